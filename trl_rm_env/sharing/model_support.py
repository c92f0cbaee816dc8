"""Whether prefix sharing runs, and which layout: the one decision, for training and for scoring.

`prefix_sharing` is `"auto"` (the default), `True`, `False` or `"packed"` everywhere (`RankedRewardConfig`,
`RewardScorer`, `RewardModelEnvironment`, `--prefix_sharing`, `reward_prefix_sharing`). Where the packed layout's
fast kernel runs (CUDA, bf16/fp16: `packs_fast`), `"auto"` and `True` run it (`packed.py`: one padding-free forward
per micro-batch), under activation checkpointing and FSDP too. On the CPU they run the KV-cache layout (`kv.py`) where the model allows it
(`kv_sharing_unsupported`); in training, `True` falls back to block-mask rows (`mask.py`) where it cannot (activation
checkpointing, FSDP), and `"auto"` to the plain path. `"packed"` runs the packed layout on any device (the CPU tests
and proxies of the GPU's work). Every fallback is logged once.
"""

from __future__ import annotations

import inspect
import logging

import torch
from transformers import PreTrainedModel

from . import kernels

logger = logging.getLogger(__name__)

SUPPORTED_ATTENTION = ("eager", "sdpa")
"""Attention kernels that take the block-mask rows' 4-D mask."""
KV_ATTENTION = ("eager", "sdpa", "flash_attention_2", "flash_attention_3")
"""Attention kernels the KV-cache layout runs with."""


def find_score_head(model: torch.nn.Module) -> torch.nn.Module | None:
    """The `score` head of a `*ForSequenceClassification` model, through DDP/DeepSpeed/FSDP/PEFT wrappers.

    The first module named `score` in traversal order (a PEFT `modules_to_save` wrapper comes before its copies).
    """
    for name, module in model.named_modules():
        if name.rsplit(".", 1)[-1] == "score":
            return module
    return None


def classifier(model: torch.nn.Module) -> torch.nn.Module | None:
    """The `*ForSequenceClassification` inside `model` (through DDP/DeepSpeed/FSDP/PEFT wrappers)."""
    for module in model.modules():
        if isinstance(module, PreTrainedModel) and find_score_head(module) is not None:
            return module
    return None


def cache_argument(body: torch.nn.Module) -> str | None:
    """The name under which `body.forward` takes a KV cache (`cache` or `past_key_values`), or None."""
    params = inspect.signature(body.forward).parameters
    for name in ("cache", "past_key_values"):  # transformers >= 5.2x renames `past_key_values` to `cache`
        if name in params:
            return name
    return None


def full_attention_unsupported(hf: torch.nn.Module) -> str | None:
    """Why `hf` (a `*ForSequenceClassification`) does not attend over every earlier token in every layer, or None."""
    config = hf.config
    layer_types = getattr(config, "layer_types", None)
    if layer_types is not None:
        if any(t != "full_attention" for t in layer_types):
            return f"its layers are not all full attention ({sorted(set(layer_types))})"
    elif getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True):
        return "it uses sliding-window attention"
    return None


def packed_unsupported(model: torch.nn.Module) -> str | None:
    """Why the packed layout (`trl_rm_env.sharing.packed`) cannot run `model`, or None when it can: it needs a
    `*ForSequenceClassification` with a `score` head whose attention goes through transformers' `AttentionInterface`
    (`_supports_attention_backend`: the packed attention replaces it) and full attention in every layer (any wrapper,
    activation checkpointing included)."""
    hf = classifier(model)
    if hf is None:
        return "it needs a *ForSequenceClassification model with a `score` head"
    if not getattr(type(hf), "_supports_attention_backend", False):
        return f"{type(hf).__name__}'s attention does not go through transformers' AttentionInterface"
    return full_attention_unsupported(hf)


