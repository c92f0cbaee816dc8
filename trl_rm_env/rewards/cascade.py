"""`CascadeReward`: reward sources tried in order per sample; the first that returns a number decides (a rule check
with an LLM judge as its fallback, as NeMo Gym's `math_with_judge`); or, with `margin`, a reward model decides the
GRPO groups it separates by at least that margin and the judge the others (what `trl-rm-env eval --cascade` measures)."""

from __future__ import annotations

import functools
import json
import logging
import math
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from trl.trainer.utils import is_async_callable

from .base import Reward, RewardCall

logger = logging.getLogger(__name__)

PASSED_WHOLE = ("trainer_state", "log_extra", "log_metric")
"""TRL's reward-function keywords that are not one value per sample: passed to every source unchanged (`log_extra`
wrapped so that a source called on some samples logs a full column). Every other keyword holding one value per
sample (the dataset's columns, TRL's `environments`) is sliced."""


def _name(source: Callable[..., Any]) -> str:
    while isinstance(source, functools.partial):
        source = source.func
    return str(getattr(source, "__name__", type(source).__name__))


def _scattered(log_extra: Callable[[str, list[Any]], Any], rows: list[int], n: int) -> Callable[..., Any]:
    """TRL's `log_extra(column, values)` for a source called on `rows` of `n` samples: its values placed at their rows
    (None elsewhere), so TRL's completions table stays aligned."""

    def log(column: str, values: Sequence[Any]) -> Any:
        full: list[Any] = [None] * n
        for i, value in zip(rows, values):
            full[i] = value
        return log_extra(column, full)

    return log


def _argument(key: str, value: Any, rows: list[int], n: int) -> Any:
    """One of TRL's keyword arguments for a source called on `rows` of the `n` samples."""
    if key == "log_extra" and callable(value) and len(rows) < n:
        return _scattered(value, rows, n)
    if key not in PASSED_WHOLE and isinstance(value, Sequence) and not isinstance(value, str) and len(value) == n:
        return [value[i] for i in rows]
    return value


def _decided(value: Any) -> bool:
    if value is None:
        return False
    try:
        return not math.isnan(float(value))  # numpy and torch NaN too
    except (TypeError, ValueError):
        return True  # not a number: the caller's reward, passed on as TRL would get it


_WARNED_SIZES: list[bool] = []  # the margin rule's warning about uneven groups, once per process


def separates(values: Sequence[Any], margin: float) -> bool:
    """Whether a group's rewards are all numbers and every two of them at least `margin` apart."""
    if not all(_decided(v) for v in values):
        return False
    ordered = sorted(float(v) for v in values)
    return all(b - a >= margin for a, b in zip(ordered, ordered[1:]))


def _routed(
    prompts: Sequence[Any], rows: Sequence[int], answers: Sequence[Any], margin: float, rewards: list[float | None]
) -> list[int]:
    """The margin rule: fill `rewards` for the groups (equal prompts) that `answers` separate by `margin`; return the
    samples of the other groups."""
    groups: dict[str, list[int]] = {}
    for k, i in enumerate(rows):
        groups.setdefault(json.dumps(prompts[i], sort_keys=True, default=str), []).append(k)
    sizes = {len(members) for members in groups.values()}
    if len(sizes) > 1 and not _WARNED_SIZES:
        _WARNED_SIZES.append(True)
        logger.warning(
            "CascadeReward: the groups of this call have %s completions; the margin rule routes each group it sees "
            "whole, so a GRPO group split across processes is routed in parts (its parts may be rewarded by "
            "different sources). Warned once.",
            sorted(sizes),
        )
    still = []
    for members in groups.values():
        if separates([answers[k] for k in members], margin):
            for k in members:
                rewards[rows[k]] = float(answers[k])
        else:
            still += [rows[k] for k in members]
    return sorted(still)


@dataclass
class CascadeCall(RewardCall):
    """One `CascadeReward.call`: the rewards, how many samples each source was called with (`calls`, in order), and
    each source's own `RewardCall` (`sources`: a judge's judgements; a plain function's rewards alone)."""

    calls: list[int] = field(default_factory=list)
    sources: list[RewardCall] = field(default_factory=list)


