"""One forward per gradient accumulation window (`window_packing`), a mixin of `RankedRewardTrainer`.

transformers' training loop fetches an optimizer step's micro-batches together (`Trainer.get_batch_samples`), then
runs a forward and backward for each. Small forwards are launch-bound on a GPU (an 8-pair micro-batch at the 0.6B
width ran at a quarter of one large forward's tokens/s), so with `window_packing` the micro-batches of a window are
laid out together, as one batch of the layout, and run as few forwards as `pack_max_tokens` allows (consecutive
records under the budget: one forward where they all fit).

What stays as it was, exactly:

- the data loader still yields `per_device_train_batch_size` records a micro-batch (collated later: each is handed
  over as its examples, `WindowExamples`), so the epoch's micro-batch count, the sampler, the resumption and the
  window boundaries are transformers' own;
- the loop still sees `gradient_accumulation_steps` entries a window: every one but the last is a slot whose records
  run in the last one's forwards (no forward, loss 0, no FLOPs, no tokens counted), and the last runs the window, its
  backward synced as the last micro-batch's is (chunks before the last only accumulate);
- each pair keeps the weight it has in its own micro-batch: today a micro-batch's loss is the mean over its pairs (with
  `center_rewards_coefficient`'s term), weighted under several processes by its pairs' share of the micro-batch's
  pairs over all processes, then divided by the window's micro-batch count. Each pair of micro-batch m weighs
  `P / N_m` here (`P` processes, `N_m` the micro-batch's pairs over all of them, gathered once a window), and the
  loop divides by the count as before: the same loss and gradients;
- the metrics are recorded once per micro-batch from its own scores (`_log_train_metrics`, as many collectives as
  before), so the logged means are the same; the tokens counted are the window's, added with its last micro-batch.

Not the same: dropout draws (the forwards differ), the padding `pad_to_multiple_of` adds, and the collation moves
from the data loader's workers to the main process (once per window).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import torch

from .collator import is_pair_example, pair_to_ranked
from .loss import PairwiseOutput, ranked_bradley_terry_loss, ranked_pairs

logger = logging.getLogger(__name__)

WINDOW_EXAMPLES = "window_examples"
"""The key of a deferred micro-batch: its examples, collated with the rest of its window."""
WINDOW_SLOT = "window_slot"
"""The key of a window's micro-batch whose records run in the window's forwards (every entry but the last)."""
WINDOW_RECORDS = "window_records"
"""The key of a window's batch: `(M,)` records of each of its M micro-batches, in order."""


@dataclass
class WindowExamples:
    """A micro-batch's examples, as the data loader hands them over: no `to` and no `pin_memory`, so accelerate and
    the data loader pass them through untouched (a recursion over every token id would cost a call per token)."""

    examples: list[dict[str, Any]]


class DeferredCollation:
    """The train data loader's collate function under window packing: a micro-batch's examples, kept for its window
    (picklable, for data loader workers)."""

    def __call__(self, examples: list[dict[str, Any]]) -> dict[str, WindowExamples]:
        return {WINDOW_EXAMPLES: WindowExamples(list(examples))}


def weighted_pair_loss(pairwise: PairwiseOutput, scores: torch.Tensor, record_index: torch.Tensor,
                       record_weight: torch.Tensor, center_rewards_coefficient: float | None) -> torch.Tensor:
    """The sum over pairs of `w * (-log sigmoid(r_i - r_j - m) + c (r_i + r_j)^2)`, `w` the weight of the pair's record
    (`ranked_bradley_terry_loss`'s terms, each pair weighted instead of averaged)."""
    terms = pairwise.pair_losses
    if center_rewards_coefficient is not None:
        terms = terms + center_rewards_coefficient * (scores[pairwise.better] + scores[pairwise.worse]) ** 2
    weight = record_weight.to(device=terms.device, dtype=terms.dtype)[record_index[pairwise.better]]
    return (terms * weight).sum()


