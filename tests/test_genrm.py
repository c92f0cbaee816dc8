"""NeMo Gym's `genrm_compare` protocol (`judges/genrm.py`) and its group adjustments (`rewards/shaping.py`): the
cases of Gym's own tests (`resources_servers/genrm_compare/tests/test_utils.py`), each with its inputs and expected
values as written there, then ours, every expected value a literal derived by hand (the derivation in a comment) from
Gym's `resources_servers/genrm_compare/utils.py` (`aggregate_scores`, `apply_length_bonuses`,
`_compute_length_weights`, `apply_style_penalties`) or, for weighted_win_loss, NeMo RL's points (1, .75, .6, .4, .25,
0 by ranking, rounded half to even, clamped to 1..6): rankings at .5, ties under each aggregator, `default_score`, and
the top-percentile threshold at groups of 8, 10 and 16 placed so that an off-by-one changes the bonus."""

from __future__ import annotations

import json
import re

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
    with pytest.raises(ValueError, match=r"^Unknown comparison strategy 'unknown'; choose one of circular, all_pairs$"):
        comparison_pairs("unknown", 3)
    with pytest.raises(ValueError, match=r"^Need at least 2 responses to compare, got 1$"):
        comparison_pairs("circular", 1)
    # a group of two, the smallest: circular compares it both ways (i against i+1 mod 2), all_pairs once
    assert comparison_pairs("circular", 2) == [(0, 1), (1, 0)] and comparison_pairs("all_pairs", 2) == [(0, 1)]


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


@pytest.mark.parametrize(
    ("text", "preview"),
    [
        ("No JSON here", "'No JSON here'"),
        ("x" * 200, "'" + "x" * 200 + "'"),  # 200 characters: shown whole
        ("y" * 201, "'" + "y" * 200 + "...'"),  # 201: the first 200, then "..."
    ],
)
def test_no_verdict_error_names_the_keys_and_shows_the_answers_first_200_characters(text, preview):
    want = "no verdict object {score_1, score_2, ranking} in the GenRM's answer: " + preview
    with pytest.raises(GenRMVerdictError, match="^" + re.escape(want) + "$"):
        parse_genrm_verdict(text, raise_on_fail=True)


def test_style_elements_are_counted_by_kind():
    text = "\n".join(["# Title", "### Subsection", "1. Ordered", "- Dash", "* Star", "+ Plus",
                      "**bold** and __also bold__", "Nice \U0001f600\u2705"])  # fmt: skip
    assert style_counts(text) == {"header_count": 2, "list_count": 4, "bold_count": 2, "emoji_count": 2}


def test_code_blocks_are_not_style():
    text = "\n".join(["```markdown", "# Ignored", "- ignored", "**ignored** \U0001f600", "```", "# Counted",
                      "- counted", "**counted** \U0001f600"])  # fmt: skip
    assert style_counts(text) == {"header_count": 1, "list_count": 1, "bold_count": 1, "emoji_count": 1}
    # A code block is left out (removed, as the style-control counters of Chatbot Arena that Gym follows remove it):
    # bold markers around one leave "****", which is no bold span.
    assert style_counts("**```\nx = 1\n```**")["bold_count"] == 0


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
    answers = ["plain answer", "# Title\n- item\n**bold**"]
    shaped, adjustments = GroupShaping(style_coeff=1.0).apply([3.0, 3.0], ["", ""], answers)
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
    answers = ["plain answer", "# Title\n- item\n**bold**"]
    shaped, adjustments = GroupShaping(style_coeff=1.0).apply(base, ["", ""], answers)
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


