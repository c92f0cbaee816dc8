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

import gzip
import inspect
import json
import logging
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
from datasets import Dataset, load_dataset

from trl_rm_env.data.converters import CONVERTERS, TIE_RULES
from trl_rm_env.data.real_formats import REAL_FORMAT_CONVERTERS, REAL_FORMAT_TIE_RULES
from trl_rm_env.data.schema import (
    MAX_COMPLETIONS_PER_RECORD,
    DataValidationError,
    OnInvalid,
    ValidationReport,
    is_main_process,
    validate_rank_record,
)

logger = logging.getLogger(__name__)

SAMPLE_DIR = Path(__file__).parent / "sample"
SAMPLE_PREFIX = "sample:"
_BINARY_KEY_DEFAULTS = {"prompt_key": "prompt", "chosen_key": "chosen", "rejected_key": "rejected"}

# A raw row is `(row number, parsed object)`; a line that failed to parse carries its DataValidationError instead,
# so that the on_invalid policy treats it like any other bad row.
RawRows = Iterable[tuple[int, Any]]

# Every data_format the loader knows: the generic converters and the published formats (real_formats.py).
ALL_CONVERTERS = {**CONVERTERS, **REAL_FORMAT_CONVERTERS}
ALL_TIE_RULES = {**TIE_RULES, **REAL_FORMAT_TIE_RULES}


@dataclass
class LoadReport(ValidationReport):
    """What `load_rank_records` kept, skipped (invalid) and dropped (ties), with the skip reasons."""

    ties: int = 0
    tie_rule: str = "no preference"

    def log(self) -> None:
        """Log the ties and the skipped rows, once each (on the main process of a distributed run)."""
        if not is_main_process():
            return
        if self.ties:
            logger.info("%s: dropped %d tied row(s) (%s)", self.source, self.ties, self.tie_rule)
        if self.skipped:
            summary = ", ".join(f"{reason} ({n})" for reason, n in self.reasons.most_common())
            logger.warning(
                "%s: skipped %d invalid row(s) of %d: %s. First: %s",
                self.source,
                self.skipped,
                self.kept + self.skipped + self.ties,
                summary,
                "; ".join(self.first_errors),
            )


# --- data specs ---


def parse_data_spec(spec: str) -> tuple[str | None, str, str | None]:
    """Parse the recipe's string form of a data source into `(name, source, split)`.

    Forms: `"source"`, `"source:split"`, `"name=source"`, `"name=source:split"`. The name (a label such as
    `train` or `eval_hs3`) is the part before the first `=` when that part has no `/` or `:`. The split is the part
    after the last `:`, except that a source starting with `sample:` is the bundled data (`sample:train` stays the
    source, with no split) and URLs (`://`) keep their colons. Local paths such as `data/x.jsonl` have no colon.
    Windows paths (`C:\\...`) are not supported.

    Examples:
        `"data/x.jsonl"` -> `(None, "data/x.jsonl", None)`; `"sample:train"` -> `(None, "sample:train", None)`;
        `"org/ds:test"` -> `(None, "org/ds", "test")`; `"eval=org/ds:test"` -> `("eval", "org/ds", "test")`.

    Args:
        spec: The string to parse.

    Returns:
        `(name or None, source, split or None)`.

    Raises:
        ValueError: an empty spec, name, source or split.
    """
    text = spec.strip()
    name = None
    head, sep, rest = text.partition("=")
    if sep and "/" not in head and ":" not in head:
        name, text = head.strip(), rest.strip()
        if not name:
            raise ValueError(f"data spec {spec!r}: empty name before '='; use 'name=source' or just 'source'")
    split = None
    if ":" in text and not text.startswith(SAMPLE_PREFIX) and "://" not in text:
        text, _, split = text.rpartition(":")
        if not split:
            raise ValueError(f"data spec {spec!r}: empty split after ':'; use 'source:split' or just 'source'")
    if not text:
        raise ValueError(f"data spec {spec!r}: no source; use 'source', 'source:split' or 'name=source:split'")
    return name, text, split


# --- sources: each yields (row number, parsed row) ---


_UTF8_BOM = b"\xef\xbb\xbf"
_UTF16_BOMS = (b"\xff\xfe", b"\xfe\xff")


def _open_binary(path: Path):
    """Open a data file for reading bytes, decompressing `.gz` files (hh-rlhf ships as `.jsonl.gz`)."""
    return gzip.open(path, "rb") if path.suffix == ".gz" else path.open("rb")


def _data_suffix(path: Path) -> str:
    """`.jsonl` or `.json` for `x.jsonl` and `x.jsonl.gz` alike; otherwise the file's last suffix."""
    return Path(path.stem).suffix if path.suffix == ".gz" else path.suffix


