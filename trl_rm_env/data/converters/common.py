"""What every converter shares: the converter contract and the checks of a row's keys and margin.

A converter is a function `(row, source, row_num, row_label, **options) -> record | None`: it returns a rank record
(`{"context": ..., "completions": [{"rank": int, "completion": ...}, ...], **metadata}`) or a regression record,
which the loader then validates; `None` for a row that carries no preference (a tie), which the loader counts and
drops; and it raises `DataValidationError` naming source, row and field for a row it cannot read (never a bare
`KeyError`). To add a format, write a module here and register the function in `converters/__init__.py`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

from ..messages import type_name
from ..schema import DataValidationError, margin_problem

Converter = Callable[..., dict[str, Any] | None]


def require_keys(
    row: Any, keys: tuple[str, ...], source: str, row_num: int | None, row_label: str, hint: str = ""
) -> Mapping[str, Any]:
    """Check that `row` is an object holding every key in `keys`; return it."""
    if not isinstance(row, Mapping):
        raise DataValidationError(source, row_num, None, f"a row must be an object, got {type_name(row)}", row_label)
    for key in keys:
        if key not in row:
            present = ", ".join(repr(k) for k in row) or "none"
            raise DataValidationError(
                source, row_num, key, f"missing {key!r}; the row has keys [{present}]{hint}", row_label
            )
    return row


def string_field(row: Any, key: str, source: str, row_num: int | None, row_label: str) -> str:
    """`row[key]`, which must be a string."""
    value = row[key]
    if not isinstance(value, str):
        raise DataValidationError(source, row_num, key, f"must be a string, got {type_name(value)}", row_label)
    return value


def margin_metadata(row: Mapping[str, Any], source: str, row_num: int | None, row_label: str) -> dict[str, Any]:
    """`{"margin": value}` when the row has a numeric margin (TRL's optional column), else `{}`."""
    margin = row.get("margin")
    if margin is None:
        return {}
    if isinstance(margin, bool) or not isinstance(margin, int | float):
        raise DataValidationError(
            source, row_num, "margin", f"margin must be a number, got {type_name(margin)} {margin!r}", row_label
        )
    if not math.isfinite(margin):
        raise DataValidationError(source, row_num, "margin", f"margin must be finite, got {margin!r}", row_label)
    problem = margin_problem(margin)
    if problem:
        raise DataValidationError(source, row_num, "margin", problem, row_label)
    return {"margin": margin}


def two_way(context: str, first: str, second: str, winner: int) -> dict[str, Any]:
    """A user turn and two assistant answers; `winner` (1 or 2) gets rank 0."""
    return {
        "context": [{"role": "user", "content": context}],
        "completions": [
            {"rank": 0 if winner == 1 else 1, "completion": [{"role": "assistant", "content": first}]},
            {"rank": 0 if winner == 2 else 1, "completion": [{"role": "assistant", "content": second}]},
        ],
    }
