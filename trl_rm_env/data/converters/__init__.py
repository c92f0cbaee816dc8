"""Converters: rows of other preference formats turned into rank records (and HelpSteer2 rows into regression
records). The contract is in `common.py`; each format has its module; the registries below map a `data_format`
name to its converter and, for converters that can return ties, to the rule the loader's log line states.
"""

from __future__ import annotations

from .common import Converter, margin_metadata, require_keys, string_field, two_way
from .helpsteer import (
    HELPSTEER2_ATTRIBUTES,
    helpsteer2_prompt_to_messages,
    helpsteer2_to_regression,
    helpsteer3_to_rank,
)
from .published import PANDALM_ANNOTATORS, hh_to_rank, llmbar_to_rank, pandalm_to_rank, parse_hh_transcript
from .trl import binary_to_rank, fold_context_into_completions, record_validation_view, validation_view
from .tulu3 import tulu3_to_rank

CONVERTERS: dict[str, Converter] = {
    "binary": binary_to_rank,
    "helpsteer3": helpsteer3_to_rank,
    "tulu3": tulu3_to_rank,
}
"""The generic rank converters: TRL's prompt/chosen/rejected data and the two NeMo RL preference datasets."""

REAL_FORMAT_CONVERTERS: dict[str, Converter] = {
    "llmbar": llmbar_to_rank,
    "pandalm": pandalm_to_rank,
    "hh": hh_to_rank,
}
"""Published human-judged preference sets (`published.py`)."""

ALL_CONVERTERS: dict[str, Converter] = {**CONVERTERS, **REAL_FORMAT_CONVERTERS}
"""Every rank `data_format` but "rank" itself."""

TIE_RULES: dict[str, str] = {
    "helpsteer3": "overall_preference == 0",
    "pandalm": "annotator majority is 0 (tie) or all three annotators differ",
    "hh": "chosen and rejected transcripts are identical",
}
"""For converters that can return `None`: what a tie is, for the loader's log line."""

REGRESSION_CONVERTERS: dict[str, Converter] = {"helpsteer2": helpsteer2_to_regression}
"""`data_format` name -> converter to regression records ("regression" is the native format)."""

__all__ = [
    "ALL_CONVERTERS",
    "CONVERTERS",
    "HELPSTEER2_ATTRIBUTES",
    "PANDALM_ANNOTATORS",
    "REAL_FORMAT_CONVERTERS",
    "REGRESSION_CONVERTERS",
    "TIE_RULES",
    "Converter",
    "binary_to_rank",
    "fold_context_into_completions",
    "helpsteer2_prompt_to_messages",
    "helpsteer2_to_regression",
    "helpsteer3_to_rank",
    "hh_to_rank",
    "llmbar_to_rank",
    "margin_metadata",
    "pandalm_to_rank",
    "parse_hh_transcript",
    "record_validation_view",
    "require_keys",
    "string_field",
    "tulu3_to_rank",
    "two_way",
    "validation_view",
]
