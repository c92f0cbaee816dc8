"""The `RewardScorer` of a planned reward model (`trl_rm_env.runtime.plan_model(..., kind="reward")`): vLLM's engine
or the model loaded with transformers. The GRPO environment, `trl-rm-env eval` and `trl-rm-env serve` (which hands a
vLLM plan to vLLM's own server instead) all go through `plan_model` then `load_scorer`.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from typing import Any

from transformers import PreTrainedTokenizerBase

from ..runtime.loading import load_tokenizer, load_weights
from ..runtime.model_options import ScoringOptions
from ..runtime.plan import ModelPlan, engine_specific, log_engine_choice, plan_model
from .scorer import RewardScorer
from .vllm_engine import VLLMEngine

logger = logging.getLogger(__name__)


def load_scorer(
    plan: ModelPlan, tokenizer: str | os.PathLike | PreTrainedTokenizerBase | None = None
) -> RewardScorer:
    """The `RewardScorer` of `plan`: vLLM's engine, or the model loaded with transformers. Under `engine="auto"`
    with no vLLM option given, a vLLM that fails to start is a warning and transformers scores instead."""
    if plan.engine == "vllm":
        try:
            engine = VLLMEngine(plan.model, plan.config, plan.options)
        except Exception as err:
            if plan.options.engine == "vllm" or engine_specific(plan.options):
                raise
            logger.warning("vLLM could not start (%s: %s); scoring with transformers instead.", type(err).__name__, err)
            plan = dataclasses.replace(plan, engine="hf", why="vLLM failed to start")
        else:
            log_engine_choice(plan)
            return RewardScorer(
                None, load_tokenizer(plan, tokenizer), plan.options, engine=engine, config=plan.config, head=plan.head
            )
    log_engine_choice(plan)
    return RewardScorer(load_weights(plan), load_tokenizer(plan, tokenizer), plan.options, head=plan.head)


def load_reward_scorer(
    model: str | os.PathLike, options: ScoringOptions | None = None, *, one_reward: bool = True, **values: Any
) -> RewardScorer:
    """Load a `*ForSequenceClassification` checkpoint (path or Hub id) and its tokenizer into a `RewardScorer`, on
    the engine `options.engine` picks (`trl_rm_env.runtime.choose_engine`; `"auto"` by default):
    `load_scorer(plan_model(...))`.

    Args:
        model: Local folder or Hub id of the reward model.
        options, **values: The `ScoringOptions` (`batch_size`, `max_tokens_per_batch`, `precision`, `engine`, ...).
        one_reward: False to read a regression model's attributes without weights (`RewardScorer.outputs`).

    Raises:
        ValueError: a bad option value.
        ImportError: `engine="vllm"` without vLLM installed.
    """
    return load_scorer(plan_model(model, options, one_reward=one_reward, **values))
