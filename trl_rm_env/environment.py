"""`RewardModelEnvironment`: a reward model as the reward function of TRL's `GRPOTrainer`.

    from trl import GRPOTrainer
    from trl_rm_env import RewardModelEnvironment

    reward = RewardModelEnvironment("Skywork/Skywork-Reward-V2-Qwen3-0.6B", max_tokens_per_batch=16384)
    trainer = GRPOTrainer(model=..., reward_funcs=[reward], args=..., train_dataset=...)

It is a plain callable with TRL's reward signature `(prompts, completions, completion_ids=None, **kwargs)`, and a
stable `__name__` (TRL logs `rewards/<name>/mean`). Unlike passing the model to `GRPOTrainer` directly, it renders
each conversation with the RM's *own* chat template (policy and RM tokenizers may differ), strips a duplicated BOS
as the Skywork-Reward-V2 card does, scores in bounded micro-batches (no OOM on large generation batches),
left-truncates over-long contexts, and logs `reward_model_env/*` metrics. Scores equal one-at-a-time scoring with
the plain model (fp32, within 1e-4).
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from .data.schema import COMPLETION_ROLES, KNOWN_ROLES, bad_text, message_is_blank
from .distributed import FullWeights, fsdp_requested, fsdp_version, shard_reward_model
from .scoring.scorer import RewardScorer, _strip_completion, as_pairs

logger = logging.getLogger(__name__)

PRECISIONS = {
    "fp32": torch.float32,
    "float32": torch.float32,
    "bf16": torch.bfloat16,
    "bfloat16": torch.bfloat16,
    "fp16": torch.float16,
    "float16": torch.float16,
}
NORMALIZATIONS = ("none", "running", "checkpoint")

# NeMo RL `env.reward_model` keys that describe Ray/Megatron resources: accepted and ignored under Accelerate.
_NEMO_IGNORED_KEYS = {
    "enabled",
    "resources",
    "dtensor_cfg",
    "logprob_batch_size",
    "max_grad_norm",
    "offload_optimizer_for_logprob",
    "generation",
    "megatron_cfg",
    "make_sequence_length_divisible_by",
}
_OUR_KEYS = {
    "max_tokens_per_batch",
    "truncation",
    "overlength_reward",
    "nonfinite_reward",
    "empty_completion_reward",
    "strip_reasoning",
    "normalization",
    "clip",
    "name",
    "device",
    "show_progress",
    "prefix_sharing",
    "attribute_weights",
    "fsdp_shard",
}


def _check_content(value: Any, where: str, completion: bool = False) -> None:
    """Refuse, with one line naming `where` and the field, a sample that is not text or a list of messages with a
    string `role` and string `content` (an assistant message with `tool_calls`, a non-empty list of objects, may
    have `content` None or none at all, as in TRL's tool-calling rollouts and the data schema); for completions,
    also roles other than the data schema's `COMPLETION_ROLES`.

    A completion holds the policy's answer and, in a multi-turn tool-calling rollout, the tool results (TRL's
    GRPOTrainer appends `{"role": "tool", ...}` messages): a `user` or `system` turn in a completion would let a
    policy write the other side of the conversation, and any role outside `KNOWN_ROLES` is a typo or a foreign
    schema. Prompt roles are the chat template's business (it renders them or raises)."""
    if isinstance(value, str):
        return
    if isinstance(value, (list, tuple)):
        for j, message in enumerate(value):
            if not isinstance(message, Mapping):
                raise TypeError(f"{where}[{j}] must be a message with 'role' and 'content', got {message!r:.80}")
            tool_calls = message.get("tool_calls")
            if tool_calls is not None and (
                message.get("role") != "assistant"
                or not isinstance(tool_calls, list)
                or not all(isinstance(call, Mapping) for call in tool_calls)
            ):
                raise TypeError(
                    f"{where}[{j}].tool_calls must be a list of objects on an assistant message, got "
                    f"{type(tool_calls).__name__} on role {message.get('role')!r}"
                )
            if tool_calls and message.get("content") is None:  # a tool call without text
                if not isinstance(message.get("role"), str):
                    raise TypeError(f"{where}[{j}].role must be a string")
                continue
            for key in ("role", "content"):
                if key not in message:
                    raise TypeError(
                        f"{where}[{j}] must be a message with 'role' and 'content'; it has no {key!r} "
                        f"(keys: {sorted(map(str, message))})"
                    )
            if not isinstance(message["role"], str):
                raise TypeError(f"{where}[{j}].role must be a string, got {type(message['role']).__name__}")
            if not isinstance(message["content"], str):
                raise TypeError(
                    f"{where}[{j}].content must be a string, got {type(message['content']).__name__}. "
                    "Multimodal content is not supported by text reward models."
                )
            role = message["role"]
            if completion and role not in COMPLETION_ROLES:
                what = "a role a completion cannot hold" if role in KNOWN_ROLES else f"not a known role {KNOWN_ROLES}"
                raise ValueError(
                    f"{where}[{j}].role is {role!r}, {what}: a completion holds the policy's turns only (roles "
                    f"{list(COMPLETION_ROLES)}); put other turns in the prompt."
                )
        return
    raise TypeError(f"{where} must be a string or a list of messages, got {type(value).__name__}")


