"""The reward model run by transformers in this process: the exact reference engine, and the one training uses.

An engine turns token ids into the model's outputs, `(N, num_labels)` fp32 in input order; everything around it
(templates, truncation, fallbacks, the reward of the outputs) is the `RewardScorer`'s. This one holds the layout
chosen once from `prefix_sharing` (`trl_rm_env.sharing.layouts`), which plans the micro-batches and runs each: plain
(longest first, within `batch_size` rows and `max_tokens_per_batch` padded tokens), KV (for the items that share a
context, the context once with a KV cache and the completions against it), or, on a GPU (or with
`prefix_sharing="packed"`), packed: ONE padding-free row of up to `max_tokens_per_batch` tokens per micro-batch
(default: sized from the device's free memory, `device_token_budget`), each prompt of a group once.

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
from ..sharing import scoring_mode
from ..sharing.layouts import Sizing, scoring_layout
from ..sharing.mode import forces_sharing
from ..sharing.planning import linear_to_attention_cost, padded_batches


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
        tokens of each are its context) the items that share one may be scored against it (`prefix_sharing`). The
        layout plans the forward passes and runs each (`Layout.plan_scoring`, `Layout.score_pass`)."""
        sizing = Sizing(
            rows=self.options.rows_per_pass(),
            tokens=self.options.max_tokens_per_batch,
            row_sequences=self.options.batch_size,
            always_share=forces_sharing(self.prefix_sharing),
            cost_ratio=self.cost_ratio,
        )
        outputs = torch.empty(len(sequences), self.num_labels, dtype=torch.float32)
        passes = self.layout.plan_scoring(self.model, sequences, context_lengths, sizing)
        with self._in_eval_mode(passes, progress) as iterator:
            for scoring_pass in iterator:
                values = scoring_pass.run(self.model, sequences, self.pad_token_id, sizing)
                outputs[torch.tensor(scoring_pass.items)] = values.float().cpu()
        return outputs

    def plan_batches(self, lengths: Sequence[int]) -> list[list[int]]:
        """Group item indices into padded micro-batches: longest first, within `batch_size` rows and the token
        budget (the plain layout's passes)."""
        return padded_batches(lengths, self.options.rows_per_pass(), self.options.max_tokens_per_batch)

    @contextlib.contextmanager
    def _in_eval_mode(self, batches: list[Any], progress: bool | None) -> Iterator[Any]:
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
