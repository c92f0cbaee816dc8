"""vLLM as the engine of a local reward model: vLLM's offline pooling runner (`classify`), fed with our token ids.

Everything before the forward pass stays ours (`RewardScorer`): the RM's own chat template, the duplicate-BOS rule,
special-token text in content encoded as text, left truncation and the over-length policy. vLLM gets the resulting
token ids as `TokensPrompt`s and returns the raw outputs of the classification head (`use_activation=False`), every
label of a regression RM included. Its automatic prefix caching encodes a GRPO group's shared prompt once, as our
KV path does, and its continuous batching replaces our micro-batches (`max_tokens_per_batch` becomes vLLM's
`max_num_batched_tokens`, `batch_size` its `max_num_seqs`). Start-up, arguments and memory: `trl_rm_env.runtime.vllm`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from ..runtime.model_options import ScoringOptions
from ..runtime.vllm import engine_arguments, start_llm, stop_llm, vllm_device


class VLLMEngine:
    """Forward passes of a `*ForSequenceClassification` reward model in vLLM (pooling runner, `classify`).

    Args:
        model: Local folder or Hub id of the reward model (vLLM loads the weights itself).
        config: The model's `transformers` config (its `num_labels` is the width of the outputs).
        options: The `ScoringOptions`: those of `VLLM_ENGINE_OPTIONS` become vLLM's arguments (`engine_arguments`),
            `show_progress` its progress bar over requests (None: only for more than 256 sequences).
        engine_kwargs: More keyword arguments for `vllm.LLM` (they win over the ones above).

    Raises:
        ImportError: vLLM is not installed (`pip install "trl-rm-env[vllm]"`; on CPU see docs/environment.md).
    """

    name = "vllm"
    prefix_sharing = False  # vLLM's prefix caching shares contexts itself: it needs no context lengths from us

    def __init__(
        self,
        model: str,
        config: Any,
        options: ScoringOptions | None = None,
        *,
        engine_kwargs: dict[str, Any] | None = None,
    ):
        options = options or ScoringOptions()
        kwargs = engine_arguments(config, options)
        self.config = config
        self.num_labels = int(getattr(config, "num_labels", 1))
        self.show_progress = options.show_progress
        self.max_length = kwargs.get("max_model_len")
        self.llm = start_llm(model, {**kwargs, **(engine_kwargs or {})}, self)
        self.device = torch.device(vllm_device() if vllm_device() in ("cuda", "cpu") else "cpu")

    def outputs(
        self,
        sequences: Sequence[Sequence[int]],
        context_lengths: Sequence[int] | None = None,
        progress: bool | None = None,
    ) -> torch.Tensor:
        """`(N, num_labels)` fp32 outputs (CPU, input order) of `sequences`: the classification head's raw values,
        as `HFEngine` returns them. `context_lengths` is not needed: vLLM finds shared prefixes itself."""
        from vllm import PoolingParams
        from vllm.inputs import TokensPrompt

        out = torch.empty(len(sequences), self.num_labels, dtype=torch.float32)
        if not sequences:
            return out
        if progress is None:
            progress = self.show_progress if self.show_progress is not None else len(sequences) > 256
        results = self.llm.classify(
            [TokensPrompt(prompt_token_ids=[int(t) for t in ids]) for ids in sequences],
            pooling_params=PoolingParams(use_activation=False),
            use_tqdm=bool(progress),
        )
        for i, result in enumerate(results):
            out[i] = torch.as_tensor(result.outputs.probs, dtype=torch.float32)
        return out

    def close(self) -> None:
        """Stop vLLM's engine processes now (they also stop when this object is garbage collected or at exit)."""
        stop_llm(self.llm)
