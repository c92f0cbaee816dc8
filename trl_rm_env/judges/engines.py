"""What runs a judge: a causal LM in this process on transformers (`HFJudgeEngine`, the exact reference and the
no-vLLM path) or on vLLM (`VLLMJudgeEngine`), planned once (`plan_judge`, the engine chosen as for reward models).
The judge behind OpenAI-compatible servers is `trl_rm_env.judges.remote.RemoteJudgeEngine`.

Every engine answers the same two requests on prompts already rendered to token ids:

- `label_logprobs(prompts, label_ids)`: for each prompt, the full-vocabulary log-probability of each label token at
  the first generated position (one forward; vLLM's `logprob_token_ids`);
- `generate(prompts, max_new_tokens, temperature, seed)`: the judge's text (special tokens skipped).

Exactness: `HFJudgeEngine` pads on the left with an attention mask and positions counted from each prompt's first
token, so each prompt's last-position logits equal running it alone (fp32: < 1e-4, tested); vLLM's equal them too.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, PreTrainedModel

from ..distributed import shard_if_requested
from ..model_source import check_model_source
from ..options import changed, spelled
from ..scoring.loading import LOADING_OPTIONS, choose_engine, default_device, load_dtype, log_engine_choice
from ..scoring.options import ScoringOptions
from ..scoring.vllm import engine_arguments, start_llm
from ..sharing.planning import padded_batches

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class JudgePlan:
    """What judges and how, resolved once (`plan_judge`): the judge's checked path (None for a loaded model), the
    loaded model or None, its config, the options, the engine (`"vllm"` or `"hf"`) and why."""

    model: str | None
    loaded: PreTrainedModel | None
    config: Any
    options: ScoringOptions
    engine: str
    why: str


CAUSAL_SUFFIXES = ("ForCausalLM", "ForConditionalGeneration", "LMHeadModel")


def is_causal_lm(config: Any) -> bool:
    """Whether a config's architectures name a causal LM (a judge) rather than a reward model."""
    return any(a.endswith(CAUSAL_SUFFIXES) for a in getattr(config, "architectures", None) or [])


def _check_causal(config: Any, where: str) -> None:
    architectures = getattr(config, "architectures", None) or []
    if architectures and not is_causal_lm(config):
        raise ValueError(
            f"the judge {where} is a {', '.join(architectures)}, not a causal language model (*ForCausalLM): a judge "
            "writes its verdict. A reward model (*ForSequenceClassification) is RewardModelEnvironment's."
        )


def plan_judge(model: str | os.PathLike | PreTrainedModel, options: ScoringOptions) -> JudgePlan:
    """Check the judge's source and config and choose its engine, once (`choose_engine`, as for reward models:
    `auto` is vLLM where it is installed and one process runs, else transformers).

    Raises:
        trl_rm_env.model_source.ModelSourceError: a missing local folder.
        ValueError: a model that is not a causal LM, an option of the engine not chosen, or a loading option with a
            model already loaded.
    """
    if isinstance(model, PreTrainedModel):
        loading = sorted(set(changed(options)) & LOADING_OPTIONS)
        if loading:
            raise ValueError(
                f"{spelled(ScoringOptions, loading)}: applied when a judge is loaded from its path; this one is already loaded"
            )
        if not type(model).__name__.endswith(CAUSAL_SUFFIXES):
            raise ValueError(
                f"the judge is a {type(model).__name__}, not a causal language model (*ForCausalLM): a judge writes its "
                "verdict. A reward model (*ForSequenceClassification) is RewardModelEnvironment's."
            )
        engine, why = choose_engine(options, hf_only="the judge is already loaded in this process")
        return JudgePlan(None, model, model.config, options, engine, why)
    path = check_model_source(str(model), "judge")
    config = AutoConfig.from_pretrained(path, trust_remote_code=options.trust_remote_code)
    _check_causal(config, path)
    engine, why = choose_engine(options)
    if engine == "hf" and why.startswith("several processes"):
        logger.warning("The judge is loaded on transformers in each of the processes (a copy per process): %s", why)
    return JudgePlan(path, None, config, options, engine, why)


