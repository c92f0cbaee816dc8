"""NeMo RL's `env.reward_model` block, read as `RewardModelEnvironment` arguments, and its `grpo.reward_shaping`
block, read as `LengthShaping` arguments of any reward of ours (`length_shaping_arguments`).

Mapped onto our options (`NEMO_OPTIONS`, each key onto one option field): `precision`, `batch_size`,
`max_model_len`, `dynamic_batching.logprob_mb_tokens` (or `train_mb_tokens`) -> `max_tokens_per_batch`,
`tokenizer.chat_template_kwargs` -> `template_kwargs`, `reward_model_cfg.reward_model_type` -> `reward_model_type`
(`bradley_terry` or `regression`: the head kind). Read here: `model_name` (or `checkpoint_path` when set),
`tokenizer.name` and `tokenizer.chat_template`. Ray/Megatron resource keys (`resources`, `dtensor_cfg`, ...) are
accepted and ignored under Accelerate; any of our own arguments may be given too; any other key is refused,
listing the supported ones.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Mapping
from typing import Any

from transformers import PreTrainedTokenizerBase

from ..runtime.model_options import ScoringOptions
from ..serving.client.remote_options import local_only

logger = logging.getLogger(__name__)

# NeMo RL `env.reward_model` keys that describe Ray/Megatron resources: accepted and ignored under Accelerate.
NEMO_IGNORED_KEYS = {
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
NEMO_OPTIONS = {
    "precision": "precision",
    "batch_size": "batch_size",
    "max_model_len": "max_length",
    "dynamic_batching.logprob_mb_tokens": "max_tokens_per_batch",
    "dynamic_batching.train_mb_tokens": "max_tokens_per_batch",
    "tokenizer.chat_template_kwargs": "template_kwargs",
    "reward_model_cfg.reward_model_type": "reward_model_type",
}
"""NeMo RL's spelling (a dotted path into the block) -> the option it sets. `logprob_mb_tokens` wins over
`train_mb_tokens` (scoring is NeMo's logprob pass), and both apply only with `dynamic_batching.enabled`."""
NEMO_KEYS = {"model_name", "checkpoint_path", "tokenizer", "dynamic_batching", "sequence_packing", "reward_model_cfg",
             *(key for key in NEMO_OPTIONS if "." not in key)}  # fmt: skip
NOT_SET = object()
"""`environment_arguments`' chat template when the block sets none (None is NeMo's passthrough template)."""

# NeMo RL's `tokenizer.chat_template: null`: the contents of the messages, concatenated, no role markers.
PASSTHROUGH_TEMPLATE = "{% for message in messages %}{{ message['content'] }}{% endfor %}"


def nemo_chat_template(value: str | None, tokenizer: PreTrainedTokenizerBase) -> str | None:
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


def _nested(config: Mapping[str, Any], path: str) -> Any:
    """The value at a dotted `path` of the block (None where any part is missing or null)."""
    value: Any = config
    for part in path.split("."):
        value = value.get(part) if isinstance(value, Mapping) else None
    return value


def environment_arguments(
    config: Mapping[str, Any], our_keys: Iterable[str], served: bool = False
) -> tuple[str, str, dict[str, Any], Any]:
    """`(model, tokenizer, keyword arguments, chat template)` of a NeMo RL `env.reward_model` block (module
    docstring); `our_keys` are the environment's own argument names, taken as they are. The chat template is
    `NOT_SET` when the block gives none. `served`: the reward model is behind servers (`remote_url`), so NeMo's keys
    that only a model loaded here applies (`precision`, `batch_size`, ...) describe the served model: they are left
    to the server (logged), not refused.

    Raises:
        ValueError: `enabled: false`, an unsupported key, no model, dynamic batching without a token budget, or a
            `checkpoint_path` that is not a Hugging Face folder.
    """
    config = dict(config)
    if isinstance(config.get("tokenizer"), str):
        config["tokenizer"] = {"name": config["tokenizer"]}
    our_keys = set(our_keys)
    if config.get("enabled") is False:
        raise ValueError("The reward_model config has `enabled: false`; there is no reward model to build.")
    supported = NEMO_KEYS | NEMO_IGNORED_KEYS | our_keys
    unknown = sorted(set(config) - supported)
    if unknown:
        raise ValueError(f"Unsupported reward_model config key(s) {unknown}. Supported: {sorted(supported)}.")
    if not (config.get("model_name") or config.get("checkpoint_path")):  # NeMo RL writes `checkpoint_path: null`
        raise ValueError("The reward_model config needs `model_name` (a Hub id or a local path).")
    extra = sorted(set(config.get("reward_model_cfg") or {}) - {"enabled", "reward_model_type"})
    if extra:
        raise ValueError(f"Unsupported reward_model_cfg key(s) {extra}. Supported: ['enabled', 'reward_model_type'].")
    if (config.get("sequence_packing") or {}).get("enabled"):
        logger.warning("sequence_packing is ignored: scoring uses token-budget batching (`max_tokens_per_batch`).")
    dynamic = bool((config.get("dynamic_batching") or {}).get("enabled"))
    kwargs: dict[str, Any] = {}
    for path, name in NEMO_OPTIONS.items():
        value = _nested(config, path)
        if value is None or (path.startswith("dynamic_batching.") and not dynamic) or name in kwargs:
            continue
        kwargs[name] = value
    if dynamic and "max_tokens_per_batch" not in kwargs:
        raise ValueError("dynamic_batching.enabled needs `logprob_mb_tokens` (tokens per micro-batch).")
    if served:
        dropped = local_only(ScoringOptions(**kwargs))
        if dropped:
            logger.info("reward_model block with remote_url: %s describe the served model; the server applies them.",
                        dropped)  # fmt: skip
        kwargs = {k: v for k, v in kwargs.items() if k not in dropped}
    # Our own names win (`precision` and `batch_size` are spelled alike in both, and read above as NeMo's).
    kwargs.update({key: config[key] for key in our_keys - set(NEMO_OPTIONS) if key in config})
    model = config.get("checkpoint_path") or config["model_name"]
    if config.get("checkpoint_path") and not os.path.isfile(os.path.join(str(model), "config.json")):
        raise ValueError(
            f"checkpoint_path={model!r} is not a Hugging Face model folder (no config.json). NeMo RL DCP "
            "checkpoints must be converted first (NeMo RL's `convert_dcp_to_hf`), or set `model_name` only."
        )
    tokenizer_cfg = config.get("tokenizer") or {}
    chat_template = tokenizer_cfg["chat_template"] if "chat_template" in tokenizer_cfg else NOT_SET
    return model, tokenizer_cfg.get("name") or model, kwargs, chat_template


NEMO_SHAPING_KEYS = ("enabled", "mode", "overlong_buffer_length", "overlong_buffer_penalty", "max_response_length",
                     "stop_properly_penalty_coef", "reasoning_length")  # fmt: skip
"""The keys of NeMo RL's `grpo.reward_shaping` block (`RewardShapingConfig`, `GRPORewardShapingConfig`)."""
OVERLONG_KEYS = ("overlong_buffer_length", "overlong_buffer_penalty", "max_response_length")


def length_shaping_arguments(block: Mapping[str, Any] | None) -> dict[str, Any]:
    """`LengthShaping` keyword arguments of NeMo RL's `grpo.reward_shaping` block, as NeMo RL's GRPO applies it:
    nothing unless `enabled`; with `stop_properly_penalty_coef` set the overlong keys are not applied (a warning, as
    NeMo RL prints one); otherwise DAPO's overlong buffer. `eos_token_id` (ours: the policy's end token ids, which
    tell a truncated completion) may be given in the block too. For any reward of ours:
    `RewardModelEnvironment.from_config(rm_block, reward_shaping=block)` or
    `JudgeEnvironment(..., **length_shaping_arguments(block))`.

    Raises:
        ValueError: an unknown key, or `mode: reasoning_length` (NeMo Gym's reasoning-chain reward, not built here).
    """
    if block is None:
        return {}
    unknown = sorted(set(block) - {*NEMO_SHAPING_KEYS, "eos_token_id"})
    if unknown:
        raise ValueError(
            f"Unsupported grpo.reward_shaping key(s) {unknown}. Supported: {sorted({*NEMO_SHAPING_KEYS, 'eos_token_id'})}."
        )
    if not block.get("enabled"):
        given = sorted(k for k in block if k not in ("enabled", "mode", "reasoning_length") and block[k] is not None)
        if given:
            logger.info("grpo.reward_shaping has enabled: false; %s are not applied (as in NeMo RL).", given)
        return {}
    mode = block.get("mode") or "response_length"
    if mode != "response_length":
        raise ValueError(
            f"grpo.reward_shaping.mode={mode!r}: only 'response_length' (DAPO's overlong buffer, the stop-properly "
            "penalty) is built here; NeMo RL's 'reasoning_length' shapes NeMo Gym rollouts' reasoning chains."
        )
    kwargs = {"eos_token_id": block["eos_token_id"]} if block.get("eos_token_id") is not None else {}
    if block.get("stop_properly_penalty_coef") is not None:
        ignored = [key for key in OVERLONG_KEYS if block.get(key) is not None]
        if ignored:
            logger.warning("grpo.reward_shaping: stop_properly_penalty_coef is set, so %s are not applied (as in "
                           "NeMo RL).", ignored)  # fmt: skip
        return {**kwargs, "stop_properly_penalty_coef": block["stop_properly_penalty_coef"]}
    missing = [key for key in OVERLONG_KEYS if block.get(key) is None]
    if missing:
        raise ValueError(
            f"grpo.reward_shaping is enabled without stop_properly_penalty_coef, so DAPO's overlong buffer applies and "
            f"needs {list(OVERLONG_KEYS)}; missing {missing}"
        )
    return {**kwargs, **{key: block[key] for key in OVERLONG_KEYS}}
