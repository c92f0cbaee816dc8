"""Regression reward models: one output per attribute, trained with a masked MSE (NeMo Aligner's "regression" RM).

A regression RM (SteerLM, HelpSteer2) rates one response on K numeric attributes (helpfulness, correctness, ...);
a weighted sum of the K predictions becomes the scalar reward later (`attribute_weights`). What changes from
[`RankedRewardTrainer`] (everything else, TRL's `RewardTrainer` included, is reused):

- Data: regression records (`context`, `completion`, `attributes`; see `trl_rm_env/data/regression.py`) or raw
  nvidia/HelpSteer2 rows, validated with the same `on_invalid` policy and over-length handling (`truncation`).
- Model: `num_labels = K`; the attribute names go into the config (`id2label`, `label2id`,
  `reward_model_type = "regression"`, `problem_type = "regression"`), so the checkpoint says what each output is.
  A model given as a path is loaded with K labels (TRL would force one).
- Loss: mean squared error over the attribute values present (missing ones are masked out).
- Metrics: per validation set and attribute, exact over the whole set (sums gathered across processes):
  `eval_<name>_<attr>_rmse`, `_mae`, `_pearson`, plus `eval_<name>_loss`; in training `loss` and `<attr>_rmse`.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections import Counter
from collections.abc import Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from datasets import Dataset, IterableDataset
from transformers import AutoConfig, AutoModelForSequenceClassification, AutoTokenizer, PreTrainedTokenizerBase
from transformers.data.data_collator import DataCollatorMixin
from trl import RewardConfig
from trl.trainer.reward_trainer import suppress_seqcls_warning
from trl.trainer.utils import create_model_from_path, global_then_local_main_first, pad

from ..data.regression import dataset_attributes, load_regression_records
from .collator import tokenize_rank_record
from .config import RankedRewardConfig
from .trainer import RankedRewardTrainer, _column_names

logger = logging.getLogger(__name__)

REWARD_MODEL_TYPE = "regression"
ATTRIBUTE_METRICS = ("rmse", "mae", "pearson")
# Per attribute, summed over examples whose value is present (x: prediction, y: target).
STAT_COLUMNS = ("n", "sum_err2", "sum_abs", "sum_x", "sum_y", "sum_xy", "sum_x2", "sum_y2")


# --------------------------------------------------------------------------------------------------------- config


@dataclass
class RegressionRewardConfig(RankedRewardConfig):
    r"""
    Configuration for [`RegressionRewardTrainer`]. Everything of [`RankedRewardConfig`] (`truncation`, `on_invalid`,
    ...) and TRL's `RewardConfig` holds, except `center_rewards_coefficient` (a Bradley-Terry term) and
    `prefix_sharing` (a regression record has a single completion), which must stay unset. These fields are added:

    Parameters:
        attributes (`list[str]` or `None`, *optional*, defaults to `None`):
            The attributes the model predicts, in output order (`num_labels = len(attributes)`). None takes them from
            the model when it is already a regression RM (its `id2label`), else from the training data (every name
            with a value, in order of first appearance). Data with any other attribute is an error.
        attribute_weights (`list[float]` or `None`, *optional*, defaults to `None`):
            Default weights of the reward, `reward = sum_a w_a * prediction_a`, one per attribute in the order of
            `attributes`. Stored in the saved model config as `attribute_weights` (`{name: weight}`), for a reward
            function to use when it is given no weights of its own. Training does not use them.
    """

    attributes: list[str] | None = field(
        default=None,
        metadata={"help": "Attributes to predict, in output order; default: those of the model or the training data."},
    )
    attribute_weights: list[float] | None = field(
        default=None,
        metadata={
            "help": "Default reward weights, one per attribute; saved in the model config (not used in training)."
        },
    )

    def __post_init__(self):
        if self.attributes is not None:
            if not self.attributes or len(set(self.attributes)) != len(self.attributes):
                raise ValueError(f"attributes must be a non-empty list of distinct names, got {self.attributes}.")
            if self.attribute_weights is not None and len(self.attribute_weights) != len(self.attributes):
                raise ValueError(
                    f"attribute_weights has {len(self.attribute_weights)} values for {len(self.attributes)} "
                    f"attributes {self.attributes}; give one weight per attribute, in the same order."
                )
        if self.center_rewards_coefficient is not None:
            raise ValueError(
                f"center_rewards_coefficient={self.center_rewards_coefficient} is a Bradley-Terry term with no "
                "meaning for a regression reward model; leave it unset."
            )
        if str(getattr(self, "prefix_sharing", None)).lower() == "true":
            raise ValueError(
                "prefix_sharing shares a context between the completions of a ranked record; a regression record has "
                "one completion, so there is nothing to share: leave it off."
            )
        super().__post_init__()
        self.prefix_sharing = False  # "auto" (the default) has nothing to share here


# ----------------------------------------------------------------------------------------------- loss and metrics


def masked_mse_loss(predictions: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean squared error over the attribute values present (NeMo Aligner's regression RM loss).

        loss = sum_{i,a} m_ia (p_ia - y_ia)^2 / sum_{i,a} m_ia,    m_ia = 1 if y_ia is present (not NaN), else 0

    Args:
        predictions: `(B, K)` predicted attribute values.
        targets: `(B, K)` rated values, NaN where an attribute is missing.

    Returns:
        The scalar loss (0 with a gradient when nothing is present).
    """
    mask = ~torch.isnan(targets)  # (B, K)
    err = torch.where(mask, predictions - torch.nan_to_num(targets).to(predictions.dtype), 0.0)
    return (err**2).sum() / mask.sum().clamp(min=1)