def _is_zero3_partitioned(model: torch.nn.Module) -> bool:
    """True when DeepSpeed ZeRO-3 sharded the weights: `from_pretrained` runs under `zero.Init` whenever a ZeRO-3
    Accelerate config is active (after `TrainingArguments` is built), leaving each rank only its shard."""
    return any(hasattr(p, "ds_id") for p in model.parameters())


def _shard_if_requested(model: torch.nn.Module, fsdp_shard: bool | None) -> str:
    """Shard the RM with FSDP2 when asked (or, for None, when the Accelerate config is FSDP v2 with several
    processes); return how the weights are held: `zero3`, `fsdp2` or `none`."""
    if _is_zero3_partitioned(model):
        if fsdp_shard:
            raise ValueError("fsdp_shard=True, but DeepSpeed ZeRO-3 already partitioned the reward model.")
        return "zero3"
    import torch.distributed as dist

    world_size = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
    zero3_requested = (
        os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() == "true"
        and os.environ.get("ACCELERATE_DEEPSPEED_ZERO_STAGE") == "3"
    )
    if zero3_requested and world_size > 1 and not fsdp_shard:
        logger.warning(
            "The Accelerate config is DeepSpeed ZeRO-3 but the reward model is not partitioned: it was loaded before "
            "the training arguments (GRPOConfig) existed, so every process holds a full copy. Create the GRPOConfig "
            "first, then RewardModelEnvironment (as recipes/grpo_rm.py does), to partition it."
        )
    if fsdp_shard is None:
        fsdp_shard = fsdp_requested() and fsdp_version() == 2 and world_size > 1
        if fsdp_requested() and fsdp_version() != 2 and world_size > 1:
            logger.info("FSDP version 1 config: the reward model is replicated on every rank (FSDP2 shards it).")
    if not fsdp_shard:
        return "none"
    if world_size == 1:
        raise ValueError("fsdp_shard=True needs an initialized process group with more than one process.")
    shard_reward_model(model)
    return "fsdp2"


# NeMo RL's `tokenizer.chat_template: null`: the contents of the messages, concatenated, no role markers.
PASSTHROUGH_TEMPLATE = "{% for message in messages %}{{ message['content'] }}{% endfor %}"


def _nemo_chat_template(value: str | None, tokenizer: PreTrainedTokenizerBase) -> str | None:
    """NeMo RL's `tokenizer.chat_template` semantics: None -> passthrough, "default" -> the tokenizer's own,
    a path ending in `.jinja` -> that file's text, anything else -> the template itself."""
    if value is None:
        return PASSTHROUGH_TEMPLATE
    if value == "default":
        return tokenizer.chat_template
    if str(value).endswith(".jinja"):
        with open(value, encoding="utf-8") as f:
            return f.read()
    return value


def _is_empty(completion: Any) -> bool:
    if isinstance(completion, str):
        return not completion.strip()
    return all(message_is_blank(m) for m in completion)


