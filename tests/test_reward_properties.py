"""Property-based tests (hypothesis) of the reward formulas: the invariants each must keep whatever its inputs, over
groups of 2 to 16 samples and ensembles of 1 to 8 members.

What is held, and where each expected value comes from (never from the function under test or another of ours):

- `GroupShaping.apply` / `.shape` (NeMo Gym's `genrm_compare` adjustments): equal to `reference_shaping`, a plain
  loop written from NeMo Gym's definitions (top-k as "fewer than k scores strictly better", k = max(1, int(N * p));
  w_k = 1 - (L_k - min L) / (max L - min L) minus its mean; style density counted from how the test built each answer,
  not by the package's regexes); permuting a group permutes its rewards (the bonus winner made unique: the "first
  of equals" rule is checked on its own); a NaN reward is left NaN and changes no other reward (against the call
  without it); interleaved groups equal each group alone; length and style adjustments sum to 0 and never favour the
  longer (or denser) answer; a group of one and all coefficients 0 change nothing.
- `LengthShaping.shape` (NeMo RL's `grpo.reward_shaping`): the DAPO overlong penalty
  `min(0, -(L - (max_len - buffer)) / buffer * penalty)` written out on plain ints (DAPO, arXiv 2503.14476, and NeMo
  RL's code), 0 up to `max_len - buffer`, `-penalty` at `max_len`, non-increasing in L; the stop-properly penalty
  multiplies a truncated completion's reward (empty, or its last id not an eos id) by the coefficient and leaves the
  others; `length_shaping_arguments` of a NeMo RL block builds the same shaping.
- `ensemble.aggregate` / `ensemble_metrics`: Python's `statistics` per row (`fmean`, `min`, `median` -- the mean of
  the two middle values for an even K --, `fmean - penalty * pstdev`) and per column over the complete rows; a NaN
  member makes its row NaN only; permuting members changes nothing.
- `ReferenceBound` (PAR): `1 / (1 + math.exp(-(r - r_ref) / T))` per element, in (0, 1), non-decreasing in r;
  `pairs` scores each distinct (prompt, reference) once (a first-appearance loop with `==`).
- `RewardFunction` (`_normalize`, `_finish`, `_filled`) and `diagnostics`: running normalization equals
  `(r - statistics.fmean(seen)) / max(statistics.pstdev(seen), 1e-6)` over every reward seen so far (std 1 while one
  reward has been seen); a NaN reward comes back None and changes no other value, now or later; clipping is
  `min(c, max(-c, r))` after normalization and length shaping; `length_corr` is `statistics.correlation`,
  `flat_groups` the share of groups of two or more whose rewards are all equal.
- GenRM (`comparison_pairs`, `received`, `aggregate_verdicts`): the pairs as `range` loops; each sample's reward the
  mean of what it received, a plain loop over `(i, j, s1, s2)` tuples (untied scores; the tie-break separately, from
  NeMo Gym's d = 3.5 - ranking); relabelling permutes the rewards; a sample never compared gets `default_score`;
  `weighted_win_loss` gives each comparison's two responses points summing to 1 (NeMo RL's table, Python's
  half-to-even `round`), non-increasing in the ranking for response 1, so a group's mean reward is 1/2.
- `judging.aggregate` / `group_samples`: the mean of each sample's shares (a loop over the verdicts), the samples
  without one by the reason of their first failed judgement; groups by `==` on prompt and column values in order of
  first appearance.

Examples are derandomized (reproducible runs, e.g. under mutation testing) and no examples database is written.
"""

from __future__ import annotations

import math
import random
import statistics

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from trl_rm_env.judges.genrm import aggregate_verdicts, comparison_pairs, received
from trl_rm_env.judges.judgements import Judgement, aggregate, group_samples
from trl_rm_env.rewards.base import RewardFunction, RewardOptions, diagnostics
from trl_rm_env.rewards.ensemble import aggregate as aggregate_members
from trl_rm_env.rewards.ensemble import ensemble_metrics
from trl_rm_env.rewards.nemo import length_shaping_arguments
from trl_rm_env.rewards.reference_bound import ReferenceBound
from trl_rm_env.rewards.shaping import GroupShaping, LengthShaping

BASE = settings(deadline=None, database=None, derandomize=True, max_examples=20)
FEW = settings(BASE, max_examples=10)
TOL = {"rel": 1e-9, "abs": 1e-9}


def approx(values, **tolerance):
    return pytest.approx(values, **(tolerance or TOL), nan_ok=True)


# ---------------------------------------------------------------------------------------------------- group shaping
WORDS = st.sampled_from(["a", "bc", "def", "ghij", "klmno", "pqrstu", "vwxyzab", "cdefghij"])  # lengths 1 to 8
# (how a line is written, how many style elements it holds); "code" lines are a fenced block, left out of both.
LINE_KINDS = {
    "plain": (lambda w: w, 0),
    "header": (lambda w: f"# {w}", 1),
    "subheader": (lambda w: f"### {w}", 1),
    "bullet": (lambda w: f"- {w}", 1),
    "star": (lambda w: f"* {w}", 1),
    "numbered": (lambda w: f"1. {w}", 1),
    "bold": (lambda w: f"**{w}**", 1),
    "emoji": (lambda w: f"{w} \U0001f600", 1),
    "code": (lambda w: f"```\n# {w}\n- {w}\n```", 0),
}