def packs_fast(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether the packed layout runs its fast kernel on `device` in `dtype` (`kernels.varlen_usable`: CUDA, bf16 or
    fp16, PyTorch's varlen kernel with the right causal mask): where `"auto"` and `True` choose it."""
    return kernels.varlen_usable(torch.device(device), dtype)


def on_accelerator(model: torch.nn.Module) -> bool:
    """Whether `model`'s weights are where the packed layout runs fast (`packs_fast`), so `"auto"` runs it."""
    for parameter in model.parameters():
        return packs_fast(parameter.device, parameter.dtype)
    return False


def kv_sharing_unsupported(model: torch.nn.Module, training: bool = False) -> str | None:
    """Why the shared-context (KV cache) path cannot run `model`, or None when it can.

    Needs a `*ForSequenceClassification` with a `score` head whose decoder body takes a cache, full attention in
    every layer (a sliding window would count the padded context slots), an attention kernel in `KV_ATTENTION`, and,
    when training, no activation checkpointing (checkpointed layers drop the cache).
    """
    hf = classifier(model)
    if hf is None:
        return "it needs a *ForSequenceClassification model with a `score` head"
    config = hf.config
    attention = getattr(config, "_attn_implementation", None)
    if attention not in KV_ATTENTION:
        return f"attn_implementation {attention!r} is not one of {KV_ATTENTION}"
    body = getattr(hf, getattr(hf, "base_model_prefix", ""), None)
    if body is None or body is hf or cache_argument(body) is None:
        return f"{type(hf).__name__}'s decoder takes no KV cache"
    reason = full_attention_unsupported(hf)
    if reason is not None:
        return reason
    checkpointing = getattr(hf, "is_activation_checkpointing", None)
    if checkpointing is None:  # transformers before the rename
        checkpointing = getattr(hf, "is_gradient_checkpointing", False)
    if training and checkpointing:
        return "activation checkpointing drops the KV cache"
    if training and any(type(m).__name__.startswith(("FSDP", "FullyShardedDataParallel")) for m in model.modules()):
        return "FSDP reshards each layer between the context and completion passes, before backward"
    return None




def packed_choice(model: torch.nn.Module, mode: bool | str, fast: bool, otherwise: str) -> str | bool | None:
    """The packed layout's part of the decision, for training and scoring alike: `"packed"` when it is asked for
    (`mode="packed"`, or any sharing mode where it runs `fast`) and the model can run it; False when it was forced
    and the model cannot (a warning ending in `otherwise`); None when the other layouts decide. Logged once."""
    if mode is False or not (mode == "packed" or fast):
        return None
    reason = packed_unsupported(model)
    if reason is None:
        logger.info("prefix_sharing=%r: each micro-batch is one packed, padding-free forward, each shared context "
                    "once.", mode)
        return "packed"
    if mode == "packed":
        logger.warning("prefix_sharing='packed': %s; %s.", reason, otherwise)
        return False
    return None


def forces_sharing(mode: bool | str | None) -> bool:
    """Whether a `prefix_sharing` value asks for sharing whatever the cost model says (`True`, `"packed"`; also
    their text from a command line or a YAML file), rather than leaving it to `"auto"` or turning it off."""
    return str(mode).lower() in ("true", "packed")


def scoring_mode(model: torch.nn.Module, mode: bool | str) -> bool | str:
    """The mode a scorer runs: `"packed"` (`"packed"`, or `"auto"`/`True` on an accelerator), `False` where the
    model cannot share (logged once), else `mode` (the KV-cache layout, `"auto"` by its cost model)."""
    if mode is False:
        return False
    packed = packed_choice(model, mode, on_accelerator(model), "scoring each sequence separately")
    if packed is not None:
        return packed
    reason = kv_sharing_unsupported(model)
    if reason is None:
        if mode == "auto":
            logger.info("prefix_sharing='auto': groups sharing a context are scored against its KV cache where "
                        "the cost model says it pays.")
        return mode
    log = logger.warning if mode is True else logger.info
    log("prefix_sharing=%r: %s; scoring each sequence separately.", mode, reason)
    return False
