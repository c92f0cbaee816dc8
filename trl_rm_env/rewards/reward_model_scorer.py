"""The scorer behind a `RewardModelEnvironment`: a reward model loaded here (planned and loaded by the model runtime,
`trl_rm_env.runtime`, sharded under ZeRO-3 or FSDP2; `local_scorer`), or behind HTTP servers (`trl-rm-env serve`,
vLLM `--runner pooling`, OpenRLHF-style: `RemoteScorer`, with the RM's tokenizer where conversations are rendered
here; `remote_scorer`)."""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from typing import Any

from transformers import PreTrainedModel, PreTrainedTokenizerBase

from ..runtime.model_options import ScoringOptions
from ..runtime.plan import plan_model
from ..scoring.scorer import RewardScorer, load_scorer
from ..serving.client import RemoteScorer
from ..serving.client.remote_options import RemoteOptions
from ..serving.client.tokenizer import client_tokenizer

logger = logging.getLogger(__name__)


def local_scorer(
    model: str | os.PathLike | PreTrainedModel,
    tokenizer: str | os.PathLike | PreTrainedTokenizerBase | None,
    options: ScoringOptions,
    fsdp_shard: bool | None,
) -> tuple[RewardScorer, str]:
    """`(scorer, sharding)`: the reward model on the engine its plan chooses (`fsdp_shard=True` keeps it on
    transformers), and how its weights are held (`none`, `zero3`, `fsdp2`; see `shard_if_requested`)."""
    hf_only = "fsdp_shard=True shards a transformers model" if fsdp_shard else None
    scorer = load_scorer(plan_model(model, options, hf_only=hf_only), tokenizer, shard=True, fsdp_shard=fsdp_shard,
                         log=logger)  # fmt: skip
    return scorer, scorer.engine.sharding


def checkpoint_statistics(config: Any) -> tuple[float, float] | None:
    """The `(reward_mean, reward_std)` training saved into the model config, or None."""
    mean, std = getattr(config, "reward_mean", None), getattr(config, "reward_std", None)
    return (float(mean), float(std)) if mean is not None and std is not None else None


def remote_scorer(
    urls: str | Sequence[str],
    model: str | None,
    tokenizer: Any,
    options: RemoteOptions,
    scoring: ScoringOptions,
    name: str,
) -> RemoteScorer:
    """A `RemoteScorer` for `urls`: `model` is the model name sent to the servers; the RM's tokenizer is `tokenizer`
    (loaded when a path or Hub id), else `model`'s when the dialect takes token ids (`client_tokenizer`)."""
    tokenizer = client_tokenizer(tokenizer, model, options.remote_input, name, api=options.remote_api)
    return RemoteScorer(urls, model=model, tokenizer=tokenizer, options=options, scoring=scoring)
