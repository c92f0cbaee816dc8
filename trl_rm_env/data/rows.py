"""The one loop that turns raw rows into records: each row is converted and validated, and a bad row either stops
the load (`on_invalid="raise"`: its `DataValidationError` names source, line/row and field) or is skipped and
counted (`on_invalid="skip"`: the counts and reasons are logged once per source). A converter may also return None
for a row that carries no preference (a tie), which is counted apart. The rank loader, the regression loader,
RewardBench 2 and `validate_records` all run it.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from ..errors import is_main_process
from .schema import DataValidationError, OnInvalid

logger = logging.getLogger(__name__)

ON_INVALID_MODES = ("raise", "skip")


@dataclass
class LoadReport:
    """What a load kept, skipped (invalid) and dropped (ties), with the skip reasons and the first few errors."""

    source: str
    kept: int = 0
    skipped: int = 0
    reasons: Counter = field(default_factory=Counter)
    first_errors: list[str] = field(default_factory=list)
    ties: int = 0
    tie_rule: str = "no preference"
    unit: str = "row"  # the word of the log line: rows of a file, records handed over in memory

    def add_invalid(self, err: DataValidationError) -> None:
        """Count a skipped row, its reason, and keep the first few messages for the summary."""
        self.skipped += 1
        self.reasons[err.reason] += 1
        if len(self.first_errors) < 3:
            self.first_errors.append(str(err))

    def log(self) -> None:
        """Log the ties and the skipped rows, once each (on the main process of a distributed run)."""
        if not is_main_process():
            return
        if self.ties:
            logger.info("%s: dropped %d tied row(s) (%s)", self.source, self.ties, self.tie_rule)
        if self.skipped:
            summary = ", ".join(f"{reason} ({n})" for reason, n in self.reasons.most_common())
            logger.warning(
                "%s: skipped %d invalid %s(s) of %d: %s. First: %s",
                self.source,
                self.skipped,
                self.unit,
                self.kept + self.skipped + self.ties,
                summary,
                "; ".join(self.first_errors),
            )


def check_on_invalid(on_invalid: str) -> None:
    if on_invalid not in ON_INVALID_MODES:
        raise ValueError(f"on_invalid must be 'raise' or 'skip', got {on_invalid!r}")


def convert_row(
    convert: Callable[[Any, int], Any], row: Any, row_num: int, on_invalid: OnInvalid = "raise"
) -> tuple[Any, DataValidationError | None]:
    """The raise-or-skip rule for one row: `(convert(row, row_num), None)`; for a bad row (`convert` raised a
    `DataValidationError`, or the row is one: a line that could not be read), the error is raised with
    `on_invalid="raise"` and returned as `(None, error)` with `"skip"`. `collect_records` runs it over a list;
    the trainer runs it per row inside `dataset.map` (`trl_rm_env.trainer.examples`)."""
    try:
        if isinstance(row, DataValidationError):
            raise row
        return convert(row, row_num), None
    except DataValidationError as err:
        if on_invalid == "raise":
            raise
        return None, err


def collect_records(
    rows: Iterable[tuple[int, Any]],
    convert: Callable[[Any, int], dict[str, Any] | None],
    report: LoadReport,
    on_invalid: OnInvalid = "raise",
    log: bool = True,
    hint: str | None = None,
) -> list[dict[str, Any]]:
    """Run `convert(row, row_number)` (convert and validate: a record, or None for a tie) over `rows`, raising or
    skipping bad rows as `on_invalid` says; a row given as a `DataValidationError` (a line that could not be read)
    is a bad row. Fills `report` and, with `log`, logs it once. With a `hint` (what to check), a load that keeps
    nothing is an error that counts what was skipped and dropped.

    Raises:
        DataValidationError: the first bad row, with `on_invalid="raise"`.
        ValueError: no valid record, when a `hint` is given.
        ValueError: `on_invalid` is neither "raise" nor "skip".
    """
    check_on_invalid(on_invalid)
    records = []
    for row_num, row in rows:
        record, err = convert_row(convert, row, row_num, on_invalid)
        if err is not None:
            report.add_invalid(err)
        elif record is None:
            report.ties += 1
        else:
            records.append(record)
    report.kept = len(records)
    if log:
        report.log()
    if not records and hint is not None:
        ties = f", dropped {report.ties} tied" if report.tie_rule != "none" else ""
        raise ValueError(f"{report.source}: no valid records (skipped {report.skipped} invalid{ties}); check {hint}")
    return records
