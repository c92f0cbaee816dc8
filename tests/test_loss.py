"""Ranked Bradley-Terry loss: pair expansion and values against hand computation (plain Python math); the pairs'
indices and TRL's pair layout made on the device asked for (the meta device, or a spy on `torch`, standing in for an
accelerator); the margin's bound and dtype; the regression loss (`masked_mse_loss`) on literal tensors: its divisor
(the values present) and its dtype (the predictions')."""

from __future__ import annotations

import math
import re

import pytest
import torch

from trl_rm_env.metrics import STAT_COLUMNS, record_statistics, summarize_statistics
from trl_rm_env.trainer.loss import masked_mse_loss, pair_layout, ranked_bradley_terry_loss, ranked_pairs


@pytest.fixture(autouse=True)
def one_torch_thread():
    """Tensors of a few elements: one intra-op thread (two spin against other work on a busy 2-core box:
    `repeat_interleave` in `ranked_pairs` took tens of ms a call that way)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


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
    with pytest.raises(
        ValueError,
        match=r"^The batch holds no strictly ordered pair \(every record's completions are "
        r"tied\)\.$",
    ):
        run([0.1, 0.2], [0, 0], [0, 0])


def test_pairs_of_interleaved_records_come_sorted_by_better_then_worse():
    # Records 0 (rows 0, 2, 3 ranked 0, 1, 2) and 1 (rows 1, 4 ranked 0, 1), interleaved: pairs (0, 2), (0, 3),
    # (2, 3) and (1, 4), listed in (better, worse) order as the docstring promises.
    better, worse = ranked_pairs(torch.tensor([0, 0, 1, 2, 1]), torch.tensor([0, 1, 0, 0, 1]))
    assert list(zip(better.tolist(), worse.tolist())) == [(0, 2), (0, 3), (1, 4), (2, 3)]
    # An empty batch: no pair, long indices on the batch's device (meta standing in for an accelerator).
    empty = torch.zeros(0, dtype=torch.long, device="meta")
    better, worse = ranked_pairs(empty, empty)
    assert better.shape == worse.shape == (0,) and better.dtype == worse.dtype == torch.long
    assert better.device.type == worse.device.type == "meta"


class DeviceSpy:
    """`torch` as `trl_rm_env.trainer.loss` sees it, recording the device of every tensor it makes with `arange`
    or `zeros` (a stand-in for an accelerator: ranked_pairs' index arithmetic is data-dependent, so it cannot run on
    the meta device)."""

    def __init__(self):
        self.devices: list = []

    def __getattr__(self, name):
        return getattr(torch, name)

    def arange(self, *args, **kwargs):
        self.devices.append(kwargs.get("device"))
        return torch.arange(*args, **kwargs)

    def zeros(self, *args, **kwargs):
        self.devices.append(kwargs.get("device"))
        return torch.zeros(*args, **kwargs)


def test_ranked_pairs_makes_its_indices_on_the_ranks_device(monkeypatch):
    # On CUDA a CPU index tensor mixed into the ranks' arithmetic is a device error; every tensor made here must be
    # asked for on the ranks' device (interleaved records: the re-sorting path runs too).
    from trl_rm_env.trainer import loss as loss_module

    spy = DeviceSpy()
    monkeypatch.setattr(loss_module, "torch", spy)
    better, worse = ranked_pairs(torch.tensor([0, 0, 1, 2, 1]), torch.tensor([0, 1, 0, 0, 1]))
    assert list(zip(better.tolist(), worse.tolist())) == [(0, 2), (0, 3), (1, 4), (2, 3)]
    assert spy.devices and set(spy.devices) == {torch.device("cpu")}


def test_a_margin_is_refused_over_1000_in_size_and_kept_in_the_scores_dtype():
    # MAX_MARGIN (data/schema.py) is 1000: exactly 1000 is a margin; the loss of s = (1, 0) with m = 1000 is
    # -log sigmoid(1 - 1000) = 999 + log1p(exp(-999)) = 999 to double precision.
    out = run([1.0, 0.0], [0, 1], [0, 0], margin=[1000.0])
    assert out.loss.item() == pytest.approx(999.0, abs=1e-9)
    message = (
        "margin is not finite or larger than 1000 in size for batch record(s) [1] (values [nan]); margins "
        "are in reward units: fix the dataset's margin column (a missing margin is 0)"
    )
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        run([1.0, 0.0, 2.0, 0.5], [0, 1, 0, 1], [0, 0, 1, 1], margin=[0.5, math.nan])
    # float32 scores (the model's), a float64 margin (the collator's): the loss stays float32.
    out = ranked_bradley_terry_loss(torch.tensor([1.0, 0.0]), torch.tensor([0, 1]), torch.tensor([0, 0]),
                                    torch.tensor([0.5], dtype=torch.float64))  # fmt: skip
    assert out.pair_losses.dtype == out.loss.dtype == torch.float32
    assert out.loss.item() == pytest.approx(nll(0.5), abs=1e-6)


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


def test_pair_layout_is_made_on_the_scores_device():
    # The meta device stands in for an accelerator: tensors made on it carry no data, only their device.
    ranks, record_index = pair_layout(4, torch.device("meta"))
    assert ranks.device.type == record_index.device.type == "meta"
    assert ranks.shape == record_index.shape == (4,)


def test_masked_mse_divides_by_the_values_present_in_the_predictions_dtype():
    # One value present: (5 - 3)^2 / 1 = 4 (not over 2: the masked value is no sample).
    loss = masked_mse_loss(torch.tensor([[2.0, 5.0]]), torch.tensor([[float("nan"), 3.0]]))
    assert loss.item() == 4.0
    # Nothing present: 0 (the divisor clamped to 1), with a gradient.
    predictions = torch.tensor([[1.0, 2.0]], requires_grad=True)
    loss = masked_mse_loss(predictions, torch.full((1, 2), float("nan")))
    assert loss.item() == 0.0 and loss.requires_grad
    # float64 ratings, bf16 predictions (the model's dtype): the loss in bf16, as the model's other losses are;
    # (1.5 - 0.25)^2 = 1.5625, exact in bf16.
    loss = masked_mse_loss(torch.tensor([[1.5]], dtype=torch.bfloat16), torch.tensor([[0.25]], dtype=torch.float64))
    assert loss.dtype == torch.bfloat16 and loss.item() == 1.5625
