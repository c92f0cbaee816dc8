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

from collections.abc import Callable, Mapping
from typing import Any

from trl_rm_env.data.schema import DataValidationError, validate_messages

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
    return {"margin": margin}


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
    lists of messages; the prompt becomes the context. Implicit prompt (no `prompt_key`): chosen and rejected are
    full conversations; their longest common prefix of messages becomes the context and the rest of each becomes its
    completion. chosen gets rank 0, rejected rank 1. A numeric `margin` column is kept as metadata; other columns are
    not.

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
            message fields, a malformed message, or an implicit-prompt pair with no shared prefix or an empty
            remainder.
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
    else:
        # Implicit prompt: chosen and rejected are whole conversations that share their opening turns.
        chosen_msgs, rejected_msgs = [], []
        for key, value, out in ((chosen_key, chosen, chosen_msgs), (rejected_key, rejected, rejected_msgs)):
            if not isinstance(value, list):
                raise fail(
                    key,
                    f"the row has no {prompt_key!r} column, so {key} must be a full conversation (a list of "
                    f"messages), got {_type_name(value)}; set prompt_key= to the column holding the prompt",
                )
            out.extend(validate_messages(value, key, source, row_num, row_label))
        shared = 0
        while shared < min(len(chosen_msgs), len(rejected_msgs)) and chosen_msgs[shared] == rejected_msgs[shared]:
            shared += 1
        if shared == 0:
            raise fail(chosen_key, f"{chosen_key} and {rejected_key} share no leading message, so there is no prompt")
        for key, msgs in ((chosen_key, chosen_msgs), (rejected_key, rejected_msgs)):
            if shared == len(msgs):
                raise fail(key, f"nothing is left of {key} after the prompt it shares with the other response")
        context, chosen_completion, rejected_completion = (
            chosen_msgs[:shared],
            chosen_msgs[shared:],
            rejected_msgs[shared:],
        )
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
