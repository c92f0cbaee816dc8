"""`RewardModelEnvironment`: the reward model loaded in this process (sharded under ZeRO-3 or FSDP2), scored by
`RewardScorer`; `trl_rm_env.environment` says what the reward function does.
"""

from __future__ import annotations

import inspect
import logging
import os
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from transformers import AutoConfig, PreTrainedModel, PreTrainedTokenizerBase

from ..distributed import full_weights, shard_if_requested
from ..heads import regression_reward_weights
from ..model_source import check_model_source
from ..scoring.loading import load_reward_model, scorer_on_chosen_engine
from ..scoring.options import ScoringOptions
from ..scoring.scorer import RewardScorer, as_pairs
from . import nemo
from .rewards import Ids, RewardFunction, Samples, check_postprocessing

logger = logging.getLogger(__name__)


class RewardModelEnvironment(RewardFunction):
    """A reward model wrapped as a GRPO reward function (TRL's reward-function signature).

    Args:
        model: A Hub id or local path of a `*ForSequenceClassification` checkpoint, or a loaded model.
        tokenizer: The RM's tokenizer, or a path/id to load it from. Defaults to the model's own.
        options, **scoring_options: How the RM scores (`trl_rm_env.scoring.ScoringOptions`), an instance and/or by
            name: `batch_size` (sequences per forward pass, default 32 unless `max_tokens_per_batch` is set),
            `max_tokens_per_batch` (token budget per forward pass, padding included: bounds memory whatever the
            batch), `max_length` (longest sequence the RM reads, default its `max_position_embeddings`),
            `truncation` (`"left"` cuts over-long contexts from the left, never the completion; `"fallback"` gives
            over-long items `overlength_reward`), `overlength_reward` (None raises an error instead),
            `nonfinite_reward` (the reward if the RM returns NaN/inf, warned once with the count, counted in
            `num_nonfinite` and `reward_model_env/num_nonfinite`; None raises an error naming the samples),
            `strip_reasoning`, `show_progress`, `prefix_sharing` (below), `template_kwargs`, and `engine` (`"auto"`,
            `"vllm"`, `"hf"`: what runs the RM, see `trl_rm_env.scoring.loading.choose_engine`; `self.engine` says
            which runs) with vLLM's `vllm_gpu_memory_utilization` (default: a KV cache of what scoring needs) and
            `vllm_tensor_parallel_size`.
        empty_completion_reward: Reward for empty or whitespace-only completions (judged after `strip_reasoning`,
            so a completion that is only reasoning counts as empty). None (default) scores them with the RM like any
            other answer (an empty assistant turn); their count is logged as `reward_model_env/num_empty`.
        strip_reasoning (scoring option): Remove `<think>...</think>` from completions before scoring.
        precision: `fp32` (default), `bf16` or `fp16` for a model loaded here. Rewards are always returned as fp32.
        normalization: `none`; `running` (running mean/std of all rewards so far); `checkpoint` (the
            `reward_mean`/`reward_std` that `RankedRewardTrainer` saved into the model config).
        clip: If set, rewards (after normalization) are clipped to `[-clip, clip]`.
        name: The reward function's `__name__`: TRL logs `rewards/<name>/mean`. Our own metrics are logged under
            `reward_model_env/*`.
        device: Where the RM runs. Default: the device of the current Accelerate process (the policy's device).
        model_init_kwargs: Extra `from_pretrained` keyword arguments for a model loaded here.
        trust_remote_code: Allow custom model code from the Hub (off by default).
        show_progress (scoring option): Progress bar over batches. None: only in `score()` on long lists, never
            inside training.
        prefix_sharing (scoring option): Score the completions of a GRPO group against one encoding of their prompt: the prompt goes
            through the RM once with a KV cache and the G completions run against it (same scores as scoring each
            alone; no mask over a whole row; eager, SDPA or FlashAttention-2). `"auto"` (default): where the RM
            supports it and a cost model says it pays (prompt long enough against the completions and the group
            size), else the plain path, logged once. `True`: every group that shares tokens; `False`: never.
        fsdp_shard: Shard the RM across the processes with FSDP2 `fully_shard` (each rank keeps 1/world_size of
            the weights between reward calls and gathers them for one call at a time). None (default): when the
            Accelerate config is FSDP version 2 and several processes run. Under DeepSpeed ZeRO-3 the RM is
            partitioned by `zero.Init` instead. `self.sharding` says which applies: `none`, `zero3` or `fsdp2`.
        remote_url: Score on reward-model servers instead (`trl-rm-env serve`, or vLLM `--runner pooling`): one
            URL or a list. `RewardModelEnvironment(remote_url=...)` then builds a `RemoteRewardModelEnvironment`
            (async `__call__`, retries, the same metrics); `model` is the model name sent to the server, and
            `remote_api` (`pooling`/`classify`/`openrlhf`) and `api_key` pick the server's dialect and key.
    """

    _remote_class: type | None = None  # what `remote_url=` builds: the subclass declared with `remote=True`

    def __init_subclass__(cls, remote: bool = False, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if remote:
            RewardModelEnvironment._remote_class = cls

    def __new__(cls, *args: Any, remote_url: str | Sequence[str] | None = None, **kwargs: Any):
        if cls is RewardModelEnvironment and remote_url is not None and cls._remote_class is not None:
            return object.__new__(cls._remote_class)
        return object.__new__(cls)

    def __init__(
        self,
        model: str | os.PathLike | PreTrainedModel,
        tokenizer: str | os.PathLike | PreTrainedTokenizerBase | None = None,
        *,
        options: ScoringOptions | None = None,
        empty_completion_reward: float | None = None,
        precision: str = "fp32",
        normalization: str = "none",
        clip: float | None = None,
        name: str = "reward_model_env",
        device: str | torch.device | None = None,
        model_init_kwargs: dict[str, Any] | None = None,
        trust_remote_code: bool = False,
        remote_url: str | Sequence[str] | None = None,
        attribute_weights: Mapping[str, float] | Sequence[float] | None = None,
        fsdp_shard: bool | None = None,
        **scoring_options: Any,
    ):
        if remote_url is not None:
            raise TypeError(f"{type(self).__name__} scores locally; use RemoteRewardModelEnvironment for remote_url.")
        check_postprocessing(normalization, clip)  # before anything loads
        options = ScoringOptions.build(options, **scoring_options)
        scorer = None
        if isinstance(model, str | os.PathLike):  # a path or Hub id: vLLM can load it (`choose_engine`)
            path = check_model_source(str(model), "reward model")
            config = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
            # A regression RM (RegressionRewardTrainer) predicts several attributes: the reward is their weighted sum.
            resolved = regression_reward_weights(config, attribute_weights)
            options = ScoringOptions.build(options, output_weights=resolved[1] if resolved else None)
            hf_only = "fsdp_shard=True shards a transformers model" if fsdp_shard else None
            if model_init_kwargs:
                hf_only = f"model_init_kwargs {sorted(model_init_kwargs)} are transformers loading arguments"
            scorer = scorer_on_chosen_engine(
                model, tokenizer, options, precision=precision, device=device, trust_remote_code=trust_remote_code,
                hf_only=hf_only,
            )  # fmt: skip
        if scorer is None:
            model, tokenizer = load_reward_model(
                model,
                tokenizer,
                precision=precision,
                device=device,
                trust_remote_code=trust_remote_code,
                model_init_kwargs=model_init_kwargs,
            )
            resolved = regression_reward_weights(model.config, attribute_weights)
            options = ScoringOptions.build(options, output_weights=resolved[1] if resolved else None)
            scorer = RewardScorer(model, tokenizer, options)
        attributes, weights = resolved if resolved is not None else ([], None)
        self.attribute_weights = weights
        self.model = scorer.model  # None when vLLM holds the weights
        self.tokenizer = scorer.tokenizer
        self.engine = scorer.engine.name  # "hf" or "vllm"
        self.sharding = shard_if_requested(self.model, fsdp_shard, logger) if self.model is not None else "none"
        self.show_progress = options.show_progress
        config = scorer.config
        mean, std = getattr(config, "reward_mean", None), getattr(config, "reward_std", None)
        self._setup(
            scorer,
            name=name,
            normalization=normalization,
            clip=clip,
            empty_completion_reward=empty_completion_reward,
            strip_reasoning=options.strip_reasoning,
            checkpoint_stats=(float(mean), float(std)) if mean is not None and std is not None else None,
            attributes=attributes,
        )

    @classmethod
    def from_config(cls, config: Mapping[str, Any], **overrides: Any) -> RewardModelEnvironment:
        """Build from a NeMo RL `env.reward_model` block (plus any of our own keyword arguments); see
        `trl_rm_env.environment.nemo` for what is mapped, ignored and refused.
        """
        model, tokenizer, kwargs, tokenizer_cfg = nemo.environment_arguments(config, cls.argument_names())
        if tokenizer_cfg.get("chat_template_kwargs"):
            kwargs["template_kwargs"] = dict(tokenizer_cfg["chat_template_kwargs"])
        env = cls(model, tokenizer, **{**kwargs, **overrides})
        if "chat_template" in tokenizer_cfg:
            if env.tokenizer is None:  # remote, sending messages: the server renders them with its own template
                raise ValueError(
                    "tokenizer.chat_template is applied where conversations are rendered, here; with remote_url and "
                    "no reward-model tokenizer they go as messages that the server renders with its own template. "
                    "Give tokenizer.name (the reward model's tokenizer) so token ids are sent."
                )
            env.tokenizer.chat_template = nemo.nemo_chat_template(tokenizer_cfg["chat_template"], env.tokenizer)
        return env

    @classmethod
    def argument_names(cls) -> set[str]:
        """Every keyword argument of the environment: its own and the scoring options."""
        internal = {"self", "model", "tokenizer", "options", "scoring_options", "remote_url"}
        own = set(inspect.signature(RewardModelEnvironment.__init__).parameters) - internal
        return own | set(ScoringOptions.names())

    # ------------------------------------------------------------------ scoring
    def score(self, conversations: Sequence[Any]) -> torch.Tensor:
        """Raw RM scores (fp32 tensor, input order) of full conversations or `(context, completion)` pairs.

        No normalization, clipping or metrics: this is for offline use and evaluation.
        """
        contexts, completions = as_pairs(conversations)
        with full_weights(self.model, self.sharding), self._nonfinite_named(range(len(contexts)), "conversations"):
            return self.scorer.score(contexts, completions)

    def __call__(
        self, prompts: Samples, completions: Samples, completion_ids: Ids = None, **kwargs: Any
    ) -> list[float]:
        """TRL reward function: one float reward per `(prompt, completion)`."""
        empty, to_score, rewards = self._plan(prompts, completions)
        nonfinite: list[int] = []
        # Entered on every rank, even one with nothing to score: under ZeRO-3 and FSDP2 gathering is a collective.
        with full_weights(self.model, self.sharding):
            if to_score:
                with self._nonfinite_named(to_score, "completions") as nonfinite:
                    rewards[torch.tensor(to_score)] = self.scorer.score(
                        [prompts[i] for i in to_score],
                        [completions[i] for i in to_score],
                        progress=bool(self.show_progress),
                    )
        return self._finish(rewards, empty, kwargs.get("log_metric"), nonfinite=len(nonfinite))

    def __repr__(self) -> str:
        return f"RewardModelEnvironment(name={self.name!r}, model={self.scorer.config._name_or_path!r})"
