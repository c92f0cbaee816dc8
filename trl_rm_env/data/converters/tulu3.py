"""allenai/llama-3.1-tulu-3-8b-preference-mixture rows as rank records."""

from __future__ import annotations

from typing import Any

from ..schema import DataValidationError, validate_messages
from .common import require_keys


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
    require_keys(row, ("chosen", "rejected"), source, row_num, row_label)
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
