"""`RankedRewardTrainer`: TRL's `RewardTrainer` for N-way ranked preferences, with exact per-set metrics.

What changes from TRL's `RewardTrainer` (everything else is TRL's):

- Data: rank-schema datasets (`context`, `completions[rank, completion]`, N >= 2, ties allowed) are taken as they
  are and become `completion_ids`/`ranks`/`context_length` examples. TRL-shaped data is processed as TRL does it:
  preference rows (`chosen`/`rejected`, explicit or implicit prompt, text or conversations, with `tools` and
  `chat_template_kwargs`) get TRL's `chosen_ids`/`rejected_ids` columns (the original columns are kept, as in TRL)
  holding the ids TRL produces; tokenized `chosen_ids`/`rejected_ids` are used as they are; legacy
  `chosen_input_ids`/`rejected_input_ids` are renamed with TRL's `FutureWarning`. Over-length records are dropped
  (TRL's behaviour) or left-truncated. A record without a `margin` in a dataset that has the column gets margin 0.
- Loss: Bradley-Terry over every strictly ordered pair of a record, each completion run through the model once
  (see `loss.py`).
- Evaluation: with `eval_dataset={name: dataset}` every metric carries the set's name (`eval_<name>_accuracy`,
  `_loss`, `_margin`, `_rewards_chosen_mean`, `_rewards_rejected_mean`, `_num_pairs`, TRL's `_min_reward`,
  `_mean_reward`, `_max_reward`, `_num_tokens`, and `_runtime`) plus `eval_total_validation_time`; TRL 1.16 names
  only the loss, so the other sets' accuracies overwrite each other.
  The metrics are exact over the set (sums over pairs gathered across processes), not means of batch means.
  `eval_total_validation_time` is in the same `log_history` row as the last set's metrics (one row per set, as TRL).
- `compute_metrics` gets what TRL's gives it: for TRL pairs, `predictions` is the `(2B, 1)` scores of each batch
  (every chosen, then every rejected) and `label_ids` is `()`. For rank-schema records, `predictions` is `(B, N)`
  (the scores of each record's completions, in record order) and `label_ids` `(B, N)` their ranks, both -100 where a
  record has fewer than N completions.
- When training ends, the mean/std of validation rewards go into the model config (`reward_mean`, `reward_std`,
  `reward_stats`), so a reward function can normalise from the checkpoint alone. An evaluation run only for these
  statistics (the last step was not an evaluation step) is not logged: the last `log_history` row stays the train
  summary, as in TRL.
- Batches are never dispatched by Accelerate (`dispatch_batches=False` unless set): its slicing assumes one row per
  example, which neither our batches nor TRL's (2B rows for B pairs) have.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import time
import warnings
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
    find_score_head,
    kv_sharing_unsupported,
    shared_context_collator,
    shared_context_scores,
    shared_prefix_scores,
)
from ..scoring.templating import common_prefix_length, left_truncate
from .collator import DataCollatorForRankedPreference, DataCollatorForSharedPrefixPairs, tokenize_rank_record
from .config import RankedRewardConfig
from .loss import STAT_COLUMNS, ranked_bradley_terry_loss, record_statistics, summarize_statistics
from .saving import AtomicCheckpointMixin

logger = logging.getLogger(__name__)

PROCESSED_COLUMNS = ("completion_ids", "ranks")
PAIR_COLUMNS = ("chosen_ids", "rejected_ids")
LEGACY_PAIR_COLUMNS = ("chosen_input_ids", "rejected_input_ids")
SET_METRICS = ("loss", "accuracy", "margin", "rewards_chosen_mean", "rewards_rejected_mean", "num_pairs")


def _column_names(dataset: Dataset | IterableDataset) -> list[str]:
    names = dataset.column_names
    if names is None:  # an IterableDataset whose features are unknown
        names = list(next(iter(dataset)).keys())
    return list(names)


def _template_kwargs(example: dict[str, Any], dataset_name: str, row: int | None) -> dict[str, Any]:
    """`apply_chat_template` keyword arguments of a TRL row: its `tools` (a list, or JSON text) and its
    `chat_template_kwargs`, as TRL's `RewardTrainer` passes them."""
    tools = example.get("tools")
    if isinstance(tools, str):
        try:
            tools = json.loads(tools)
        except json.JSONDecodeError as err:
            raise DataValidationError(
                dataset_name, row, "tools", f"tools is a string but not valid JSON: {err}", "row"
            ) from None
    extra = example.get("chat_template_kwargs") or {}
    if not isinstance(extra, dict):
        raise DataValidationError(
            dataset_name, row, "chat_template_kwargs", f"must be an object, got {type(extra).__name__}", "row"
        )
    return {"tools": tools, **extra}


