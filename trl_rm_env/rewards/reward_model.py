"""`RewardModelEnvironment`: one reward function over a reward model, loaded here or behind servers."""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Generator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from ..distributed import full_weights
from ..options import names, route
from ..runtime.model_options import ScoringOptions
from ..scoring.scorer import as_pairs
from ..serving.client.remote_options import RemoteOptions
from . import nemo
from .attributes import AttributeReward, SharedOutputs
from .backend import connect
from .base import Ids, RewardFunction, RewardOptions, Samples
from .ensemble import EnsembleOptions, aggregate, ensemble_metrics
from .pickling import PicklesByArguments
from .reference_bound import ReferenceBound
from .shaping import GroupShaping, LengthShaping

OWN_ARGUMENTS = ("model", "tokenizer", "remote_url", "fsdp_shard", "options")
"""The environment's own arguments; every other keyword argument is an option of `OPTION_CLASSES`."""
OPTION_CLASSES = (
    ScoringOptions, RewardOptions, RemoteOptions, GroupShaping, LengthShaping, ReferenceBound, EnsembleOptions
)
"""Where the environment's options are declared: how the RM scores, what the reward function does with the scores,
how servers are reached (with `remote_url`), how a group's rewards are shaped (NeMo Gym's group shaping, NeMo RL's
length shaping), a reward bounded against a reference answer (PAR), and a multi-head model's heads aggregated."""

logger = logging.getLogger(__name__)


def checkpoint_statistics(config: Any) -> tuple[float, float] | None:
    """The `(reward_mean, reward_std)` training saved into the model config (None: not saved, or no config here)."""
    mean, std = getattr(config, "reward_mean", None), getattr(config, "reward_std", None)
    return (float(mean), float(std)) if mean is not None and std is not None else None


@dataclass(frozen=True)
class ScoreRequest:
    """A reward-model call asking its scorer for `score_pairs` of `(contexts[i], completions[i])`: one reward each,
    or every output of each (`every_output`: a multi-head model's heads); `progress` as `Scorer.score_pairs`."""

    contexts: list[Any]
    completions: list[Any]
    progress: bool | None = None
    every_output: bool = False


