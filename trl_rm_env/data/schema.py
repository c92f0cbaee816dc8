"""The rank schema (from NeMo RL) and its validation.

One record::

    {"context": [{"role": "user", "content": "..."}, ...],
     "completions": [{"rank": 0, "completion": [{"role": "assistant", "content": "..."}]}, ...]}

Lower rank is better; equal ranks are ties. A record needs at least two completions and at least two distinct
ranks (otherwise it yields no training pair). Keys other than `context` and `completions` are kept as metadata.
Plain-text records (TRL's "standard" format: `context` and every `completion` a string) are accepted too.

Every error names where the record came from (file and line, or dataset and row) and the field, e.g.::

    data/train.jsonl, line 7, field 'completions[1].rank': rank must be an int, got str '1'
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

logger = logging.getLogger(__name__)

OnInvalid = Literal["raise", "skip"]


class DataValidationError(ValueError):
    """A record does not follow the schema. `source`, `row` and `field` say where; `reason` says what."""

    def __init__(self, source: str, row: int | None, field: str | None, reason: str, row_label: str = "line"):
        self.source, self.row, self.field, self.reason = source, row, field, reason
        where = source if row is None else f"{source}, {row_label} {row}"
        if field:
            where += f", field {field!r}"
        self.row_label = row_label
        super().__init__(f"{where}: {reason}")

    def __reduce__(self):
        # Keep the structured fields when the error crosses a process boundary (Dataset.map(num_proc>1), workers).
        return (type(self), (self.source, self.row, self.field, self.reason, self.row_label))


def _type_name(value: Any) -> str:
    return type(value).__name__


def validate_messages(messages: Any, where: str, source: str, row: int | None, row_label: str) -> list[dict]:
    """Check a list of `{"role": str, "content": str}` messages; return them with only role/content kept."""

    def fail(field_name: str, reason: str) -> DataValidationError:
        return DataValidationError(source, row, field_name, reason, row_label)

    if not isinstance(messages, list):
        raise fail(where, f"must be a list of messages, got {_type_name(messages)}")
    out = []
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise fail(f"{where}[{i}]", f"a message must be an object with 'role' and 'content', got {_type_name(message)}")
        for key in ("role", "content"):
            if key not in message:
                raise fail(f"{where}[{i}].{key}", f"message has no {key!r}")
            if not isinstance(message[key], str):
                raise fail(f"{where}[{i}].{key}", f"{key} must be a string, got {_type_name(message[key])}")
        out.append({"role": message["role"], "content": message["content"]})
    return out


def validate_rank_record(
    record: Any, source: str = "<records>", row: int | None = None, row_label: str = "line"
) -> dict[str, Any]:
    """Validate one rank-schema record and return it normalised.

    Args:
        record: The parsed record.
        source: Where it came from (a file path or a dataset name), used in errors.
        row: Its line (files, 1-based) or row (datasets, 0-based) number, used in errors.
        row_label: "line" or "row", the word used in errors.

    Returns:
        `{"context": ..., "completions": [{"rank": int, "completion": ...}, ...], **metadata}` where messages keep
        only `role` and `content`.

    Raises:
        DataValidationError: naming source, row and field, for: a record that is not an object, missing
            `context`/`completions`, a non-list, fewer than 2 completions, a non-int rank, all ranks equal, a message
            without role/content, an empty completion.
    """

    def fail(field_name: str | None, reason: str) -> DataValidationError:
        return DataValidationError(source, row, field_name, reason, row_label)

    if not isinstance(record, Mapping):
        raise fail(None, f"a record must be a JSON object, got {_type_name(record)}")
    for key in ("context", "completions"):
        if key not in record:
            raise fail(key, f"missing required field {key!r} (a rank record has 'context' and 'completions')")
    context = record["context"]
    plain_text = isinstance(context, str)
    if not plain_text:
        context = validate_messages(context, "context", source, row, row_label)
    completions = record["completions"]
    if not isinstance(completions, list):
        raise fail("completions", f"must be a list of {{'rank', 'completion'}} objects, got {_type_name(completions)}")
    if len(completions) < 2:
        raise fail("completions", f"needs at least 2 completions to rank, got {len(completions)}")
    normalised = []
    for i, item in enumerate(completions):
        where = f"completions[{i}]"
        if not isinstance(item, Mapping):
            raise fail(where, f"must be an object with 'rank' and 'completion', got {_type_name(item)}")
        if "rank" not in item:
            raise fail(f"{where}.rank", "missing 'rank'")
        rank = item["rank"]
        if isinstance(rank, bool) or not isinstance(rank, int):
            raise fail(f"{where}.rank", f"rank must be an int, got {_type_name(rank)} {rank!r}")
        if "completion" not in item:
            raise fail(f"{where}.completion", "missing 'completion'")
        completion = item["completion"]
        if plain_text:
            if not isinstance(completion, str):
                raise fail(
                    f"{where}.completion",
                    f"context is plain text, so the completion must be a string too, got {_type_name(completion)}",
                )
            if not completion.strip():
                raise fail(f"{where}.completion", "empty completion")
        else:
            completion = validate_messages(completion, f"{where}.completion", source, row, row_label)
            if not completion or all(not m["content"].strip() for m in completion):
                raise fail(f"{where}.completion", "empty completion")
        normalised.append({"rank": rank, "completion": completion})
    if len({c["rank"] for c in normalised}) < 2:
        raise fail("completions", "all ranks are equal, so the record has no preference pair")
    metadata = {k: v for k, v in record.items() if k not in ("context", "completions")}
    return {"context": context, "completions": normalised, **metadata}


@dataclass
class ValidationReport:
    """What `validate_records` kept and skipped, with the reasons."""

    source: str
    kept: int = 0
    skipped: int = 0
    reasons: Counter = field(default_factory=Counter)
    first_errors: list[str] = field(default_factory=list)

    def add_invalid(self, err: DataValidationError) -> None:
        """Count a skipped record, its reason, and keep the first few messages for the summary."""
        self.skipped += 1
        self.reasons[err.reason] += 1
        if len(self.first_errors) < 3:
            self.first_errors.append(str(err))

    def log(self) -> None:
        if self.skipped:
            summary = ", ".join(f"{reason} ({n})" for reason, n in self.reasons.most_common())
            logger.warning(
                "%s: skipped %d invalid record(s) of %d: %s. First: %s",
                self.source,
                self.skipped,
                self.kept + self.skipped,
                summary,
                "; ".join(self.first_errors),
            )


def validate_records(
    records: Iterable[tuple[int, Any]],
    source: str,
    on_invalid: OnInvalid = "raise",
    row_label: str = "line",
) -> tuple[list[dict[str, Any]], ValidationReport]:
    """Validate `(row, record)` pairs; raise on the first bad one, or skip and count them.

    Returns:
        The valid records and a `ValidationReport` (whose `log()` is called once here when anything was skipped).
    """
    if on_invalid not in ("raise", "skip"):
        raise ValueError(f"on_invalid must be 'raise' or 'skip', got {on_invalid!r}")
    report = ValidationReport(source)
    kept = []
    for row, record in records:
        try:
            kept.append(validate_rank_record(record, source, row, row_label))
        except DataValidationError as err:
            if on_invalid == "raise":
                raise
            report.add_invalid(err)
    report.kept = len(kept)
    report.log()
    return kept, report


def iter_pairs(ranks: list[int]) -> Iterator[tuple[int, int]]:
    """Every ordered pair `(i, j)` with completion i strictly better (lower rank) than j. Ties give no pair."""
    for i, ri in enumerate(ranks):
        for j, rj in enumerate(ranks):
            if ri < rj:
                yield i, j
