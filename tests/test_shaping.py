"""Group shaping (NeMo Gym's `genrm_compare` adjustments) and length shaping (NeMo RL's `grpo.reward_shaping`) on
cases worked out by hand: each expected value is a literal with its derivation in a comment, from NeMo Gym's and NeMo
RL's formulas (the module docstring of `trl_rm_env.rewards.shaping`); warnings are asserted whole.
"""

from __future__ import annotations

import logging
import re

import pytest
import torch

import trl_rm_env.rewards.shaping as shaping_module
from trl_rm_env.rewards.shaping import GroupShaping, LengthShaping

NEGATIVE_WARNING = (
    "{}: stop_properly_penalty_coef scales the reward of a truncated completion, as NeMo RL does; a negative reward "
    "(a reward model's score, a normalized reward) is raised by it. Use it with rewards >= 0 (normalization='none', "
    "a judge's, a reference-bounded one). Warned once."
)


def test_the_stop_properly_penalty_warns_once_per_reward_when_it_raises_a_negative_reward(caplog, monkeypatch):
    """NeMo RL multiplies a truncated completion's reward by the coefficient: meant for rewards >= 0. Rewards of 0 and
    above, or a negative reward of a completion that ended, are not warned of; a negative truncated one is, once per
    reward function (named), in one message."""
    monkeypatch.setattr(shaping_module, "_warned_negative", set())
    shaping = LengthShaping(stop_properly_penalty_coef=0.5, eos_token_id=2)
    with caplog.at_level(logging.WARNING, logger="trl_rm_env.rewards.shaping"):
        # all truncated (no id 2 at the end), rewards 0, 0.5 and 3: 0, 0.25, 1.5; nothing to warn of
        assert shaping.shape(torch.tensor([0.0, 0.5, 3.0]), [[5], [5], [7, 5]], "calm").tolist() == [0.0, 0.25, 1.5]
        # a negative reward of a completion that ended with 2 is left as it is
        assert shaping.shape(torch.tensor([-1.0, 1.0]), [[5, 2], [5]], "ended").tolist() == [-1.0, 0.5]
        assert caplog.records == []
        for _ in range(2):  # -1 truncated: -0.5 (raised); warned the first time only
            assert shaping.shape(torch.tensor([-1.0, 1.0]), [[5], [2]], "raised").tolist() == [-0.5, 1.0]
        assert shaping.shape(torch.tensor([-4.0]), [[]], "other").tolist() == [-2.0]  # empty: truncated
    assert [r.getMessage() for r in caplog.records] == [NEGATIVE_WARNING.format("raised"),
                                                        NEGATIVE_WARNING.format("other")]  # fmt: skip
    assert {r.levelno for r in caplog.records} == {logging.WARNING}


# ---------------------------------------------------------------------------------------------------- group shaping
def test_top_performer_bonuses_follow_nemo_gyms_threshold_shortest_and_first_of_equals():
    """NeMo Gym's bonuses: the threshold is the `max(0, int(N * top_percentile) - 1)`-th best score; the shortest
    non-empty (stripped) reasoning, the first of equals, gets `reasoning_bonus` if its score reaches the threshold;
    then the same for answers with `answer_bonus`."""
    scores = [3.0, 1.0, 2.0, 2.0, 0.0]  # best first: 3, 2, 2, 1, 0
    reasonings = ["long reasoning", "", "ab", " ab ", "abc"]  # stripped lengths 14, 0, 2, 2, 3: index 2 shortest
    answers = ["a", "bb", "cc", "d", "eeee"]  # lengths 1, 2, 2, 1, 4: index 0 shortest (first of equals)
    # top_percentile 0.4: int(5 * 0.4) - 1 = 1, threshold 2 (the 2nd best): index 2 (score 2) reaches it, +0.5;
    # index 0 (score 3) too, +0.25.
    shaping = GroupShaping(reasoning_bonus=0.5, answer_bonus=0.25, top_percentile=0.4)
    assert shaping.apply(scores, reasonings, answers) == ([3.25, 1.0, 2.5, 2.0, 0.0], [0.25, 0.0, 0.5, 0.0, 0.0])
    # top_percentile 0.2: int(1.0) - 1 = 0, threshold 3 (the best): index 2 (score 2) gets nothing.
    shaping = GroupShaping(reasoning_bonus=0.5, answer_bonus=0.25, top_percentile=0.2)
    assert shaping.apply(scores, reasonings, answers) == ([3.25, 1.0, 2.0, 2.0, 0.0], [0.25, 0.0, 0.0, 0.0, 0.0])
    # top_percentile 0: max(0, -1) = 0, the best again. A reasoning of one character is non-empty (index 0 wins,
    # score 3: +0.5); a blank answer is empty: the shortest answer is index 2 ("c", score 2 < 3): nothing.
    shaping = GroupShaping(reasoning_bonus=0.5, answer_bonus=0.25, top_percentile=0.0)
    got = shaping.apply(scores, ["x", "", "ab", "ab", "abc"], [" ", "bb", "c", "dd", "e"])
    assert got == ([3.5, 1.0, 2.0, 2.0, 0.0], [0.5, 0.0, 0.0, 0.0, 0.0])
    # No non-empty reasoning: no reasoning bonus. A group of two is shaped (top_percentile 0.5: threshold the best,
    # 1.0; the shortest answer, index 0, reaches it); a group of one is left as it is.
    shaping = GroupShaping(reasoning_bonus=1.0, answer_bonus=2.0, top_percentile=0.5)
    assert shaping.apply([1.0, 0.0], ["", "  "], ["a", "bb"]) == ([3.0, 0.0], [2.0, 0.0])
    assert shaping.apply([2.0], ["r"], ["a"]) == ([2.0], [0.0])
    assert GroupShaping().apply([1, 2], ["", ""], ["a", "bb"]) == ([1.0, 2.0], [0.0, 0.0])  # nothing active