def _limit_pair(
    chosen: list[int], rejected: list[int], max_length: int | None, truncation: str, bos_token_id: int | None
) -> tuple[list[int], list[int], str]:
    """Apply `max_length` to a tokenized pair: "dropped" (TRL's filter), or with `truncation="left"` cut their
    shared leading tokens (the prompt) from the left, the same number from both."""
    longest = max(len(chosen), len(rejected))
    if max_length is None or longest <= max_length:
        return chosen, rejected, "ok"
    if truncation != "left":
        return chosen, rejected, "dropped"
    shared = common_prefix_length(chosen, rejected)
    shared = min(shared, len(chosen) - 1, len(rejected) - 1)
    cut = longest - max_length
    out = [left_truncate(ids, shared, len(ids) - cut, bos_token_id) for ids in (chosen, rejected)]
    if any(ids is None for ids in out):
        return chosen, rejected, "dropped"
    return out[0], out[1], "truncated"


class RankedRewardTrainer(AtomicCheckpointMixin, RewardTrainer):
    """Train a Bradley-Terry reward model on ranked (N-way, ties allowed) preference data.

    Takes every argument of TRL's [`RewardTrainer`]; the differences are in the module docstring.

    Args:
        model: Model id or path, or a sequence-classification model (`num_labels=1`), or a `PeftModel`.
        args: A [`RankedRewardConfig`] (a plain TRL `RewardConfig` is upgraded with the defaults of the new fields).
        data_collator: Defaults to [`DataCollatorForRankedPreference`] (or the prefix-sharing collator); TRL's
            `DataCollatorForPreference` works too, for TRL pair data.
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
        self._eval_extremes: list[torch.Tensor] = []
        self._last_eval_summary: dict[str, tuple[int, dict[str, float]]] = {}
        self._last_full_evaluation: tuple[int, dict[str, float], bool] | None = None  # (step, metrics, silent)
        self._pending_total_time: tuple[str, float, str] | None = None  # (key, start time, last set's prefix)
        self._silent_logs = False
        self._last_scores: torch.Tensor | None = None
        user_collator = data_collator
        if args.accelerator_config.dispatch_batches is None:
            # Accelerate dispatches iterable datasets by slicing and padding every batch tensor along dim 0 as if it
            # counted examples; our batches (and TRL's: 2B rows for B pairs) do not. TRL turns dispatching off for an
            # iterable train set; we do it for every set, including an iterable passed to `evaluate` later.
            args.accelerator_config.dispatch_batches = False
        super().__init__(model, args, data_collator, *a, **kwargs)
        self._prefix_sharing = self.args.prefix_sharing and self._check_prefix_sharing()
        if user_collator is None:
            if self._prefix_sharing == "kv":
                self.data_collator = shared_context_collator(  # ZeRO-3: the same layer calls on every rank
                    self.processing_class.pad_token_id, self.args.pad_to_multiple_of, not self.is_deepspeed_enabled
                )
            elif self._prefix_sharing:
                self.data_collator = DataCollatorForSharedPrefixPairs(
                    pad_token_id=self.processing_class.pad_token_id,
                    pack_max_tokens=self.args.pack_max_tokens,
                    pad_to_multiple_of=self.args.pad_to_multiple_of,
                )
            else:
                self.data_collator = DataCollatorForRankedPreference(
                    pad_token_id=self.processing_class.pad_token_id, pad_to_multiple_of=self.args.pad_to_multiple_of
                )

    def _check_prefix_sharing(self) -> str | bool:
        """Which prefix-sharing path the model can run: `"kv"` (the contexts once with a KV cache, the completions
        against it), `"mask"` (block-mask rows: eager/SDPA, only with `prefix_sharing=True` where the KV path cannot
        run, e.g. under activation checkpointing) or False (the plain path). Logged once."""
        model = self.accelerator.unwrap_model(self.model)
        mode = self.args.prefix_sharing
        if mode == "auto" and type(self).compute_loss is not RankedRewardTrainer.compute_loss:
            # A subclass's compute_loss reads the batch it knows (TRL's `input_ids`/`attention_mask`): keep it.
            logger.info("prefix_sharing='auto': %s overrides compute_loss; using the plain batch layout.",
                        type(self).__name__)
            return False
        if mode == "auto" and "inputs" in (getattr(self.args, "include_for_metrics", None) or []):
            # transformers hands `batch["input_ids"]` to compute_metrics: the plain layout has it.
            logger.info("prefix_sharing='auto': include_for_metrics has 'inputs'; using the plain batch layout.")
            return False
        reason = kv_sharing_unsupported(model, training=True)
        if reason is None and getattr(self.args, "activation_checkpointing", False):
            reason = "activation checkpointing drops the KV cache"
        if reason is None and getattr(self, "is_fsdp_enabled", False):
            reason = "FSDP reshards each layer between the context and completion passes, before backward"
        if reason is None:
            logger.info("prefix_sharing=%r: each record's context runs once, its completions against its KV cache.", mode)
            return "kv"
        log = logger.warning if mode is True else logger.info
        attention = getattr(model.config, "_attn_implementation", None)
        if mode is True and attention in SUPPORTED_ATTENTION and find_score_head(model) is not None:
            log("prefix_sharing=True: %s; using block-mask rows (their attention grows with the square of the row).",
                reason)
            return "mask"
        log("prefix_sharing=%r: %s; using the plain path.", mode, reason)
        return False

    # ------------------------------------------------------------------ data
    def _prepare_dataset(
        self,
        dataset: Dataset | IterableDataset,
        processing_class: PreTrainedTokenizerBase,
        args: RankedRewardConfig,
        dataset_name: str,
    ) -> Dataset | IterableDataset:
        columns = _column_names(dataset)
        if all(c in columns for c in LEGACY_PAIR_COLUMNS) and not all(c in columns for c in PAIR_COLUMNS):
            warnings.warn(  # TRL 1.16's warning, word for word
                "Detected legacy dataset columns `chosen_input_ids`/`rejected_input_ids`; they are deprecated and "
                "will not be supported in v1. Please migrate to `chosen_ids`/`rejected_ids`.",
                FutureWarning,
                stacklevel=2,
            )
            dataset = dataset.rename_column("chosen_input_ids", "chosen_ids")
            dataset = dataset.rename_column("rejected_input_ids", "rejected_ids")
            columns = _column_names(dataset)
        if all(c in columns for c in PROCESSED_COLUMNS):
            return dataset
        if all(c in columns for c in PAIR_COLUMNS):  # TRL's tokenized format (or our processed pairs)
            return self._prepare_pretokenized(dataset, processing_class, args, dataset_name)
        if "chosen" in columns and "context" not in columns:
            return self._prepare_preference(dataset, processing_class, args, dataset_name, columns)
        if isinstance(dataset, IterableDataset):
            return self._prepare_iterable(dataset, processing_class, args, dataset_name, columns)

        with global_then_local_main_first():
            if "context" in columns and "completions" in columns:
                records, _ = validate_records(
                    enumerate(dataset), dataset_name, args.on_invalid, row_label="row", max_completions=args.max_completions
                )
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
                # A record without a margin, in a set where others have one, has margin 0.
                out["margin"] = float(example["margin"]) if example.get("margin") is not None else 0.0
                out["status"] = status
                return out

            tokenized = self._tokenize_dataset(base, tokenize, args, dataset_name)
            if not has_margin:
                tokenized = tokenized.remove_columns(["margin"])
        return tokenized

    def _prepare_preference(
        self,
        dataset: Dataset | IterableDataset,
        processing_class: PreTrainedTokenizerBase,
        args: RankedRewardConfig,
        dataset_name: str,
        columns: list[str],
    ) -> Dataset | IterableDataset:
        """TRL preference rows -> TRL's processed columns: the original columns (text responses with EOS appended,
        as TRL does), plus `chosen_ids`/`rejected_ids` holding the ids TRL's `RewardTrainer` produces, and `margin`
        (0 where missing) when the dataset has the column."""
        from ..data.converters import binary_to_rank, fold_context_into_completions, record_validation_view

        has_margin = "margin" in columns
        eos = processing_class.eos_token
        on_invalid, max_length, truncation = args.on_invalid, args.max_length, args.truncation

        def process(example, row):
            out: dict[str, Any] = {}
            for key in ("chosen", "rejected"):  # TRL appends EOS to plain-text responses
                if isinstance(example.get(key), str) and eos and not example[key].endswith(eos):
                    out[key] = example[key] + eos
            try:
                # TRL responses may run for several turns: then they are whole conversations of an empty context.
                record = fold_context_into_completions(binary_to_rank(example, dataset_name, row, "row"))
                validate_rank_record(record_validation_view(record), dataset_name, row, "row")
                kwargs = _template_kwargs(example, dataset_name, row)
            except DataValidationError as err:
                if on_invalid == "raise":
                    raise
                out.update(chosen_ids=[], rejected_ids=[], status="invalid", reason=err.reason)
                if has_margin:
                    out["margin"] = 0.0
                return out
            tokenized, status = tokenize_rank_record(record, processing_class, max_length, truncation, kwargs)
            ids = tokenized["completion_ids"] if tokenized is not None else [[], []]
            out.update(chosen_ids=ids[0], rejected_ids=ids[1], status=status, reason="")
            if has_margin:
                out["margin"] = float(record.get("margin", 0.0))
            return out

        with global_then_local_main_first():
            if isinstance(dataset, IterableDataset):  # lazy: no counts up front
                mapped = dataset.map(process, with_indices=True)
                mapped = mapped.filter(lambda status: status in ("ok", "truncated"), input_columns="status")
                return mapped.remove_columns(["status", "reason"])
            mapped = dataset.map(
                process, with_indices=True, num_proc=args.dataset_num_proc, desc=f"Tokenizing {dataset_name} dataset"
            )
            return self._finish_tokenized(mapped, args, dataset_name)

    def _prepare_pretokenized(
        self,
        dataset: Dataset | IterableDataset,
        processing_class: PreTrainedTokenizerBase,
        args: RankedRewardConfig,
        dataset_name: str,
    ) -> Dataset | IterableDataset:
        """`chosen_ids`/`rejected_ids` given: TRL's `max_length` filter (or left truncation of the shared prefix)."""
        if args.max_length is None:
            return dataset
        max_length, truncation, bos = args.max_length, args.truncation, processing_class.bos_token_id
        if truncation != "left":  # exactly TRL's filter
            kwargs = {} if isinstance(dataset, IterableDataset) else {"num_proc": args.dataset_num_proc}
            with global_then_local_main_first():
                return dataset.filter(
                    lambda chosen, rejected: len(chosen) <= max_length and len(rejected) <= max_length,
                    input_columns=list(PAIR_COLUMNS),
                    **kwargs,
                )

        def limit(example):
            chosen, rejected, status = _limit_pair(example["chosen_ids"], example["rejected_ids"], max_length, truncation, bos)
            return {"chosen_ids": chosen, "rejected_ids": rejected, "status": status}

        with global_then_local_main_first():
            if isinstance(dataset, IterableDataset):
                mapped = dataset.map(limit).filter(lambda status: status != "dropped", input_columns="status")
                return mapped.remove_columns(["status"])
            return self._finish_tokenized(dataset.map(limit, num_proc=args.dataset_num_proc), args, dataset_name)

    def _tokenize_dataset(self, base: Dataset, tokenize, args: RankedRewardConfig, dataset_name: str) -> Dataset:
        """Map `tokenize` (which adds a `status`: kept, truncated or dropped) over `base`; count and report the
        over-long records, drop the dropped ones, and remove `status`."""
        tokenized = base.map(
            tokenize,
            remove_columns=base.column_names,
            num_proc=args.dataset_num_proc,
            desc=f"Tokenizing {dataset_name} dataset",
        )
        return self._finish_tokenized(tokenized, args, dataset_name)

    def _finish_tokenized(self, tokenized: Dataset, args: RankedRewardConfig, dataset_name: str) -> Dataset:
        """Count the `status` of every example (and the `reason` of invalid ones), report the skipped, dropped and
        truncated ones, keep the kept ones, and remove the bookkeeping columns."""
        counts = Counter(tokenized["status"])
        if counts["invalid"]:
            reasons = Counter(r for r, s in zip(tokenized["reason"], tokenized["status"]) if s == "invalid")
            logger.warning("%s: skipped %d invalid row(s): %s", dataset_name, counts["invalid"], dict(reasons))
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
        tokenized = tokenized.filter(lambda s: s in ("ok", "truncated"), input_columns="status")
        tokenized = tokenized.remove_columns([c for c in ("status", "reason") if c in tokenized.column_names])
        if len(tokenized) == 0 and counts["invalid"] and not counts["dropped"]:
            raise ValueError(f"Dataset {dataset_name!r} has no valid record.")
        if len(tokenized) == 0:
            raise ValueError(
                f"Every record of dataset {dataset_name!r} is longer than max_length={args.max_length}; raise "
                "max_length or use truncation='left'."
            )
        return tokenized

    def _prepare_iterable(self, dataset, processing_class, args, dataset_name, columns):
        """Streaming rank-schema data: validate and tokenize lazily (counts are not available up front)."""
        if "context" not in columns or "completions" not in columns:
            raise ValueError(
                f"Dataset {dataset_name!r} has columns {columns}: expected rank-schema records "
                "('context', 'completions'), TRL preference data ('chosen', 'rejected', optional 'prompt'), or "
                "tokenized data ('chosen_ids', 'rejected_ids')."
            )

        def tokenize(example):
            record = validate_rank_record(example, dataset_name, None, "row", args.max_completions)
            out, status = tokenize_rank_record(record, processing_class, args.max_length, args.truncation)
            return out or {"completion_ids": [], "ranks": [], "context_length": 0}

        mapped = dataset.map(tokenize, remove_columns=columns)
        return mapped.filter(lambda ranks: len(ranks) > 0, input_columns="ranks")

    def _set_signature_columns_if_needed(self):
        if self._signature_columns is None:
            self._signature_columns = [*PAIR_COLUMNS, "margin", *PROCESSED_COLUMNS, "context_length"]

    # ------------------------------------------------------------------ loss
    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        mode = "train" if self.model.training else "eval"
        ranks = inputs.pop("ranks", None)
        record_index = inputs.pop("record_index", None)
        margin = inputs.pop("margin", None)
        inputs.pop("context_length", None)
        if ranks is None:  # TRL's pair layout (ours or TRL's DataCollatorForPreference): every chosen, then rejected
            rows = inputs["score_index"] if "score_index" in inputs else inputs["input_ids"]
            ranks, record_index = _pair_layout(rows.shape[0], rows.device)
        if "prefix_ids" in inputs:  # contexts once with a KV cache, completions against it (see prefix_sharing.py)
            scores, outputs = shared_context_scores(model, inputs)
            token_count = inputs["prefix_mask"].sum() + inputs["completion_mask"].sum()
        elif "segment_ids" in inputs:  # prefix-shared rows (see prefix_sharing.py)
            dtype = next(p for p in model.parameters() if p.is_floating_point()).dtype
            if dtype not in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
                dtype = torch.float32
            scores, outputs = shared_prefix_scores(model, inputs, dtype)
            token_count = (inputs["record_ids"] >= 0).sum()
        else:
            outputs = model(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"], use_cache=False)
            scores = outputs.logits[:, 0]  # (C,)
            token_count = inputs["attention_mask"].sum()
        if mode == "eval":
            self._last_scores = scores.detach()
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
            # (min, max) per process; repeated padding samples of a last batch cannot change either.
            local = scores.detach().float()
            self._eval_extremes.append(self.accelerator.gather(torch.stack([local.min(), local.max()])[None]).cpu())
        return (loss, outputs) if return_outputs else loss

    # ------------------------------------------------------------------ evaluation
    def evaluation_loop(self, dataloader, description, prediction_loss_only=None, ignore_keys=None, metric_key_prefix="eval"):
        self._eval_stats, self._eval_extremes = [], []
        # `evaluate` asks for predictions only when there is a `compute_metrics` (Trainer's rule, as in TRL).
        output = super().evaluation_loop(dataloader, description, prediction_loss_only, ignore_keys, metric_key_prefix)
        if self._eval_stats:
            stats = torch.cat(self._eval_stats).sum(0)
            summary = summarize_statistics(stats)
            self._last_eval_summary[metric_key_prefix] = (self.state.global_step, summary)
            for key in SET_METRICS:
                output.metrics[f"{metric_key_prefix}_{key}"] = summary[key]
            # TRL's eval keys, exact over the set and named after it (`eval_min_reward` ... for a single set).
            extremes = torch.cat(self._eval_extremes)
            output.metrics[f"{metric_key_prefix}_min_reward"] = extremes[:, 0].min().item()
            output.metrics[f"{metric_key_prefix}_mean_reward"] = summary["reward_mean"]
            output.metrics[f"{metric_key_prefix}_max_reward"] = extremes[:, 1].max().item()
            output.metrics[f"{metric_key_prefix}_num_tokens"] = float(self._total_train_tokens)
        self._eval_stats, self._eval_extremes = [], []
        return output

    def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None):
        """The loss, and (unless `prediction_loss_only`) predictions and labels for `compute_metrics`: for TRL pairs
        exactly TRL's (`(2B, 1)` scores, every chosen then every rejected, and `()`), for rank records `(B, N)` scores
        and `(B, N)` ranks (-100 where a record has fewer than N completions)."""
        inputs = self._prepare_inputs(inputs)
        ranks, record_index = inputs.get("ranks"), inputs.get("record_index")
        with torch.no_grad(), self.compute_loss_context_manager():
            loss = self.compute_loss(model, inputs)
        loss = loss.detach()
        if prediction_loss_only:
            return loss, None, None
        scores = self._last_scores
        if ranks is None:  # TRL's layout, TRL's shapes
            return loss, scores[:, None], ()
        num_records = int(record_index.max().item()) + 1
        counts = torch.bincount(record_index, minlength=num_records)
        starts = torch.cumsum(counts, 0) - counts
        position = torch.arange(len(record_index), device=record_index.device) - starts[record_index]
        width = int(counts.max().item())
        predictions = scores.new_full((num_records, width), -100.0)
        predictions[record_index, position] = scores
        labels = torch.full_like(predictions, -100, dtype=torch.long)
        labels[record_index, position] = ranks
        return loss, predictions, labels

    def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix="eval"):
        sets = eval_dataset if eval_dataset is not None else self.eval_dataset
        if not isinstance(sets, dict) or not sets:
            metrics = super().evaluate(eval_dataset, ignore_keys, metric_key_prefix)
        else:
            # The total time goes into the last set's log row (see `log`): one row per set, as TRL logs them.
            key = f"{metric_key_prefix}_total_validation_time"
            self._pending_total_time = (key, time.time(), f"{metric_key_prefix}_{list(sets)[-1]}")
            try:
                metrics = super().evaluate(eval_dataset, ignore_keys, metric_key_prefix)
            finally:
                self._pending_total_time = None
        if eval_dataset is None and metric_key_prefix == "eval":  # every validation set, as final_evaluation needs
            self._last_full_evaluation = (self.state.global_step, dict(metrics), self._silent_logs)
        return metrics

    def final_evaluation(self) -> dict[str, float]:
        """The metrics of every validation set for the current weights, evaluating only when needed.

        Reuses the evaluation that already ran at the current step (the last one of `eval_strategy`, or the one
        `train()` runs to store the reward statistics, which is logged now: it stayed out of the log while training
        ended); otherwise evaluates now. The recipes call this after training, so that the validation sets are not
        evaluated twice.
        """
        cached = self._last_full_evaluation
        if cached is not None and cached[0] == self.state.global_step:
            step, metrics, silent = cached
            if silent:
                self.log(dict(metrics))
                self._last_full_evaluation = (step, metrics, False)
            return dict(metrics)
        return self.evaluate()

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        pending = self._pending_total_time
        if pending is not None and f"{pending[2]}_runtime" in logs:  # the last named set's evaluation row
            logs[pending[0]] = round(time.time() - pending[1], 4)
        if self._silent_logs:  # an evaluation of our own (reward statistics): not part of the user's log
            self._metrics["train" if self.model.training else "eval"].clear()
            if self.state.epoch is not None:  # the returned metrics look as if logged
                logs["epoch"] = self.state.epoch
            return
        super().log(logs, start_time)

    @contextlib.contextmanager
    def _quiet(self):
        """Evaluations run for our own needs (reward statistics) stay out of `log_history` and the loggers."""
        self._silent_logs = True
        try:
            yield
        finally:
            self._silent_logs = False

    # ------------------------------------------------------------------ reward statistics
    def train(self, *args, **kwargs):
        output = super().train(*args, **kwargs)
        if self.args.load_best_model_at_end and self.state.best_model_checkpoint is not None:
            self._last_full_evaluation = None  # it measured the last weights, not the reloaded best ones
        if self.args.save_reward_stats and self.eval_dataset is not None:
            # With load_best_model_at_end the weights are now the best checkpoint's, not the ones evaluated last.
            reloaded = self.args.load_best_model_at_end and self.state.best_model_checkpoint is not None
            with self._quiet():  # TRL's log layout: the train summary stays the last row
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


def _pair_layout(rows: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """`(ranks, record_index)` of TRL's pair layout: rows 0..B-1 are the chosen, B..2B-1 the rejected."""
    half = rows // 2
    ranks = torch.cat([torch.zeros(half, dtype=torch.long), torch.ones(half, dtype=torch.long)]).to(device)
    return ranks, torch.arange(half, device=device).repeat(2)


__all__ = ["RankedRewardTrainer", "STAT_COLUMNS"]
