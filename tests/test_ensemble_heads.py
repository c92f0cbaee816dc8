"""The ensemble heads' bootstrap weights and loss (`trl_rm_env.trainer.ensemble`), beyond what
tests/test_ensemble_training.py holds:

- `bootstrap_weights`: Poisson(1) draws, checked without restating the hash: their frequencies over many records
  against Poisson(1)'s probabilities e^-1 / k! (`math`), records of the same shape told apart by their token ids,
  negative seeds, the dtype whatever torch's default; and, with the hash stubbed (a digest chosen here), the
  quantile it maps to: u = digest / 2^64 (the 8 digest bytes read little-endian) falls in the Poisson CDF's steps
  e^-1, 2 e^-1, ..., a u on a step's upper edge taking that step (P(X <= k) = CDF(k)), u = 1 the cap `MAX_POISSON`.
- `ensemble_loss`: in the scores' dtype whatever the margin's and weights' (the collator's float32/float64), and
  the weights moved to the scores' device (the meta device standing in for an accelerator: no data, only devices).

Fast: tensors of a few elements and two thousand hashes (~0.1 s).
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from trl_rm_env.trainer import ensemble
from trl_rm_env.trainer.ensemble import MAX_POISSON, bootstrap_weights, ensemble_loss


@pytest.fixture(autouse=True)
def one_torch_thread():
    """Tensors of a few elements: one intra-op thread (two spin against other work on a busy 2-core box)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def same_shape_records(count: int) -> list[list[list[int]]]:
    """`count` records of two completions of 3 and 2 tokens each, told apart only by their token ids."""
    return [[[i, i + 1, 7], [3 * i, 5]] for i in range(count)]


def test_bootstrap_weights_follow_poisson_one_over_records_told_apart_by_their_tokens():
    weights = bootstrap_weights(same_shape_records(500), 4, seed=3)  # 2000 draws
    assert torch.equal(weights, weights.round()) and 0 <= weights.min() and weights.max() <= MAX_POISSON
    # Frequencies of 0..3 against P(X = k) = e^-1 / k! (0.368, 0.368, 0.184, 0.061): a frequency's standard error
    # over 2000 draws is at most sqrt(0.25 / 2000) = 0.011; 0.045 is four of them.
    for k in range(4):
        assert (weights == k).float().mean().item() == pytest.approx(math.exp(-1) / math.factorial(k), abs=0.045)
    assert weights.mean().item() == pytest.approx(1.0, abs=0.08)  # E[X] = 1
    # A negative seed is a seed: reproducible, and another resample than its absolute value's.
    batch = same_shape_records(40)
    negative = bootstrap_weights(batch, 2, seed=-3)
    assert torch.equal(negative, bootstrap_weights(batch, 2, seed=-3))
    assert not torch.equal(negative, bootstrap_weights(batch, 2, seed=3))


def test_bootstrap_weights_are_float32_whatever_torchs_default_dtype():
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        weights = bootstrap_weights(same_shape_records(2), 3, seed=0)
    finally:
        torch.set_default_dtype(default)
    assert weights.dtype == torch.float32 and weights.shape == (2, 3)


def test_a_hash_maps_to_the_poisson_quantile_of_its_uniform(monkeypatch):
    # e^-1 as a double is m * 2^-54 (it lies in [1/4, 1/2)), so e^-1 * 2^64 is an integer, exactly a digest.
    e = math.exp(-1)
    values = [
        0,  # u ~ 2^-65: the smallest draw, 0
        int(e * 2.0**64),  # u = e^-1 = P(X <= 0) exactly: still 0
        int(e * 2.0**64) + 2**11,  # just above (2^11 > the ulp of e^-1 * 2^64): 1
        int(2 * e * 2.0**64),  # u = 2 e^-1 = P(X <= 1): 1
        int(2.5 * e * 2.0**64),  # P(X <= 1) < u = 0.92 < P(X <= 2) = 2.5 e^-1: 2
        2**64 - 1,  # u = 1 to double precision, above P(X <= 15) = 1 - 2e-14: the cap, 16
    ]
    digests = iter(v.to_bytes(8, "little") for v in values)
    monkeypatch.setattr(ensemble, "hashlib", SimpleNamespace(
        blake2b=lambda data, **options: SimpleNamespace(digest=lambda: next(digests))))  # fmt: skip
    weights = bootstrap_weights(same_shape_records(len(values)), 1, seed=0)
    assert weights[:, 0].tolist() == [0.0, 0.0, 1.0, 1.0, 2.0, 16.0] and MAX_POISSON == 16


def test_the_ensemble_loss_keeps_the_scores_dtype_and_device():
    # float32 scores (the model's), a float64 margin and float64 weights: every loss float32.
    scores = torch.tensor([[1.0, 0.5], [0.0, 1.0], [2.0, -1.0], [0.5, 0.5]])
    ranks, record_index = torch.tensor([0, 1, 0, 1]), torch.tensor([0, 0, 1, 1])
    margin = torch.tensor([0.25, 0.0], dtype=torch.float64)
    weights = torch.tensor([[1.0, 2.0], [3.0, 0.0]], dtype=torch.float64)
    loss, aggregate, heads = ensemble_loss(scores, ranks, record_index, margin, None, weights)
    assert loss.dtype == aggregate.loss.dtype == torch.float32
    assert [(h.loss.dtype, h.pair_losses.dtype) for h in heads] == [(torch.float32, torch.float32)] * 2
    # Head 0: pairs (0, 1) and (2, 3), differences 1 - 0 - 0.25 and 2 - 0.5, weights 1 and 3, over 2 pairs.
    nll = lambda x: math.log1p(math.exp(-x))  # noqa: E731  -log sigmoid(x)
    assert heads[0].loss.item() == pytest.approx((1 * nll(0.75) + 3 * nll(1.5)) / 2, abs=1e-6)
    # Scores on an accelerator (meta), the collator's weights on the CPU: moved to the scores, the loss there.
    loss, _, heads = ensemble_loss(scores.to("meta"), ranks, record_index, None, 0.01, weights.float())
    assert loss.device.type == "meta" and heads[1].loss.device.type == "meta"


@pytest.mark.parametrize(
    "given, ensemble, weights",
    [
        ({}, 3, [1 / 3, 1 / 3, 1 / 3]),  # an ensemble checkpoint: the mean of its 3 heads
        ({"label_index": 1}, 1, None),  # head 1 alone: its column is the reward
        ({"kind": "bradley_terry"}, 1, None),  # one head declared: column 0
    ],
)
def test_an_ensembles_reward_is_read_in_one_place_the_mean_of_its_heads_unless_asked_otherwise(given, ensemble, weights):
    """`heads.reward_head` decides once how an ensemble checkpoint's outputs become its reward, for scoring, the
    reward function and `eval` alike (they read `RewardHead.ensemble` and `output_weights`)."""
    from trl_rm_env.heads import RewardHead, reward_head

    config = SimpleNamespace(num_labels=3, ensemble_heads=3, id2label={0: "head_0", 1: "head_1", 2: "head_2"})
    head = reward_head(config, **given)
    assert head.ensemble == ensemble and head.output_weights(3) == weights
    assert reward_head(SimpleNamespace(num_labels=1)).output_weights(1) is None  # a one-head model: column 0
    regression = RewardHead(("helpful", "safe"), (1.0, -0.5))
    assert regression.output_weights(2) == [1.0, -0.5]