@pytest.mark.parametrize(
    ("text", "verdict"),
    [
        ('{"": 0, "score_1": 2}', (2.0, 3.0, 3.5)),  # an empty key: its closing quote ends the string
        ('{"note": "a \\" }", "score_1": 2}', (2.0, 3.0, 3.5)),  # an escaped quote does not end the string
        ('{"note": "a \\\\", "score_1": 2}', (2.0, 3.0, 3.5)),  # an escaped backslash: the quote after it does
        ('{"score_1": 1} {"score_1": 5, "note": "}"}', (5.0, 3.0, 3.5)),  # a brace in a string closes nothing
        ('{"score_1": 5} {"note": 1}', (5.0, 3.0, 3.5)),  # an object without a verdict key is no verdict
        ('{"score_1": 5} {}', (5.0, 3.0, 3.5)),
        ('Verdict: {"score_1": 4, "ranking": 2}. Done.', (4.0, 3.0, 2.0)),  # an object ends at its brace, text after
    ],
)
def test_objects_are_delimited_as_json_reads_them(text, verdict):
    """NeMo Gym's parser reads the last JSON object of the text that holds a verdict key: braces and quotes inside
    JSON strings (escapes included) delimit nothing, and an object with none of the keys is skipped, not a verdict of
    defaults."""
    assert parse_genrm_verdict(text) == verdict


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
    with pytest.raises(ValueError, match=r"^Unknown aggregator 'elo'; choose one of simple_tiebreaker, "
                                         r"individual_scores, weighted_win_loss$"):  # fmt: skip
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


@pytest.mark.parametrize(
    ("ranking", "points"),
    [
        (1, 1.0), (2, 0.75), (3, 0.6), (4, 0.4), (5, 0.25), (6, 0.0),
        (1.5, 0.75),  # round(1.5) = 2
        (2.5, 0.75),  # half to even: 2 (half up would be 3: .6)
        (3.5, 0.4),  # 4
        (4.5, 0.4),  # half to even: 4 (half up would be 5: .25)
        (5.5, 0.0),  # 6
        (2.4, 0.75), (2.6, 0.6),
        (0.5, 1.0), (-3, 1.0), (9, 0.0), (6.4, 0.0),  # round(0.5) = 0 and below clamp to 1; above 6 to 6
    ],
)  # fmt: skip
def test_weighted_win_loss_points_round_half_to_even_and_clamp(ranking, points):
    """NeMo RL's weighted win/loss: response 1 gets the points of its ranking (1: 1.0, 2: .75, 3: .6, 4: .4, 5: .25,
    6: 0) rounded half to even (Python's `round`) and clamped to 1..6, response 2 the rest of 1; the scores play no
    part (5 and 1 here)."""
    rewards, tie_rate = aggregate_verdicts([(5.0, 1.0, ranking)], [(0, 1)], 2, method="weighted_win_loss")
    assert rewards == approx([points, 1.0 - points], abs=1e-12) and tie_rate == 0.0


@pytest.mark.parametrize(
    ("verdict", "tiebreaker", "individual"),
    [
        ((4.0, 4.0, 1.0), [6.5, 1.5], [4.0, 4.0]),  # a tie: d = 3.5 - 1 = 2.5
        ((2.0, 2.0, 6.0), [-0.5, 4.5], [2.0, 2.0]),  # d = 3.5 - 6 = -2.5: response 2 wins the tie
        ((5.0, 5.0, 4.5), [4.0, 6.0], [5.0, 5.0]),  # d = -1
        ((3.0, 3.0, 3.5), [3.0, 3.0], [3.0, 3.0]),  # d = 0
        ((4.0, 3.0, 6.0), [4.0, 3.0], [4.0, 3.0]),  # unequal scores: the ranking is not read
    ],
)
def test_one_verdict_by_aggregator(verdict, tiebreaker, individual):
    """NeMo Gym's simple_tiebreaker (`adjustment = 3.5 - ranking` added to score_1 and taken from score_2 only when
    the scores are equal) against individual_scores (the scores as written)."""
    assert aggregate_verdicts([verdict], [(0, 1)], 2)[0] == approx(tiebreaker, abs=1e-12)
    assert aggregate_verdicts([verdict], [(0, 1)], 2, method="individual_scores")[0] == approx(individual, abs=1e-12)


# All pairs of a group of 4, three of the six tied.
GROUP_VERDICTS = [(4.0, 4.0, 2.0), (3.0, 5.0, 5.0), (2.0, 2.0, 5.0), (5.0, 1.0, 1.0), (3.0, 3.0, 3.5), (4.0, 2.0, 2.0)]
GROUP_PAIRS = [(0, 1), (0, 2), (0, 3), (1, 2), (1, 3), (2, 3)]


