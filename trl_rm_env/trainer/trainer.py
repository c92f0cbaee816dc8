"""`RankedRewardTrainer`: TRL's `RewardTrainer` for N-way ranked preferences, with exact per-set metrics.

What changes from TRL's `RewardTrainer` (everything else is TRL's):

- Data: rank-schema datasets (`context`, `completions[rank, completion]`, N >= 2, ties allowed) are taken as they
  are; TRL's prompt/chosen/rejected datasets (and tokenized `chosen_ids`/`rejected_ids`) are turned into two-way
  rank records, so existing TRL scripts keep working. Over-length records are dropped or left-truncated.
- Loss: Bradley-Terry over every strictly ordered pair of a record, each completion run through the model once
  (see `loss.py`).
- Evaluation: with `eval_dataset={name: dataset}` every metric carries the set's name (`eval_<name>_accuracy`,
  `_loss`, `_margin`, `_rewards_chosen_mean`, `_rewards_rejected_mean`, `_num_pairs`, `_runtime`) plus
  `eval_total_validation_time`; TRL 1.16 names only the loss, so the other sets' accuracies overwrite each other.
  The metrics are exact over the set (sums over pairs gathered across processes), not means of batch means.
- When training ends, the mean/std of validation rewards go into the model config (`reward_mean`, `reward_std`,
  `reward_stats`), so a reward function can normalise from the checkpoint alone.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections import Counter
from typing import Any

import torch
from datasets import Dataset, IterableDataset
from transformers import PreTrainedTokenizerBase
from trl import RewardTrainer
from trl.trainer.utils import global_then_local_main_first

from ..data.schema import DataValidationError, validate_rank_record, validate_records
from ..scoring.prefix_sharing import (
    SUPPORTED_ATTENTION,
    DataCollatorForSharedPrefix,
    find_score_head,
    shared_prefix_scores,
)
from ..scoring.templating import common_prefix_length
from .collator import DataCollatorForRankedPreference, tokenize_rank_record
from .config import RankedRewardConfig
from .loss import STAT_COLUMNS, ranked_bradley_terry_loss, record_statistics, summarize_statistics

logger = logging.getLogger(__name__)

PROCESSED_COLUMNS = ("completion_ids", "ranks")
SET_METRICS = ("loss", "accuracy", "margin", "rewards_chosen_mean", "rewards_rejected_mean", "num_pairs")


def _column_names(dataset: Dataset | IterableDataset) -> list[str]:
    names = dataset.column_names
    if names is None:  # an IterableDataset whose features are unknown
        names = list(next(iter(dataset)).keys())
    return list(names)


def _binary_rows_to_records(dataset: Dataset, dataset_name: str, on_invalid: str) -> list[dict[str, Any]]:
    """TRL preference rows (prompt/chosen/rejected, explicit or implicit prompt) -> validated two-way rank records."""
    from ..data.converters import binary_to_rank

    records, skipped, reasons = [], 0, Counter()
    for row_num, row in enumerate(dataset):
        try:
            records.append(validate_rank_record(binary_to_rank(row, dataset_name, row_num), dataset_name, row_num, "row"))
        except DataValidationError as err:
            if on_invalid == "raise":
                raise
            skipped += 1
            reasons[err.reason] += 1
    if skipped:
        logger.warning("%s: skipped %d invalid row(s): %s", dataset_name, skipped, dict(reasons))
    return records


class RankedRewardTrainer(RewardTrainer):
    """Train a Bradley-Terry reward model on ranked (N-way, ties allowed) preference data.

    Takes every argument of TRL's [`RewardTrainer`]; the differences are in the module docstring.

    Args:
        model: Model id or path, or a sequence-classification model (`num_labels=1`), or a `PeftModel`.
        args: A [`RankedRewardConfig`] (a plain TRL `RewardConfig` is upgraded with the defaults of the new fields).
        data_collator: Defaults to [`DataCollatorForRankedPreference`].
        train_dataset: Rank-schema records, TRL preference data, or already tokenized data.
        eval_dataset: The same, or a dict `{name: dataset}` for named validation sets.
        processing_class: The tokenizer; loaded from the model when None.
        **kwargs: Everything else `RewardTrainer` accepts (`callbacks`, `optimizers`, `peft_config`, ...).

    Example:
    ```python
    >>> from trl_rm_env import RankedRewardConfig, RankedRewardTrainer, load_rank_dataset
    >>> trainer = RankedRewardTrainer(
    ...     model="Qwen/Qwen3-0.6B",
    ...     args=RankedRewardConfig("qwen3-rm", eval_strategy="steps", eval_steps=100),
    ...     train_dataset=load_rank_dataset("sample:train"),
    ...     eval_dataset={"in_domain": load_rank_dataset("sample:in_domain"),
    ...                   "harder": load_rank_dataset("sample:harder")},
    ... )
    >>> trainer.train()  # logs eval_in_domain_accuracy, eval_harder_accuracy, ...
    ```
    """

    _tag_names = ["trl", "reward-trainer", "trl-rm-env"]

    def __init__(self, model, args: RankedRewardConfig | None = None, data_collator=None, *a, **kwargs):
        if args is not None and not isinstance(args, RankedRewardConfig):
            # Accept a plain RewardConfig: keep its values, add our fields' defaults.
            # (not `to_dict()`: it masks every `*_token` value, such as `eos_token`, with a placeholder)
            ours = RankedRewardConfig.__dataclass_fields__
            values = {f.name: getattr(args, f.name) for f in dataclasses.fields(args) if f.init and f.name in ours}
            args = RankedRewardConfig(**values)
        if args is None:
            name = model if isinstance(model, str) else model.config._name_or_path
            args = RankedRewardConfig(f"{str(name).rstrip('/').split('/')[-1]}-RankedReward")
        self._data_counts: dict[str, Counter] = {}
        self._eval_stats: list[torch.Tensor] = []
        self._last_eval_summary: dict[str, tuple[int, dict[str, float]]] = {}
        self._last_full_evaluation: tuple[int, dict[str, float]] | None = None  # (global step, metrics)
        user_collator = data_collator
        super().__init__(model, args, data_collator, *a, **kwargs)
        self._prefix_sharing = self.args.prefix_sharing and self._check_prefix_sharing()
        if user_collator is None:
            if self._prefix_sharing:
                self.data_collator = DataCollatorForSharedPrefix(
                    pad_token_id=self.processing_class.pad_token_id,
                    pack_max_tokens=self.args.pack_max_tokens,
                    pad_to_multiple_of=self.args.pad_to_multiple_of,
                )
            else:
                self.data_collator = DataCollatorForRankedPreference(
                    pad_token_id=self.processing_class.pad_token_id, pad_to_multiple_of=self.args.pad_to_multiple_of
                )

    def _check_prefix_sharing(self) -> bool:
        """Prefix sharing needs a 4-D mask the attention kernel takes as-is, and a `score` head to read."""
        model = self.accelerator.unwrap_model(self.model)
        attention = getattr(model.config, "_attn_implementation", None)
        if attention not in SUPPORTED_ATTENTION:
            logger.warning(
                "prefix_sharing needs attn_implementation in %s, the model uses %r: using the plain path.",
                SUPPORTED_ATTENTION,
                attention,
            )
            return False
        if find_score_head(model) is None:
            logger.warning("prefix_sharing needs a `score` head (a *ForSequenceClassification): using the plain path.")
            return False
        return True

    # ------------------------------------------------------------------ data
    def _prepare_dataset(
        self,
        dataset: Dataset | IterableDataset,
        processing_class: PreTrainedTokenizerBase,
        args: RankedRewardConfig,
        dataset_name: str,
    ) -> Dataset | IterableDataset:
        columns = _column_names(dataset)
        if all(c in columns for c in PROCESSED_COLUMNS):
            return dataset
        if "chosen_ids" in columns and "rejected_ids" in columns:  # TRL's tokenized format

            def to_ranked(example):
                ids = [example["chosen_ids"], example["rejected_ids"]]
                out = {"completion_ids": ids, "ranks": [0, 1], "context_length": common_prefix_length(*ids)}
                return out

            return dataset.map(to_ranked, remove_columns=["chosen_ids", "rejected_ids"])
        if isinstance(dataset, IterableDataset):
            return self._prepare_iterable(dataset, processing_class, args, dataset_name, columns)

        with global_then_local_main_first():
            if "context" in columns and "completions" in columns:
                records, _ = validate_records(enumerate(dataset), dataset_name, args.on_invalid, row_label="row")
            elif "chosen" in columns:
                records = _binary_rows_to_records(dataset, dataset_name, args.on_invalid)
            else:
                raise ValueError(
                    f"Dataset {dataset_name!r} has columns {columns}: expected rank-schema records "
                    "('context', 'completions'), TRL preference data ('chosen', 'rejected', optional 'prompt'), or "
                    "tokenized data ('chosen_ids', 'rejected_ids')."
                )
            if not records:
                raise ValueError(f"Dataset {dataset_name!r} has no valid record.")
            # Metadata columns of varying types would only get in the way of Arrow: keep what training needs.
            keep = [{"context": r["context"], "completions": r["completions"], "margin": r.get("margin")} for r in records]
            has_margin = any(r["margin"] is not None for r in keep)
            base = Dataset.from_list(keep if has_margin else [{k: r[k] for k in ("context", "completions")} for r in keep])

            def tokenize(example):
                out, status = tokenize_rank_record(example, processing_class, args.max_length, args.truncation)
                if out is None:
                    out = {"completion_ids": [], "ranks": [], "context_length": 0}
                out.setdefault("margin", example.get("margin"))
                out["status"] = status
                return out

            tokenized = self._tokenize_dataset(base, tokenize, args, dataset_name)
            if not has_margin:
                tokenized = tokenized.remove_columns(["margin"])
        return tokenized

    def _tokenize_dataset(self, base: Dataset, tokenize, args: RankedRewardConfig, dataset_name: str) -> Dataset:
        """Map `tokenize` (which adds a `status`: kept, truncated or dropped) over `base`; count and report the
        over-long records, drop the dropped ones, and remove `status`."""
        tokenized = base.map(
            tokenize,
            remove_columns=base.column_names,
            num_proc=args.dataset_num_proc,
            desc=f"Tokenizing {dataset_name} dataset",
        )
        counts = Counter(tokenized["status"])
        self._data_counts[dataset_name] = counts
        if counts["dropped"] or counts["truncated"]:
            logger.warning(
                "%s: %d record(s) over max_length=%s: %d dropped, %d left-truncated (truncation=%r).",
                dataset_name,
                counts["dropped"] + counts["truncated"],
                args.max_length,
                counts["dropped"],
                counts["truncated"],
                args.truncation,
            )
        tokenized = tokenized.filter(lambda s: s != "dropped", input_columns="status").remove_columns("status")
        if len(tokenized) == 0:
            raise ValueError(
                f"Every record of dataset {dataset_name!r} is longer than max_length={args.max_length}; raise "
                "max_length or use truncation='left'."
            )
        return tokenized

    def _prepare_iterable(self, dataset, processing_class, args, dataset_name, columns):
        """Streaming data: validate, convert and tokenize lazily (counts are not available up front)."""
        from ..data.converters import binary_to_rank

        rank_format = "context" in columns and "completions" in columns

        def tokenize(example):
            record = example if rank_format else binary_to_rank(example, dataset_name, None)
            record = validate_rank_record(record, dataset_name, None, "row")
            out, status = tokenize_rank_record(record, processing_class, args.max_length, args.truncation)
            return out or {"completion_ids": [], "ranks": [], "context_length": 0}

        mapped = dataset.map(tokenize, remove_columns=columns)
        return mapped.filter(lambda ranks: len(ranks) > 0, input_columns="ranks")

    def _set_signature_columns_if_needed(self):
        if self._signature_columns is None:
            self._signature_columns = ["completion_ids", "ranks", "margin", "context_length"]

    # ------------------------------------------------------------------ loss
    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        mode = "train" if self.model.training else "eval"
        ranks = inputs.pop("ranks")
        record_index = inputs.pop("record_index")
        margin = inputs.pop("margin", None)
        inputs.pop("context_length", None)
        if "segment_ids" in inputs:  # prefix-shared rows (see prefix_sharing.py)
            dtype = next(p for p in model.parameters() if p.is_floating_point()).dtype
            if dtype not in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
                dtype = torch.float32
            scores, outputs = shared_prefix_scores(model, inputs, dtype)
            token_count = (inputs["record_ids"] >= 0).sum()
        else:
            outputs = model(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"], use_cache=False)
            scores = outputs.logits[:, 0]  # (C,)
            token_count = inputs["attention_mask"].sum()
        pairwise = ranked_bradley_terry_loss(
            scores, ranks, record_index, margin, self.args.center_rewards_coefficient
        )
        num_records = int(record_index.max().item()) + 1
        loss = pairwise.loss
        if mode == "train":
            num_tokens = self.accelerator.gather_for_metrics(token_count).sum().item()
            self._total_train_tokens += num_tokens // self._tp_size
            self._metrics["train"]["num_tokens"] = [self._total_train_tokens]
            with torch.no_grad():
                stats = record_statistics(scores, record_index, pairwise, num_records).sum(0, keepdim=True)
                stats = self.accelerator.gather(stats).sum(0)  # (1, 9) on every process
                summary = summarize_statistics(stats)
                # Processes hold different numbers of completions and collectives need equal shapes (gloo aborts,
                # NCCL may hang): gather each process's (min, max); the mean is exact from the summed statistics.
                local = scores.detach().float()
                extremes = self.accelerator.gather(torch.stack([local.min(), local.max()])[None])  # (P, 2)
                self._metrics["train"]["min_reward"].append(extremes[:, 0].min().item())
                self._metrics["train"]["mean_reward"].append(summary["reward_mean"])
                self._metrics["train"]["max_reward"].append(extremes[:, 1].max().item())
                self._metrics["train"]["accuracy"].append(summary["accuracy"])
                self._metrics["train"]["margin"].append(summary["margin"])
                self._metrics["train"]["num_pairs"].append(summary["num_pairs"])
            if self.accelerator.num_processes > 1 and summary["num_pairs"] > 0:
                # DDP and DeepSpeed average gradients over processes. Weighting each process's mean by its share of
                # the pairs makes the step the mean over every pair of the global batch, as on one process with
                # the same global batch (processes hold different numbers of pairs with ranked records).
                loss = loss * (pairwise.better.numel() * self.accelerator.num_processes / summary["num_pairs"])
        else:
            stats = record_statistics(scores, record_index, pairwise, num_records)  # (B, 9)
            self._eval_stats.append(self.accelerator.gather_for_metrics(stats).cpu())
        return (loss, outputs) if return_outputs else loss

    # ------------------------------------------------------------------ evaluation
    def evaluation_loop(self, dataloader, description, prediction_loss_only=None, ignore_keys=None, metric_key_prefix="eval"):
        self._eval_stats = []
        # Predictions are not needed (the metrics come from the exact pair statistics), so never gather them.
        output = super().evaluation_loop(dataloader, description, True, ignore_keys, metric_key_prefix)
        if self._eval_stats:
            stats = torch.cat(self._eval_stats).sum(0)
            summary = summarize_statistics(stats)
            self._last_eval_summary[metric_key_prefix] = (self.state.global_step, summary)
            for key in SET_METRICS:
                output.metrics[f"{metric_key_prefix}_{key}"] = summary[key]
        self._eval_stats = []
        return output

    def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None):
        with torch.no_grad():
            loss = self.compute_loss(model, self._prepare_inputs(inputs))
        return loss.detach(), None, None

    def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix="eval"):
        sets = eval_dataset if eval_dataset is not None else self.eval_dataset
        if not isinstance(sets, dict):
            metrics = super().evaluate(eval_dataset, ignore_keys, metric_key_prefix)
        else:
            start = time.time()
            metrics = super().evaluate(eval_dataset, ignore_keys, metric_key_prefix)
            key = f"{metric_key_prefix}_total_validation_time"
            metrics[key] = round(time.time() - start, 4)
            self.log({key: metrics[key]})
        if eval_dataset is None and metric_key_prefix == "eval":  # every validation set, as final_evaluation needs
            self._last_full_evaluation = (self.state.global_step, dict(metrics))
        return metrics

    def final_evaluation(self) -> dict[str, float]:
        """The metrics of every validation set for the current weights, evaluating only when needed.

        Reuses the evaluation that already ran at the current step (the last one of `eval_strategy`, or the one
        `train()` runs to store the reward statistics); otherwise evaluates now. The recipes call this after
        training, so that the validation sets are not evaluated twice.
        """
        cached = self._last_full_evaluation
        if cached is not None and cached[0] == self.state.global_step:
            return dict(cached[1])
        return self.evaluate()

    # ------------------------------------------------------------------ reward statistics
    def train(self, *args, **kwargs):
        output = super().train(*args, **kwargs)
        if self.args.load_best_model_at_end and self.state.best_model_checkpoint is not None:
            self._last_full_evaluation = None  # it measured the last weights, not the reloaded best ones
        if self.args.save_reward_stats and self.eval_dataset is not None:
            # With load_best_model_at_end the weights are now the best checkpoint's, not the ones evaluated last.
            reloaded = self.args.load_best_model_at_end and self.state.best_model_checkpoint is not None
            self.store_reward_stats(reevaluate=reloaded)
        return output

    def store_reward_stats(self, reevaluate: bool = False) -> dict[str, dict[str, float]]:
        """Write validation reward mean/std into the model config and return them per set.

        Uses the evaluation of the current step when there is one (unless `reevaluate`), else evaluates once more.
        """
        sets = self.eval_dataset if isinstance(self.eval_dataset, dict) else {"eval": self.eval_dataset}
        prefixes = {name: ("eval" if name == "eval" and not isinstance(self.eval_dataset, dict) else f"eval_{name}") for name in sets}
        missing = [
            p for p in prefixes.values() if self._last_eval_summary.get(p, (None,))[0] != self.state.global_step
        ]
        if missing or reevaluate:
            self.evaluate()
        per_set, total_n, total_sum, total_sq = {}, 0.0, 0.0, 0.0
        for name, prefix in prefixes.items():
            summary = self._last_eval_summary[prefix][1]
            n = summary["num_completions"]
            per_set[name] = {"mean": summary["reward_mean"], "std": summary["reward_std"], "count": n}
            total_n += n
            total_sum += summary["reward_mean"] * n
            total_sq += (summary["reward_std"] ** 2 + summary["reward_mean"] ** 2) * n
        mean = total_sum / max(total_n, 1)
        std = max(total_sq / max(total_n, 1) - mean**2, 0.0) ** 0.5
        config = self.accelerator.unwrap_model(self.model).config
        config.reward_mean, config.reward_std, config.reward_stats = mean, std, per_set
        return per_set


__all__ = ["RankedRewardTrainer", "STAT_COLUMNS"]
