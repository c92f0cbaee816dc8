"""Collators: examples -> the padded batches `RankedRewardTrainer` and `RegressionRewardTrainer` train on.

Examples come in two forms (see `trl_rm_env.trainer.examples`):

- ranked: `completion_ids` (one list of ids per completion, context included), `ranks`, optional `context_length`,
  `margin`;
- TRL's pairs: `chosen_ids`, `rejected_ids`, optional `margin`. A batch made only of pairs is laid out as TRL's
  `DataCollatorForPreference` lays it out (every chosen, then every rejected) and carries no `ranks`: the trainer
  reads that layout as "row i is better than row i + B".

A missing or `None` margin is 0. Four layouts, each a collator here:

- plain (`DataCollatorForRankedPreference`): every completion its own padded row, `record_index` tells which record
  it belongs to, and the loss forms every ordered pair from that;
- packed (`DataCollatorForPackedContext`, the default on a GPU): the whole batch in one padding-free row, each
  record's context once, its completions after it (`trl_rm_env.sharing.packed`);
- shared context by KV cache (`DataCollatorForSharedContext`, the default on the CPU): each record's context once,
  its completions against it (`trl_rm_env.sharing.kv`);
- block-mask rows (`DataCollatorForSharedPrefix`, `prefix_sharing=True` under activation checkpointing or FSDP):
  context and completions in one row under a block mask, optionally packed (`trl_rm_env.sharing.mask`).

With `pack_max_tokens`, the packed and KV collators bound each forward: a batch whose records hold more tokens
(context once, completions' own tokens) is cut into `chunks`, runs of consecutive records under the budget, each a batch
of the layout; the trainer runs one forward and backward per chunk in the same step (`RankedRewardTrainer`).

Regression examples (`input_ids`, `targets`) have their own, `DataCollatorForRegression`.

    >>> collator = DataCollatorForRankedPreference(pad_token_id=0)
    >>> batch = collator([{"completion_ids": [[5, 6, 7], [5, 8]], "ranks": [0, 1]}])
    >>> batch["input_ids"].tolist(), batch["ranks"].tolist(), batch["record_index"].tolist()
    ([[5, 6, 7], [5, 8, 0]], [0, 1], [0, 0])
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from transformers.data.data_collator import DataCollatorMixin
from trl.trainer.utils import pad

from ..sharing import (
    collate_shared_context,
    pack_groups,
    plan_passes,
    plan_rows,
    record_row,
    shared_prefix_length,
)
from ..sharing.kv import pad_to_multiple
from ..sharing.planning import contiguous_runs, record_tokens


def _margins(examples: list[dict[str, Any]]) -> torch.Tensor | None:
    """`(B,)` margins when any example has one (a missing or None margin is 0), else None."""
    if not any(example.get("margin") is not None for example in examples):
        return None
    return torch.tensor([float(example.get("margin") or 0.0) for example in examples], dtype=torch.float)


def _record_fields(examples: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
    """What the shared layouts' batches carry beside their tokens: `ranks` and `record_index` `(C,)` (completions in
    record order), and `margin` `(B,)` when the examples have one (`_TakesPairs` puts one in every example)."""
    fields = {
        "ranks": torch.tensor([r for example in examples for r in example["ranks"]], dtype=torch.long),
        "record_index": torch.tensor(
            [i for i, example in enumerate(examples) for _ in example["completion_ids"]], dtype=torch.long
        ),
    }
    if "margin" in examples[0]:
        fields["margin"] = torch.tensor([example["margin"] for example in examples], dtype=torch.float)
    return fields


def is_pair_example(example: dict[str, Any]) -> bool:
    """Whether `example` is in TRL's pair form (`chosen_ids`/`rejected_ids`) rather than the ranked form."""
    return "chosen_ids" in example and "completion_ids" not in example


def pair_to_ranked(example: dict[str, Any]) -> dict[str, Any]:
    """A TRL pair example (`chosen_ids`, `rejected_ids`, [`margin`]) as a two-way ranked example."""
    out = {"completion_ids": [example["chosen_ids"], example["rejected_ids"]], "ranks": [0, 1]}
    if example.get("margin") is not None:
        out["margin"] = example["margin"]
    return out


@dataclass
class _RightPadding(DataCollatorMixin):
    """Right-pads token-id lists into `input_ids` and `attention_mask`.

    Args:
        pad_token_id: Token id used for padding.
        pad_to_multiple_of: If set, pad the length to a multiple of this value.
        return_tensors: Only `"pt"` is supported.
    """

    pad_token_id: int
    pad_to_multiple_of: int | None = None
    return_tensors: str = "pt"

    def _pad(self, sequences: list[list[int]]) -> dict[str, torch.Tensor]:
        input_ids = [torch.tensor(ids) for ids in sequences]
        attention_mask = [torch.ones_like(ids) for ids in input_ids]
        return {
            "input_ids": pad(
                input_ids, self.pad_token_id, padding_side="right", pad_to_multiple_of=self.pad_to_multiple_of
            ),
            "attention_mask": pad(attention_mask, 0, padding_side="right", pad_to_multiple_of=self.pad_to_multiple_of),
        }