class Answer:
    """An answer built line by line, so its style count and lengths are known without the package's regexes."""

    def __init__(self, lines: list[tuple[str, str]]):
        written = [(LINE_KINDS[kind][0](word), kind) for kind, word in lines]
        self.text = "\n".join(text for text, _ in written)
        self.styled = sum(LINE_KINDS[kind][1] for kind, _ in lines)
        without_code = self.text
        for text, kind in written:
            if kind == "code":
                without_code = without_code.replace(text, "")
        self.chars = len(without_code.strip())
        self.length = len(self.text.strip())

    @property
    def density(self) -> float:
        return self.styled / self.chars if self.chars else 0.0


ANSWERS = st.lists(st.tuples(st.sampled_from(sorted(LINE_KINDS)), WORDS), max_size=3).map(Answer)
SCORES = st.one_of(st.floats(-10, 10, allow_nan=False, allow_infinity=False), st.sampled_from([0.0, 1.0, 2.5]))
# One sample: (its score, its reasoning's length, its answer).
SAMPLES = st.tuples(SCORES, st.integers(0, 30), ANSWERS)
GROUPS = st.lists(SAMPLES, min_size=2, max_size=16)
COEFFICIENT = st.one_of(st.just(0.0), st.floats(0.01, 2.0))


@st.composite
def shapings(draw, bonuses=True, lengths=True, style=True):
    return GroupShaping(
        reasoning_bonus=draw(COEFFICIENT) if bonuses else 0.0,
        answer_bonus=draw(COEFFICIENT) if bonuses else 0.0,
        top_percentile=draw(st.floats(0.0, 1.0)),
        reasoning_length_coeff=draw(COEFFICIENT) if lengths else 0.0,
        answer_length_coeff=draw(COEFFICIENT) if lengths else 0.0,
        style_coeff=draw(COEFFICIENT) if style else 0.0,
    )


def completion(reasoning_length: int, answer: Answer) -> str:
    return f"<think>{'r' * reasoning_length}</think>{answer.text}"


def parts(group):
    scores = [s for s, _, _ in group]
    reasonings = ["r" * n for _, n, _ in group]
    return scores, reasonings, [a.text for _, _, a in group]


def centred(values: list[float]) -> list[float]:
    """NeMo Gym's group weight: 1 for the smallest, 0 for the largest, linear between, minus the mean."""
    if max(values) == min(values):
        return [0.0] * len(values)
    raw = [1 - (v - min(values)) / (max(values) - min(values)) for v in values]
    return [w - statistics.fmean(raw) for w in raw]


def reference_shaping(shaping: GroupShaping, group) -> list[float]:
    """The group's shaped rewards from NeMo Gym's definitions (see the module docstring)."""
    scores = [float(s) for s, _, _ in group]
    out = list(scores)
    coefficients = (shaping.reasoning_bonus, shaping.answer_bonus, shaping.reasoning_length_coeff,
                    shaping.answer_length_coeff, shaping.style_coeff)  # fmt: skip
    if len(group) < 2 or not any(coefficients):
        return out
    top = max(1, int(len(group) * shaping.top_percentile))
    reasoning_lengths = [n for _, n, _ in group]
    answer_lengths = [a.length for _, _, a in group]
    for bonus, lengths in ((shaping.reasoning_bonus, reasoning_lengths), (shaping.answer_bonus, answer_lengths)):
        winner = None  # the first of the shortest non-empty ones
        for k, length in enumerate(lengths):
            if length > 0 and (winner is None or length < lengths[winner]):
                winner = k
        if bonus > 0 and winner is not None and sum(s > out[winner] for s in scores) < top:
            out[winner] += bonus
    for weights, coefficient in ((centred(reasoning_lengths), shaping.reasoning_length_coeff),
                                 (centred(answer_lengths), shaping.answer_length_coeff),
                                 (centred([a.density for _, _, a in group]), shaping.style_coeff)):  # fmt: skip
        if coefficient > 0:
            out = [o + w * coefficient for o, w in zip(out, weights)]
    return out


def shape(shaping: GroupShaping, rewards: list[float], prompts: list, group) -> list[float]:
    completions = [completion(n, a) for _, n, a in group]
    return shaping.shape(torch.tensor(rewards, dtype=torch.float64), prompts, completions).tolist()


def unique_winners(group) -> bool:
    """No two samples tie for the shortest non-empty reasoning, nor for the shortest non-empty answer."""
    for lengths in ([n for _, n, _ in group], [a.length for _, _, a in group]):
        kept = [n for n in lengths if n > 0]
        if kept and kept.count(min(kept)) > 1:
            return False
    return True


@BASE
@given(shaping=shapings(), group=GROUPS)
def test_apply_equals_nemo_gyms_definitions(shaping, group):
    shaped, adjustments = shaping.apply(*parts(group))
    want = reference_shaping(shaping, group)
    assert shaped == approx(want)
    assert adjustments == approx([w - s for w, (s, _, _) in zip(want, group)])


@BASE
@given(shaping=shapings(), group=GROUPS, prompt=st.sampled_from(["p", [{"role": "user", "content": "p"}]]))
def test_shape_of_one_group_equals_nemo_gyms_definitions(shaping, group, prompt):
    rewards = [s for s, _, _ in group]
    assert shape(shaping, rewards, [prompt] * len(group), group) == approx(reference_shaping(shaping, group))


