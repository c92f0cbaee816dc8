"""Preference data in the rank schema (and regression records): sources, validation, converters and loaders.

The data path reads in one direction: a source (`sources.py`) gives raw rows; a converter (`converters/`, when
`data_format` is not "rank") turns each row into a record; the schema (`schema.py`, messages in `messages.py`) checks
and normalises it inside the one raise-or-skip loop (`loading.py`); the kept records become a `datasets.Dataset`
(`loaders.py`, `regression.py`). Start with `load_rank_dataset("sample:train")` (or a `.jsonl`/`.json` path, a Hub
id, a `datasets.Dataset`).
"""

from trl_rm_env.data.converters import CONVERTERS, binary_to_rank, helpsteer3_to_rank, tulu3_to_rank
from trl_rm_env.data.loaders import load_rank_dataset, load_rank_records, records_to_dataset, validate_records
from trl_rm_env.data.loading import LoadReport
from trl_rm_env.data.schema import DataValidationError, iter_pairs, validate_rank_record
from trl_rm_env.data.sources import parse_data_spec

__all__ = [
    "CONVERTERS",
    "DataValidationError",
    "LoadReport",
    "binary_to_rank",
    "helpsteer3_to_rank",
    "iter_pairs",
    "load_rank_dataset",
    "load_rank_records",
    "parse_data_spec",
    "records_to_dataset",
    "tulu3_to_rank",
    "validate_rank_record",
    "validate_records",
]
