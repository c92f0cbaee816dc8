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
- `ensemble_heads=K`: K bootstrapped score heads on one backbone (`trl_rm_env.trainer.ensemble`): the model has
  `num_labels=K` (a path is loaded so), each head its own weighted loss, the metrics those of the heads' mean plus
  each head's evaluation accuracy (`eval_<set>_head_<k>_accuracy`).
- Batches are never dispatched by Accelerate (`dispatch_batches=False` unless set): its slicing assumes one row per
  example, which neither our batches nor TRL's (2B rows for B pairs) have.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time

import torch
from trl import RewardTrainer

from ..compat import checkpointing_enabled
from ..fused_kernels import use_fused_kernels
from ..metrics import record_statistics, summarize_statistics
from ..sharing import training_layout
from ..sharing.layouts import KV_CACHE, PLAIN, Layout
from ..sharing.model_support import packs_fast
from .bounded_forwards import SCORES_OUT, BoundedForwardsMixin, ScoresOut
from .checkpoints import AtomicCheckpointMixin
from .classifier import ensemble_model, one_label_view
from .collator import DataCollatorForRankedPreference
from .config import RankedRewardConfig
from .ensemble import ensemble_loss, head_statistics
from .examples import PAIR_COLUMNS, PROCESSED_COLUMNS, ExamplePreparer
from .loss import pair_layout, ranked_bradley_terry_loss
from .windows import WINDOW_RECORDS, WINDOW_SLOT, WindowPackingMixin, weighted_pair_loss

logger = logging.getLogger(__name__)

SET_METRICS = ("loss", "accuracy", "margin", "rewards_chosen_mean", "rewards_rejected_mean", "num_pairs")


