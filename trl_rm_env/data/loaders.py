"""Loading rank-schema data from files, the bundled sample, memory or the Hub.

The data path reads in one direction: a source gives raw rows; a converter (when `data_format` is not "rank")
turns each row into a rank record; `validate_rank_record` checks and normalises it; the kept records become a
`datasets.Dataset`. Bad rows either stop the load (`on_invalid="raise"`, the error names source, line/row and
field) or are skipped and counted (`on_invalid="skip"`), and the counts are logged once per source::

    from trl_rm_env.data import load_rank_dataset, parse_data_spec

    train = load_rank_dataset("sample:train")
    hs3 = load_rank_dataset("nvidia/HelpSteer3", hub_config="preference", data_format="helpsteer3")
    name, source, split = parse_data_spec("eval=org/data:test")  # ("eval", "org/data", "test")
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable
from typing import Any

import pyarrow as pa
from datasets import Dataset

from .converters import ALL_CONVERTERS, TIE_RULES
from .rows import LoadReport, check_on_invalid, collect_records
from .schema import MAX_COMPLETIONS_PER_RECORD, OnInvalid, validate_rank_record
from .sources import open_source

_BINARY_KEY_DEFAULTS = {"prompt_key": "prompt", "chosen_key": "chosen", "rejected_key": "rejected"}


def _converter_for(data_format: str, key_options: dict[str, str]) -> Any:
    """The converter for `data_format` (None for "rank"), with the key options it accepts bound."""
    changed = {k: v for k, v in key_options.items() if v != _BINARY_KEY_DEFAULTS[k]}
    if data_format == "rank":
        if changed:
            raise ValueError(f"{', '.join(changed)} only apply when converting, e.g. data_format='binary'")
        return None
    if data_format not in ALL_CONVERTERS:
        raise ValueError(f"unknown data_format {data_format!r}; choose 'rank' or one of {sorted(ALL_CONVERTERS)}")
    converter = ALL_CONVERTERS[data_format]
    accepted = inspect.signature(converter).parameters
    unsupported = [k for k in changed if k not in accepted]
    if unsupported:
        raise ValueError(f"data_format={data_format!r} does not take {', '.join(unsupported)}")
    bound = {k: v for k, v in key_options.items() if k in accepted}
    return lambda row, source, row_num, row_label: converter(row, source, row_num, row_label, **bound)


def load_rank_records(
    source: str | Dataset | list[dict[str, Any]],
    *,
    split: str | None = None,
    data_format: str = "rank",
    on_invalid: OnInvalid = "raise",
    prompt_key: str = "prompt",
    chosen_key: str = "chosen",
    rejected_key: str = "rejected",
    hub_config: str | None = None,
    name: str | None = None,
    max_completions: int | None = MAX_COMPLETIONS_PER_RECORD,
    log: bool = True,
    allow_empty: bool = False,
) -> tuple[list[dict[str, Any]], LoadReport]:
    """Load, convert and validate rows from `source` into normalised rank records.

    Args:
        source: A local `.jsonl` (one object per line, errors cite 1-based lines) or `.json` file (a list, or an
            object with one list value; errors cite 0-based rows), either one optionally gzipped (`.jsonl.gz`,
            `.json.gz`), `"sample:<split>"` for the bundled data in
            `trl_rm_env/data/sample/`, a `datasets.Dataset` or list of dicts, or else a Hub dataset id, optionally
            with an inline split (`"org/name:split"`).
        split: Hub split (default "train"); not allowed for local files.
        data_format: "rank" for rank-schema rows, or a converter name: "binary", "helpsteer3", "tulu3" (`CONVERTERS`),
            "llmbar", "pandalm", "hh" (`REAL_FORMAT_CONVERTERS`).
        on_invalid: "raise" stops at the first bad row; "skip" drops bad rows and logs their count and reasons once.
        prompt_key: Prompt column, for `data_format="binary"`.
        chosen_key: Preferred-response column, for `data_format="binary"`.
        rejected_key: Other-response column, for `data_format="binary"`.
        hub_config: Hub dataset configuration (`name=` of `datasets.load_dataset`), e.g. "preference".
        name: Name used in errors for an in-memory source (default "<dataset>").
        max_completions: Most completions per record (default `MAX_COMPLETIONS_PER_RECORD`; None: no limit).
        log: Log the tie and skip counts (once); False when the caller reports them itself (`trl-rm-env validate`).
        allow_empty: Return an empty list instead of raising when no record is valid.

    Returns:
        The valid records and a `LoadReport` with `source, kept, skipped, ties, reasons`.

    Raises:
        DataValidationError: with `on_invalid="raise"`, the first bad row, naming source, line/row and field; in
            either mode, a file that cannot be read as a whole (UTF-16, not a list of rows, a corrupt `.gz`).
        FileNotFoundError: a missing local file or bundled split.
        ValueError: a bad option, or no valid record at all.
    """
    check_on_invalid(on_invalid)
    key_options = {"prompt_key": prompt_key, "chosen_key": chosen_key, "rejected_key": rejected_key}
    converter = _converter_for(data_format, key_options)
    source_name, rows, row_label = open_source(source, split, hub_config, name)
    report = LoadReport(source_name, tie_rule=TIE_RULES.get(data_format, "no preference"))

    def convert(row: Any, row_num: int) -> dict[str, Any] | None:
        if converter is not None:
            row = converter(row, source_name, row_num, row_label)
            if row is None:  # a tie
                return None
        return validate_rank_record(row, source_name, row_num, row_label, max_completions)

    hint = None if allow_empty else f"data_format={data_format!r} and the file contents"
    records = collect_records(rows, convert, report, on_invalid, log, hint)
    return records, report


def records_to_dataset(records: list[dict[str, Any]], source: str) -> Dataset:
    """Validated records -> Dataset, with every metadata key any record has (missing values become None).

    Raises:
        ValueError: plain-text records mixed with message records, or a metadata key with values of different types
            (what `trl-rm-env validate` reports as a whole-file problem).
    """
    plain = [isinstance(r["context"], str) for r in records]
    if any(plain) and not all(plain):
        raise ValueError(
            f"{source}: mixes plain-text records (context is a string) with conversational ones (lists of "
            "messages); use one form per dataset"
        )
    columns = list(dict.fromkeys(key for record in records for key in record))
    try:
        return Dataset.from_dict({key: [r.get(key) for r in records] for key in columns})
    except (pa.ArrowInvalid, pa.ArrowTypeError) as err:
        raise ValueError(f"{source}: records do not fit one table ({err}); a metadata key must have one type") from err


def load_rank_dataset(source: str | Dataset | list[dict[str, Any]], **options: Any) -> Dataset:
    """Load `source` as a `datasets.Dataset` of rank records (columns `context`, `completions`, metadata).

    Takes the arguments of `load_rank_records`, which does the work (declared there once); call that one to get the
    `LoadReport` counts.

    Returns:
        A Dataset with one row per valid record.

    Raises:
        DataValidationError: with `on_invalid="raise"`, the first bad row, naming source, line/row and field.
        FileNotFoundError: a missing local file or bundled split.
        ValueError: a bad option, no valid record, or records that cannot form one table (plain text mixed with
            messages, or a metadata key with different types).
    """
    records, report = load_rank_records(source, **options)
    return records_to_dataset(records, report.source)


def validate_records(
    records: Iterable[tuple[int, Any]],
    source: str,
    on_invalid: OnInvalid = "raise",
    row_label: str = "line",
    max_completions: int | None = MAX_COMPLETIONS_PER_RECORD,
    log: bool = True,
) -> tuple[list[dict[str, Any]], LoadReport]:
    """Validate `(row, record)` pairs of rank records; raise on the first bad one, or skip and count them.

    Args:
        records: `(row number, record)` pairs.
        source: Name used in errors.
        on_invalid: "raise" or "skip".
        row_label: "line" or "row", the word used in errors.
        max_completions: Most completions per record (None: no limit).
        log: Log the summary of skipped records (once); False when the caller reports it itself.

    Returns:
        The valid records and a `LoadReport`.
    """
    report = LoadReport(source, unit="record")
    kept = collect_records(
        records,
        lambda record, row: validate_rank_record(record, source, row, row_label, max_completions),
        report,
        on_invalid,
        log,
    )
    return kept, report


def load_prompt_dataset(spec: str, column: str = "prompt") -> Dataset:
    """GRPO's prompts, a dataset with a `prompt` column (messages or text) as `GRPOTrainer` expects, from a rank file
    or the bundled sample (each distinct context once) or any dataset's `column` (a local JSON/JSONL file or a Hub
    id, `spec` as `parse_data_spec` reads it).

    Raises:
        ValueError: a dataset without `column`, naming its columns.
    """
    from .sources import parse_data_spec

    _, source, split = parse_data_spec(spec)
    if source.startswith("sample:") or source.endswith((".jsonl", ".json")) and _is_rank_file(source):
        records, _ = load_rank_records(source, split=split)
        contexts = {repr(record["context"]): record["context"] for record in records}  # first seen order
        return Dataset.from_list([{"prompt": context} for context in contexts.values()])
    from datasets import load_dataset

    if source.endswith((".jsonl", ".json")):
        dataset = load_dataset("json", data_files=source, split="train")
    else:
        dataset = load_dataset(source, split=split or "train")
    if column not in dataset.column_names:
        raise ValueError(
            f"Prompt dataset {spec!r} has no column {column!r} (columns: {dataset.column_names}); name the prompt "
            "column (prompt_column)."
        )
    return dataset.rename_column(column, "prompt") if column != "prompt" else dataset


def _is_rank_file(path: str) -> bool:
    with open(path, encoding="utf-8") as f:
        first = f.readline() if path.endswith(".jsonl") else f.read(1 << 16)
    return '"completions"' in first and '"context"' in first