def judge_tokenizer(plan: JudgePlan, tokenizer: Any = None) -> Any:
    """The judge's tokenizer: the one given, loaded from a path or id, or the model's own."""
    if tokenizer is None or isinstance(tokenizer, str | os.PathLike):
        source = tokenizer or plan.model or plan.loaded.config._name_or_path
        tokenizer = AutoTokenizer.from_pretrained(str(source), trust_remote_code=plan.options.trust_remote_code)
    return tokenizer


def load_judge_engine(plan: JudgePlan, tokenizer: Any) -> Any:
    """The engine of `plan`: `VLLMJudgeEngine`, or `HFJudgeEngine` (the judge's `tokenizer` pads and decodes)."""
    trust = plan.options.trust_remote_code
    log_engine_choice(plan.engine, plan.why)
    if plan.engine == "vllm":
        return VLLMJudgeEngine(plan.model, plan.config, plan.options)
    model = plan.loaded
    if model is None:
        device = plan.options.device if plan.options.device is not None else default_device()
        kwargs = {"dtype": load_dtype(plan.options.precision, device), "trust_remote_code": trust}
        model = AutoModelForCausalLM.from_pretrained(plan.model, **kwargs | (plan.options.model_init_kwargs or {}))
        model.requires_grad_(False)
        model.eval().to(device)
    engine = HFJudgeEngine(model, tokenizer, plan.options)
    # Under DeepSpeed ZeRO-3 (partitioned as it loads) or an FSDP2 launch (sharded here), each process holds a shard
    # between calls and gathers the weights for each call, as a reward model does.
    engine.sharding = shard_if_requested(model, None, logger)
    return engine


class HFJudgeEngine:
    """A causal-LM judge run by transformers in this process (left padding, micro-batches by `batch_size` rows and
    `max_tokens_per_batch` padded tokens, longest first).

    Args:
        model: The judge, a `*ForCausalLM` model.
        tokenizer: Its tokenizer (padding id, decoding).
        options: The `ScoringOptions` (`batch_size`, `max_tokens_per_batch`, `max_length`, `show_progress`).
    """

    name = "hf"
    is_async = False
    sharding = "none"  # `zero3` or `fsdp2` when the weights are sharded (`load_judge_engine`)

    def __init__(self, model: PreTrainedModel, tokenizer: Any, options: ScoringOptions | None = None):
        self.options = options = options or ScoringOptions()  # the one owner of the batch bounds
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
        self, prompts: Sequence[Sequence[int]], max_new_tokens: int, temperature: float, seed: int
    ) -> list[str]:
        """The judge's text for each prompt (greedy at temperature 0, else sampled with `seed`)."""
        out = [""] * len(prompts)
        sample = temperature > 0
        kwargs = {"do_sample": sample, "max_new_tokens": max_new_tokens, "pad_token_id": self.pad_token_id}
        kwargs |= (
            {"temperature": temperature, "top_p": 1.0, "top_k": 0}
            if sample
            else {"temperature": None, "top_p": None, "top_k": None}
        )
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.random.fork_rng(devices=[self.device] if self.device.type == "cuda" else []):
                torch.manual_seed(seed)
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
        options: The `ScoringOptions` (vLLM's: `precision`, `max_length`, `max_tokens_per_batch`, `batch_size`,
            `prefix_sharing`, `vllm_gpu_memory_utilization`, `vllm_tensor_parallel_size`, `trust_remote_code`).
    """

    name = "vllm"
    is_async = False
    model, sharding = None, "none"

    @property
    def device(self) -> str:
        from ..scoring.vllm import vllm_device

        return vllm_device()

    def __init__(self, model: str, config: Any, options: ScoringOptions | None = None):
        options = options or ScoringOptions()
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
        self, prompts: Sequence[Sequence[int]], max_new_tokens: int, temperature: float, seed: int
    ) -> list[str]:
        """The judge's text for each prompt (greedy at temperature 0, else sampled with `seed`)."""
        from vllm import SamplingParams

        params = SamplingParams(
            max_tokens=max_new_tokens, temperature=temperature, seed=seed, skip_special_tokens=True
        )
        return [result.outputs[0].text for result in self._run(prompts, params)]

    def close(self) -> None:
        """Stop vLLM's engine processes now."""
        from ..scoring.vllm import _shutdown

        engine_core = getattr(getattr(self.llm, "llm_engine", None), "engine_core", None)
        if engine_core is not None:
            _shutdown(engine_core)