class RankedRewardTrainer(AtomicCheckpointMixin, WindowPackingMixin, BoundedForwardsMixin, RewardTrainer):
    """Train a Bradley-Terry reward model on ranked (N-way, ties allowed) preference data.

    Takes every argument of TRL's [`RewardTrainer`]; the differences are in the module docstring.

    Args:
        model: Model id or path, or a sequence-classification model (`num_labels=1`), or a `PeftModel`.
        args: A [`RankedRewardConfig`] (a plain TRL `RewardConfig` is upgraded with the defaults of the new fields).
        data_collator: Defaults to [`DataCollatorForRankedPreference`] in the layout `prefix_sharing` resolves to;
            one of ours runs its own layout, and any other (TRL's `DataCollatorForPreference`, for TRL pair data) is
            read as the plain layout, as TRL reads it.
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
        self._examples = ExamplePreparer()  # TRL's __init__ prepares the datasets through `_prepare_dataset`
        self._data_counts = self._examples.counts
        self._eval_stats: list[torch.Tensor] = []
        self._eval_extremes: list[torch.Tensor] = []
        self._eval_summaries: dict[str, tuple[int, dict[str, float]]] = {}
        self._full_evaluation: tuple[int, dict[str, float], bool] | None = None  # (step, metrics, silent)
        self._pending_total_time: tuple[str, float, str] | None = None  # (key, start time, last set's prefix)
        self._silent_logs = False
        user_collator = data_collator
        self._heads = args.ensemble_heads
        self._eval_head_stats: list[torch.Tensor] = []
        heads_view = contextlib.nullcontext()
        if self._heads > 1:
            model = ensemble_model(model, args, kwargs)
            heads_view = one_label_view(model.config)  # TRL's __init__ refuses num_labels != 1
        if args.accelerator_config.dispatch_batches is None:
            # Accelerate dispatches iterable datasets by slicing and padding every batch tensor along dim 0 as if it
            # counted examples; our batches (and TRL's: 2B rows for B pairs) do not. TRL turns dispatching off for an
            # iterable train set; we do it for every set, including an iterable passed to `evaluate` later.
            args.accelerator_config.dispatch_batches = False
        fused, args.use_liger_kernel = (True if args.use_liger_kernel else args.fused_kernels), False  # ours, below
        with heads_view:
            super().__init__(model, args, data_collator, *a, **kwargs)
        self._fused_kernels = use_fused_kernels(fused, self.model, args.device, "training", args.liger_kernel_config)
        self._layout = self._check_prefix_sharing()  # what prefix_sharing resolves to (a `sharing.layouts` object)
        self._forward_budget = self._check_forward_budget(user_collator)  # `BoundedForwardsMixin`
        if user_collator is None:  # our collator, in the layout
            settings = {"pad_token_id": self.processing_class.pad_token_id, "layout": self._layout}
            settings["pad_to_multiple_of"] = args.pad_to_multiple_of
            if self._layout.shares_contexts:  # the packed and KV forwards' budget; the block-mask rows' length
                settings["pack_max_tokens"] = self._forward_budget if self._layout.cuts_chunks else args.pack_max_tokens
            if self._layout is KV_CACHE:  # ZeRO-3: the same layer calls on every rank, so no passes split by length
                settings["split_passes"] = not self.is_deepspeed_enabled
            if self._heads > 1:  # each record's bootstrap weights, one per head
                settings["ensemble_heads"] = self._heads
                settings["ensemble_seed"] = args.seed if args.ensemble_seed is None else args.ensemble_seed
            self.data_collator = DataCollatorForRankedPreference(**settings)
        else:  # a user's collator of ours runs its own layout; any other (TRL's) is read as the plain one, as TRL does
            self._layout = getattr(self.data_collator, "layout", PLAIN)
        if self._heads > 1 and getattr(self.data_collator, "ensemble_heads", 1) != self._heads:
            raise ValueError(
                f"ensemble_heads={self._heads} trains each head on its own bootstrap resample, which our collators "
                f"draw; the data_collator given ({type(self.data_collator).__name__}) draws none: give one of ours "
                f"with ensemble_heads={self._heads}, or no data_collator."
            )
        self._window_packing = self._check_window_packing(user_collator)  # `WindowPackingMixin`

    def _check_prefix_sharing(self) -> Layout:
        """Which layout the model can run (`trl_rm_env.sharing.training_layout`): packed, KV cache, block mask or
        plain. `"auto"` keeps TRL's batch layout where something reads it: a subclass's own `compute_loss`, or
        `include_for_metrics=["inputs"]` (transformers hands `batch["input_ids"]` to `compute_metrics`)."""
        plain_reason = None
        if type(self).compute_loss is not RankedRewardTrainer.compute_loss:
            plain_reason = f"{type(self).__name__} overrides compute_loss"
        elif "inputs" in (getattr(self.args, "include_for_metrics", None) or []):
            plain_reason = "include_for_metrics has 'inputs'"
        return training_layout(
            self.accelerator.unwrap_model(self.model),
            self.args.prefix_sharing,
            activation_checkpointing=checkpointing_enabled(self.args),
            fsdp=bool(getattr(self, "is_fsdp_enabled", False)),
            plain_reason=plain_reason,
            accelerator=packs_fast(self.args.device, self._compute_dtype()),
        )

    def _compute_dtype(self) -> torch.dtype:
        """The dtype the attention computes in: bf16/fp16 under mixed precision, else the weights'."""
        if self.args.bf16:
            return torch.bfloat16
        if self.args.fp16:
            return torch.float16
        parameter = next((p for p in self.model.parameters() if p.is_floating_point()), None)
        return parameter.dtype if parameter is not None else torch.float32

    def training_step(self, model, inputs, num_items_in_batch=None):
        """TRL's step; a packed batch's forward AND backward run under the packed attention (activation
        checkpointing recomputes layers in backward). A batch cut into `chunks` (`pack_max_tokens`) runs one forward
        and backward per chunk, each chunk's loss weighted by its share of the pairs, so the step's gradients and loss
        are the whole batch's; its metrics are computed once, over the whole batch. An accumulation window's
        micro-batches run together (`window_packing`: `WindowPackingMixin`)."""
        if WINDOW_SLOT in inputs or WINDOW_RECORDS in inputs:
            return self._window_training_step(model, inputs, num_items_in_batch)
        if "chunks" in inputs or self._even_forwards():
            return self._chunked_training_step(model, inputs, num_items_in_batch)
        with self._layout.attention(model):
            return super().training_step(model, inputs, num_items_in_batch)

    def _prepare_dataset(self, dataset, processing_class, args, dataset_name):
        return self._examples.prepare(dataset, processing_class, args, dataset_name)

    def _set_signature_columns_if_needed(self):
        if self._signature_columns is None:
            self._signature_columns = [*PAIR_COLUMNS, "margin", *PROCESSED_COLUMNS, "context_length"]

    # ------------------------------------------------------------------ loss
    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        """TRL's loss of a batch (our ranked loss); the scores go to the `ScoresOut` its caller put in `inputs`
        (`SCORES_OUT`: a step's chunk loop, `prediction_step`), if any."""
        loss, _, outputs = self._loss_and_scores(model, inputs)
        return (loss, outputs) if return_outputs else loss

    def _loss_and_scores(self, model, inputs) -> tuple[torch.Tensor, torch.Tensor, object]:
        """`(loss, scores, outputs)` of a batch: the loss, one score per completion in TRL's pair layout or the
        records' (a multi-head model's: the mean of its heads), and the model's outputs."""
        mode = "train" if self.model.training else "eval"
        ranks = inputs.pop("ranks", None)
        record_index = inputs.pop("record_index", None)
        margin = inputs.pop("margin", None)
        loss_weight = inputs.pop("loss_weight", None)  # a chunk of a bounded step (`_chunked_training_step`)
        record_weight = inputs.pop("record_weight", None)  # a forward of an accumulation window: each pair's weight
        score_order = inputs.pop("score_order", None)
        scores_out = inputs.pop(SCORES_OUT, None)  # the caller's `ScoresOut`: where this batch's scores go
        bootstrap = inputs.pop("bootstrap_weights", None)  # `ensemble_heads`: (B, K)
        inputs.pop("context_length", None)
        scores, outputs, token_count = self._layout_scores(model, inputs)
        if score_order is not None:  # chunks of TRL pairs, concatenated in record order: TRL's pair layout
            scores = scores[score_order.to(scores.device)]
        if ranks is None:  # TRL's pair layout (ours or TRL's DataCollatorForPreference): every chosen, then rejected
            ranks, record_index = pair_layout(scores.shape[0], scores.device)
        heads = None
        if self._heads > 1:  # K heads' scores (C, K): their weighted losses; the metrics read their mean
            heads = scores
            loss, pairwise, head_pairs = ensemble_loss(heads, ranks, record_index, margin,
                                                       self.args.center_rewards_coefficient,
                                                       bootstrap if mode == "train" else None)  # fmt: skip
            scores = heads.mean(dim=1)
        else:
            pairwise = ranked_bradley_terry_loss(
                scores, ranks, record_index, margin, self.args.center_rewards_coefficient
            )
            loss = pairwise.loss
        if scores_out is not None:
            scores_out.add(scores, token_count)
        if mode == "train" and (loss_weight is not None or record_weight is not None):  # a chunk; metrics per step
            if record_weight is not None:  # each pair by its micro-batch's weight (`trl_rm_env.trainer.windows`)
                loss = weighted_pair_loss(pairwise, scores, record_index, record_weight,
                                          self.args.center_rewards_coefficient)
            else:  # its share of the step's pairs
                loss = loss * loss_weight
        elif mode == "train":
            summary = self._log_train_metrics(scores, pairwise, record_index, token_count)
            if self.accelerator.num_processes > 1 and summary["num_pairs"] > 0:
                # DDP and DeepSpeed average gradients over processes. Weighting each process's mean by its share of
                # the pairs makes the step the mean over every pair of the global batch, as on one process with
                # the same global batch (processes hold different numbers of pairs with ranked records).
                loss = loss * (pairwise.better.numel() * self.accelerator.num_processes / summary["num_pairs"])
        else:
            num_records = int(record_index.max().item()) + 1
            stats = record_statistics(scores, record_index, pairwise, num_records)  # (B, 9)
            self._eval_stats.append(self.accelerator.gather_for_metrics(stats).cpu())
            if heads is not None:  # each head's own pairs, for its accuracy
                per_head = head_statistics(heads.detach(), record_index, head_pairs, num_records)  # (B, K, 9)
                self._eval_head_stats.append(self.accelerator.gather_for_metrics(per_head).cpu())
            # (min, max) per process; repeated padding samples of a last batch cannot change either.
            local = scores.detach().float()
            self._eval_extremes.append(self.accelerator.gather(torch.stack([local.min(), local.max()])[None]).cpu())
        return loss, scores.detach(), outputs

    def _layout_scores(self, model, inputs) -> tuple[torch.Tensor, object, torch.Tensor]:
        """`(scores, outputs, token_count)` of a batch in its layout: one score per completion (in the batch's
        order), the model's outputs (the last chunk's for a batch in `chunks`) and the real tokens through it."""
        if "chunks" in inputs or (not self.model.training and self._even_forwards()):
            # evaluation of a bounded batch: each chunk's forward (as many as the other processes run), scores in
            # record order
            chunks, real, _, _ = self._forwards(inputs)
            parts = []
            for chunk in chunks:
                chunk = {k: v for k, v in chunk.items()
                         if k not in ("ranks", "record_index", "margin", "chunks", "bootstrap_weights")}  # fmt: skip
                with self._layout.attention(model):
                    parts.append(self._layout.scores(model, chunk, self._heads))
            parts = parts[:real]
            return torch.cat([p[0] for p in parts]), parts[-1][1], sum(p[2] for p in parts)
        return self._layout.scores(model, inputs, self._heads)

    def _log_train_metrics(self, scores, pairwise, record_index, token_count) -> dict[str, float]:
        """Record one training batch's metrics (TRL's keys, exact over the processes' pairs); the summary."""
        num_records = int(record_index.max().item()) + 1
        num_tokens = self.accelerator.gather_for_metrics(torch.as_tensor(token_count, device=scores.device)).sum()
        self._total_train_tokens += num_tokens.item() // self._tp_size
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
        return summary

    # ------------------------------------------------------------------ evaluation
    def evaluation_loop(self, dataloader, description, prediction_loss_only=None, ignore_keys=None, metric_key_prefix="eval"):
        self._eval_stats, self._eval_extremes, self._eval_head_stats = [], [], []
        # `evaluate` asks for predictions only when there is a `compute_metrics` (Trainer's rule, as in TRL).
        output = super().evaluation_loop(dataloader, description, prediction_loss_only, ignore_keys, metric_key_prefix)
        if self._eval_stats:
            stats = torch.cat(self._eval_stats).sum(0)
            summary = summarize_statistics(stats)
            self._eval_summaries[metric_key_prefix] = (self.state.global_step, summary)
            for key in SET_METRICS:
                output.metrics[f"{metric_key_prefix}_{key}"] = summary[key]
            # TRL's eval keys, exact over the set and named after it (`eval_min_reward` ... for a single set).
            extremes = torch.cat(self._eval_extremes)
            output.metrics[f"{metric_key_prefix}_min_reward"] = extremes[:, 0].min().item()
            output.metrics[f"{metric_key_prefix}_mean_reward"] = summary["reward_mean"]
            output.metrics[f"{metric_key_prefix}_max_reward"] = extremes[:, 1].max().item()
            output.metrics[f"{metric_key_prefix}_num_tokens"] = float(self._total_train_tokens)
        if self._eval_head_stats:  # `ensemble_heads`: each head's accuracy over the set
            per_head = torch.cat(self._eval_head_stats).sum(0)  # (K, 9)
            for k in range(per_head.shape[0]):
                output.metrics[f"{metric_key_prefix}_head_{k}_accuracy"] = summarize_statistics(per_head[k])["accuracy"]
        self._eval_stats, self._eval_extremes, self._eval_head_stats = [], [], []
        return output

    def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None):
        """The loss, and (unless `prediction_loss_only`) predictions and labels for `compute_metrics`: for TRL pairs
        exactly TRL's (`(2B, 1)` scores, every chosen then every rejected, and `()`), for rank records `(B, N)` scores
        and `(B, N)` ranks (-100 where a record has fewer than N completions)."""
        inputs = self._prepare_inputs(inputs)
        ranks, record_index = inputs.get("ranks"), inputs.get("record_index")
        out = ScoresOut()
        with torch.no_grad(), self.compute_loss_context_manager():
            # a subclass's own compute_loss runs in evaluation too; the scores come back in `out`
            loss = self.compute_loss(model, {**inputs, SCORES_OUT: out})
        loss = loss.detach()
        if prediction_loss_only:
            return loss, None, None
        scores, _ = out.joined()
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
            self._full_evaluation = (self.state.global_step, dict(metrics), self._silent_logs)
        return metrics

    def final_evaluation(self) -> dict[str, float]:
        """The metrics of every validation set for the current weights, evaluating only when needed.

        Reuses the evaluation that already ran at the current step (the last one of `eval_strategy`, or the one
        `train()` runs to store the reward statistics, which is logged now: it stayed out of the log while training
        ended); otherwise evaluates now. The recipes call this after training, so that the validation sets are not
        evaluated twice.
        """
        cached = self._full_evaluation
        if cached is not None and cached[0] == self.state.global_step:
            step, metrics, silent = cached
            if silent:
                self.log(dict(metrics))
                self._full_evaluation = (step, metrics, False)
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
            self._full_evaluation = None  # it measured the last weights, not the reloaded best ones
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
            p for p in prefixes.values() if self._eval_summaries.get(p, (None,))[0] != self.state.global_step
        ]
        if missing or reevaluate:
            self.evaluate()
        per_set, total_n, total_sum, total_sq = {}, 0.0, 0.0, 0.0
        for name, prefix in prefixes.items():
            summary = self._eval_summaries[prefix][1]
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


__all__ = ["RankedRewardTrainer"]