class WindowPackingMixin:
    """`window_packing` for `RankedRewardTrainer`, on `BoundedForwardsMixin`'s chunk loop (`_run_forwards`) and
    `_log_train_metrics`; `compute_loss` takes a chunk's `record_weight`."""

    _window_packing: bool = False

    def _check_window_packing(self, user_collator) -> bool:
        """Whether windows are packed: `"auto"` where the layout `packs_windows` (the packed layout) and a step has
        several micro-batches; `True` refused in one line where it cannot apply. Logged once."""
        asked = self.args.window_packing
        if asked is False:
            return False
        steps = self.args.gradient_accumulation_steps
        why = None
        if user_collator is not None:
            why = "a data_collator was given (the window is laid out by ours)"
        elif not self._layout.cuts_chunks:
            why = f"prefix_sharing resolved to the {self._layout.name} layout (windows are packed in the packed and KV layouts)"
        elif self.args.ensemble_heads > 1:
            why = f"ensemble_heads={self.args.ensemble_heads} weighs each head's pairs by its own resample"
        elif steps < 2:
            why = f"gradient_accumulation_steps={steps}: each optimizer step is one micro-batch already"
        if asked is True and why:
            raise ValueError(f"window_packing=True runs a gradient accumulation window's micro-batches together, but "
                             f"{why}; set window_packing to 'auto' or False.")
        if why or not (asked is True or self._layout.packs_windows):
            logger.debug("window_packing=%r: off (%s).", asked, why or f"the {self._layout.name} layout")
            return False
        logger.info("window_packing=%r: the %d micro-batches of each optimizer step run as few forwards as %s allows.",
                    asked, steps, f"pack_max_tokens={self._forward_budget}" if self._forward_budget else "one forward")
        return True

    # ------------------------------------------------------------------ the loop's hooks
    def get_train_dataloader(self):
        """transformers' train data loader, its micro-batches handed over as their examples (`DeferredCollation`)
        when windows are packed."""
        if not self._window_packing:
            return super().get_train_dataloader()
        collator = self.data_collator
        self.data_collator = DeferredCollation()
        try:
            return super().get_train_dataloader()
        finally:
            self.data_collator = collator

    def get_batch_samples(self, epoch_iterator, num_batches, device):
        """transformers' window of micro-batches; deferred ones become slots and, last, the window's batch."""
        batches, num_items = super().get_batch_samples(epoch_iterator, num_batches, device)
        if not batches or WINDOW_EXAMPLES not in batches[0]:
            return batches, num_items
        windows = [batch[WINDOW_EXAMPLES].examples for batch in batches]
        # Pairs as two-way records: the window's batch is in record order, each micro-batch's records together.
        examples = [pair_to_ranked(e) if is_pair_example(e) else e for window in windows for e in window]
        merged = self.data_collator(examples)
        merged[WINDOW_RECORDS] = torch.tensor([len(window) for window in windows])
        return [{WINDOW_SLOT: i} for i in range(len(batches) - 1)] + [merged], num_items

    def _track_num_input_tokens(self, inputs):
        if WINDOW_SLOT in inputs:  # its tokens are counted with the window's batch
            return None
        return super()._track_num_input_tokens(inputs)

    def floating_point_ops(self, inputs) -> int:
        if WINDOW_SLOT in inputs:
            return 0
        return super().floating_point_ops(inputs)

    # ------------------------------------------------------------------ the window's step
    def _window_training_step(self, model, inputs, num_items_in_batch):
        """A slot: nothing (loss 0). The window's batch: its forwards (the last repeated, weight 0, where another
        process runs more), each pair weighted as in its micro-batch; then each micro-batch's metrics."""
        if WINDOW_SLOT in inputs:
            return torch.zeros((), device=self.args.device)
        sizes = inputs[WINDOW_RECORDS].tolist()
        chunks = list(inputs["chunks"]) if "chunks" in inputs else [inputs]
        ranks, record_index = inputs["ranks"], inputs["record_index"]
        record_micro = torch.repeat_interleave(torch.arange(len(sizes)), torch.tensor(sizes))  # record -> micro-batch
        better, _ = ranked_pairs(ranks, record_index)
        local_pairs = torch.bincount(record_micro[record_index[better]], minlength=len(sizes))
        empty = (local_pairs == 0).nonzero().flatten().tolist()
        if empty:  # what the micro-batch's own loss raises
            raise ValueError(f"Micro-batch(es) {empty} of this accumulation window hold no strictly ordered pair (every "
                             "record's completions are tied).")
        processes, real = self.accelerator.num_processes, len(chunks)
        global_pairs = local_pairs
        if processes > 1:  # one collective a window: the forward counts and each micro-batch's pairs
            counts = torch.cat([torch.tensor([len(chunks)]), local_pairs])[None].to(self.args.device)
            gathered = self.accelerator.gather(counts).cpu()
            chunks += [chunks[-1]] * (int(gathered[:, 0].max()) - len(chunks))
            global_pairs = gathered[:, 1:].sum(0)
        record_weight = (processes / global_pairs.double())[record_micro]  # (B,): each pair's weight by its record
        extras, first = [], 0
        for i, chunk in enumerate(chunks):
            count = int(chunk["record_index"].max()) + 1
            if i < real:
                weight, first = record_weight[first:first + count], first + count
            else:  # a repeat: as many forwards as the other processes, adding nothing
                weight = torch.zeros(count, dtype=torch.float64)
            extras.append({"record_weight": weight})
        loss, scores, token_count = self._run_forwards(model, chunks, extras, real, num_items_in_batch,
                                                       drop=("chunks", WINDOW_RECORDS))
        self._log_window_metrics(scores, inputs, record_micro, len(sizes), token_count)
        return loss

    def _log_window_metrics(self, scores: torch.Tensor, inputs: dict, record_micro: torch.Tensor, micro_count: int,
                            token_count) -> None:
        """Each micro-batch's metrics from its own scores, as its own step would have recorded them."""
        device = scores.device
        ranks, record_index = inputs["ranks"].to(device), inputs["record_index"].to(device)
        margin = inputs.get("margin")
        completion_micro = record_micro.to(device)[record_index]
        for m in range(micro_count):
            rows = (completion_micro == m).nonzero().flatten()
            records = (record_micro == m).nonzero().flatten()
            first = int(records[0])
            local = record_index[rows] - first
            pairwise = ranked_bradley_terry_loss(
                scores[rows], ranks[rows], local, None if margin is None else margin[records].to(device),
                self.args.center_rewards_coefficient,
            )
            tokens = token_count if m == micro_count - 1 else 0  # the window's tokens, counted once
            self._log_train_metrics(scores[rows], pairwise, local, tokens)
