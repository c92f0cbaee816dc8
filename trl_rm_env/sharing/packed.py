"""Packed prefix sharing: one padding-free forward per micro-batch, the GPU's layout (and the default there).

A micro-batch of groups (a training record's completions, or a GRPO group's completions of one prompt) becomes ONE
row `(1, T)`: for each group its context once, then each completion's own tokens, positions restarting where the
completion would start alone. Every decoder layer makes one attention call over the row, in which each context
attends causally to itself and each completion to its context and causally to itself, never to another completion
(`packed_attention_forward`, registered with transformers' `AttentionInterface` as `PACKED_ATTENTION`). Scores are read
at each completion's last token. Nothing is padded (beyond an optional bucket, itself a segment of its own), so the
tokens through the model are the unique tokens; backward goes through each context once.

The layout is described once, on the CPU, by the collator (`pack_groups`): the cumulative query and key lengths of
every segment, the index of every segment's keys in the row, and the longest segment, so the forward makes no
device-to-host sync. Three kernels read it (`kernels.packed_kernel`: `varlen` where it runs, else `mask`; `flex` when
`TRL_RM_ENV_PACKED_KERNEL=flex`):

- `varlen`: FlashAttention's variable-length kernel as PyTorch ships it (`torch.nn.attention.varlen.varlen_attn`),
  with each completion's keys gathered as `context + own` (the kernel's causal mask is aligned to the end of the keys:
  completion token i sees the whole context and its own tokens up to i). CUDA, fp16/bf16.
- `mask`: one SDPA call over the row with its block mask (`T x T` booleans), on any device and dtype: the CPU's kernel,
  and fp32 or dropout on CUDA.
- `flex`: FlexAttention under the layout as a `BlockMask` (the blocks the mask touches), the key/value heads shared by
  the query heads rather than repeated (`enable_gqa`); compiled on CUDA, its unfused reference on the CPU.

Exactness: every score equals running the context and that completion alone (tests: fp32, 1e-5).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from . import kernels
from .model_support import classifier, find_score_head, packs_fast
from .planning import pooled_index

logger = logging.getLogger(__name__)

PACKED_ATTENTION = "trl_rm_env_packed"
"""The attention implementation name the packed forward runs under (registered with transformers on first use)."""
_CALLS: contextvars.ContextVar[list[int] | None] = contextvars.ContextVar("packed_attention_calls", default=None)
"""The packed attention's calls during the current `packed_scores` forward (of this thread or task), which checks that
there were some. Kept beside the layout, not on it: wrappers may copy the layout (FSDP2 rebuilds dataclass inputs to
cast them)."""


@dataclass
class PackedAttention:
    """The attention layout of one packed row, built on the CPU (`pack_groups`) and handed to every layer.

    Segment s is queries `[cu_seqlens_q[s], cu_seqlens_q[s+1])` of the row; its keys are the row positions
    `key_index[cu_seqlens_k[s]:cu_seqlens_k[s+1]]`, its context's then its own, and its query i sees its keys up to
    `i + (keys - queries)` (causal, aligned to the end of the keys).

    Args:
        cu_seqlens_q: `(S + 1,)` int32 cumulative query lengths.
        cu_seqlens_k: `(S + 1,)` int32 cumulative key lengths.
        key_index: `(sum of key lengths,)` long, the row position of every segment's keys.
        max_q: The longest segment's queries.
        max_k: The longest segment's keys.
        contexts: Per segment, the `(start, end)` of its context in the row (`(0, 0)`: none).
        num_tokens: The real tokens of the row (padding excluded).
        length: The row's length `T` (queries of every segment, padding included).
    """

    cu_seqlens_q: torch.Tensor
    cu_seqlens_k: torch.Tensor
    key_index: torch.Tensor
    max_q: int
    max_k: int
    contexts: list[tuple[int, int]]
    num_tokens: int
    length: int
    mask: torch.Tensor | None = field(default=None, repr=False)
    flex: Any = field(default=None, repr=False)

    def to(self, device: torch.device | str, non_blocking: bool = False) -> PackedAttention:
        """A copy with its tensors on `device` (Accelerate's `send_to_device` calls this)."""
        move = functools.partial(torch.Tensor.to, device=device, non_blocking=non_blocking)
        return replace(
            self, cu_seqlens_q=move(self.cu_seqlens_q), cu_seqlens_k=move(self.cu_seqlens_k),
            key_index=move(self.key_index), mask=None if self.mask is None else move(self.mask), flex=None,
        )

    def pin_memory(self) -> PackedAttention:
        """A copy in pinned memory (the data loader's `pin_memory`)."""
        return replace(
            self, cu_seqlens_q=self.cu_seqlens_q.pin_memory(), cu_seqlens_k=self.cu_seqlens_k.pin_memory(),
            key_index=self.key_index.pin_memory(), mask=None if self.mask is None else self.mask.pin_memory(),
        )

    def block_mask(self) -> torch.Tensor:
        """The `(1, 1, T, T)` boolean mask (True = attend) of the layout, on the device of `cu_seqlens_q`: query q
        sees its segment's context and its own segment's tokens up to itself (a few vectorized ops)."""
        device = self.cu_seqlens_q.device
        starts = self.cu_seqlens_q.long()
        lengths = starts[1:] - starts[:-1]
        contexts = torch.tensor(self.contexts, dtype=torch.long, device=device).reshape(-1, 2)
        own_start = starts[:-1].repeat_interleave(lengths, output_size=self.length)[:, None]  # per query token
        context = contexts.repeat_interleave(lengths, dim=0, output_size=self.length)
        keys = torch.arange(self.length, device=device)
        queries = keys[:, None]
        keys = keys[None, :]
        allowed = ((keys >= context[:, :1]) & (keys < context[:, 1:])) | ((keys >= own_start) & (keys <= queries))
        return allowed[None, None]

    def flex_mask(self) -> Any:
        """The layout as FlexAttention's `BlockMask` (the `T x T` mask of `block_mask`, held as the blocks it touches),
        on the device of `cu_seqlens_q`: a query token's segment gives its context's range and its own start."""
        from torch.nn.attention.flex_attention import create_block_mask

        device = self.cu_seqlens_q.device
        starts = self.cu_seqlens_q.long()
        lengths = starts[1:] - starts[:-1]
        segment = torch.arange(len(lengths), device=device).repeat_interleave(lengths, output_size=self.length)
        contexts = torch.tensor(self.contexts, dtype=torch.long, device=device).reshape(-1, 2)
        context_start, context_end, own_start = contexts[:, 0], contexts[:, 1], starts[:-1]

        def mask_mod(batch, head, q, kv):
            s = segment[q]
            return ((kv >= context_start[s]) & (kv < context_end[s])) | ((kv >= own_start[s]) & (kv <= q))

        return create_block_mask(mask_mod, None, None, self.length, self.length, device=device,
                                 _compile=device.type == "cuda")  # fmt: skip


def pack_groups(
    groups: Sequence[Sequence[Sequence[int]]],
    prefix_lengths: Sequence[int],
    pad_token_id: int,
    pad_to_multiple_of: int | None = None,
) -> dict[str, Any]:
    """One packed row for `groups` of token sequences, group g sharing its first `prefix_lengths[g]` tokens (0: no
    context, each sequence runs whole); every sequence keeps at least one token after its prefix.

    Returns `input_ids`, `position_ids` `(1, T)`, `packed` (the `PackedAttention`), `last_index` `(M,)` (the row
    position each sequence's score is read at, `pooled_index`; sequences in group order) and `num_tokens` (real
    tokens). With `pad_to_multiple_of`, `T` is rounded up with padding that is a segment of its own (attending to
    itself only).
    """
    tokens: list[int] = []
    # Per segment: its first row position, its length, its first position id, its context's (start, end).
    starts: list[int] = []
    lengths: list[int] = []
    first_positions: list[int] = []
    contexts: list[tuple[int, int]] = []
    last: list[int] = []

    def segment(ids: Sequence[int], first_position: int, context: tuple[int, int]) -> None:
        starts.append(len(tokens))
        lengths.append(len(ids))
        first_positions.append(first_position)
        contexts.append(context)
        tokens.extend(ids)

    for group, p in zip(groups, prefix_lengths):
        if p < 0 or any(len(seq) <= p for seq in group):
            raise ValueError("pack_groups needs prefix lengths >= 0 and every sequence longer than its prefix.")
        context = (len(tokens), len(tokens) + p)
        if p:
            segment(group[0][:p], 0, (0, 0))
        for seq in group:
            segment(seq[p:], p, context if p else (0, 0))
            at = pooled_index(seq, pad_token_id)
            last.append(starts[-1] + at - p if at >= p else context[0] + at)
    num_tokens = len(tokens)
    extra = -num_tokens % pad_to_multiple_of if pad_to_multiple_of else 0
    if extra:
        segment([pad_token_id] * extra, 0, (0, 0))
    # Vectorized: each segment's keys are two ranges of the row (its context's, then its own tokens).
    length_q = torch.tensor(lengths, dtype=torch.long)
    start_q = torch.tensor(starts, dtype=torch.long)
    context = torch.tensor(contexts, dtype=torch.long).reshape(-1, 2)
    length_k = context[:, 1] - context[:, 0] + length_q
    range_starts = torch.stack([context[:, 0], start_q], 1).reshape(-1)
    range_lengths = torch.stack([context[:, 1] - context[:, 0], length_q], 1).reshape(-1)
    packed = PackedAttention(
        cu_seqlens_q=torch.cat([length_q.new_zeros(1), length_q.cumsum(0)]).to(torch.int32),
        cu_seqlens_k=torch.cat([length_k.new_zeros(1), length_k.cumsum(0)]).to(torch.int32),
        key_index=_ranges(range_starts, range_lengths), max_q=max(lengths), max_k=int(length_k.max()),
        contexts=contexts, num_tokens=num_tokens, length=len(tokens),
    )
    positions = _ranges(torch.tensor(first_positions, dtype=torch.long), length_q)
    return {
        "input_ids": torch.tensor([tokens], dtype=torch.long),
        "position_ids": positions[None],
        "packed": packed,
        "last_index": torch.tensor(last, dtype=torch.long),
        "num_tokens": num_tokens,
    }


def _ranges(starts: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """The concatenation of `range(start, start + length)` for each pair (long)."""
    total = int(lengths.sum())
    offsets = lengths.cumsum(0) - lengths
    within = torch.arange(total) - offsets.repeat_interleave(lengths, output_size=total)
    return starts.repeat_interleave(lengths, output_size=total) + within


# ---------------------------------------------------------------------------------------------------- the kernels


def packed_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    packed: PackedAttention | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """The attention of a packed row (`query` `(1, heads, T, dim)`, `key`/`value` `(1, kv_heads, T, dim)`): one call
    of the `varlen` kernel, or one SDPA call under the block mask. Registered as `PACKED_ATTENTION`."""
    if packed is None:
        raise RuntimeError(
            f"The {PACKED_ATTENTION!r} attention ran without a packed layout: only `packed_scores` runs a model under "
            "it (a forward of a model whose config still names it from an interrupted call?)."
        )
    if query.shape[0] != 1:
        raise ValueError(f"A packed forward takes one row; got a batch of {query.shape[0]}.")
    calls = _CALLS.get()
    if calls is not None:
        calls[0] += 1
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    dtype = query.dtype
    if query.is_cuda and torch.is_autocast_enabled("cuda"):  # as SDPA does under autocast
        dtype = torch.get_autocast_dtype("cuda")
    kernel = kernels.packed_kernel()
    if kernel == "flex":
        if dropout:
            raise ValueError(f"{kernels.PACKED_KERNEL_ENV}=flex: FlexAttention has no attention dropout (the model's "
                             f"is {dropout}); use the mask kernel, or a model without attention dropout.")
        return flex_attention(query, key, value, packed, scale, dtype), None
    scale_ok = "scale" in kernels.varlen_parameters() or abs(scale - query.shape[-1] ** -0.5) < 1e-12
    usable = dropout == 0.0 and scale_ok and kernels.varlen_usable(query.device, dtype)
    if kernel == "varlen" and not usable:
        raise ValueError(f"{kernels.PACKED_KERNEL_ENV}=varlen: torch's varlen kernel does not run this forward "
                         f"({query.device.type}, {dtype}, dropout {dropout}); unset it, or choose flex or mask.")
    if usable and kernel != "mask":
        return varlen_attention(query, key, value, packed, scale, dtype), None
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if packed.mask is None:  # built once per forward, by the first layer that needs it (no host sync)
        packed.mask = packed.block_mask()
    return sdpa_attention_forward(module, query, key, value, packed.mask, dropout=dropout, scaling=scale,
                                  is_causal=False)


def varlen_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, packed: PackedAttention, scale: float,
    dtype: torch.dtype,
) -> torch.Tensor:
    """The `varlen` kernel's reading of a packed row: `(1, T, heads, dim)` from `query` `(1, heads, T, dim)` and
    `key`/`value` `(1, kv_heads, T, dim)`. Each segment's keys are gathered (`packed.key_index`: its context's, then
    its own) into one `(sum of key lengths, kv_heads, dim)` tensor, everything cast to the compute `dtype`, and the
    kernel (`kernels.run_varlen`: causal, aligned to the end of each segment's keys; key/value heads shared by the
    query heads) runs once over every segment."""
    q = query[0].transpose(0, 1).to(dtype).contiguous()  # (T, heads, dim)
    k = key[0].transpose(0, 1).index_select(0, packed.key_index).to(dtype)  # (keys, kv_heads, dim): gathered
    v = value[0].transpose(0, 1).index_select(0, packed.key_index).to(dtype)
    out = kernels.run_varlen(q, k, v, packed.cu_seqlens_q, packed.cu_seqlens_k, packed.max_q, packed.max_k, scale)
    return out[None]


def flex_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, packed: PackedAttention, scale: float,
    dtype: torch.dtype,
) -> torch.Tensor:
    """FlexAttention's reading of a packed row: `(1, T, heads, dim)` from `query` `(1, heads, T, dim)` and `key`/`value`
    `(1, kv_heads, T, dim)`, under the layout's block mask (`PackedAttention.flex_mask`, built once per forward), the
    key/value heads shared by the query heads (not repeated), in the compute `dtype`."""
    if not query.is_cuda and torch.is_grad_enabled() and query.requires_grad:
        raise ValueError(f"{kernels.PACKED_KERNEL_ENV}=flex: FlexAttention has no backward off CUDA (torch runs its "
                         "unfused reference there, forward only); train with the mask kernel here.")
    if packed.flex is None:
        packed.flex = packed.flex_mask()
    out = kernels.run_flex(query.to(dtype), key.to(dtype), value.to(dtype), packed.flex, scale)
    return out.transpose(1, 2)