def regression_statistics(predictions: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Per-example, per-attribute sums (columns `STAT_COLUMNS`), shape `(B, K, 8)`, float64, zero where missing.

    Summing over all examples of a set gives exact RMSE, MAE and Pearson correlation per attribute, whatever the
    batch sizes or the number of processes.
    """
    x, y = predictions.detach().double(), targets.double()  # (B, K)
    mask = ~torch.isnan(y)
    x, y = torch.where(mask, x, 0.0), torch.nan_to_num(y)
    err = x - y
    columns = [mask.double(), err**2, err.abs(), x, y, x * y, x**2, y**2]
    return torch.stack(columns, dim=-1)


def summarize_regression_statistics(stats: torch.Tensor, attributes: Sequence[str]) -> dict[str, float]:
    """Set-level metrics from summed `regression_statistics` (`(K, 8)`, or `(B, K, 8)` summed here).

    Returns:
        `loss` (MSE over every present value) and, per attribute, `<attr>_rmse`, `<attr>_mae`, `<attr>_pearson`
        (NaN when the attribute has no value, or Pearson's r when predictions or targets are constant).
    """
    if stats.dim() == 3:
        stats = stats.sum(0)
    stats = stats.double().cpu()
    total = stats[:, 0].sum().item()
    out = {"loss": stats[:, 1].sum().item() / total if total else math.nan}
    for name, row in zip(attributes, stats.tolist()):
        n, err2, abs_err, sx, sy, sxy, sx2, sy2 = row
        if n == 0:
            out.update({f"{name}_{metric}": math.nan for metric in ATTRIBUTE_METRICS})
            continue
        var_x, var_y = n * sx2 - sx * sx, n * sy2 - sy * sy
        denominator = math.sqrt(var_x * var_y) if var_x > 0 and var_y > 0 else 0.0
        out[f"{name}_rmse"] = math.sqrt(err2 / n)
        out[f"{name}_mae"] = abs_err / n
        out[f"{name}_pearson"] = (n * sxy - sx * sy) / denominator if denominator else math.nan
    return out


def format_regression_table(
    metrics: Mapping[str, float],
    set_names: Sequence[str],
    attributes: Sequence[str],
    baseline: Mapping[str, float] | None = None,
    prefix: str = "eval",
) -> str:
    """A text table of the per-set, per-attribute metrics.

    With `baseline` (from `trl_rm_env.data.regression.mean_baseline_rmse`) it also shows the RMSE of predicting the
    training mean and the relative gain `1 - rmse / mean_rmse`.
    """
    header = ["set", "attribute", "rmse", "mae", "pearson"] + (["mean_rmse", "gain"] if baseline else [])
    rows = []
    for name in set_names:
        for attr in attributes:
            values = [metrics.get(f"{prefix}_{name}_{attr}_{m}", math.nan) for m in ATTRIBUTE_METRICS]
            if baseline:
                reference = baseline.get(f"{name}_{attr}", math.nan)
                values += [reference, 1 - values[0] / reference if reference else math.nan]
            rows.append([name, attr, *(f"{v:.4f}" for v in values)])
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)) for r in [header, *rows]]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def parse_attribute_weights(entries: Sequence[str], option: str = "attribute_weights") -> dict[str, float]:
    """`["helpfulness=1", "verbosity=-0.2"]` (command-line form) -> `{"helpfulness": 1.0, "verbosity": -0.2}`.

    Raises:
        ValueError: an entry that is not `name=<number>` or a name given twice; the message names `option`.
    """
    weights: dict[str, float] = {}
    for entry in entries:
        name, sep, value = str(entry).partition("=")
        name = name.strip()
        try:
            weight = float(value)
        except ValueError:
            weight = None
        if not sep or not name or weight is None:
            raise ValueError(f"{option} entry {entry!r} must be name=<number>, e.g. helpfulness=1.0")
        if name in weights:
            raise ValueError(f"{option} names {name!r} twice")
        weights[name] = weight
    return weights


def regression_reward_weights(
    config: Any, attribute_weights: Mapping[str, float] | Sequence[float] | None = None
) -> tuple[list[str], list[float]] | None:
    """The attribute names of a regression RM's config and the weights that turn its outputs into one reward.

    For a reward function: `reward = sum_a weights[a] * output[a]`. Weights come from `attribute_weights` (a dict by
    name, where unnamed attributes weigh 0, or a list in output order), else from the checkpoint's own
    `attribute_weights`; a single-attribute model needs none.

    Args:
        config: The model config (`reward_model_type`, `id2label`, optional `attribute_weights`).
        attribute_weights: Weights given by the caller, or None.

    Returns:
        `(names, weights)` in output order, or None when the config is not a regression RM and no weights are given.

    Raises:
        ValueError: weights for a model that is not a regression RM, an unknown attribute name, a list of the wrong
            length, or no weights for a model with several attributes.
    """
    if getattr(config, "reward_model_type", None) != REWARD_MODEL_TYPE:
        if attribute_weights is not None:
            raise ValueError(
                "attribute_weights applies to regression reward models (config.reward_model_type == 'regression', "
                f"as RegressionRewardTrainer saves them); this model has reward_model_type="
                f"{getattr(config, 'reward_model_type', None)!r} and {config.num_labels} output(s)."
            )
        return None
    names = [config.id2label[i] for i in range(config.num_labels)]
    weights = attribute_weights if attribute_weights is not None else getattr(config, "attribute_weights", None)
    if weights is None:
        if len(names) == 1:
            return names, [1.0]
        raise ValueError(
            f"This regression reward model predicts {names}: give attribute_weights, a dict by name (unnamed ones "
            f"weigh 0) or a list in this order, e.g. {{{names[0]!r}: 1.0}}."
        )
    if isinstance(weights, Mapping):
        unknown = sorted(set(weights) - set(names))
        if unknown:
            raise ValueError(
                f"attribute_weights names {unknown}, which the model does not predict; it predicts {names}."
            )
        return names, [float(weights.get(name, 0.0)) for name in names]
    weights = [float(w) for w in weights]
    if len(weights) != len(names):
        raise ValueError(f"attribute_weights has {len(weights)} values for the {len(names)} attributes {names}.")
    return names, weights


# ---------------------------------------------------------------------------------------------- tokens and batches


def tokenize_regression_record(
    record: Mapping[str, Any],
    tokenizer: PreTrainedTokenizerBase,
    attributes: Sequence[str],
    max_length: int | None = None,
    truncation: str = "drop",
) -> tuple[dict[str, Any] | None, str]:
    """Encode `context + completion` (the rank trainer's encoding, see `tokenize_rank_record`) and the targets.

    Returns:
        `({"input_ids": [int], "targets": [float] (K, NaN where missing)}, status)`, or `(None, "dropped")` when
        over `max_length`; status is "ok", "truncated" or "dropped".
    """
    one = {"context": record["context"], "completions": [{"rank": 0, "completion": record["completion"]}]}
    example, status = tokenize_rank_record(one, tokenizer, max_length, truncation)
    if example is None:
        return None, status
    values = record["attributes"]
    targets = [math.nan if values.get(name) is None else float(values[name]) for name in attributes]
    return {"input_ids": example["completion_ids"][0], "targets": targets}, status


@dataclass
class DataCollatorForRegression(DataCollatorMixin):
    """Pad a batch of regression examples (`input_ids`, `targets`).

    The batch holds `input_ids`, `attention_mask`: `(B, L)` right-padded, and `targets`: `(B, K)` float32, NaN
    where an attribute is missing.

    Args:
        pad_token_id: Token id used for padding.
        pad_to_multiple_of: If set, pad the length to a multiple of this value.
        return_tensors: Only `"pt"` is supported.
    """

    pad_token_id: int
    pad_to_multiple_of: int | None = None
    return_tensors: str = "pt"

    def torch_call(self, examples: list[dict[str, Any]]) -> dict[str, Any]:
        input_ids = [torch.tensor(example["input_ids"]) for example in examples]
        attention_mask = [torch.ones_like(ids) for ids in input_ids]
        return {
            "input_ids": pad(
                input_ids, self.pad_token_id, padding_side="right", pad_to_multiple_of=self.pad_to_multiple_of
            ),
            "attention_mask": pad(attention_mask, 0, padding_side="right", pad_to_multiple_of=self.pad_to_multiple_of),
            "targets": torch.tensor([example["targets"] for example in examples], dtype=torch.float32),
        }


# -------------------------------------------------------------------------------------------------------- trainer


@contextmanager
def _one_label_view(config):
    """Show TRL's `RewardTrainer.__init__` a one-label config (it refuses `num_labels != 1`); restore it after."""
    id2label, label2id = config.id2label, config.label2id
    config.id2label, config.label2id = {0: "LABEL_0"}, {"LABEL_0": 0}
    try:
        yield
    finally:
        config.id2label, config.label2id = id2label, label2id


def _regression_args(args: RewardConfig | None, model: Any) -> RegressionRewardConfig:
    """`args` as a `RegressionRewardConfig` (a TRL `RewardConfig` or `RankedRewardConfig` keeps its values)."""
    if args is None:
        name = model if isinstance(model, str) else model.config._name_or_path
        return RegressionRewardConfig(f"{str(name).rstrip('/').split('/')[-1]}-RegressionReward")
    if isinstance(args, RegressionRewardConfig):
        return args
    # (not `to_dict()`: it masks every `*_token` value, such as `eos_token`, with a placeholder)
    ours = RegressionRewardConfig.__dataclass_fields__
    return RegressionRewardConfig(
        **{f.name: getattr(args, f.name) for f in dataclasses.fields(args) if f.init and f.name in ours}
    )


@contextmanager
def _transformers_log_level(level: int | None):
    """Raise transformers' log level for a block (None: leave it)."""
    from transformers.utils import logging as hf_logging

    if level is None:
        yield
        return
    before = hf_logging.get_verbosity()
    hf_logging.set_verbosity(max(level, before))
    try:
        yield
    finally:
        hf_logging.set_verbosity(before)


class RegressionRewardTrainer(RankedRewardTrainer):
    """Train a regression reward model: one output per attribute, masked MSE, exact per-set, per-attribute metrics.

    Takes every argument of [`RankedRewardTrainer`] (and so of TRL's `RewardTrainer`); the differences are in the
    module docstring.

    Args:
        model: Model id or path (loaded as `AutoModelForSequenceClassification` with one label per attribute), a
            sequence-classification model with `num_labels == len(attributes)`, or a `PeftModel` of one.
        args: A [`RegressionRewardConfig`] (a TRL `RewardConfig` is upgraded with the defaults of the new fields).
        data_collator: Defaults to [`DataCollatorForRegression`].
        train_dataset: Regression records (`context`, `completion`, `attributes`), raw nvidia/HelpSteer2 rows
            (`prompt`, `response`, attribute columns), or tokenized data (`input_ids`, `targets`).
        eval_dataset: The same, or a dict `{name: dataset}` for named validation sets.
        processing_class: The tokenizer; loaded from the model when None.
        **kwargs: Everything else `RewardTrainer` accepts (`callbacks`, `optimizers`, `peft_config`,
            `quantization_config`, ...).

    Raises:
        ValueError: no attribute names can be found, or the model's `num_labels` is not the number of attributes.
        TypeError: a streaming (`IterableDataset`) dataset.

    Example:
    ```python
    >>> from trl_rm_env.data.regression import load_regression_dataset
    >>> from trl_rm_env.trainer.regression import RegressionRewardConfig, RegressionRewardTrainer
    >>> trainer = RegressionRewardTrainer(
    ...     model="Qwen/Qwen3-0.6B",
    ...     args=RegressionRewardConfig("qwen3-regression-rm", eval_strategy="steps", eval_steps=100),
    ...     train_dataset=load_regression_dataset("nvidia/HelpSteer2", data_format="helpsteer2"),
    ...     eval_dataset={"hs2": load_regression_dataset("nvidia/HelpSteer2:validation", data_format="helpsteer2")},
    ... )
    >>> trainer.train()  # logs eval_hs2_helpfulness_rmse, eval_hs2_helpfulness_pearson, ...
    ```
    """

    _tag_names = ["trl", "reward-trainer", "trl-rm-env", "regression-reward-model"]

    def __init__(
        self,
        model,
        args: RewardConfig | None = None,
        data_collator=None,
        train_dataset: Dataset | None = None,
        eval_dataset: Dataset | dict[str, Dataset] | None = None,
        processing_class: PreTrainedTokenizerBase | None = None,
        **kwargs,
    ):
        args = _regression_args(args, model)
        self.attributes = self._resolve_attributes(model, args, train_dataset)
        args.attributes = list(self.attributes)
        if args.attribute_weights is not None and len(args.attribute_weights) != len(self.attributes):
            raise ValueError(
                f"attribute_weights has {len(args.attribute_weights)} values for the {len(self.attributes)} "
                f"attributes {self.attributes}; give one weight per attribute, in the same order."
            )
        if isinstance(model, str):
            if processing_class is None:
                init_kwargs = args.model_init_kwargs or {}
                processing_class = AutoTokenizer.from_pretrained(
                    model, revision=init_kwargs.get("revision"), trust_remote_code=args.trust_remote_code
                )
            model = self._load_model(model, args, kwargs.pop("quantization_config", None))
        if model.config.num_labels != len(self.attributes):
            raise ValueError(
                f"The model has num_labels={model.config.num_labels} but there are {len(self.attributes)} attributes "
                f"{self.attributes}: build it with num_labels={len(self.attributes)} (or pass its path and it is "
                "loaded with that many)."
            )
        self._set_label_config(model.config, args.attribute_weights)
        self._train_stats: torch.Tensor | None = None
        self._regression_eval_stats: list[torch.Tensor] = []
        self._last_regression_stats: dict[str, tuple[int, torch.Tensor]] = {}
        with _one_label_view(model.config):
            super().__init__(model, args, data_collator, train_dataset, eval_dataset, processing_class, **kwargs)
        if data_collator is None:
            self.data_collator = DataCollatorForRegression(
                pad_token_id=self.processing_class.pad_token_id, pad_to_multiple_of=self.args.pad_to_multiple_of
            )
        if isinstance(self.eval_dataset, dict):
            self._check_metric_names(list(self.eval_dataset))

    # ------------------------------------------------------------------ model
    @staticmethod
    def _resolve_attributes(model: Any, args: RegressionRewardConfig, train_dataset: Any) -> list[str]:
        """`args.attributes`, else the names of a regression RM given as `model`, else those of the training data."""
        if args.attributes is not None:
            return list(args.attributes)
        if isinstance(model, str):
            init_kwargs = args.model_init_kwargs or {}
            config = AutoConfig.from_pretrained(
                model, revision=init_kwargs.get("revision"), trust_remote_code=args.trust_remote_code
            )
        else:
            config = model.config
        if getattr(config, "reward_model_type", None) == REWARD_MODEL_TYPE:
            return [config.id2label[i] for i in range(config.num_labels)]
        if isinstance(train_dataset, IterableDataset) or train_dataset is None:
            raise ValueError("Cannot infer the attribute names from this training dataset; set `attributes`.")
        return dataset_attributes(train_dataset)

    def _load_model(self, path: str, args: RegressionRewardConfig, quantization_config: Any) -> Any:
        """Load `path` as in TRL's `RewardTrainer`, but with one output per attribute (TRL forces `num_labels=1`)."""
        from transformers import set_seed

        set_seed(args.seed)  # the new score head is random: seed it as TRL does
        init_kwargs = dict(args.model_init_kwargs or {})
        if quantization_config is not None:
            init_kwargs["quantization_config"] = quantization_config
        if args.distributed_state.distributed_type in ["MULTI_GPU", "DEEPSPEED"]:
            init_kwargs["device_map"] = None  # distributed training requires device_map=None ("auto" fails)
        init_kwargs.update(
            num_labels=len(self.attributes),
            id2label=dict(enumerate(self.attributes)),
            label2id={name: i for i, name in enumerate(self.attributes)},
        )
        init_kwargs.setdefault("trust_remote_code", args.trust_remote_code)
        new_head = self._head_size_mismatch(path, init_kwargs)
        if new_head is not None:
            # A trained classifier with another head size (a one-label Bradley-Terry RM, Skywork-Reward-V2): keep the
            # body, build a new head. transformers would refuse (`ignore_mismatched_sizes`) with a long report.
            init_kwargs["ignore_mismatched_sizes"] = True
            logger.warning(
                "%s has a %d-output score head; building a new %d-output head for %s (random, seeded).",
                path, new_head, len(self.attributes), ", ".join(self.attributes),
            )
        with suppress_seqcls_warning(), _transformers_log_level(logging.ERROR if new_head is not None else None):
            model = create_model_from_path(path, AutoModelForSequenceClassification, **init_kwargs)
        args.model_init_kwargs = None  # used here; TRL would only warn that they are ignored for a loaded model
        return model

    def _head_size_mismatch(self, path: str, init_kwargs: dict) -> int | None:
        """The checkpoint's head size when `path` is a sequence classifier with another number of outputs, else None."""
        config = AutoConfig.from_pretrained(
            path, revision=init_kwargs.get("revision"), trust_remote_code=init_kwargs.get("trust_remote_code", False)
        )
        classifier = any(a.endswith("ForSequenceClassification") for a in getattr(config, "architectures", None) or [])
        if classifier and config.num_labels != len(self.attributes):
            return config.num_labels
        return None

    def _set_label_config(self, config, weights: Sequence[float] | None) -> None:
        """Write what each output means (and the default reward weights) into the model config, for the checkpoint."""
        config.id2label = dict(enumerate(self.attributes))
        config.label2id = {name: i for i, name in enumerate(self.attributes)}
        config.problem_type = "regression"
        config.reward_model_type = REWARD_MODEL_TYPE
        if weights is not None:
            config.attribute_weights = dict(zip(self.attributes, map(float, weights)))

    def _check_metric_names(self, set_names: list[str]) -> None:
        names = [f"eval_{s}_loss" for s in set_names]
        names += [f"eval_{s}_{a}_{m}" for s in set_names for a in self.attributes for m in ATTRIBUTE_METRICS]
        duplicates = sorted(name for name, count in Counter(names).items() if count > 1)
        if duplicates:
            raise ValueError(
                f"Validation set names {set_names} and attributes {self.attributes} give the same metric name "
                f"{duplicates}; rename a set."
            )

    # ------------------------------------------------------------------ data
    def _prepare_dataset(
        self,
        dataset: Dataset | IterableDataset,
        processing_class: PreTrainedTokenizerBase,
        args: RegressionRewardConfig,
        dataset_name: str,
    ) -> Dataset:
        if isinstance(dataset, IterableDataset):
            raise TypeError(
                f"Dataset {dataset_name!r} is an IterableDataset; RegressionRewardTrainer needs a `datasets.Dataset` "
                "(HelpSteer2 has 21k rows: load it without streaming)."
            )
        columns = _column_names(dataset)
        if "input_ids" in columns and "targets" in columns:
            return dataset
        if "completion" in columns and "attributes" in columns:
            data_format = "regression"
        elif "prompt" in columns and "response" in columns:
            data_format = "helpsteer2"
        else:
            raise ValueError(
                f"Dataset {dataset_name!r} has columns {columns}: expected regression records ('context', "
                "'completion', 'attributes'), nvidia/HelpSteer2 rows ('prompt', 'response', attribute columns), or "
                "tokenized data ('input_ids', 'targets')."
            )
        with global_then_local_main_first():
            records, _ = load_regression_records(
                dataset,
                data_format=data_format,
                on_invalid=args.on_invalid,
                attributes=self.attributes,
                name=dataset_name,
            )
            base = Dataset.from_list(
                [
                    {"context": r["context"], "completion": r["completion"], "attributes": r["attributes"]}
                    for r in records
                ]
            )

            def tokenize(example):
                out, status = tokenize_regression_record(
                    example, processing_class, self.attributes, args.max_length, args.truncation
                )
                out = out or {"input_ids": [], "targets": [math.nan] * len(self.attributes)}
                return {**out, "status": status}

            tokenized = self._tokenize_dataset(base, tokenize, args, dataset_name)
        return tokenized

    def _set_signature_columns_if_needed(self):
        if self._signature_columns is None:
            self._signature_columns = ["input_ids", "targets"]

    # ------------------------------------------------------------------ loss
    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        targets = inputs.pop("targets")  # (B, K), NaN where missing
        outputs = model(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"], use_cache=False)
        predictions = outputs.logits.float()  # (B, K)
        loss = masked_mse_loss(predictions, targets)
        # Per-example sums, gathered across processes (duplicated padding samples of the last batch are dropped).
        stats = self.accelerator.gather_for_metrics(regression_statistics(predictions, targets)).sum(0).cpu()
        if self.model.training:
            num_tokens = self.accelerator.gather_for_metrics(inputs["attention_mask"].sum()).sum().item()
            self._total_train_tokens += num_tokens // self._tp_size
            self._metrics["train"]["num_tokens"] = [self._total_train_tokens]
            self._train_stats = stats if self._train_stats is None else self._train_stats + stats
            present = stats[:, 0].sum().item()  # rated values in the global batch
            if self.accelerator.num_processes > 1 and present > 0:
                # Gradients are averaged over processes: weight each process's MSE by its share of the rated values,
                # so a step is the MSE over the global batch (as on one process with the same global batch).
                local = (~torch.isnan(targets)).sum().item()
                loss = loss * (local * self.accelerator.num_processes / present)
        else:
            self._regression_eval_stats.append(stats)
        return (loss, outputs) if return_outputs else loss

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        if self.model.training and self._train_stats is not None:
            # Exact over the logging window: sums since the last log.
            summary = summarize_regression_statistics(self._train_stats, self.attributes)
            for name in self.attributes:
                self._metrics["train"][f"{name}_rmse"] = [summary[f"{name}_rmse"]]
            self._train_stats = None
        super().log(logs, start_time)

    # ------------------------------------------------------------------ evaluation
    def evaluation_loop(
        self, dataloader, description, prediction_loss_only=None, ignore_keys=None, metric_key_prefix="eval"
    ):
        self._regression_eval_stats = []
        output = super().evaluation_loop(dataloader, description, True, ignore_keys, metric_key_prefix)
        if self._regression_eval_stats:
            stats = torch.stack(self._regression_eval_stats).sum(0)  # (K, 8) over the whole set
            self._last_regression_stats[metric_key_prefix] = (self.state.global_step, stats)
            for key, value in summarize_regression_statistics(stats, self.attributes).items():
                output.metrics[f"{metric_key_prefix}_{key}"] = value
        self._regression_eval_stats = []
        return output

    def store_reward_stats(self, reevaluate: bool = False) -> dict[str, dict[str, dict[str, float]]]:
        """Write the mean/std of each attribute's predictions on the validation sets into the model config.

        `config.attribute_stats = {attr: {"mean", "std", "count"}}` pools every validation set (over the examples
        rated on that attribute). Uses the evaluation of the current step when there is one (unless `reevaluate`).

        Returns:
            The same statistics per set: `{set: {attr: {"mean", "std", "count"}}}`.
        """
        sets = self.eval_dataset if isinstance(self.eval_dataset, dict) else {"eval": self.eval_dataset}
        prefixes = {name: "eval" if not isinstance(self.eval_dataset, dict) else f"eval_{name}" for name in sets}
        stale = [
            p for p in prefixes.values() if self._last_regression_stats.get(p, (None,))[0] != self.state.global_step
        ]
        if stale or reevaluate:
            self.evaluate()

        def moments(stats: torch.Tensor) -> dict[str, dict[str, float]]:
            out = {}
            for name, (n, _, _, sx, _, _, sx2, _) in zip(self.attributes, stats.tolist()):
                mean = sx / n if n else math.nan
                out[name] = {
                    "mean": mean,
                    "std": max(sx2 / n - mean**2, 0.0) ** 0.5 if n else math.nan,
                    "count": int(n),
                }
            return out

        per_set = {name: moments(self._last_regression_stats[p][1]) for name, p in prefixes.items()}
        pooled = sum(self._last_regression_stats[p][1] for p in prefixes.values())
        self.accelerator.unwrap_model(self.model).config.attribute_stats = moments(pooled)
        return per_set


__all__ = [
    "DataCollatorForRegression",
    "RegressionRewardConfig",
    "RegressionRewardTrainer",
    "format_regression_table",
    "masked_mse_loss",
    "regression_reward_weights",
    "regression_statistics",
    "summarize_regression_statistics",
    "tokenize_regression_record",
]
