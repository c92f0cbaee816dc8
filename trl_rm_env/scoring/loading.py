"""Loading a reward model for inference: the one place the environment, `eval` and `serve` load one."""

from __future__ import annotations

import os
from typing import Any

import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from ..model_source import check_model_source
from .options import ScoringOptions
from .scorer import RewardScorer

PRECISIONS = {
    "fp32": torch.float32,
    "float32": torch.float32,
    "bf16": torch.bfloat16,
    "bfloat16": torch.bfloat16,
    "fp16": torch.float16,
    "float16": torch.float16,
}
"""Precision names and their dtypes (NeMo RL's and torch's spellings)."""


def default_device() -> torch.device:
    """The device of this process: Accelerate's (its GPU under a multi-GPU launch), else CUDA when available."""
    from accelerate import PartialState

    return PartialState().device


def load_reward_model(
    model: str | os.PathLike | PreTrainedModel,
    tokenizer: str | os.PathLike | PreTrainedTokenizerBase | None = None,
    *,
    precision: str = "fp32",
    device: str | torch.device | None = None,
    trust_remote_code: bool = False,
    model_init_kwargs: dict[str, Any] | None = None,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """A `*ForSequenceClassification` reward model and its tokenizer, ready to score: frozen, in eval mode, on
    `device` (default `default_device()`).

    Args:
        model: A local folder or Hub id (checked first: a typo'd folder fails in one line), or a loaded model.
        tokenizer: Its tokenizer, a path or Hub id of one, or None (the model's own).
        precision: `fp32`, `bf16` or `fp16` (or `float32`, `bfloat16`, `float16`) for a model loaded here.
        device: Where the model runs.
        trust_remote_code: Allow custom model code from the Hub.
        model_init_kwargs: More `from_pretrained` keyword arguments.

    Raises:
        ValueError: an unknown precision.
        trl_rm_env.model_source.ModelSourceError: a missing local model folder.
    """
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {sorted(PRECISIONS)}, got {precision!r}")
    if isinstance(model, str | os.PathLike):
        path = check_model_source(str(model), "reward model")
        kwargs = {"dtype": PRECISIONS[precision], "trust_remote_code": trust_remote_code, **(model_init_kwargs or {})}
        model = AutoModelForSequenceClassification.from_pretrained(path, **kwargs)
        tokenizer = path if tokenizer is None else tokenizer
    if tokenizer is None:
        tokenizer = model.config._name_or_path
    if isinstance(tokenizer, str | os.PathLike):
        tokenizer = AutoTokenizer.from_pretrained(str(tokenizer), trust_remote_code=trust_remote_code)
    model.requires_grad_(False)  # a scoring model is never trained here
    model.eval().to(device if device is not None else default_device())
    return model, tokenizer


def load_reward_scorer(
    model: str | os.PathLike,
    *,
    precision: str = "fp32",
    device: str | None = None,
    trust_remote_code: bool = False,
    options: ScoringOptions | None = None,
    **values: Any,
) -> RewardScorer:
    """Load a `*ForSequenceClassification` checkpoint (path or Hub id) and its tokenizer into a `RewardScorer`.

    Args:
        model: Local folder or Hub id of the reward model.
        precision: "fp32", "bf16" or "fp16". Scores are returned in fp32 whatever the precision.
        device: "cpu", "cuda", "cuda:1", ... Default: `default_device()`.
        trust_remote_code: Allow custom model code from the Hub.
        options, **values: The `ScoringOptions` (`batch_size`, `max_tokens_per_batch`, `max_length`,
            `output_weights`, ...).

    Raises:
        ValueError: an unknown precision or option value.
    """
    rm, tokenizer = load_reward_model(model, precision=precision, device=device, trust_remote_code=trust_remote_code)
    return RewardScorer(rm, tokenizer, options, **values)