@functools.cache
def _register() -> None:
    from transformers import AttentionInterface

    # No mask function is registered for this name: transformers then builds no mask (the layout is the mask).
    AttentionInterface.register(PACKED_ATTENTION, packed_attention_forward)


@contextlib.contextmanager
def packed_attention(model: torch.nn.Module) -> Iterator[None]:
    """Run `model` (wrapped or not) under the packed attention for the duration (forward and backward, so that
    activation checkpointing recomputes with it); the attention implementation is restored after."""
    _register()
    config = classifier(model).config
    previous = config._attn_implementation
    if previous == PACKED_ATTENTION:
        yield
        return
    config._attn_implementation = PACKED_ATTENTION
    try:
        yield
    finally:
        config._attn_implementation = previous


def packed_scores(
    model: torch.nn.Module, inputs: dict[str, Any], label_index: int | None = 0, **forward_kwargs: Any
) -> tuple[torch.Tensor, Any]:
    """Scores `(M,)` of the sequences packed in `inputs` (`pack_groups`'s, or a collator's with `score_index`), and
    the model's outputs; `label_index=None` returns every output column `(M, num_labels)`.

    One call of `model` (wrapped or not: DDP, DeepSpeed, FSDP2 and PEFT see one forward) on the `(1, T)` row; the
    score head's per-position logits are captured with a forward hook and read at each sequence's last token.
    """
    head = find_score_head(model)
    if head is None:
        raise ValueError("Packed scoring needs a model with a `score` head (a `*ForSequenceClassification`).")
    input_ids = inputs["input_ids"]
    packed: PackedAttention = inputs["packed"].to(input_ids.device, non_blocking=True)
    captured: list[torch.Tensor] = []
    handle = head.register_forward_hook(lambda module, args, output: captured.append(output))
    calls = [0]
    token = _CALLS.set(calls)
    try:
        with packed_attention(model):
            outputs = model(
                input_ids=input_ids, position_ids=inputs["position_ids"], use_cache=False, packed=packed,
                **forward_kwargs,
            )
    finally:
        handle.remove()
        _CALLS.reset(token)
    if calls[0] == 0:  # the model's attention does not go through transformers' AttentionInterface
        raise RuntimeError(
            f"{type(classifier(model)).__name__} ran its own attention, not the packed layout's: its scores would mix "
            "completions. Use prefix_sharing=False (or True / 'auto', which do not pack this model)."
        )
    logits = captured[-1][0]  # (T, num_labels)
    if "score_index" in inputs:  # (row, column) per score, in the caller's order; one row
        at_last = logits[inputs["score_index"][:, 1]]
    else:
        at_last = logits[inputs["last_index"]]
    return (at_last if label_index is None else at_last[:, label_index]), outputs


