"""Preference data in the rank schema: validation, converters from other formats, and loaders.

Start with `load_rank_dataset("sample:train")` (or a `.jsonl`/`.json` path, a Hub id, a `datasets.Dataset`).
"""

from trl_rm_env.data.converters import CONVERTERS, binary_to_rank, helpsteer3_to_rank, tulu3_to_rank
from trl_rm_env.data.loaders import LoadReport, load_rank_dataset, load_rank_records, parse_data_spec
from trl_rm_env.data.schema import DataValidationError, iter_pairs, validate_rank_record, validate_records

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
    "tulu3_to_rank",
    "validate_rank_record",
    "validate_records",
]