@BASE
@given(shaping=shapings(), group=GROUPS, data=st.data())
def test_permuting_a_group_permutes_its_shaped_rewards(shaping, group, data):
    """No tie for a bonus (the first of equals breaks the symmetry: checked on its own below): shaping the permuted
    group gives the permuted rewards."""
    assume(unique_winners(group))
    order = data.draw(st.permutations(range(len(group))))
    shaped = shape(shaping, [s for s, _, _ in group], ["p"] * len(group), group)
    permuted = [group[k] for k in order]
    assert shape(shaping, [s for s, _, _ in permuted], ["p"] * len(group), permuted) == approx(
        [shaped[k] for k in order]
    )


@BASE
@given(scores=st.lists(SCORES, min_size=2, max_size=16), length=st.integers(1, 20), bonus=st.floats(0.1, 2.0),
       top_percentile=st.floats(0, 1), data=st.data())  # fmt: skip
def test_the_first_of_equally_short_answers_is_the_one_that_may_get_the_bonus(scores, length, bonus, top_percentile,
                                                                              data):
    """Ties for the shortest answer: the first of them in the call's order is the candidate, and gets the bonus when
    fewer than k = max(1, int(N * top_percentile)) scores are strictly better than its own."""
    n = len(scores)
    tied = sorted(data.draw(st.sets(st.integers(0, n - 1), min_size=2, max_size=n)))
    answers = ["a" * length if k in tied else "a" * (length + 1 + k) for k in range(n)]
    shaped, _ = GroupShaping(answer_bonus=bonus, top_percentile=top_percentile).apply(scores, [""] * n, answers)
    top = sum(s > scores[tied[0]] for s in scores) < max(1, int(n * top_percentile))
    assert shaped == approx([s + (bonus if k == tied[0] and top else 0.0) for k, s in enumerate(scores)])


@BASE
@given(shaping=shapings(), group=GROUPS, data=st.data())
def test_a_nan_reward_is_left_nan_and_changes_no_other_reward(shaping, group, data):
    """NaN rewards (no reward) stay NaN; every other reward is what the call without those samples gives."""
    masked = data.draw(st.sets(st.integers(0, len(group) - 1), max_size=len(group) - 1))
    rewards = [math.nan if k in masked else s for k, (s, _, _) in enumerate(group)]
    shaped = shape(shaping, rewards, ["p"] * len(group), group)
    kept = [k for k in range(len(group)) if k not in masked]
    alone = shape(shaping, [rewards[k] for k in kept], ["p"] * len(kept), [group[k] for k in kept])
    assert all(math.isnan(shaped[k]) for k in masked)
    assert [shaped[k] for k in kept] == approx(alone, rel=0, abs=1e-12)


@FEW
@given(shaping=shapings(), first=GROUPS, second=GROUPS, data=st.data())
def test_groups_of_different_prompts_are_shaped_independently(shaping, first, second, data):
    """Two groups interleaved in one call: each sample's reward is its group's alone, and NeMo Gym's."""
    n = len(first) + len(second)
    positions = sorted(data.draw(st.sets(st.integers(0, n - 1), min_size=len(first), max_size=len(first))))
    prompts = [[{"role": "user", "content": "first"}] if k in positions else "second" for k in range(n)]
    items, rest = iter(first), iter(second)
    merged = [next(items) if k in positions else next(rest) for k in range(n)]
    shaped = shape(shaping, [s for s, _, _ in merged], prompts, merged)
    others = [k for k in range(n) if k not in positions]
    assert [shaped[k] for k in positions] == approx(reference_shaping(shaping, first))
    assert [shaped[k] for k in others] == approx(reference_shaping(shaping, second))
    alone = shape(shaping, [s for s, _, _ in second], ["second"] * len(second), second)
    assert [shaped[k] for k in others] == approx(alone, rel=0, abs=1e-12)


def question(content: str, keys_reversed: bool) -> list[dict[str, str]]:
    message = {"content": content, "role": "user"} if keys_reversed else {"role": "user", "content": content}
    return [message]


# Prompts sharing long prefixes, equal messages written with their keys in either order, and plain texts.
QUESTIONS = st.one_of(
    st.builds(question, st.sampled_from(["question one", "question two", "question three"]), st.booleans()),
    st.sampled_from(["question one", "question two"]),
)


@BASE
@given(shaping=shapings(), group=GROUPS, data=st.data())
def test_each_group_of_equal_prompts_is_shaped_alone(shaping, group, data):
    """Samples grouped by equal prompts (`==`: a message's key order does not matter), in any interleaving: each
    group's rewards are NeMo Gym's for that group alone; a sample alone in its group is unchanged."""
    prompts = data.draw(st.lists(QUESTIONS, min_size=len(group), max_size=len(group)))
    rewards = [s for s, _, _ in group]
    shaped = shape(shaping, rewards, prompts, group)
    keys, members = [], []
    for k, prompt in enumerate(prompts):
        if prompt in keys:
            members[keys.index(prompt)].append(k)
        else:
            keys.append(prompt)
            members.append([k])
    for indices in members:
        assert [shaped[k] for k in indices] == approx(reference_shaping(shaping, [group[k] for k in indices]))
        if len(indices) == 1:
            assert shaped[indices[0]] == rewards[indices[0]]
    one, _ = shaping.apply(*parts(group[:1]))
    assert one == [group[0][0]]


@FEW
@given(group=GROUPS, top_percentile=st.floats(0, 1), data=st.data())
def test_all_coefficients_zero_is_no_shaping(group, top_percentile, data):
    masked = data.draw(st.sets(st.integers(0, len(group) - 1)))
    rewards = [math.nan if k in masked else s for k, (s, _, _) in enumerate(group)]
    shaping = GroupShaping(top_percentile=top_percentile)
    assert shape(shaping, rewards, ["p"] * len(group), group) == approx(rewards, rel=0, abs=0)
    assert shaping.apply(*parts(group)) == ([s for s, _, _ in group], [0.0] * len(group))