@dataclass
class DataCollatorForRankedPreference(_RightPadding):
    """Pad the completions of a batch of rank records into one tensor.

    Each example holds `completion_ids` (one list of token ids per completion) and `ranks`, or TRL's `chosen_ids`
    and `rejected_ids`. The batch holds:

    - `input_ids`, `attention_mask`: `(C, L)`, right-padded, C = total completions in the batch;
    - `ranks`: `(C,)` the rank of each row; `record_index`: `(C,)` the record (0..B-1) each row belongs to;
    - `margin`: `(B,)` when any example has a `margin` (missing ones are 0).

    A batch made only of TRL pairs is exactly what TRL's `DataCollatorForPreference` returns (rows: every chosen,
    then every rejected; no `ranks`/`record_index`), so the trainer handles it as TRL does.

    Args: `pad_token_id`, `pad_to_multiple_of` (the padded length's multiple), `return_tensors` (only `"pt"`).
    """

    def torch_call(self, examples: list[dict[str, Any]]) -> dict[str, Any]:
        margin = _margins(examples)
        if all(is_pair_example(example) for example in examples):
            output = self._pad(
                [example["chosen_ids"] for example in examples] + [example["rejected_ids"] for example in examples]
            )
        else:
            examples = [pair_to_ranked(e) if is_pair_example(e) else e for e in examples]
            output = self._pad([ids for example in examples for ids in example["completion_ids"]])
            output["ranks"] = torch.tensor([r for example in examples for r in example["ranks"]], dtype=torch.long)
            output["record_index"] = torch.tensor(
                [i for i, example in enumerate(examples) for _ in example["completion_ids"]], dtype=torch.long
            )
        if margin is not None:
            output["margin"] = margin
        return output


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
        built = [record_row(example["completion_ids"], pad_token_id=self.pad_token_id) for example in examples]
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
        score_index = [(where[i][0], where[i][1] + offset) for i in range(len(examples)) for offset in built[i][3]]
        output = {
            "input_ids": input_ids,
            "position_ids": position_ids,
            "record_ids": record_ids,
            "segment_ids": segment_ids,
            "score_index": torch.tensor(score_index, dtype=torch.long),
            **_record_fields(examples),
        }
        return output


class _BoundedForwards:
    """Bounds the tokens of one forward (`pack_max_tokens`) for a shared layout's collator: a batch of ranked examples
    whose records hold more tokens (`record_tokens`: context once, each completion's own tokens) is cut into runs of
    consecutive records under the budget (a record over it alone is a run), each collated by the layout. The batch is
    then `{"chunks": [batch, ...], "ranks", "record_index", "margin"}` (the whole batch's, completions in record order,
    for metrics); each chunk has its own `ranks`, `record_index` (from 0) and `margin`. Under the budget, the
    layout's batch unchanged."""

    def torch_call(self, examples: list[dict[str, Any]]) -> dict[str, Any]:
        budget = self.pack_max_tokens
        if not budget or len(examples) < 2:
            return self._collate(examples)
        runs = contiguous_runs([record_tokens(e["completion_ids"]) for e in examples], budget)
        if len(runs) == 1:
            return self._collate(examples)
        return {"chunks": [self._collate(examples[a:b]) for a, b in runs], **_record_fields(examples)}

    def _collate(self, examples: list[dict[str, Any]]) -> dict[str, Any]:
        raise NotImplementedError


@dataclass
class DataCollatorForSharedContext(_BoundedForwards, DataCollatorForSharedPrefix):
    """Collate rank records for the shared-context (KV cache) path of `RankedRewardTrainer`.

    Each record's completions share its longest common token prefix (the rendered context), encoded once; the batch
    holds the tensors of `collate_shared_context`, `score_index` `(C, 2)` (completion row, column of its last token;
    completions in record order), `ranks`, `record_index` (and `margin`) as in `DataCollatorForRankedPreference`.
    The contexts of a batch are one padded forward, the completions another (records never attend to each other).

    Args:
        pad_token_id: Token id used for padding.
        pack_max_tokens: If set, the most tokens of records (each context once) in one forward: a batch with more
            is cut into `chunks` of consecutive records (`_BoundedForwards`).
        pad_to_multiple_of: If set, pad both lengths to a multiple of this value (one pass each).
        split_passes: Run contexts (and completions) of similar lengths in separate passes (`plan_passes`: little
            padding). Off under DeepSpeed ZeRO-3, where every rank must run the same number of layer calls.
    """

    split_passes: bool = True

    def _collate(self, examples: list[dict[str, Any]]) -> dict[str, Any]:
        groups, prefixes = [], []
        for example in examples:
            group = example["completion_ids"]
            p = shared_prefix_length(group)
            if p >= 1:
                groups.append(group)
                prefixes.append(p)
                continue
            # Completions that share no token: one group each, all but the last token as context (a single-token
            # completion gets an empty context). Exact either way.
            for seq in group:
                groups.append([seq])
                prefixes.append(len(seq) - 1)
        output = collate_shared_context(groups, prefixes, self.pad_token_id)
        if self.pad_to_multiple_of:
            output = pad_to_multiple(output, self.pad_to_multiple_of, self.pad_token_id)
        elif self.split_passes:  # contexts (and completions) of similar lengths in one pass each: little padding
            output["prefix_chunks"] = plan_passes(prefixes)
            output["completion_chunks"] = plan_passes(output["completion_mask"].sum(1).tolist())
        rows = torch.arange(output["completion_ids"].shape[0])
        output["score_index"] = torch.stack([rows, output.pop("last_index")], dim=1)
        return output | _record_fields(examples)


