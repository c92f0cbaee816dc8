"""Loading a planned model (`trl_rm_env.runtime.plan.ModelPlan`) with transformers, and its tokenizer: the one
place a reward model or a judge gets its weights in this process (vLLM loads its own: `trl_rm_env.runtime.vllm`)."""

from __future__ import annotations

import os

from transformers import (
    AutoModelForCausalLM,
    AutoModelForSequenceClassification,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from .plan import ModelPlan, default_device, load_dtype

AUTO_CLASSES = {"reward": AutoModelForSequenceClassification, "judge": AutoModelForCausalLM}


def load_weights(plan: ModelPlan) -> PreTrainedModel:
    """The plan's model on transformers, ready for inference: loaded from its path or Hub id (the Auto class of its
    kind, `options.precision` on `options.device`, `trust_remote_code` and `model_init_kwargs` as given) or the
    model already loaded; frozen, in eval mode, on `options.device` (default `default_device()`)."""
    options = plan.options
    device = options.device if options.device is not None else default_device()
    model = plan.loaded
    if model is None:
        kwargs = {"dtype": load_dtype(options.precision, device), "trust_remote_code": options.trust_remote_code}
        model = AUTO_CLASSES[plan.kind].from_pretrained(plan.model, **kwargs | (options.model_init_kwargs or {}))
    model.requires_grad_(False)  # a model we run for rewards is never trained here
    return model.eval().to(device)


def load_tokenizer(
    plan: ModelPlan, tokenizer: str | os.PathLike | PreTrainedTokenizerBase | None = None
) -> PreTrainedTokenizerBase:
    """The tokenizer given, loaded from a path or Hub id, or the plan's model's own."""
    if tokenizer is None or isinstance(tokenizer, str | os.PathLike):
        source = str(tokenizer or plan.source)
        tokenizer = AutoTokenizer.from_pretrained(source, trust_remote_code=plan.options.trust_remote_code)
    return tokenizer