class CascadeReward(Reward):
    """Several TRL reward functions as one: per sample, the first source that returns a number (not None or NaN)
    gives the reward, and a later source is called only with the samples still undecided (the slices of `prompts`,
    `completions`, `completion_ids` and of every per-sample column TRL passes; empty ones when none is left, since
    under several processes a source may be a collective every process enters). A sample no source decides gets None
    (TRL's "no reward from this function").

    Works with any reward functions, ours (`JudgeEnvironment`, `RewardModelEnvironment`) or plain ones; asynchronous
    when any source is (TRL awaits it). Logs `judge_env/cascade_<source>` (samples each source decided) and
    `judge_env/cascade_undecided`; `call(...)` also returns how many samples each source was called with, and what
    each source's call returned (`CascadeCall`).

        def exact_match(prompts, completions, answer, **kwargs):  # None where it cannot tell
            return [1.0 if c.strip() == a else None for c, a in zip(completions, answer)]

        reward = CascadeReward([exact_match, JudgeEnvironment(JUDGE, template=RUBRIC_WITH_REFERENCE)])

    With `margin`, the first source (a reward model) is routed group by group: it scores every sample, and its rewards
    stand for each GRPO group (the samples of the call with equal prompts) whose completions it separates by at least
    `margin` (every two of them that far apart; for a preference pair, its margin; a lone completion is decided);
    the samples of the other groups go, as whole groups, to the next sources. Each group is rewarded by one source,
    so GRPO's advantages, computed within a group, never mix the reward model's scale with the judge's.

        reward = CascadeReward([RewardModelEnvironment(RM), JudgeEnvironment(JUDGE, mode="pairwise")], margin=1.0)

    Args:
        sources: The reward functions, in the order they are asked.
        name: The cascade's `__name__` (TRL logs `rewards/<name>/mean`).
        margin: Route by the first source's margin (> 0), group by group; None: the first number decides.

    Raises:
        ValueError: no sources, or two with the same name; a `margin` that is not > 0, or with one source.
    """

    def __init__(self, sources: Sequence[Callable[..., Any]], name: str = "cascade", margin: float | None = None):
        self.sources = list(sources)
        if not self.sources:
            raise ValueError("CascadeReward needs at least one reward source")
        if margin is not None and (not math.isfinite(margin) or margin <= 0 or len(self.sources) < 2):
            raise ValueError(
                f"CascadeReward: margin must be a finite number > 0, with a source after the reward model that it "
                f"routes from (got margin={margin!r} and {len(self.sources)} source(s))"
            )
        self.margin = margin
        self.source_names = [_name(s) for s in self.sources]
        if len(set(self.source_names)) != len(self.source_names):
            raise ValueError(f"CascadeReward's sources need distinct names (their metrics), got {self.source_names}")
        self.__name__ = name
        self.is_async = any(is_async_callable(s) for s in self.sources)  # TRL's own test
        for source, name in zip(self.sources[1:], self.source_names[1:]):
            mode = getattr(source, "mode", None)
            if getattr(mode, "compares", False) and margin is None:  # with a margin, groups are routed whole
                logger.warning(
                    "CascadeReward: %s is a %s judge after another source: it compares only the completions of a "
                    "group that the sources before it left undecided (a pointwise judge judges each on its own).",
                    name,
                    mode.name,
                )

    def _answer(self, request: tuple[Callable[..., Any], dict[str, Any]]) -> Any:
        """A source called with its samples: its `RewardCall` (an awaitable of it from an async source); a plain
        function's rewards."""
        source, arguments = request
        return source.call(**arguments) if isinstance(source, Reward) else source(**arguments)

    def _steps(
        self, prompts: Sequence[Any], completions: Sequence[Any], completion_ids: Any, kwargs: Mapping[str, Any]
    ) -> Generator[tuple[Callable[..., Any], dict[str, Any]], Any, CascadeCall]:
        """Yield `(source, its arguments: the undecided samples)` for each source; receive its rewards."""
        n = len(prompts)
        rewards: list[float | None] = [None] * n
        undecided = list(range(n))
        result = CascadeCall(rewards)
        counts: dict[str, float] = {}
        for source, name in zip(self.sources, self.source_names):
            # Every source is called, with no samples when none is left: under several processes a source may be a
            # collective (a judge gathering whole groups, a sharded model), which every process must enter.
            rows = list(undecided)
            arguments = {
                "prompts": [prompts[i] for i in rows],
                "completions": [completions[i] for i in rows],
                "completion_ids": None if completion_ids is None else [completion_ids[i] for i in rows],
                **{key: _argument(key, value, rows, n) for key, value in kwargs.items()},
            }
            result.calls.append(len(undecided))
            answered = yield source, arguments
            result.sources.append(answered if isinstance(answered, RewardCall) else RewardCall(answered))
            answers = result.sources[-1].rewards
            if len(answers) != len(undecided):
                raise ValueError(
                    f"{self.__name__}: source {name!r} returned {len(answers)} rewards for {len(undecided)} samples"
                )
            if self.margin is not None and source is self.sources[0]:
                still = _routed(prompts, undecided, answers, self.margin, rewards)
            else:
                still = []
                for i, value in zip(undecided, answers):
                    if _decided(value):
                        rewards[i] = float(value)
                    else:
                        still.append(i)
            counts[name] = float(len(undecided) - len(still))
            undecided = still
        log_metric = kwargs.get("log_metric")
        if log_metric is not None and n:
            for name, count in counts.items():
                log_metric(f"judge_env/cascade_{name}", count)
            log_metric("judge_env/cascade_undecided", float(len(undecided)))
        return result
