"""Saving a trained reward model as a plain Hugging Face checkpoint, printing per-set metrics, and checking what
`accelerate launch` set up (the recipes' shared plumbing)."""

from __future__ import annotations

import logging
import os

from transformers import Trainer

logger = logging.getLogger(__name__)


def save_reward_model(trainer: Trainer, output_dir: str) -> None:
    """Save `AutoModelForSequenceClassification` weights (safetensors), config and tokenizer to `output_dir`.

    LoRA adapters are merged into the base weights first, so the folder loads with `from_pretrained` and nothing
    else (no PEFT needed). DeepSpeed ZeRO-3 and FSDP checkpoints are gathered by `Trainer.save_model`.
    """
    model = trainer.accelerator.unwrap_model(trainer.model)
    if hasattr(model, "merge_and_unload") and hasattr(model, "peft_config"):
        merged = model.merge_and_unload()
        if trainer.accelerator.is_main_process:
            os.makedirs(output_dir, exist_ok=True)
            merged.save_pretrained(output_dir, safe_serialization=True)
            trainer.processing_class.save_pretrained(output_dir)
        trainer.accelerator.wait_for_everyone()
        return
    trainer.save_model(output_dir)


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


def check_distributed_setup(accelerator) -> str:
    """Describe the distributed setup the processes got, e.g. `"Distributed: DEEPSPEED x2 on cpu:0"`, for the log.

    Refuses a launch that would silently train unsynchronised, and warns when the Accelerate config asked for a
    sharding backend that is not in use.

    Raises:
        RuntimeError: Several processes were launched (`WORLD_SIZE` > 1) but Accelerate set up no distributed
            training: this happens without GPUs when `use_cpu` is off. Each process would train its own model on
            its share of the data and report metrics of that share only.
    """
    from accelerate.utils import DistributedType

    state = accelerator.state
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size > 1 and (state.distributed_type == DistributedType.NO or state.num_processes != world_size):
        raise RuntimeError(
            f"{world_size} processes were launched but Accelerate set up {state.distributed_type.value} with "
            f"{state.num_processes} process(es) on {state.device}: no GPU was found. To train on CPU pass "
            "`--use_cpu true` (the *_tiny.yaml configs set it) and use an accelerate_configs/*_cpu.yaml config."
        )
    for backend in ("FSDP", "DEEPSPEED"):
        requested = os.environ.get(f"ACCELERATE_USE_{backend}", "false").lower() == "true"
        if requested and state.distributed_type.value != backend:
            logger.warning(
                "The Accelerate config asks for %s but this run uses %s: nothing is sharded.%s",
                backend,
                state.distributed_type.value,
                " On CPU accelerate runs FSDP only after `trl_rm_env.distributed.enable_fsdp_on_cpu()` (the recipes "
                "call it first thing)."
                if backend == "FSDP" and state.device.type == "cpu"
                else "",
            )
    return f"Distributed: {state.distributed_type.value} x{state.num_processes} on {state.device}"
