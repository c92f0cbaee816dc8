"""Training forwards of bounded size (`pack_max_tokens`): the packed and KV layouts' collators cut a micro-batch with
more tokens into `chunks` of consecutive records (the layouts that `cuts_chunks`: `trl_rm_env.sharing.layouts`);
this mixin of `RankedRewardTrainer` runs one forward and backward per chunk in the same step, each chunk's loss
weighted by its share of the pairs, so the step's loss and gradients are the whole micro-batch's.

Across processes every batch runs as many forwards on every process (ZeRO-3 and FSDP gather each layer's weights in
each forward, DDP syncs buffers): the chunk counts are gathered and the last chunk repeated, with weight 0, where a
process has fewer. Chunks before the last only accumulate gradients (no sync; under DeepSpeed, no optimizer step).
"""

from __future__ import annotations

import contextlib
import logging

import torch

from ..compat import checkpointing_enabled
from .loss import pair_layout, ranked_bradley_terry_loss, ranked_pairs
from .token_budget import training_token_budget

logger = logging.getLogger(__name__)

SCORES_OUT = "scores_out"
"""The input key of a forward's `ScoresOut`: transformers' `training_step` returns only the loss, so what
`compute_loss` scored comes back through the object handed in with the inputs."""


class ScoresOut:
    """Where `compute_loss` leaves what its forwards scored: `(detached scores, real tokens)` per forward, in order.
    Made by the caller of `training_step` (or `compute_loss`) for that call and handed in its inputs under
    `SCORES_OUT`; nothing of it stays on the trainer. (Not a list: transformers' `_prepare_inputs` copies lists.)"""

    def __init__(self) -> None:
        self.parts: list[tuple[torch.Tensor, object]] = []

    def add(self, scores: torch.Tensor, token_count: object) -> None:
        self.parts.append((scores.detach(), token_count))

    def joined(self, count: int | None = None) -> tuple[torch.Tensor, object]:
        """The scores of the first `count` forwards (all: None), concatenated, and their tokens summed."""
        parts = self.parts[:count]
        return torch.cat([s for s, _ in parts]), sum(t for _, t in parts)