@pytest.mark.parametrize(
    ("method", "rewards"),
    [
        # (0,1) tie d = 1.5: 5.5, 2.5; (0,2) 3, 5; (0,3) tie d = -1.5: .5, 3.5; (1,2) 5, 1; (1,3) tie d = 0: 3, 3;
        # (2,3) 4, 2. 0: 5.5 + 3 + .5; 1: 2.5 + 5 + 3; 2: 5 + 1 + 4; 3: 3.5 + 3 + 2 (each over 3)
        ("simple_tiebreaker", [9 / 3, 10.5 / 3, 10 / 3, 8.5 / 3]),
        # 0: 4 + 3 + 2; 1: 4 + 5 + 3; 2: 5 + 1 + 4; 3: 2 + 3 + 2
        ("individual_scores", [9 / 3, 12 / 3, 10 / 3, 7 / 3]),
        # rankings 2, 5, 5, 1, 3.5 (-> 4), 2: response 1 gets .75, .25, .25, 1, .4, .75; response 2 the rest
        ("weighted_win_loss", [1.25 / 3, 1.65 / 3, 1.5 / 3, 1.6 / 3]),
    ],
)
def test_a_group_of_four_with_ties_by_aggregator(method, rewards):
    """Each sample's reward is the mean of what it received over its three comparisons; the tie rate is the share
    of comparisons with equal scores (3 of 6), whatever the aggregator. By hand from NeMo Gym's `aggregate_scores`
    and NeMo RL's points."""
    got, tie_rate = aggregate_verdicts(GROUP_VERDICTS, GROUP_PAIRS, 4, method=method)
    assert got == approx(rewards, abs=1e-12) and tie_rate == 0.5


def test_a_sample_compared_with_nobody_gets_default_score():
    """NeMo Gym's `aggregate_scores`: no comparison -> `default_score` (2.5 here, not the 3.0 default)."""
    rewards, tie_rate = aggregate_verdicts([(4.0, 2.0, 1.0)], [(0, 1)], 3, default_score=2.5)
    assert rewards == [4.0, 2.0, 2.5] and tie_rate == 0.0
    assert aggregate_verdicts([], [], 2, default_score=2.5) == ([2.5, 2.5], 0.0)


def test_a_partial_verdict_is_filled_with_the_given_defaults():
    """NeMo Gym's `parse_genrm_output`: a missing key is `default_score` / `default_ranking` as given."""
    assert parse_genrm_verdict('{"score_1": 5}', 2.0, 2.5) == (5.0, 2.0, 2.5)
    assert parse_genrm_verdict('{"ranking": 6}', 2.0, 2.5) == (2.0, 2.0, 6.0)
    assert parse_genrm_verdict("nothing", 2.0, 2.5) == (2.0, 2.0, 2.5)


def _short_at(n: int, index: int, long: str, short: str) -> list[str]:
    return [short if i == index else long for i in range(n)]


