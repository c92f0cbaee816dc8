"""The steps the recipes share, so that each reads top to bottom: model -> data -> train -> evaluate and save.

`start` (before anything loads: FSDP on CPU, the resume checkpoint), `prepare_model` (the tiny offline models when
asked, a typo'd folder in one line, `model_init_kwargs` from the model arguments), `train` (the distributed setup
checked and printed, log-friendly progress, `train()`, the share of the model each process holds) and
`finish_reward_model` (the training recipes' evaluation, checkpoint, metrics, log history and table).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Mapping
from typing import Any

from transformers import Trainer

from trl_rm_env.distributed import check_distributed_setup, describe_sharding, enable_fsdp_on_cpu
from trl_rm_env.model_source import check_model_source, ensure_tiny_model
from trl_rm_env.trainer.checkpoints import resolve_resume_checkpoint
from trl_rm_env.trainer.saving import save_reward_model

logger = logging.getLogger(__name__)


def show_logs(level: int) -> None:
    """Print `trl_rm_env`'s log messages of `level` and above to stderr when it is INFO or DEBUG (`--log_level info`,
    the process's level as transformers computes it), as transformers prints its own; at the default level only
    warnings reach the terminal."""
    if level > logging.INFO:
        return
    package = logging.getLogger("trl_rm_env")
    package.setLevel(level)
    if not any(getattr(h, "_trl_rm_env", False) for h in package.handlers):
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
        handler._trl_rm_env = True
        package.addHandler(handler)


def start(training_args: Any) -> str | None:
    """First thing in a recipe: our own log messages at `--log_level` (`show_logs`), FSDP shards on CPU too
    (accelerate alone falls back to DDP there), and the resume checkpoint is resolved, so a missing or incomplete one
    fails in one line before anything loads."""
    show_logs(training_args.get_process_log_level())
    enable_fsdp_on_cpu()
    return resolve_resume_checkpoint(training_args.resume_from_checkpoint, training_args.output_dir)


def prepare_model(
    model_args: Any,
    training_args: Any,
    *,
    build_tiny: bool = False,
    kind: str = "reward_model",
    what: str = "model",
    **tiny_options: Any,
) -> str:
    """The model path of `model_args`, checked: with `build_tiny`, the tiny offline model is built where it is
    missing (only at a folder named `kind`: see `ensure_tiny_model`); a typo'd local folder fails in one line. The
    model arguments' revision, attention implementation and dtype go into `training_args.model_init_kwargs`
    (values already there win)."""
    path = model_args.model_name_or_path
    if build_tiny:
        ensure_tiny_model(path, kind, **tiny_options)
    check_model_source(path, what)
    given = dict(revision=model_args.model_revision, attn_implementation=model_args.attn_implementation,
                 dtype=model_args.dtype)  # fmt: skip
    merged = {k: v for k, v in given.items() if v is not None} | (training_args.model_init_kwargs or {})
    training_args.model_init_kwargs = {k: v for k, v in merged.items() if v is not None}
    return path


def train(trainer: Trainer, resume: str | None) -> None:
    """Print what `accelerate launch` set up, keep nested progress bars out of logs, train, and print the share of the
    trained model this process holds (about 1/processes under ZeRO-3 and FSDP)."""
    trainer.accelerator.print(check_distributed_setup(trainer.accelerator))
    model = trainer.accelerator.unwrap_model(trainer.model)
    for bits in (4, 8):
        if getattr(model, f"is_loaded_in_{bits}bit", False):
            trainer.accelerator.print(f"Quantized base: {bits}-bit (bitsandbytes); training its LoRA adapters (QLoRA)")
    tty_aware_progress(trainer)
    trainer.train(resume_from_checkpoint=resume)
    trainer.accelerator.print(describe_sharding(trainer.model))


def finish_reward_model(
    trainer: Any,
    output_dir: str,
    eval_datasets: Mapping[str, Any],
    table: Callable[[dict], str],
    saved: str,
) -> dict:
    """The end of a training recipe: every validation set's final metrics (reusing `train()`'s evaluation of this
    step), a plain Hugging Face checkpoint (LoRA merged), `eval_results.json` (per-set names), `trainer_state.json`
    (the full log history), the printed `table(metrics)` and the `saved` line; then `trainer.end()`."""
    metrics = trainer.final_evaluation() if eval_datasets else {}
    save_reward_model(trainer, output_dir)
    if eval_datasets:
        trainer.save_metrics("eval", metrics)
    trainer.save_state()
    if eval_datasets:
        trainer.accelerator.print(table(metrics))
    trainer.accelerator.print(saved)
    trainer.end()
    return metrics


def tty_aware_progress(trainer: Trainer) -> None:
    """Keep the nested evaluation bar out of logs: when stderr is not a terminal, transformers' evaluation bar
    (drawn under the training bar with cursor-up escape codes, `ESC[A`) is not drawn; the training bar and the
    logged metrics stay. Nothing changes on a terminal or with `disable_tqdm`."""
    from transformers.trainer_callback import ProgressCallback

    if sys.stderr.isatty() or not any(type(cb) is ProgressCallback for cb in trainer.callback_handler.callbacks):
        return

    class LogFriendlyProgressCallback(ProgressCallback):
        def on_prediction_step(self, args, state, control, eval_dataloader=None, **kwargs):
            if self.training_bar is None:  # a standalone evaluation: one bar, nothing nested
                super().on_prediction_step(args, state, control, eval_dataloader=eval_dataloader, **kwargs)

    trainer.remove_callback(ProgressCallback)
    trainer.add_callback(LogFriendlyProgressCallback)
