"""Reward-model ensembles: several reward models' rewards (or a multi-head model's heads, read in one forward)
aggregated conservatively, which reduces over-optimization (Coste et al. 2023; Eisenstein et al. 2023).

- `RewardModelEnvironment(..., ensemble="min")` on a checkpoint with K outputs (`num_labels=K`, one per head): every
  head read from the same forward, aggregated per sample;
- `EnsembleReward([env_1, env_2, ...], ensemble="mean")`: separate reward functions (reward models local or behind
  servers, each with its own template and engine), called on the same samples (concurrently when any is
  asynchronous), then aggregated.

Aggregations: `mean`, `min` (worst case), `median`, `mean_minus_std` (uncertainty-weighted: mean - `ensemble_penalty`
x the members' std). Metrics: `<prefix>/ensemble_std` (the mean over samples of the members' std, rising as the policy
leaves the reward models' data) and `<prefix>/ensemble_member_<k>_mean`. An `EnsembleReward`'s members log their own
metrics too, under their own prefix (two reward models share `reward_model_env/*`, which TRL then averages).
"""

from __future__ import annotations

import asyncio
import functools
import math
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from trl.trainer.utils import is_async_callable

from ..options import check_choices, document, option
from .base import Ids, Reward, Samples

ENSEMBLES = ("mean", "min", "median", "mean_minus_std")


@document
@dataclass(frozen=True)
class EnsembleOptions:
    """How an ensemble's members become one reward (see the module docstring); the `Args` below are generated from
    the fields.

    Raises:
        ValueError: an unknown aggregation, or a negative penalty.
    """

    ensemble: str | None = option(
        None,
        choices=ENSEMBLES,
        help="Aggregate a multi-head checkpoint's heads (read in one forward): `mean`, `min`, `median` or "
        "`mean_minus_std`. None: the model's one reward (`label_index`), or for a checkpoint trained with "
        "`ensemble_heads` the mean of its heads.",
    )
    ensemble_penalty: float = option(1.0, help="`mean_minus_std`: the weight of the members' std.")

    def __post_init__(self) -> None:
        check_choices(self)
        if self.ensemble_penalty < 0:
            raise ValueError(f"ensemble_penalty must be >= 0, got {self.ensemble_penalty}")
        if self.ensemble_penalty != 1.0 and self.ensemble != "mean_minus_std":
            raise ValueError(f"ensemble_penalty weighs mean_minus_std's std; ensemble is {self.ensemble!r}")


def aggregate(members: torch.Tensor, how: str, penalty: float = 1.0) -> torch.Tensor:
    """One reward per row of `members` (`(N, K)`: each sample's K members) by `how`; a row with a NaN member is NaN."""
    values = members.double()
    if how == "mean":
        out = values.mean(dim=1)
    elif how == "min":
        out = values.min(dim=1).values
    elif how == "median":  # the mean of the two middle values for an even K
        ordered = values.sort(dim=1).values
        k = values.shape[1]
        out = (ordered[:, (k - 1) // 2] + ordered[:, k // 2]) / 2
    elif how == "mean_minus_std":
        out = values.mean(dim=1) - penalty * values.std(dim=1, unbiased=False)
    else:
        raise ValueError(f"ensemble must be one of {list(ENSEMBLES)}, got {how!r}")
    out[torch.isnan(values).any(dim=1)] = float("nan")
    return out.to(members.dtype)


def ensemble_metrics(members: torch.Tensor) -> dict[str, float]:
    """`ensemble_std` (the mean over samples of the members' std) and each member's mean, over the complete rows."""
    kept = members[~torch.isnan(members).any(dim=1)].double()
    if not len(kept):
        return {}
    out = {"ensemble_std": kept.std(dim=1, unbiased=False).mean().item()}
    out.update({f"ensemble_member_{k}_mean": kept[:, k].mean().item() for k in range(kept.shape[1])})
    return out


def _name(source: Callable[..., Any]) -> str:
    while isinstance(source, functools.partial):
        source = source.func
    return str(getattr(source, "__name__", type(source).__name__))


class EnsembleReward(Reward):
    """Several reward functions as one ensemble reward: each is called with the same samples (TRL's arguments; all at
    once when any is asynchronous, TRL awaiting the ensemble), and each sample's rewards are aggregated (`ensemble`,
    see the module docstring). Each member keeps its own template, engine, normalization and servers.

        reward = EnsembleReward([RewardModelEnvironment(RM_1), RewardModelEnvironment(RM_2, remote_url=URL)],
                                ensemble="min")

    Args:
        members: The reward functions (two or more, distinct names).
        ensemble: `mean`, `min`, `median` or `mean_minus_std`.
        ensemble_penalty: `mean_minus_std`'s weight of the std.
        name: The ensemble's `__name__` (TRL logs `rewards/<name>/mean`); its metrics go under `reward_model_env/`.

    Raises:
        ValueError: fewer than two members, two with one name, or a bad aggregation.
    """

    metric_prefix = "reward_model_env"

    def __init__(
        self,
        members: Sequence[Callable[..., Any]],
        ensemble: str = "mean",
        ensemble_penalty: float = 1.0,
        name: str = "ensemble",
    ):
        self.members = list(members)
        names = [_name(m) for m in self.members]
        if len(self.members) < 2 or len(set(names)) != len(names):
            raise ValueError(f"EnsembleReward needs two or more members with distinct names, got {names}")
        self.options = EnsembleOptions(ensemble, ensemble_penalty)
        if ensemble is None:
            raise ValueError(f"EnsembleReward needs an aggregation, one of {list(ENSEMBLES)}")
        self.member_names, self.__name__ = names, name
        self.is_async = any(is_async_callable(m) for m in self.members)

    def _steps(
        self, prompts: Samples, completions: Samples, completion_ids: Ids, kwargs: Mapping[str, Any]
    ) -> Generator[Any, Any, list[float | None]]:
        arguments = {"prompts": prompts, "completions": completions, "completion_ids": completion_ids, **kwargs}
        answers = yield arguments
        columns = []
        for name, rewards in zip(self.member_names, answers):
            if len(rewards) != len(prompts):
                raise ValueError(f"{self.__name__}: member {name!r} returned {len(rewards)} rewards for {len(prompts)}")
            columns.append([math.nan if r is None else float(r) for r in rewards])
        members = torch.tensor(columns, dtype=torch.float64).T
        rewards = aggregate(members, self.options.ensemble, self.options.ensemble_penalty)
        log_metric = kwargs.get("log_metric")
        if log_metric is not None and len(prompts):
            for key, value in ensemble_metrics(members).items():
                log_metric(f"{self.metric_prefix}/{key}", value)
        return [None if math.isnan(r) else r for r in rewards.tolist()]

    def _answer(self, request: dict[str, Any]) -> Any:
        """Every member called on the call's arguments (concurrently when any is asynchronous)."""
        if not self.is_async:
            return [member(**request) for member in self.members]

        async def all_members() -> list[Any]:  # a synchronous member in a thread: it never holds the event loop
            calls = [
                member(**request) if is_async_callable(member) else asyncio.to_thread(member, **request)
                for member in self.members
            ]
            return list(await asyncio.gather(*calls))

        return all_members()

    def __repr__(self) -> str:
        return f"EnsembleReward({self.member_names}, ensemble={self.options.ensemble!r})"

