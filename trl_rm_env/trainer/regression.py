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
from typing import Any

import torch
from datasets import Dataset, IterableDataset
from transformers import AutoConfig, AutoTokenizer, PreTrainedTokenizerBase
from trl import RewardConfig
from trl.trainer.utils import global_then_local_main_first

from ..data.regression import dataset_attributes, load_regression_records
from ..heads import attribute_names, is_regression_model, set_regression_labels
from ..metrics import ATTRIBUTE_METRICS, regression_statistics, summarize_regression_statistics
from .classifier import load_classifier, one_label_view
from .collator import DataCollatorForRegression
from .config import RegressionRewardConfig
from .examples import column_names, tokenize_regression_record
from .loss import masked_mse_loss
from .trainer import RankedRewardTrainer

logger = logging.getLogger(__name__)


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
            model = load_classifier(model, args, kwargs.pop("quantization_config", None), self.attributes,
                                    f"for {', '.join(self.attributes)}")  # fmt: skip
        if model.config.num_labels != len(self.attributes):
            raise ValueError(
                f"The model has num_labels={model.config.num_labels} but there are {len(self.attributes)} attributes "
                f"{self.attributes}: build it with num_labels={len(self.attributes)} (or pass its path and it is "
                "loaded with that many)."
            )
        set_regression_labels(model.config, self.attributes, args.attribute_weights)  # what each output means
        self._train_stats: torch.Tensor | None = None
        self._regression_eval_stats: list[torch.Tensor] = []
        self._regression_stats: dict[str, tuple[int, torch.Tensor]] = {}
        with one_label_view(model.config):
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
        if is_regression_model(config):
            return attribute_names(config)
        if isinstance(train_dataset, IterableDataset) or train_dataset is None:
            raise ValueError("Cannot infer the attribute names from this training dataset; set `attributes`.")
        return dataset_attributes(train_dataset)

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
        columns = column_names(dataset)
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

            tokenized = self._examples.tokenize(base, tokenize, args, dataset_name)
        return tokenized

    def _set_signature_columns_if_needed(self):
        if self._signature_columns is None:
            self._signature_columns = ["input_ids", "targets"]

    # ------------------------------------------------------------------ loss
    def _loss_and_scores(self, model, inputs) -> tuple[torch.Tensor, torch.Tensor, object]:
        """`(loss, predictions, outputs)`: the masked MSE, the `(B, K)` predicted attributes and the model's outputs
        (`compute_loss` is the base trainer's, around this)."""
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
        return loss, predictions.detach(), outputs

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
            self._regression_stats[metric_key_prefix] = (self.state.global_step, stats)
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
            p for p in prefixes.values() if self._regression_stats.get(p, (None,))[0] != self.state.global_step
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

        per_set = {name: moments(self._regression_stats[p][1]) for name, p in prefixes.items()}
        pooled = sum(self._regression_stats[p][1] for p in prefixes.values())
        self.accelerator.unwrap_model(self.model).config.attribute_stats = moments(pooled)
        return per_set
