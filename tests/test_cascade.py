"""`CascadeReward`'s plumbing with plain reward functions (TRL's signature, no model): its names and refusals, what
each source is called with (sliced columns, TRL's own `log_extra`, `completion_ids`), what counts as undecided, the
margin rule's groups (equal prompts, however their keys are ordered) and gaps (at least the margin), and its
warnings. The judge-backed cascade is tested in tests/test_judges.py.

Every expected value is a literal worked out by hand in the comment beside it; the messages are the product's text.
"""

from __future__ import annotations

import datetime
import functools
import logging
import re
from types import SimpleNamespace

import pytest

from trl_rm_env import CascadeReward
from trl_rm_env.rewards import cascade as cascade_module

LOGGER = "trl_rm_env.rewards.cascade"


def rule(prompts, completions, **kwargs):
    """A rule check: 1.0 for "yes", None (undecided) otherwise."""
    return [1.0 if c == "yes" else None for c in completions]


def judge(prompts, completions, **kwargs):
    return [0.5] * len(completions)


def as_number(prompts, completions, **kwargs):
    """A stand-in reward model: the completion read as a number ("none" gives None)."""
    return [None if c == "none" else float(c) for c in completions]


def fallback(prompts, completions, **kwargs):
    """A stand-in judge: 100 plus the number (so its rewards are told from `as_number`'s)."""
    return [100.0 + float(c) if c != "none" else 100.0 for c in completions]


def test_names_and_refusals():
    plain = CascadeReward([rule])
    assert plain.__name__ == "cascade"  # TRL logs rewards/cascade/mean
    assert CascadeReward([rule, judge], name="mixed").__name__ == "mixed"
    # A source's metric name: a partial's function's name (however deeply wrapped), else its class's name.

    class Grader:
        def __call__(self, prompts, completions, **kwargs):
            return [0.0] * len(completions)

    named = CascadeReward([functools.partial(functools.partial(rule)), Grader(), judge])
    assert named.source_names == ["rule", "Grader", "judge"]
    with pytest.raises(ValueError, match=r"^CascadeReward needs at least one reward source$"):
        CascadeReward([])
    with pytest.raises(ValueError, match=re.escape("CascadeReward's sources need distinct names (their metrics), "
                                                   "got ['rule', 'rule']") + "$"):  # fmt: skip
        CascadeReward([rule, functools.partial(rule)])
    with pytest.raises(ValueError, match=re.escape("CascadeReward: margin must be a finite number > 0, with a source "
                                                   "after the reward model that it routes from (got margin=0.0 and 2 "
                                                   "source(s))") + "$"):  # fmt: skip
        CascadeReward([rule, judge], margin=0.0)


def test_a_comparing_judge_after_another_source_is_warned_about(caplog):
    def pairwise(prompts, completions, **kwargs):
        return [0.0] * len(completions)

    def pointwise(prompts, completions, **kwargs):
        return [0.0] * len(completions)

    pairwise.mode = SimpleNamespace(compares=True, name="pairwise")  # what JudgeEnvironment.mode holds
    pointwise.mode = SimpleNamespace(compares=False, name="pointwise")
    want = ("CascadeReward: pairwise is a pairwise judge after another source: it compares only the completions of a "
            "group that the sources before it left undecided (a pointwise judge judges each on its own).")  # fmt: skip
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        CascadeReward([rule, pairwise])
    assert [r.getMessage() for r in caplog.records] == [want]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        CascadeReward([rule, pointwise, pairwise])  # the comparing one third, named as itself
    assert [r.getMessage() for r in caplog.records] == [want]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        CascadeReward([pairwise, rule])  # first: it sees every sample
        CascadeReward([rule, pointwise])  # judges each completion on its own
        CascadeReward([as_number, pairwise], margin=1.0)  # with a margin, groups go to it whole
    assert caplog.records == []


