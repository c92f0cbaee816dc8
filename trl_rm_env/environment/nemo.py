"""NeMo RL's `env.reward_model` block, read as `RewardModelEnvironment` arguments.

Mapped: `model_name` (or `checkpoint_path` when set), `tokenizer.name` (and `tokenizer.chat_template`,
`tokenizer.chat_template_kwargs`), `precision`, `batch_size`, `max_model_len` -> `max_length`,
`dynamic_batching.enabled` with `logprob_mb_tokens`/`train_mb_tokens` -> `max_tokens_per_batch`,
`reward_model_cfg.reward_model_type` (`bradley_terry`, `regression`). Ray/Megatron resource keys (`resources`,
`dtensor_cfg`, ...) are accepted and ignored under Accelerate; any of our own arguments may be given too; any other
key is refused, listing the supported ones.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Mapping
from typing import Any

from transformers import PreTrainedTokenizerBase

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
NEMO_KEYS = {"model_name", "checkpoint_path", "tokenizer", "precision", "batch_size", "max_model_len",
             "dynamic_batching", "sequence_packing", "reward_model_cfg", "model_init_kwargs", "trust_remote_code",
             "max_length"}  # fmt: skip

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


def environment_arguments(
    config: Mapping[str, Any], our_keys: Iterable[str]
) -> tuple[str, str, dict[str, Any], dict[str, Any]]:
    """`(model, tokenizer, keyword arguments, tokenizer config)` of a NeMo RL `env.reward_model` block (module
    docstring); `our_keys` are the environment's own argument names, taken as they are.

    Raises:
        ValueError: `enabled: false`, an unsupported key, no model, an unsupported reward model type, dynamic
            batching without a token budget, or a `checkpoint_path` that is not a Hugging Face folder.
    """
    config = dict(config)
    our_keys = set(our_keys)
    if config.get("enabled") is False:
        raise ValueError("The reward_model config has `enabled: false`; there is no reward model to build.")
    supported = NEMO_KEYS | NEMO_IGNORED_KEYS | our_keys
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
    for key in our_keys | {"model_init_kwargs", "trust_remote_code"}:
        if key in config:
            kwargs[key] = config[key]
    model = config.get("checkpoint_path") or config["model_name"]
    if config.get("checkpoint_path") and not os.path.isfile(os.path.join(str(model), "config.json")):
        raise ValueError(
            f"checkpoint_path={model!r} is not a Hugging Face model folder (no config.json). NeMo RL DCP "
            "checkpoints must be converted first (NeMo RL's `convert_dcp_to_hf`), or set `model_name` only."
        )
    return model, tokenizer_cfg.get("name") or model, kwargs, tokenizer_cfg
