"""NeMo Gym's `genrm_compare` protocol (`judges/genrm.py`) and its group adjustments (`rewards/shaping.py`): the
cases of Gym's own tests (`resources_servers/genrm_compare/tests/test_utils.py`), each with its inputs and expected
values as written there, then ours (the aggregators NeMo RL had, the bonuses and length weights by hand)."""

from __future__ import annotations

import json

import pytest
from pytest import approx

from trl_rm_env.data.messages import reasoning_and_answer, split_reasoning
from trl_rm_env.judges.genrm import (
    EMPTY_ANSWER,
    GenRMVerdictError,
    aggregate_verdicts,
    comparison_pairs,
    genrm_messages,
    parse_genrm_verdict,
)
from trl_rm_env.rewards.shaping import GroupShaping, centered_weights, style_counts, style_density

# --- Gym's cases ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("strategy", "n", "pairs"),
    [
        ("circular", 3, [(0, 1), (1, 2), (2, 0)]),
        ("circular", 4, [(0, 1), (1, 2), (2, 3), (3, 0)]),
        ("all_pairs", 3, [(0, 1), (0, 2), (1, 2)]),
        ("all_pairs", 4, [(0, 1), (0, 2), (0, 3), (1, 2), (1, 3), (2, 3)]),
    ],
)
def test_pairs(strategy, n, pairs):
    assert comparison_pairs(strategy, n) == pairs


def test_pairs_refuse_an_unknown_strategy_and_a_group_of_one():
    with pytest.raises(ValueError, match="Unknown comparison strategy"):
        comparison_pairs("unknown", 3)
    with pytest.raises(ValueError, match="Need at least 2 responses"):
        comparison_pairs("circular", 1)


@pytest.mark.parametrize(
    ("text", "defaults", "verdict"),
    [
        ('Here\'s my evaluation:\n```json\n{"score_1": 4, "score_2": 3, "ranking": 2}\n```\n', (3.0, 3.5), (4, 3, 2)),
        ('The result is {"score_1": 5, "score_2": 2, "ranking": 1}', (3.0, 3.5), (5, 2, 1)),
        ('{"score_1": 4}', (3.0, 3.5), (4, 3, 3.5)),
        ("I think response 1 is better", (2.5, 4.0), (2.5, 2.5, 4.0)),
        ('{"score_1": "not a number"}', (3.0, 3.5), (3, 3, 3.5)),
        ('```json\n{"rubric_evaluations": [\n  {"rubric_id": 2, "score_1": 1, "score_2": 5, "ranking": 6},\n  '
         '{"rubric_id": 1, "score_1": 3, "score_2": 3, "ranking": 2}\n], "overall": {"score_1": 5, "score_2": 2, '
         '"ranking": 1}}\n```', (3.0, 3.5), (5, 2, 1)),  # fmt: skip
    ],
)
def test_verdicts(text, defaults, verdict):
    assert parse_genrm_verdict(text, *defaults) == approx(verdict)


@pytest.mark.parametrize("key", ["score_1", "score_2", "ranking"])
@pytest.mark.parametrize("value", ["NaN", "Infinity", "-Infinity", 1e309])
def test_a_non_finite_value_is_no_verdict(key, value):
    text = json.dumps({"score_1": 4, "score_2": 2, "ranking": 1} | {key: value})
    with pytest.raises(GenRMVerdictError):
        parse_genrm_verdict(text, 3.0, 3.5, raise_on_fail=True)
    assert parse_genrm_verdict(text, 3.0, 3.5) == (3.0, 3.0, 3.5)


def test_no_verdict_raises_when_asked():
    with pytest.raises(GenRMVerdictError, match="No JSON here"):
        parse_genrm_verdict("No JSON here", 3.0, 3.5, raise_on_fail=True)


def test_style_elements_are_counted_by_kind():
    text = "\n".join(["# Title", "### Subsection", "1. Ordered", "- Dash", "* Star", "+ Plus",
                      "**bold** and __also bold__", "Nice \U0001f600\u2705"])  # fmt: skip
    assert style_counts(text) == {"header_count": 2, "list_count": 4, "bold_count": 2, "emoji_count": 2}


def test_code_blocks_are_not_style():
    text = "\n".join(["```markdown", "# Ignored", "- ignored", "**ignored** \U0001f600", "```", "# Counted",
                      "- counted", "**counted** \U0001f600"])  # fmt: skip
    assert style_counts(text) == {"header_count": 1, "list_count": 1, "bold_count": 1, "emoji_count": 1}


def test_what_only_looks_like_style_is_not():
    text = "\n".join(["####### h7 should not count", "inline # header should not count", "1.not a list",
                      "-not a list", "**bold"])  # fmt: skip
    assert style_counts(text) == {"header_count": 0, "list_count": 0, "bold_count": 0, "emoji_count": 0}


