"""The rank schema (from NeMo RL) and its validation.

One record::

    {"context": [{"role": "user", "content": "..."}, ...],
     "completions": [{"rank": 0, "completion": [{"role": "assistant", "content": "..."}]}, ...]}

Lower rank is better; equal ranks are ties. A record needs at least two completions and at least two distinct
ranks (otherwise it yields no training pair), and at most `MAX_COMPLETIONS_PER_RECORD` completions. Keys other than
`context` and `completions` are kept as metadata; an optional `margin` must be a finite number. Plain-text records
(TRL's "standard" format: `context` and every `completion` a string) are accepted too.

Messages have a `role` from `KNOWN_ROLES` and a string `content`; an assistant message may carry `tool_calls` (a
list of objects) instead of text, and `tool_call_id` and `name` are kept. With a context, a completion holds only
assistant and tool messages; with an empty context (`[]`), a completion is a whole conversation. No string anywhere
in a record may hold a lone surrogate (`"\\ud800"`), which no tokenizer can encode.

Every error names where the record came from (file and line, or dataset and row) and the field, e.g.::

    data/train.jsonl, line 7, field 'completions[1].rank': rank must be an int, got str '1'
"""

from __future__ import annotations

import logging
import math
import os
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

logger = logging.getLogger(__name__)

OnInvalid = Literal["raise", "skip"]

KNOWN_ROLES = ("system", "developer", "user", "assistant", "tool")
"""The message roles the schema accepts (OpenAI's and the chat templates' roles)."""
COMPLETION_ROLES = ("assistant", "tool")
"""The roles a completion may hold when the record has a context (a tool call and its result are part of an answer)."""
KEPT_MESSAGE_KEYS = ("tool_calls", "tool_call_id", "name")
"""Message keys kept besides `role` and `content` (when not None): what chat templates render for tool calling."""
MAX_COMPLETIONS_PER_RECORD = 1024
"""Most completions in one record. Every completion of a record is scored in one forward pass and every strictly
ordered pair is a loss term (N(N-1)/2 of them), so a record of thousands is nearly always a data error."""
MAX_NESTING = 100
"""Deepest nesting of lists and objects in an in-memory record (files are limited by the JSON parser)."""
MAX_MARGIN = 1000.0
"""Largest |margin|. A margin is in reward units (the model's logits: reward models score within a few tens), so one
of thousands cannot be met by any score difference and only swamps the loss (a margin of 1e30 trains at a loss of
4.5e28); it is a scaling error in the data."""
"""Deepest nesting of lists and objects in an in-memory record (files are limited by the JSON parser)."""
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


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


def is_main_process() -> bool:
    """True unless this is a non-zero rank of a distributed launch (`RANK`/`LOCAL_RANK` set by torchrun and
    accelerate): summaries are logged by one process, not once per process."""
    for name in ("RANK", "LOCAL_RANK"):
        value = os.environ.get(name, "0")
        if value.strip().lstrip("-").isdigit() and int(value) != 0:
            return False
    return True


def bad_text(value: Any, where: str = "", depth: int = 0) -> tuple[str, str] | None:
    """The first string in `value` (walking objects, their keys and lists) that is not valid Unicode, as
    `(field, reason)`, or None. A lone surrogate (JSON allows the escape `"\\ud800"`) cannot be encoded by a
    tokenizer or written by Arrow, so it is refused here, where the record and field are known."""
    if isinstance(value, str):
        if value.isascii():
            return None
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as err:
            return where or "<record>", (
                f"text holds a lone surrogate {value[err.start]!r} at character {err.start} (not valid Unicode, so it "
                "cannot be tokenized); fix the text or the program that wrote it"
            )
        return None
    if depth > MAX_NESTING and isinstance(value, Mapping | list | tuple):
        return where or "<record>", f"nested more than {MAX_NESTING} levels deep"
    if isinstance(value, Mapping):
        for key, item in value.items():
            path = f"{where}.{key}" if where else str(key)
            found = bad_text(key, path, depth + 1) or bad_text(item, path, depth + 1)
            if found:
                return found
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            found = bad_text(item, f"{where}[{i}]", depth + 1)
            if found:
                return found
    return None


def check_text(record: Any, source: str, row: int | None, row_label: str) -> None:
    """Raise `DataValidationError` naming the field of the first string in `record` that is not valid Unicode."""
    found = bad_text(record)
    if found:
        raise DataValidationError(source, row, found[0], found[1], row_label)


