"""`RewardSources`: a GRPO run's reward functions and weights from its sources, and the combinations it refuses (the
GRPO recipe's messages, raised for a library user too, asserted whole). `build()`'s wiring (which options reach which
reward function) is checked with stand-ins for the environments against what its docstring promises."""

from __future__ import annotations

import math
import re

import pytest

from trl_rm_env import CascadeReward, JudgeEnvironment, RewardModelEnvironment
from trl_rm_env.rewards.reward_sources import RewardSources
from trl_rm_env.runtime.model_options import ScoringOptions


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({}, "reward_model is null and no reward_judge is given: GRPO needs a reward source"),
        ({"judge": "j", "judge_options": {}, "reward_options": {"options": ScoringOptions(batch_size=4)}},
         "reward_model is null (no reward model), but options of one are given: batch_size"),
        ({"judge": "j", "judge_options": {}, "reward_options": {"tokenizer": "t", "device": "cpu"}},
         "reward_model is null (no reward model), but options of one are given: device, tokenizer"),
        ({"judge": "j", "judge_options": {}, "per_attribute": True},
         "reward_per_attribute needs a reward model (reward_model is null)"),
        ({"reward_model": "rm", "judge": "j", "judge_options": {}, "cascade_margin": 0.0},
         "reward_cascade_margin must be > 0, got 0.0"),
        ({"reward_model": "rm", "judge": "j", "judge_options": {}, "cascade_margin": math.inf},
         "reward_cascade_margin must be > 0, got inf"),
        ({"reward_model": "rm", "cascade_margin": 1.0},
         "reward_cascade_margin routes between a reward model and a judge: give reward_judge and a reward model "
         "(reward_model or reward_remote_url)"),
        ({"reward_model": "rm", "judge": "j", "judge_options": {}, "cascade_margin": 1.0, "per_attribute": True},
         "reward_cascade_margin routes one reward model's rewards; reward_per_attribute splits them"),
        ({"judge": "j", "judge_options": {}, "ensemble_members": [{"model": "rm2"}]},
         "reward_ensemble_members are aggregated with the reward model into one reward: give a reward model "
         "(reward_model or reward_remote_url), without reward_per_attribute and reward_cascade_margin"),
        ({"reward_model": "rm", "per_attribute": True, "ensemble_members": [{"model": "rm2"}]},
         "reward_ensemble_members are aggregated with the reward model into one reward: give a reward model "
         "(reward_model or reward_remote_url), without reward_per_attribute and reward_cascade_margin"),
        ({"reward_model": "rm", "ensemble_members": [{"model": "rm2"}, '{"name": "b"}']},
         "reward_ensemble_members[1] needs a `model` (a path or Hub id) or a `remote_url`: got {'name': 'b'}"),
        ({"reward_model": "rm", "ensemble_members": ["rm2"]},
         "reward_ensemble_members[0]: expected a JSON object such as '{\"enable_thinking\": false}', got 'rm2'"),
        ({"reward_options": {"remote_url": "http://rm:8000", "options": ScoringOptions(batch_size=4)}},
         "reward_batch_size: applied by a reward model loaded here; with reward_remote_url give them to the server "
         "instead (`trl-rm-env serve --help`)"),
    ],
)  # fmt: skip
def test_a_combination_that_cannot_apply_is_refused_before_any_model_loads(kwargs, message):
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        RewardSources(**kwargs)


def test_ensemble_members_make_one_ensemble_reward_aggregated_as_the_reward_options_say(tiny_dir):
    """`ensemble_members` (the recipe's `reward_ensemble_members`, JSON text or mappings): with the reward model, one
    `EnsembleReward` whose aggregation is `ensemble` (taken from the reward model, which keeps its one head); its
    rewards are the members' per sample, aggregated."""
    import json

    from trl_rm_env import EnsembleReward

    rm = str(tiny_dir / "reward_model")
    sources = RewardSources(reward_model=rm, reward_options={"name": "first", "ensemble": "min", "device": "cpu"},
                            ensemble_members=[json.dumps({"model": rm, "name": "second", "normalization": "none",
                                                          "clip": 0.001, "device": "cpu"})])  # fmt: skip
    (reward,), weights = sources.build()
    assert isinstance(reward, EnsembleReward) and weights is None
    assert reward.member_names == ["first", "second"] and reward.options.ensemble == "min"
    prompts = [[{"role": "user", "content": "Hi"}]] * 2
    completions = [[{"role": "assistant", "content": text}] for text in ("Hello.", "Hey there, friend.")]
    first, second = (m(prompts=prompts, completions=completions) for m in reward.members)
    want = [min(a, b) for a, b in zip(first, second)]  # "min": each sample's worse member
    assert all(a != b for a, b in zip(first, second))  # the second clipped: "min" is told from "mean" and "max"
    assert reward(prompts=prompts, completions=completions) == pytest.approx(want, abs=1e-12)


def test_servers_are_a_reward_model_and_an_empty_tokenizer_is_no_option():
    RewardSources(reward_options={"remote_url": ["http://rm:8000"]}, judge="j", judge_options={}, cascade_margin=1.0)
    RewardSources(judge="j", judge_options={}, reward_options={"tokenizer": None, "options": ScoringOptions()})


