"""Regression reward data: one response rated on several numeric attributes (HelpSteer2-style).

One record::

    {"context": [{"role": "user", "content": "What is 2 + 3?"}],
     "completion": [{"role": "assistant", "content": "2 + 3 = 5. The answer is 5."}],
     "attributes": {"helpfulness": 4, "correctness": 4, "verbosity": 2}}

`context` and `completion` are lists of messages, or both plain strings (TRL's "standard" format); messages follow
the rank schema's rules (`schema.py`: known roles, a completion of assistant and tool messages, no lone surrogates,
tool calls). `attributes` maps a name to a number (int or float; not a bool, NaN or infinity). An attribute may be missing or `null` (it is
then masked out of the loss), but a record needs at least one. Other keys are kept as metadata. A regression reward
model predicts every attribute; a weighted sum of them becomes the reward (`attribute_weights`, see
`docs/regression.md`).

Sources (`sources.py`) and the `on_invalid` policy (`rows.py`) are the ones of the rank loaders::

    from trl_rm_env.data.regression import load_regression_dataset

    train = load_regression_dataset("sample:train")                      # bundled regression_train.jsonl
    hs2 = load_regression_dataset("nvidia/HelpSteer2", split="validation", data_format="helpsteer2")

Errors name source, line/row and field, e.g.::

    data/train.jsonl, line 7, field 'attributes.helpfulness': must be a number, got str '3'
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from datasets import Dataset

from .converters import HELPSTEER2_ATTRIBUTES, REGRESSION_CONVERTERS
from .loaders import records_to_dataset
from .messages import finite_number, type_name
from .rows import LoadReport, check_on_invalid, collect_records
from .schema import DataValidationError, OnInvalid, check_text, validate_exchange
from .sources import load_named_sets, open_source

REGRESSION_FORMATS = ("regression", *REGRESSION_CONVERTERS)
"""Every regression `data_format`: the native records and each converter's name."""


# --- one record ---


def validate_regression_record(
    record: Any,
    source: str = "<records>",
    row: int | None = None,
    row_label: str = "line",
    attributes: Sequence[str] | None = None,
) -> dict[str, Any]:
    """Validate one regression record and return it normalised.

    Args:
        record, source, row, row_label: The parsed record and where it came from, as for `validate_rank_record`.
        attributes: The allowed attribute names; None allows any name.

    Returns:
        `{"context": ..., "completion": ..., "attributes": {name: float}, **metadata}`: messages as
        `validate_messages` returns them; `attributes` holds the present values only, as floats (a `null` value
        counts as missing).

    Raises:
        DataValidationError: naming source, row and field, for: a record that is not an object, a string that is not
            valid Unicode, a missing `context`/`completion`/`attributes`, a malformed message, a user or system message
            in the completion, an empty completion, `attributes` that is not an object, a value that is not a finite
            number (bools and numeric strings are not numbers), an attribute not in `attributes`, or no attribute
            value at all.
    """

    def fail(field_name: str | None, reason: str) -> DataValidationError:
        return DataValidationError(source, row, field_name, reason, row_label)

    if not isinstance(record, Mapping):
        raise fail(None, f"a record must be a JSON object, got {type_name(record)}")
    check_text(record, source, row, row_label)
    for key in ("context", "completion", "attributes"):
        if key not in record:
            raise fail(
                key,
                f"missing required field {key!r} (a regression record has 'context', 'completion' and 'attributes')",
            )
    context, completion = validate_exchange(record["context"], record["completion"], "completion", source, row, row_label)

    values = record["attributes"]
    if not isinstance(values, Mapping):
        raise fail("attributes", f"must be an object mapping attribute names to numbers, got {type_name(values)}")
    allowed = None if attributes is None else set(attributes)
    present: dict[str, float] = {}
    for name, value in values.items():
        where = f"attributes.{name}"
        if value is None:  # not rated: masked out of the loss
            continue
        if allowed is not None and name not in allowed:
            raise fail(
                where,
                f"unknown attribute {name!r}; the configured attributes are {list(attributes)} "
                "(add it to `attributes`, or drop it from the data)",
            )
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise fail(where, f"must be a number, got {type_name(value)} {value!r}")
        number = finite_number(value)
        if number is None:
            raise fail(
                where,
                f"must be a finite number, got {value!r} (leave the attribute out, or null, when it has no value)",
            )
        present[str(name)] = number
    if not present:
        raise fail("attributes", "no attribute value: a record needs at least one (missing ones are masked out)")
    metadata = {k: v for k, v in record.items() if k not in ("context", "completion", "attributes")}
    return {"context": context, "completion": completion, "attributes": present, **metadata}



# --- loading ---


