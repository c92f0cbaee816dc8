"""Rank records -> token ids -> padded batches.

Data path: a validated record (`context`, `completions[rank, completion]`) becomes one example holding the token
ids of every completion (context included) and their ranks. The collator flattens the completions of a batch of
records into one padded tensor, so each completion goes through the model exactly once; `record_index` says which
record each row belongs to, and the loss builds every ordered pair from that.

Two example forms are accepted:

- ranked: `completion_ids` (one list of ids per completion), `ranks`, optional `context_length`, `margin`;
- TRL's pairs: `chosen_ids`, `rejected_ids`, optional `margin` (what TRL's `RewardTrainer` and ours keep for two-way
  preference data). A batch of pairs is laid out exactly as TRL's `DataCollatorForPreference` does (every chosen,
  then every rejected) and carries no `ranks`: the trainer reads that layout as "row i is better than row i + B".

A missing or `None` margin is 0 (no margin), so a margin given for only some records is fine.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from transformers import PreTrainedTokenizerBase
from transformers.data.data_collator import DataCollatorMixin
from trl.trainer.utils import pad

from ..scoring.prefix_sharing import DataCollatorForSharedPrefix
from ..scoring.templating import common_prefix_length, context_token_ids, encode_conversation, left_truncate


def _is_empty_context(context: Any) -> bool:
    return context == "" or context == []


def tokenize_rank_record(
    record: dict[str, Any],
    tokenizer: PreTrainedTokenizerBase,
    max_length: int | None = None,
    truncation: str = "drop",
    template_kwargs: dict[str, Any] | None = None,
) -> tuple[dict[str, Any] | None, str]:
    """Encode every completion of `record` with its context.

    Args:
        record: A validated rank record.
        tokenizer: The reward model's tokenizer.
        max_length: Longest allowed sequence in tokens, or None for no limit.
        truncation: `"drop"` the record when a sequence is too long, or `"left"`: cut the same number of tokens
            from the left of the context of every completion (a leading BOS is kept). The completion is never cut.
        template_kwargs: Extra keyword arguments for `apply_chat_template` (TRL's `tools` and
            `chat_template_kwargs` columns), used for conversations only.

    Returns:
        `(example, status)`: `example` is `{"completion_ids": [[int]], "ranks": [int], "context_length": int}`
        (plus `margin` when the record has one), or None when dropped; `status` is "ok", "truncated" or "dropped".
        `context_length` is the number of leading tokens that are the context (shared by all completions).
    """
    kwargs = template_kwargs or {}
    context = record["context"]
    sequences = [encode_conversation(tokenizer, context, c["completion"], **kwargs) for c in record["completions"]]
    ranks = [c["rank"] for c in record["completions"]]
    if _is_empty_context(context):  # TRL's implicit prompt with nothing shared: no context tokens
        context_length = 0
    else:
        context_ids = context_token_ids(tokenizer, context, **kwargs)
        # The context's tokens are the prefix every sequence shares with the context encoded alone.
        context_length = min(common_prefix_length(seq, context_ids) for seq in sequences)
    status = "ok"
    longest = max(len(seq) for seq in sequences)
    if max_length is not None and longest > max_length:
        if truncation == "drop":
            return None, "dropped"
        # Every completion loses the same number of context tokens (as many as the longest needs), so the
        # truncated records still share their context.
        cut = longest - max_length
        truncated = [left_truncate(seq, context_length, len(seq) - cut, tokenizer.bos_token_id) for seq in sequences]
        if any(seq is None for seq in truncated):  # only completion tokens would be left to cut
            return None, "dropped"
        sequences = truncated
        context_length -= cut
        status = "truncated"
    example: dict[str, Any] = {"completion_ids": sequences, "ranks": ranks, "context_length": context_length}
    if record.get("margin") is not None:
        example["margin"] = float(record["margin"])
    return example, status


def _margins(examples: list[dict[str, Any]]) -> torch.Tensor | None:
    """`(B,)` margins when any example has one (a missing or None margin is 0), else None."""
    if not any(example.get("margin") is not None for example in examples):
        return None
    return torch.tensor([float(example.get("margin") or 0.0) for example in examples], dtype=torch.float)


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
class DataCollatorForRankedPreference(DataCollatorMixin):
    """Pad the completions of a batch of rank records into one tensor.

    Each example holds `completion_ids` (one list of token ids per completion) and `ranks`, or TRL's `chosen_ids`
    and `rejected_ids`. The batch holds:

    - `input_ids`, `attention_mask`: `(C, L)`, right-padded, C = total completions in the batch;
    - `ranks`: `(C,)` the rank of each row; `record_index`: `(C,)` the record (0..B-1) each row belongs to;
    - `margin`: `(B,)` when any example has a `margin` (missing ones are 0).

    A batch made only of TRL pairs is exactly what TRL's `DataCollatorForPreference` returns (rows: every chosen,
    then every rejected; no `ranks`/`record_index`), so the trainer handles it as TRL does.

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
            "input_ids": pad(input_ids, self.pad_token_id, padding_side="right", pad_to_multiple_of=self.pad_to_multiple_of),
            "attention_mask": pad(attention_mask, 0, padding_side="right", pad_to_multiple_of=self.pad_to_multiple_of),
        }

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
class DataCollatorForSharedPrefixPairs(DataCollatorForSharedPrefix):
    """`DataCollatorForSharedPrefix` that also takes TRL pair examples (`chosen_ids`/`rejected_ids`).

    Pairs are turned into two-way ranked examples (chosen rank 0, rejected rank 1; a missing margin is 0). A batch made
    only of pairs has its `score_index` put in TRL's pair layout (every chosen, then every rejected) and no
    `ranks`/`record_index`, so the trainer reads it as TRL pairs. Ranked examples pass through unchanged.
    """

    def torch_call(self, examples: list[dict[str, Any]]) -> dict[str, Any]:
        if not any(is_pair_example(example) for example in examples):
            margin = _margins(examples)
            if margin is not None:  # the parent reads `margin` from every example when the first has one
                examples = [{**e, "margin": float(m)} for e, m in zip(examples, margin.tolist())]
            return super().torch_call(examples)
        pairs = all(is_pair_example(example) for example in examples)
        margin = _margins(examples)
        converted = [pair_to_ranked(e) if is_pair_example(e) else e for e in examples]
        if margin is not None:
            converted = [{**e, "margin": float(m)} for e, m in zip(converted, margin.tolist())]
        output = super().torch_call(converted)
        if pairs and "score_index" in output:
            n = len(examples)
            order = torch.cat([torch.arange(n) * 2, torch.arange(n) * 2 + 1])  # record order -> chosen..., rejected...
            output["score_index"] = output["score_index"][order]
            output.pop("ranks", None)
            output.pop("record_index", None)
        return output