@pytest.fixture(scope="module")
def regression_rm(tiny_tokenizer, tmp_path_factory):
    from trl_rm_env.heads import set_regression_labels
    from trl_rm_env.tiny_models import build_tiny_reward_model

    path = tmp_path_factory.mktemp("regression-rm")
    model = build_tiny_reward_model(tiny_tokenizer, num_labels=3)
    set_regression_labels(model.config, ["helpfulness", "correctness", "verbosity"], [1.0, 0.5, -0.25])
    model.save_pretrained(path)
    tiny_tokenizer.save_pretrained(path)
    return str(path)


def test_per_attribute_rewards_beside_a_judge_weigh_as_the_model_says_and_the_judge_one(regression_rm, tiny_dir):
    judge = {"tokenizer": None, "engine": "hf"}
    sources = RewardSources(regression_rm, {"options": ScoringOptions()}, str(tiny_dir / "policy"), judge,
                            per_attribute=True)  # fmt: skip
    rewards, weights = sources.build()
    assert [type(r).__name__ for r in rewards[:3]] == ["AttributeReward"] * 3
    assert isinstance(rewards[3], JudgeEnvironment) and len(rewards) == 4
    assert weights == [1.0, 0.5, -0.25, 1.0]  # TRL's reward_weights: one per reward function
    rewards, weights = sources.build([1.0, 1.0, 1.0, 2.0])
    assert len(rewards) == 4 and weights == [1.0, 1.0, 1.0, 2.0]
    with pytest.raises(ValueError, match=r"^reward_weights has 2 weight\(s\) but the recipe builds 4 reward "
                                         r"function\(s\): give 4 weight\(s\) or drop reward_weights$"):
        sources.build([1.0, 1.0])


def test_without_per_attribute_trl_keeps_its_default_weights_and_a_cascade_is_one_reward(tiny_dir):
    rm, judge = str(tiny_dir / "reward_model"), {"tokenizer": None, "engine": "hf"}
    rewards, weights = RewardSources(rm, {}, str(tiny_dir / "policy"), judge).build()
    assert [type(r) for r in rewards] == [RewardModelEnvironment, JudgeEnvironment] and weights is None
    cascade = RewardSources(rm, {}, str(tiny_dir / "policy"), judge, cascade_margin=0.5)
    rewards, weights = cascade.build()
    assert len(rewards) == 1 and isinstance(rewards[0], CascadeReward) and weights is None
    with pytest.raises(ValueError, match=re.escape(
            "reward_weights has 2 weight(s) but the recipe builds one reward (reward_cascade_margin: the reward model's "
            "where it separates a group, else the judge's): give 1 weight(s) or drop reward_weights") + "$"):  # fmt: skip
        cascade.build([1.0, 1.0])


class Built:
    """A stand-in for `RewardModelEnvironment` and `JudgeEnvironment` in `build()`: what each was built with."""

    def __init__(self, model=None, **options):
        self.model, self.options = model, options
        self.__name__ = options.get("name", "built")

    def __call__(self, prompts, completions, **kwargs):
        return [0.0] * len(completions)


@pytest.fixture
def stand_ins(monkeypatch):
    from trl_rm_env.rewards import judge, reward_model

    monkeypatch.setattr(reward_model, "RewardModelEnvironment", Built)
    monkeypatch.setattr(judge, "JudgeEnvironment", Built)


def test_build_passes_each_source_its_own_options(stand_ins):
    """What the docstring promises, wired: the ensemble's aggregation taken from the reward options (default `mean`,
    `ensemble_penalty` default 1) and not given to the reward model; each member built from its own mapping (a member
    with only a `remote_url` is one); the judge built from `judge_options`; the cascade routed by `cascade_margin`."""
    from trl_rm_env import EnsembleReward

    members = [{"model": "rm2", "name": "b"}, {"remote_url": "http://rm:8000", "name": "c"}]
    (reward,), weights = RewardSources("rm", {"name": "a", "device": "cpu"}, ensemble_members=members).build()
    assert isinstance(reward, EnsembleReward) and weights is None
    assert (reward.options.ensemble, reward.options.ensemble_penalty) == ("mean", 1.0)
    assert [(m.model, m.options) for m in reward.members] == [
        ("rm", {"name": "a", "device": "cpu"}), ("rm2", {"name": "b"}), (None, {"remote_url": "http://rm:8000", "name": "c"})
    ]  # fmt: skip
    options = {"name": "a", "ensemble": "mean_minus_std", "ensemble_penalty": 2.0}
    (reward,), _ = RewardSources("rm", options, ensemble_members=members[:1]).build()
    assert (reward.options.ensemble, reward.options.ensemble_penalty) == ("mean_minus_std", 2.0)
    assert reward.members[0].options == {"name": "a"}  # the aggregation is the ensemble's, not the reward model's
    judge_options = {"name": "strict", "mode": "pairwise"}
    (cascade,), weights = RewardSources("rm", {}, "jm", judge_options, cascade_margin=0.5).build()
    assert isinstance(cascade, CascadeReward) and cascade.margin == 0.5 and weights is None
    assert [(s.model, s.options) for s in cascade.sources] == [("rm", {}), ("jm", judge_options)]
    rewards, weights = RewardSources("rm", {}, "jm", judge_options).build([1.0, 3.0])
    assert [r.model for r in rewards] == ["rm", "jm"] and weights == [1.0, 3.0]
