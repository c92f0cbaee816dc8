"""The reward model run by transformers in this process: the exact reference engine, and the one training uses.

An engine turns token ids into the model's outputs, `(N, num_labels)` fp32 in input order; everything around it
(templates, truncation, fallbacks, the reward of the outputs) is the `RewardScorer`'s. This one plans micro-batches
(longest first, within `batch_size` rows and `max_tokens_per_batch` padded tokens) and runs them plainly, or, for the
items that share a context, the context once with a KV cache and the completions against it (`trl_rm_env.sharing`).

Exactness: right padding with an attention mask leaves every real token's computation unchanged in a causal model,
and the classifier reads the last non-pad token, so each output equals running that sequence alone (fp32: < 1e-4,
proved by the parity tests); the shared path equals it to float rounding too.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from ..sharing import collate_shared_context, plan_passes, scoring_mode, share_plan, shared_context_scores
from ..sharing.planning import greedy_batches, linear_to_attention_cost


class HFEngine:
    """Forward passes of a `*ForSequenceClassification` model loaded with transformers.

    Args:
        model: The reward model (eval mode is set for each call, its training flag restored after).
        pad_token_id: The tokenizer's padding id.
        batch_size: At most this many rows per forward pass (None: no limit but the token budget).
        max_tokens_per_batch: At most this many tokens per forward pass, padding included.
        prefix_sharing: `"auto"`, `True` or `False` (see `trl_rm_env.sharing`); `False` where the model cannot
            share (logged once).
        show_progress: Progress bar over batches (None: only for more than 8 batches).
    """

    name = "hf"

    def __init__(
        self,
        model: torch.nn.Module,
        pad_token_id: int,
        *,
        batch_size: int | None,
        max_tokens_per_batch: int | None,
        prefix_sharing: bool | str = "auto",
        show_progress: bool | None = None,
    ):
        self.model = model
        self.pad_token_id = pad_token_id
        self.batch_size = batch_size
        self.max_tokens_per_batch = max_tokens_per_batch
        self.show_progress = show_progress
        self.prefix_sharing = scoring_mode(model, prefix_sharing)
        self.cost_ratio = linear_to_attention_cost(getattr(model, "config", None))
        self.last_batch_shapes: list[tuple[int, int]] = []  # (rows, length) of each forward pass of the last call
        self.last_key_shapes: list[tuple[int, int]] = []  # (rows, keys) of each shared completion pass
        self.last_shared: list[int] = []  # items of the last call scored against a shared context

    @property
    def num_labels(self) -> int:
        return self.model.config.num_labels

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @torch.inference_mode()
    def outputs(
        self,
        sequences: Sequence[Sequence[int]],
        context_lengths: Sequence[int] | None = None,
        progress: bool | None = None,
    ) -> torch.Tensor:
        """`(N, num_labels)` fp32 outputs (CPU, input order) of `sequences`; with `context_lengths` (how many leading
        tokens of each are its context) the items that share one may be scored against it (`prefix_sharing`)."""
        self.last_batch_shapes, self.last_key_shapes, self.last_shared = [], [], []
        if self.prefix_sharing and context_lengths is not None:
            return self._shared_outputs(sequences, context_lengths, progress)
        return self._plain_outputs(sequences, progress)

    def plan_batches(self, lengths: Sequence[int]) -> list[list[int]]:
        """Group item indices into micro-batches: longest first, within `batch_size` rows and the token budget."""
        order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
        budget = self.max_tokens_per_batch

        def fits(current: list[int], i: int) -> bool:  # longest first: the batch's longest is its first
            return budget is None or (len(current) + 1) * lengths[current[0]] <= budget

        return greedy_batches(order, fits, self.batch_size)


    def _plain_outputs(self, sequences: Sequence[Sequence[int]], progress: bool | None) -> torch.Tensor:
        """`(N, num_labels)` fp32 outputs, one padded row per sequence (appends to `last_batch_shapes`)."""
        outputs = torch.empty(len(sequences), self.num_labels, dtype=torch.float32)
        if not sequences:
            return outputs
        batches = self.plan_batches([len(s) for s in sequences])
        pad_id = self.pad_token_id
        with torch.inference_mode(), self._in_eval_mode(batches, progress) as iterator:
            for batch in iterator:
                length = max(len(sequences[i]) for i in batch)
                input_ids = torch.full((len(batch), length), pad_id, dtype=torch.long)
                attention_mask = torch.zeros((len(batch), length), dtype=torch.long)
                for row, i in enumerate(batch):
                    input_ids[row, : len(sequences[i])] = torch.as_tensor(sequences[i])
                    attention_mask[row, : len(sequences[i])] = 1
                self.last_batch_shapes.append((len(batch), length))
                logits = self.model(
                    input_ids=input_ids.to(self.device), attention_mask=attention_mask.to(self.device), use_cache=False
                ).logits
                outputs[torch.tensor(batch)] = logits.float().cpu()
        return outputs

    def _shared_outputs(
        self, sequences: Sequence[Sequence[int]], context_lengths: Sequence[int], progress: bool | None
    ) -> torch.Tensor:
        groups, plain = share_plan(sequences, context_lengths, self.prefix_sharing is True, self.cost_ratio)
        self.last_shared = sorted(i for _, members in groups for i in members)
        outputs = torch.empty(len(sequences), self.num_labels, dtype=torch.float32)
        if plain:
            outputs[torch.tensor(plain)] = self._plain_outputs([sequences[i] for i in plain], progress)
        if not groups:
            return outputs
        batches = self._plan_shared_batches(groups, sequences)
        with torch.inference_mode(), self._in_eval_mode(batches, progress) as iterator:
            for batch in iterator:
                chosen = [groups[g] for g in batch]
                inputs = collate_shared_context(
                    [[sequences[i] for i in members] for _, members in chosen],
                    [p for p, _ in chosen],
                    self.pad_token_id,
                )
                prefix_lengths = [p for p, _ in chosen]
                inputs["prefix_chunks"] = plan_passes(prefix_lengths, self.batch_size, self.max_tokens_per_batch)
                own = inputs["completion_mask"].sum(1).tolist()
                context_of = [prefix_lengths[g] for g in inputs["group_index"].tolist()]
                inputs["completion_chunks"] = plan_passes(own, self.batch_size, self.max_tokens_per_batch, context_of)
                for rows, length in inputs["prefix_chunks"]:
                    self.last_batch_shapes.append((len(rows), length))
                for rows, length in inputs["completion_chunks"]:
                    self.last_batch_shapes.append((len(rows), length))
                    self.last_key_shapes.append((len(rows), max(context_of[i] for i in rows) + length))
                inputs = {k: (v.to(self.device) if torch.is_tensor(v) else v) for k, v in inputs.items()}
                values, _ = shared_context_scores(self.model, inputs, label_index=None)
                items = [i for _, members in chosen for i in members]
                outputs[torch.tensor(items)] = values.float().cpu()
        return outputs

    def _plan_shared_batches(self, groups: list[tuple[int, list[int]]], sequences) -> list[list[int]]:
        """Batches of groups for the context pass: longest context first, at most `batch_size` contexts and
        `max_tokens_per_batch` padded context tokens, and every completion row able to fit the budget with the
        batch's longest context (`rows x (context + completion)`)."""
        order = sorted(range(len(groups)), key=lambda g: -groups[g][0])
        budget = self.max_tokens_per_batch

        def fits(current: list[int], g: int) -> bool:  # longest context first: the batch's longest is its first
            prefix = groups[current[0]][0]
            longest_own = max(len(sequences[i]) - groups[g][0] for i in groups[g][1])
            return budget is None or ((len(current) + 1) * prefix <= budget and prefix + longest_own <= budget)

        return greedy_batches(order, fits, self.batch_size)

    @contextlib.contextmanager
    def _in_eval_mode(self, batches: list[list[int]], progress: bool | None) -> Iterator[Any]:
        """The model in eval mode (its training flag restored after), and `batches` to iterate, behind a progress
        bar when `progress` (None: `show_progress`, else only for more than 8 batches)."""
        if progress is None:
            progress = self.show_progress if self.show_progress is not None else len(batches) > 8
        iterator: Any = batches
        if progress:
            from tqdm.auto import tqdm

            iterator = tqdm(batches, desc="Scoring", unit="batch")
        was_training = self.model.training
        self.model.eval()
        try:
            yield iterator
        finally:
            self.model.train(was_training)
