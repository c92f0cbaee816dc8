"""Any model we run for rewards, run by vLLM in this process on our token ids: one class for both kinds of model.

- a reward model: vLLM's offline pooling runner (`classify`). Everything before the forward pass stays ours
  (`RewardScorer`): the RM's own chat template, the duplicate-BOS rule, special-token text in content encoded as
  text, left truncation and the over-length policy. vLLM gets the resulting token ids as `TokensPrompt`s and returns
  the raw outputs of the classification head (`use_activation=False`), every label of a regression RM included;
- a judge: vLLM's generate runner (`LLM.generate`): a label's full-vocabulary log-probability at the first generated
  position (`logprob_token_ids`), or the judge's text, each prompt sampled with its seed.

Its automatic prefix caching encodes a GRPO group's shared prompt (a judge's instruction) once, as our KV path does,
and its continuous batching replaces our micro-batches (`max_tokens_per_batch` becomes vLLM's
`max_num_batched_tokens`, `batch_size` its `max_num_seqs`). Start-up, arguments and memory: `trl_rm_env.runtime.vllm`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from ..model_options import ModelOptions
from ..vllm import engine_arguments, start_llm, stop_llm, vllm_device
from .contract import GeneratesHere, Sampling

RUNNERS = {"reward": "pooling", "judge": "generate"}
"""vLLM's runner for each kind of model (`ModelPlan.kind`)."""


class VLLMEngine(GeneratesHere):
    """Forward passes of a model in vLLM: a reward model's outputs (pooling runner, `classify`), or a judge's label
    log-probabilities and text (generate runner).

    Args:
        model: Local folder or Hub id of the model (vLLM loads the weights itself).
        config: The model's `transformers` config (a reward model's `num_labels` is the width of the outputs).
        options: The `ModelOptions` (a reward model's `ScoringOptions`): those of `VLLM_ENGINE_OPTIONS` become vLLM's
            arguments (`engine_arguments`), `show_progress` its progress bar over requests (None: only for more
            than 256 sequences).
        kind: `"reward"` or `"judge"` (`ModelPlan.kind`): vLLM's runner, and which calls it answers.
        engine_kwargs: More keyword arguments for `vllm.LLM` (they win over the ones above).

    Raises:
        ImportError: vLLM is not installed (`pip install "trl-rm-env[vllm]"`; on CPU see docs/environment.md).
    """

    name = "vllm"
    is_async = False
    model, sharding = None, "none"  # vLLM holds the weights

    def __init__(
        self,
        model: str,
        config: Any,
        options: ModelOptions | None = None,
        *,
        kind: str = "reward",
        engine_kwargs: dict[str, Any] | None = None,
    ):
        options = options or ModelOptions()
        kwargs = engine_arguments(config, options, runner=RUNNERS[kind])
        self.config, self.kind = config, kind
        self.num_labels = int(getattr(config, "num_labels", 1))
        self.show_progress = options.show_progress
        self.max_length = kwargs.get("max_model_len")
        kwargs = {**kwargs, **(engine_kwargs or {})}
        # vLLM's prefix caching shares contexts itself (it needs no context lengths from us): on unless
        # `prefix_sharing=False` (`engine_arguments`, the one place it is decided).
        self.prefix_sharing = bool(kwargs.get("enable_prefix_caching"))
        self.llm = start_llm(model, kwargs, self)

    @property
    def device(self) -> torch.device:
        """The device vLLM runs on (a type torch does not know: the CPU, for where a reward function was built)."""
        try:
            return torch.device(vllm_device())
        except RuntimeError:
            return torch.device("cpu")

    def _progress(self, count: int, progress: bool | None = None) -> bool:
        if progress is None:
            progress = self.show_progress if self.show_progress is not None else count > 256
        return bool(progress)

    @staticmethod
    def _prompts(sequences: Sequence[Sequence[int]]) -> list[Any]:
        from vllm.inputs import TokensPrompt

        return [TokensPrompt(prompt_token_ids=[int(t) for t in ids]) for ids in sequences]

    # ------------------------------------------------------------------ a reward model
    def outputs(
        self, sequences: Sequence[Sequence[int]], context_lengths: Sequence[int] | None = None, progress: bool | None = None
    ) -> torch.Tensor:
        """`(N, num_labels)` fp32 outputs (CPU, input order) of `sequences`: the classification head's raw values,
        as `HFEngine` returns them. `context_lengths` is not needed: vLLM finds shared prefixes itself."""
        from vllm import PoolingParams

        out = torch.empty(len(sequences), self.num_labels, dtype=torch.float32)
        if not sequences:
            return out
        results = self.llm.classify(
            self._prompts(sequences),
            pooling_params=PoolingParams(use_activation=False),
            use_tqdm=self._progress(len(sequences), progress),
        )
        for i, result in enumerate(results):
            out[i] = torch.as_tensor(result.outputs.probs, dtype=torch.float32)
        return out

    # ------------------------------------------------------------------ a judge
    def _generated(self, prompts: Sequence[Sequence[int]], params: Any) -> list[Any]:
        if not prompts:
            return []
        return self.llm.generate(self._prompts(prompts), params, use_tqdm=self._progress(len(prompts)))

    def label_logprobs(
        self, prompts: Sequence[Sequence[int]], label_ids: Sequence[int], labels: Sequence[str] = ()
    ) -> list[list[float]]:
        """Each prompt's full-vocabulary log-probabilities of `label_ids` at its next position."""
        from vllm import SamplingParams

        params = SamplingParams(max_tokens=1, temperature=0.0, logprob_token_ids=[int(t) for t in label_ids])
        out = []
        for result in self._generated(prompts, params):
            step = result.outputs[0].logprobs[0]
            out.append([step[t].logprob if t in step else float("-inf") for t in label_ids])
        return out

    def _sample(self, sampling: Sampling) -> list[str]:
        """`generate`'s text: greedy at temperature 0, else sampled with the prompt's seed."""
        from vllm import SamplingParams

        params = [
            SamplingParams(
                max_tokens=sampling.max_new_tokens, temperature=sampling.temperature, top_p=sampling.top_p,
                seed=int(seed), skip_special_tokens=True,
            )
            for seed in sampling.seeds
        ]  # fmt: skip
        return [result.outputs[0].text for result in self._generated(sampling.prompts, params)]

    def close(self) -> None:
        """Stop vLLM's engine processes now (they also stop when this object is garbage collected or at exit)."""
        stop_llm(self.llm)
