"""What runs a judge: a causal LM in this process on transformers (`HFJudgeEngine`, the exact reference and the
no-vLLM path) or on vLLM (`VLLMJudgeEngine`), planned and loaded by the model runtime as a reward model is
(`trl_rm_env.runtime`: `plan_model(..., kind="judge")`, then `judge_engine`).
The judge behind OpenAI-compatible servers is `trl_rm_env.judges.remote.RemoteJudgeEngine`.

Every engine answers the same two requests on prompts already rendered to token ids:

- `label_logprobs(prompts, label_ids)`: for each prompt, the full-vocabulary log-probability of each label token at
  the first generated position (one forward; vLLM's `logprob_token_ids`);
- `generate(prompts, max_new_tokens, temperature, seeds, top_p, keep_failures)`: the judge's text (special tokens
  skipped), each prompt sampled with its seed; with `keep_failures`, a prompt whose request failed (servers only)
  answers None.

Exactness: `HFJudgeEngine` pads on the left with an attention mask and positions counted from each prompt's first
token, so each prompt's last-position logits equal running it alone (fp32: < 1e-4, tested); vLLM's equal them too.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import torch
from transformers import PreTrainedModel

from ..distributed import shard_if_requested
from ..runtime.loading import load_weights
from ..runtime.model_options import ModelOptions
from ..runtime.plan import ModelPlan, log_engine_choice
from ..runtime.vllm import engine_arguments, start_llm, stop_llm, vllm_device
from ..sharing.planning import padded_batches

logger = logging.getLogger(__name__)


def judge_engine(plan: ModelPlan, tokenizer: Any) -> HFJudgeEngine | VLLMJudgeEngine:
    """The engine of a judge's plan (`trl_rm_env.runtime.plan_model(..., kind="judge")`): `VLLMJudgeEngine`, or
    `HFJudgeEngine` on the weights `load_weights` loads (or the judge given loaded, as it is), its `tokenizer`
    padding and decoding."""
    log_engine_choice(plan)
    if plan.engine == "vllm":
        return VLLMJudgeEngine(plan.model, plan.config, plan.options)
    engine = HFJudgeEngine(plan.loaded if plan.loaded is not None else load_weights(plan), tokenizer, plan.options)
    # Under DeepSpeed ZeRO-3 (partitioned as it loads) or an FSDP2 launch (sharded here), each process holds a shard
    # between calls and gathers the weights for each call, as a reward model does.
    engine.sharding = shard_if_requested(engine.model, None, logger)
    return engine


class HFJudgeEngine:
    """A causal-LM judge run by transformers in this process (left padding, micro-batches by `batch_size` rows and
    `max_tokens_per_batch` padded tokens, longest first).

    Args:
        model: The judge, a `*ForCausalLM` model.
        tokenizer: Its tokenizer (padding id, decoding).
        options: The `ModelOptions` (`batch_size`, `max_tokens_per_batch`, `max_length`, `show_progress`).
    """

    name = "hf"
    is_async = False
    sharding = "none"  # `zero3` or `fsdp2` when the weights are sharded (`judge_engine`)

    def __init__(self, model: PreTrainedModel, tokenizer: Any, options: ModelOptions | None = None):
        self.options = options = options or ModelOptions()  # the one owner of the batch bounds
        self.model, self.tokenizer = model, tokenizer
        self.max_length = options.longest_sequence(model.config)
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.pad_token_id = int(pad if pad is not None else 0)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def _batches(self, prompts: Sequence[Sequence[int]], extra: int = 0) -> list[list[int]]:
        lengths = [len(p) + extra for p in prompts]
        return padded_batches(lengths, self.options.rows_per_pass(), self.options.max_tokens_per_batch)

    def _left_padded(self, rows: list[Sequence[int]]) -> dict[str, torch.Tensor]:
        length = max(len(r) for r in rows)
        input_ids = torch.full((len(rows), length), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(rows), length), dtype=torch.long)
        for k, row in enumerate(rows):
            input_ids[k, length - len(row) :] = torch.as_tensor(list(row), dtype=torch.long)
            mask[k, length - len(row) :] = 1
        return {"input_ids": input_ids.to(self.device), "attention_mask": mask.to(self.device)}

    @torch.inference_mode()
    def label_logprobs(
        self, prompts: Sequence[Sequence[int]], label_ids: Sequence[int], labels: Sequence[str] = ()
    ) -> list[list[float]]:
        """Each prompt's full-vocabulary log-probabilities of `label_ids` at its next position."""
        out: list[list[float]] = [[] for _ in prompts]
        labels = torch.tensor(list(label_ids), dtype=torch.long)
        was_training = self.model.training
        self.model.eval()
        try:
            for batch in self._batches(prompts):
                inputs = self._left_padded([prompts[i] for i in batch])
                positions = (inputs["attention_mask"].cumsum(-1) - 1).clamp(min=0)
                logits = self.model(**inputs, position_ids=positions, use_cache=False, logits_to_keep=1).logits
                logprobs = torch.log_softmax(logits[:, -1].float(), dim=-1).cpu()[:, labels]
                for row, i in enumerate(batch):
                    out[i] = logprobs[row].tolist()
        finally:
            self.model.train(was_training)
        return out

    @torch.inference_mode()
    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        max_new_tokens: int,
        temperature: float,
        seeds: Sequence[int],
        top_p: float = 1.0,
        keep_failures: bool = False,
    ) -> list[str]:
        """The judge's text for each prompt (greedy at temperature 0, else sampled from one random stream seeded with
        the first of `seeds`: every prompt, a repeated one included, draws its own sample). Nothing here fails by
        request, so `keep_failures` changes nothing."""
        out = [""] * len(prompts)
        sample = temperature > 0
        kwargs = {"do_sample": sample, "max_new_tokens": max_new_tokens, "pad_token_id": self.pad_token_id}
        kwargs |= (
            {"temperature": temperature, "top_p": top_p, "top_k": 0}
            if sample
            else {"temperature": None, "top_p": None, "top_k": None}
        )
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.random.fork_rng(devices=[self.device] if self.device.type == "cuda" else []):
                torch.manual_seed(int(seeds[0]) if len(seeds) else 0)
                for batch in self._batches(prompts, extra=max_new_tokens):
                    inputs = self._left_padded([prompts[i] for i in batch])
                    generated = self.model.generate(**inputs, **kwargs)[:, inputs["input_ids"].shape[1] :]
                    for row, i in enumerate(batch):
                        out[i] = self.tokenizer.decode(generated[row], skip_special_tokens=True)
        finally:
            self.model.train(was_training)
        return out


