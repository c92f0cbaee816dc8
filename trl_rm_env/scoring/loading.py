"""The `RewardScorer` of a planned reward model (`trl_rm_env.runtime.plan_model(..., kind="reward")`), on the engine
`trl_rm_env.runtime.loading.load_engine` builds: vLLM's, or the model loaded with transformers. The GRPO
environment, `trl-rm-env eval` and `trl-rm-env serve` (which hands a vLLM plan to vLLM's own server instead) all go
through `plan_model` then `load_scorer`.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from transformers import PreTrainedTokenizerBase

from ..runtime.loading import load_engine, load_tokenizer
from ..runtime.model_options import ScoringOptions
from ..runtime.plan import ModelPlan, plan_model
from .scorer import RewardScorer

logger = logging.getLogger(__name__)


def load_scorer(
    plan: ModelPlan,
    tokenizer: str | os.PathLike | PreTrainedTokenizerBase | None = None,
    *,
    shard: bool = False,
    fsdp_shard: bool | None = None,
    log: logging.Logger = logger,
) -> RewardScorer:
    """The `RewardScorer` of `plan`, on the engine `load_engine` builds (vLLM's, or the model loaded with
    transformers; under `engine="auto"` with no vLLM option given, a vLLM that fails to start is a warning and
    transformers scores instead; `shard`, `fsdp_shard`, `log`: `load_engine`'s)."""
    tokenizer = load_tokenizer(plan, tokenizer)
    engine = load_engine(plan, tokenizer, shard=shard, fsdp_shard=fsdp_shard, log=log)
    config = plan.config if engine.model is None else None  # a loaded model's own config, else the plan's
    return RewardScorer(engine.model, tokenizer, plan.options, engine=engine, config=config, head=plan.head)


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
