"""TRL's model flags (`trl.ModelConfig`) read for a training run: the quantization config (`--load_in_4bit` /
`--load_in_8bit` and the `bnb_*` options) and the LoRA config of a reward model, each combination that cannot train
refused naming its flags, for the recipes and a library user alike.
"""

from __future__ import annotations

import logging
from typing import Any

logger = logging.getLogger(__name__)


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
