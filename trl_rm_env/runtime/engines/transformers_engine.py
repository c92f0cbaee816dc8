"""Any model we run for rewards, run by transformers in this process: the exact reference engine, and the no-vLLM
path. One class for both kinds of model (`ModelPlan.kind`):

- a reward model (`*ForSequenceClassification`): `outputs(sequences, context_lengths)`, the model's outputs,
  `(N, num_labels)` fp32 in input order; everything around it (templates, truncation, fallbacks, the reward of the
  outputs) is the `RewardScorer`'s. The engine holds the layout chosen once from `prefix_sharing`
  (`trl_rm_env.sharing.layouts`), which plans the micro-batches and runs each: plain (longest first, within
  `batch_size` rows and `max_tokens_per_batch` padded tokens), KV (for the items that share a context, the context
  once with a KV cache and the completions against it), or, on a GPU (or with `prefix_sharing="packed"`), packed:
  ONE padding-free row of up to `max_tokens_per_batch` tokens per micro-batch (default: sized from the device's free
  memory, `device_token_budget`), each prompt of a group once;
- a judge (`*ForCausalLM`): `label_logprobs(prompts, label_ids)`, each prompt's full-vocabulary log-probability of
  each label token at the first generated position (one forward), and `generate(prompts, max_new_tokens,
  temperature, seeds, top_p, keep_failures)`, the judge's text (special tokens skipped), on prompts already rendered
  to token ids, left-padded in micro-batches by `batch_size` rows and `max_tokens_per_batch` padded tokens.

Exactness: right padding with an attention mask leaves every real token's computation unchanged in a causal model,
and the classifier reads the last non-pad token, so each output equals running that sequence alone (fp32: < 1e-4,
proved by the parity tests); the shared path equals it to float rounding too. A judge's prompts are padded on the
left with positions counted from each prompt's first token, so each prompt's last-position logits equal running it
alone (fp32: < 1e-4, tested).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from ...sharing.layouts import Layout, Sizing, scoring_sharing
from ...sharing.planning import linear_to_attention_cost, padded_batches, shared_prefixes_in
from ..model_options import ModelOptions
from .contract import GeneratesHere, Sampling


class HFEngine(GeneratesHere):
    """Forward passes of a model loaded with transformers: a reward model's outputs, or a judge's label
    log-probabilities and text.

    Args:
        model: The model: a `*ForSequenceClassification` reward model or a `*ForCausalLM` judge (eval mode is set for
            each call, its training flag restored after).
        tokenizer: Its tokenizer: the padding id (its EOS where it has none) and a judge's decoding.
        options: The `ModelOptions` (a reward model's `ScoringOptions`) it reads, the one owner of each value
            (`batch_size`: rows per pass, or sequences per packed row; `max_tokens_per_batch`: tokens per forward
            pass, padding included, default sized from the device in the packed layout; `max_length`;
            `prefix_sharing`, a reward model's: `"auto"`, `True`, `False` or `"packed"`, see `trl_rm_env.sharing`,
            `False` where the model cannot share (logged once), `"auto"` and `True` run `"packed"` on an
            accelerator; `show_progress`: a bar over a reward model's batches, None only for more than 8).
        kind: `"reward"` or `"judge"` (`ModelPlan.kind`): which calls it answers; a judge shares no prefixes here.
        prefix_sharing: The mode its plan asks for (`ModelPlan.prefix_sharing`), resolved here once against the model
            (`sharing.scoring_sharing`: `self.sharing`, read on every call). None: a reward model's
            `options.prefix_sharing`, nothing for a judge (an engine built around a loaded model, `RewardScorer`).
    """

    name = "hf"
    is_async = False
    sharding = "none"  # `zero3` or `fsdp2` when the weights are sharded (`trl_rm_env.runtime.loading.load_engine`)

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer: Any,
        options: ModelOptions | None = None,
        *,
        kind: str = "reward",
        prefix_sharing: bool | str | None = None,
    ):
        self.model, self.tokenizer, self.kind = model, tokenizer, kind
        self.options = options = options or ModelOptions()
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.pad_token_id = int(pad if pad is not None else 0)
        self.max_length = options.longest_sequence(model.config)
        if prefix_sharing is None:  # a judge's prompts are its own: nothing shared here
            prefix_sharing = options.prefix_sharing if kind == "reward" else False
        self.sharing = scoring_sharing(model, prefix_sharing)
        self.cost_ratio = linear_to_attention_cost(getattr(model, "config", None))

    @property
    def prefix_sharing(self) -> bool | str:
        """The sharing mode that runs (the engine contract's, for logs and tests): `self.sharing.mode`."""
        return self.sharing.mode

    @property
    def layout(self) -> Layout:
        """The layout that plans and runs the forward passes: `self.sharing.layout`."""
        return self.sharing.layout

    @property
    def num_labels(self) -> int:
        return self.model.config.num_labels

    def close(self) -> None:
        """Nothing to stop: the model is this process's, freed with the engine (the `Engine` contract's `close`)."""

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    # ------------------------------------------------------------------ a reward model
    @torch.inference_mode()
    def outputs(
        self, sequences: Sequence[Sequence[int]], context_lengths: Sequence[int] | None = None, progress: bool | None = None
    ) -> torch.Tensor:
        """`(N, num_labels)` fp32 outputs (CPU, input order) of `sequences`; with `context_lengths` (how many leading
        tokens of each are its context) the items that share one may be scored against it (`prefix_sharing`);
        without them, the prefixes the sequences share are found in their ids (`shared_prefixes_in`: a server's
        token-id requests). The layout plans the forward passes and runs each (`Layout.plan_scoring`,
        `Layout.score_pass`)."""
        sharing = self.sharing
        if context_lengths is None and sharing.mode is not False and len(sequences) > 1:
            context_lengths = shared_prefixes_in(sequences, self.cost_ratio, always=sharing.always)
        sizing = Sizing(
            rows=self.options.rows_per_pass(),
            tokens=self.options.max_tokens_per_batch,
            row_sequences=self.options.batch_size,
            always_share=sharing.always,
            cost_ratio=self.cost_ratio,
        )
        outputs = torch.empty(len(sequences), self.num_labels, dtype=torch.float32)
        passes = sharing.layout.plan_scoring(self.model, sequences, context_lengths, sizing)
        with self._in_eval_mode(), self._progress(passes, progress) as iterator:
            for scoring_pass in iterator:
                values = scoring_pass.run(self.model, sequences, self.pad_token_id, sizing)
                outputs[torch.tensor(scoring_pass.items)] = values.float().cpu()
        return outputs

    def wave_bounds(self) -> tuple[int | None, int | None]:
        """`(tokens, sequences)` one forward pass of a scoring call holds at most (`Layout.pass_bounds`): the size of
        the waves an overlapped call encodes ahead (`trl_rm_env.scoring.overlap`)."""
        sizing = Sizing(rows=self.options.rows_per_pass(), tokens=self.options.max_tokens_per_batch,
                        row_sequences=self.options.batch_size, always_share=False, cost_ratio=self.cost_ratio)
        return self.sharing.layout.pass_bounds(self.model, sizing)

    def plan_batches(self, lengths: Sequence[int]) -> list[list[int]]:
        """Group item indices into padded micro-batches: longest first, within `batch_size` rows and the token
        budget (the plain layout's passes, and a judge's)."""
        return padded_batches(lengths, self.options.rows_per_pass(), self.options.max_tokens_per_batch)

    # ------------------------------------------------------------------ a judge
    @torch.inference_mode()
    def label_logprobs(
        self, prompts: Sequence[Sequence[int]], label_ids: Sequence[int], labels: Sequence[str] = ()
    ) -> list[list[float]]:
        """Each prompt's full-vocabulary log-probabilities of `label_ids` at its next position."""
        out: list[list[float]] = [[] for _ in prompts]
        columns = torch.tensor(list(label_ids), dtype=torch.long)
        with self._in_eval_mode():
            for batch in self.plan_batches([len(p) for p in prompts]):
                inputs = self._left_padded([prompts[i] for i in batch])
                positions = (inputs["attention_mask"].cumsum(-1) - 1).clamp(min=0)
                logits = self.model(**inputs, position_ids=positions, use_cache=False, logits_to_keep=1).logits
                logprobs = torch.log_softmax(logits[:, -1].float(), dim=-1).cpu()[:, columns]
                for row, i in enumerate(batch):
                    out[i] = logprobs[row].tolist()
        return out

    @torch.inference_mode()
    def _sample(self, sampling: Sampling) -> list[str]:
        """`generate`'s text: greedy at temperature 0, else sampled from one random stream seeded with the first of
        the seeds (every prompt, a repeated one included, draws its own sample)."""
        prompts, max_new_tokens, seeds = sampling.prompts, sampling.max_new_tokens, sampling.seeds
        out = [""] * len(prompts)
        sample = sampling.temperature > 0
        kwargs = {"do_sample": sample, "max_new_tokens": max_new_tokens, "pad_token_id": self.pad_token_id}
        kwargs |= (
            {"temperature": sampling.temperature, "top_p": sampling.top_p, "top_k": 0}
            if sample
            else {"temperature": None, "top_p": None, "top_k": None}
        )
        with self._in_eval_mode(), torch.random.fork_rng(devices=[self.device] if self.device.type == "cuda" else []):
            torch.manual_seed(int(seeds[0]) if len(seeds) else 0)
            for batch in self.plan_batches([len(p) + max_new_tokens for p in prompts]):
                inputs = self._left_padded([prompts[i] for i in batch])
                generated = self.model.generate(**inputs, **kwargs)[:, inputs["input_ids"].shape[1] :]
                for row, i in enumerate(batch):
                    out[i] = self.tokenizer.decode(generated[row], skip_special_tokens=True)
        return out

    def _left_padded(self, rows: list[Sequence[int]]) -> dict[str, torch.Tensor]:
        length = max(len(r) for r in rows)
        input_ids = torch.full((len(rows), length), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(rows), length), dtype=torch.long)
        for k, row in enumerate(rows):
            input_ids[k, length - len(row) :] = torch.as_tensor(list(row), dtype=torch.long)
            mask[k, length - len(row) :] = 1
        return {"input_ids": input_ids.to(self.device), "attention_mask": mask.to(self.device)}

    # ------------------------------------------------------------------ around every call
    @contextlib.contextmanager
    def _in_eval_mode(self) -> Iterator[None]:
        """The model in eval mode, its training flag restored after."""
        was_training = self.model.training
        self.model.eval()
        try:
            yield
        finally:
            self.model.train(was_training)

    @contextlib.contextmanager
    def _progress(self, batches: list[Any], progress: bool | None) -> Iterator[Any]:
        """`batches` to iterate, behind a progress bar when `progress` (None: `show_progress`, else only for more
        than 8 batches)."""
        if progress is None:
            progress = self.options.show_progress if self.options.show_progress is not None else len(batches) > 8
        if not progress:
            yield batches
            return
        from tqdm.auto import tqdm

        yield tqdm(batches, desc="Scoring", unit="batch")