@pytest.mark.parametrize(
    ("top_percentile", "scores", "reasoning_at", "answer_at", "bonuses"),
    [
        # N=8, p=.2 (the Super recipe's): int(1.6) - 1 = 0 -> the best, 5.0. Reasoning at 5.0: +.5; answer at the
        # 2nd best 4.5: nothing (with int(N * p) = 1 the threshold would be 4.5 and it would get .25).
        (0.2, [3.0, 1.0, 4.0, 2.0, 5.0, 2.5, 4.5, 3.5], 4, 6, {4: 0.5}),
        # N=8, p=.5: int(4.0) - 1 = 3 -> the 4th best of 5, 4.5, 4, 3.5, 3, ... = 3.5. Reasoning at 3.5: +.5;
        # answer at 3.0 (5th): nothing.
        (0.5, [3.0, 1.0, 4.0, 2.0, 5.0, 2.5, 4.5, 3.5], 7, 0, {7: 0.5}),
        # N=10, p=.3: int(3.0000000000000004) - 1 = 2 -> the 3rd best of 5, 4.5, 4, 3.5, ... = 4.0 (sample 1).
        (0.3, [2.0, 4.0, 1.0, 3.0, 5.0, 2.5, 4.5, 1.5, 3.5, 0.5], 1, 8, {1: 0.5}),
        # N=10, p=.2: int(2.0) - 1 = 1 -> the 2nd best, 4.5 (sample 6); here the answer is there: +.25, the
        # reasoning at 4.0 (3rd best): nothing.
        (0.2, [2.0, 4.0, 1.0, 3.0, 5.0, 2.5, 4.5, 1.5, 3.5, 0.5], 1, 6, {6: 0.25}),
        # N=16, p=.2: int(3.2) - 1 = 2 -> the 3rd best of 5, 5, 4.5, 4, 4, 3.5, ... = 4.5, counting the two 5.0s
        # (a threshold over distinct scores would be 4.0). Reasoning at 4.5 (sample 3): +.5; answer at 4.0: nothing.
        (0.2, [3.0, 5.0, 2.0, 4.5, 1.0, 4.0, 3.5, 2.5, 5.0, 1.5, 3.0, 2.0, 4.0, 2.5, 1.0, 3.5], 3, 5, {3: 0.5}),
        # The same group with the two swapped: the answer at 4.5 gets .25, the reasoning at 4.0 (sample 12) nothing.
        (0.2, [3.0, 5.0, 2.0, 4.5, 1.0, 4.0, 3.5, 2.5, 5.0, 1.5, 3.0, 2.0, 4.0, 2.5, 1.0, 3.5], 12, 3, {3: 0.25}),
        # N=4, p=.2: int(.8) - 1 = -1, max(0, -1) = 0 -> the best, 4.0; the 2nd best 3.0 gets nothing (index -1 would
        # be the lowest score, 1.0, and both would get a bonus).
        (0.2, [1.0, 3.0, 4.0, 2.0], 1, 1, {}),
        # p=1: int(N) - 1 -> the lowest score: any shortest completion gets both bonuses.
        (1.0, [1.0, 3.0, 4.0, 2.0, 0.5, 2.5, 3.5, 1.5], 4, 4, {4: 0.75}),
    ],
)
def test_the_top_percentile_threshold_at_real_group_sizes(top_percentile, scores, reasoning_at, answer_at, bonuses):
    """NeMo Gym's `apply_length_bonuses`: the threshold is the `max(0, int(N * top_percentile) - 1)`-th of the
    scores sorted best first (ties counted), and a bonus goes to the shortest non-empty reasoning (answer) when its
    score is `>=` it. Each case puts one bonus candidate exactly at the threshold and the other one rank below, so an
    off-by-one index, `>`, or a threshold over distinct scores changes the result."""
    n = len(scores)
    shaping = GroupShaping(reasoning_bonus=0.5, answer_bonus=0.25, top_percentile=top_percentile)
    shaped, adjustments = shaping.apply(scores, _short_at(n, reasoning_at, "a longer thought", "ab"),
                                        _short_at(n, answer_at, "a longer answer", "x"))  # fmt: skip
    assert adjustments == [bonuses.get(i, 0.0) for i in range(n)]
    assert shaped == [s + bonuses.get(i, 0.0) for i, s in enumerate(scores)]


