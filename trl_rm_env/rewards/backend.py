"""The one way a reward function reaches its model, for a reward model and a judge alike, here or behind servers:
`connect` decides once where the model runs, with the same guards and messages for both kinds, and returns a
`Backend`: what the reward function's requests go to (a reward model's `Scorer`, a judge's engine) and what the
function reports of it (tokenizer, model, engine, sharding, servers).

Loaded here, the model is planned and loaded by the layers below, each call going down once: a reward model by
`trl_rm_env.scoring.load_reward_scorer` (the runtime's `plan_model`, then `load_engine`), a judge by the runtime
itself (`plan_model`, `load_planned`), sharded under ZeRO-3 or FSDP2; behind servers its client comes from
`trl_rm_env.serving.client` (`RemoteScorer` for reward-model servers, `RemoteJudgeEngine` for OpenAI-compatible
ones), with the model's tokenizer where conversations are rendered here. A reward function of a new kind calls
`connect` with the kind of model it needs and reaches local and remote models without a split of its own.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from transformers import PreTrainedModel, PreTrainedTokenizerBase

from ..heads import RewardHead
from ..options import spelled
from ..runtime.loading import load_planned
from ..runtime.model_options import ModelOptions, ScoringOptions
from ..runtime.plan import KINDS, plan_model
from ..scoring.scorer import load_reward_scorer
from ..serving.client import RemoteScorer
from ..serving.client.judge_engine import RemoteJudgeEngine, remote_judge_tokenizer
from ..serving.client.remote_options import RemoteOptions, local_only
from ..serving.client.tokenizer import client_tokenizer
from .pickling import accelerator_type

logger = logging.getLogger(__name__)

WORDS = {"reward": ("reward model", "score"), "judge": ("judge", "judge")}
"""How messages name each kind of model, and what its servers do with a request."""


@dataclass(frozen=True)
class Backend:
    """What a reward function calls and reports of it, decided once by `connect`.

    Args:
        runs: What the function's requests go to: a reward model's `Scorer` (`RewardScorer` here, `RemoteScorer`
            behind servers) or a judge's engine (the runtime's `HFEngine`, `VLLMEngine` or a registered engine here,
            `RemoteJudgeEngine` behind servers).
        engine: The engine's name: `hf`, `vllm`, a registered engine's, or `remote`.
        tokenizer: The model's tokenizer as the function holds it (None: servers render the conversations).
        tokens: Whether conversations are rendered here, into token ids (else sent as messages).
        model: The transformers model loaded in this process (None: vLLM or servers hold it).
        sharding: How its weights are held across the processes: `none`, `zero3` or `fsdp2`.
        remote_url: The servers' URLs (None: loaded here).
        built_on: The accelerator type it runs on here (`trl_rm_env.rewards.pickling`).
        config: The model's config where it loads here (None behind servers).
        head: A reward model's head where it loads here (None: a judge, or behind servers).
    """

    runs: Any
    engine: str
    tokenizer: PreTrainedTokenizerBase | None
    tokens: bool
    model: PreTrainedModel | None = None
    sharding: str = "none"
    remote_url: list[str] | None = None
    built_on: str = "cpu"
    config: Any = None
    head: RewardHead | None = None


def connect(
    kind: str,
    owner: str,
    model: str | os.PathLike | PreTrainedModel | None,
    tokenizer: str | os.PathLike | PreTrainedTokenizerBase | None,
    *,
    options: ModelOptions,
    remote_url: str | Sequence[str] | None = None,
    remote_values: Mapping[str, Any] | None = None,
    name: str = "reward",
    fsdp_shard: bool | None = None,
    check_tokenizer: Callable[[PreTrainedTokenizerBase | None], None] | None = None,
    log: logging.Logger = logger,
) -> Backend:
    """The `Backend` of a reward function (`owner`, for messages) over a model of `kind` (`"reward"`: a
    `*ForSequenceClassification` reward model; `"judge"`: a causal LM): loaded here from `model` (a path, a Hub id or
    a loaded model) with `options` (a reward model's `ScoringOptions`, a judge's `ModelOptions`), or on the servers at
    `remote_url`, reached with the `RemoteOptions` given by name in `remote_values` (there `model` is the model name
    sent, None: the server's own).

    `name`: the reward function's, for messages. `fsdp_shard`: a reward model's (`RewardModelEnvironment`).
    `check_tokenizer`: called with the tokenizer (None behind servers that render messages) before any weights load,
    so a bad option fails fast (a judge's verdicts that are not one token). `log`: the caller's logger (its users
    filter on it), for the engine's choice and the weights' sharding.

    Raises:
        ValueError: an unknown `kind`; options of servers without `remote_url`, or with it an option that only a model
            loaded here applies (named); `fsdp_shard` with `remote_url`; a judge's `remote_api` (reward-model servers'
            dialects) with `remote_url`.
        TypeError: neither a model nor `remote_url`; a loaded model with `remote_url`.
    """
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {list(KINDS)}, got {kind!r}")
    what, verb = WORDS[kind]
    remote_values = dict(remote_values or {})
    if remote_url is None:
        if remote_values:
            raise ValueError(
                f"{', '.join(sorted(remote_values))}: options of a {what} behind servers; this one is loaded here "
                f"(give remote_url to {verb} on servers)"
            )
        if model is None:
            raise TypeError(f"{owner} needs a model (a path, a Hub id or a loaded {what}), or remote_url")
        here = _reward_model_here if kind == "reward" else _judge_here
        return here(model, tokenizer, options, fsdp_shard, check_tokenizer, log)
    if isinstance(model, PreTrainedModel):
        raise TypeError("with remote_url, model is the model name sent to the servers, not a loaded model")
    if fsdp_shard:
        raise ValueError(f"fsdp_shard shards a {what} loaded here; with remote_url a server holds it")
    remote = RemoteOptions(**remote_values)
    served = _reward_model_served if kind == "reward" else _judge_served
    return served(remote_url, model, tokenizer, options, remote, name, check_tokenizer, log)


def _reward_model_here(model, tokenizer, options, fsdp_shard, check_tokenizer, log) -> Backend:
    """The reward model on the engine its plan chooses (`fsdp_shard=True` keeps it on transformers), its weights held
    as the launch says (`distributed.shard_if_requested`)."""
    hf_only = "fsdp_shard=True shards a transformers model" if fsdp_shard else None
    scorer = load_reward_scorer(model, ScoringOptions.of(options), tokenizer=tokenizer, hf_only=hf_only, shard=True,
                                fsdp_shard=fsdp_shard, check_tokenizer=check_tokenizer, log=log)  # fmt: skip
    engine = scorer.engine
    return Backend(scorer, engine.name, scorer.tokenizer, True, scorer.model, engine.sharding, None,
                   accelerator_type(engine.device), scorer.config, scorer.head)  # fmt: skip


def _judge_here(model, tokenizer, options, fsdp_shard, check_tokenizer, log) -> Backend:
    """The judge on the engine its plan chooses, its weights held as the launch says."""
    plan = plan_model(model, options, kind="judge")
    tokenizer, engine = load_planned(plan, tokenizer, shard=True, check_tokenizer=check_tokenizer, log=log)
    return Backend(engine, engine.name, tokenizer, True, engine.model, engine.sharding, None,
                   accelerator_type(engine.device), plan.config)  # fmt: skip


def _reward_model_served(urls, model, tokenizer, options, remote, name, check_tokenizer, log) -> Backend:
    """A `RemoteScorer` for `urls`; the RM's tokenizer is `tokenizer` (loaded when a path or Hub id), else `model`'s
    when the dialect takes token ids (`client_tokenizer`); None where the server renders messages, so nothing set on
    it here could change a reward."""
    tokenizer = client_tokenizer(tokenizer, model, remote.remote_input, name, api=remote.remote_api)
    scorer = RemoteScorer(urls, model=model, tokenizer=tokenizer, options=remote, scoring=ScoringOptions.of(options))
    rendered = scorer.tokenizer if scorer.renders_here else None
    if check_tokenizer is not None:
        check_tokenizer(rendered)
    return Backend(scorer, "remote", rendered, scorer.renders_here, remote_url=scorer.urls)


def _judge_served(urls, model, tokenizer, options, remote, name, check_tokenizer, log) -> Backend:
    """A `RemoteJudgeEngine` for OpenAI-compatible servers at `urls`: token ids rendered here with the judge's
    tokenizer, or messages the server renders (warned: special-token text is read there as control tokens)."""
    if remote.remote_api != "pooling":
        raise ValueError("remote_api is the dialect of reward-model servers; a judge speaks OpenAI's API")
    tokenizer = remote_judge_tokenizer(tokenizer, model, remote.remote_input, name)
    tokens = tokenizer is not None and remote.remote_input != "messages"
    # Rendered here (token ids): the prompt's length is known here, so over-long judgements are ours.
    here_only = sorted(set(local_only(options)) - ({"overlength_reward"} if tokens else set()))
    if here_only:
        raise ValueError(
            f"{spelled(ModelOptions, here_only)}: applied by a judge loaded in this process, not by one behind "
            "servers; give them to the server or drop them"
        )
    if check_tokenizer is not None:
        check_tokenizer(tokenizer)
    engine = RemoteJudgeEngine(urls, model=model, tokens=tokens, options=remote,
                               max_length=options.max_length if tokens else None,
                               template_kwargs=options.template_kwargs)  # fmt: skip
    if not tokens:
        log.warning(
            "%s: judgements go to the server as messages, which it renders with its own chat template: special-token "
            "text in a completion is read there as control tokens (a policy could forge the judge's turns), and "
            "verdict log-probabilities come from its top 20. Give the judge's tokenizer to send token ids.",
            name,
        )
    return Backend(engine, "remote", tokenizer, tokens, remote_url=engine.bases)
