"""Bradley-Terry loss over every ordered pair of a ranked record.

Bradley & Terry (1952); Ouyang et al. 2022 (InstructGPT, Eq. 1) for reward models. For a record with completions
scored r_1..r_N and ranks k_1..k_N (lower is better), every pair (i, j) with k_i < k_j is a preference i > j:

    loss = mean over pairs of  -log sigmoid(r_i - r_j - m)

with m the record's margin (0 when absent). Tied completions (k_i == k_j) form no pair. InstructGPT trains on all
K(K-1)/2 pairs of a prompt as one batch element so that each completion is run through the model once; we do the
same: the pair matrix is built from one score vector. TRL's `center_rewards_coefficient` (Eisenstein et al. 2023,
Eq. 2) adds `c * mean over pairs of (r_i + r_j)^2`, which is exactly TRL's term for two completions.

Regression reward models (NeMo Aligner's second kind) train with `masked_mse_loss`. The exact statistics that the
trainers log per set from these losses are in `trl_rm_env.metrics`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


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


def pair_layout(rows: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """`(ranks, record_index)` of TRL's pair layout: rows 0..B-1 are the chosen, B..2B-1 the rejected."""
    half = rows // 2
    ranks = torch.cat([torch.zeros(half, dtype=torch.long), torch.ones(half, dtype=torch.long)]).to(device)
    return ranks, torch.arange(half, device=device).repeat(2)


def masked_mse_loss(predictions: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean squared error over the attribute values present (NeMo Aligner's regression RM loss).

        loss = sum_{i,a} m_ia (p_ia - y_ia)^2 / sum_{i,a} m_ia,    m_ia = 1 if y_ia is present (not NaN), else 0

    Args:
        predictions: `(B, K)` predicted attribute values.
        targets: `(B, K)` rated values, NaN where an attribute is missing.

    Returns:
        The scalar loss (0 with a gradient when nothing is present).
    """
    mask = ~torch.isnan(targets)  # (B, K)
    err = torch.where(mask, predictions - torch.nan_to_num(targets).to(predictions.dtype), 0.0)
    return (err**2).sum() / mask.sum().clamp(min=1)
