"""The steps the recipes share, so that each reads top to bottom: model -> data -> train -> evaluate and save.

`start` (before anything loads: FSDP on CPU, the resume checkpoint), `prepare_model` (the tiny offline models when
asked, a typo'd folder in one line, `model_init_kwargs` from the model arguments), `quantization` (TRL's
`--load_in_4bit`/`--load_in_8bit` and `bnb_*` flags, checked), `train` (the distributed setup printed, log-friendly
progress, `train()`, the share of the model each process holds) and `finish_reward_model` (the training recipes'
evaluation, checkpoint, metrics, log history and table).
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable, Mapping
from typing import Any

from transformers import Trainer

from trl_rm_env.distributed import describe_sharding, enable_fsdp_on_cpu
from trl_rm_env.model_source import check_model_source, ensure_tiny_model
from trl_rm_env.trainer.checkpoints import resolve_resume_checkpoint
from trl_rm_env.trainer.saving import save_reward_model

logger = logging.getLogger(__name__)


def show_logs(level: int) -> None:
    """Print `trl_rm_env`'s log messages of `level` and above to stderr when it is INFO or DEBUG (`--log_level info`,
    the process's level as transformers computes it), as transformers prints its own; at the default level only
    warnings reach the terminal, as before."""
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


BNB_FLAGS = ("bnb_4bit_quant_type", "use_bnb_nested_quant", "bnb_4bit_quant_storage")
"""`ModelConfig`'s options of 4-bit quantization: they mean something only with `load_in_4bit`."""


def quantization(model_args: Any, training_args: Any = None) -> Any:
    """The `BitsAndBytesConfig` of TRL's model flags (`get_quantization_config`, as `trl/scripts/reward.py` passes
    it), or None: `--load_in_4bit` / `--load_in_8bit` with the `bnb_*` options. A quantized model trains adapters
    only, so it needs `--use_peft` (QLoRA); the final checkpoint merges them into the full-precision weights.

    Raises:
        ValueError: a `bnb_*` option without `--load_in_4bit`, a quantized model without `--use_peft`, a quantized
            model without bf16 or fp16 mixed precision in `training_args` (TRL casts the trainable QLoRA weights,
            the `score` head's included, to bf16: an fp32 forward stops at the first step), or bitsandbytes
            missing, each naming the flag.
    """
    import dataclasses

    from transformers.utils import is_bitsandbytes_available
    from trl import get_quantization_config

    defaults = {f.name: f.default for f in dataclasses.fields(model_args) if f.name in BNB_FLAGS}
    given = [name for name, default in defaults.items() if getattr(model_args, name) != default]
    flag = "--load_in_4bit" if model_args.load_in_4bit else "--load_in_8bit" if model_args.load_in_8bit else None
    if given and not model_args.load_in_4bit:
        raise ValueError(f"{', '.join('--' + n for n in given)} configure 4-bit quantization: add --load_in_4bit")
    if flag is None:
        return None
    if not model_args.use_peft:
        raise ValueError(f"{flag} loads frozen quantized weights, which train only through adapters: add --use_peft")
    if training_args is not None and not (training_args.bf16 or training_args.fp16):
        raise ValueError(
            f"{flag} trains QLoRA adapters that TRL keeps in bf16 (the score head's trainable copy included), which an "
            "fp32 forward cannot run: add --bf16 true (with --dtype bfloat16)"
        )
    if not is_bitsandbytes_available():
        raise ValueError(f"{flag} needs bitsandbytes: pip install 'trl-rm-env[quantization]'")
    return get_quantization_config(model_args)


def peft_config(model_args: Any) -> Any:
    """TRL's `get_peft_config(model_args)` for a reward model, whose LoRA task is sequence classification (`SEQ_CLS`:
    the `score` head is trained and saved with the adapters). TRL's default task (`CAUSAL_LM`, a language model's) is
    replaced, logged once; any other is refused.

    Raises:
        ValueError: `--lora_task_type` other than `SEQ_CLS` (or TRL's default), naming the flag.
    """
    from trl import get_peft_config

    task = str(getattr(model_args, "lora_task_type", "SEQ_CLS")).upper()
    if model_args.use_peft and task != "SEQ_CLS":
        if task != "CAUSAL_LM":
            raise ValueError(f"--lora_task_type {task}: a reward model is a sequence classifier; use SEQ_CLS")
        logger.info("--lora_task_type: a reward model's LoRA task is SEQ_CLS (TRL's default CAUSAL_LM is for language "
                    "models); using SEQ_CLS.")
    if model_args.use_peft:
        model_args.lora_task_type = "SEQ_CLS"
    return get_peft_config(model_args)


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
            "`--use_cpu true` (the *_tiny.yaml configs set it) and a *_cpu Accelerate config (`--accelerate_config "
            "ddp_cpu`; in a checkout accelerate_configs/ddp_cpu.yaml)."
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