@pytest.mark.parametrize("text", ["", "   ", "```python\n# ignored\n- ignored\n```"])
def test_style_density_of_nothing_is_zero(text):
    assert style_density(text) == approx(0.0)


def test_style_density_is_per_character():
    text = "# Title\nPlain answer"
    assert style_density(text) == approx(1 / len(text))


def test_centered_weights():
    assert centered_weights([0.2, 0.2, 0.2]) == [0.0, 0.0, 0.0]
    assert centered_weights([0.0, 0.5, 1.0]) == approx([0.5, 0.0, -0.5])


def test_style_shaping_is_off_at_zero_and_for_a_group_of_one():
    assert GroupShaping(style_coeff=0.0).apply([1.0, 2.0], ["", ""], ["plain", "# styled"]) == ([1.0, 2.0], [0, 0])
    assert GroupShaping(style_coeff=1.0).apply([3.0], [""], ["# styled"]) == ([3.0], [0.0])


def test_style_shaping_rewards_less_markdown():
    shaped, adjustments = GroupShaping(style_coeff=1.0).apply([3.0, 3.0], ["", ""],
                                                              ["plain answer", "# Title\n- item\n**bold**"])  # fmt: skip
    assert shaped == approx([3.5, 2.5]) and adjustments == approx([0.5, -0.5])


@pytest.mark.parametrize(
    ("verdicts", "pairs", "rewards", "tie_rate"),
    [
        ([(4.0, 2.0, 1.0)], [(0, 1)], [4.0, 2.0], 0.0),
        ([(3.0, 3.0, 2.0)], [(0, 1)], [4.5, 1.5], 1.0),  # tie: d = 3.5 - 2 = 1.5
        ([(4.0, 2.0, 1.0), (3.0, 5.0, 5.0), (3.0, 4.0, 4.0)], [(0, 1), (1, 2), (2, 0)], [4.0, 2.5, 4.0], 0.0),
    ],
)
def test_simple_tiebreaker(verdicts, pairs, rewards, tie_rate):
    assert aggregate_verdicts(verdicts, pairs, len(rewards)) == (approx(rewards), approx(tie_rate))


def test_style_after_aggregation():
    """Gym's integration case: a neutral verdict, then the style adjustment on top of the base rewards."""
    base, tie_rate = aggregate_verdicts([(3.0, 3.0, 3.5)], [(0, 1)], 2)
    shaped, adjustments = GroupShaping(style_coeff=1.0).apply(base, ["", ""], ["plain answer", "# Title\n- item\n**bold**"])
    assert base == approx([3.0, 3.0]) and tie_rate == 1.0
    assert shaped == approx([3.5, 2.5]) and adjustments == approx([0.5, -0.5])


# --- ours -----------------------------------------------------------------------------------------------------------


def test_the_genrm_is_sent_the_prompt_a_principle_and_the_two_answers():
    prompt = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}]
    assert genrm_messages(prompt, "4", "  ", principle="Be correct.") == [
        *prompt,
        {"role": "principle", "content": "Be correct."},
        {"role": "response_1", "content": "4"},
        {"role": "response_2", "content": EMPTY_ANSWER},
    ]
    assert [m["role"] for m in genrm_messages(prompt, "4", "5")] == ["system", "user", "response_1", "response_2"]


def test_reasoning_is_split_from_the_answer():
    assert split_reasoning("<think>Let me add.</think>\n\nIt is 4.") == ("Let me add.", "It is 4.")
    assert split_reasoning("It is 4.") == ("", "It is 4.")
    assert split_reasoning("a</think>b</think> c") == ("a</think>b", "c")  # the last marker ends the reasoning


def test_a_completions_reasoning_and_answer_are_its_last_assistant_turn_tool_calls_left_out():
    turns = [
        {"role": "assistant", "content": "<think>look it up</think>", "tool_calls": [{"function": {"name": "f"}}]},
        {"role": "tool", "content": "42"},
        {"role": "assistant", "content": "<think>so 42</think>\nIt is 42."},
    ]
    assert reasoning_and_answer(turns) == ("so 42", "It is 42.")
    assert reasoning_and_answer("<think>cut off mid-thought") == ("cut off mid-thought", "")
    assert reasoning_and_answer("Plain.") == ("", "Plain.")
    assert reasoning_and_answer([{"role": "assistant", "content": None, "tool_calls": []}]) == ("", "")


def test_the_first_fenced_verdict_wins_else_the_last_object():
    text = 'x {"score_1": 1} ```json\n{"score_1": 2}\n``` ```json\n{"score_1": 3}\n``` {"score_1": 4}'
    assert parse_genrm_verdict(text)[0] == 2
    assert parse_genrm_verdict('{"score_1": 1} then {"a": "}"} then {"score_1": 5, "note": "{x}"}')[0] == 5
    assert parse_genrm_verdict('{ unclosed {"score_2": 1}')[1] == 1  # an object inside an unclosed brace counts


