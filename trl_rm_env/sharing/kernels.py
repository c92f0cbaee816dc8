"""The attention kernel of the packed layout on CUDA: FlashAttention's variable-length kernel as PyTorch ships it
(`torch.nn.attention.varlen.varlen_attn`, PyTorch >= 2.10), across the releases that spell its arguments differently,
and whether it runs here with the mask the layout needs (`varlen_usable`)."""

from __future__ import annotations

import functools
import inspect
import logging
from typing import Any

import torch

logger = logging.getLogger(__name__)


@functools.cache
def varlen_kernel() -> Any:
    """`torch.nn.attention.varlen.varlen_attn`, or None where this PyTorch has none."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    return varlen_attn


@functools.cache
def varlen_parameters() -> frozenset[str]:
    """The names `varlen_attn` takes in this PyTorch (`window_size` or `is_causal`, `enable_gqa`, `scale`)."""
    return frozenset(inspect.signature(varlen_kernel()).parameters)


def run_varlen(query, key, value, cu_q, cu_k, max_q, max_k, scale):
    """`varlen_attn` with a causal mask, across the PyTorch releases that spell its arguments differently (before
    `enable_gqa`, the key/value heads are repeated to the query heads, as transformers' `repeat_kv` does)."""
    params = varlen_parameters()
    kwargs: dict[str, Any] = {"window_size": (-1, 0)} if "window_size" in params else {"is_causal": True}
    if query.shape[1] != key.shape[1]:
        if "enable_gqa" in params:
            kwargs["enable_gqa"] = True
        else:
            repeat = query.shape[1] // key.shape[1]
            key, value = key.repeat_interleave(repeat, dim=1), value.repeat_interleave(repeat, dim=1)
    if "scale" in params:
        kwargs["scale"] = scale
    return varlen_kernel()(query, key, value, cu_q, cu_k, max_q, max_k, **kwargs)


@functools.cache
def varlen_usable(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether the `varlen` kernel runs on `device` in `dtype` with the mask the packed layout needs: causal, aligned
    to the END of the keys (a completion's query i sees its whole context and its own tokens up to i), probed once per
    device and dtype. Where it does not, `prefix_sharing="auto"` does not choose the packed layout."""
    if device.type != "cuda" or dtype not in (torch.float16, torch.bfloat16) or varlen_kernel() is None:
        return False
    try:
        # Two queries against three keys of equal scores, values 0, 1, 2: aligned to the end of the keys, query 0
        # sees keys 0-1 (mean 0.5) and query 1 all three (1.0); aligned to the start, 0 and 0.5; not causal, 1 and 1.
        query = torch.ones(2, 1, 64, device=device, dtype=dtype)
        key = torch.zeros(3, 1, 64, device=device, dtype=dtype)
        value = torch.arange(3, device=device, dtype=dtype)[:, None, None].expand(3, 1, 64).contiguous()
        cu_q = torch.tensor([0, 2], device=device, dtype=torch.int32)
        cu_k = torch.tensor([0, 3], device=device, dtype=torch.int32)
        out = run_varlen(query, key, value, cu_q, cu_k, 2, 3, 1.0).float().mean(dim=(1, 2)).tolist()
        aligned = abs(out[0] - 0.5) < 1e-2 and abs(out[1] - 1.0) < 1e-2
    except Exception as err:  # an old GPU, a build without the kernel
        logger.info("Packed attention: torch's varlen kernel does not run here (%s).", err)
        return False
    if not aligned:
        logger.warning("Packed attention: torch's varlen kernel does not align its causal mask to the end of the keys "
                       "(a probe gave %s); the packed layout is not used on this device.", out)
    return aligned
