"""The bases of every reward function of the package.

`Reward`: TRL's reward-function call, written once as a generator of requests and run synchronously or awaited.
`RewardFunction`: what a reward function over a model does around its scorer (TRL's inputs checked
(`trl_rm_env.data.messages`), empty completions, NaN/inf scores, normalization, clipping and the metrics), with the
options of that post-processing (`RewardOptions`); `_plan`, then `_filled` and `_finish` bracket its model's
requests.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import math
import threading
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ..data.messages import check_sample, message_is_blank, strip_completion_reasoning
from ..distributed import world_size
from ..options import check_choices, document, option
from ..scoring.interfaces import NonfiniteScores, Scorer
from .shaping import GroupShaping, LengthShaping

logger = logging.getLogger(__name__)

# TRL's reward-function arguments: one prompt and one completion per sample (text or messages), and their token ids.
Samples = Sequence[Any]
Ids = Sequence[Sequence[int]] | None

NORMALIZATIONS = ("none", "running", "checkpoint")


@document
@dataclass(frozen=True)
class RewardOptions:
    """What a reward function does with the scores: its name, normalization, clipping and the reward of empty
    completions (the `Args` below are generated from the fields).

    Raises:
        ValueError: an unknown normalization, or `clip <= 0`.
    """

    name: str = option(
        "reward_model_env",
        help="The reward function's `__name__`: TRL logs `rewards/<name>/mean` (our own metrics are under "
        "`reward_model_env/*`).",
    )
    normalization: str = option(
        "none",
        choices=NORMALIZATIONS,
        help="`none`; `running` (running mean/std of all rewards so far); `checkpoint` (the `reward_mean` and "
        "`reward_std` that training saved into the model config).",
    )
    clip: float | None = option(None, help="Clip rewards (after normalization) to [-clip, clip].")
    empty_completion_reward: float | None = option(
        None,
        help="The reward of an empty or whitespace-only completion (judged after `strip_reasoning`). None: the RM "
        "scores it like any other answer; the count is logged as `reward_model_env/num_empty` either way.",
    )

    def __post_init__(self) -> None:
        check_choices(self)
        if self.clip is not None and self.clip <= 0:
            raise ValueError(f"clip must be > 0, got {self.clip}")


def completion_length(completion: Any, ids: Sequence[int] | None) -> int:
    """A completion's length: its token ids' count where TRL passed them, else the characters of its text."""
    if ids is not None:
        return len(ids)
    if isinstance(completion, str):
        return len(completion)
    return sum(len(m.get("content") or "") for m in completion)


def diagnostics(rewards: torch.Tensor, prompts: Samples, completions: Samples, ids: Ids) -> dict[str, float]:
    """A call's signs of reward hacking, from the rewards returned (NaN: none, left out):

    - `length_corr`: Pearson's correlation of reward and completion length (`completion_length`) over the call
      (absent when either is constant): rising, the policy is paid for length;
    - `flat_groups`: the share of GRPO groups (equal prompts, two samples or more) whose rewards are all equal: no
      advantage, no learning signal from them.
    """
    out: dict[str, float] = {}
    kept = [i for i in range(len(prompts)) if not torch.isnan(rewards[i])]
    if len(kept) >= 2:
        values = rewards[kept].double()
        lengths = torch.tensor(
            [completion_length(completions[i], None if ids is None else ids[i]) for i in kept], dtype=torch.float64
        )
        if values.std() > 0 and lengths.std() > 0:
            out["length_corr"] = float(torch.corrcoef(torch.stack([values, lengths]))[0, 1])
    groups: dict[str, list[float]] = {}
    for i in kept:
        groups.setdefault(repr(prompts[i]), []).append(float(rewards[i]))
    several = [g for g in groups.values() if len(g) >= 2]
    if several:
        out["flat_groups"] = sum(max(g) - min(g) == 0 for g in several) / len(several)
    return out


def is_empty(completion: Any) -> bool:
    """True for a completion with no text and no tool call (blank text, or only blank messages)."""
    if isinstance(completion, str):
        return not completion.strip()
    return all(message_is_blank(m) for m in completion)


@dataclass
class RewardCall:
    """What one reward call returns through `Reward.call`: TRL's rewards, and what a subclass found out on the way
    (`JudgeCall`'s judgements, `CascadeCall`'s routing). Returned, never kept on the reward: AsyncGRPO awaits several
    calls of one reward function at once, and each reads its own."""

    rewards: list[float | None]


class Reward:
    """The one base of the package's reward functions: TRL's reward-function call, `(prompts, completions,
    completion_ids=None, **kwargs) -> list[float | None]`, one way whether it runs synchronously or is awaited.

    A subclass writes its call once, as a generator, `_steps(prompts, completions, completion_ids, kwargs)`: it yields
    requests (a model's forward, a server's answer, another reward function's call), receives each answer
    (`_answer(request)`) and returns the rewards, or a `RewardCall` that holds them with what else the call found.
    `is_async` says which function `__call__` is: a plain one, run holding `_holding()` (a lock, gathered weights)
    across all the requests of a call, or a coroutine function (TRL awaits it, concurrently with its other reward
    functions) that awaits any answer that is awaitable. An answer that raises is thrown into the generator at the
    `yield` that asked, so the subclass's handlers there see it. `call(...)` is the same call returning the whole
    `RewardCall`.
    """

    __name__: str
    is_async: bool = False

    def _steps(
        self, prompts: Samples, completions: Samples, completion_ids: Ids, kwargs: Mapping[str, Any]
    ) -> Generator[Any, Any, list[Any]]:
        """One reward call: yields requests, receives their answers, returns one reward per sample."""
        raise NotImplementedError

    def _answer(self, request: Any) -> Any:
        """The answer to one request of `_steps` (with `is_async`, it may be awaitable)."""
        raise NotImplementedError

    def _holding(self) -> contextlib.AbstractContextManager[Any]:
        """What a synchronous call holds across all its requests (nothing, unless a subclass says)."""
        return contextlib.nullcontext()

    @property
    def __signature__(self) -> inspect.Signature:
        """The reward function's signature (`inspect.signature(reward)`): TRL's."""
        return inspect.signature(self.__call__)

    @property
    def __call__(self) -> Callable[..., Any]:
        """TRL's reward function; a coroutine function when `is_async` (TRL awaits it)."""
        return self._call_async if self.is_async else self._call

    def call(self, prompts: Samples, completions: Samples, completion_ids: Ids = None, **kwargs: Any) -> Any:
        """TRL's reward call returning its whole `RewardCall` (a coroutine of it when `is_async`): the rewards, and
        what the call found out (a judge's judgements, a cascade's routing)."""
        steps = self._steps(prompts, completions, completion_ids, kwargs)
        return self._whole_async(steps) if self.is_async else _whole(self._drive_sync(steps))

    async def _whole_async(self, steps: Generator[Any, Any, Any]) -> RewardCall:
        return _whole(await self._drive_async(steps))

    def _call(self, prompts: Samples, completions: Samples, completion_ids: Ids = None, **kwargs: Any) -> list[Any]:
        return _rewards(self._drive(self._steps(prompts, completions, completion_ids, kwargs)))

    async def _call_async(
        self, prompts: Samples, completions: Samples, completion_ids: Ids = None, **kwargs: Any
    ) -> list[Any]:
        return _rewards(await self._drive(self._steps(prompts, completions, completion_ids, kwargs)))

    def _drive(self, steps: Generator[Any, Any, Any]) -> Any:
        """Run a generator of requests to its result; with `is_async`, a coroutine of it."""
        return self._drive_async(steps) if self.is_async else self._drive_sync(steps)

    def _drive_sync(self, steps: Generator[Any, Any, Any]) -> Any:
        """`_drive_async`'s one loop, run to its end at once: a synchronous reward's answers are never awaitable, so
        the coroutine never suspends."""
        with self._holding():
            coroutine = self._drive_async(steps)
            try:
                coroutine.send(None)
            except StopIteration as done:
                return done.value
            coroutine.close()
            raise TypeError(f"{type(self).__name__} is synchronous, but one of its answers was awaitable")

    async def _drive_async(self, steps: Generator[Any, Any, Any]) -> Any:
        try:
            request = next(steps)
            while True:
                try:
                    answer = self._answer(request)
                    if inspect.isawaitable(answer):
                        answer = await answer
                except Exception as error:  # raised where it was asked for
                    request = steps.throw(error)
                else:
                    request = steps.send(answer)
        except StopIteration as done:
            return done.value


def _whole(result: Any) -> RewardCall:
    """A call's result as a `RewardCall` (a subclass that returns its rewards alone has nothing more to say)."""
    return result if isinstance(result, RewardCall) else RewardCall(result)


def _rewards(result: Any) -> list[Any]:
    """The rewards TRL receives from a call's result."""
    return result.rewards if isinstance(result, RewardCall) else result


class RewardFunction(Reward):
    """The reward pipeline around a `Scorer`: checks, empties, NaN/inf, normalization, clipping, metrics.

    Subclasses build their scorer and call `_setup`; `_plan`, then `_filled` and `_finish` bracket the requests of
    their `_steps`.
    """

    scorer: Scorer
    reward_options: RewardOptions
    metric_prefix = "reward_model_env"  # where `_log` puts the metrics
    name = property(lambda self: self.reward_options.name)
    normalization = property(lambda self: self.reward_options.normalization)
    clip = property(lambda self: self.reward_options.clip)
    empty_completion_reward = property(lambda self: self.reward_options.empty_completion_reward)

    def _setup(
        self,
        scorer: Scorer,
        options: RewardOptions,
        *,
        strip_reasoning: bool = False,
        checkpoint_stats: tuple[float, float] | None = None,
        attributes: Sequence[str] = (),
        shaping: GroupShaping | None = None,
        length_shaping: LengthShaping | None = None,
    ) -> None:
        """What every reward function holds (`checkpoint_stats`: `(mean, std)` for `normalization="checkpoint"`;
        `shaping`: the group shaping of its rewards, `length_shaping` NeMo RL's by response length, none by default).

        Raises:
            ValueError: `checkpoint` normalization without statistics.
        """
        if options.normalization == "checkpoint" and checkpoint_stats is None:
            raise ValueError(
                "normalization='checkpoint' needs `reward_mean` and `reward_std` in the model config; "
                "RankedRewardTrainer writes them when it trains with validation sets (a served reward model gives "
                "no config). Use 'running' instead."
            )
        self.scorer = scorer
        # One call at a time into a model loaded here: AsyncGRPO calls sync reward functions from several threads,
        # and a model's forward (prefix sharing's KV path above all) is not safe to run concurrently.
        self._calls = threading.Lock()
        self.reward_options = options
        self.__name__ = options.name  # TRL reads the reward function's name here
        self.strip_reasoning = strip_reasoning
        self.attributes = list(attributes)  # a regression RM's: the mean of each is logged
        self.shaping = shaping or GroupShaping()
        self.length_shaping = length_shaping or LengthShaping()
        self._warned_shaping = False
        self._checkpoint_stats = checkpoint_stats
        self._count, self._mean, self._m2 = 0, 0.0, 0.0  # running statistics (Welford)
        self.num_nonfinite = 0  # samples given `nonfinite_reward` so far (the first time is warned)
        self._warned_nonfinite = False

    @contextlib.contextmanager
    def _nonfinite_named(self, indices: Sequence[int], what: str):
        """Around one scoring call on the samples `indices`: yields a list that the caller fills with the result's
        `nonfinite` (the scorer's item numbers), which on leaving become the caller's samples (given
        `nonfinite_reward`, counted; warned the first time, naming the count); and re-raises the scorer's
        `NonfiniteScores` naming the caller's sample indices, not the scorer's."""
        found: list[int] = []
        try:
            yield found
        except NonfiniteScores as err:
            bad = [indices[i] for i in err.items]
            raise NonfiniteScores(
                f"{self.name}: the reward model returned NaN/inf for item(s) {bad[:10]}{'...' if len(bad) > 10 else ''}"
                f" of the {what} ({len(bad)} of {len(indices)} scored). Check the model dtype (fp16 overflows are "
                "common) or set `nonfinite_reward`.",
                bad,
            ) from err
        found[:] = [indices[i] for i in found]
        if found:
            self.num_nonfinite += len(found)
            if not self._warned_nonfinite:
                self._warned_nonfinite = True
                shown = ", ".join(f"{what}[{i}]" for i in found[:10]) + (" ..." if len(found) > 10 else "")
                logger.warning(
                    "%s: the reward model returned NaN/inf for %d of %d samples (%s); they get nonfinite_reward=%s. "
                    "Warned once: later ones are counted in `reward_model_env/num_nonfinite` and `num_nonfinite`.",
                    self.name,
                    len(found),
                    len(indices),
                    shown,
                    self.scorer.nonfinite_reward,
                )

    def _check_inputs(self, prompts: Sequence[Any], completions: Sequence[Any]) -> list[int]:
        """Validate TRL's inputs; return the indices of empty completions."""
        for what, value in (("prompts", prompts), ("completions", completions)):
            if isinstance(value, str | bytes | Mapping) or not isinstance(value, Sequence):
                raise TypeError(
                    f"{what} must be a list (one item per completion, as TRL passes them), got {type(value).__name__}"
                )
        if len(prompts) != len(completions):
            raise ValueError(
                f"{self.name}: got {len(prompts)} prompts but {len(completions)} completions; there must be one "
                "prompt per completion (TRL repeats each prompt num_generations times)."
            )
        for i, (prompt, completion) in enumerate(zip(prompts, completions)):
            check_sample(prompt, f"prompts[{i}]")
            check_sample(completion, f"completions[{i}]", completion=True)
            if isinstance(prompt, str) != isinstance(completion, str):
                raise TypeError(
                    f"prompts[{i}] and completions[{i}] must both be text or both be message lists, got "
                    f"{type(prompt).__name__} and {type(completion).__name__}."
                )
        # With strip_reasoning, a completion that is all `<think>` (or cut off mid-thought) has no answer: empty.
        strip = self.strip_reasoning
        return [i for i, c in enumerate(completions) if is_empty(strip_completion_reasoning(c) if strip else c)]

    def _plan(
        self, prompts: Samples, completions: Samples, dtype: torch.dtype = torch.float32
    ) -> tuple[list[int], list[int], torch.Tensor]:
        """Check TRL's inputs; return the empty completions, the samples to score and the rewards to fill (`dtype`:
        fp32 for a model's scores, fp64 where rewards are computed from parsed numbers, kept exact)."""
        empty = self._check_inputs(prompts, completions)
        skip = set(empty) if self.empty_completion_reward is not None else set()
        to_score = [i for i in range(len(prompts)) if i not in skip]
        return empty, to_score, torch.empty(len(prompts), dtype=dtype)

    def _filled(
        self,
        rewards: torch.Tensor,
        empty: Sequence[int],
        groups: tuple[Samples, Samples] | None = None,
        whole: bool = False,
    ) -> torch.Tensor:
        """The rewards with the empty completions' (`empty_completion_reward`, when set), then shaped group by group
        (`groups`: the prompts and completions these rewards are of; `whole`: of every process, not this one's
        share, which under several processes may hold part of a group: warned once)."""
        if self.empty_completion_reward is not None and len(empty):
            rewards[torch.tensor(list(empty))] = float(self.empty_completion_reward)
        if groups is not None and self.shaping.active:
            if not whole and world_size() > 1 and not self._warned_shaping:
                self._warned_shaping = True
                logger.warning(
                    "%s: group shaping reads each process's share of a call: a GRPO group that TRL splits between "
                    "processes (a per-device batch smaller than num_generations) is shaped in parts. Keep a "
                    "process's batch a multiple of num_generations. Warned once.",
                    self.name,
                )
            rewards = self.shaping.shape(rewards, *groups)
        return rewards

    def _finish(
        self,
        rewards: torch.Tensor,
        empty: int,
        log_metric,
        nonfinite: int | None = None,
        samples: tuple[Samples, Samples, Ids] | None = None,
        outputs: torch.Tensor | None = None,
    ) -> list[float | None]:
        """Normalization, length shaping (`LengthShaping`), clipping and metrics of `_filled` rewards (`empty`: how
        many completions were empty; `nonfinite`: how many samples got `nonfinite_reward`, logged as
        `reward_model_env/num_nonfinite` when known; `samples`: the call's prompts, completions and completion ids,
        for the diagnostics of reward hacking; `outputs`: the call's raw model outputs, a regression RM's attributes
        logged from them).
        A NaN reward is no reward: None to TRL (which leaves it out of the loss), left out of the statistics and the
        metrics."""
        kept = ~torch.isnan(rewards)
        raw = rewards.clone()
        rewards = self._normalize(rewards)
        unshaped = rewards  # the diagnostics read the reward before length shaping (its penalty would hide them)
        if self.length_shaping.active:
            rewards = self.length_shaping.shape(rewards, None if samples is None else samples[2], self.name)
        if self.clip is not None:
            rewards = rewards.clamp(-self.clip, self.clip)
        self._log(log_metric, raw[kept], rewards[kept], empty, nonfinite, outputs)
        if log_metric is not None and samples is not None:
            for key, value in diagnostics(unshaped, *samples).items():
                log_metric(f"{self.metric_prefix}/{key}", value)
        if kept.all():
            return rewards.tolist()
        return [value if keep else None for value, keep in zip(rewards.tolist(), kept.tolist())]

    # ------------------------------------------------------------------ normalization and metrics
    def _normalize(self, rewards: torch.Tensor) -> torch.Tensor:
        if self.normalization == "none" or rewards.numel() == 0:
            return rewards
        if self.normalization == "checkpoint":
            mean, std = self._checkpoint_stats
        else:
            for value in rewards[~torch.isnan(rewards)].double().tolist():  # Welford's update, all rewards so far
                self._count += 1
                delta = value - self._mean
                self._mean += delta / self._count
                self._m2 += delta * (value - self._mean)
            mean = self._mean
            std = math.sqrt(self._m2 / self._count) if self._count > 1 else 1.0
        return (rewards - mean) / max(std, 1e-6)

    def _log(
        self,
        log_metric: Callable[[str, float], None] | None,
        raw: torch.Tensor,
        rewards: torch.Tensor,
        empty: int,
        nonfinite: int | None = None,
        outputs: torch.Tensor | None = None,
    ):
        if log_metric is None or rewards.numel() == 0:
            return
        prefix = self.metric_prefix
        log_metric(f"{prefix}/num_samples", float(rewards.numel()))
        log_metric(f"{prefix}/mean_reward", rewards.mean().item())
        log_metric(f"{prefix}/std_reward", rewards.std(unbiased=False).item())
        log_metric(f"{prefix}/min_reward", rewards.min().item())
        log_metric(f"{prefix}/max_reward", rewards.max().item())
        log_metric(f"{prefix}/num_empty", float(empty))
        if nonfinite is not None:
            log_metric(f"{prefix}/num_nonfinite", float(nonfinite))
        attributes = self.attributes
        if attributes and outputs is not None:  # regression RM: mean of each predicted attribute
            for k, attribute in enumerate(attributes):
                column = outputs[:, k][~torch.isnan(outputs[:, k])]
                if column.numel():
                    log_metric(f"{prefix}/{attribute}_mean", column.mean().item())
        if self.normalization != "none":
            log_metric(f"{prefix}/raw_mean_reward", raw.mean().item())