def load_regression_records(
    source: str | Dataset | list[dict[str, Any]],
    *,
    split: str | None = None,
    data_format: str = "regression",
    on_invalid: OnInvalid = "raise",
    attributes: Sequence[str] | None = None,
    hub_config: str | None = None,
    name: str | None = None,
    log: bool = True,
    allow_empty: bool = False,
) -> tuple[list[dict[str, Any]], LoadReport]:
    """Load, convert and validate rows from `source` into normalised regression records.

    Files are read as for rank data (`sources.py`: UTF-8 with an optional byte-order mark; a line that is not UTF-8,
    not JSON or nested too deeply is a bad row naming its line).

    Args:
        source: A local `.jsonl` (errors cite 1-based lines) or `.json` file (errors cite 0-based rows),
            `"sample:<split>"` for the bundled regression splits (`train`, `in_domain`, `harder`; the files
            `trl_rm_env/data/sample/regression_<split>.jsonl`), a `datasets.Dataset` or list of dicts, or else a Hub
            dataset id, optionally with an inline split (`"nvidia/HelpSteer2:validation"`).
        split: Hub split (default "train"); not allowed for local files.
        data_format: "regression" for records as in the module docstring, or "helpsteer2" for nvidia/HelpSteer2
            rows.
        on_invalid: "raise" stops at the first bad row; "skip" drops bad rows and logs their count and reasons once.
        attributes: The allowed attribute names (others are an error); None allows any.
        hub_config: Hub dataset configuration (`name=` of `datasets.load_dataset`).
        name: Name used in errors for an in-memory source (default "<dataset>").
        log: Log the skip counts (once); False when the caller reports them itself (`trl-rm-env validate`).
        allow_empty: Return an empty list instead of raising when no record is valid.

    Returns:
        The valid records and a `LoadReport` (`source`, `kept`, `skipped`, `reasons`).

    Raises:
        DataValidationError: with `on_invalid="raise"`, the first bad row, naming source, line/row and field.
        FileNotFoundError: a missing local file or bundled split.
        ValueError: a bad option, or no valid record at all.
    """
    check_on_invalid(on_invalid)
    if data_format not in REGRESSION_FORMATS:
        raise ValueError(f"unknown regression data_format {data_format!r}; choose one of {list(REGRESSION_FORMATS)}")
    converter = REGRESSION_CONVERTERS.get(data_format)
    source_name, rows, row_label = open_source(source, split, hub_config, name, sample_prefix="regression_")
    report = LoadReport(source_name, tie_rule="none")  # a rating has no ties

    def convert(row: Any, row_num: int) -> dict[str, Any]:
        if converter is not None:
            row = converter(row, source_name, row_num, row_label, attributes=attributes)
        return validate_regression_record(row, source_name, row_num, row_label, attributes)

    hint = None if allow_empty else f"data_format={data_format!r} and the file contents"
    records = collect_records(rows, convert, report, on_invalid, log, hint)
    return records, report


def attribute_names(records: Iterable[Mapping[str, Any]]) -> list[str]:
    """Every attribute name with a value in `records`, in order of first appearance."""
    names: dict[str, None] = {}
    for record in records:
        for key, value in record["attributes"].items():
            if value is not None:
                names.setdefault(key, None)
    return list(names)


def load_regression_dataset(source: str | Dataset | list[dict[str, Any]], **options: Any) -> Dataset:
    """Load `source` as a `datasets.Dataset` of regression records (`context`, `completion`, `attributes`, metadata).

    Takes the arguments of `load_regression_records`, which does the work (declared there once). The `attributes` column holds every attribute
    name (the `attributes` argument, else all names found, in order of first appearance) in every row; a missing
    value is `None`.

    Raises:
        DataValidationError: with `on_invalid="raise"`, the first bad row, naming source, line/row and field.
        FileNotFoundError: a missing local file or bundled split.
        ValueError: a bad option, no valid record, or records that cannot form one table.
    """
    records, report = load_regression_records(source, **options)
    return regression_records_to_dataset(records, report.source, options.get("attributes"))


def regression_records_to_dataset(
    records: list[dict[str, Any]], source: str, attributes: Sequence[str] | None = None
) -> Dataset:
    """Validated regression records -> Dataset whose `attributes` column holds every attribute name (`attributes`,
    else all names found, in order of first appearance) in every row, `None` where a record has no value.

    Raises:
        ValueError: records that cannot form one table (see `loaders.records_to_dataset`).
    """
    names = list(attributes) if attributes is not None else attribute_names(records)
    rows = [{**r, "attributes": {n: r["attributes"].get(n) for n in names}} for r in records]
    return records_to_dataset(rows, source)


