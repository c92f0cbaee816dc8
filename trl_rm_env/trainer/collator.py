"""Rank records -> token ids -> padded batches.

Data path: a validated record (`context`, `completions[rank, completion]`) becomes one example holding the token
ids of every completion (context included) and their ranks. The collator flattens the completions of a batch of
records into one padded tensor, so each completion goes through the model exactly once; `record_index` says which
record each row belongs to, and the loss builds every ordered pair from that.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from transformers import PreTrainedTokenizerBase
from transformers.data.data_collator import DataCollatorMixin
from trl.trainer.utils import pad

from ..scoring.templating import common_prefix_length, context_token_ids, encode_conversation, left_truncate


def tokenize_rank_record(
    record: dict[str, Any],
    tokenizer: PreTrainedTokenizerBase,
    max_length: int | None = None,
    truncation: str = "drop",
) -> tuple[dict[str, Any] | None, str]:
    """Encode every completion of `record` with its context.

    Args:
        record: A validated rank record.
        tokenizer: The reward model's tokenizer.
        max_length: Longest allowed sequence in tokens, or None for no limit.
        truncation: `"drop"` the record when a sequence is too long, or `"left"`: cut the same number of tokens
            from the left of the context of every completion (a leading BOS is kept). The completion is never cut.

    Returns:
        `(example, status)`: `example` is `{"completion_ids": [[int]], "ranks": [int], "context_length": int}`
        (plus `margin` when the record has one), or None when dropped; `status` is "ok", "truncated" or "dropped".
        `context_length` is the number of leading tokens that are the context (shared by all completions).
    """
    sequences = [encode_conversation(tokenizer, record["context"], c["completion"]) for c in record["completions"]]
    ranks = [c["rank"] for c in record["completions"]]
    context_ids = context_token_ids(tokenizer, record["context"])
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


@dataclass
class DataCollatorForRankedPreference(DataCollatorMixin):
    """Pad the completions of a batch of rank records into one tensor.

    Each example holds `completion_ids` (one list of token ids per completion) and `ranks`. The batch holds:

    - `input_ids`, `attention_mask`: `(C, L)`, right-padded, C = total completions in the batch;
    - `ranks`: `(C,)` the rank of each row; `record_index`: `(C,)` the record (0..B-1) each row belongs to;
    - `margin`: `(B,)` when the examples have a `margin`.

    Args:
        pad_token_id: Token id used for padding.
        pad_to_multiple_of: If set, pad the length to a multiple of this value.
        return_tensors: Only `"pt"` is supported.
    """

    pad_token_id: int
    pad_to_multiple_of: int | None = None
    return_tensors: str = "pt"

    def torch_call(self, examples: list[dict[str, Any]]) -> dict[str, Any]:
        input_ids = [torch.tensor(ids) for example in examples for ids in example["completion_ids"]]
        attention_mask = [torch.ones_like(ids) for ids in input_ids]
        output = {
            "input_ids": pad(input_ids, self.pad_token_id, padding_side="right", pad_to_multiple_of=self.pad_to_multiple_of),
            "attention_mask": pad(attention_mask, 0, padding_side="right", pad_to_multiple_of=self.pad_to_multiple_of),
            "ranks": torch.tensor([r for example in examples for r in example["ranks"]], dtype=torch.long),
            "record_index": torch.tensor(
                [i for i, example in enumerate(examples) for _ in example["completion_ids"]], dtype=torch.long
            ),
        }
        if "margin" in examples[0]:
            output["margin"] = torch.tensor([example["margin"] for example in examples], dtype=torch.float)
        return output
