"""Prefix sharing: one row per record, the shared context once and every completion after it.

Wang & Hegde (2024), "Accelerating Direct Preference Optimization with Prefix Sharing", for DPO; here for reward
models with N ranked completions. A record whose completions tokenize to `P + S_1`, ..., `P + S_N` (P the longest
shared prefix, in practice the rendered context) becomes the row `P S_1 S_2 ... S_N` with

- a block mask: tokens of `S_i` attend causally to `P` and to `S_i` only, never to another completion;
- position ids that restart at `len(P)` for every `S_i`, so each completion sees exactly the positions it would
  see alone;
- the score of completion i read at the last token of `S_i`.

Mathematically every score equals the score of `P + S_i` run alone; numerically they agree to float rounding
(the tests check 1e-4 in fp32). The context goes through the model once instead of N times. With `pack_max_tokens`,
several records share one row (each record its own block), which removes most padding (padding-free packing).

The mask is passed to the model as a 4-D additive float mask, which transformers hands as-is to the eager and SDPA
attention kernels. Scores are taken from the output of the model's `score` head through a forward hook, so the
forward still runs through the (DDP / DeepSpeed / FSDP / PEFT) wrapper.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from transformers.data.data_collator import DataCollatorMixin

from .templating import common_prefix_length

SUPPORTED_ATTENTION = ("eager", "sdpa")


def shared_prefix_length(sequences: Sequence[Sequence[int]]) -> int:
    """Longest prefix shared by every sequence, capped so each sequence keeps at least one token of its own."""
    first = sequences[0]
    n = min(len(s) for s in sequences) - 1
    for seq in sequences[1:]:
        n = min(n, common_prefix_length(first, seq))
    return max(n, 0)


def record_row(
    completion_ids: Sequence[Sequence[int]], prefix_length: int | None = None
) -> tuple[list[int], list[int], list[int], list[int]]:
    """One record as `(tokens, positions, segments, score_offsets)`: segment 0 is the shared prefix, k the k-th
    completion (1-based); `score_offsets[k-1]` is the row offset of completion k's last token. `prefix_length`
    defaults to `shared_prefix_length(completion_ids)`."""
    p = shared_prefix_length(completion_ids) if prefix_length is None else prefix_length
    prefix = list(completion_ids[0][:p])
    tokens, positions, segments, offsets = prefix[:], list(range(p)), [0] * p, []
    for k, seq in enumerate(completion_ids, start=1):
        suffix = list(seq[p:])
        tokens += suffix
        positions += range(p, p + len(suffix))
        segments += [k] * len(suffix)
        offsets.append(len(tokens) - 1)
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
    """The attention mask `(R, 1, L, L)` for rows built by `DataCollatorForSharedPrefix`: additive in `dtype`, or
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


@dataclass
class DataCollatorForSharedPrefix(DataCollatorMixin):
    """Collate rank records into prefix-shared (and optionally packed) rows.

    The batch holds `input_ids`, `position_ids`, `record_ids`, `segment_ids` (all `(R, L)`, right-padded),
    `score_index` `(C, 2)` (row, column of each completion's last token, completions in record order), `ranks` and
    `record_index` `(C,)` as in `DataCollatorForRankedPreference`, and `margin` `(B,)` when present. The trainer
    builds the 4-D mask from `record_ids` and `segment_ids`.

    Args:
        pad_token_id: Token id used for padding.
        pack_max_tokens: If set, pack several records into a row of up to this many tokens.
        pad_to_multiple_of: If set, pad the row length to a multiple of this value.
    """

    pad_token_id: int
    pack_max_tokens: int | None = None
    pad_to_multiple_of: int | None = None
    return_tensors: str = "pt"

    def torch_call(self, examples: list[dict[str, Any]]) -> dict[str, Any]:
        built = [record_row(example["completion_ids"]) for example in examples]
        rows = plan_rows([len(b[0]) for b in built], self.pack_max_tokens)
        row_len = max(sum(len(built[i][0]) for i in row) for row in rows)
        if self.pad_to_multiple_of:
            row_len = -(-row_len // self.pad_to_multiple_of) * self.pad_to_multiple_of
        shape = (len(rows), row_len)
        input_ids = torch.full(shape, self.pad_token_id, dtype=torch.long)
        position_ids = torch.zeros(shape, dtype=torch.long)
        record_ids = torch.full(shape, -1, dtype=torch.long)
        segment_ids = torch.full(shape, -1, dtype=torch.long)
        where: dict[int, tuple[int, int]] = {}  # record -> (row, start column)
        for r, row in enumerate(rows):
            start = 0
            for i in row:
                tokens, positions, segments, _ = built[i]
                end = start + len(tokens)
                input_ids[r, start:end] = torch.tensor(tokens)
                position_ids[r, start:end] = torch.tensor(positions)
                segment_ids[r, start:end] = torch.tensor(segments)
                record_ids[r, start:end] = i
                where[i] = (r, start)
                start = end
        score_index = [
            (where[i][0], where[i][1] + offset) for i in range(len(examples)) for offset in built[i][3]
        ]
        output = {
            "input_ids": input_ids,
            "position_ids": position_ids,
            "record_ids": record_ids,
            "segment_ids": segment_ids,
            "score_index": torch.tensor(score_index, dtype=torch.long),
            "ranks": torch.tensor([r for example in examples for r in example["ranks"]], dtype=torch.long),
            "record_index": torch.tensor(
                [i for i, example in enumerate(examples) for _ in example["completion_ids"]], dtype=torch.long
            ),
        }
        if "margin" in examples[0]:
            output["margin"] = torch.tensor([example["margin"] for example in examples], dtype=torch.float)
        return output


def find_score_head(model: torch.nn.Module) -> torch.nn.Module | None:
    """The `score` head of a `*ForSequenceClassification` model, through DDP/DeepSpeed/FSDP/PEFT wrappers.

    The first module named `score` in traversal order (a PEFT `modules_to_save` wrapper comes before its copies).
    """
    for name, module in model.named_modules():
        if name.rsplit(".", 1)[-1] == "score":
            return module
    return None


def shared_prefix_scores(
    model: torch.nn.Module, inputs: dict[str, torch.Tensor], dtype: torch.dtype, label_index: int = 0
) -> tuple:
    """Run the model once on prefix-shared rows and return `(scores (C,), outputs)`.

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
    return logits[index[:, 0], index[:, 1], label_index], outputs


__all__ = [
    "DataCollatorForSharedPrefix",
    "SUPPORTED_ATTENTION",
    "find_score_head",
    "plan_rows",
    "record_row",
    "shared_prefix_length",
    "shared_prefix_mask",
    "shared_prefix_scores",
]
