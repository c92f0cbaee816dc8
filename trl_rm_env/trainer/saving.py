"""Saving a trained reward model as a plain Hugging Face checkpoint, and printing per-set metrics."""

from __future__ import annotations

import os

from transformers import Trainer


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
