"""The attention kernels of the packed layout: FlashAttention's variable-length kernel as PyTorch ships it
(`torch.nn.attention.varlen.varlen_attn`, PyTorch >= 2.10; CUDA), across the releases that spell its arguments
differently, and whether it runs here with the mask the layout needs (`varlen_usable`); FlexAttention
(`torch.nn.attention.flex_attention`, any device: its key/value heads shared by the query heads, `enable_gqa`, where
a varlen kernel without GQA repeats them); and which one a packed forward runs (`packed_kernel`)."""

from __future__ import annotations

import functools
import inspect
import logging
import os
import warnings
from typing import Any

import torch

logger = logging.getLogger(__name__)

PACKED_KERNEL_ENV = "TRL_RM_ENV_PACKED_KERNEL"
"""The environment variable that picks the packed layout's attention kernel (`packed_kernel`)."""
PACKED_KERNELS = ("auto", "varlen", "flex", "mask")


@functools.cache
def packed_kernel() -> str:
    """The packed layout's attention kernel, from `TRL_RM_ENV_PACKED_KERNEL`: `auto` (the default: `varlen` where it
    runs, else the block mask under SDPA), `varlen`, `flex` (FlexAttention, any device and dtype) or `mask`. Read
    once per process.

    Raises:
        ValueError: any other value, naming the variable.
    """
    value = os.environ.get(PACKED_KERNEL_ENV, "auto").strip().lower() or "auto"
    if value not in PACKED_KERNELS:
        raise ValueError(f"{PACKED_KERNEL_ENV}={value!r}: choose one of {', '.join(PACKED_KERNELS)}.")
    return value


@functools.cache
def _compiled_flex() -> Any:
    """FlexAttention compiled for CUDA (its fused kernel; dynamic shapes: a packed row's length changes every call)."""
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=True)


def run_flex(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, block_mask: Any, scale: float) -> torch.Tensor:
    """FlexAttention over `(1, heads, T, dim)` queries and `(1, kv_heads, T, dim)` keys/values under `block_mask`
    (`enable_gqa`: each key/value head shared by its query heads, none repeated): compiled on CUDA, its unfused
    reference elsewhere (the CPU's tests)."""
    from torch.nn.attention.flex_attention import flex_attention

    gqa = query.shape[1] != key.shape[1]
    if query.is_cuda:
        return _compiled_flex()(query, key, value, block_mask=block_mask, scale=scale, enable_gqa=gqa)
    with warnings.catch_warnings():  # "called without torch.compile": on purpose off CUDA
        warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
        return flex_attention(query, key, value, block_mask=block_mask, scale=scale, enable_gqa=gqa)


@functools.cache
def varlen_kernel() -> Any:
    """`torch.nn.attention.varlen.varlen_attn`, or None where this PyTorch has none."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    return varlen_attn


def varlen_parameters() -> frozenset[str]:
    """The names the varlen kernel takes in this PyTorch (`window_size` or `is_causal`, `enable_gqa`, `scale`)."""
    kernel = varlen_kernel()
    return _parameters(kernel) if kernel is not None else frozenset()


@functools.cache
def _parameters(kernel: Any) -> frozenset[str]:
    return frozenset(inspect.signature(kernel).parameters)


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


def reference_varlen_attn(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    cu_seq_q: torch.Tensor,
    cu_seq_k: torch.Tensor,
    max_q: int,
    max_k: int,
    *,
    scale: float | None = None,
    window_size: tuple[int, int] = (-1, -1),
    enable_gqa: bool = False,
    is_causal: bool | None = None,
) -> torch.Tensor:
    """The contract of the varlen kernel in plain PyTorch, segment by segment: what the CPU tests run in its place, so
    that every line of the packed layout's `varlen` branch but the CUDA kernel itself runs in CI.

    `query` `(sum q, heads, dim)`, `key`/`value` `(sum k, kv_heads, dim)`; segment s is queries
    `[cu_seq_q[s], cu_seq_q[s+1])` against keys `[cu_seq_k[s], cu_seq_k[s+1])`. The mask is FlashAttention's: query i
    of a segment of `q` queries and `k` keys stands at key position `i + k - q` (aligned to the END of the keys) and sees
    key j where `i + k - q - left <= j <= i + k - q + right` (`window_size=(left, right)`, -1: unbounded; `(-1, 0)` or
    `is_causal=True` is causal). Key/value heads are shared by `heads // kv_heads` consecutive query heads, only with
    `enable_gqa` (as the kernel, it refuses mismatched heads otherwise). Inputs the real kernel would read out of
    bounds (keys or queries shorter than the cumulative lengths say, a segment longer than `max_q`/`max_k`) raise.
    Softmax in float32, output in the query's dtype, `(sum q, heads, dim)`.
    """
    if is_causal is not None:
        window_size = (-1, 0) if is_causal else (-1, -1)
    cu_q, cu_k = cu_seq_q.tolist(), cu_seq_k.tolist()
    if len(cu_q) != len(cu_k) or cu_q[-1] != query.shape[0] or cu_k[-1] != key.shape[0] or key.shape != value.shape:
        raise ValueError(
            f"varlen: cu_seq_q ends at {cu_q[-1]} for {query.shape[0]} queries, cu_seq_k at {cu_k[-1]} for "
            f"{key.shape[0]} keys ({len(cu_q)} and {len(cu_k)} offsets; key {tuple(key.shape)}, value "
            f"{tuple(value.shape)})"
        )
    heads, kv_heads = query.shape[1], key.shape[1]
    if heads != kv_heads:
        if not enable_gqa or heads % kv_heads:
            raise ValueError(f"varlen: {heads} query heads and {kv_heads} key/value heads (enable_gqa={enable_gqa})")
        key = key.repeat_interleave(heads // kv_heads, dim=1)
        value = value.repeat_interleave(heads // kv_heads, dim=1)
    scale = query.shape[-1] ** -0.5 if scale is None else scale
    left, right = window_size
    out = torch.zeros_like(query)
    for s in range(len(cu_q) - 1):
        q0, q1, k0, k1 = cu_q[s], cu_q[s + 1], cu_k[s], cu_k[s + 1]
        sq, sk = q1 - q0, k1 - k0
        if sq > max_q or sk > max_k:
            raise ValueError(f"varlen: segment {s} has {sq} queries and {sk} keys, over max_q={max_q}, max_k={max_k}")
        if sq == 0:
            continue
        at = torch.arange(sq)[:, None] + (sk - sq)  # each query's position among the keys
        j = torch.arange(sk)[None, :]
        allowed = torch.ones(sq, sk, dtype=torch.bool)
        if left >= 0:
            allowed &= j >= at - left
        if right >= 0:
            allowed &= j <= at + right
        logits = torch.einsum("qhd,khd->hqk", query[q0:q1].float(), key[k0:k1].float()) * scale
        logits = logits.masked_fill(~allowed.to(logits.device), float("-inf"))
        weights = torch.softmax(logits, dim=-1).nan_to_num(0.0)  # a query that sees no key: zeros, as the kernel
        out[q0:q1] = torch.einsum("hqk,khd->qhd", weights, value[k0:k1].float()).to(query.dtype)
    return out
