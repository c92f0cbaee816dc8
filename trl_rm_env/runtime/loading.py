"""Loading a planned model (`trl_rm_env.runtime.plan.ModelPlan`): its engine (`load_engine`, vLLM or transformers,
for a reward model and a judge alike), its weights with transformers and its tokenizer. The one place a reward model
or a judge gets its weights in this process (vLLM loads its own: `trl_rm_env.runtime.vllm`)."""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Callable

from transformers import (
    AutoModelForCausalLM,
    AutoModelForSequenceClassification,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from ..distributed import shard_if_requested
from ..fused_kernels import use_fused_kernels
from .engines.contract import Engine
from .engines.registry import registered_engine
from .engines.transformers_engine import HFEngine
from .engines.vllm_engine import VLLMEngine
from .plan import ModelPlan, default_device, engine_specific, load_dtype, log_engine_choice, planned_sharing

logger = logging.getLogger(__name__)

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
    model = model.eval().to(device)
    use_fused_kernels(options.fused_kernels, model, device, "scoring" if plan.kind == "reward" else "judging")
    return model


def load_tokenizer(
    plan: ModelPlan, tokenizer: str | os.PathLike | PreTrainedTokenizerBase | None = None
) -> PreTrainedTokenizerBase:
    """The tokenizer given, loaded from a path or Hub id, or the plan's model's own."""
    if tokenizer is None or isinstance(tokenizer, str | os.PathLike):
        source = str(tokenizer or plan.source)
        tokenizer = AutoTokenizer.from_pretrained(source, trust_remote_code=plan.options.trust_remote_code)
    return tokenizer


def load_planned(
    plan: ModelPlan, tokenizer: str | os.PathLike | PreTrainedTokenizerBase | None = None, *, shard: bool = False,
    fsdp_shard: bool | None = None, check_tokenizer: Callable[[PreTrainedTokenizerBase], None] | None = None,
    log: logging.Logger = logger,
) -> tuple[PreTrainedTokenizerBase, Engine]:
    """`(tokenizer, engine)` of a plan, a reward model's or a judge's: the tokenizer (`load_tokenizer`), checked by
    `check_tokenizer` before any weights load (a bad option fails fast), then the engine (`load_engine`, with
    `shard`, `fsdp_shard` and `log`)."""
    tokenizer = load_tokenizer(plan, tokenizer)
    if check_tokenizer is not None:
        check_tokenizer(tokenizer)
    return tokenizer, load_engine(plan, tokenizer, shard=shard, fsdp_shard=fsdp_shard, log=log)


def load_engine(
    plan: ModelPlan,
    tokenizer: PreTrainedTokenizerBase,
    *,
    shard: bool = False,
    fsdp_shard: bool | None = None,
    log: logging.Logger = logger,
) -> Engine:
    """The engine of a plan, a reward model's or a judge's (`plan.kind`): `VLLMEngine`, or `HFEngine` on the weights
    `load_weights` loads. Under `engine="auto"` with no vLLM option given, a vLLM that fails to start is a warning and
    transformers runs the model instead. A judge given loaded runs as it was given (not frozen or moved: it may be a
    model that is still training).

    `shard`: hold the weights as the launch says, for a reward function called on every process (`zero3`: already
    partitioned by DeepSpeed as they loaded; `fsdp2`: sharded here under an FSDP2 launch, or with `fsdp_shard=True`;
    `distributed.shard_if_requested`), each call gathering them; the engine's `sharding` says which. `log`: the
    caller's logger (the reward function's: its users filter on it). An engine registered by name
    (`runtime.engines.registry`) is its builder's `build(plan, tokenizer)`, as it is."""
    build = registered_engine(plan.engine)
    if build is not None:
        log_engine_choice(plan)
        return build(plan, tokenizer)
    if plan.engine == "vllm":
        if plan.options.fused_kernels is True:
            raise ValueError("fused_kernels=True applies Liger Kernel's kernels to a model transformers runs, but the "
                             "engine is vLLM (which runs its own fused kernels); set engine='hf', or fused_kernels to "
                             "'auto' or False.")
        try:
            engine = VLLMEngine(plan.model, plan.config, plan.options, kind=plan.kind)
        except Exception as err:
            if plan.options.engine == "vllm" or engine_specific(plan.options):
                raise
            doing = "scoring" if plan.kind == "reward" else "judging"
            log.warning("vLLM could not start (%s: %s); %s with transformers instead.", type(err).__name__, err, doing)
            sharing = planned_sharing(plan.kind, "hf", plan.options)
            plan = dataclasses.replace(plan, engine="hf", why="vLLM failed to start", prefix_sharing=sharing)
        else:
            log_engine_choice(plan)
            return engine
    log_engine_choice(plan)
    as_given = plan.kind == "judge" and plan.loaded is not None
    weights = plan.loaded if as_given else load_weights(plan)
    engine = HFEngine(weights, tokenizer, plan.options, kind=plan.kind, prefix_sharing=plan.prefix_sharing)
    if shard:
        engine.sharding = shard_if_requested(engine.model, fsdp_shard, log, kind=plan.kind)
    return engine