def finite_number(value: Any) -> float | None:
    """`value` as a float when it is a finite int or float (not a bool, NaN, infinity, or an int too large for a
    float); else None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def message_is_blank(message: Mapping[str, Any]) -> bool:
    """True when a validated message has neither non-blank text nor a tool call."""
    content = message.get("content")
    return not message.get("tool_calls") and not (isinstance(content, str) and content.strip())


def validate_messages(messages: Any, where: str, source: str, row: int | None, row_label: str) -> list[dict]:
    """Check a list of messages and return them normalised.

    Each message is an object with a `role` from `KNOWN_ROLES` and a string `content`. An assistant message may
    carry `tool_calls` (a non-empty list of objects), and then its `content` may be missing or None. `tool_call_id`
    and `name`, when present, are strings.

    Returns:
        The messages with `role`, `content` (None for a tool call without text) and, when present and not None,
        `tool_calls`, `tool_call_id` and `name`; other keys are dropped.

    Raises:
        DataValidationError: naming the message field (e.g. `context[2].role`) and listing the accepted values.
    """

    def fail(field_name: str, reason: str) -> DataValidationError:
        return DataValidationError(source, row, field_name, reason, row_label)

    if not isinstance(messages, list):
        raise fail(where, f"must be a list of messages, got {_type_name(messages)}")
    out = []
    for i, message in enumerate(messages):
        at = f"{where}[{i}]"
        if not isinstance(message, Mapping):
            raise fail(at, f"a message must be an object with 'role' and 'content', got {_type_name(message)}")
        if "role" not in message:
            raise fail(f"{at}.role", "message has no 'role'")
        role = message["role"]
        if not isinstance(role, str):
            raise fail(f"{at}.role", f"role must be a string, got {_type_name(role)}")
        if role not in KNOWN_ROLES:
            raise fail(f"{at}.role", f"unknown role {role!r}; accepted roles: {', '.join(KNOWN_ROLES)}")
        tool_calls = message.get("tool_calls")
        if tool_calls is not None:
            if role != "assistant":
                raise fail(f"{at}.tool_calls", f"only assistant messages carry tool_calls, this one is {role!r}")
            if not isinstance(tool_calls, list) or not all(isinstance(call, Mapping) for call in tool_calls):
                raise fail(f"{at}.tool_calls", f"tool_calls must be a list of objects, got {_type_name(tool_calls)}")
        content = message.get("content")
        if tool_calls and content is None:
            pass  # a tool call without text
        elif "content" not in message:
            raise fail(f"{at}.content", "message has no 'content'")
        elif not isinstance(content, str):
            hint = (
                " (a list of content parts is not supported: join the text into one string)"
                if isinstance(content, list)
                else ""
            )
            raise fail(f"{at}.content", f"content must be a string, got {_type_name(content)}{hint}")
        normalised = {"role": role, "content": content}
        for key in KEPT_MESSAGE_KEYS:
            value = message.get(key)
            if value is None:
                continue
            if key != "tool_calls" and not isinstance(value, str):
                raise fail(f"{at}.{key}", f"{key} must be a string, got {_type_name(value)}")
            normalised[key] = value
        out.append(normalised)
    return out


def check_completion_roles(
    completion: list[dict], where: str, has_context: bool, source: str, row: int | None, row_label: str
) -> None:
    """With a context, a completion may hold only assistant and tool messages (a `user` or `system` turn inside a
    completion would put words in the other party's mouth). Raise naming the message's role field otherwise."""
    if not has_context:
        return
    for i, message in enumerate(completion):
        if message["role"] not in COMPLETION_ROLES:
            raise DataValidationError(
                source,
                row,
                f"{where}[{i}].role",
                f"a completion may hold only {' and '.join(COMPLETION_ROLES)} messages, got {message['role']!r}; "
                "put earlier turns in 'context'",
                row_label,
            )


def validate_margin(record: Mapping[str, Any], source: str, row: int | None, row_label: str) -> dict[str, Any]:
    """`{"margin": float}` for a record with a margin, `{}` without one (missing or None).

    Raises:
        DataValidationError: a margin that is not a finite number (a string, a bool, NaN, infinity) or whose size is
            over `MAX_MARGIN`.
    """
    value = record.get("margin")
    if value is None:
        return {}
    number = finite_number(value)
    if number is None:
        raise DataValidationError(
            source, row, "margin", f"margin must be a finite number, got {_type_name(value)} {value!r}", row_label
        )
    problem = margin_problem(number)
    if problem:
        raise DataValidationError(source, row, "margin", problem, row_label)
    return {"margin": number}


def margin_problem(margin: float) -> str | None:
    """Why a finite `margin` cannot be trained on (its size is over `MAX_MARGIN`), or None."""
    if abs(margin) > MAX_MARGIN:
        return (
            f"margin {margin:g} is larger than {MAX_MARGIN:g} in size: margins are in reward units (reward models "
            "score within a few tens), so this one can never be met and only swamps the loss; rescale the column"
        )
    return None


def validate_rank_record(
    record: Any,
    source: str = "<records>",
    row: int | None = None,
    row_label: str = "line",
    max_completions: int | None = MAX_COMPLETIONS_PER_RECORD,
) -> dict[str, Any]:
    """Validate one rank-schema record and return it normalised.

    Args:
        record: The parsed record.
        source: Where it came from (a file path or a dataset name), used in errors.
        row: Its line (files, 1-based) or row (datasets, 0-based) number, used in errors.
        row_label: "line" or "row", the word used in errors.
        max_completions: Most completions in the record (None: no limit).

    Returns:
        `{"context": ..., "completions": [{"rank": int, "completion": ...}, ...], **metadata}`: messages as
        `validate_messages` returns them, `margin` (when present and not None) as a float.

    Raises:
        DataValidationError: naming source, row and field, for: a record that is not an object, a string that is not
            valid Unicode (a lone surrogate), missing `context`/`completions`, a non-list, fewer than 2 or more than
            `max_completions` completions, a rank that is not an int or not a 64-bit int, all ranks equal, a
            malformed message (see `validate_messages`), a user or system message in a completion, an empty
            completion, a margin that is not a finite number.
    """

    def fail(field_name: str | None, reason: str) -> DataValidationError:
        return DataValidationError(source, row, field_name, reason, row_label)

    if not isinstance(record, Mapping):
        raise fail(None, f"a record must be a JSON object, got {_type_name(record)}")
    check_text(record, source, row, row_label)
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
    if max_completions is not None and len(completions) > max_completions:
        n = len(completions)
        raise fail(
            "completions",
            f"{n} completions, more than the limit of {max_completions} per record (all of a record's completions "
            f"are scored in one batch and every ordered pair is a loss term, up to {n * (n - 1) // 2} here); split "
            "it into several records with the same context, or raise max_completions",
        )
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
        if not _INT64_MIN <= rank <= _INT64_MAX:
            raise fail(f"{where}.rank", f"rank must fit in a 64-bit integer, got {rank}; use small ints (0 is best)")
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
            check_completion_roles(completion, f"{where}.completion", bool(context), source, row, row_label)
            if all(message_is_blank(m) for m in completion):
                raise fail(f"{where}.completion", "empty completion")
        normalised.append({"rank": rank, "completion": completion})
    if len({c["rank"] for c in normalised}) < 2:
        raise fail("completions", "all ranks are equal, so the record has no preference pair")
    metadata = {k: v for k, v in record.items() if k not in ("context", "completions")}
    metadata.update(validate_margin(record, source, row, row_label))
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
        """Log the skipped records once (on the main process of a distributed run)."""
        if self.skipped and is_main_process():
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
    max_completions: int | None = MAX_COMPLETIONS_PER_RECORD,
    log: bool = True,
) -> tuple[list[dict[str, Any]], ValidationReport]:
    """Validate `(row, record)` pairs; raise on the first bad one, or skip and count them.

    Args:
        records: `(row number, record)` pairs.
        source: Name used in errors.
        on_invalid: "raise" or "skip".
        row_label: "line" or "row", the word used in errors.
        max_completions: Most completions per record (None: no limit).
        log: Log the summary of skipped records (once); False when the caller reports it itself.

    Returns:
        The valid records and a `ValidationReport`.
    """
    if on_invalid not in ("raise", "skip"):
        raise ValueError(f"on_invalid must be 'raise' or 'skip', got {on_invalid!r}")
    report = ValidationReport(source)
    kept = []
    for row, record in records:
        try:
            kept.append(validate_rank_record(record, source, row, row_label, max_completions))
        except DataValidationError as err:
            if on_invalid == "raise":
                raise
            report.add_invalid(err)
    report.kept = len(kept)
    if log:
        report.log()
    return kept, report


def iter_pairs(ranks: list[int]) -> Iterator[tuple[int, int]]:
    """Every ordered pair `(i, j)` with completion i strictly better (lower rank) than j. Ties give no pair."""
    for i, ri in enumerate(ranks):
        for j, rj in enumerate(ranks):
            if ri < rj:
                yield i, j
