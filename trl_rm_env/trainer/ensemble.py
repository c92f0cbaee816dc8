"""K bootstrapped score heads on one backbone (`RankedRewardConfig(ensemble_heads=K)`): an ensemble of reward models
for the cost of one (Zhang et al. 2024, efficient reward-model ensembles; Coste et al. 2023 and Eisenstein et al.
2023 on why ensembles resist over-optimization).

- **Model**: an ordinary `*ForSequenceClassification` with `num_labels=K`, one output per head, and
  `config.ensemble_heads = K` naming it an ensemble; every tool that loads a sequence classifier loads it, and
  `RewardModelEnvironment` aggregates its heads (`ensemble`, default `mean` for such a checkpoint).
- **Loss**: each head k has its own Bradley-Terry loss over the same ranked pairs P, each pair weighted by its
  record's bootstrap weight w[r, k]: `loss_k = 1/|P| sum_p w[r(p), k] l_kp` (E[w] = 1: the resample's mean loss,
  estimated; a sum over pairs, so chunks and processes compose as for one head); the loss is the mean of the heads'
  losses, so the backbone gets the mean of their gradients. TRL's `center_rewards_coefficient` applies to each head,
  unweighted (it centres the head's scale, not its fit to the resample).
- **Bootstrap**: w[r, k] ~ Poisson(1) (the online bootstrap: a resample with replacement, record by record), drawn
  from a hash of the record's token ids keyed by the seed and personalized by the head's index: reproducible by
  seed, different between heads, the same for a record whatever its batch, order, process or the number of heads.
- **Metrics**: training and evaluation report the aggregate (the mean of the heads), under TRL's names; evaluation
  adds each head's accuracy (`eval_<set>_head_<k>_accuracy`).

With K=1 nothing here runs: training is exactly the single-head trainer's.
"""

from __future__ import annotations

import array
import hashlib
import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F

from .loss import PairwiseOutput, ranked_bradley_terry_loss

MAX_POISSON = 16
"""The largest bootstrap weight drawn (Poisson(1) puts 1e-14 of its mass above it)."""
_POISSON_CDF = [sum(math.exp(-1.0) / math.factorial(j) for j in range(k + 1)) for k in range(MAX_POISSON)]


def bootstrap_weights(records: Sequence[Sequence[Sequence[int]]], heads: int, seed: int) -> torch.Tensor:
    """`(B, heads)` Poisson(1) weights, one per record and head, each from a BLAKE2b hash of the record's token ids
    (`records[b]`: its completions' token ids) keyed by the seed and personalized by the head's index: the same record
    gets the same weights anywhere, and head k's weights do not depend on how many heads there are."""
    key = int(seed).to_bytes(8, "little", signed=True)
    out = torch.empty(len(records), heads, dtype=torch.float32)
    for b, completions in enumerate(records):
        data = b"".join(len(ids).to_bytes(4, "little") + array.array("q", ids).tobytes() for ids in completions)
        for k in range(heads):
            raw = hashlib.blake2b(data, key=key, digest_size=8, person=k.to_bytes(16, "little")).digest()
            u = (int.from_bytes(raw, "little") + 0.5) / 2.0**64  # uniform in (0, 1)
            out[b, k] = next((j for j, c in enumerate(_POISSON_CDF) if u <= c), MAX_POISSON)
    return out


def ensemble_loss(
    scores: torch.Tensor,
    ranks: torch.Tensor,
    record_index: torch.Tensor,
    margin: torch.Tensor | None,
    center_rewards_coefficient: float | None,
    weights: torch.Tensor | None,
) -> tuple[torch.Tensor, PairwiseOutput, list[PairwiseOutput]]:
    """`(loss, aggregate, heads)` of K heads' scores `(C, K)`: the mean over heads of each head's Bradley-Terry loss,
    its pairs weighted by `weights` `(B, K)` (None: unweighted, as in evaluation) over the number of pairs (the
    Poisson bootstrap's estimate of the resample's mean loss, E[w] = 1: a sum over pairs, so a batch cut into chunks,
    or spread over processes, weighs each pair as one forward would); the aggregate's pairs and losses (the mean of
    the heads' scores) for the metrics; and each head's for its own (`head_statistics`: its `pair_losses` unweighted,
    its `loss` the head's term of the mean). The pairs are found once: every head has the same."""
    aggregate = ranked_bradley_terry_loss(scores.mean(dim=1), ranks, record_index, margin)
    better, worse = aggregate.better, aggregate.worse
    diff = scores[better] - scores[worse]  # (P, K)
    if margin is not None:  # (checked by the aggregate's loss)
        diff = diff - margin.to(diff.dtype)[record_index[better]][:, None]
    pair_losses = -F.logsigmoid(diff)
    weighted = pair_losses
    if weights is not None:
        weighted = weights.to(pair_losses.device, pair_losses.dtype)[record_index[better]] * pair_losses
    losses = weighted.mean(dim=0)  # (K,)
    if center_rewards_coefficient is not None:
        losses = losses + center_rewards_coefficient * ((scores[better] + scores[worse]) ** 2).mean(dim=0)
    heads = [PairwiseOutput(losses[k], better, worse, pair_losses[:, k]) for k in range(scores.shape[1])]
    return losses.mean(), aggregate, heads


def head_statistics(
    scores: torch.Tensor, record_index: torch.Tensor, heads: Sequence[PairwiseOutput], num_records: int
) -> torch.Tensor:
    """`(B, K, 9)` per-record sums of each head's pairs (`trl_rm_env.metrics.record_statistics`), from the heads'
    `PairwiseOutput`s of `ensemble_loss`."""
    from ..metrics import record_statistics

    return torch.stack(
        [record_statistics(scores[:, k], record_index, head, num_records) for k, head in enumerate(heads)], dim=1
    )