@BASE
@given(shaping=shapings(bonuses=False), group=GROUPS)
def test_length_and_style_adjustments_of_a_group_sum_to_zero(shaping, group):
    _, adjustments = shaping.apply(*parts(group))
    assert sum(adjustments) == pytest.approx(0.0, abs=1e-9)


@pytest.mark.parametrize("which", ["reasoning", "answer", "style"])
@BASE
@given(coefficient=st.floats(0.01, 2.0), group=GROUPS)
def test_the_shorter_or_plainer_never_gets_a_lower_adjustment(coefficient, which, group):
    shaping = GroupShaping(**{f"{which}_length_coeff" if which != "style" else "style_coeff": coefficient})
    _, adjustments = shaping.apply(*parts(group))
    measure = {"reasoning": lambda s: s[1], "answer": lambda s: s[2].length, "style": lambda s: s[2].density}[which]
    values = [measure(s) for s in group]
    for i in range(len(group)):
        for j in range(len(group)):
            if values[i] < values[j]:
                assert adjustments[i] >= adjustments[j] - 1e-12
            elif values[i] == values[j]:
                assert adjustments[i] == pytest.approx(adjustments[j], abs=1e-12)
    if len(set(values)) > 1:  # the shortest gets the most, by coefficient x (1 - mean weight)
        assert max(adjustments) == pytest.approx(adjustments[values.index(min(values))], abs=1e-12)
        assert max(adjustments) - min(adjustments) == pytest.approx(coefficient, rel=1e-9)


# ---------------------------------------------------------------------------------------------------- length shaping
@st.composite
def overlong_cases(draw):
    buffer = draw(st.integers(1, 64))
    max_length = draw(st.integers(buffer, buffer + 200))
    lengths = draw(st.lists(st.integers(0, max_length + 20), min_size=1, max_size=16))
    return buffer, draw(st.floats(0.0, 2.0)), max_length, lengths


REWARDS = st.floats(-10, 10, allow_nan=False, allow_infinity=False)


def dapo_penalty(length: int, max_length: int, buffer: int, penalty: float) -> float:
    """DAPO's soft overlong punishment (arXiv 2503.14476, eq. 13; NeMo RL's `grpo.reward_shaping`)."""
    return min(0, -(length - (max_length - buffer)) / buffer * penalty)


def length_shaped(shaping: LengthShaping, rewards: list[float], ids: list[list[int]]) -> list[float]:
    return shaping.shape(torch.tensor(rewards, dtype=torch.float64), ids, "test").tolist()


@BASE
@given(case=overlong_cases(), data=st.data())
def test_the_overlong_penalty_is_dapos(case, data):
    buffer, penalty, max_length, lengths = case
    rewards = data.draw(st.lists(REWARDS, min_size=len(lengths), max_size=len(lengths)))
    shaping = LengthShaping(overlong_buffer_length=buffer, overlong_buffer_penalty=penalty,
                            max_response_length=max_length)  # fmt: skip
    shaped = length_shaped(shaping, rewards, [[7] * n for n in lengths])
    assert shaped == approx([r + dapo_penalty(n, max_length, buffer, penalty) for r, n in zip(rewards, lengths)])
    for r, n, s in zip(rewards, lengths, shaped):
        if n <= max_length - buffer:
            assert s == r
        if n == max_length:
            assert s == pytest.approx(r - penalty, **TOL)
    block = {"enabled": True, "overlong_buffer_length": buffer, "overlong_buffer_penalty": penalty,
             "max_response_length": max_length}  # fmt: skip
    from_block = LengthShaping(**length_shaping_arguments(block))
    assert length_shaped(from_block, rewards, [[7] * n for n in lengths]) == approx(shaped, rel=0, abs=0)


@BASE
@given(case=overlong_cases())
def test_the_overlong_penalty_never_rewards_a_longer_completion(case):
    buffer, penalty, max_length, lengths = case
    lengths = sorted(lengths)
    shaping = LengthShaping(overlong_buffer_length=buffer, overlong_buffer_penalty=penalty,
                            max_response_length=max_length)  # fmt: skip
    shaped = length_shaped(shaping, [0.0] * len(lengths), [[1] * n for n in lengths])
    assert all(s <= 0 for s in shaped)
    assert all(later <= earlier for earlier, later in zip(shaped, shaped[1:]))


@BASE
@given(coefficient=st.floats(0.0, 1.0), eos=st.lists(st.integers(0, 9), min_size=1, max_size=3),
       ids=st.lists(st.lists(st.integers(0, 9), max_size=6), min_size=1, max_size=16), data=st.data())  # fmt: skip
def test_stop_properly_scales_only_truncated_completions(coefficient, eos, ids, data):
    rewards = data.draw(st.lists(REWARDS, min_size=len(ids), max_size=len(ids)))
    want = [r * coefficient if not seq or seq[-1] not in eos else r for r, seq in zip(rewards, ids)]
    shaping = LengthShaping(stop_properly_penalty_coef=coefficient, eos_token_id=eos)
    assert length_shaped(shaping, rewards, ids) == approx(want)
    block = {"enabled": True, "stop_properly_penalty_coef": coefficient, "eos_token_id": eos}
    assert length_shaped(LengthShaping(**length_shaping_arguments(block)), rewards, ids) == approx(want)