class RewardModelEnvironment(PicklesByArguments, RewardFunction):
    """A reward model wrapped as a GRPO reward function (TRL's reward-function signature), scored in this process or
    on reward-model servers.

    It holds one scorer: a `RewardScorer` for a model loaded here (`trl_rm_env.scoring`, on vLLM or transformers as
    `engine` chooses, sharded under ZeRO-3 or FSDP2), or a `RemoteScorer` with `remote_url`
    (`trl_rm_env.serving.client`). Calling it is synchronous with a local scorer and asynchronous (a coroutine
    function, which TRL's `GRPOTrainer` awaits concurrently with its other reward functions) with a remote one; `score`
    likewise. Everything around the scorer (TRL's input checks, empty completions, NaN/inf, normalization, clipping,
    `reward_model_env/*` metrics) is the same for both (`RewardFunction`).

    Args:
        model: A Hub id or local path of a `*ForSequenceClassification` checkpoint, or a loaded model. With
            `remote_url`: the model name sent to the servers (None: the server's own).
        tokenizer: The RM's tokenizer, or a path/id to load it from. Defaults to the model's own. With `remote_url`,
            conversations are sent as token ids rendered with it (else `model`'s when it loads), or as messages.
        remote_url: Score on reward-model servers at this URL or these URLs (`trl-rm-env serve`, or vLLM
            `--runner pooling`) instead of loading the RM here.
        fsdp_shard: Shard the RM across the processes with FSDP2 `fully_shard` (each rank keeps 1/world_size of the
            weights between reward calls and gathers them for one call at a time). None (default): when the
            Accelerate config is FSDP version 2 and several processes run. Under DeepSpeed ZeRO-3 the RM is
            partitioned by `zero.Init` instead. `self.sharding` says which applies: `none`, `zero3` or `fsdp2`.
        options: A `ScoringOptions` instance; any of its options may also be given by name.
        **options_by_name: Every option of `ScoringOptions` (how the RM is loaded and scores: `batch_size`,
            `max_tokens_per_batch`, `max_length`, `truncation`, `precision`, `engine`, `prefix_sharing`, ...),
            `RewardOptions` (`name`, `normalization`, `clip`, `empty_completion_reward`), `GroupShaping` (NeMo Gym's
            group bonuses and length and style adjustments: `answer_length_coeff`, ...), `LengthShaping` (NeMo RL's
            `grpo.reward_shaping`: `overlong_buffer_length`, `stop_properly_penalty_coef`, ...), `ReferenceBound` (PAR:
            `reference_column`, `reference_temperature`), `EnsembleOptions` (`ensemble`, `ensemble_penalty`: a
            multi-head model's heads aggregated) and, with `remote_url`,
            `RemoteOptions` (`remote_api`, `remote_input`, `timeout`, `retries`, `api_key`, ...), by name; each is
            documented on its class.

    Raises:
        TypeError: a keyword argument that is no option (listing the accepted ones), or no model and no
            `remote_url`.
        ValueError: a bad option value; a server's option without `remote_url`, or with it an option that only a
            model loaded here applies (`batch_size`, `fsdp_shard`, `normalization="checkpoint"`, ...), each named.
    """

    def __init__(
        self,
        model: str | os.PathLike | PreTrainedModel | None = None,
        tokenizer: str | os.PathLike | PreTrainedTokenizerBase | None = None,
        *,
        remote_url: str | Sequence[str] | None = None,
        fsdp_shard: bool | None = None,
        options: ScoringOptions | None = None,
        **options_by_name: Any,
    ):
        self._remember(
            model=model, tokenizer=tokenizer, remote_url=remote_url, fsdp_shard=fsdp_shard, options=options, **options_by_name
        )  # what pickling sends (AsyncGRPO's spawned reward workers): `trl_rm_env.rewards.pickling`
        given = route(options_by_name, *OPTION_CLASSES, own=OWN_ARGUMENTS)
        self.bound, self.ensemble = ReferenceBound(**given[ReferenceBound]), EnsembleOptions(**given[EnsembleOptions])
        if self.bound.active and given[RewardOptions].get("normalization") == "checkpoint":
            raise ValueError(
                "reference_column bounds the reward in (0, 1); normalization='checkpoint' applies the checkpoint's "
                "statistics of raw scores, which mean nothing there: use 'running' or 'none'"
            )
        if self.ensemble.ensemble is not None and (remote_url is not None or self.bound.active):
            raise ValueError(
                "ensemble reads every head of a multi-head model loaded here, from one forward: not with remote_url "
                "(servers return one reward per item) nor with reference_column"
            )
        shaping, length_shaping = GroupShaping(**given[GroupShaping]), LengthShaping(**given[LengthShaping])
        scoring = ScoringOptions.build(options, **given[ScoringOptions])
        reward = RewardOptions(**given[RewardOptions])  # bad values fail here, before anything loads
        backend = connect("reward", type(self).__name__, model, tokenizer, options=scoring, remote_url=remote_url,
                          remote_values=given[RemoteOptions], name=reward.name, fsdp_shard=fsdp_shard, log=logger)
        scorer, head = backend.runs, backend.head
        self.model, self.tokenizer, self.engine = backend.model, backend.tokenizer, backend.engine
        self.sharding, self.remote_url, self._built_on = backend.sharding, backend.remote_url, backend.built_on
        if self.ensemble.ensemble is not None and backend.config.num_labels < 2:  # loaded here (remote_url refused)
            raise ValueError(
                f"ensemble aggregates the heads of a multi-head model; {backend.config._name_or_path} has one output"
            )
        if self.ensemble.ensemble is None and head is not None and head.ensemble > 1:
            logger.info("%s is an ensemble of %d heads (ensemble_heads): its reward is their mean (ensemble='mean'; "
                        "label_index=k reads head k alone).", backend.config._name_or_path, head.ensemble)  # fmt: skip
            self.ensemble = EnsembleOptions("mean")  # their metrics too (`ensemble_std`)
        self.show_progress = scoring.show_progress
        self._setup(
            scorer,
            reward,
            strip_reasoning=scoring.strip_reasoning,
            checkpoint_stats=checkpoint_statistics(backend.config),
            attributes=head.attributes if head is not None else (),
            shaping=shaping,
            length_shaping=length_shaping,
        )

    @classmethod
    def from_config(
        cls, config: Mapping[str, Any], reward_shaping: Mapping[str, Any] | None = None, **overrides: Any
    ) -> RewardModelEnvironment:
        """Build from a NeMo RL `env.reward_model` block (plus any of our own keyword arguments) and, optionally, its
        `grpo.reward_shaping` block (DAPO's overlong buffer, the stop-properly penalty: `LengthShaping`); see
        `trl_rm_env.rewards.nemo` for what is mapped, ignored and refused.
        """
        served = overrides.get("remote_url", config.get("remote_url")) is not None
        model, tokenizer, kwargs, chat_template = nemo.environment_arguments(config, cls.argument_names(), served)
        kwargs.update(nemo.length_shaping_arguments(reward_shaping))
        env = cls(model, tokenizer, **{**kwargs, **overrides})
        if chat_template is not nemo.NOT_SET:
            if env.tokenizer is None:  # remote, sending messages: the server renders them with its own template
                raise ValueError(
                    "tokenizer.chat_template is applied where conversations are rendered, here; with remote_url and "
                    "no reward-model tokenizer they go as messages that the server renders with its own template. "
                    "Give tokenizer.name (the reward model's tokenizer) so token ids are sent."
                )
            env.tokenizer.chat_template = nemo.nemo_chat_template(chat_template, env.tokenizer)
            env._remember(**{**env._arguments, "tokenizer": env.tokenizer})  # pickled with its template
        return env

    @classmethod
    def argument_names(cls) -> set[str]:
        """Every keyword argument of the environment: its own and every option's."""
        return {"remote_url", "fsdp_shard"} | {name for options in OPTION_CLASSES for name in names(options)}

    @property
    def attribute_weights(self) -> list[float] | None:
        """A regression RM's reward weights, in the order of `attributes` (None: a Bradley-Terry head, or remote)."""
        weights = getattr(getattr(self.scorer, "head", None), "weights", None)
        return None if weights is None else list(weights)

    def attribute_rewards(self, weighted: bool = False) -> list[AttributeReward]:
        """One TRL reward function per attribute of a regression reward model, named after it, all served by one
        forward per batch (`trl_rm_env.rewards.attributes`): for `GRPOConfig(multi_objective_aggregation=
        "normalize_then_sum", reward_weights=env.attribute_weights)` (GDPO), where each attribute is normalized within
        its group on its own. Each returns the attribute's raw value; empty completions get `empty_completion_reward`
        (when set), NaN/inf `nonfinite_reward` (else an error naming the items).

        `weighted=True` multiplies each attribute by its weight (`attribute_weights`), for trainers that sum reward
        functions without weights (AsyncGRPO's `_score_group`).

        Raises:
            ValueError: a Bradley-Terry (one-output) model, one behind servers (they return one reward per item),
                `normalization`, `clip`, an ensemble, a reference or a shaping set (each attribute is a raw value;
                GDPO normalizes), or `weighted` without weights.
        """
        given = {
            "normalization": self.normalization != "none",
            "clip": self.clip is not None,
            "ensemble": self.ensemble.ensemble is not None,
            "reference_column": self.bound.active,
            "group shaping": self.shaping.active,
            "length shaping": self.length_shaping.active,
        }
        post = [name for name, on in given.items() if on]
        if post:
            raise ValueError(
                f"{self.name}: attribute_rewards() returns raw attribute values (GDPO normalizes them per group); "
                f"drop {', '.join(post)}"
            )
        if weighted and self.attribute_weights is None:
            raise ValueError(f"{self.name}: attribute_rewards(weighted=True) needs attribute_weights")
        if self.remote_url is not None or len(self.attributes) < 2:
            raise ValueError(
                f"{self.name}: attribute_rewards() needs a regression reward model loaded here (several outputs); this "
                f"one {'is behind servers, which return one reward per item' if self.remote_url else 'has one reward'}"
            )
        shared = SharedOutputs(self)
        weights = self.attribute_weights if weighted else [1.0] * len(self.attributes)
        return [AttributeReward(shared, k, name, w) for k, (name, w) in enumerate(zip(self.attributes, weights))]

    def _attribute_outputs(self, prompts: Samples, completions: Samples, kwargs: dict[str, Any]) -> torch.Tensor:
        """`(N, attributes)` outputs of a batch for `attribute_rewards` (one scoring call for all of them)."""
        empty, to_score, _ = self._plan(prompts, completions)
        outputs = torch.full((len(prompts), len(self.attributes)), float("nan"), dtype=torch.float32)
        with self._holding():  # every rank enters: a collective under ZeRO-3
            if to_score:
                with self._nonfinite_named(to_score, "completions") as nonfinite:  # the fallbacks, named here
                    scored = self.scorer.score_pairs(
                        [prompts[i] for i in to_score], [completions[i] for i in to_score], every_output=True
                    )
                    nonfinite.extend(scored.nonfinite)
                outputs[torch.tensor(to_score)] = scored.scores
        if self.empty_completion_reward is not None and empty:
            outputs[torch.tensor(empty)] = float(self.empty_completion_reward)
        return outputs

    # ------------------------------------------------------------------ scoring
    @property
    def is_async(self) -> bool:
        """Servers score: the call is a coroutine function (one unpickled and not loaded yet is local: a remote one is
        rebuilt as it unpickles)."""
        return "_pending" not in self.__dict__ and self.scorer.is_async

    @staticmethod
    def _pending_name(arguments: dict[str, Any]) -> str:
        return str(arguments.get("name", RewardOptions().name))

    def _holding(self) -> contextlib.ExitStack:
        # One call at a time; entered on every rank, even one with nothing to score: under ZeRO-3 and FSDP2 gathering
        # is a collective. Running normalization and the attribute metrics read this call's state inside it.
        stack = contextlib.ExitStack()
        stack.enter_context(self._calls)
        stack.enter_context(full_weights(self.model, self.sharding))
        return stack

    def _answer(self, request: ScoreRequest) -> Any:
        """The request scored: a `ScoredPairs`, or an awaitable of one when servers score."""
        return self.scorer.score_pairs(
            request.contexts, request.completions, request.progress, every_output=request.every_output
        )

    def score(self, conversations: Sequence[Any]) -> Any:
        """Raw RM scores (fp32 tensor, input order) of full conversations or `(context, completion)` pairs: output
        `label_index` (or a regression head's weighted sum); no ensemble, reference, shaping, normalization, clipping or
        metrics, which make rewards (offline use and evaluation); a coroutine of them when servers score."""
        return self._drive(self._scoring(conversations))

    def _scoring(self, conversations: Sequence[Any]) -> Generator[ScoreRequest, Any, torch.Tensor]:
        contexts, completions = as_pairs(conversations)
        with self._nonfinite_named(range(len(contexts)), "conversations") as nonfinite:
            scored = yield ScoreRequest(contexts, completions)  # `as_pairs`' lists
            nonfinite.extend(scored.nonfinite)
        return scored.scores

    def _steps(
        self, prompts: Samples, completions: Samples, completion_ids: Ids, kwargs: Mapping[str, Any]
    ) -> Generator[ScoreRequest, Any, list[float]]:
        empty, to_score, rewards = self._plan(prompts, completions)
        references = self.bound.references(completions, kwargs, self.name) if self.bound.active else None
        nonfinite: list[int] = []
        outputs = None  # the model's raw outputs, a regression RM's attributes
        log_metric = kwargs.get("log_metric")
        if to_score:
            contexts, answers = [prompts[i] for i in to_score], [completions[i] for i in to_score]
            named = list(to_score)  # a reference's NaN is named by the first sample of its prompt
            if references is not None:  # one more answer per prompt, in the same call (the same forward)
                more_contexts, more_answers, pair_of = self.bound.pairs(prompts, references, to_score)
                first = {pair: i for i, pair in reversed(list(pair_of.items()))}
                contexts, answers = contexts + more_contexts, answers + more_answers
                named += [first[k] for k in range(len(more_contexts))]
            heads = self.ensemble.ensemble is not None
            with self._nonfinite_named(named, "completions") as nonfinite:
                scored = yield ScoreRequest(contexts, answers, bool(self.show_progress), heads)
                nonfinite.extend(scored.nonfinite)
            scores, outputs = scored.scores, scored.outputs
            if heads:  # every head from the one forward, aggregated
                if log_metric is not None:
                    for key, value in ensemble_metrics(scores).items():
                        log_metric(f"{self.metric_prefix}/{key}", value)
                scores = aggregate(scores, self.ensemble.ensemble, self.ensemble.ensemble_penalty)
            if references is not None:
                own, reference = scores[: len(to_score)], scores[len(to_score) :]
                scores = self.bound.bounded(own, reference[torch.tensor([pair_of[i] for i in to_score])])
                if log_metric is not None:
                    log_metric(f"{self.metric_prefix}/reference_mean", reference.mean().item())
            rewards[torch.tensor(to_score)] = scores
        rewards = self._filled(rewards, empty, (prompts, completions))
        samples = (prompts, completions, completion_ids)
        return self._finish(
            rewards, len(empty), log_metric, nonfinite=len(nonfinite), samples=samples, outputs=outputs
        )

    def __repr__(self) -> str:
        where = f"remote_url={self.remote_url!r}" if self.remote_url else f"model={self.scorer.config._name_or_path!r}"
        return f"{type(self).__name__}(name={self.name!r}, {where})"


class RemoteRewardModelEnvironment(RewardModelEnvironment):
    """`RewardModelEnvironment(model, tokenizer, remote_url=...)` with `remote_url` required: the reward model behind
    servers, an asynchronous reward function. Arguments as for `RewardModelEnvironment`."""

    def __init__(self, model: str | None = None, tokenizer: Any = None, *, remote_url: str | Sequence[str], **kwargs: Any):
        super().__init__(model, tokenizer, remote_url=remote_url, **kwargs)
