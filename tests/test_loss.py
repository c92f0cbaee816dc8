"""Ranked Bradley-Terry loss: pair expansion and values against hand computation (plain Python math)."""

from __future__ import annotations

import math

import pytest
import torch

from trl_rm_env.metrics import STAT_COLUMNS, record_statistics, summarize_statistics
from trl_rm_env.trainer.loss import ranked_bradley_terry_loss, ranked_pairs


def nll(x: float) -> float:
    """-log sigmoid(x), computed by hand."""
    return math.log1p(math.exp(-x))


def hand_pairs(ranks: list[int], records: list[int]) -> set[tuple[int, int]]:
    return {
        (i, j)
        for i in range(len(ranks))
        for j in range(len(ranks))
        if records[i] == records[j] and ranks[i] < ranks[j]
    }


def run(scores, ranks, records, margin=None, center=None):
    return ranked_bradley_terry_loss(
        torch.tensor(scores, dtype=torch.float64),
        torch.tensor(ranks),
        torch.tensor(records),
        None if margin is None else torch.tensor(margin, dtype=torch.float64),
        center,
    )


@pytest.mark.parametrize(
    "ranks",
    [[0, 1], [1, 0], [0, 1, 2], [2, 0, 1], [0, 1, 2, 3], [3, 1, 0, 2], [0, 0, 1], [0, 1, 1, 2], [1, 0, 0, 1]],
)
def test_pair_expansion_matches_hand_enumeration(ranks):
    records = [0] * len(ranks)
    better, worse = ranked_pairs(torch.tensor(ranks), torch.tensor(records))
    got = set(zip(better.tolist(), worse.tolist()))
    assert got == hand_pairs(ranks, records)
    # N distinct ranks give N(N-1)/2 pairs; ties give none.
    if len(set(ranks)) == len(ranks):
        assert len(got) == len(ranks) * (len(ranks) - 1) // 2


def test_pairs_never_cross_records():
    ranks = [0, 1, 0, 1, 2]
    records = [0, 0, 1, 1, 1]
    better, worse = ranked_pairs(torch.tensor(ranks), torch.tensor(records))
    assert set(zip(better.tolist(), worse.tolist())) == {(0, 1), (2, 3), (2, 4), (3, 4)}


def test_two_way_equals_trl_reward_loss():
    scores = [1.5, -0.25]
    out = run(scores, [0, 1], [0, 0])
    assert out.loss.item() == pytest.approx(nll(1.75), abs=1e-12)
    # TRL's RewardTrainer: -logsigmoid(chosen - rejected).mean()
    trl = -torch.nn.functional.logsigmoid(torch.tensor(1.5) - torch.tensor(-0.25)).mean()
    assert out.loss.item() == pytest.approx(trl.item(), abs=1e-6)


def test_three_way_hand_value():
    s = [2.0, 0.5, -1.0]  # ranks 0, 1, 2 -> pairs (0,1), (0,2), (1,2)
    out = run(s, [0, 1, 2], [0, 0, 0])
    expected = (nll(s[0] - s[1]) + nll(s[0] - s[2]) + nll(s[1] - s[2])) / 3
    assert out.loss.item() == pytest.approx(expected, abs=1e-12)


def test_four_way_shuffled_ranks_hand_value():
    s = [0.3, -0.7, 1.1, 0.0]
    ranks = [2, 3, 0, 1]  # best: index 2, then 3, then 0, then 1
    out = run(s, ranks, [0, 0, 0, 0])
    order = [2, 3, 0, 1]
    pairs = [(order[a], order[b]) for a in range(4) for b in range(a + 1, 4)]
    expected = sum(nll(s[i] - s[j]) for i, j in pairs) / 6
    assert out.loss.item() == pytest.approx(expected, abs=1e-12)


def test_ties_form_no_pair():
    s = [1.0, 0.2, 0.9, -0.5]
    ranks = [0, 1, 1, 2]  # completions 1 and 2 are tied
    out = run(s, ranks, [0] * 4)
    pairs = [(0, 1), (0, 2), (0, 3), (1, 3), (2, 3)]
    expected = sum(nll(s[i] - s[j]) for i, j in pairs) / len(pairs)
    assert out.loss.item() == pytest.approx(expected, abs=1e-12)
    assert (1, 2) not in set(zip(out.better.tolist(), out.worse.tolist()))