# ---------------------------------------------------------------------------------------------------- ensembles
MEMBER = st.floats(-100, 100, allow_nan=False, allow_infinity=False)
HOWS = ("mean", "min", "median", "mean_minus_std")


@st.composite
def member_tables(draw):
    rows, k = draw(st.integers(1, 6)), draw(st.integers(1, 8))
    return [draw(st.lists(MEMBER, min_size=k, max_size=k)) for _ in range(rows)]


def reference_row(row: list[float], how: str, penalty: float) -> float:
    if any(math.isnan(v) for v in row):
        return math.nan
    return {
        "mean": lambda: statistics.fmean(row),
        "min": lambda: min(row),
        "median": lambda: statistics.median(row),
        "mean_minus_std": lambda: statistics.fmean(row) - penalty * statistics.pstdev(row),
    }[how]()


@pytest.mark.parametrize("how", HOWS)
@BASE
@given(table=member_tables(), penalty=st.floats(0, 3), data=st.data())
def test_aggregate_equals_the_statistics_module_row_by_row(table, how, penalty, data):
    holes = data.draw(st.sets(st.integers(0, len(table) - 1)))  # rows with a NaN member
    for r in holes:
        table[r][data.draw(st.integers(0, len(table[r]) - 1))] = math.nan
    penalty = penalty if how == "mean_minus_std" else 1.0
    out = aggregate_members(torch.tensor(table, dtype=torch.float64), how, penalty)
    assert out.dtype == torch.float64
    assert out.tolist() == approx([reference_row(row, how, penalty) for row in table])
    assert [math.isnan(v) for v in out.tolist()] == [r in holes for r in range(len(table))]


@pytest.mark.parametrize("how", HOWS)
@FEW
@given(table=member_tables(), data=st.data())
def test_the_order_of_members_does_not_matter(table, how, data):
    order = data.draw(st.permutations(range(len(table[0]))))
    members = torch.tensor(table, dtype=torch.float64)
    assert aggregate_members(members[:, list(order)], how).tolist() == approx(aggregate_members(members, how).tolist())


@pytest.mark.parametrize("how", HOWS)
@FEW
@given(table=member_tables())
def test_aggregate_keeps_the_members_dtype(table, how):
    out = aggregate_members(torch.tensor(table, dtype=torch.float32), how)
    assert out.dtype == torch.float32
    want = [reference_row([float(torch.tensor(v, dtype=torch.float32)) for v in row], how, 1.0) for row in table]
    assert out.tolist() == approx(want, rel=1e-5, abs=1e-4)


@BASE
@given(table=member_tables(), data=st.data())
def test_ensemble_metrics_are_column_statistics_over_complete_rows(table, data):
    holes = data.draw(st.sets(st.integers(0, len(table) - 1)))
    for r in holes:
        table[r][data.draw(st.integers(0, len(table[r]) - 1))] = math.nan
    complete = [row for row in table if not any(math.isnan(v) for v in row)]
    want = {}
    if complete:
        want["ensemble_std"] = statistics.fmean([statistics.pstdev(row) for row in complete])
        for k in range(len(table[0])):
            want[f"ensemble_member_{k}_mean"] = statistics.fmean([row[k] for row in complete])
    got = ensemble_metrics(torch.tensor(table, dtype=torch.float64))
    assert got.keys() == want.keys()
    assert got == approx(want)


# ---------------------------------------------------------------------------------------------------- PAR's bound
@BASE
@given(scores=st.lists(st.tuples(st.floats(-15, 15), st.floats(-15, 15)), min_size=1, max_size=16),
       temperature=st.floats(1.0, 10.0))  # fmt: skip
def test_the_bounded_reward_is_a_sigmoid_of_the_gap_in_zero_one(scores, temperature):
    bound = ReferenceBound(reference_column="reference", reference_temperature=temperature)
    r = torch.tensor([s for s, _ in scores], dtype=torch.float64)
    r_ref = torch.tensor([s for _, s in scores], dtype=torch.float64)
    out = bound.bounded(r, r_ref).tolist()
    assert out == approx([1 / (1 + math.exp(-(s - ref) / temperature)) for s, ref in scores], rel=1e-12, abs=1e-12)
    assert all(0 < v < 1 for v in out)


@BASE
@given(scores=st.lists(st.floats(-50, 50), min_size=2, max_size=16), reference=st.floats(-50, 50),
       temperature=st.floats(0.05, 10.0))  # fmt: skip
def test_the_bounded_reward_never_falls_as_the_score_rises(scores, reference, temperature):
    bound = ReferenceBound(reference_column="reference", reference_temperature=temperature)
    scores = sorted(scores)
    out = bound.bounded(torch.tensor(scores, dtype=torch.float64), torch.full((len(scores),), reference,
                                                                              dtype=torch.float64)).tolist()
    assert all(later >= earlier for earlier, later in zip(out, out[1:]))
    assert all(0 <= v <= 1 for v in out)


PROMPTS = st.sampled_from(["p", "q", [{"role": "user", "content": "p"}], [{"role": "user", "content": "q"}]])
REFERENCES = st.sampled_from(["x", "y", "z", [{"role": "assistant", "content": "x"}]])


