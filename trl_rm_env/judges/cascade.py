"""`CascadeReward`: reward sources tried in order per sample; the first that returns a number decides (a rule check
with an LLM judge as its fallback, as NeMo Gym's `math_with_judge`)."""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from trl.trainer.utils import is_async_callable

PASSED_WHOLE = ("trainer_state", "log_extra", "log_metric", "environments")
"""TRL's reward-function keywords that are not one value per sample: passed to every source unchanged."""


def _name(source: Callable[..., Any]) -> str:
    while isinstance(source, functools.partial):
        source = source.func
    return str(getattr(source, "__name__", type(source).__name__))


def _decided(value: Any) -> bool:
    return value is not None and not (isinstance(value, float) and math.isnan(value))


class CascadeReward:
    """Several TRL reward functions as one: per sample, the first source that returns a number (not None or NaN)
    gives the reward, and a later source is called only with the samples still undecided (the slices of `prompts`,
    `completions`, `completion_ids` and of every per-sample column TRL passes). A sample no source decides gets None
    (TRL's "no reward from this function").

    Works with any reward functions, ours (`JudgeEnvironment`, `RewardModelEnvironment`) or plain ones; asynchronous
    when any source is (TRL awaits it). Logs `judge_env/cascade_<source>` (samples each source decided) and
    `judge_env/cascade_undecided`.

        def exact_match(prompts, completions, answer, **kwargs):  # None where it cannot tell
            return [1.0 if c.strip() == a else None for c, a in zip(completions, answer)]

        reward = CascadeReward([exact_match, JudgeEnvironment(JUDGE, template=RUBRIC_WITH_REFERENCE)])

    Args:
        sources: The reward functions, in the order they are asked.
        name: The cascade's `__name__` (TRL logs `rewards/<name>/mean`).

    Raises:
        ValueError: no sources, or two with the same name.
    """

    def __init__(self, sources: Sequence[Callable[..., Any]], name: str = "cascade"):
        self.sources = list(sources)
        if not self.sources:
            raise ValueError("CascadeReward needs at least one reward source")
        self.source_names = [_name(s) for s in self.sources]
        if len(set(self.source_names)) != len(self.source_names):
            raise ValueError(f"CascadeReward's sources need distinct names (their metrics), got {self.source_names}")
        self.__name__ = name
        self.is_async = any(is_async_callable(s) for s in self.sources)  # TRL's own test
        self.last_calls: list[int] = []  # samples each source was called with, in the last call

    @property
    def __signature__(self) -> inspect.Signature:
        return inspect.signature(self.__call__)

    @property
    def __call__(self) -> Callable[..., Any]:
        """TRL's reward function; a coroutine function when any source is one."""
        return self._rewards_async if self.is_async else self._rewards

    def _steps(
        self, prompts: Sequence[Any], completions: Sequence[Any], completion_ids: Any, kwargs: Mapping[str, Any]
    ):
        """Yield `(source, its arguments)` for each source with undecided samples; receive its rewards."""
        n = len(prompts)
        rewards: list[float | None] = [None] * n
        undecided = list(range(n))
        self.last_calls = []
        counts: dict[str, float] = {}
        for source, name in zip(self.sources, self.source_names):
            if not undecided:
                counts[name] = 0.0
                self.last_calls.append(0)
                continue

            rows = list(undecided)

            def pick(values: Any, rows: list[int] = rows) -> Any:
                return [values[i] for i in rows]

            arguments = {
                "prompts": pick(prompts),
                "completions": pick(completions),
                "completion_ids": pick(completion_ids) if completion_ids is not None else None,
                **{
                    key: pick(value)
                    if key not in PASSED_WHOLE
                    and isinstance(value, Sequence)
                    and not isinstance(value, str)
                    and len(value) == n
                    else value
                    for key, value in kwargs.items()
                },
            }
            self.last_calls.append(len(undecided))
            answers = yield source, arguments
            if len(answers) != len(undecided):
                raise ValueError(
                    f"{self.__name__}: source {name!r} returned {len(answers)} rewards for {len(undecided)} samples"
                )
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
        return rewards

    def _rewards(self, prompts, completions, completion_ids=None, **kwargs: Any) -> list[float | None]:
        steps = self._steps(prompts, completions, completion_ids, kwargs)
        try:
            source, arguments = next(steps)
            while True:
                source, arguments = steps.send(source(**arguments))
        except StopIteration as done:
            return done.value

    async def _rewards_async(self, prompts, completions, completion_ids=None, **kwargs: Any) -> list[float | None]:
        steps = self._steps(prompts, completions, completion_ids, kwargs)
        try:
            source, arguments = next(steps)
            while True:
                answer = source(**arguments)
                if inspect.isawaitable(answer):
                    answer = await answer
                source, arguments = steps.send(answer)
        except StopIteration as done:
            return done.value