def test_what_each_source_is_called_with():
    """Three samples; the rule decides sample 1 ("yes"), the fallback gets samples 0 and 2."""
    calls = []
    logged = {}

    def first(prompts, completions, **kwargs):
        calls.append(kwargs)
        return rule(prompts, completions)

    def second(prompts, completions, **kwargs):
        calls.append(kwargs)
        if "log_extra" in kwargs:
            kwargs["log_extra"]("why", ["judged 0", "judged 2"])
        return [0.25, 0.75][: len(completions)]

    def log_extra(column, values):
        logged[column] = values

    state = object()
    cascade = CascadeReward([first, second])
    called = cascade.call(["p0", "p1", "p2"], ["no", "yes", "maybe"], completion_ids=[[0], [1], [2]],
                          label=["a", "b", "c"], tag="xyz", step=7, trainer_state=state, log_extra=log_extra)  # fmt: skip
    rewards = called.rewards
    assert rewards == [0.25, 1.0, 0.75] and called.calls == [3, 2]
    # The first source, called on every sample, gets TRL's own log_extra; a per-sample column is sliced for the
    # second; a string (even one as long as the batch: "xyz" has 3 characters), a number and the trainer state are
    # passed whole.
    assert calls[0]["log_extra"] is log_extra
    assert calls[0]["completion_ids"] == [[0], [1], [2]] and calls[1]["completion_ids"] == [[0], [2]]
    assert calls[1]["label"] == ["a", "c"] and calls[1]["tag"] == "xyz" and calls[1]["step"] == 7
    assert calls[1]["trainer_state"] is state
    assert logged == {"why": ["judged 0", None, "judged 2"]}  # placed at the second source's rows
    assert CascadeReward([first, second])(["p"], ["no"])[0] == 0.25  # no completion_ids given: None passed
    assert calls[-2]["completion_ids"] is None and calls[-1]["completion_ids"] is None


def test_a_source_must_answer_every_sample_with_a_number_or_none():
    def short(prompts, completions, **kwargs):
        return [0.0]

    def words(prompts, completions, **kwargs):
        return ["abc"] * len(completions)

    with pytest.raises(ValueError, match=r"^mixed: source 'short' returned 1 rewards for 3 samples$"):
        CascadeReward([short, judge], name="mixed")(["p"] * 3, ["a", "b", "c"])
    # Text is not "undecided": it is taken as the reward, as TRL would take it, and fails there as float() does.
    with pytest.raises(ValueError, match=r"^could not convert string to float: 'abc'$"):
        CascadeReward([words, judge])(["p"], ["a"])


def test_the_margin_rule_groups_by_prompt_and_decides_gaps_of_at_least_the_margin(monkeypatch):
    monkeypatch.setattr(cascade_module, "_WARNED_SIZES", [])  # its uneven groups' warning stays in this test
    asked = []

    def judge_asked(prompts, completions, **kwargs):
        asked.append(list(completions))
        return fallback(prompts, completions)

    cascade = CascadeReward([as_number, judge_asked], margin=0.25)
    # "a": 0 and 0.25 exactly the margin apart (decided); "b": alone, its reward None (to the judge); "c": 1 and None
    # (not all numbers: to the judge); "d": alone with NaN (to the judge, whose 100 + NaN leaves it undecided: None).
    rewards = cascade(["a", "a", "b", "c", "c", "d"], ["0", "0.25", "none", "1", "none", "nan"])
    assert rewards == [0.0, 0.25, 100.0, 101.0, 100.0, None]
    assert asked == [["none", "1", "none", "nan"]]
    # One group however its prompt's keys are ordered: tied rewards (gap 0), so both go to the judge.
    asked.clear()
    one = [{"role": "user", "content": "q"}]
    same = [{"content": "q", "role": "user"}]
    assert cascade([one, same], ["2", "2"]) == [102.0, 102.0] and asked == [["2", "2"]]
    # A prompt holding what JSON cannot write (a date) is grouped by its text: one tied group, to the judge.
    asked.clear()
    day = [{"role": "user", "content": "q", "date": datetime.date(2024, 1, 2)}]
    assert cascade([day, [dict(day[0])]], ["3", "3"]) == [103.0, 103.0] and asked == [["3", "3"]]


def test_the_margin_rule_warns_once_about_groups_of_different_sizes(monkeypatch, caplog):
    monkeypatch.setattr(cascade_module, "_WARNED_SIZES", [])
    cascade = CascadeReward([as_number, fallback], margin=1.0)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        cascade(["a", "a", "b", "b"], ["0", "5", "0", "5"])  # two groups of 2: nothing to say
        cascade(["a", "a", "b"], ["0", "5", "0"])  # a group of 2 and one of 1
        cascade(["a", "b", "b", "b"], ["0", "0", "2", "4"])  # once only
    assert [r.getMessage() for r in caplog.records] == [
        "CascadeReward: the groups of this call have [1, 2] completions; the margin rule routes each group it sees "
        "whole, so a GRPO group split across processes is routed in parts (its parts may be rewarded by different "
        "sources). Warned once."
    ]
