"""Converters: rows of other preference formats turned into rank-schema records.

Each converter is a pure function `(row, source, row_num, row_label) -> record | None`:

- it returns `{"context": ..., "completions": [{"rank": int, "completion": ...}, ...], **metadata}`, which the loader
  then checks with `validate_rank_record`;
- it returns `None` for a row that carries no preference (a tie), which the loader counts and drops;
- it raises `DataValidationError` naming source, row and field for a row it cannot read (never a bare `KeyError`).

`CONVERTERS` maps a `data_format` name to its converter. To add a format, write a function with that signature
(extra keyword options such as `chosen_key` are passed by the loader when the function accepts them) and add it to
`CONVERTERS`; if it can return ties, describe its tie rule in `TIE_RULES` so the loader's log says what was dropped.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

from trl_rm_env.data.schema import DataValidationError, margin_problem, validate_messages

Converter = Callable[..., dict[str, Any] | None]


def _type_name(value: Any) -> str:
    return type(value).__name__


def _require(
    row: Any, keys: tuple[str, ...], source: str, row_num: int | None, row_label: str, hint: str = ""
) -> Mapping[str, Any]:
    """Check that `row` is an object holding every key in `keys`; return it."""
    if not isinstance(row, Mapping):
        raise DataValidationError(source, row_num, None, f"a row must be an object, got {_type_name(row)}", row_label)
    for key in keys:
        if key not in row:
            present = ", ".join(repr(k) for k in row) or "none"
            raise DataValidationError(
                source, row_num, key, f"missing {key!r}; the row has keys [{present}]{hint}", row_label
            )
    return row


def _margin_metadata(row: Mapping[str, Any], source: str, row_num: int | None, row_label: str) -> dict[str, Any]:
    """`{"margin": value}` when the row has a numeric margin (TRL's optional column), else `{}`."""
    margin = row.get("margin")
    if margin is None:
        return {}
    if isinstance(margin, bool) or not isinstance(margin, int | float):
        raise DataValidationError(
            source, row_num, "margin", f"margin must be a number, got {_type_name(margin)} {margin!r}", row_label
        )
    if not math.isfinite(margin):
        raise DataValidationError(source, row_num, "margin", f"margin must be finite, got {margin!r}", row_label)
    problem = margin_problem(margin)
    if problem:
        raise DataValidationError(source, row_num, "margin", problem, row_label)
    return {"margin": margin}


_TOOL_CALLS_PLACEHOLDER = "[tool_calls]"


def validation_view(messages: Any) -> Any:
    """A copy of `messages` for schema validation only: an assistant message that carries `tool_calls` and no text
    content (TRL's tool-calling format) gets a placeholder content, so validators that require text accept it.

    The messages themselves (with `tool_calls`, `tool_call_id`, `name`, and any `None` fields an Arrow table adds) are
    what the chat template renders, exactly as TRL passes them to `apply_chat_template`.
    """
    if not isinstance(messages, list):
        return messages
    view = []
    for message in messages:
        if isinstance(message, Mapping) and message.get("tool_calls") and not isinstance(message.get("content"), str):
            message = {**message, "content": _TOOL_CALLS_PLACEHOLDER}
        if isinstance(message, Mapping):
            # Only role and content are the schema's business; Arrow fills absent keys of a message with None.
            message = {k: v for k, v in message.items() if k in ("role", "content") or v is not None}
        view.append(message)
    return view


def record_validation_view(record: Mapping[str, Any]) -> dict[str, Any]:
    """`record` with every message list replaced by its `validation_view` (see there)."""
    view = dict(record)
    view["context"] = validation_view(record.get("context"))
    completions = record.get("completions")
    if isinstance(completions, list):
        view["completions"] = [
            {**c, "completion": validation_view(c.get("completion"))} if isinstance(c, Mapping) else c
            for c in completions
        ]
    return view


ANSWER_ROLES = ("assistant", "tool")
"""Roles a completion holds when the record has a context (the schema's rule)."""


def fold_context_into_completions(record: dict[str, Any]) -> dict[str, Any]:
    """`record` with its message context moved into every completion (context `[]`) when a completion holds a
    message whose role is not an answer role (a TRL response that goes on for several turns: `assistant`, `user`,
    `assistant`). The token ids are unchanged (each sequence is still context + completion), and the schema accepts
    whole conversations as completions of an empty context. Text records and records that need nothing are returned
    as they are."""
    context = record.get("context")
    completions = record.get("completions")
    if not isinstance(context, list) or not context or not isinstance(completions, list):
        return record

    def other_roles(completion: Any) -> bool:
        return isinstance(completion, list) and any(
            isinstance(m, Mapping) and m.get("role") not in ANSWER_ROLES for m in completion
        )

    if not any(isinstance(c, Mapping) and other_roles(c.get("completion")) for c in completions):
        return record
    folded = [{**c, "completion": [*context, *c["completion"]]} for c in completions]
    return {**record, "context": [], "completions": folded}


def _text_context_split(chosen: str, rejected: str) -> int:
    """Length of the context of an implicit-prompt text pair: their longest common prefix, shortened until both
    remainders hold a non-blank character (0 when they share nothing)."""
    n = 0
    limit = min(len(chosen), len(rejected))
    while n < limit and chosen[n] == rejected[n]:
        n += 1
    while n > 0 and (not chosen[n:].strip() or not rejected[n:].strip()):
        n -= 1
    return n


# --- TRL binary preference (prompt / chosen / rejected) ---


def binary_to_rank(
    row: Any,
    source: str,
    row_num: int | None,
    row_label: str = "row",
    prompt_key: str = "prompt",
    chosen_key: str = "chosen",
    rejected_key: str = "rejected",
) -> dict[str, Any]:
    """Turn a TRL preference row (chosen better than rejected) into a two-completion rank record.

    Explicit prompt (the row has `prompt_key`): prompt, chosen and rejected are all strings (plain text) or all
    lists of messages; the prompt becomes the context. Implicit prompt (no `prompt_key`, TRL's
    `*_implicit_prompt_preference`): chosen and rejected are whole texts or whole conversations. For text, the
    context is their longest common prefix (shortened so both remainders keep a non-blank character; "" when they
    share nothing); since a completion is encoded as `context + completion`, the token ids are those of the whole
    `chosen` / `rejected` text, as TRL tokenizes them. For conversations, the context is their longest common prefix
    of messages (`[]` when they share none), shortened so both keep at least one message. chosen gets rank 0,
    rejected rank 1. A numeric `margin` column is kept as metadata; other columns are not. Messages are returned as
    given (tool calls, `None` fields and all), so the chat template renders exactly what TRL renders; they are
    checked through `validation_view`.

    Args:
        row: The row, a mapping.
        source: Where it came from (file path or dataset name), used in errors.
        row_num: Its line or row number, used in errors.
        row_label: "line" or "row", the word used in errors.
        prompt_key: Column holding the prompt.
        chosen_key: Column holding the preferred response (or conversation).
        rejected_key: Column holding the other response (or conversation).

    Returns:
        The rank record `{"context", "completions": [chosen (rank 0), rejected (rank 1)], ["margin"]}`.

    Raises:
        DataValidationError: a missing key (listing the keys present and the option to set), mixed string and
            message fields, a malformed message, or a non-numeric or non-finite margin.
    """
    options = {chosen_key: "chosen_key", rejected_key: "rejected_key"}
    for key, option in options.items():
        _require(row, (key,), source, row_num, row_label, f"; set {option}= to the column that holds it")
    chosen, rejected = row[chosen_key], row[rejected_key]

    def fail(field_name: str, reason: str) -> DataValidationError:
        return DataValidationError(source, row_num, field_name, reason, row_label)

    if prompt_key in row:
        prompt = row[prompt_key]
        if isinstance(prompt, str):
            for key, value in ((chosen_key, chosen), (rejected_key, rejected)):
                if not isinstance(value, str):
                    raise fail(
                        key, f"the prompt is plain text, so {key} must be a string too, got {_type_name(value)}"
                    )
        elif isinstance(prompt, list):
            for key, value in ((chosen_key, chosen), (rejected_key, rejected)):
                if not isinstance(value, list):
                    raise fail(
                        key, f"the prompt is a list of messages, so {key} must be one too, got {_type_name(value)}"
                    )
        else:
            raise fail(prompt_key, f"must be a string or a list of messages, got {_type_name(prompt)}")
        context, chosen_completion, rejected_completion = prompt, chosen, rejected
    elif isinstance(chosen, str) or isinstance(rejected, str):
        # Implicit prompt, plain text: the shared leading text is the context.
        for key, value in ((chosen_key, chosen), (rejected_key, rejected)):
            if not isinstance(value, str):
                raise fail(
                    key,
                    f"the row has no {prompt_key!r} column and the other response is plain text, so {key} must be a "
                    f"string too, got {_type_name(value)}",
                )
        split = _text_context_split(chosen, rejected)
        context, chosen_completion, rejected_completion = chosen[:split], chosen[split:], rejected[split:]
    else:
        # Implicit prompt, conversations: the shared opening messages are the context.
        for key, value in ((chosen_key, chosen), (rejected_key, rejected)):
            if not isinstance(value, list):
                raise fail(
                    key,
                    f"the row has no {prompt_key!r} column, so {key} must be a full conversation (a list of "
                    f"messages) or a string, got {_type_name(value)}; set prompt_key= to the column holding the prompt",
                )
            validate_messages(validation_view(value), key, source, row_num, row_label)
        shared = 0
        while shared < min(len(chosen), len(rejected)) and chosen[shared] == rejected[shared]:
            shared += 1
        while shared > 0 and (shared == len(chosen) or shared == len(rejected)):
            shared -= 1  # each response keeps at least one message of its own
        context, chosen_completion, rejected_completion = chosen[:shared], chosen[shared:], rejected[shared:]
    return {
        "context": context,
        "completions": [
            {"rank": 0, "completion": chosen_completion},
            {"rank": 1, "completion": rejected_completion},
        ],
        **_margin_metadata(row, source, row_num, row_label),
    }


# --- nvidia/HelpSteer3 "preference" ---


def helpsteer3_to_rank(row: Any, source: str, row_num: int | None, row_label: str = "row") -> dict[str, Any] | None:
    """Turn a nvidia/HelpSteer3 "preference" row into a rank record, or `None` for a tie.

    `overall_preference` runs from -3 (response1 much better) to 3 (response2 much better). Below 0, response1 gets
    rank 0 and response2 rank 1; above 0, the reverse. At 0 the annotators saw no difference: that row is a tie and
    yields no training pair, so it is returned as `None` for the loader to count and drop (NeMo RL instead makes a
    chosen == rejected pair, which only adds noise).

    Args:
        row: `{"context": [messages], "response1": str, "response2": str, "overall_preference": int, ...}`.
        source: Where it came from, used in errors.
        row_num: Its line or row number, used in errors.
        row_label: "line" or "row", the word used in errors.

    Returns:
        `{"context", "completions": [response1, response2 as assistant messages], "overall_preference",
        ["domain"], ["language"]}`, or `None` for a tie.

    Raises:
        DataValidationError: a missing key, a non-string response, or an `overall_preference` that is not an int
            in -3..3.
    """
    _require(row, ("context", "response1", "response2", "overall_preference"), source, row_num, row_label)

    def fail(field_name: str, reason: str) -> DataValidationError:
        return DataValidationError(source, row_num, field_name, reason, row_label)

    for key in ("response1", "response2"):
        if not isinstance(row[key], str):
            raise fail(key, f"must be a string, got {_type_name(row[key])}")
    preference = row["overall_preference"]
    if isinstance(preference, bool) or not isinstance(preference, int) or not -3 <= preference <= 3:
        raise fail("overall_preference", f"must be an int in -3..3, got {_type_name(preference)} {preference!r}")
    if preference == 0:
        return None
    rank1, rank2 = (0, 1) if preference < 0 else (1, 0)
    metadata = {key: row[key] for key in ("domain", "language") if key in row}
    return {
        "context": row["context"],
        "completions": [
            {"rank": rank1, "completion": [{"role": "assistant", "content": row["response1"]}]},
            {"rank": rank2, "completion": [{"role": "assistant", "content": row["response2"]}]},
        ],
        **metadata,
        "overall_preference": preference,
    }


# --- allenai/llama-3.1-tulu-3-8b-preference-mixture ---


def tulu3_to_rank(row: Any, source: str, row_num: int | None, row_label: str = "row") -> dict[str, Any]:
    """Turn a Tulu 3 preference-mixture row into a rank record.

    chosen and rejected are whole conversations that differ only in their last (assistant) message: the shared
    context is `chosen[:-1]`, checked equal to `rejected[:-1]`; the completions are `chosen[-1:]` (rank 0) and
    `rejected[-1:]` (rank 1). The `prompt` column repeats the last user turn and is dropped; `id` and `source` are
    kept as metadata when present.

    Args:
        row: `{"prompt": str, "chosen": [messages], "rejected": [messages], ...}`.
        source: Where it came from, used in errors.
        row_num: Its line or row number, used in errors.
        row_label: "line" or "row", the word used in errors.

    Returns:
        `{"context": chosen[:-1], "completions": [chosen[-1:] (rank 0), rejected[-1:] (rank 1)], ["id"], ["source"]}`.

    Raises:
        DataValidationError: a missing key, a malformed or empty conversation, or contexts that differ.
    """
    _require(row, ("chosen", "rejected"), source, row_num, row_label)
    chosen = validate_messages(row["chosen"], "chosen", source, row_num, row_label)
    rejected = validate_messages(row["rejected"], "rejected", source, row_num, row_label)
    for key, msgs in (("chosen", chosen), ("rejected", rejected)):
        if not msgs:
            raise DataValidationError(source, row_num, key, "empty conversation", row_label)
    if chosen[:-1] != rejected[:-1]:
        first_diff = next(
            (i for i, (a, b) in enumerate(zip(chosen[:-1], rejected[:-1])) if a != b),
            min(len(chosen), len(rejected)) - 1,
        )
        raise DataValidationError(
            source,
            row_num,
            "rejected",
            f"rejected[:-1] must equal chosen[:-1] (the shared context); they differ at message {first_diff} "
            f"(chosen has {len(chosen)} messages, rejected {len(rejected)})",
            row_label,
        )
    metadata = {key: row[key] for key in ("id", "source") if key in row}
    return {
        "context": chosen[:-1],
        "completions": [{"rank": 0, "completion": chosen[-1:]}, {"rank": 1, "completion": rejected[-1:]}],
        **metadata,
    }


# --- registry ---

CONVERTERS: dict[str, Converter] = {
    "binary": binary_to_rank,
    "helpsteer3": helpsteer3_to_rank,
    "tulu3": tulu3_to_rank,
}
"""`data_format` name -> converter. Add new formats here."""

TIE_RULES: dict[str, str] = {"helpsteer3": "overall_preference == 0"}
"""For converters that can return `None`: what a tie is, for the loader's log line."""