@BASE
@given(rows=st.lists(st.tuples(PROMPTS, REFERENCES), min_size=1, max_size=16), data=st.data())
def test_pairs_scores_each_distinct_prompt_and_reference_once(rows, data):
    samples = sorted(data.draw(st.sets(st.integers(0, len(rows) - 1), min_size=1)))
    prompts, references = [p for p, _ in rows], [r for _, r in rows]
    contexts, answers, index = ReferenceBound(reference_column="reference").pairs(prompts, references, samples)
    distinct = []  # first-appearance order
    for i in samples:
        if rows[i] not in distinct:
            distinct.append(rows[i])
    assert list(zip(contexts, answers)) == distinct
    assert sorted(index) == samples
    for i in samples:
        assert (contexts[index[i]], answers[index[i]]) == rows[i]
        for j in samples:
            assert (index[i] == index[j]) == (rows[i] == rows[j])  # one prompt, two references: two pairs


# ---------------------------------------------------------------------------------------------------- the pipeline
class Light(RewardFunction):
    """A reward function without a model: the pipeline's post-processing alone."""

    def __init__(self, **options):
        length_shaping = options.pop("length_shaping", None)
        stats = options.pop("checkpoint_stats", None)
        self._setup(object(), RewardOptions(**options), checkpoint_stats=stats, length_shaping=length_shaping)

    def finish(self, rewards: list[float], ids=None) -> list[float | None]:
        samples = None if ids is None else (["p"] * len(rewards), ["c"] * len(rewards), ids)
        return self._finish(torch.tensor(rewards, dtype=torch.float64), 0, None, samples=samples)


CALLS = st.lists(st.lists(st.one_of(REWARDS, st.just(math.nan)), min_size=1, max_size=16), min_size=1, max_size=4)


def running(calls: list[list[float]], clip: float | None = None) -> list[list[float | None]]:
    """Each call's rewards normalized by the mean and population std of every reward seen so far (NaN: None)."""
    seen, out = [], []
    for call in calls:
        seen += [r for r in call if not math.isnan(r)]
        mean = statistics.fmean(seen) if seen else 0.0
        std = statistics.pstdev(seen) if len(seen) > 1 else 1.0
        values = [None if math.isnan(r) else (r - mean) / max(std, 1e-6) for r in call]
        out.append([v if v is None or clip is None else min(clip, max(-clip, v)) for v in values])
    return out


def loose(calls):
    return [[v if v is None else pytest.approx(v, rel=1e-6, abs=1e-6) for v in call] for call in calls]


@BASE
@given(calls=CALLS, clip=st.one_of(st.none(), st.floats(0.1, 3.0)))
def test_running_normalization_uses_every_reward_seen_so_far(calls, clip):
    reward = Light(normalization="running", clip=clip)
    assert [reward.finish(call) for call in calls] == loose(running(calls, clip))


@BASE
@given(calls=CALLS, data=st.data())
def test_a_missing_reward_is_none_and_changes_no_other(calls, data):
    k = data.draw(st.integers(0, len(calls) - 1))
    at = data.draw(st.integers(0, len(calls[k])))
    with_hole = [list(call) for call in calls]
    with_hole[k].insert(at, math.nan)
    plain, holed = Light(normalization="running"), Light(normalization="running")
    got = [holed.finish(call) for call in with_hole]
    want = [plain.finish(call) for call in calls]
    assert got[k].pop(at) is None
    assert got == want


@BASE
@given(rewards=st.lists(st.one_of(REWARDS, st.just(math.nan)), min_size=1, max_size=16),
       clip=st.floats(0.1, 12.0), mean=st.floats(-5, 5), std=st.floats(0.0, 4.0),
       normalization=st.sampled_from(["none", "checkpoint"]))  # fmt: skip
def test_clipping_bounds_the_normalized_rewards(rewards, clip, mean, std, normalization):
    reward = Light(normalization=normalization, clip=clip, checkpoint_stats=(mean, std))
    got = reward.finish(rewards)
    scale = (mean, max(std, 1e-6)) if normalization == "checkpoint" else (0.0, 1.0)
    want = [None if math.isnan(r) else min(clip, max(-clip, (r - scale[0]) / scale[1])) for r in rewards]
    assert got == [v if v is None else pytest.approx(v, **TOL) for v in want]
    assert all(v is None or -clip <= v <= clip for v in got)


@BASE
@given(case=overlong_cases(), clip=st.floats(0.1, 3.0), data=st.data())
def test_length_shaping_comes_after_normalization_and_before_clipping(case, clip, data):
    buffer, penalty, max_length, lengths = case
    calls = [data.draw(st.lists(REWARDS, min_size=len(lengths), max_size=len(lengths))) for _ in range(2)]
    shaping = LengthShaping(overlong_buffer_length=buffer, overlong_buffer_penalty=penalty,
                            max_response_length=max_length)  # fmt: skip
    reward = Light(normalization="running", clip=clip, length_shaping=shaping)
    ids = [[3] * n for n in lengths]
    got = [reward.finish(call, ids) for call in calls]
    want = [[min(clip, max(-clip, v + dapo_penalty(n, max_length, buffer, penalty))) for v, n in zip(call, lengths)]
            for call in running(calls)]  # fmt: skip
    assert got == loose(want)


@FEW
@given(rewards=st.lists(REWARDS, min_size=1, max_size=16), fill=REWARDS, data=st.data())
def test_empty_completions_get_their_reward_and_nothing_else_changes(rewards, fill, data):
    empty = sorted(data.draw(st.sets(st.integers(0, len(rewards) - 1))))
    reward = Light(empty_completion_reward=fill)
    got = reward._filled(torch.tensor(rewards, dtype=torch.float64), empty).tolist()
    assert got == [fill if k in empty else r for k, r in enumerate(rewards)]


@BASE
@given(rows=st.lists(st.tuples(st.sampled_from("abc"), st.integers(-8, 8).map(lambda v: v / 4),
                               st.text(alphabet="xy", max_size=12)), min_size=1, max_size=16),
       data=st.data())  # fmt: skip