def test_weighted_win_loss_gives_the_better_response_the_points():
    pairs = [(0, 1)] * 4
    rewards, tie_rate = aggregate_verdicts([(5, 1, 1), (4, 2, 2), (2, 4, 5), (3, 3, 3.5)], pairs, 2,
                                           method="weighted_win_loss")  # fmt: skip
    # response 0: 1 + .75 + .25 + .4 (3.5 rounds half to even: 4); response 1: the rest of 1 each time
    assert rewards == approx([(1 + 0.75 + 0.25 + 0.4) / 4, (0 + 0.25 + 0.75 + 0.6) / 4])
    assert tie_rate == approx(0.25)


def test_individual_scores_are_averaged_without_tiebreak():
    rewards, _ = aggregate_verdicts([(3, 3, 1), (5, 1, 1)], [(0, 1), (1, 2)], 4, method="individual_scores")
    assert rewards == [3.0, 4.0, 1.0, 3.0]  # the last compared with nobody: the default


def test_aggregation_refuses_an_unknown_method_and_mismatched_lengths():
    with pytest.raises(ValueError, match="Unknown aggregator"):
        aggregate_verdicts([], [], 2, method="elo")
    with pytest.raises(ValueError, match="one verdict per compared pair"):
        aggregate_verdicts([(3, 3, 3.5)], [], 2)


def test_bonuses_go_to_the_shortest_among_the_top_scores():
    shaping = GroupShaping(reasoning_bonus=0.5, answer_bonus=0.25, top_percentile=0.5)
    # 4 samples, threshold: the int(4 * .5) - 1 = 1st best score (0-based) = 3.0
    shaped, adjustments = shaping.apply([4.0, 3.0, 2.0, 1.0], ["long reasoning", "short", "", "x"],
                                        ["a long answer", "mid answer", "", "tiny"])  # fmt: skip
    # shortest non-empty reasoning: "x" (sample 3, score 1 < 3: no bonus); shortest non-empty answer: "tiny"
    # (sample 3 again: no bonus)
    assert adjustments == [0.0, 0.0, 0.0, 0.0]
    shaped, adjustments = shaping.apply([4.0, 3.0, 2.0, 1.0], ["long reasoning", "short", "", "longer one"],
                                        ["a long answer", "mid", "", "tiny answer"])  # fmt: skip
    assert adjustments == [0.0, 0.75, 0.0, 0.0] and shaped == [4.0, 3.75, 2.0, 1.0]


def test_length_shaping_favours_shorter_and_sums_to_zero():
    shaping = GroupShaping(reasoning_length_coeff=0.3, answer_length_coeff=0.35)
    shaped, adjustments = shaping.apply([3.0, 3.0, 3.0], ["aa", "aaaa", ""], ["b", "bbb", "bb"])
    # reasoning lengths 2, 4, 0 -> raw .5, 0, 1 -> centred 0, -.5, .5; answers 1, 3, 2 -> 1, 0, .5 -> .5, -.5, 0
    assert adjustments == approx([0.35 * 0.5, 0.3 * -0.5 + 0.35 * -0.5, 0.3 * 0.5])
    assert sum(adjustments) == approx(0.0) and shaped == approx([3 + a for a in adjustments])


def test_shaping_refuses_bad_values():
    with pytest.raises(ValueError, match="style_coeff must be >= 0"):
        GroupShaping(style_coeff=-1)
    with pytest.raises(ValueError, match="top_percentile"):
        GroupShaping(top_percentile=1.5)
    with pytest.raises(ValueError, match="one reasoning and one answer per score"):
        GroupShaping(style_coeff=1).apply([1.0, 2.0], [""], ["a", "b"])


