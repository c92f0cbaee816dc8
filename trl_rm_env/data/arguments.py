"""The data sections of the training recipes' `TrlParser`: where the training and validation sets come from, and
loading them. `RankedDataArguments` (rank-schema and converted preference data) and `RegressionDataArguments`
(regression records) name their sets the same way and load them through `load_named_sets`."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from datasets import Dataset

from .converters import ALL_CONVERTERS
from .loaders import load_rank_dataset
from .regression import REGRESSION_FORMATS, dataset_attributes, load_regression_dataset
from .schema import MAX_COMPLETIONS_PER_RECORD, OnInvalid
from .sources import parse_data_spec

RANK_FORMATS = ("rank", *ALL_CONVERTERS)
"""Every `data_format` the rank loader accepts: the rank schema and each converter's name."""


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


@dataclass
class RankedDataArguments:
    """Where the training and validation data come from.

    A *source* is a local `.jsonl`/`.json` file, `sample:<split>` (the data bundled with the package: `train`,
    `in_domain`, `harder`), or a Hub dataset id with an optional `:split` (`nvidia/HelpSteer3:validation`).

    Args:
        train_data: Source of the training set.
        eval_data: Named validation sets, each `name=source` (e.g. `in_domain=sample:in_domain`); every metric is
            reported per name (`eval_<name>_accuracy`, ...). A source without a name is called `eval`.
        data_format: `rank` (the rank schema), `binary` (prompt/chosen/rejected), `helpsteer3`, `tulu3`, `llmbar`,
            `pandalm`, `hh` (`RANK_FORMATS`).
        prompt_key: Prompt column of `binary` data.
        chosen_key: Chosen column of `binary` data.
        rejected_key: Rejected column of `binary` data.
        hub_config: Dataset configuration name for Hub sources (e.g. `preference` for HelpSteer3).
        build_tiny_model: If the model path, a folder named `reward_model`, does not exist, build the tiny offline
            models in its parent folder first (`trl-rm-env make-tiny`); for the offline quickstart. Any other missing
            path is an error (a typo), never a freshly built model.
    """

    train_data: str = field(default="sample:train", metadata={"help": "Training data source."})
    eval_data: list[str] = field(
        default_factory=list,
        metadata={"help": "Validation sets as name=source (repeatable), e.g. in_domain=sample:in_domain."},
    )
    data_format: str = field(
        default="rank",
        metadata={"help": "Format of the sources.", "choices": list(RANK_FORMATS)},
    )
    prompt_key: str = field(default="prompt", metadata={"help": "Prompt column of binary data."})
    chosen_key: str = field(default="chosen", metadata={"help": "Chosen column of binary data."})
    rejected_key: str = field(default="rejected", metadata={"help": "Rejected column of binary data."})
    hub_config: str | None = field(default=None, metadata={"help": "Hub dataset configuration name."})
    build_tiny_model: bool = field(
        default=False,
        metadata={"help": "Build the tiny offline models at the model path if it does not exist (quickstart)."},
    )

    def load(
        self, on_invalid: str = "raise", max_completions: int | None = MAX_COMPLETIONS_PER_RECORD
    ) -> tuple[Dataset, dict[str, Dataset]]:
        """Load the training set and the named validation sets as rank-schema `Dataset`s.

        `max_completions` (the trainer config's, `RankedRewardConfig.max_completions`; None: no limit): a record with
        more completions is invalid (see `docs/data_format.md`).
        """
        kwargs = dict(
            data_format=self.data_format,
            on_invalid=on_invalid,
            prompt_key=self.prompt_key,
            chosen_key=self.chosen_key,
            rejected_key=self.rejected_key,
            hub_config=self.hub_config,
            max_completions=max_completions,
        )
        return load_named_sets(self.train_data, self.eval_data, lambda *a, **kw: load_rank_dataset(*a, **kw, **kwargs))


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
