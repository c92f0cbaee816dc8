"""Preference data in the rank schema (and regression records): sources, validation, converters and loaders.

The data path reads in one direction: a source (`sources.py`) gives raw rows; a converter (`converters/`, when
`data_format` is not "rank") turns each row into a record; the schema (`schema.py`, messages in `messages.py`) checks
and normalises it inside the one raise-or-skip loop (`rows.py`); the kept records become a `datasets.Dataset`
(`loaders.py`, `regression.py`). Start with `load_rank_dataset("sample:train")` (or a `.jsonl`/`.json` path, a Hub
id, a `datasets.Dataset`).
"""

from __future__ import annotations

from ..lazy import lazy_exports

_MODULES = {
    ".converters": ("CONVERTERS", "binary_to_rank", "helpsteer3_to_rank", "tulu3_to_rank"),
    ".loaders": ("load_rank_dataset", "load_rank_records", "records_to_dataset", "validate_records"),
    ".rows": ("LoadReport",),
    ".schema": ("DataValidationError", "iter_pairs", "validate_rank_record"),
    ".sources": ("parse_data_spec",),
}
"""Public names, imported on first use: the command line reads `data.rows` and `data.schema` without loading
`datasets`."""


__getattr__, __dir__, __all__ = lazy_exports(__name__, _MODULES)
