"""Block-mask rows: the fallback layout of prefix sharing in training (`prefix_sharing=True` where the KV path
cannot run: activation checkpointing, FSDP).

A record whose completions tokenize to `P + S_1`, ..., `P + S_N` becomes the row `P S_1 S_2 ... S_N` with a block
mask (tokens of `S_i` attend causally to `P` and to `S_i` only, never to another completion), position ids that
restart at `len(P)` for every `S_i` (each completion sees the positions it would see alone) and the score of
completion i read at the last token of `S_i`. Attention costs `(P + N·C)²` over a dense mask (eager and SDPA only).
With `pack_max_tokens` several records share one row, each its own block. Scores are read from the `score` head's
output through a forward hook, so the forward still runs through the (DDP / DeepSpeed / FSDP / PEFT) wrapper once.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .model_support import find_score_head
from .planning import pooled_index, shared_prefix_length


def record_row(
    completion_ids: Sequence[Sequence[int]], prefix_length: int | None = None, pad_token_id: int | None = None
) -> tuple[list[int], list[int], list[int], list[int]]:
    """One record as `(tokens, positions, segments, score_offsets)`: segment 0 is the shared prefix, k the k-th
    completion (1-based); `score_offsets[k-1]` is the row offset where completion k's score is read: where the
    model pools it (`pooled_index`: its last token that is not `pad_token_id`). `prefix_length` defaults to
    `shared_prefix_length(completion_ids)`."""
    p = shared_prefix_length(completion_ids) if prefix_length is None else prefix_length
    prefix = list(completion_ids[0][:p])
    tokens, positions, segments, offsets = prefix[:], list(range(p)), [0] * p, []
    for k, seq in enumerate(completion_ids, start=1):
        suffix = list(seq[p:])
        start = len(tokens)
        tokens += suffix
        positions += range(p, p + len(suffix))
        segments += [k] * len(suffix)
        at = pooled_index(seq, pad_token_id)
        offsets.append(start + at - p if at >= p else at)
    return tokens, positions, segments, offsets


def plan_rows(lengths: Sequence[int], max_tokens: int | None) -> list[list[int]]:
    """Group records into rows. Without `max_tokens`, one record per row; with it, first-fit (longest first) packing
    of records into rows of at most `max(max_tokens, longest record)` tokens. Returns record indices per row."""
    if not max_tokens:
        return [[i] for i in range(len(lengths))]
    capacity = max(max_tokens, max(lengths))
    rows: list[list[int]] = []
    used: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        for r, total in enumerate(used):
            if total + lengths[i] <= capacity:
                rows[r].append(i)
                used[r] += lengths[i]
                break
        else:
            rows.append([i])
            used.append(lengths[i])
    return rows


def shared_prefix_mask(record_ids: torch.Tensor, segment_ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The attention mask `(R, 1, L, L)` for rows built in the block-mask layout (`BLOCK_MASK`): additive in `dtype`, or
    boolean (True = attend) when `dtype` is `torch.bool`.

    Query q may attend to key k when both belong to the same record, k is not after q, and k is in the shared
    prefix or in q's own completion. Padding (record id -1) attends only to itself, so no softmax row is empty.
    """
    length = record_ids.shape[1]
    same_record = record_ids[:, :, None] == record_ids[:, None, :]
    causal = torch.ones(length, length, dtype=torch.bool, device=record_ids.device).tril()
    visible = (segment_ids[:, None, :] == 0) | (segment_ids[:, :, None] == segment_ids[:, None, :])
    allowed = same_record & causal & visible & (record_ids[:, None, :] >= 0)
    allowed |= torch.eye(length, dtype=torch.bool, device=record_ids.device)
    if dtype == torch.bool:  # SDPA takes a boolean mask (True = attend) as-is: no float copy
        return allowed[:, None]
    mask = torch.zeros(allowed.shape, dtype=dtype, device=record_ids.device)
    mask.masked_fill_(~allowed, torch.finfo(dtype).min)
    return mask[:, None]


def shared_prefix_scores(
    model: torch.nn.Module, inputs: dict[str, torch.Tensor], dtype: torch.dtype, label_index: int | None = 0
) -> tuple:
    """Run the model once on prefix-shared rows and return `(scores (C,), outputs)`; `label_index=None` returns every
    output column `(C, num_labels)`.

    The forward goes through `model` (so distributed wrappers see it); the per-position logits of the score head are
    captured with a forward hook and read at `score_index`.
    """
    head = find_score_head(model)
    if head is None:
        raise ValueError("Prefix sharing needs a model with a `score` head (a `*ForSequenceClassification`).")
    captured: list[torch.Tensor] = []
    handle = head.register_forward_hook(lambda module, args, output: captured.append(output))
    try:
        config = getattr(getattr(model, "module", model), "config", None)  # through DDP / DeepSpeed wrappers
        attention = getattr(config, "_attn_implementation", None)
        mask_dtype = torch.bool if attention == "sdpa" else dtype
        mask = shared_prefix_mask(inputs["record_ids"], inputs["segment_ids"], mask_dtype)
        outputs = model(
            input_ids=inputs["input_ids"],
            attention_mask=mask,
            position_ids=inputs["position_ids"],
            use_cache=False,
        )
    finally:
        handle.remove()
    logits = captured[-1]  # (R, L, num_labels)
    index = inputs["score_index"]
    at_last = logits[index[:, 0], index[:, 1]]
    return (at_last if label_index is None else at_last[:, label_index]), outputs
