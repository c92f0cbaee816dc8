"""Datasets -> training examples: every dataset shape `RankedRewardTrainer` accepts, prepared as TRL would.

- rank-schema records (`context`, `completions[rank, completion]`): validated (raise or skip, `on_invalid`) and
  tokenized into `completion_ids` (each completion with its context), `ranks`, `context_length` (and `margin`);
- TRL preference rows (`chosen`/`rejected`, explicit or implicit prompt, text or conversations, `tools` and
  `chat_template_kwargs`): TRL's processed columns `chosen_ids`/`rejected_ids` holding the ids TRL's `RewardTrainer`
  produces, the original columns kept (with EOS appended to text responses, as TRL does);
- TRL's tokenized columns (`chosen_ids`/`rejected_ids`, or the legacy `chosen_input_ids`/`rejected_input_ids`,
  renamed with TRL's FutureWarning): TRL's `max_length` filter, or left truncation of the shared prefix;
- streaming datasets: validated and tokenized lazily.

Over-long records are dropped (TRL's behaviour) or left-truncated (`truncation="left"`: the context loses the same
number of tokens for every completion, the completion is never cut); the counts are logged per set.
"""

from __future__ import annotations

import json
import logging
import math
import warnings
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from datasets import Dataset, IterableDataset
from transformers import PreTrainedTokenizerBase
from trl.trainer.utils import global_then_local_main_first

from ..data.converters import binary_to_rank, fold_context_into_completions, record_validation_view
from ..data.loaders import validate_records
from ..data.rows import convert_row
from ..data.schema import DataValidationError, validate_rank_record
from ..tokenization import common_prefix_length, context_token_ids, encode_conversation, left_truncate

logger = logging.getLogger(__name__)

PROCESSED_COLUMNS = ("completion_ids", "ranks")
PAIR_COLUMNS = ("chosen_ids", "rejected_ids")
LEGACY_PAIR_COLUMNS = ("chosen_input_ids", "rejected_input_ids")


def _is_empty_context(context: Any) -> bool:
    return context == "" or context == []