def _utf16_error(source: str) -> DataValidationError:
    return DataValidationError(
        source, None, None, "the file is UTF-16 (it starts with a UTF-16 byte-order mark); save it as UTF-8"
    )


def _decode(raw: bytes, source: str, row: int | None, row_label: str = "line") -> str:
    """UTF-8 bytes -> text; a leading UTF-8 byte-order mark (what Windows editors write) is dropped.

    Raises:
        DataValidationError: bytes that are not UTF-8, naming the row and the offending byte.
    """
    if raw.startswith(_UTF8_BOM):
        raw = raw[len(_UTF8_BOM) :]
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise DataValidationError(
            source,
            row,
            None,
            f"not valid UTF-8: byte 0x{raw[err.start]:02x} at byte {err.start + 1}; save the file as UTF-8",
            row_label,
        ) from None


def parse_json(text: str, source: str, row: int | None, row_label: str = "line") -> Any:
    """`json.loads(text)`, with every failure as a `DataValidationError` naming the source and line.

    Besides invalid JSON this covers values nested too deeply for the parser (`RecursionError`, about 1000 levels)
    and integers of more than 4300 digits (Python's limit). `NaN` and `Infinity` parse (as Python does); the schema
    rejects them where a number must be finite.
    """
    try:
        return json.loads(text)
    except RecursionError:
        reason = "invalid JSON: nested too deeply to parse (more than about 1000 levels of lists or objects)"
    except ValueError as err:  # JSONDecodeError, and int() past sys.get_int_max_str_digits()
        if isinstance(err, json.JSONDecodeError) and row is not None and row_label == "line":
            # One line of a .jsonl file: the error's own "line 2 column 1" would count lines within this one.
            message = err.msg.removesuffix(" at")  # "Invalid control character at": the position follows
            reason = f"invalid JSON: {message} at character {err.pos + 1} of the line"
        elif isinstance(err, json.JSONDecodeError):
            reason = f"invalid JSON: {err}"
        else:
            reason = f"invalid JSON: a number of more than {sys.get_int_max_str_digits()} digits"
    raise DataValidationError(source, row, None, reason, row_label)


def read_jsonl(path: Path) -> Iterator[tuple[int, Any]]:
    """One JSON value per line of a `.jsonl` (or `.jsonl.gz`) file, with 1-based line numbers; blank lines skipped.

    A line that is not UTF-8 or not JSON yields a `DataValidationError` naming the file and line in place of the
    value, so that the `on_invalid` policy treats it like any other bad row. A UTF-8 byte-order mark is accepted.

    Raises:
        DataValidationError: a file that cannot be read as a whole (UTF-16, a corrupt `.gz`).
    """
    source = str(path)
    try:
        with _open_binary(path) as f:
            for line_num, raw in enumerate(f, start=1):
                if line_num == 1 and raw.startswith(_UTF16_BOMS):
                    raise _utf16_error(source)
                try:
                    line = _decode(raw, source, line_num, "line")
                    if not line.strip():
                        continue
                    yield line_num, parse_json(line, source, line_num, "line")
                except DataValidationError as err:
                    yield line_num, err
    except (OSError, EOFError) as err:  # gzip.BadGzipFile is an OSError
        raise DataValidationError(source, None, None, f"cannot read the file: {err}") from None


def read_json(path: Path) -> list[tuple[int, Any]]:
    """The rows of a `.json` (or `.json.gz`) file: a list, or an object with a single list value (`{"data": [...]}`),
    with 0-based row numbers. A UTF-8 byte-order mark is accepted.

    Raises:
        DataValidationError: a file that is not UTF-8 (naming the line of the bad byte), not JSON, nested too deeply,
            or not a list of rows.
    """
    source = str(path)
    try:
        with _open_binary(path) as f:
            raw = f.read()
    except (OSError, EOFError) as err:
        raise DataValidationError(source, None, None, f"cannot read the file: {err}") from None
    if raw.startswith(_UTF16_BOMS):
        raise _utf16_error(source)
    body = raw[len(_UTF8_BOM) :] if raw.startswith(_UTF8_BOM) else raw
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as err:
        line = body.count(b"\n", 0, err.start) + 1
        column = err.start - (body.rfind(b"\n", 0, err.start) + 1) + 1
        raise DataValidationError(
            source,
            line,
            None,
            f"not valid UTF-8: byte 0x{body[err.start]:02x} at byte {column}; save the file as UTF-8",
        ) from None
    try:
        data = parse_json(text, source, None)
    except DataValidationError as err:
        raise DataValidationError(
            source, None, None, f"{err.reason} (for one object per line, name the file .jsonl)"
        ) from None
    if isinstance(data, dict):
        lists = [key for key, value in data.items() if isinstance(value, list)]
        if len(lists) != 1:
            raise DataValidationError(
                source,
                None,
                None,
                f"a .json file must hold a list of rows or an object with one list value, got an object with "
                f"{len(lists)} list values (keys: {sorted(data)})",
            )
        data = data[lists[0]]
    if not isinstance(data, list):
        raise DataValidationError(
            source, None, None, f"a .json file must hold a list of rows, got {type(data).__name__}"
        )
    return list(enumerate(data))