class RewardModelEnvironment:
    """A reward model wrapped as a GRPO reward function (TRL's reward-function signature).

    Args:
        model: A Hub id or local path of a `*ForSequenceClassification` checkpoint, or a loaded model.
        tokenizer: The RM's tokenizer, or a path/id to load it from. Defaults to the model's own.
        batch_size: Sequences per forward pass (default 32 unless `max_tokens_per_batch` is set).
        max_tokens_per_batch: Token budget per forward pass (padding included); bounds memory whatever the batch.
        max_length: Longest sequence the RM reads (default: its `max_position_embeddings`).
        truncation: `"left"` cuts over-long contexts from the left (never the completion); `"fallback"` gives
            over-long items `overlength_reward`.
        overlength_reward: Reward for items that cannot fit in `max_length`; None raises an error instead.
        nonfinite_reward: Reward used if the RM returns NaN/inf (warned once with the count, counted in
            `num_nonfinite` and the `reward_model_env/num_nonfinite` metric); None raises an error naming the samples.
        empty_completion_reward: Reward for empty or whitespace-only completions (judged after `strip_reasoning`,
            so a completion that is only reasoning counts as empty). None (default) scores them with the RM like any
            other answer (an empty assistant turn); their count is logged as `reward_model_env/num_empty`.
        strip_reasoning: Remove `<think>...</think>` from completions before scoring.
        precision: `fp32` (default), `bf16` or `fp16` for a model loaded here. Rewards are always returned as fp32.
        normalization: `none`; `running` (running mean/std of all rewards so far); `checkpoint` (the
            `reward_mean`/`reward_std` that `RankedRewardTrainer` saved into the model config).
        clip: If set, rewards (after normalization) are clipped to `[-clip, clip]`.
        name: The reward function's `__name__`: TRL logs `rewards/<name>/mean`. Our own metrics are logged under
            `reward_model_env/*`.
        device: Where the RM runs. Default: the device of the current Accelerate process (the policy's device).
        model_init_kwargs: Extra `from_pretrained` keyword arguments for a model loaded here.
        trust_remote_code: Allow custom model code from the Hub (off by default).
        show_progress: Progress bar over batches. None: only in `score()` on long lists, never inside training.
        prefix_sharing: Score the completions of a GRPO group against one encoding of their prompt: the prompt goes
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

    def __new__(cls, *args: Any, remote_url: str | Sequence[str] | None = None, **kwargs: Any):
        if cls is RewardModelEnvironment and remote_url is not None:
            return RemoteRewardModelEnvironment.__new__(RemoteRewardModelEnvironment)
        return object.__new__(cls)

    def __init__(
        self,
        model: str | os.PathLike | PreTrainedModel,
        tokenizer: str | os.PathLike | PreTrainedTokenizerBase | None = None,
        *,
        batch_size: int | None = None,
        max_tokens_per_batch: int | None = None,
        max_length: int | None = None,
        truncation: str = "left",
        overlength_reward: float | None = None,
        nonfinite_reward: float | None = None,
        empty_completion_reward: float | None = None,
        strip_reasoning: bool = False,
        precision: str = "fp32",
        normalization: str = "none",
        clip: float | None = None,
        name: str = "reward_model_env",
        device: str | torch.device | None = None,
        model_init_kwargs: dict[str, Any] | None = None,
        trust_remote_code: bool = False,
        show_progress: bool | None = None,
        prefix_sharing: bool | str = "auto",
        remote_url: str | Sequence[str] | None = None,
        attribute_weights: Mapping[str, float] | Sequence[float] | None = None,
        fsdp_shard: bool | None = None,
    ):
        if remote_url is not None:
            raise TypeError(f"{type(self).__name__} scores locally; use RemoteRewardModelEnvironment for remote_url.")
        if precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {sorted(PRECISIONS)}, got {precision!r}")
        if normalization not in NORMALIZATIONS:
            raise ValueError(f"normalization must be one of {NORMALIZATIONS}, got {normalization!r}")
        if clip is not None and clip <= 0:
            raise ValueError(f"clip must be > 0, got {clip}")
        if device is None:
            from accelerate import PartialState

            device = PartialState().device
        if isinstance(model, (str, os.PathLike)):
            from .model_source import check_model_source

            model_path = check_model_source(str(model), "reward model")  # a typo'd folder: one line, not a Hub id
            kwargs = {"dtype": PRECISIONS[precision], "trust_remote_code": trust_remote_code, **(model_init_kwargs or {})}
            model = AutoModelForSequenceClassification.from_pretrained(model_path, **kwargs)
            if tokenizer is None:
                tokenizer = model_path
        if tokenizer is None:
            tokenizer = model.config._name_or_path
        if isinstance(tokenizer, (str, os.PathLike)):
            tokenizer = AutoTokenizer.from_pretrained(str(tokenizer), trust_remote_code=trust_remote_code)
        model.requires_grad_(False)  # the RM is never trained here
        model.eval().to(device)

        from .trainer.regression import regression_reward_weights

        # A regression RM (RegressionRewardTrainer) predicts several attributes: the reward is their weighted sum.
        resolved = regression_reward_weights(model.config, attribute_weights)
        self.attributes, self.attribute_weights = resolved if resolved is not None else ([], None)
        self.model = model
        self.tokenizer = tokenizer
        self.sharding = _shard_if_requested(model, fsdp_shard)
        self.__name__ = name
        self.name = name
        self.empty_completion_reward = empty_completion_reward
        self.strip_reasoning = strip_reasoning
        self.normalization = normalization
        self.clip = clip
        self.show_progress = show_progress
        self.scorer = RewardScorer(
            model,
            tokenizer,
            batch_size=batch_size,
            max_tokens_per_batch=max_tokens_per_batch,
            max_length=max_length,
            truncation=truncation,
            overlength_reward=overlength_reward,
            nonfinite_reward=nonfinite_reward,
            strip_reasoning=strip_reasoning,
            show_progress=show_progress,
            prefix_sharing=prefix_sharing,
            output_weights=self.attribute_weights,
        )
        self._count, self._mean, self._m2 = 0, 0.0, 0.0  # running statistics (Welford)
        self.num_nonfinite = 0  # samples given `nonfinite_reward` so far (the first time is warned)
        self._warned_nonfinite = False
        if normalization == "checkpoint":
            mean, std = getattr(model.config, "reward_mean", None), getattr(model.config, "reward_std", None)
            if mean is None or std is None:
                raise ValueError(
                    "normalization='checkpoint' needs `reward_mean` and `reward_std` in the model config; "
                    "RankedRewardTrainer writes them when it trains with validation sets. Use 'running' instead."
                )
            self._checkpoint_stats = (float(mean), float(std))

    # ------------------------------------------------------------------ construction from NeMo RL config
    @classmethod
    def from_config(cls, config: Mapping[str, Any], **overrides) -> RewardModelEnvironment:
        """Build from a NeMo RL `env.reward_model` block (plus any of our own keyword arguments).

        Mapped: `model_name` (or `checkpoint_path` when set), `tokenizer.name` (and `tokenizer.chat_template`),
        `precision`, `batch_size`, `max_model_len` -> `max_length`, `dynamic_batching.enabled` with
        `logprob_mb_tokens`/`train_mb_tokens` -> `max_tokens_per_batch`, `reward_model_cfg.reward_model_type`
        (`bradley_terry`). Ray/Megatron resource keys (`resources`, `dtensor_cfg`, ...) are ignored. Any other key
        raises a `ValueError` listing the supported ones.
        """
        config = dict(config)
        if config.get("enabled") is False:
            raise ValueError("The reward_model config has `enabled: false`; there is no reward model to build.")
        supported = {"model_name", "checkpoint_path", "tokenizer", "precision", "batch_size", "max_model_len",
                     "dynamic_batching", "sequence_packing", "reward_model_cfg", "model_init_kwargs",
                     "trust_remote_code", "max_length"} | _NEMO_IGNORED_KEYS | _OUR_KEYS
        unknown = sorted(set(config) - supported)
        if unknown:
            raise ValueError(f"Unsupported reward_model config key(s) {unknown}. Supported: {sorted(supported)}.")
        if not (config.get("model_name") or config.get("checkpoint_path")):  # NeMo RL writes `checkpoint_path: null`
            raise ValueError("The reward_model config needs `model_name` (a Hub id or a local path).")
        rm_cfg = config.get("reward_model_cfg") or {}
        rm_type = rm_cfg.get("reward_model_type", "bradley_terry")
        if rm_type not in ("bradley_terry", "regression"):
            raise ValueError(
                f"reward_model_cfg.reward_model_type={rm_type!r} is not supported; use 'bradley_terry' or 'regression'."
            )
        if config.get("sequence_packing", {}) and config["sequence_packing"].get("enabled"):
            logger.warning("sequence_packing is ignored: scoring uses token-budget batching (`max_tokens_per_batch`).")
        kwargs: dict[str, Any] = {}
        tokenizer_cfg = config.get("tokenizer") or {}
        if isinstance(tokenizer_cfg, str):
            tokenizer_cfg = {"name": tokenizer_cfg}
        if config.get("precision"):
            kwargs["precision"] = str(config["precision"])
        if config.get("batch_size") is not None:
            kwargs["batch_size"] = int(config["batch_size"])
        if config.get("max_model_len") or config.get("max_length"):
            kwargs["max_length"] = int(config.get("max_length") or config["max_model_len"])
        dyn = config.get("dynamic_batching") or {}
        if dyn.get("enabled"):
            budget = dyn.get("logprob_mb_tokens") or dyn.get("train_mb_tokens")
            if not budget:
                raise ValueError("dynamic_batching.enabled needs `logprob_mb_tokens` (tokens per micro-batch).")
            kwargs["max_tokens_per_batch"] = int(budget)
        for key in _OUR_KEYS | {"model_init_kwargs", "trust_remote_code"}:
            if key in config:
                kwargs[key] = config[key]
        kwargs.update(overrides)
        model = config.get("checkpoint_path") or config["model_name"]
        if config.get("checkpoint_path") and not os.path.isfile(os.path.join(str(model), "config.json")):
            raise ValueError(
                f"checkpoint_path={model!r} is not a Hugging Face model folder (no config.json). NeMo RL DCP "
                "checkpoints must be converted first (NeMo RL's `convert_dcp_to_hf`), or set `model_name` only."
            )
        tokenizer = tokenizer_cfg.get("name") or model
        env = cls(model, tokenizer, **kwargs)
        if "chat_template" in tokenizer_cfg:
            env.tokenizer.chat_template = _nemo_chat_template(tokenizer_cfg["chat_template"], env.tokenizer)
        if tokenizer_cfg.get("chat_template_kwargs"):
            env.scorer.template_kwargs = dict(tokenizer_cfg["chat_template_kwargs"])
        return env

    # ------------------------------------------------------------------ scoring
    def _full_weights(self):
        """Under ZeRO-3 or FSDP2 the RM's weights are sharded across ranks and nothing else gathers them (TRL
        prepares reward *models*, not reward callables): gather them, read-only, for one scoring call. This is a
        collective: every rank must enter it the same number of times, as GRPO's reward calls do."""
        if self.sharding == "zero3":
            import deepspeed

            return deepspeed.zero.GatheredParameters(list(self.model.parameters()), modifier_rank=None)
        if self.sharding == "fsdp2":
            return FullWeights(self.model)
        return contextlib.nullcontext()

    def score(self, conversations: Sequence[Any]) -> torch.Tensor:
        """Raw RM scores (fp32 tensor, input order) of full conversations or `(context, completion)` pairs.

        No normalization, clipping or metrics: this is for offline use and evaluation.
        """
        contexts, completions = as_pairs(conversations)
        with self._full_weights(), self._nonfinite_named(range(len(contexts)), "conversations"):
            return self.scorer.score(contexts, completions)

    def __call__(
        self,
        prompts: Sequence[Any],
        completions: Sequence[Any],
        completion_ids: Sequence[Sequence[int]] | None = None,
        **kwargs: Any,
    ) -> list[float]:
        """TRL reward function: one float reward per `(prompt, completion)`."""
        empty = self._check_inputs(prompts, completions)
        rewards = torch.empty(len(prompts), dtype=torch.float32)
        to_score = self._to_score(len(prompts), empty)
        nonfinite: list[int] = []
        with self._full_weights():  # entered on every rank, even one with nothing to score (a ZeRO-3 collective)
            if to_score:
                with self._nonfinite_named(to_score, "completions") as nonfinite:
                    rewards[torch.tensor(to_score)] = self.scorer.score(
                        [prompts[i] for i in to_score],
                        [completions[i] for i in to_score],
                        progress=bool(self.show_progress),
                    )
        return self._finish(rewards, empty, kwargs.get("log_metric"), nonfinite=len(nonfinite))

    @contextlib.contextmanager
    def _nonfinite_named(self, indices: Sequence[int], what: str):
        """Around one `scorer.score` call on the samples `indices`: yields a list that receives the samples the
        model scored NaN/inf (given `nonfinite_reward`); warns the first time it happens, naming the count; and
        re-raises the scorer's `FloatingPointError` naming the caller's sample indices, not the scorer's."""
        found: list[int] = []
        try:
            yield found
        except FloatingPointError as err:
            bad = [indices[i] for i in getattr(self.scorer, "last_nonfinite", [])]
            if not bad:
                raise
            raise FloatingPointError(
                f"{self.name}: the reward model returned NaN/inf for item(s) {bad[:10]}{'...' if len(bad) > 10 else ''}"
                f" of the {what} ({len(bad)} of {len(indices)} scored). Check the model dtype (fp16 overflows are "
                "common) or set `nonfinite_reward`."
            ) from err
        found.extend(indices[i] for i in getattr(self.scorer, "last_nonfinite", []))
        if found:
            self.num_nonfinite += len(found)
            if not self._warned_nonfinite:
                self._warned_nonfinite = True
                shown = ", ".join(f"{what}[{i}]" for i in found[:10]) + (" ..." if len(found) > 10 else "")
                logger.warning(
                    "%s: the reward model returned NaN/inf for %d of %d samples (%s); they get nonfinite_reward=%s. "
                    "Warned once: later ones are counted in `reward_model_env/num_nonfinite` and `num_nonfinite`.",
                    self.name,
                    len(found),
                    len(indices),
                    shown,
                    self.scorer.nonfinite_reward,
                )

    # ------------------------------------------------------------------ shared by local and remote scoring
    def _check_inputs(self, prompts: Sequence[Any], completions: Sequence[Any]) -> list[int]:
        """Validate TRL's inputs; return the indices of empty completions."""
        for what, value in (("prompts", prompts), ("completions", completions)):
            if isinstance(value, str | bytes | Mapping) or not isinstance(value, Sequence):
                raise TypeError(
                    f"{what} must be a list (one item per completion, as TRL passes them), got {type(value).__name__}"
                )
        if len(prompts) != len(completions):
            raise ValueError(
                f"{self.name}: got {len(prompts)} prompts but {len(completions)} completions; there must be one "
                "prompt per completion (TRL repeats each prompt num_generations times)."
            )
        for i, (prompt, completion) in enumerate(zip(prompts, completions)):
            _check_content(prompt, f"prompts[{i}]")
            _check_content(completion, f"completions[{i}]", completion=True)
            for where, value in ((f"prompts[{i}]", prompt), (f"completions[{i}]", completion)):
                found = bad_text(value, where)  # a lone surrogate: no tokenizer can encode it
                if found:
                    raise ValueError(f"{found[0]}: {found[1]}")
            if isinstance(prompt, str) != isinstance(completion, str):
                raise TypeError(
                    f"prompts[{i}] and completions[{i}] must both be text or both be message lists, got "
                    f"{type(prompt).__name__} and {type(completion).__name__}."
                )
        # With strip_reasoning, a completion that is all `<think>` (or cut off mid-thought) has no answer: empty.
        strip = self.strip_reasoning
        return [i for i, c in enumerate(completions) if _is_empty(_strip_completion(c) if strip else c)]

    def _to_score(self, n: int, empty: list[int]) -> list[int]:
        skip = set(empty) if self.empty_completion_reward is not None else set()
        return [i for i in range(n) if i not in skip]

    def _finish(
        self, rewards: torch.Tensor, empty: list[int], log_metric, nonfinite: int | None = None
    ) -> list[float]:
        """Fallback for empty completions, normalization, clipping, metrics (`nonfinite`: how many samples got
        `nonfinite_reward`, logged as `reward_model_env/num_nonfinite` when known)."""
        if self.empty_completion_reward is not None and empty:
            rewards[torch.tensor(empty)] = float(self.empty_completion_reward)
        raw = rewards.clone()
        rewards = self._normalize(rewards)
        if self.clip is not None:
            rewards = rewards.clamp(-self.clip, self.clip)
        self._log(log_metric, raw, rewards, len(empty), nonfinite)
        return rewards.tolist()

    # ------------------------------------------------------------------ normalization and metrics
    def _normalize(self, rewards: torch.Tensor) -> torch.Tensor:
        if self.normalization == "none" or rewards.numel() == 0:
            return rewards
        if self.normalization == "checkpoint":
            mean, std = self._checkpoint_stats
        else:
            for value in rewards.double().tolist():  # Welford's update, all rewards seen so far
                self._count += 1
                delta = value - self._mean
                self._mean += delta / self._count
                self._m2 += delta * (value - self._mean)
            mean = self._mean
            std = math.sqrt(self._m2 / self._count) if self._count > 1 else 1.0
        return (rewards - mean) / max(std, 1e-6)

    def _log(
        self,
        log_metric: Callable[[str, float], None] | None,
        raw: torch.Tensor,
        rewards: torch.Tensor,
        empty: int,
        nonfinite: int | None = None,
    ):
        if log_metric is None or rewards.numel() == 0:
            return
        prefix = "reward_model_env"
        log_metric(f"{prefix}/num_samples", float(rewards.numel()))
        log_metric(f"{prefix}/mean_reward", rewards.mean().item())
        log_metric(f"{prefix}/std_reward", rewards.std(unbiased=False).item())
        log_metric(f"{prefix}/min_reward", rewards.min().item())
        log_metric(f"{prefix}/max_reward", rewards.max().item())
        log_metric(f"{prefix}/num_empty", float(empty))
        if nonfinite is not None:
            log_metric(f"{prefix}/num_nonfinite", float(nonfinite))
        attributes = getattr(self, "attributes", None)
        outputs = self.scorer.last_outputs if attributes else None
        if attributes and outputs is not None:  # regression RM: mean of each predicted attribute
            for k, attribute in enumerate(attributes):
                column = outputs[:, k][~torch.isnan(outputs[:, k])]
                if column.numel():
                    log_metric(f"{prefix}/{attribute}_mean", column.mean().item())
        if self.normalization != "none":
            log_metric(f"{prefix}/raw_mean_reward", raw.mean().item())

    def __repr__(self) -> str:
        return f"RewardModelEnvironment(name={self.name!r}, model={self.model.config._name_or_path!r})"


