"""TRL's preference rows (prompt / chosen / rejected, explicit or implicit prompt, text or conversations) as rank
records, and the views the trainer validates TRL's tool-calling rows through."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..messages import COMPLETION_ROLES, type_name
from ..schema import DataValidationError, validate_messages
from .common import margin_metadata, require_keys

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
            isinstance(m, Mapping) and m.get("role") not in COMPLETION_ROLES for m in completion
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
        require_keys(row, (key,), source, row_num, row_label, f"; set {option}= to the column that holds it")
    chosen, rejected = row[chosen_key], row[rejected_key]

    def fail(field_name: str, reason: str) -> DataValidationError:
        return DataValidationError(source, row_num, field_name, reason, row_label)

    if prompt_key in row:
        prompt = row[prompt_key]
        if isinstance(prompt, str):
            for key, value in ((chosen_key, chosen), (rejected_key, rejected)):
                if not isinstance(value, str):
                    raise fail(
                        key, f"the prompt is plain text, so {key} must be a string too, got {type_name(value)}"
                    )
        elif isinstance(prompt, list):
            for key, value in ((chosen_key, chosen), (rejected_key, rejected)):
                if not isinstance(value, list):
                    raise fail(
                        key, f"the prompt is a list of messages, so {key} must be one too, got {type_name(value)}"
                    )
        else:
            raise fail(prompt_key, f"must be a string or a list of messages, got {type_name(prompt)}")
        context, chosen_completion, rejected_completion = prompt, chosen, rejected
    elif isinstance(chosen, str) or isinstance(rejected, str):
        # Implicit prompt, plain text: the shared leading text is the context.
        for key, value in ((chosen_key, chosen), (rejected_key, rejected)):
            if not isinstance(value, str):
                raise fail(
                    key,
                    f"the row has no {prompt_key!r} column and the other response is plain text, so {key} must be a "
                    f"string too, got {type_name(value)}",
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
                    f"messages) or a string, got {type_name(value)}; set prompt_key= to the column holding the prompt",
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
        **margin_metadata(row, source, row_num, row_label),
    }