def tokenize_rank_record(
    record: dict[str, Any],
    tokenizer: PreTrainedTokenizerBase,
    max_length: int | None = None,
    truncation: str = "none",
    template_kwargs: dict[str, Any] | None = None,
) -> tuple[dict[str, Any] | None, str]:
    """Encode every completion of `record` with its context.

    Args:
        record: A validated rank record.
        tokenizer: The reward model's tokenizer.
        max_length: Longest allowed sequence in tokens, or None for no limit.
        truncation: `"none"` drops the record when a sequence is too long, or `"left"`: cut the same number of tokens
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
        if truncation == "none":
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


def tokenize_regression_record(
    record: Mapping[str, Any],
    tokenizer: PreTrainedTokenizerBase,
    attributes: Sequence[str],
    max_length: int | None = None,
    truncation: str = "none",
) -> tuple[dict[str, Any] | None, str]:
    """Encode `context + completion` (the rank trainer's encoding, see `tokenize_rank_record`) and the targets.

    Returns:
        `({"input_ids": [int], "targets": [float] (K, NaN where missing)}, status)`, or `(None, "dropped")` when
        over `max_length`; status is "ok", "truncated" or "dropped".
    """
    one = {"context": record["context"], "completions": [{"rank": 0, "completion": record["completion"]}]}
    example, status = tokenize_rank_record(one, tokenizer, max_length, truncation)
    if example is None:
        return None, status
    values = record["attributes"]
    targets = [math.nan if values.get(name) is None else float(values[name]) for name in attributes]
    return {"input_ids": example["completion_ids"][0], "targets": targets}, status


def column_names(dataset: Dataset | IterableDataset) -> list[str]:
    names = dataset.column_names
    if names is None:  # an IterableDataset whose features are unknown
        names = list(next(iter(dataset)).keys())
    return list(names)


def template_kwargs(example: dict[str, Any], dataset_name: str, row: int | None) -> dict[str, Any]:
    """`apply_chat_template` keyword arguments of a TRL row: its `tools` (a list, or JSON text) and its
    `chat_template_kwargs`, as TRL's `RewardTrainer` passes them."""
    tools = example.get("tools")
    if isinstance(tools, str):
        try:
            tools = json.loads(tools)
        except json.JSONDecodeError as err:
            raise DataValidationError(
                dataset_name, row, "tools", f"tools is a string but not valid JSON: {err}", "row"
            ) from None
    extra = example.get("chat_template_kwargs") or {}
    if not isinstance(extra, dict):
        raise DataValidationError(
            dataset_name, row, "chat_template_kwargs", f"must be an object, got {type(extra).__name__}", "row"
        )
    return {"tools": tools, **extra}


def limit_pair(
    chosen: list[int], rejected: list[int], max_length: int | None, truncation: str, bos_token_id: int | None
) -> tuple[list[int], list[int], str]:
    """Apply `max_length` to a tokenized pair: "dropped" (TRL's filter), or with `truncation="left"` cut their
    shared leading tokens (the prompt) from the left, the same number from both."""
    longest = max(len(chosen), len(rejected))
    if max_length is None or longest <= max_length:
        return chosen, rejected, "ok"
    if truncation != "left":
        return chosen, rejected, "dropped"
    shared = common_prefix_length(chosen, rejected)
    shared = min(shared, len(chosen) - 1, len(rejected) - 1)
    cut = longest - max_length
    out = [left_truncate(ids, shared, len(ids) - cut, bos_token_id) for ids in (chosen, rejected)]
    if any(ids is None for ids in out):
        return chosen, rejected, "dropped"
    return out[0], out[1], "truncated"


class ExamplePreparer:
    """Prepares a trainer's datasets (`RankedRewardTrainer._prepare_dataset` calls `prepare`), and keeps per set the
    count of kept, truncated, dropped and invalid records (`counts[name]`)."""

    def __init__(self) -> None:
        self.counts: dict[str, Counter] = {}

    def prepare(
        self,
        dataset: Dataset | IterableDataset,
        processing_class: PreTrainedTokenizerBase,
        args: Any,
        dataset_name: str,
    ) -> Dataset | IterableDataset:
        columns = column_names(dataset)
        if all(c in columns for c in LEGACY_PAIR_COLUMNS) and not all(c in columns for c in PAIR_COLUMNS):
            warnings.warn(  # TRL 1.16's warning, word for word
                "Detected legacy dataset columns `chosen_input_ids`/`rejected_input_ids`; they are deprecated and "
                "will not be supported in v1. Please migrate to `chosen_ids`/`rejected_ids`.",
                FutureWarning,
                stacklevel=2,
            )
            dataset = dataset.rename_column("chosen_input_ids", "chosen_ids")
            dataset = dataset.rename_column("rejected_input_ids", "rejected_ids")
            columns = column_names(dataset)
        if all(c in columns for c in PROCESSED_COLUMNS):
            return dataset
        if all(c in columns for c in PAIR_COLUMNS):  # TRL's tokenized format (or our processed pairs)
            return self.pretokenized(dataset, args, dataset_name, processing_class.bos_token_id)
        if "chosen" in columns and "context" not in columns:
            return self.preference(dataset, processing_class, args, dataset_name, columns)
        if isinstance(dataset, IterableDataset):
            return self.iterable(dataset, processing_class, args, dataset_name, columns)

        with global_then_local_main_first():
            if "context" in columns and "completions" in columns:
                records, _ = validate_records(
                    enumerate(dataset), dataset_name, args.on_invalid, row_label="row", max_completions=args.max_completions
                )
            else:
                raise ValueError(
                    f"Dataset {dataset_name!r} has columns {columns}: expected rank-schema records "
                    "('context', 'completions'), TRL preference data ('chosen', 'rejected', optional 'prompt'), or "
                    "tokenized data ('chosen_ids', 'rejected_ids')."
                )
            if not records:
                raise ValueError(f"Dataset {dataset_name!r} has no valid record.")
            # Metadata columns of varying types would only get in the way of Arrow: keep what training needs.
            keep = [{"context": r["context"], "completions": r["completions"], "margin": r.get("margin")} for r in records]
            has_margin = any(r["margin"] is not None for r in keep)
            base = Dataset.from_list(keep if has_margin else [{k: r[k] for k in ("context", "completions")} for r in keep])

            def tokenize(example):
                out, status = tokenize_rank_record(example, processing_class, args.max_length, args.truncation)
                if out is None:
                    out = {"completion_ids": [], "ranks": [], "context_length": 0}
                # A record without a margin, in a set where others have one, has margin 0.
                out["margin"] = float(example["margin"]) if example.get("margin") is not None else 0.0
                out["status"] = status
                return out

            tokenized = self.tokenize(base, tokenize, args, dataset_name)
            if not has_margin:
                tokenized = tokenized.remove_columns(["margin"])
        return tokenized

    def preference(
        self,
        dataset: Dataset | IterableDataset,
        processing_class: PreTrainedTokenizerBase,
        args: Any,
        dataset_name: str,
        columns: list[str],
    ) -> Dataset | IterableDataset:
        """TRL preference rows -> TRL's processed columns: the original columns (text responses with EOS appended,
        as TRL does), plus `chosen_ids`/`rejected_ids` holding the ids TRL's `RewardTrainer` produces, and `margin`
        (0 where missing) when the dataset has the column."""
        has_margin = "margin" in columns
        eos = processing_class.eos_token
        on_invalid, max_length, truncation = args.on_invalid, args.max_length, args.truncation

        def convert(example, row):
            # TRL responses may run for several turns: then they are whole conversations of an empty context.
            record = fold_context_into_completions(binary_to_rank(example, dataset_name, row, "row"))
            validate_rank_record(record_validation_view(record), dataset_name, row, "row")
            return record, template_kwargs(example, dataset_name, row)

        def process(example, row):
            out: dict[str, Any] = {}
            for key in ("chosen", "rejected"):  # TRL appends EOS to plain-text responses
                if isinstance(example.get(key), str) and eos and not example[key].endswith(eos):
                    out[key] = example[key] + eos
            converted, err = convert_row(convert, example, row, on_invalid)
            if err is not None:
                out.update(chosen_ids=[], rejected_ids=[], status="invalid", reason=err.reason)
                if has_margin:
                    out["margin"] = 0.0
                return out
            record, kwargs = converted
            tokenized, status = tokenize_rank_record(record, processing_class, max_length, truncation, kwargs)
            ids = tokenized["completion_ids"] if tokenized is not None else [[], []]
            out.update(chosen_ids=ids[0], rejected_ids=ids[1], status=status, reason="")
            if has_margin:
                out["margin"] = float(record.get("margin", 0.0))
            return out

        with global_then_local_main_first():
            if isinstance(dataset, IterableDataset):  # lazy: no counts up front
                mapped = dataset.map(process, with_indices=True)
                mapped = mapped.filter(lambda status: status in ("ok", "truncated"), input_columns="status")
                return mapped.remove_columns(["status", "reason"])
            mapped = dataset.map(
                process, with_indices=True, num_proc=args.dataset_num_proc, desc=f"Tokenizing {dataset_name} dataset"
            )
            return self.finish(mapped, args, dataset_name)

    def pretokenized(self, dataset: Dataset | IterableDataset, args: Any, dataset_name: str, bos: int | None) -> Any:
        """`chosen_ids`/`rejected_ids` given: TRL's `max_length` filter (or left truncation of the shared prefix, a
        leading `bos` kept)."""
        if args.max_length is None:
            return dataset
        max_length, truncation = args.max_length, args.truncation
        if truncation != "left":  # exactly TRL's filter
            kwargs = {} if isinstance(dataset, IterableDataset) else {"num_proc": args.dataset_num_proc}
            with global_then_local_main_first():
                return dataset.filter(
                    lambda chosen, rejected: len(chosen) <= max_length and len(rejected) <= max_length,
                    input_columns=list(PAIR_COLUMNS),
                    **kwargs,
                )

        def limit(example):
            chosen, rejected, status = limit_pair(example["chosen_ids"], example["rejected_ids"], max_length, truncation, bos)
            return {"chosen_ids": chosen, "rejected_ids": rejected, "status": status}

        with global_then_local_main_first():
            if isinstance(dataset, IterableDataset):
                mapped = dataset.map(limit).filter(lambda status: status != "dropped", input_columns="status")
                return mapped.remove_columns(["status"])
            return self.finish(dataset.map(limit, num_proc=args.dataset_num_proc), args, dataset_name)

    def tokenize(self, base: Dataset, tokenize, args: Any, dataset_name: str) -> Dataset:
        """Map `tokenize` (which adds a `status`: kept, truncated or dropped) over `base`; count and report the
        over-long records, drop the dropped ones, and remove `status`."""
        tokenized = base.map(
            tokenize,
            remove_columns=base.column_names,
            num_proc=args.dataset_num_proc,
            desc=f"Tokenizing {dataset_name} dataset",
        )
        return self.finish(tokenized, args, dataset_name)

    def finish(self, tokenized: Dataset, args: Any, dataset_name: str) -> Dataset:
        """Count the `status` of every example (and the `reason` of invalid ones), report the skipped, dropped and
        truncated ones, keep the kept ones, and remove the bookkeeping columns."""
        counts = Counter(tokenized["status"])
        if counts["invalid"]:
            reasons = Counter(r for r, s in zip(tokenized["reason"], tokenized["status"]) if s == "invalid")
            logger.warning("%s: skipped %d invalid row(s): %s", dataset_name, counts["invalid"], dict(reasons))
        self.counts[dataset_name] = counts
        if counts["dropped"] or counts["truncated"]:
            logger.warning(
                "%s: %d record(s) over max_length=%s: %d dropped, %d left-truncated (truncation=%r).",
                dataset_name,
                counts["dropped"] + counts["truncated"],
                args.max_length,
                counts["dropped"],
                counts["truncated"],
                args.truncation,
            )
        tokenized = tokenized.filter(lambda s: s in ("ok", "truncated"), input_columns="status")
        tokenized = tokenized.remove_columns([c for c in ("status", "reason") if c in tokenized.column_names])
        if len(tokenized) == 0 and counts["invalid"] and not counts["dropped"]:
            raise ValueError(f"Dataset {dataset_name!r} has no valid record.")
        if len(tokenized) == 0:
            raise ValueError(
                f"Every record of dataset {dataset_name!r} is longer than max_length={args.max_length}; raise "
                "max_length or use truncation='left'."
            )
        return tokenized

    def iterable(self, dataset, processing_class, args, dataset_name, columns):
        """Streaming rank-schema data: validate and tokenize lazily (counts are not available up front)."""
        if "context" not in columns or "completions" not in columns:
            raise ValueError(
                f"Dataset {dataset_name!r} has columns {columns}: expected rank-schema records "
                "('context', 'completions'), TRL preference data ('chosen', 'rejected', optional 'prompt'), or "
                "tokenized data ('chosen_ids', 'rejected_ids')."
            )

        def tokenize(example):
            record = validate_rank_record(example, dataset_name, None, "row", args.max_completions)
            out, status = tokenize_rank_record(record, processing_class, args.max_length, args.truncation)
            return out or {"completion_ids": [], "ranks": [], "context_length": 0}

        mapped = dataset.map(tokenize, remove_columns=columns)
        return mapped.filter(lambda ranks: len(ranks) > 0, input_columns="ranks")