# --- NeMo RL's length shaping (`grpo.reward_shaping`), cases computed from its formulas --------------------------------
def test_dapo_overlong_buffer_and_stop_properly_penalty_follow_nemo_rls_formulas():
    import torch

    from trl_rm_env.rewards.shaping import LengthShaping

    rewards = torch.tensor([1.0, 1.0, 1.0, 0.5], dtype=torch.float64)
    ids = [[7] * 10, [7] * 14, [7] * 16, [7] * 20]
    dapo = LengthShaping(overlong_buffer_length=4, overlong_buffer_penalty=1.0, max_response_length=16)
    # expected length 12: 10 -> no penalty; 14 -> -2/4; 16 -> -4/4; 20 -> -8/4 (no lower bound, as NeMo RL)
    assert dapo.shape(rewards, ids, "rm").tolist() == [1.0, 0.5, 0.0, 0.5 - 2.0]
    at_start = dapo.shape(torch.ones(3, dtype=torch.float64), [[7] * 12, [7] * 13, [7] * 11], "rm").tolist()
    assert at_start == [1.0, 0.75, 1.0]  # exactly at the buffer's start: nothing; one token in: -1/4
    stop = LengthShaping(stop_properly_penalty_coef=0.25, eos_token_id=[2, 3])
    ended = [[5, 2], [5, 5], [], [4, 3]]
    assert stop.shape(rewards, ended, "rm").tolist() == [1.0, 0.25, 0.25, 0.5]
    with pytest.raises(ValueError, match="go together"):
        LengthShaping(overlong_buffer_length=4)
    with pytest.raises(ValueError, match="needs eos_token_id"):
        LengthShaping(stop_properly_penalty_coef=0.5)
    with pytest.raises(ValueError, match="give one kind"):
        LengthShaping(overlong_buffer_length=4, overlong_buffer_penalty=1.0, max_response_length=16,
                      stop_properly_penalty_coef=0.5, eos_token_id=2)  # fmt: skip
    with pytest.raises(ValueError, match="reads TRL's completion_ids"):
        dapo.shape(rewards, None, "rm")


def test_nemo_rls_reward_shaping_block_is_read_as_nemo_rl_applies_it(caplog):
    """`grpo.reward_shaping` as NeMo RL's GRPO reads it: off unless `enabled`; the stop-properly penalty wins over the
    overlong keys (which are then not applied, with a warning); DAPO's keys together; the reasoning-length mode and
    unknown keys refused, each in one line naming the key."""
    import logging

    from trl_rm_env.rewards.nemo import length_shaping_arguments
    from trl_rm_env.rewards.shaping import LengthShaping

    # NeMo RL's grpo_math_1B.yaml ships the block disabled, with its DAPO values filled in: nothing applies.
    shipped = {"enabled": False, "overlong_buffer_length": 128, "overlong_buffer_penalty": 1,
               "max_response_length": 2048, "stop_properly_penalty_coef": None}  # fmt: skip
    assert length_shaping_arguments(shipped) == {} and length_shaping_arguments(None) == {}
    dapo = length_shaping_arguments({**shipped, "enabled": True, "mode": "response_length",
                                     "reasoning_length": {"tau1": 4096, "tau2": 13000}})  # fmt: skip
    assert dapo == {"overlong_buffer_length": 128, "overlong_buffer_penalty": 1, "max_response_length": 2048}
    assert LengthShaping(**dapo) == LengthShaping(overlong_buffer_length=128, overlong_buffer_penalty=1,
                                                  max_response_length=2048)  # fmt: skip
    with caplog.at_level(logging.WARNING, logger="trl_rm_env.rewards.nemo"):
        stop = length_shaping_arguments({**shipped, "enabled": True, "stop_properly_penalty_coef": 0.5,
                                         "eos_token_id": [2]})  # fmt: skip
    assert stop == {"stop_properly_penalty_coef": 0.5, "eos_token_id": [2]}
    assert "so ['overlong_buffer_length', 'overlong_buffer_penalty', 'max_response_length'] are not applied" in caplog.text
    with pytest.raises(ValueError, match=r"only 'response_length'"):
        length_shaping_arguments({"enabled": True, "mode": "reasoning_length"})
    with pytest.raises(ValueError, match=r"Unsupported grpo.reward_shaping key\(s\) \['overlong_penalty'\]"):
        length_shaping_arguments({"enabled": True, "overlong_penalty": 1})
    with pytest.raises(ValueError, match=r"needs \['overlong_buffer_length', .*missing \['max_response_length'\]"):
        length_shaping_arguments({"enabled": True, "overlong_buffer_length": 4, "overlong_buffer_penalty": 1.0})


def test_length_shaping_takes_token_ids_only_and_warns_when_it_would_raise_a_negative_reward(caplog):
    import torch

    from trl_rm_env.rewards.shaping import LengthShaping

    assert LengthShaping(stop_properly_penalty_coef=0.5, eos_token_id=["2", "3"]).eos_token_id == [2, 3]  # a CLI's
    for bad in ("<|im_end|>", True, [2, "eos"]):
        with pytest.raises(ValueError, match="eos_token_id takes token ids"):
            LengthShaping(stop_properly_penalty_coef=0.5, eos_token_id=bad)
    shaped = LengthShaping(stop_properly_penalty_coef=0.5, eos_token_id=2).shape(
        torch.tensor([-1.0, 1.0]), [[5], [5]], "neg_rm"
    )
    assert shaped.tolist() == [-0.5, 0.5]  # NeMo RL's formula, as it is
    assert "raised by it" in caplog.text
