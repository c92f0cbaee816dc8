"""NVIDIA's HelpSteer3 preference rows (rank records, ties kept as ties) and HelpSteer2 rows (regression records)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from ..messages import type_name
from ..schema import DataValidationError
from .common import require_keys

HELPSTEER2_ATTRIBUTES = ("helpfulness", "correctness", "coherence", "complexity", "verbosity")
"""The five attribute columns of nvidia/HelpSteer2 (each 0-4, higher is more)."""


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
    require_keys(row, ("context", "response1", "response2", "overall_preference"), source, row_num, row_label)

    def fail(field_name: str, reason: str) -> DataValidationError:
        return DataValidationError(source, row_num, field_name, reason, row_label)

    for key in ("response1", "response2"):
        if not isinstance(row[key], str):
            raise fail(key, f"must be a string, got {type_name(row[key])}")
    preference = row["overall_preference"]
    if isinstance(preference, bool) or not isinstance(preference, int) or not -3 <= preference <= 3:
        raise fail("overall_preference", f"must be an int in -3..3, got {type_name(preference)} {preference!r}")
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


_HELPSTEER2_TURN = re.compile(r"\n?<extra_id_1>(User|Assistant)\n?")


def helpsteer2_prompt_to_messages(prompt: str) -> list[dict[str, str]]:
    """Split a HelpSteer2 prompt into messages.

    Multi-turn prompts (about 29% of HelpSteer2) hold every earlier turn, separated by `<extra_id_1>User` and
    `<extra_id_1>Assistant` lines (the dataset card's format); the text before the first separator is the first
    user turn.
    """
    parts = _HELPSTEER2_TURN.split(prompt)
    messages = [{"role": "user", "content": parts[0]}]
    for role, content in zip(parts[1::2], parts[2::2]):
        messages.append({"role": role.lower(), "content": content})
    return messages


def helpsteer2_to_regression(
    row: Any,
    source: str,
    row_num: int | None,
    row_label: str = "row",
    attributes: Sequence[str] | None = None,
) -> dict[str, Any]:
    """Turn a nvidia/HelpSteer2 row into a regression record.

    The prompt becomes the context (split into turns, see `helpsteer2_prompt_to_messages`), the response the
    assistant completion, and the attribute columns the `attributes`. With `attributes` set, exactly those columns
    are read (each must exist); otherwise whichever of the five HelpSteer2 columns the row has.

    Args:
        row: `{"prompt": str, "response": str, "helpfulness": int, "correctness": int, "coherence": int,
            "complexity": int, "verbosity": int}`.
        source: Where it came from, used in errors.
        row_num: Its line or row number, used in errors.
        row_label: "line" or "row", the word used in errors.
        attributes: The attribute columns to read; None reads the HelpSteer2 five that are present.

    Returns:
        `{"context": [messages], "completion": [assistant message], "attributes": {name: value}}`, for
        `validate_regression_record` to check (the values are checked there).

    Raises:
        DataValidationError: a missing `prompt`/`response` or requested attribute column, or a non-string
            prompt/response.
    """
    columns = tuple(attributes) if attributes is not None else ()
    require_keys(row, ("prompt", "response", *columns), source, row_num, row_label)
    for key in ("prompt", "response"):
        if not isinstance(row[key], str):
            raise DataValidationError(source, row_num, key, f"must be a string, got {type_name(row[key])}", row_label)
    names = columns or tuple(name for name in HELPSTEER2_ATTRIBUTES if name in row)
    return {
        "context": helpsteer2_prompt_to_messages(row["prompt"]),
        "completion": [{"role": "assistant", "content": row["response"]}],
        "attributes": {name: row[name] for name in names},
    }