def test_diagnostics_are_the_correlation_and_the_share_of_flat_groups(rows, data):
    masked = data.draw(st.sets(st.integers(0, len(rows) - 1)))
    rewards = [math.nan if k in masked else r for k, (_, r, _) in enumerate(rows)]
    kept = [rows[k] for k in range(len(rows)) if k not in masked]
    want = {}
    values, lengths = [r for _, r, _ in kept], [len(c) for _, _, c in kept]
    if len(kept) >= 2 and len(set(values)) > 1 and len(set(lengths)) > 1:
        want["length_corr"] = statistics.correlation(values, lengths)
    groups = {}
    for prompt, r, _ in kept:
        groups.setdefault(prompt, []).append(r)
    several = [g for g in groups.values() if len(g) >= 2]
    if several:
        want["flat_groups"] = sum(len(set(g)) == 1 for g in several) / len(several)
    got = diagnostics(torch.tensor(rewards, dtype=torch.float64), [p for p, _, _ in rows], [c for _, _, c in rows],
                      None)  # fmt: skip
    assert got.keys() == want.keys()
    assert got == approx(want, rel=1e-9, abs=1e-9)


# ---------------------------------------------------------------------------------------------------- GenRM
RANKINGS = st.integers(2, 12).map(lambda v: v / 2)  # 1, 1.5, ..., 6
WIN_POINTS = {1: 1.0, 2: 0.75, 3: 0.6, 4: 0.4, 5: 0.25, 6: 0.0}  # NeMo RL's, response 1's by rounded ranking


def random_verdicts(rng: random.Random, count: int, ties: bool = False) -> list[tuple[float, float, float]]:
    """`count` verdicts `(score_1, score_2, ranking)`: scores 1-5, untied unless `ties` (then about half tie),
    rankings 1 to 6 by halves. Drawn from a seeded generator: a group's hundreds of verdicts stay cheap to make."""
    out = []
    for _ in range(count):
        s1 = rng.randint(1, 5)
        s2 = s1 if ties and rng.random() < 0.5 else rng.choice([v for v in range(1, 6) if v != s1])
        out.append((float(s1), float(s2), rng.randint(2, 12) / 2))
    return out


@FEW
@given(n=st.integers(2, 16))
def test_comparison_pairs_are_every_pair_or_each_with_the_next(n):
    assert comparison_pairs("all_pairs", n) == [(i, j) for i in range(n) for j in range(i + 1, n)]
    assert comparison_pairs("circular", n) == [(i, (i + 1) % n) for i in range(n)]
    for strategy in ("all_pairs", "circular"):
        with pytest.raises(ValueError):
            comparison_pairs(strategy, 1)


def mean_received(n: int, judged: list[tuple[int, int, float, float]], default: float) -> list[float]:
    """Each sample's mean of what it received, from `(i, j, value_i, value_j)` tuples; `default` for none."""
    got: list[list[float]] = [[] for _ in range(n)]
    for i, j, value_i, value_j in judged:
        got[i].append(value_i)
        got[j].append(value_j)
    return [sum(g) / len(g) if g else default for g in got]


@st.composite
def all_pairs_verdicts(draw, ties=False):
    """A group of 2 to 16 compared all pairs, each pair judged 1 to 3 times, and its verdicts."""
    n, copies, seed = draw(st.integers(2, 16)), draw(st.integers(1, 3)), draw(st.integers(0, 2**32 - 1))
    pairs = [(i, j) for i in range(n) for j in range(i + 1, n) for _ in range(copies)]
    return n, pairs, random_verdicts(random.Random(seed), len(pairs), ties)


@pytest.mark.parametrize("method", ["simple_tiebreaker", "individual_scores"])
@BASE
@given(case=all_pairs_verdicts(), default=st.floats(0, 5))
def test_each_sample_gets_the_mean_of_the_scores_it_received(case, method, default):
    n, pairs, verdicts = case
    rewards, ties = aggregate_verdicts(verdicts, pairs, n, method, default)
    assert rewards == approx(mean_received(n, [(i, j, v[0], v[1]) for (i, j), v in zip(pairs, verdicts)], default))
    assert ties == 0.0


@BASE
@given(case=all_pairs_verdicts(ties=True))
def test_tied_scores_are_split_by_the_ranking(case):
    """NeMo Gym's tie-breaker: equal scores s become s + d and s - d, d = 3.5 - ranking; the share of ties is
    returned."""
    n, pairs, verdicts = case
    judged = []
    for (i, j), (s1, s2, ranking) in zip(pairs, verdicts):
        d = 3.5 - ranking if s1 == s2 else 0.0
        judged.append((i, j, s1 + d, s2 - d))
    rewards, ties = aggregate_verdicts(verdicts, pairs, n, "simple_tiebreaker")
    assert rewards == approx(mean_received(n, judged, 3.0))
    assert ties == pytest.approx(sum(s1 == s2 for s1, s2, _ in verdicts) / len(verdicts), **TOL)


@pytest.mark.parametrize("method", ["simple_tiebreaker", "individual_scores", "weighted_win_loss"])
@FEW
@given(case=all_pairs_verdicts(), data=st.data())
def test_relabelling_a_group_permutes_its_rewards(case, method, data):
    n, pairs, verdicts = case
    label = data.draw(st.permutations(range(n)))
    rewards, _ = aggregate_verdicts(verdicts, pairs, n, method)
    relabelled, _ = aggregate_verdicts(verdicts, [(label[i], label[j]) for i, j in pairs], n, method)
    assert [relabelled[label[k]] for k in range(n)] == approx(rewards)