def test_the_bonus_candidates_are_the_first_shortest_stripped_non_empty_texts():
    """NeMo Gym's `apply_length_bonuses` over a group of 8 at p=.2 (threshold: the best score, 5.0, taken before any
    bonus): lengths are of the stripped text, an empty or blank text is no candidate, and of equal lengths the first
    index wins (`min` by length)."""
    scores = [5.0, 5.0, 4.0, 3.0, 2.0, 1.0, 4.5, 3.5]
    # Stripped reasoning lengths: 2 ("  ab  "), 3, 0 (blank), 0, 4, 2, 6, 5: samples 0 and 5 tie at 2 -> sample 0
    # (5.0 >= 5.0): +.5. Unstripped, sample 0 would be 6 long and sample 5 (1.0) the candidate; with blanks counted
    # sample 2 (4.0); with the last of equals sample 5.
    reasonings = ["  ab  ", "abc", "   ", "", "abcd", "ab", "abcdef", "abcde"]
    # Answers: sample 1's "x" is the shortest non-empty (sample 3's is empty): 5.0 >= 5.0, the threshold taken before
    # sample 0's bonus (taken after it, 5.5, sample 1 would get nothing): +.25.
    answers = ["an answer", "x", "an answer", "", "an answer", "an answer", "an answer", "an answer"]
    shaped, adjustments = GroupShaping(reasoning_bonus=0.5, answer_bonus=0.25).apply(scores, reasonings, answers)
    assert adjustments == [0.5, 0.25, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    assert shaped == [5.5, 5.25, 4.0, 3.0, 2.0, 1.0, 4.5, 3.5]


def test_length_weights_over_a_group_of_eight():
    """NeMo Gym's `_compute_length_weights`, 1 - (L - min) / (max - min) minus the mean, by hand for 8 samples, each
    text measured stripped; reasoning and answer each with their own coefficient."""
    reasonings = [" " * 3, "r" * 10, "r" * 20, "r" * 30, "r" * 40, "\n" + "r" * 10 + " ", "r" * 20, "r" * 30]
    answers = ["a" * 5, "a", "a" * 9, " a ", "a" * 5, "a" * 9, "a", "a" * 5]
    # Reasoning lengths 0, 10, 20, 30, 40, 10, 20, 30: raw 1, .75, .5, .25, 0, .75, .5, .25 (mean .5)
    # -> .5, .25, 0, -.25, -.5, .25, 0, -.25. Answer lengths 5, 1, 9, 1, 5, 9, 1, 5: raw .5, 1, 0, 1, .5, 0, 1, .5
    # (mean .5625) -> -.0625, .4375, -.5625, .4375, -.0625, -.5625, .4375, -.0625.
    want = [0.3 * 0.5 + 0.35 * -0.0625, 0.3 * 0.25 + 0.35 * 0.4375, 0.3 * 0 + 0.35 * -0.5625,
            0.3 * -0.25 + 0.35 * 0.4375, 0.3 * -0.5 + 0.35 * -0.0625, 0.3 * 0.25 + 0.35 * -0.5625,
            0.3 * 0 + 0.35 * 0.4375, 0.3 * -0.25 + 0.35 * -0.0625]  # fmt: skip
    shaped, adjustments = GroupShaping(reasoning_length_coeff=0.3, answer_length_coeff=0.35).apply(
        [2.0] * 8, reasonings, answers
    )
    assert adjustments == approx(want, abs=1e-12) and shaped == approx([2.0 + w for w in want], abs=1e-12)
    assert want[0] == approx(0.128125) and want[1] == approx(0.228125)


def test_style_weights_over_three_densities():
    """NeMo Gym's `apply_style_penalties` by hand: densities 0, 1/10 (a header in 10 characters) and 2/10 (two list
    items in 10) -> raw 1, .5, 0, centred .5, 0, -.5, times the coefficient .05."""
    answers = ["abcdefghij", "# abcdefgh", "- a\n- bcde"]
    assert [style_density(a) for a in answers] == approx([0.0, 0.1, 0.2], abs=1e-12)
    shaped, adjustments = GroupShaping(style_coeff=0.05).apply([3.0, 3.0, 3.0], ["", "", ""], answers)
    assert adjustments == approx([0.025, 0.0, -0.025], abs=1e-12) and shaped == approx([3.025, 3.0, 2.975], abs=1e-12)


def test_shaping_refuses_bad_values():
    with pytest.raises(ValueError, match="style_coeff must be >= 0"):
        GroupShaping(style_coeff=-1)
    with pytest.raises(ValueError, match="top_percentile"):
        GroupShaping(top_percentile=1.5)
    with pytest.raises(ValueError, match="one reasoning and one answer per score"):
        GroupShaping(style_coeff=1).apply([1.0, 2.0], [""], ["a", "b"])


# --- NeMo RL's length shaping (`grpo.reward_shaping`), cases computed from its formulas -----------------------------
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
    not_applied = "so ['overlong_buffer_length', 'overlong_buffer_penalty', 'max_response_length'] are not applied"
    assert not_applied in caplog.text
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