PACKED_CPU_TOKENS = 8192
"""Tokens per packed row under the block-mask kernel (the CPU's, or fp32) when no `max_tokens_per_batch` is set: its
mask grows with the square of the row."""
MIN_DEVICE_TOKENS, MAX_DEVICE_TOKENS = 16384, 131072
"""The bounds of a packed row's default token budget on an accelerator (`device_token_budget`)."""


def device_token_budget(model: torch.nn.Module, share: float = 0.5) -> int:
    """Tokens per packed forward on the model's accelerator, from its free memory, as vLLM sizes its cache: `share`
    of the free bytes over one token's transient activations in a decoder layer (hidden states, q/k/v with the
    gathered context keys, the MLP), within [`MIN_DEVICE_TOKENS`, `MAX_DEVICE_TOKENS`], a multiple of 1,024. Where
    the packed layout runs under its block mask (the CPU, fp32), `PACKED_CPU_TOKENS`. Measured at each call (the
    policy, its optimizer and vLLM may have taken memory since the reward model loaded)."""
    parameter = next(model.parameters())
    if not packs_fast(parameter.device, parameter.dtype):
        return PACKED_CPU_TOKENS
    config = model.config
    hidden = getattr(config, "hidden_size", 4096)
    heads = getattr(config, "num_attention_heads", 32)
    head_dim = getattr(config, "head_dim", None) or hidden // heads
    kv = (getattr(config, "num_key_value_heads", None) or heads) * head_dim
    ffn = getattr(config, "intermediate_size", None) or 4 * hidden
    per_token = parameter.element_size() * (4 * hidden + 2 * heads * head_dim + 6 * kv + 3 * ffn)
    free, _ = torch.cuda.mem_get_info(parameter.device)
    tokens = int(free * share / per_token) // 1024 * 1024
    return max(MIN_DEVICE_TOKENS, min(MAX_DEVICE_TOKENS, tokens))