def dataset_attributes(dataset: Dataset | Iterable[Mapping[str, Any]]) -> list[str]:
    """The attribute names of a regression dataset (raw HelpSteer2 rows: the HelpSteer2 columns it has).

    Read from the `attributes` column's features when it is a struct (as `load_regression_dataset` makes it), else
    from the values present in the rows.

    Raises:
        ValueError: no attribute can be found.
    """
    features = getattr(dataset, "features", None)
    columns = list(getattr(dataset, "column_names", None) or [])
    if features is not None and isinstance(features.get("attributes"), dict):
        names = list(features["attributes"])
    elif "attributes" in columns or not columns:
        names = attribute_names(r for r in dataset if isinstance(r.get("attributes"), Mapping))
    else:
        names = [c for c in HELPSTEER2_ATTRIBUTES if c in columns]
    if not names:
        raise ValueError(f"cannot find attribute names in a dataset with columns {columns}; set `attributes`")
    return names


def attribute_matrix(dataset: Iterable[Mapping[str, Any]], attributes: Sequence[str]) -> list[list[float]]:
    """The `attributes` values of each record of a regression dataset, NaN where missing. Shape `(N, K)`."""
    rows = []
    for record in dataset:
        values = record["attributes"]
        rows.append([float("nan") if values.get(n) is None else float(values[n]) for n in attributes])
    return rows


def mean_baseline_rmse(
    train: Iterable[Mapping[str, Any]], evals: Mapping[str, Iterable[Mapping[str, Any]]], attributes: Sequence[str]
) -> dict[str, float]:
    """RMSE of always predicting the training mean of each attribute: `{f"{name}_{attr}": rmse}` per set.

    The yardstick of a regression RM: a model that learned nothing beyond the average scores this.
    """
    train_rows = attribute_matrix(train, attributes)
    means = []
    for k in range(len(attributes)):
        values = [row[k] for row in train_rows if not math.isnan(row[k])]
        means.append(sum(values) / len(values) if values else math.nan)
    out = {}
    for name, dataset in evals.items():
        rows = attribute_matrix(dataset, attributes)
        for k, attr in enumerate(attributes):
            errors = [(row[k] - means[k]) ** 2 for row in rows if not math.isnan(row[k])]
            out[f"{name}_{attr}"] = math.sqrt(sum(errors) / len(errors)) if errors else math.nan
    return out


@dataclass
class RegressionDataArguments:
    """Where the training and validation data of a regression reward model come from.

    A *source* is a local `.jsonl`/`.json` file, `sample:<split>` (the regression data bundled with the package:
    `train`, `in_domain`, `harder`), or a Hub dataset id with an optional `:split` (`nvidia/HelpSteer2:validation`).
    The attribute names are `RegressionRewardConfig.attributes` (None: every name found in the training data).

    Args:
        train_data: Source of the training set.
        eval_data: Named validation sets, each `name=source`; every metric is reported per name and attribute
            (`eval_<name>_<attribute>_rmse`, ...). A source without a name is called `eval`.
        data_format: `regression` (records with `context`, `completion`, `attributes`) or `helpsteer2`.
        hub_config: Dataset configuration name for Hub sources.
        build_tiny_model: If the model path does not exist, build a tiny offline regression model there first (one
            output per attribute); for the offline quickstart.
    """

    train_data: str = field(default="sample:train", metadata={"help": "Training data source."})
    eval_data: list[str] = field(
        default_factory=list,
        metadata={"help": "Validation sets as name=source (repeatable), e.g. in_domain=sample:in_domain."},
    )
    data_format: str = field(
        default="regression", metadata={"help": "Format of the sources.", "choices": list(REGRESSION_FORMATS)}
    )
    hub_config: str | None = field(default=None, metadata={"help": "Hub dataset configuration name."})
    build_tiny_model: bool = field(
        default=False,
        metadata={"help": "Build a tiny offline regression model at the model path if it does not exist."},
    )

    def load(
        self, attributes: Sequence[str] | None = None, on_invalid: OnInvalid = "raise"
    ) -> tuple[Dataset, dict[str, Dataset]]:
        """Load the training set and the named validation sets as regression `Dataset`s.

        Args:
            attributes: The attribute names; None takes those of the training set (and holds the validation sets to
                them, so an attribute only a validation set has is an error).
            on_invalid: "raise" or "skip" bad rows.

        Returns:
            `(train, {name: eval_set})`.
        """
        kwargs = dict(data_format=self.data_format, on_invalid=on_invalid, hub_config=self.hub_config)
        names = list(attributes) if attributes is not None else None

        def load(source: str, split: str | None, name: str) -> Dataset:
            nonlocal names
            dataset = load_regression_dataset(source, split=split, name=name, attributes=names, **kwargs)
            if names is None:  # the training set, loaded first, decides the attributes of the validation sets
                names = dataset_attributes(dataset)
            return dataset

        return load_named_sets(self.train_data, self.eval_data, load)