@dataclass
class DataCollatorForPackedContext(_BoundedForwards, DataCollatorMixin):
    """Collate rank records into ONE packed, padding-free row for the packed path of `RankedRewardTrainer`.

    Each record's context (its completions' longest common token prefix) once, then each completion's own tokens,
    positions restarting after the context (`trl_rm_env.sharing.pack_groups`). The batch holds `input_ids` and
    `position_ids` `(1, T)`, `packed` (the `PackedAttention` layout, built here on the CPU), `num_tokens` (real
    tokens), `score_index` `(C, 2)` (row 0, column of each completion's last token; completions in record order),
    `ranks`, `record_index` (and `margin`) as in `DataCollatorForRankedPreference`.

    Args:
        pad_token_id: Token id used for padding.
        pad_to_multiple_of: If set, pad the row to a multiple of this length (the padding attends to itself only).
        pack_max_tokens: If set, the most tokens in one packed row: a batch with more is cut into `chunks` of
            consecutive records, one packed row each (`_BoundedForwards`).
    """

    pad_token_id: int
    pad_to_multiple_of: int | None = None
    pack_max_tokens: int | None = None
    return_tensors: str = "pt"

    def _collate(self, examples: list[dict[str, Any]]) -> dict[str, Any]:
        groups = [example["completion_ids"] for example in examples]
        output = pack_groups(groups, [shared_prefix_length(g) for g in groups], self.pad_token_id,
                             self.pad_to_multiple_of)
        last = output.pop("last_index")
        output["score_index"] = torch.stack([torch.zeros_like(last), last], dim=1)
        return output | _record_fields(examples)


class _TakesPairs:
    """Lets a collator of ranked examples take TRL pair examples (`chosen_ids`/`rejected_ids`) too.

    Pairs become two-way ranked examples (chosen rank 0, rejected rank 1; a missing margin is 0). A batch made only
    of pairs has its `score_index` put in TRL's pair layout (every chosen, then every rejected; a batch cut into
    `chunks` carries that order as `score_order` instead) and no `ranks`/`record_index`, so the trainer reads it as
    TRL pairs. Ranked examples pass through unchanged.
    """

    def torch_call(self, examples: list[dict[str, Any]]) -> dict[str, Any]:
        pairs = all(is_pair_example(example) for example in examples)
        margin = _margins(examples)
        converted = [pair_to_ranked(e) if is_pair_example(e) else e for e in examples]
        if margin is not None:  # the layouts read `margin` from every example when the first has one
            converted = [{**e, "margin": float(m)} for e, m in zip(converted, margin.tolist())]
        output = super().torch_call(converted)
        if pairs and ("score_index" in output or "chunks" in output):
            n = len(examples)
            order = torch.cat([torch.arange(n) * 2, torch.arange(n) * 2 + 1])  # record order -> chosen..., rejected...
            if "chunks" in output:  # the chunks' scores, concatenated in record order, are reordered by the trainer
                output["score_order"] = order
            else:
                output["score_index"] = output["score_index"][order]
            output.pop("ranks", None)
            output.pop("record_index", None)
        return output


@dataclass
class DataCollatorForSharedPrefixPairs(_TakesPairs, DataCollatorForSharedPrefix):
    """`DataCollatorForSharedPrefix` that also takes TRL pair examples (`chosen_ids`/`rejected_ids`)."""


@dataclass
class DataCollatorForSharedContextPairs(_TakesPairs, DataCollatorForSharedContext):
    """`DataCollatorForSharedContext` that also takes TRL pair examples (`chosen_ids`/`rejected_ids`)."""


@dataclass
class DataCollatorForPackedContextPairs(_TakesPairs, DataCollatorForPackedContext):
    """`DataCollatorForPackedContext` that also takes TRL pair examples (`chosen_ids`/`rejected_ids`)."""


@dataclass
class DataCollatorForRegression(_RightPadding):
    """Pad a batch of regression examples (`input_ids`, `targets`).

    The batch holds `input_ids`, `attention_mask`: `(B, L)` right-padded, and `targets`: `(B, K)` float32, NaN
    where an attribute is missing.

    Args: `pad_token_id`, `pad_to_multiple_of` (the padded length's multiple), `return_tensors` (only `"pt"`).
    """

    def torch_call(self, examples: list[dict[str, Any]]) -> dict[str, Any]:
        output = self._pad([example["input_ids"] for example in examples])
        output["targets"] = torch.tensor([example["targets"] for example in examples], dtype=torch.float32)
        return output
