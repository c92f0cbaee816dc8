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

from collections.abc import Iterator, Mapping
from typing import Any, Literal

from .messages import (
    COMPLETION_ROLES,
    KNOWN_ROLES,
    MessageProblem,
    bad_text,
    finite_number,
    message_is_blank,
    messages_problem,
    normalize_message,
    type_name,
)

OnInvalid = Literal["raise", "skip"]

MAX_COMPLETIONS_PER_RECORD = 1024
"""Most completions in one record. Every completion of a record is scored in one forward pass and every strictly
ordered pair is a loss term (N(N-1)/2 of them), so a record of thousands is nearly always a data error."""
MAX_MARGIN = 1000.0
"""Largest |margin|. A margin is in reward units (the model's logits: reward models score within a few tens), so one
of thousands cannot be met by any score difference and only swamps the loss (a margin of 1e30 trains at a loss of
4.5e28); it is a scaling error in the data."""
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


def check_text(record: Any, source: str, row: int | None, row_label: str) -> None:
    """Raise `DataValidationError` naming the field of the first string in `record` that is not valid Unicode (or
    the first nesting deeper than `MAX_NESTING`)."""
    found = bad_text(record)
    if found:
        raise DataValidationError(source, row, found[0], found[1], row_label)


# ---------------------------------------------------------------------------------------------------- messages
def _data_reason(problem: MessageProblem) -> str:
    """How a broken message rule reads in a data error (the field is named beside it)."""
    value, code = problem.value, problem.code
    if code == "not_list":
        return f"must be a list of messages, got {type_name(value)}"
    if code == "not_object":
        return f"a message must be an object with 'role' and 'content', got {type_name(value)}"
    if code in ("no_role", "no_content"):
        return f"message has no {problem.field!r}"
    if code == "unknown_role":
        return f"unknown role {value!r}; accepted roles: {', '.join(KNOWN_ROLES)}"
    if code == "completion_role":
        return (
            f"a completion may hold only {' and '.join(COMPLETION_ROLES)} messages, got {value!r}; put earlier turns "
            "in 'context'"
        )
    if code == "tool_calls_role":
        return f"only assistant messages carry tool_calls, this one is {value!r}"
    if code == "tool_calls_type":
        return f"tool_calls must be a list of objects, got {type_name(value)}"
    if code == "content_type" and isinstance(value, list):
        return "content must be a string, got list (a list of content parts is not supported: join the text into one string)"
    return f"{problem.field} must be a string, got {type_name(value)}"  # role_type, content_type, key_type


def validate_messages(
    messages: Any,
    where: str,
    source: str,
    row: int | None,
    row_label: str,
    completion_roles: tuple[str, ...] | None = None,
) -> list[dict]:
    """Check a list of messages (the rules of `trl_rm_env.data.messages`, roles from `KNOWN_ROLES`, and from
    `completion_roles` when given) and return them normalised: `role`, `content` (None for a tool call without
    text) and the kept keys (`tool_calls`, `tool_call_id`, `name`) that are not None; other keys are dropped.

    Raises:
        DataValidationError: naming the message field (e.g. `context[2].role`) and, for a role, the accepted ones.
    """
    problem = messages_problem(messages, completion_roles=completion_roles)
    if problem is not None:
        raise DataValidationError(source, row, problem.at(where), _data_reason(problem), row_label)
    return [normalize_message(message) for message in messages]


def validate_exchange(
    context: Any, completion: Any, where: str, source: str, row: int | None, row_label: str
) -> tuple[Any, Any]:
    """Check a context and one completion of it, both plain text or both message lists (`where`: the completion's
    field), and return them normalised. With a context, the completion holds `COMPLETION_ROLES` only.

    Raises:
        DataValidationError: a malformed message, mixed text and messages, or an empty completion.
    """

    def fail(reason: str) -> DataValidationError:
        return DataValidationError(source, row, where, reason, row_label)

    if isinstance(context, str):
        if not isinstance(completion, str):
            raise fail(f"context is plain text, so the completion must be a string too, got {type_name(completion)}")
        if not completion.strip():
            raise fail("empty completion")
        return context, completion
    context = validate_messages(context, "context", source, row, row_label)
    roles = COMPLETION_ROLES if context else None  # an empty context: the completion is a whole conversation
    completion = validate_messages(completion, where, source, row, row_label, completion_roles=roles)
    if all(message_is_blank(m) for m in completion):
        raise fail("empty completion")
    return context, completion


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
            source, row, "margin", f"margin must be a finite number, got {type_name(value)} {value!r}", row_label
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
        raise fail(None, f"a record must be a JSON object, got {type_name(record)}")
    check_text(record, source, row, row_label)
    for key in ("context", "completions"):
        if key not in record:
            raise fail(key, f"missing required field {key!r} (a rank record has 'context' and 'completions')")
    context = record["context"]
    if not isinstance(context, str):
        context = validate_messages(context, "context", source, row, row_label)
    completions = record["completions"]
    if not isinstance(completions, list):
        raise fail("completions", f"must be a list of {{'rank', 'completion'}} objects, got {type_name(completions)}")
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
            raise fail(where, f"must be an object with 'rank' and 'completion', got {type_name(item)}")
        if "rank" not in item:
            raise fail(f"{where}.rank", "missing 'rank'")
        rank = item["rank"]
        if isinstance(rank, bool) or not isinstance(rank, int):
            raise fail(f"{where}.rank", f"rank must be an int, got {type_name(rank)} {rank!r}")
        if not _INT64_MIN <= rank <= _INT64_MAX:
            raise fail(f"{where}.rank", f"rank must fit in a 64-bit integer, got {rank}; use small ints (0 is best)")
        if "completion" not in item:
            raise fail(f"{where}.completion", "missing 'completion'")
        _, completion = validate_exchange(context, item["completion"], f"{where}.completion", source, row, row_label)
        normalised.append({"rank": rank, "completion": completion})
    if len({c["rank"] for c in normalised}) < 2:
        raise fail("completions", "all ranks are equal, so the record has no preference pair")
    metadata = {k: v for k, v in record.items() if k not in ("context", "completions")}
    metadata.update(validate_margin(record, source, row, row_label))
    return {"context": context, "completions": normalised, **metadata}


def iter_pairs(ranks: list[int]) -> Iterator[tuple[int, int]]:
    """Every ordered pair `(i, j)` with completion i strictly better (lower rank) than j. Ties give no pair."""
    for i, ri in enumerate(ranks):
        for j, rj in enumerate(ranks):
            if ri < rj:
                yield i, j