def test_length_and_style_adjustments_are_nemo_gyms_centred_weights():
    """w_k = 1 - (L_k - min L) / (max L - min L), minus the group's mean, times each coefficient (each alone and both
    together); the style weight the same on each answer's style density (elements per character)."""
    scores = [1.0, 1.0, 1.0]
    reasonings = ["", "abcde", "abcdefghij"]  # lengths 0, 5, 10: raw 1, 0.5, 0 (mean 0.5): 0.5, 0, -0.5
    answers = ["ab", "abcd", "cd"]  # lengths 2, 4, 2: raw 1, 0, 1 (mean 2/3): 1/3, -2/3, 1/3
    w_r, w_a = [0.5, 0.0, -0.5], [1 / 3, -2 / 3, 1 / 3]
    cases = [(0.2, 0.0), (0.0, 0.4), (0.2, 0.4)]
    for c_r, c_a in cases:
        shaped, adjustments = GroupShaping(reasoning_length_coeff=c_r, answer_length_coeff=c_a).apply(
            scores, reasonings, answers
        )
        want = [r * c_r + a * c_a for r, a in zip(w_r, w_a)]
        assert adjustments == pytest.approx(want, abs=1e-12)
        assert shaped == pytest.approx([1.0 + w for w in want], abs=1e-12)
    # Style densities: a header in 13 characters (1/13), none (0), two bold spans in 15 characters (2/15).
    # raw: 1 - (1/13) / (2/15) = 11/26, 1, 0; mean 37/78; weights -4/78, 41/78, -37/78.
    answers = ["# Title\nplain", "plain text", "**b** and **c**"]
    shaped, adjustments = GroupShaping(style_coeff=0.3).apply([0.0, 0.0, 0.0], ["", "", ""], answers)
    assert adjustments == pytest.approx([0.3 * -4 / 78, 0.3 * 41 / 78, 0.3 * -37 / 78], abs=1e-12)
    assert shaped == pytest.approx(adjustments, abs=1e-12)
    with pytest.raises(ValueError, match=r"^one reasoning and one answer per score: 2, 1, 2$"):
        GroupShaping(style_coeff=1).apply([1.0, 2.0], [""], ["a", "b"])


def test_group_shaping_of_a_call_groups_equal_prompts_and_leaves_nan_out():
    """GRPO groups are the samples with equal prompts (messages equal whatever their keys' order, prompts holding
    objects JSON cannot write compared by their text); a NaN reward is no reward, left out of its group. The answer
    is the text after `</think>`. Rewards keep their dtype (fp64 here: exact to 1e-12)."""
    from decimal import Decimal

    p = [{"role": "user", "content": "q"}]
    p_reordered = [{"content": "q", "role": "user"}]
    q = [{"role": "user", "content": "r", "meta": Decimal("1.5")}]
    prompts = [p, p_reordered, p, p, q, q]
    completions = ["<think>abc</think>x", "yyy", "zz", "w", "a", "bb"]
    rewards = torch.tensor([1.0, 1.0, 1.0, float("nan"), 5.0, 5.0], dtype=torch.float64)
    # group p (samples 0, 1, 2; 3 is NaN): answers of 1, 3, 2 characters: raw 1, 0, 0.5, mean 0.5: 0.5, -0.5, 0
    # group q (4, 5): 1, 2 characters: 0.5, -0.5; times 0.3 (one group of all five: lengths 1, 3, 2, 1, 2, other weights)
    out = GroupShaping(answer_length_coeff=0.3).shape(rewards, prompts, completions)
    assert out.dtype == torch.float64
    assert out.tolist()[:3] + out.tolist()[4:] == pytest.approx([1.15, 0.85, 1.0, 5.15, 4.85], abs=1e-12)
    assert torch.isnan(out[3])
    assert torch.isnan(rewards[3]) and rewards[0] == 1.0  # the rewards given are left as they were