def _sample_path(split: str) -> Path:
    path = SAMPLE_DIR / f"{split}.jsonl"
    if not path.is_file():
        available = sorted(p.stem for p in SAMPLE_DIR.glob("*.jsonl"))
        raise FileNotFoundError(f"no bundled sample split {split!r}; available: {', '.join(available)}")
    return path


def _open_source(
    source: str | Dataset | list[dict[str, Any]], split: str | None, hub_config: str | None, name: str | None
) -> tuple[str, RawRows, str]:
    """Resolve `source` into `(name used in errors, raw rows, row label)`."""
    if isinstance(source, Dataset | list):
        return name or "<dataset>", enumerate(source), "row"
    if not isinstance(source, str):
        raise TypeError(
            f"source must be a path, 'sample:<split>', a Hub id, a Dataset or a list of dicts, got {source!r}"
        )
    if source.startswith(SAMPLE_PREFIX) or (source == "sample" and split):
        path = _sample_path(source[len(SAMPLE_PREFIX) :] if source != "sample" else split)
        return str(path), read_jsonl(path), "line"
    path = Path(source)
    if _data_suffix(path) in (".jsonl", ".json"):
        if split is not None:
            raise ValueError(f"{source}: split={split!r} applies to Hub datasets only; a local file is one split")
        if not path.is_file():
            raise FileNotFoundError(f"data file not found: {source}")
        if _data_suffix(path) == ".jsonl":
            return source, read_jsonl(path), "line"
        return source, read_json(path), "row"
    if path.exists():
        raise ValueError(f"{source}: unsupported local data file; use .jsonl (one object per line) or .json")
    # A Hub dataset id, optionally with an inline split: "org/name:split".
    repo_id, inline_split = source, None
    if ":" in source:
        repo_id, _, inline_split = source.rpartition(":")
        if split is not None and split != inline_split:
            raise ValueError(f"{source}: inline split {inline_split!r} conflicts with split={split!r}")
    split = inline_split or split or "train"
    dataset = load_dataset(repo_id, name=hub_config, split=split)
    label = f"{repo_id}[{hub_config}]" if hub_config else repo_id
    return f"{label}:{split}", enumerate(dataset), "row"


# --- records ---


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
    if on_invalid not in ("raise", "skip"):
        raise ValueError(f"on_invalid must be 'raise' or 'skip', got {on_invalid!r}")
    key_options = {"prompt_key": prompt_key, "chosen_key": chosen_key, "rejected_key": rejected_key}
    converter = _converter_for(data_format, key_options)
    source_name, rows, row_label = _open_source(source, split, hub_config, name)
    report = LoadReport(source_name, tie_rule=ALL_TIE_RULES.get(data_format, "no preference"))
    records = []
    for row_num, row in rows:
        try:
            if isinstance(row, DataValidationError):
                raise row
            if converter is not None:
                row = converter(row, source_name, row_num, row_label)
                if row is None:
                    report.ties += 1
                    continue
            records.append(validate_rank_record(row, source_name, row_num, row_label, max_completions))
        except DataValidationError as err:
            if on_invalid == "raise":
                raise
            report.add_invalid(err)
    report.kept = len(records)
    if log:
        report.log()
    if not records and not allow_empty:
        raise ValueError(
            f"{source_name}: no valid records (skipped {report.skipped} invalid, dropped {report.ties} tied); "
            f"check data_format={data_format!r} and the file contents"
        )
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


def load_rank_dataset(
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
) -> Dataset:
    """Load `source` as a `datasets.Dataset` of rank records (columns `context`, `completions`, metadata).

    Same arguments as `load_rank_records`, which does the work; call that one to get the `LoadReport` counts.

    Returns:
        A Dataset with one row per valid record.

    Raises:
        DataValidationError: with `on_invalid="raise"`, the first bad row, naming source, line/row and field.
        FileNotFoundError: a missing local file or bundled split.
        ValueError: a bad option, no valid record, or records that cannot form one table (plain text mixed with
            messages, or a metadata key with different types).
    """
    records, report = load_rank_records(
        source,
        split=split,
        data_format=data_format,
        on_invalid=on_invalid,
        prompt_key=prompt_key,
        chosen_key=chosen_key,
        rejected_key=rejected_key,
        hub_config=hub_config,
        name=name,
        max_completions=max_completions,
    )
    return records_to_dataset(records, report.source)
