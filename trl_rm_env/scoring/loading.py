"""Loading a reward model for inference: the one place the environment, `eval` and `serve` load one, and where the
scoring engine is chosen (`choose_engine`).
"""

from __future__ import annotations

import logging
import os
from typing import Any

import torch
from transformers import (
    AutoConfig,
    AutoModelForSequenceClassification,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from ..distributed import launched
from ..model_source import check_model_source
from .options import ScoringOptions
from .scorer import RewardScorer
from .vllm import VLLMEngine, vllm_device, vllm_installed

logger = logging.getLogger(__name__)
_logged_choices: set[tuple[str, str]] = set()

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


def choose_engine(
    requested: str, *, device: str | torch.device | None = None, hf_only: str | None = None
) -> tuple[str, str]:
    """`(engine, why)` for a reward model given by path or Hub id: `"vllm"` or `"hf"`.

    `"vllm"` and `"hf"` are taken as asked. `"auto"` keeps transformers when vLLM is not installed, when several
    processes run (each would start its own vLLM engine: serve one instead, `trl-rm-env serve --engine vllm`, and
    pass `remote_url`), when `device` is not the device vLLM's build runs on, or when the caller says why only
    transformers can serve the case (`hf_only`: a model to shard with ZeRO-3/FSDP2, transformers loading
    arguments); otherwise vLLM.
    """
    if requested in ("vllm", "hf"):
        return requested, "asked for"
    if hf_only:
        return "hf", hf_only
    if not vllm_installed():
        return "hf", "vLLM is not installed"
    if launched():
        return "hf", "several processes run (each would start its own vLLM: serve it once and use remote_url)"
    if device is not None and torch.device(device).type != vllm_device():
        return "hf", f"device {device} is not the one vLLM runs on ({vllm_device()})"
    return "vllm", "vLLM is installed"


def log_engine_choice(engine: str, why: str) -> None:
    """Say once per process which engine scores and why."""
    if (engine, why) not in _logged_choices:
        _logged_choices.add((engine, why))
        logger.info("Reward model scoring engine: %s (%s)", "vLLM" if engine == "vllm" else "transformers", why)


def vllm_scorer(
    model: str | os.PathLike,
    tokenizer: str | os.PathLike | PreTrainedTokenizerBase | None,
    options: ScoringOptions,
    *,
    precision: str = "fp32",
    trust_remote_code: bool = False,
) -> RewardScorer:
    """A `RewardScorer` whose forward passes run in vLLM (`VLLMEngine`); the tokenizer is loaded here, the weights
    by vLLM only."""
    path = check_model_source(str(model), "reward model")
    config = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
    if tokenizer is None or isinstance(tokenizer, str | os.PathLike):
        tokenizer = AutoTokenizer.from_pretrained(str(tokenizer or path), trust_remote_code=trust_remote_code)
    engine = VLLMEngine(
        path, config, options, precision=precision, trust_remote_code=trust_remote_code, show_progress=options.show_progress
    )
    return RewardScorer(None, tokenizer, options, engine=engine, config=config)


def scorer_on_chosen_engine(
    model: str | os.PathLike,
    tokenizer: str | os.PathLike | PreTrainedTokenizerBase | None,
    options: ScoringOptions,
    *,
    precision: str = "fp32",
    device: str | torch.device | None = None,
    trust_remote_code: bool = False,
    hf_only: str | None = None,
) -> RewardScorer | None:
    """A vLLM `RewardScorer` when `choose_engine` picks vLLM for this case, else None (the caller loads the model
    with transformers). Under `"auto"`, a vLLM that fails to start is a warning and None, not an error."""
    engine, why = choose_engine(options.engine, device=device, hf_only=hf_only)
    if engine == "hf":
        log_engine_choice(engine, why)
        return None
    if options.engine == "vllm" and hf_only:
        raise ValueError(f"engine='vllm' cannot serve this reward model: {hf_only}")
    try:
        scorer = vllm_scorer(model, tokenizer, options, precision=precision, trust_remote_code=trust_remote_code)
    except Exception as err:
        if options.engine == "vllm":
            raise
        logger.warning("vLLM could not start (%s: %s); scoring with transformers instead.", type(err).__name__, err)
        log_engine_choice("hf", "vLLM failed to start")
        return None
    log_engine_choice(engine, why)
    return scorer


def load_reward_scorer(
    model: str | os.PathLike,
    *,
    precision: str = "fp32",
    device: str | None = None,
    trust_remote_code: bool = False,
    options: ScoringOptions | None = None,
    **values: Any,
) -> RewardScorer:
    """Load a `*ForSequenceClassification` checkpoint (path or Hub id) and its tokenizer into a `RewardScorer`, on
    the engine `options.engine` picks (`choose_engine`; `"auto"` by default).

    Args:
        model: Local folder or Hub id of the reward model.
        precision: "fp32", "bf16" or "fp16". Scores are returned in fp32 whatever the precision.
        device: "cpu", "cuda", "cuda:1", ... Default: `default_device()` (vLLM: its own device).
        trust_remote_code: Allow custom model code from the Hub.
        options, **values: The `ScoringOptions` (`batch_size`, `max_tokens_per_batch`, `max_length`, `engine`,
            `output_weights`, ...).

    Raises:
        ValueError: an unknown precision or option value.
        ImportError: `engine="vllm"` without vLLM installed.
    """
    options = ScoringOptions.build(options, **values)
    scorer = scorer_on_chosen_engine(
        model, None, options, precision=precision, device=device, trust_remote_code=trust_remote_code
    )
    if scorer is not None:
        return scorer
    rm, tokenizer = load_reward_model(model, precision=precision, device=device, trust_remote_code=trust_remote_code)
    return RewardScorer(rm, tokenizer, options)