class BoundedForwardsMixin:
    """`pack_max_tokens` for a `RewardTrainer` subclass whose `compute_loss` takes a chunk's `loss_weight` and leaves
    `(scores, token count)` in the `ScoresOut` of its inputs, and which records a step's metrics with
    `_log_train_metrics`."""

    def _check_forward_budget(self, user_collator) -> int | None:
        """The most tokens one training forward takes (`pack_max_tokens`), for the packed and KV layouts (the block-mask
        rows read it as their row length). Unset under the packed layout on CUDA: sized from the free memory
        (`training_token_budget`). Refused, naming why, where nothing would read it."""
        budget = self.args.pack_max_tokens
        if budget is not None and (user_collator is not None or not self._layout.shares_contexts):
            why = ("a data_collator was given (pack_max_tokens is read by ours)" if user_collator is not None
                   else "this model trains on the plain path (prefix_sharing resolved to no shared layout; see the log)")
            raise ValueError(f"pack_max_tokens={budget} bounds the forwards of the shared layouts, but {why}; "
                             "unset pack_max_tokens.")
        if budget is None and user_collator is None and self._layout.sized_from_memory and (
                self.args.device.type == "cuda"):
            budget = training_token_budget(self.accelerator.unwrap_model(self.model),
                                           checkpointing_enabled(self.args), self._compute_dtype(), self.args.device)
            logger.info("pack_max_tokens: %d tokens per packed training forward (from the GPU's free memory).", budget)
        return budget

    def _track_num_input_tokens(self, inputs):
        """Transformers' count of input tokens seen (`include_num_input_tokens_seen`), over every chunk of a batch cut
        by `pack_max_tokens` (their `input_ids` together): the same count, and the same collective on every process,
        as for a batch that fits."""
        if "chunks" in inputs and all("input_ids" in c for c in inputs["chunks"]):
            inputs = {"input_ids": torch.cat([c["input_ids"].reshape(-1) for c in inputs["chunks"]])[None]}
        return super()._track_num_input_tokens(inputs)

    def floating_point_ops(self, inputs) -> int:
        """Transformers' FLOP estimate (`total_flos`), summed over the chunks of a batch cut by `pack_max_tokens`."""
        if "chunks" in inputs:
            flops = super().floating_point_ops
            return sum(flops(c) for c in inputs["chunks"])
        return super().floating_point_ops(inputs)

    def _even_forwards(self) -> bool:
        """Whether every batch's forwards are counted across processes (`_forwards`): a forward budget cuts batches
        into chunks (the collator is a bounded one: ours with a `pack_max_tokens`), and processes must run as many
        forwards (ZeRO-3 and FSDP gather each layer's weights in each, DDP syncs buffers)."""
        collator = self.data_collator
        layout = getattr(collator, "layout", None)
        bounded = layout is not None and layout.cuts_chunks and bool(getattr(collator, "pack_max_tokens", None))
        return bounded and self.accelerator.num_processes > 1

    def _forwards(self, inputs) -> tuple[list[dict], int, list[int], int]:
        """The forwards of a batch: its chunks (the batch itself when it has none), the last one repeated where another
        process runs more (`_even_forwards`: their counts gathered, one bounded wait per batch); how many are real;
        the pairs of each real chunk; and the pairs of the whole step over all processes, divided by their number."""
        chunks = list(inputs["chunks"]) if "chunks" in inputs else [inputs]
        pairs = [ranked_pairs(c["ranks"], c["record_index"])[0].numel() if "ranks" in c
                 else len(c.get("score_index", c["input_ids"])) // 2 for c in chunks]  # TRL pairs: rows / 2
        real, total = len(chunks), float(sum(pairs))
        if self._even_forwards():
            counts = torch.tensor([[len(chunks), sum(pairs)]], device=self.args.device)
            gathered = self.accelerator.gather(counts)
            most, total = int(gathered[:, 0].max()), float(gathered[:, 1].sum()) / self.accelerator.num_processes
            chunks += [chunks[-1]] * (most - len(chunks))
        return chunks, real, pairs, total

    @contextlib.contextmanager
    def _accumulating(self, model):
        """A backward whose gradients only accumulate (a chunk before the last of a step): no gradient sync across
        processes and, under DeepSpeed (whose `backward` steps the optimizer at every boundary), no step."""
        if not self.accelerator.sync_gradients:  # the step's own micro-batch already defers (gradient accumulation)
            yield
            return
        if self.is_deepspeed_enabled:
            state = self.accelerator.gradient_state
            previous = state.sync_gradients
            state._set_sync_gradients(False)
            try:
                yield
            finally:
                state._set_sync_gradients(previous)
        else:
            with self.accelerator.no_sync(model):
                yield

    def _run_forwards(self, model, chunks: list[dict], extras: list[dict], real: int, num_items_in_batch,
                      drop: tuple[str, ...] = ("chunks",)):
        """One step's forwards and backwards: transformers' `training_step` on each chunk (its keys in `drop` left
        out, `extras[i]` added: a chunk's loss weighting), all but the last only accumulating gradients, each in the
        layout's attention. `(summed loss, the first `real` chunks' scores, their tokens)`: the one chunk loop of
        bounded forwards and window packing."""
        out, loss = ScoresOut(), 0.0
        for i, (chunk, extra) in enumerate(zip(chunks, extras)):
            with contextlib.nullcontext() if i == len(chunks) - 1 else self._accumulating(model):
                chunk = {k: v for k, v in chunk.items() if k not in drop}
                with self._layout.attention(model):
                    loss = loss + super().training_step(model, {**chunk, **extra, SCORES_OUT: out},
                                                        num_items_in_batch)
        scores, token_count = out.joined(real)
        return loss, scores, token_count

    def _chunked_training_step(self, model, inputs, num_items_in_batch):
        # The pair share is the global one, as in `compute_loss` (each process's gradients are averaged); a repeated
        # chunk weighs 0. Metrics once, over the whole batch, from each real chunk's detached scores and token count.
        chunks, real, pairs, total = self._forwards(inputs)
        weights = [n / total if total else 0.0 for n in pairs] + [0.0] * (len(chunks) - real)
        extras = [{"loss_weight": weight} for weight in weights]
        loss, scores, token_count = self._run_forwards(model, chunks, extras, real, num_items_in_batch)
        ranks, record_index = inputs.get("ranks"), inputs.get("record_index")
        if "score_order" in inputs:  # chunks of TRL pairs: every chosen, then every rejected
            scores = scores[inputs["score_order"].to(scores.device)]
        if ranks is None:  # TRL's pair layout
            ranks, record_index = pair_layout(scores.shape[0], scores.device)
        margin = inputs.get("margin")
        pairwise = ranked_bradley_terry_loss(
            scores, ranks.to(scores.device), record_index.to(scores.device),
            None if margin is None else margin.to(scores.device), self.args.center_rewards_coefficient,
        )
        self._log_train_metrics(scores, pairwise, record_index.to(scores.device), token_count)
        return loss
