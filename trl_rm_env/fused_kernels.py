"""Fused kernels from Liger Kernel (`fused_kernels`), for the reward models we train and the ones we score with.

A forward of a Qwen3-style decoder spends much of its time outside its matmuls: RMSNorm's fp32 upcasts, the rotary
embedding, SiLU and the gate product are separate elementwise kernels in transformers' eager code (about 45% of a
packed forward on an H200, `benchmarks/profile_packed.py`). Liger Kernel (`pip install 'trl-rm-env[gpu]'`, the
`liger-kernel` package: Triton kernels, maintained by LinkedIn, the ones TRL uses through `use_liger_kernel`) fuses
each into one kernel. We apply its RMSNorm, SwiGLU and RoPE to the model instance through Liger's own entry point
(`_apply_liger_kernel_to_instance`, as transformers' `use_liger_kernel` does), with its two loss kernels off:

- `fused_linear_cross_entropy`, Liger's default, replaces the model's `forward` with a causal LM's loss forward
  (it does so on any instance it is given): a `*ForSequenceClassification` reward model would lose its score head.
  transformers' `use_liger_kernel=True` passes Liger's defaults, so a reward model trained that way breaks; we apply
  the same kernels without it (`use_liger_kernel: true` on our trainers is read as `fused_kernels: true`);
- `cross_entropy` patches `torch.nn.functional.cross_entropy` process-wide; a reward model has no such loss.

Liger patches the model type's module (`modeling_qwen3.apply_rotary_pos_emb`, the RMSNorm and MLP classes) for every
model of that type built or run later in the process, as it does under TRL. Its kernels need CUDA: `"auto"` applies
them where the model runs on CUDA, the package is installed and Liger supports the model type, and says which it did
(logged once); `True` is refused in one line naming what is missing.
"""

from __future__ import annotations

import importlib.util
import logging
from typing import Any

import torch

logger = logging.getLogger(__name__)

INSTALL = "pip install 'trl-rm-env[gpu]' (the liger-kernel package)"
LIGER_OPTIONS = {"cross_entropy": False, "fused_linear_cross_entropy": False, "rms_norm": True, "swiglu": True,
                 "rope": True}  # fmt: skip
"""What we ask of Liger: its RMSNorm, SwiGLU and RoPE kernels, neither loss kernel (the module docstring says why)."""


def supported_model_types() -> frozenset[str]:
    """The model types Liger Kernel has kernels for (its own table; empty when the package is not installed)."""
    if importlib.util.find_spec("liger_kernel") is None:
        return frozenset()
    from liger_kernel.transformers.monkey_patch import MODEL_TYPE_TO_APPLY_LIGER_FN

    return frozenset(MODEL_TYPE_TO_APPLY_LIGER_FN)


def _base(model: Any) -> Any:
    """The transformers model under a PEFT wrapper (or the model itself)."""
    get_base = getattr(model, "get_base_model", None)
    return get_base() if callable(get_base) else model


def why_not_fused(model: Any, device: torch.device | str) -> str | None:
    """Why Liger's kernels cannot run `model` on `device` (None: they can): not CUDA, the package missing, or a model
    type Liger has no kernels for."""
    device = torch.device(device)
    if device.type != "cuda":
        return f"the model runs on {device.type} (Liger's kernels are Triton kernels for CUDA)"
    if importlib.util.find_spec("liger_kernel") is None:
        return f"liger-kernel is not installed ({INSTALL})"
    model_type = getattr(getattr(_base(model), "config", None), "model_type", None)
    if model_type not in supported_model_types():
        return f"Liger Kernel has no kernels for model type {model_type!r}"
    return None


def use_fused_kernels(asked: bool | str, model: Any, device: torch.device | str, what: str,
                      config: dict[str, bool] | None = None) -> bool:
    """Apply Liger's RMSNorm, SwiGLU and RoPE kernels to `model` (in place) where `asked` (`"auto"`, True, False)
    says so and they can run; whether they were applied. `what` names the use in the log line (`training`, ...);
    `config` (transformers' `liger_kernel_config`) turns kernels on or off by Liger's names.

    Raises:
        ValueError: `asked=True` where they cannot run, naming why; a loss kernel asked for in `config`.
    """
    if asked is False:
        return False
    losses = sorted(k for k in ("cross_entropy", "fused_linear_cross_entropy") if (config or {}).get(k))
    if losses:
        raise ValueError(f"liger_kernel_config asks for {', '.join(losses)}: Liger's loss kernels replace a causal LM's "
                         "loss (fused_linear_cross_entropy replaces the model's forward), and a reward model has none; "
                         "leave them out.")
    why = why_not_fused(model, device)
    if why is not None:
        if asked is True:
            raise ValueError(f"fused_kernels=True runs Liger Kernel's fused RMSNorm, SwiGLU and RoPE, but {why}; set "
                             "fused_kernels to 'auto' or False.")
        logger.info("fused_kernels='auto' (%s): off, %s.", what, why)
        return False
    from liger_kernel.transformers import _apply_liger_kernel_to_instance

    base = _base(model)
    _apply_liger_kernel_to_instance(model=base, **(LIGER_OPTIONS | (config or {})))
    logger.info("fused_kernels=%r (%s): Liger Kernel's RMSNorm, SwiGLU and RoPE on this %s model (its loss kernels "
                "off).", asked, what, base.config.model_type)
    return True