class RemoteRewardModelEnvironment(RewardModelEnvironment):
    """A `RewardModelEnvironment` whose reward model runs behind HTTP servers with vLLM's `POST /pooling` API.

    Built by `RewardModelEnvironment(remote_url=...)` (or directly). The server is `trl-rm-env serve`, or vLLM
    started with `--runner pooling` on a `*ForSequenceClassification` model; requests ask for raw logits
    (`use_activation: false`), so rewards are the Bradley-Terry scores the local environment returns. Conversations
    are sent as messages and rendered by the server with the RM's chat template; plain-text prompts are sent as
    `prompt + completion` text (the server adds no EOS, unlike local scoring of plain text).

    `__call__` is async: TRL's `GRPOTrainer` runs async reward functions concurrently with the others. Requests are
    spread over the URLs, retried with exponential backoff on 502/503/504, timeouts and connection errors (never on
    other 4xx), and a server that stays down raises an error naming its URL.

    Args:
        remote_url: One URL or several (`http://host:port`).
        model: The model name sent with each request (None: the server's own).
        timeout, retries, backoff, max_concurrency: Client settings (see `trl_rm_env.serving.RemoteScorer`).
        remote_api: The server's dialect: `"pooling"` (vLLM `/pooling`, default), `"classify"` (vLLM `/classify`)
            or `"openrlhf"` (OpenRLHF's `/get_reward`, text only: conversations are rendered here with `tokenizer`,
            the RM's tokenizer or its path). Raw scores are always asked for.
        api_key: Sent as `Authorization: Bearer <key>`; None: `TRL_RM_ENV_API_KEY`, else `VLLM_API_KEY`.
        nonfinite_reward: Reward for an item the server scored NaN/inf; None raises an error, as local scoring does.
        empty_completion_reward, strip_reasoning, clip, name: As for `RewardModelEnvironment`.
        normalization: `none` or `running` (`checkpoint` needs the model config, which a remote RM does not give).
    """

    def __new__(cls, *args: Any, **kwargs: Any):
        return object.__new__(cls)

    def __init__(
        self,
        model: str | None = None,
        tokenizer: Any = None,
        *,
        remote_url: str | Sequence[str],
        timeout: float = 60.0,
        retries: int = 5,
        backoff: float = 0.5,
        max_concurrency: int = 64,
        remote_api: str = "pooling",
        api_key: str | None = None,
        nonfinite_reward: float | None = None,
        empty_completion_reward: float | None = None,
        strip_reasoning: bool = False,
        normalization: str = "none",
        clip: float | None = None,
        name: str = "reward_model_env",
        **unused: Any,
    ):
        from .serving.client import RemoteScorer

        local_only = sorted(k for k, v in unused.items() if v not in (None, False))
        if local_only:
            logger.warning("%s: options %s apply to local scoring and are ignored with remote_url.", name, local_only)
        if normalization not in ("none", "running"):
            raise ValueError(f"normalization must be 'none' or 'running' with remote_url, got {normalization!r}")
        if clip is not None and clip <= 0:
            raise ValueError(f"clip must be > 0, got {clip}")
        if remote_api == "openrlhf" and isinstance(tokenizer, str | os.PathLike):
            tokenizer = AutoTokenizer.from_pretrained(str(tokenizer))  # /get_reward takes text: rendered here
        elif tokenizer is not None and remote_api != "openrlhf":
            logger.warning("%s: the tokenizer is ignored with remote_url; the server renders with its own.", name)
            tokenizer = None
        self.client = RemoteScorer(
            remote_url,
            model=model,
            timeout=timeout,
            retries=retries,
            backoff=backoff,
            max_concurrency=max_concurrency,
            api=remote_api,
            api_key=api_key,
            nonfinite_reward=nonfinite_reward,
            tokenizer=tokenizer,
        )
        self.model = None
        self.scorer = self.client  # `last_nonfinite` and `nonfinite_reward`, as a local scorer has them
        self.num_nonfinite = 0  # samples given `nonfinite_reward` so far, as for local scoring
        self._warned_nonfinite = False
        self.remote_url = self.client.urls
        self.__name__ = name
        self.name = name
        self.empty_completion_reward = empty_completion_reward
        self.strip_reasoning = strip_reasoning
        self.normalization = normalization
        self.clip = clip
        self._count, self._mean, self._m2 = 0, 0.0, 0.0

    async def score(self, conversations: Sequence[Any]) -> torch.Tensor:  # type: ignore[override]
        """Raw scores (fp32 tensor, input order) of full conversations or `(context, completion)` pairs."""
        contexts, completions = as_pairs(conversations)
        with self._nonfinite_named(range(len(contexts)), "conversations"):
            scores = await self.client.score(list(zip(contexts, completions)))
        return torch.tensor(scores, dtype=torch.float32)

    async def __call__(  # type: ignore[override]
        self,
        prompts: Sequence[Any],
        completions: Sequence[Any],
        completion_ids: Sequence[Sequence[int]] | None = None,
        **kwargs: Any,
    ) -> list[float]:
        """TRL reward function (async): one float reward per `(prompt, completion)`."""
        empty = self._check_inputs(prompts, completions)
        rewards = torch.empty(len(prompts), dtype=torch.float32)
        to_score = self._to_score(len(prompts), empty)
        nonfinite: list[int] = []
        if to_score:
            pairs = [
                (prompts[i], _strip_completion(completions[i]) if self.strip_reasoning else completions[i])
                for i in to_score
            ]
            with self._nonfinite_named(to_score, "completions") as nonfinite:  # NaN/inf: as local scoring
                scores = await self.client.score(pairs)
            rewards[torch.tensor(to_score)] = torch.tensor(scores, dtype=torch.float32)
        return self._finish(rewards, empty, kwargs.get("log_metric"), nonfinite=len(nonfinite))

    def __repr__(self) -> str:
        return f"RemoteRewardModelEnvironment(name={self.name!r}, remote_url={self.remote_url!r})"
