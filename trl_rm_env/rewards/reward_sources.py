"""The reward functions of a GRPO run, from what it names as its reward sources.

A run's reward is a reward model (loaded here, or behind servers), a generative judge, both (two reward functions,
in that order, weighed by TRL's `reward_weights`), a cascade of the two (one reward: the reward model's where it
separates a group by `cascade_margin`, else the judge's), a regression reward model's attributes as one reward
function each (GDPO), or an ensemble of the reward model with more reward models (`EnsembleReward`, one reward).
`RewardSources` holds that choice and refuses a combination that cannot apply, in the options' own names, for the
GRPO recipe (`reward_*` keys) and a library user alike.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..options import changed, option_fields, recipe_key
from ..runtime.model_options import ScoringOptions
from ..serving.client.remote_options import RemoteOptions, local_only
from .base import RewardOptions


def recipe_keys(names: list[str]) -> str:
    """Reward-model options named by their `reward_*` keys (the names the refusals below use)."""
    keys = {f.name: recipe_key(f) for cls in (ScoringOptions, RemoteOptions, RewardOptions) for f in option_fields(cls)}
    return ", ".join(keys.get(name) or name for name in names)


@dataclass
class RewardSources:
    """What a GRPO run is rewarded by (see the module docstring); `check()` on creation.

    Args:
        reward_model: The reward model's path or Hub id (None: no reward model, or one behind servers).
        reward_options: `RewardModelEnvironment`'s keyword arguments besides the model: `options` (its
            `ScoringOptions`), `remote_url` for servers, and the others given.
        judge: The judge model's path or Hub id (None with `judge_options`: the judge is behind a server).
        judge_options: `JudgeEnvironment`'s keyword arguments besides the model, or None: no judge.
        cascade_margin: One cascade reward, the reward model's for groups it separates by this margin, else the
            judge's (`CascadeReward`).
        per_attribute: A regression reward model's attributes as one reward function each.
        ensemble_members: More reward models, each a mapping of `RewardModelEnvironment` arguments (`model`, and
            `remote_url`, `name`, any option; JSON text is read): with the reward model, one `EnsembleReward`
            aggregated by the reward options' `ensemble` (default `mean`) and `ensemble_penalty`.
    """

    reward_model: str | None = None
    reward_options: Mapping[str, Any] = field(default_factory=dict)
    judge: str | None = None
    judge_options: Mapping[str, Any] | None = None
    cascade_margin: float | None = None
    per_attribute: bool = False
    ensemble_members: Sequence[Mapping[str, Any] | str] | None = None

    def __post_init__(self) -> None:
        if self.ensemble_members:
            self.ensemble_members = [_member(i, m) for i, m in enumerate(self.ensemble_members)]
        self.check()

    @property
    def with_reward_model(self) -> bool:
        """Whether a reward model scores (loaded here, or the servers' own at `remote_url`)."""
        return self.reward_model is not None or bool(self.reward_options.get("remote_url"))

    def check(self) -> None:
        """Refuse a combination that cannot apply (`ValueError`, naming the recipe's keys): no source; options of a
        reward model without one; options of servers without `remote_url`, or with it options that only a reward model
        loaded here applies; a cascade without both sources or beside `per_attribute`."""
        with_rm, with_judge, margin = self.with_reward_model, self.judge_options is not None, self.cascade_margin
        if not with_rm and not with_judge:
            raise ValueError("reward_model is null and no reward_judge is given: GRPO needs a reward source")
        options = self.reward_options.get("options")
        remote = {f.name for f in option_fields(RemoteOptions)} & set(self.reward_options)
        remote_url = self.reward_options.get("remote_url")
        if remote and not remote_url:
            raise ValueError(
                f"{recipe_keys(sorted(remote))} apply with reward_remote_url (a reward model behind servers)"
            )
        local = local_only(options) if options is not None and remote_url else []
        if local:
            raise ValueError(
                f"{recipe_keys(local)}: applied by a reward model loaded here; with reward_remote_url give them to the "
                "server instead (`trl-rm-env serve --help`)"
            )
        others = [n for n, v in self.reward_options.items() if n != "options" and (n != "tokenizer" or v)]
        given = sorted([*(changed(options) if options is not None else ()), *others])
        if not with_rm and given:
            raise ValueError(f"reward_model is null (no reward model), but options of one are given: {', '.join(given)}")
        if self.per_attribute and not with_rm:
            raise ValueError("reward_per_attribute needs a reward model (reward_model is null)")
        if self.ensemble_members and (not with_rm or self.per_attribute or margin is not None):
            raise ValueError("reward_ensemble_members are aggregated with the reward model into one reward: give a "
                             "reward model (reward_model or reward_remote_url), without reward_per_attribute and "
                             "reward_cascade_margin")  # fmt: skip
        if margin is None:
            return
        if not (math.isfinite(margin) and margin > 0):
            raise ValueError(f"reward_cascade_margin must be > 0, got {margin}")
        if not (with_rm and with_judge):
            raise ValueError("reward_cascade_margin routes between a reward model and a judge: give reward_judge and "
                             "a reward model (reward_model or reward_remote_url)")  # fmt: skip
        if self.per_attribute:
            raise ValueError("reward_cascade_margin routes one reward model's rewards; reward_per_attribute splits them")

    def build(self, reward_weights: list[float] | None = None) -> tuple[list[Callable], list[float] | None]:
        """The reward functions, loaded, in TRL's order, and the weights to train with: `reward_weights` as given
        (one per function, else a `ValueError` naming both counts, before TRL's own message), else under
        `per_attribute` the regression model's attribute weights (and 1 for a judge beside them), else None (TRL's
        default: all 1)."""
        from .cascade import CascadeReward
        from .ensemble import EnsembleReward
        from .judge import JudgeEnvironment
        from .reward_model import RewardModelEnvironment

        rewards: list[Callable] = []
        weights: list[float] = []  # the default under `per_attribute`: the model's own attribute weights, 1 for a judge
        if self.with_reward_model:
            options = dict(self.reward_options)
            if self.ensemble_members:  # the aggregation is the members', not the reward model's heads
                how, penalty = options.pop("ensemble", None) or "mean", options.pop("ensemble_penalty", 1.0)
            environment = RewardModelEnvironment(self.reward_model, **options)
            if self.per_attribute:  # GDPO: each attribute normalized within its group on its own
                rewards += environment.attribute_rewards()
                weights += environment.attribute_weights or [1.0] * len(rewards)
            elif self.ensemble_members:  # one reward: the members' rewards aggregated per sample
                members = [environment] + [
                    RewardModelEnvironment(m.get("model"), **{k: v for k, v in m.items() if k != "model"})
                    for m in self.ensemble_members
                ]
                rewards.append(EnsembleReward(members, ensemble=how, ensemble_penalty=penalty))
                weights.append(1.0)
            else:
                rewards.append(environment)
                weights.append(1.0)
        if self.judge_options is not None:
            judge = JudgeEnvironment(self.judge, **self.judge_options)
            if self.cascade_margin is not None:  # one reward: the RM where it separates a group, else the judge
                rewards = [CascadeReward([rewards[0], judge], margin=self.cascade_margin)]
            else:
                rewards.append(judge)
                weights.append(1.0)
        if reward_weights is None:
            return rewards, weights if self.per_attribute else None
        if len(reward_weights) != len(rewards):
            built = ("one reward (reward_cascade_margin: the reward model's where it separates a group, else the "
                     "judge's)" if self.cascade_margin is not None else f"{len(rewards)} reward function(s)")  # fmt: skip
            raise ValueError(f"reward_weights has {len(reward_weights)} weight(s) but the recipe builds {built}: give "
                             f"{len(rewards)} weight(s) or drop reward_weights")  # fmt: skip
        return rewards, list(reward_weights)


def _member(index: int, value: Mapping[str, Any] | str) -> dict[str, Any]:
    """One `ensemble_members` entry as `RewardModelEnvironment` arguments (JSON text read), with a `model` or a
    `remote_url`.

    Raises:
        ValueError: not a JSON object, or neither `model` nor `remote_url`, naming the entry.
    """
    from ..runtime.model_options import json_object

    try:
        member = json_object(value)
    except ValueError as err:
        raise ValueError(f"reward_ensemble_members[{index}]: {err}") from None
    if not (member.get("model") or member.get("remote_url")):
        raise ValueError(f"reward_ensemble_members[{index}] needs a `model` (a path or Hub id) or a `remote_url`: "
                         f"got {member}")  # fmt: skip
    return member
