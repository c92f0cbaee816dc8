"""The end of a training run: the reward model saved as a plain Hugging Face checkpoint, and the per-set tables the
recipes print."""

from __future__ import annotations

import copy
import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

from transformers import AutoConfig, AutoModelForSequenceClassification, Trainer

from ..metrics import ATTRIBUTE_METRICS
from ..waiting import wait_for_everyone


def save_reward_model(trainer: Trainer, output_dir: str) -> None:
    """Save `AutoModelForSequenceClassification` weights (safetensors), config and tokenizer to `output_dir`.

    LoRA adapters are merged into the base weights first, so the folder loads with `from_pretrained` and nothing
    else (no PEFT needed). A quantized base (QLoRA: `--load_in_4bit`/`--load_in_8bit`) is merged into its
    full-precision weights, reloaded from the base checkpoint: the folder needs no bitsandbytes, vLLM loads it, and no
    adapter is rounded into 4-bit weights. DeepSpeed ZeRO-3 and FSDP checkpoints are gathered by `Trainer.save_model`.
    """
    model = trainer.accelerator.unwrap_model(trainer.model)
    if hasattr(model, "merge_and_unload") and hasattr(model, "peft_config"):
        quantized = getattr(model.config, "quantization_config", None) is not None
        merged = _full_precision_merge(model, trainer.args) if quantized else model.merge_and_unload()
        if trainer.accelerator.is_main_process:
            os.makedirs(output_dir, exist_ok=True)
            merged.save_pretrained(output_dir, safe_serialization=True)
            trainer.processing_class.save_pretrained(output_dir)
        wait_for_everyone(trainer.accelerator, f"finish saving the merged reward model to {output_dir}")
        return
    trainer.save_model(output_dir)


def _full_precision_merge(model: Any, args: Any) -> Any:
    """A PEFT model over a quantized base, merged into the base's full-precision weights: the base checkpoint is
    loaded again without quantization (with the trained model's config: labels, reward statistics), the trained
    adapters and heads (`modules_to_save`) are put on it, and merged."""
    from peft import get_peft_model, get_peft_model_state_dict, set_peft_model_state_dict

    config = copy.deepcopy(model.config)
    del config.quantization_config
    base_path = config._name_or_path
    skip = {"quantization_config", "device_map", "torch_dtype"}
    init_kwargs = {k: v for k, v in (getattr(args, "model_init_kwargs", None) or {}).items() if k not in skip}
    if init_kwargs.get("dtype") in (None, "auto"):  # the base's own dtype, not the quantized model's compute dtype
        trust = init_kwargs.get("trust_remote_code", False)
        init_kwargs["dtype"] = AutoConfig.from_pretrained(base_path, trust_remote_code=trust).dtype or "float32"
    base = AutoModelForSequenceClassification.from_pretrained(base_path, config=config, **init_kwargs)
    peft_config = copy.deepcopy(model.peft_config[model.active_adapter])
    peft_config.inference_mode = True
    clean = get_peft_model(base, peft_config)
    state = {k: v.to(base.dtype) for k, v in get_peft_model_state_dict(model).items()}
    set_peft_model_state_dict(clean, state)
    return clean.merge_and_unload()


def format_metrics_table(metrics: dict[str, float], set_names: list[str], prefix: str = "eval") -> str:
    """A small text table of the per-set metrics, one row per validation set."""
    columns = ["accuracy", "loss", "margin", "rewards_chosen_mean", "rewards_rejected_mean", "num_pairs", "runtime"]
    header = ["set", *columns]
    rows = []
    for name in set_names:
        row = [name]
        for column in columns:
            value = metrics.get(f"{prefix}_{name}_{column}")
            row.append("-" if value is None else (f"{value:d}" if isinstance(value, int) else f"{value:.4f}"))
        rows.append(row)
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(r, widths)) for r in [header, *rows]]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def format_regression_table(
    metrics: Mapping[str, float],
    set_names: Sequence[str],
    attributes: Sequence[str],
    baseline: Mapping[str, float] | None = None,
    prefix: str = "eval",
) -> str:
    """A text table of the per-set, per-attribute metrics.

    With `baseline` (from `trl_rm_env.data.regression.mean_baseline_rmse`) it also shows the RMSE of predicting the
    training mean and the relative gain `1 - rmse / mean_rmse`, in percent.
    """
    header = ["set", "attribute", "rmse", "mae", "pearson"] + (["mean_rmse", "gain"] if baseline else [])
    rows = []
    for name in set_names:
        for attr in attributes:
            values = [metrics.get(f"{prefix}_{name}_{attr}_{m}", math.nan) for m in ATTRIBUTE_METRICS]
            if baseline:
                reference = baseline.get(f"{name}_{attr}", math.nan)
                values += [reference, 1 - values[0] / reference if reference else math.nan]
            cells = [f"{v:.4f}" for v in values]
            if baseline:
                cells[-1] = f"{values[-1]:.0%}" if math.isfinite(values[-1]) else "nan"  # as docs/regression.md shows
            rows.append([name, attr, *cells])
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)) for r in [header, *rows]]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