class VLLMJudgeEngine:
    """A causal-LM judge run by vLLM in this process (`LLM.generate` on our token ids; prefix caching shares a group's
    instruction and prompt across its judgements).

    Args:
        model: Local folder or Hub id of the judge.
        config: Its transformers config.
        options: The `ModelOptions` (vLLM's: `VLLM_ENGINE_OPTIONS`, `trl_rm_env.runtime.vllm`).
    """

    name = "vllm"
    is_async = False
    model, sharding = None, "none"

    @property
    def device(self) -> str:
        return vllm_device()

    def __init__(self, model: str, config: Any, options: ModelOptions | None = None):
        options = options or ModelOptions()
        arguments = engine_arguments(config, options, runner="generate")
        self.max_length = arguments.get("max_model_len")
        self.show_progress = options.show_progress
        self.llm = start_llm(model, arguments, self)

    def _run(self, prompts: Sequence[Sequence[int]], params: Any) -> list[Any]:
        from vllm.inputs import TokensPrompt

        if not prompts:
            return []
        progress = self.show_progress if self.show_progress is not None else len(prompts) > 256
        return self.llm.generate(
            [TokensPrompt(prompt_token_ids=[int(t) for t in p]) for p in prompts], params, use_tqdm=bool(progress)
        )

    def label_logprobs(
        self, prompts: Sequence[Sequence[int]], label_ids: Sequence[int], labels: Sequence[str] = ()
    ) -> list[list[float]]:
        """Each prompt's full-vocabulary log-probabilities of `label_ids` at its next position."""
        from vllm import SamplingParams

        params = SamplingParams(max_tokens=1, temperature=0.0, logprob_token_ids=[int(t) for t in label_ids])
        out = []
        for result in self._run(prompts, params):
            step = result.outputs[0].logprobs[0]
            out.append([step[t].logprob if t in step else float("-inf") for t in label_ids])
        return out

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        max_new_tokens: int,
        temperature: float,
        seeds: Sequence[int],
        top_p: float = 1.0,
        keep_failures: bool = False,
    ) -> list[str]:
        """The judge's text for each prompt (greedy at temperature 0, else sampled with the prompt's seed). Nothing
        here fails by request, so `keep_failures` changes nothing."""
        from vllm import SamplingParams

        params = [
            SamplingParams(
                max_tokens=max_new_tokens,
                temperature=temperature,
                top_p=top_p,
                seed=int(seed),
                skip_special_tokens=True,
            )
            for seed in seeds
        ]
        return [result.outputs[0].text for result in self._run(prompts, params)]

    def close(self) -> None:
        """Stop vLLM's engine processes now."""
        stop_llm(self.llm)
