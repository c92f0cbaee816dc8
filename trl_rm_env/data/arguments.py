"""The data section of the Bradley-Terry recipe's `TrlParser`: where the training and validation sets come from, and
loading them. `RankedDataArguments` here and `trl_rm_env.data.regression.RegressionDataArguments` name their sets the
same way and load them through `trl_rm_env.data.sources.load_named_sets`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from datasets import Dataset

from .converters import ALL_CONVERTERS
from .loaders import load_rank_dataset
from .schema import MAX_COMPLETIONS_PER_RECORD
from .sources import SAMPLE_PREFIX, load_named_sets

RANK_FORMATS = ("rank", *ALL_CONVERTERS)
"""Every `data_format` the rank loader accepts: the rank schema and each converter's name."""


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
            `pandalm`, `hh` (`RANK_FORMATS`), for every source but the bundled `sample:` sets, which are rank records
            (so a config can add `sample=sample:in_domain` beside its Hub sets); `hub_config` likewise.
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
        sample = {**kwargs, "data_format": "rank", "hub_config": None}

        def load(source: str, **where: Any) -> Dataset:  # the bundled samples are rank records, whatever the format
            return load_rank_dataset(source, **where, **(sample if source.startswith(SAMPLE_PREFIX) else kwargs))

        return load_named_sets(self.train_data, self.eval_data, load)