def test_all_tied_batch_raises():
    with pytest.raises(ValueError, match="no strictly ordered pair"):
        run([0.1, 0.2], [0, 0], [0, 0])


def test_margin_is_per_record():
    s = [1.0, 0.0, 2.0, 1.5, 0.5]
    ranks = [0, 1, 0, 1, 2]
    records = [0, 0, 1, 1, 1]
    margin = [0.5, 0.25]
    out = run(s, ranks, records, margin=margin)
    pairs = [(0, 1, 0.5), (2, 3, 0.25), (2, 4, 0.25), (3, 4, 0.25)]
    expected = sum(nll(s[i] - s[j] - m) for i, j, m in pairs) / 4
    assert out.loss.item() == pytest.approx(expected, abs=1e-12)


def test_center_rewards_matches_trl_for_two_way_and_extends_to_n_way():
    c = 0.01
    s = [1.5, -0.25]
    out = run(s, [0, 1], [0, 0], center=c)
    # TRL: loss += c * mean((chosen + rejected) ** 2)
    assert out.loss.item() == pytest.approx(nll(1.75) + c * (1.25**2), abs=1e-12)
    s = [2.0, 0.5, -1.0]
    out = run(s, [0, 1, 2], [0, 0, 0], center=c)
    pairs = [(0, 1), (0, 2), (1, 2)]
    bt = sum(nll(s[i] - s[j]) for i, j in pairs) / 3
    center = sum((s[i] + s[j]) ** 2 for i, j in pairs) / 3
    assert out.loss.item() == pytest.approx(bt + c * center, abs=1e-12)


def test_gradient_flows_to_every_completion_once():
    scores = torch.tensor([0.4, 0.1, -0.2], dtype=torch.float64, requires_grad=True)
    out = ranked_bradley_terry_loss(scores, torch.tensor([0, 1, 2]), torch.zeros(3, dtype=torch.long))
    out.loss.backward()
    s = scores.detach().tolist()
    sig = lambda x: 1 / (1 + math.exp(-x))  # noqa: E731
    # d/ds_i of mean_p -log sigmoid(s_b - s_w): -(1 - sigmoid(d)) / P for the better, + for the worse
    grad = [0.0, 0.0, 0.0]
    for i, j in [(0, 1), (0, 2), (1, 2)]:
        g = (1 - sig(s[i] - s[j])) / 3
        grad[i] -= g
        grad[j] += g
    assert scores.grad.tolist() == pytest.approx(grad, abs=1e-12)


def test_record_statistics_give_exact_set_metrics():
    # Two records; record 1 has a score tie between ranked completions (counts as wrong).
    s = [1.0, 0.0, 0.3, 0.3, -1.0]
    ranks = [0, 1, 0, 1, 2]
    records = [0, 0, 1, 1, 1]
    out = run(s, ranks, records)
    stats = record_statistics(torch.tensor(s, dtype=torch.float64), torch.tensor(records), out, 2)
    assert stats.shape == (2, len(STAT_COLUMNS))
    summary = summarize_statistics(stats)
    pairs = [(0, 1), (2, 3), (2, 4), (3, 4)]
    assert summary["num_pairs"] == 4
    assert summary["accuracy"] == pytest.approx(3 / 4)  # (2, 3) is a score tie -> wrong
    assert summary["margin"] == pytest.approx(sum(s[i] - s[j] for i, j in pairs) / 4)
    assert summary["rewards_chosen_mean"] == pytest.approx(sum(s[i] for i, _ in pairs) / 4)
    assert summary["rewards_rejected_mean"] == pytest.approx(sum(s[j] for _, j in pairs) / 4)
    assert summary["loss"] == pytest.approx(sum(nll(s[i] - s[j]) for i, j in pairs) / 4)
    mean = sum(s) / 5
    assert summary["reward_mean"] == pytest.approx(mean)
    assert summary["reward_std"] == pytest.approx((sum((x - mean) ** 2 for x in s) / 5) ** 0.5)
    # Summing per-record rows in any split gives the same set metrics (batch-size independence).
    assert summarize_statistics(stats[:1] + stats[1:]) == summarize_statistics(stats.sum(0))