@pytest.mark.parametrize("method", ["simple_tiebreaker", "individual_scores", "weighted_win_loss"])
@FEW
@given(n=st.integers(2, 16), default=st.floats(-5, 5), data=st.data())
def test_a_sample_in_no_comparison_gets_the_default_score(n, default, method, data):
    compared = sorted(data.draw(st.sets(st.integers(0, n - 1), max_size=n)))
    pairs = [(i, j) for i in compared for j in compared if i < j]
    verdicts = random_verdicts(random.Random(data.draw(st.integers(0, 2**32 - 1))), len(pairs))
    rewards, ties = aggregate_verdicts(verdicts, pairs, n, method, default)
    judged = [(i, j, *received(v, method)) for (i, j), v in zip(pairs, verdicts)]
    assert rewards == approx(mean_received(n, judged, default))
    for k in range(n):
        if all(k not in pair for pair in pairs):
            assert rewards[k] == default
    assert ties == 0.0


@BASE
@given(verdict=st.tuples(st.integers(1, 5).map(float), st.integers(1, 5).map(float), RANKINGS),
       other=RANKINGS)  # fmt: skip
def test_weighted_win_loss_shares_one_point_per_comparison(verdict, other):
    first, second = received(verdict, "weighted_win_loss")
    assert first + second == pytest.approx(1.0, **TOL)
    assert first == WIN_POINTS[round(verdict[2])]  # Python's round: half to even, as NeMo RL rounds
    worse, _ = received((verdict[0], verdict[1], other), "weighted_win_loss")
    if other > verdict[2]:  # a ranking further towards response 2 never gives response 1 more
        assert worse <= first


@BASE
@given(case=all_pairs_verdicts())
def test_weighted_win_loss_rewards_of_a_group_average_one_half(case):
    n, pairs, verdicts = case
    rewards, _ = aggregate_verdicts(verdicts, pairs, n, "weighted_win_loss")
    judged = [(i, j, WIN_POINTS[round(v[2])], 1 - WIN_POINTS[round(v[2])]) for (i, j), v in zip(pairs, verdicts)]
    assert rewards == approx(mean_received(n, judged, 3.0))
    assert statistics.fmean(rewards) == pytest.approx(0.5, **TOL)
    assert all(0 <= r <= 1 for r in rewards)


# ---------------------------------------------------------------------------------------------------- judging
class Shares:
    """A mode whose verdict is each shown sample's value, in the order shown (a listwise judge's shares)."""

    def shares(self, shown, verdict):
        return list(zip(shown, verdict))


@st.composite
def judged_calls(draw):
    n = draw(st.integers(1, 16))
    to_score = sorted(draw(st.sets(st.integers(0, n - 1), min_size=1, max_size=6)))
    judgements, verdicts = [], []
    for _ in range(draw(st.integers(0, 16))):
        shown = tuple(draw(st.lists(st.sampled_from(to_score), min_size=1, max_size=3, unique=True)))
        status = draw(st.sampled_from(["judged", "judged", "overlength", "unparsed"]))
        verdict = None if status != "judged" else tuple(
            draw(st.lists(st.floats(0, 1), min_size=len(shown), max_size=len(shown))))
        judgements.append(Judgement(shown, None, overlength=status == "overlength"))
        verdicts.append(verdict)
    alone = sorted(draw(st.sets(st.sampled_from(to_score))))
    return to_score, judgements, verdicts, alone, draw(st.floats(-1, 1))


@BASE
@given(call=judged_calls())
def test_a_judged_samples_reward_is_the_mean_of_its_shares(call):
    to_score, judgements, verdicts, alone, single = call
    shares = {i: [] for i in to_score}
    first_failure = {}
    for judgement, verdict in zip(judgements, verdicts):
        for position, i in enumerate(judgement.samples):
            if verdict is None:
                first_failure.setdefault(i, "overlength" if judgement.overlength else "unparsed")
            else:
                shares[i].append(verdict[position])
    want_values, want_missing = {}, {"overlength": [], "unparsed": []}
    for i in to_score:
        if shares[i]:
            want_values[i] = statistics.fmean(shares[i])
        elif i in alone:
            want_values[i] = single
        else:
            want_missing[first_failure.get(i, "unparsed")].append(i)
    values, missing = aggregate(Shares(), judgements, verdicts, to_score, alone, single)
    assert values == approx(want_values)
    assert missing == want_missing


COLUMN_VALUES = st.sampled_from(["ref-a", "ref-b", None])


@BASE
@given(rows=st.lists(st.tuples(PROMPTS, COLUMN_VALUES, st.sampled_from([1, 2])), min_size=1, max_size=16),
       columns=st.integers(0, 2), data=st.data())  # fmt: skip
def test_groups_are_equal_prompts_and_column_values_in_first_appearance_order(rows, columns, data):
    to_score = data.draw(st.lists(st.sampled_from(range(len(rows))), unique=True, min_size=1))
    named = {"reference": [r for _, r, _ in rows], "rubric": [u for _, _, u in rows]}
    chosen = dict(list(named.items())[:columns])
    keys, groups = [], []
    for i in to_score:
        key = [rows[i][0], *(column[i] for column in chosen.values())]
        if key in keys:
            groups[keys.index(key)].append(i)
        else:
            keys.append(key)
            groups.append([i])
    assert group_samples([p for p, _, _ in rows], to_score, chosen or None) == groups