# ---------------------------------------------------------------------------------------------------- refusals
def test_shaping_options_out_of_range_are_refused_in_one_line():
    """Each refusal of `GroupShaping` and `LengthShaping` whole; the range ends themselves accepted."""
    for name in ("reasoning_bonus", "answer_bonus", "reasoning_length_coeff", "answer_length_coeff", "style_coeff"):
        with pytest.raises(ValueError, match=rf"^{name} must be >= 0, got -0\.1$"):
            GroupShaping(**{name: -0.1})
    assert GroupShaping(top_percentile=0.0).top_percentile == 0.0 and GroupShaping(top_percentile=1.0).active is False
    for bad in (-0.1, 1.5):
        with pytest.raises(ValueError, match=rf"^top_percentile must be in \[0, 1\], got {bad}$"):
            GroupShaping(top_percentile=bad)
    together = ("overlong_buffer_length, overlong_buffer_penalty and max_response_length go together (DAPO's overlong "
                "buffer), got {}")  # fmt: skip
    ranges = ("need overlong_buffer_length >= 1, overlong_buffer_penalty >= 0 and max_response_length >= "
              "overlong_buffer_length, got {}")  # fmt: skip
    refusals = [
        ({"overlong_buffer_length": 4}, together.format((4, None, None))),
        ({"overlong_buffer_penalty": 1.0, "max_response_length": 16}, together.format((None, 1.0, 16))),
        ({"overlong_buffer_length": 0, "overlong_buffer_penalty": 1.0, "max_response_length": 16},
         ranges.format((0, 1.0, 16))),
        ({"overlong_buffer_length": 4, "overlong_buffer_penalty": -1.0, "max_response_length": 16},
         ranges.format((4, -1.0, 16))),
        ({"overlong_buffer_length": 4, "overlong_buffer_penalty": 1.0, "max_response_length": 3},
         ranges.format((4, 1.0, 3))),
        ({"stop_properly_penalty_coef": 1.5, "eos_token_id": 2}, "stop_properly_penalty_coef must be in [0, 1], got 1.5"),
        ({"stop_properly_penalty_coef": -0.5, "eos_token_id": 2},
         "stop_properly_penalty_coef must be in [0, 1], got -0.5"),
        ({"stop_properly_penalty_coef": 0.5},
         "stop_properly_penalty_coef needs eos_token_id: the policy's end token(s) tell truncation"),
        ({"stop_properly_penalty_coef": 0.5, "eos_token_id": 2, "overlong_buffer_length": 4,
          "overlong_buffer_penalty": 1.0, "max_response_length": 16},
         "stop_properly_penalty_coef and the overlong buffer keys are two kinds of length shaping; NeMo RL applies the "
         "first and ignores the others: give one kind"),
        ({"stop_properly_penalty_coef": 0.5, "eos_token_id": "<|im_end|>"},
         "eos_token_id takes token ids (integers), got '<|im_end|>': give the token's id"),
    ]  # fmt: skip
    for kwargs, message in refusals:
        with pytest.raises(ValueError, match="^" + re.escape(message) + "$"):
            LengthShaping(**kwargs)
    # The ends of each range: a buffer of 1 token, no penalty, max_response_length equal to the buffer; coefficients
    # 0 and 1. Token ids are kept as a list of ints, with or without a coefficient.
    edge = LengthShaping(overlong_buffer_length=1, overlong_buffer_penalty=0.0, max_response_length=1)
    assert edge.active and edge.shape(torch.tensor([1.0]), [[7, 7]], "edge").tolist() == [1.0]  # penalty 0
    for coef in (0.0, 1.0):
        assert LengthShaping(stop_properly_penalty_coef=coef, eos_token_id=2).eos_token_id == [2]
    assert LengthShaping(eos_token_id=(3, "4")).eos_token_id == [3, 4]
    assert LengthShaping().active is False and LengthShaping(eos_token_id=3).active is False
