"""Bradley-Terry loss over every ordered pair of a ranked record.

Bradley & Terry (1952); Ouyang et al. 2022 (InstructGPT, Eq. 1) for reward models. For a record with completions
scored r_1..r_N and ranks k_1..k_N (lower is better), every pair (i, j) with k_i < k_j is a preference i > j:

    loss = mean over pairs of  -log sigmoid(r_i - r_j - m)

with m the record's margin (0 when absent). Tied completions (k_i == k_j) form no pair. InstructGPT trains on all
K(K-1)/2 pairs of a prompt as one batch element so that each completion is run through the model once; we do the
same: the pair matrix is built from one score vector. TRL's `center_rewards_coefficient` (Eisenstein et al. 2023,
Eq. 2) adds `c * mean over pairs of (r_i + r_j)^2`, which is exactly TRL's term for two completions.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

# Columns of the per-record statistics used for exact evaluation metrics (summed over a whole set).
STAT_COLUMNS = (
    "num_pairs",
    "num_correct",
    "margin_sum",
    "better_sum",
    "worse_sum",
    "loss_sum",
    "num_completions",
    "score_sum",
    "score_sq_sum",
)


@dataclass
class PairwiseOutput:
    """The loss and the pairs it was computed from (`better`, `worse`: row indices into the score vector)."""

    loss: torch.Tensor
    better: torch.Tensor
    worse: torch.Tensor
    pair_losses: torch.Tensor


def ranked_pairs(ranks: torch.Tensor, record_index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Row indices `(better, worse)` of every strictly ordered pair within the same record. Shapes: `(P,)`.

    Pairs are sorted by `(better, worse)`. Only pairs within a record are ever formed: memory is proportional to
    the sum over records of `n_r ** 2` (not to the square of the batch's completion count).
    """
    device = ranks.device
    num_rows = ranks.numel()
    if num_rows == 0:
        empty = torch.zeros(0, dtype=torch.long, device=device)
        return empty, empty
    order = torch.argsort(record_index, stable=True)  # each record's rows together, in row order
    counts = torch.unique_consecutive(record_index[order], return_counts=True)[1]  # (R,)
    starts = torch.cumsum(counts, 0) - counts
    row_count = counts.repeat_interleave(counts)  # (C,): size of the row's record, in sorted order
    row_start = starts.repeat_interleave(counts)
    # Candidate (a, b): sorted row a with every sorted row b of its record.
    a = torch.arange(num_rows, device=device).repeat_interleave(row_count)  # (Q,)
    first = torch.cumsum(row_count, 0) - row_count
    b = row_start[a] + torch.arange(a.numel(), device=device) - first.repeat_interleave(row_count)
    sorted_ranks = ranks[order]
    keep = sorted_ranks[a] < sorted_ranks[b]
    better, worse = order[a[keep]], order[b[keep]]
    if not torch.equal(order, torch.arange(num_rows, device=device)):  # records interleaved: restore row order
        perm = torch.argsort(better * num_rows + worse)
        better, worse = better[perm], worse[perm]
    return better, worse


def ranked_bradley_terry_loss(
    scores: torch.Tensor,
    ranks: torch.Tensor,
    record_index: torch.Tensor,
    margin: torch.Tensor | None = None,
    center_rewards_coefficient: float | None = None,
) -> PairwiseOutput:
    """Bradley-Terry loss, mean over all strictly ordered pairs of every record.

    Args:
        scores: `(C,)` reward of each completion.
        ranks: `(C,)` rank of each completion (lower is better).
        record_index: `(C,)` record each completion belongs to.
        margin: `(B,)` optional margin per record, subtracted from every pair's score difference.
        center_rewards_coefficient: optional weight of the mean of `(r_i + r_j)^2` over pairs.

    Returns:
        A `PairwiseOutput`.

    Raises:
        ValueError: no strictly ordered pair in the batch, or a non-finite margin.
    """
    better, worse = ranked_pairs(ranks, record_index)
    if better.numel() == 0:
        raise ValueError("The batch holds no strictly ordered pair (every record's completions are tied).")
    diff = scores[better] - scores[worse]  # (P,)
    if margin is not None:
        # Data that skipped validation (pre-tokenized columns): fail loudly, as validation does.
        from ..data.schema import MAX_MARGIN  # here: this module stays importable on its own (torch only)

        bad = (~torch.isfinite(margin) | (margin.abs() > MAX_MARGIN)).nonzero().flatten().tolist()
        if bad:
            raise ValueError(
                f"margin is not finite or larger than {MAX_MARGIN:g} in size for batch record(s) {bad} (values "
                f"{margin[bad].tolist()}); margins are in reward units: fix the dataset's margin column (a missing "
                "margin is 0)"
            )
        diff = diff - margin.to(diff.dtype)[record_index[better]]
    pair_losses = -F.logsigmoid(diff)
    loss = pair_losses.mean()
    if center_rewards_coefficient is not None:
        loss = loss + center_rewards_coefficient * ((scores[better] + scores[worse]) ** 2).mean()
    return PairwiseOutput(loss=loss, better=better, worse=worse, pair_losses=pair_losses)


def record_statistics(
    scores: torch.Tensor, record_index: torch.Tensor, out: PairwiseOutput, num_records: int
) -> torch.Tensor:
    """Per-record sums (columns `STAT_COLUMNS`), shape `(B, 9)`, float64, for exact metrics over a whole set.

    A pair is correct when the better completion scores strictly higher (a tie in score counts as wrong, as in
    RewardBench). Summing rows over a set and dividing gives exact accuracy, margin, loss and reward moments,
    whatever the batch sizes.
    """
    scores = scores.detach().double()
    stats = torch.zeros(num_records, len(STAT_COLUMNS), dtype=torch.float64, device=scores.device)
    pair_record = record_index[out.better]
    s_better, s_worse = scores[out.better], scores[out.worse]
    per_pair = torch.stack(
        [
            torch.ones_like(s_better),
            (s_better > s_worse).double(),
            s_better - s_worse,
            s_better,
            s_worse,
            out.pair_losses.detach().double(),
        ],
        dim=1,
    )
    stats[:, :6].index_add_(0, pair_record, per_pair)
    per_completion = torch.stack([torch.ones_like(scores), scores, scores**2], dim=1)
    stats[:, 6:].index_add_(0, record_index, per_completion)
    return stats


def summarize_statistics(stats: torch.Tensor) -> dict[str, float]:
    """Exact set-level metrics from summed `record_statistics` rows (`(9,)` or `(B, 9)`)."""
    if stats.dim() == 2:
        stats = stats.sum(0)
    s = dict(zip(STAT_COLUMNS, stats.tolist()))
    pairs = max(s["num_pairs"], 1.0)
    n = max(s["num_completions"], 1.0)
    mean = s["score_sum"] / n
    var = max(s["score_sq_sum"] / n - mean**2, 0.0)
    return {
        "loss": s["loss_sum"] / pairs,
        "accuracy": s["num_correct"] / pairs,
        "margin": s["margin_sum"] / pairs,
        "rewards_chosen_mean": s["better_sum"] / pairs,
        "rewards_rejected_mean": s["worse_sum"] / pairs,
        "num_pairs": int(s["num_pairs"]),
        "num_completions": int(s["num_completions"]),
        "reward_mean": mean,
        "reward_std": var**0.5,
    }
