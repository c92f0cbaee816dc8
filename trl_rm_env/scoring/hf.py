"""The reward model run by transformers in this process: the exact reference engine, and the one training uses.

An engine turns token ids into the model's outputs, `(N, num_labels)` fp32 in input order; everything around it
(templates, truncation, fallbacks, the reward of the outputs) is the `RewardScorer`'s. This one plans micro-batches
(longest first, within `batch_size` rows and `max_tokens_per_batch` padded tokens) and runs them plainly, or, for the
items that share a context, the context once with a KV cache and the completions against it (`trl_rm_env.sharing`).
On a GPU (or with `prefix_sharing="packed"`) every micro-batch is instead ONE packed, padding-free row of up to
`max_tokens_per_batch` tokens (default: sized from the device's free memory, `device_token_budget`), each prompt of
a group once (`trl_rm_env.sharing.packed`).

Exactness: right padding with an attention mask leaves every real token's computation unchanged in a causal model,
and the classifier reads the last non-pad token, so each output equals running that sequence alone (fp32: < 1e-4,
proved by the parity tests); the shared path equals it to float rounding too.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from ..runtime.model_options import ScoringOptions
from ..sharing import (
    collate_shared_context,
    pack_groups,
    packed_scores,
    plan_passes,
    scoring_mode,
    share_plan,
    shared_context_scores,
)
from ..sharing.layouts import PACKED, scoring_layout
from ..sharing.mode import forces_sharing, packs_fast
from ..sharing.planning import greedy_batches, linear_to_attention_cost, padded_batches, plan_packed_rows

PACKED_CPU_TOKENS = 8192
"""Tokens per packed row under the block-mask kernel (the CPU's, or fp32) when no `max_tokens_per_batch` is set: its
mask grows with the square of the row."""
MIN_DEVICE_TOKENS, MAX_DEVICE_TOKENS = 16384, 131072
"""The bounds of a packed row's default token budget on an accelerator (`device_token_budget`)."""


def device_token_budget(model: torch.nn.Module, share: float = 0.5) -> int:
    """Tokens per packed forward on the model's accelerator, from its free memory, as vLLM sizes its cache: `share`
    of the free bytes over one token's transient activations in a decoder layer (hidden states, q/k/v with the
    gathered context keys, the MLP), within [`MIN_DEVICE_TOKENS`, `MAX_DEVICE_TOKENS`], a multiple of 1,024. Where
    the packed layout runs under its block mask (the CPU, fp32), `PACKED_CPU_TOKENS`. Measured at each call (the
    policy, its optimizer and vLLM may have taken memory since the reward model loaded)."""
    parameter = next(model.parameters())
    if not packs_fast(parameter.device, parameter.dtype):
        return PACKED_CPU_TOKENS
    config = model.config
    hidden = getattr(config, "hidden_size", 4096)
    heads = getattr(config, "num_attention_heads", 32)
    head_dim = getattr(config, "head_dim", None) or hidden // heads
    kv = (getattr(config, "num_key_value_heads", None) or heads) * head_dim
    ffn = getattr(config, "intermediate_size", None) or 4 * hidden
    per_token = parameter.element_size() * (4 * hidden + 2 * heads * head_dim + 6 * kv + 3 * ffn)
    free, _ = torch.cuda.mem_get_info(parameter.device)
    tokens = int(free * share / per_token) // 1024 * 1024
    return max(MIN_DEVICE_TOKENS, min(MAX_DEVICE_TOKENS, tokens))


class HFEngine:
    """Forward passes of a `*ForSequenceClassification` model loaded with transformers.

    Args:
        model: The reward model (eval mode is set for each call, its training flag restored after).
        pad_token_id: The tokenizer's padding id.
        options: The `ScoringOptions` it reads, the one owner of each value (`batch_size`: rows per pass, or
            sequences per packed row; `max_tokens_per_batch`: tokens per forward pass, padding included, default
            sized from the device in the packed layout; `prefix_sharing`: `"auto"`, `True`, `False` or `"packed"`,
            see `trl_rm_env.sharing`, `False` where the model cannot share (logged once), `"auto"` and `True` run
            `"packed"` on an accelerator; `show_progress`: a bar over batches, None only for more than 8).
    """

    name = "hf"

    def __init__(self, model: torch.nn.Module, pad_token_id: int, options: ScoringOptions):
        self.model = model
        self.pad_token_id = pad_token_id
        self.options = options
        self.prefix_sharing = scoring_mode(model, options.prefix_sharing)  # the mode that runs, for this model
        self.layout = scoring_layout(self.prefix_sharing)
        self.cost_ratio = linear_to_attention_cost(getattr(model, "config", None))

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
        if self.layout is PACKED:  # every micro-batch one padding-free row
            return self._packed_outputs(sequences, context_lengths, progress)
        if self.layout.shares_contexts and context_lengths is not None:  # against each shared context's KV cache
            return self._shared_outputs(sequences, context_lengths, progress)
        return self._plain_outputs(sequences, progress)

    def plan_batches(self, lengths: Sequence[int]) -> list[list[int]]:
        """Group item indices into micro-batches: longest first, within `batch_size` rows and the token budget."""
        return padded_batches(lengths, self.options.rows_per_pass(), self.options.max_tokens_per_batch)

    def _plain_outputs(self, sequences: Sequence[Sequence[int]], progress: bool | None) -> torch.Tensor:
        """`(N, num_labels)` fp32 outputs, one padded row per sequence."""
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
                logits = self.model(
                    input_ids=input_ids.to(self.device), attention_mask=attention_mask.to(self.device), use_cache=False
                ).logits
                outputs[torch.tensor(batch)] = logits.float().cpu()
        return outputs

    def _shared_outputs(
        self, sequences: Sequence[Sequence[int]], context_lengths: Sequence[int], progress: bool | None
    ) -> torch.Tensor:
        groups, plain = share_plan(sequences, context_lengths, forces_sharing(self.prefix_sharing), self.cost_ratio)
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
                inputs["prefix_chunks"] = plan_passes(prefix_lengths, self.options.rows_per_pass(), self.options.max_tokens_per_batch)
                own = inputs["completion_mask"].sum(1).tolist()
                context_of = [prefix_lengths[g] for g in inputs["group_index"].tolist()]
                inputs["completion_chunks"] = plan_passes(own, self.options.rows_per_pass(), self.options.max_tokens_per_batch, context_of)
                inputs = {k: (v.to(self.device) if torch.is_tensor(v) else v) for k, v in inputs.items()}
                values, _ = shared_context_scores(self.model, inputs, label_index=None)
                items = [i for _, members in chosen for i in members]
                outputs[torch.tensor(items)] = values.float().cpu()
        return outputs

    def _packed_outputs(
        self, sequences: Sequence[Sequence[int]], context_lengths: Sequence[int] | None, progress: bool | None
    ) -> torch.Tensor:
        """`(N, num_labels)` fp32 outputs, one packed row per micro-batch: every group sharing a context (all of
        them: with nothing padded, sharing never costs more) with its context once, the other items whole."""
        outputs = torch.empty(len(sequences), self.num_labels, dtype=torch.float32)
        if not sequences:
            return outputs
        if context_lengths is None:
            groups, plain = [], list(range(len(sequences)))
        else:
            groups, plain = share_plan(sequences, context_lengths, True, self.cost_ratio)
        lengths = [len(s) for s in sequences]
        units = [(p, members) for p, members in groups] + [(0, [i]) for i in plain]
        budget = self.options.max_tokens_per_batch or device_token_budget(self.model)
        rows = plan_packed_rows(units, lengths, budget, self.options.batch_size)
        with torch.inference_mode(), self._in_eval_mode(rows, progress) as iterator:
            for row in iterator:
                batch = pack_groups([[sequences[i] for i in items] for _, items in row], [p for p, _ in row],
                                    self.pad_token_id)
                batch = {k: (v.to(self.device) if torch.is_tensor(v) else v) for k, v in batch.items()}
                values, _ = packed_scores(self.model, batch, label_index=None)
                outputs[torch.tensor([i for _, items in row for i in items])] = values.float().cpu()
        return outputs

    def _plan_shared_batches(self, groups: list[tuple[int, list[int]]], sequences) -> list[list[int]]:
        """Batches of groups for the context pass: longest context first, at most `batch_size` contexts and
        `max_tokens_per_batch` padded context tokens, and every completion row able to fit the budget with the
        batch's longest context (`rows x (context + completion)`)."""
        order = sorted(range(len(groups)), key=lambda g: -groups[g][0])
        budget = self.options.max_tokens_per_batch

        def fits(current: list[int], g: int) -> bool:  # longest context first: the batch's longest is its first
            prefix = groups[current[0]][0]
            longest_own = max(len(sequences[i]) - groups[g][0] for i in groups[g][1])
            return budget is None or ((len(current) + 1) * prefix <= budget and prefix + longest_own <= budget)

        return greedy_batches(order, fits, self.options.rows_per_pass())

    @contextlib.contextmanager
    def _in_eval_mode(self, batches: list[list[int]], progress: bool | None) -> Iterator[Any]:
        """The model in eval mode (its training flag restored after), and `batches` to iterate, behind a progress
        bar when `progress` (None: `show_progress`, else only for more than 8 batches)."""
        if progress is None:
            progress = self.options.show_progress if self.options.show_progress is not None else len(batches) > 8
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
