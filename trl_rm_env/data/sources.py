"""Where rows come from: a data spec string, local `.jsonl`/`.json` files (optionally gzipped), the bundled sample,
in-memory data and the Hub. Each source yields `(row number, parsed row)`; a line that cannot be read (not UTF-8, not
JSON) yields its `DataValidationError` in place of the row, so that the loaders' `on_invalid` policy treats it like
any other bad row (`trl_rm_env.data.rows`)."""

from __future__ import annotations

import gzip
import json
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from datasets import Dataset, load_dataset

from .schema import DataValidationError

SAMPLE_DIR = Path(__file__).parent / "sample"
SAMPLE_PREFIX = "sample:"

RawRows = Iterable[tuple[int, Any]]
"""`(row number, parsed row)` pairs; a row that failed to parse is its `DataValidationError`."""


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


def _sample_path(split: str, prefix: str = "") -> Path:
    """The bundled file of `split`: `<split>.jsonl`, or with `prefix` (`regression_`) `<prefix><split>.jsonl`."""
    name = split if split.startswith(prefix) else prefix + split
    path = SAMPLE_DIR / f"{name}.jsonl"
    if not path.is_file():
        if not prefix:
            available = sorted(p.stem for p in SAMPLE_DIR.glob("*.jsonl"))
            raise FileNotFoundError(f"no bundled sample split {split!r}; available: {', '.join(available)}")
        available = sorted(p.stem[len(prefix) :] for p in SAMPLE_DIR.glob(f"{prefix}*.jsonl"))
        kind = prefix.rstrip("_")
        raise FileNotFoundError(
            f"no bundled {kind} split {name[len(prefix) :]!r}; available: {', '.join(available)}"
        )
    return path


def open_source(
    source: str | Dataset | list[dict[str, Any]],
    split: str | None,
    hub_config: str | None,
    name: str | None,
    sample_prefix: str = "",
) -> tuple[str, RawRows, str]:
    """Resolve `source` (a path, `sample:<split>`, a Hub id, a Dataset or a list of dicts) into `(name used in
    errors, raw rows, row label)`; `name` names an in-memory source. `sample_prefix` picks a family of bundled files:
    with `regression_`, `sample:train` is `regression_train.jsonl`."""
    if isinstance(source, Dataset | list):
        return name or "<dataset>", enumerate(source), "row"
    if not isinstance(source, str):
        raise TypeError(
            f"source must be a path, 'sample:<split>', a Hub id, a Dataset or a list of dicts, got {source!r}"
        )
    if source.startswith(SAMPLE_PREFIX) or (source == "sample" and split):
        path = _sample_path(source[len(SAMPLE_PREFIX) :] if source != "sample" else split, sample_prefix)
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
    if path.exists() and not path.is_dir():
        raise ValueError(f"{source}: unsupported local data file; use .jsonl (one object per line) or .json")
    # A Hub dataset id, optionally with an inline split: "org/name:split". As in `datasets.load_dataset`, a local
    # folder of that name (a clone of the data set's repository, its configs in README.md) comes before the Hub.
    repo_id, inline_split = source, None
    if ":" in source:
        repo_id, _, inline_split = source.rpartition(":")
        if split is not None and split != inline_split:
            raise ValueError(f"{source}: inline split {inline_split!r} conflicts with split={split!r}")
    split = inline_split or split or "train"
    dataset = load_dataset(repo_id, name=hub_config, split=split)
    label = f"{repo_id}[{hub_config}]" if hub_config else repo_id
    return f"{label}:{split}", enumerate(dataset), "row"


def load_named_sets(
    train_data: str, eval_data: Sequence[str], load: Callable[..., Dataset]
) -> tuple[Dataset, dict[str, Dataset]]:
    """`load(source, split=..., name=...)` the training set and every `name=source[:split]` validation set (a source
    without a name is called `eval`).

    Raises:
        ValueError: two validation sets with the same name.
    """
    _, source, split = parse_data_spec(train_data)
    train = load(source, split=split, name="train")
    evals: dict[str, Dataset] = {}
    for spec in eval_data:
        name, source, split = parse_data_spec(spec)
        name = name or "eval"
        if name in evals:
            raise ValueError(f"eval_data names must be unique; {name!r} is given twice in {list(eval_data)}.")
        evals[name] = load(source, split=split, name=name)
    return train, evals
