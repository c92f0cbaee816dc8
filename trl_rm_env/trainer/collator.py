"""Collators: examples -> the padded batches `RankedRewardTrainer` and `RegressionRewardTrainer` train on.

Examples come in two forms (see `trl_rm_env.trainer.examples`):

- ranked: `completion_ids` (one list of ids per completion, context included), `ranks`, optional `context_length`,
  `margin`;
- TRL's pairs: `chosen_ids`, `rejected_ids`, optional `margin`. A batch made only of pairs is laid out as TRL's
  `DataCollatorForPreference` lays it out (every chosen, then every rejected) and carries no `ranks`: the trainer
  reads that layout as "row i is better than row i + B".

A missing or `None` margin is 0. One collator, `DataCollatorForRankedPreference`, lays out a batch in any of the
four layouts (`trl_rm_env.sharing.layouts`, which own how each lays a batch out), ranked and pair examples alike:

- plain (`PLAIN`, the default): every completion its own padded row, `record_index` tells which record it belongs
  to, and the loss forms every ordered pair from that;
- packed (`PACKED`, the trainer's default on a GPU): the whole batch in one padding-free row, each record's context
  once, its completions after it (`trl_rm_env.sharing.packed`);
- shared context by KV cache (`KV_CACHE`, the default on the CPU): each record's context once, its completions
  against it (`trl_rm_env.sharing.kv`);
- block-mask rows (`BLOCK_MASK`, `prefix_sharing=True` under activation checkpointing or FSDP): context and
  completions in one row under a block mask, optionally packed (`trl_rm_env.sharing.mask`).

With `pack_max_tokens`, the packed and KV layouts bound each forward: a batch whose records hold more tokens
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

from ..sharing.layouts import PLAIN, Layout, right_padded
from ..sharing.planning import contiguous_runs, record_tokens
from .ensemble import bootstrap_weights


def _margins(examples: list[dict[str, Any]]) -> torch.Tensor | None:
    """`(B,)` margins when any example has one (a missing or None margin is 0), else None."""
    if not any(example.get("margin") is not None for example in examples):
        return None
    return torch.tensor([float(example.get("margin") or 0.0) for example in examples], dtype=torch.float)


def _record_fields(examples: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
    """What the shared layouts' batches carry beside their tokens: `ranks` and `record_index` `(C,)` (completions in
    record order), and `margin` `(B,)` when the examples have one (a shared layout's batch puts one in every example
    when any has one)."""
    fields = _ranks_and_records(examples)
    if "margin" in examples[0]:
        fields["margin"] = torch.tensor([example["margin"] for example in examples], dtype=torch.float)
    return fields


def _ranks_and_records(examples: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
    """`ranks` and `record_index` `(C,)`: each completion's rank and record, completions in record order; and
    `bootstrap_weights` `(B, K)` when the examples carry them (`ensemble_heads`)."""
    out = {
        "ranks": torch.tensor([r for example in examples for r in example["ranks"]], dtype=torch.long),
        "record_index": torch.tensor(
            [i for i, example in enumerate(examples) for _ in example["completion_ids"]], dtype=torch.long
        ),
    }
    if examples and "bootstrap" in examples[0]:
        out["bootstrap_weights"] = torch.stack([example["bootstrap"] for example in examples])
    return out


def _with_bootstrap(examples: list[dict[str, Any]], heads: int, seed: int) -> list[dict[str, Any]]:
    """Ranked `examples` each with its `bootstrap` weights `(K,)` (`trl_rm_env.trainer.ensemble`) when `heads` > 1."""
    if heads <= 1:
        return examples
    weights = bootstrap_weights([example["completion_ids"] for example in examples], heads, seed)
    return [{**example, "bootstrap": w} for example, w in zip(examples, weights)]


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
        return right_padded([torch.tensor(ids) for ids in sequences], self.pad_token_id, self.pad_to_multiple_of)


@dataclass
class DataCollatorForRankedPreference(_RightPadding):
    """Collate rank records (or TRL pairs) into the batches of a layout (`trl_rm_env.sharing.layouts`): one collator
    for every layout, the layout object saying how the tokens are laid out.

    Each example holds `completion_ids` (one list of token ids per completion) and `ranks`, or TRL's `chosen_ids`
    and `rejected_ids`; pairs become two-way ranked examples (chosen rank 0, rejected rank 1; a missing margin is 0).
    Every batch holds its layout's tokens (`Layout.collate`), `ranks` and `record_index` `(C,)` (each completion's
    rank and record, completions in record order) and `margin` `(B,)` when any example has one. With the plain
    layout (`PLAIN`, the default):

    - `input_ids`, `attention_mask`: `(C, L)`, right-padded, C = total completions in the batch;
    - a batch made only of TRL pairs is exactly what TRL's `DataCollatorForPreference` returns (rows: every chosen,
      then every rejected; no `ranks`/`record_index`), so the trainer handles it as TRL does.

    With a shared layout (`PACKED`, `KV_CACHE`, `BLOCK_MASK`: each record's context once), a batch made only of pairs
    has its `score_index` put in TRL's pair layout (every chosen, then every rejected; a batch cut into `chunks`
    carries that order as `score_order` instead) and no `ranks`/`record_index`. Where the layout `cuts_chunks`
    (packed, KV) and `pack_max_tokens` is set, a batch whose records hold more tokens (`record_tokens`: context once,
    each completion's own tokens) is cut into runs of consecutive records under the budget (a record over it alone is
    a run), each laid out on its own: the batch is then `{"chunks": [batch, ...], "ranks", "record_index",
    "margin"}` (the whole batch's, for metrics); each chunk has its own `ranks`, `record_index` (from 0) and
    `margin`.

    Args:
        pad_token_id: Token id used for padding.
        pad_to_multiple_of: If set, pad lengths to a multiple of this value (the packed row's padding attends to
            itself only).
        return_tensors: Only `"pt"`.
        layout: The layout of the batches (`PLAIN`, `PACKED`, `KV_CACHE`, `BLOCK_MASK`).
        pack_max_tokens: Packed and KV: the most tokens of records (each context once) in one forward, a batch with
            more cut into `chunks`; block mask: pack several records into a row of up to this many tokens.
        split_passes: KV: run contexts (and completions) of similar lengths in separate passes (`plan_passes`:
            little padding). Off under DeepSpeed ZeRO-3, where every rank must run the same number of layer calls.
        ensemble_heads, ensemble_seed: Above 1 head, each record's bootstrap weights, `bootstrap_weights` `(B, K)`
            (`trl_rm_env.trainer.ensemble`).
    """

    layout: Layout = PLAIN
    pack_max_tokens: int | None = None
    split_passes: bool = True
    ensemble_heads: int = 1
    ensemble_seed: int = 0

    def torch_call(self, examples: list[dict[str, Any]]) -> dict[str, Any]:
        if self.layout.shares_contexts:
            return self._shared(examples)
        margin = _margins(examples)
        if all(is_pair_example(example) for example in examples):
            output = self._pad(
                [example["chosen_ids"] for example in examples] + [example["rejected_ids"] for example in examples]
            )
            if self.ensemble_heads > 1:  # one row per record (TRL's pair layout: record i is rows i and B + i)
                ranked = _with_bootstrap([pair_to_ranked(e) for e in examples], self.ensemble_heads, self.ensemble_seed)
                output["bootstrap_weights"] = torch.stack([example["bootstrap"] for example in ranked])
        else:
            examples = [pair_to_ranked(e) if is_pair_example(e) else e for e in examples]
            examples = _with_bootstrap(examples, self.ensemble_heads, self.ensemble_seed)
            output = self.layout.collate(examples, self) | _ranks_and_records(examples)
        if margin is not None:
            output["margin"] = margin
        return output

    def _shared(self, examples: list[dict[str, Any]]) -> dict[str, Any]:
        """A shared layout's batch (each record's context once)."""
        pairs = all(is_pair_example(example) for example in examples)
        margin = _margins(examples)
        examples = [pair_to_ranked(e) if is_pair_example(e) else e for e in examples]
        examples = _with_bootstrap(examples, self.ensemble_heads, self.ensemble_seed)
        if margin is not None:  # every example carries one when any does (a missing margin is 0)
            examples = [{**e, "margin": float(m)} for e, m in zip(examples, margin.tolist())]
        else:
            examples = [{k: v for k, v in e.items() if k != "margin"} for e in examples]
        output = self._bounded(examples)
        if pairs:
            n = len(examples)
            order = torch.cat([torch.arange(n) * 2, torch.arange(n) * 2 + 1])  # record order -> chosen..., rejected...
            if "chunks" in output:  # the chunks' scores, concatenated in record order, are reordered by the trainer
                output["score_order"] = order
            else:
                output["score_index"] = output["score_index"][order]
            output.pop("ranks", None)
            output.pop("record_index", None)
        return output

    def _bounded(self, examples: list[dict[str, Any]]) -> dict[str, Any]:
        budget = self.pack_max_tokens if self.layout.cuts_chunks else None
        runs = [(0, len(examples))]
        if budget and len(examples) > 1:
            runs = contiguous_runs([record_tokens(e["completion_ids"]) for e in examples], budget)
        if len(runs) == 1:
            return self.layout.collate(examples, self) | _record_fields(examples)
        chunks = [self.layout.collate(examples[a:b], self) | _record_fields(examples[a:b]) for a, b in runs]
        return {"chunks": chunks, **_record_fields(examples)}


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
