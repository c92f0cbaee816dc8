"""`trl-rm-env eval`'s data sets: each `--data` spec to a named set of records (rank or regression), and RewardBench 2
rows to one set per subset."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from pathlib import Path

REQUEST_NAMES = {"cascade": "cascade_margin"}
"""How the library names what a message about a request names beside the request's fields (`{cascade}`)."""


class EvalRequestError(ValueError):
    """An `EvalRequest` that cannot run as given. Its message names the request's fields and options as the library
    spells them (`cascade_margin`, `mode`); `spelled(spell)` names them as a caller does (`trl-rm-env eval`: its
    flags, `--cascade-margin`, `--judge-mode`).

    Args:
        template: The message, each name of a field or option in braces (`"{cascade} needs {model}"`).
    """

    def __init__(self, template: str):
        self.template = template
        super().__init__(self.spelled(lambda name: REQUEST_NAMES.get(name, name)))

    def spelled(self, spell: Callable[[str], str]) -> str:
        """The message with each name in braces spelled by `spell` (a name `spell` returns None for keeps its braces)."""
        return re.sub(r"\{([a-z_]+)\}", lambda m: spell(m.group(1)) or m.group(0), self.template)


def data_spec(spec: str, data_format: str) -> tuple[str, str, str | None]:
    """`FILE`, `FILE:name`, `name=SOURCE[:split]` or a Hub `SOURCE[:split]` -> `(name, source, split)`."""
    from ..data.sources import parse_data_spec
    from .rewardbench import LLMBAR_FILE_SUBSETS

    head, sep, tail = spec.rpartition(":")
    if sep and "=" not in spec and Path(head).is_file():
        return tail, head, None
    name, source, split = parse_data_spec(spec)
    if name is None:
        path = Path(source)
        stem = Path(path.stem).stem if path.suffix == ".gz" else path.stem
        name = stem if path.is_file() else source
        if data_format == "llmbar" and stem.lower() in LLMBAR_FILE_SUBSETS:
            name = LLMBAR_FILE_SUBSETS[stem.lower()]  # LLMBar's file names -> RewardBench subset names
        if split:
            name = f"{name}:{split}"
    return name, source, split


def load_sets(
    specs: Sequence[str], data_format: str, on_invalid: str, regression: bool
) -> tuple[dict, dict, dict]:
    """`eval`'s sets, by name: records, rows skipped and ties dropped while loading.

    Raises:
        EvalRequestError: two sets with one name; `rewardbench2` with several sources.
    """
    from ..data.loaders import load_rank_records
    from ..data.regression import load_regression_records

    datasets, skipped, ties = {}, {}, {}
    if data_format == "rewardbench2":
        return rewardbench2_sets(specs, on_invalid)
    for spec in specs:
        name, source, split = data_spec(spec, data_format)
        if name in datasets:
            raise EvalRequestError(f"two data sets are named {name!r}; name them in {{data}} with FILE:name")
        if regression:
            records, report = load_regression_records(
                source, split=split, data_format=data_format, on_invalid=on_invalid
            )
            datasets[name], skipped[name] = records, report.skipped
        else:
            records, report = load_rank_records(source, split=split, data_format=data_format, on_invalid=on_invalid)
            datasets[name], skipped[name], ties[name] = records, report.skipped, report.ties
    return datasets, skipped, ties


def rewardbench2_sets(specs: Sequence[str], on_invalid: str) -> tuple[dict, dict, dict]:
    """`eval --format rewardbench2`: one source of RewardBench 2 rows -> one set per subset."""
    from .rewardbench2 import load_rewardbench2, split_by_subset

    if len(specs) != 1:
        raise EvalRequestError("{data_format} rewardbench2 takes one {data} source (a file or allenai/reward-bench-2)")
    name, source, split = data_spec(specs[0], "rewardbench2")
    records, report = load_rewardbench2(source, split=split, on_invalid=on_invalid, name=name)
    datasets = split_by_subset(records)
    skipped = {subset: 0 for subset in datasets}
    skipped[next(iter(datasets))] = report.skipped  # invalid rows have no trusted subset: counted on the first
    return datasets, skipped, {}
