"""Exact statistics over whole sets: per-example sums that add up across batches and processes.

Metrics logged per validation set (and in training) are never means of batch means: every batch contributes sums
(pairs, correct pairs, margins, losses, reward moments; per attribute, errors and cross products), which are gathered
across processes and added, and the set's metrics are computed once from the totals. So they do not depend on the
batch size, the number of processes or the padding Accelerate adds to a last batch. The trainers and `eval` share
these functions.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Protocol

import torch


class Pairs(Protocol):
    """The pairs a Bradley-Terry loss was computed from (`trl_rm_env.trainer.loss.PairwiseOutput`): row indices
    `better` and `worse` into the score vector, and each pair's loss."""

    better: torch.Tensor
    worse: torch.Tensor
    pair_losses: torch.Tensor

# --- Bradley-Terry: per-record sums over pairs ---

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


def record_statistics(
    scores: torch.Tensor, record_index: torch.Tensor, out: Pairs, num_records: int
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


# --- regression: per-example, per-attribute sums ---

ATTRIBUTE_METRICS = ("rmse", "mae", "pearson")
# Per attribute, summed over examples whose value is present (x: prediction, y: target).
REGRESSION_STAT_COLUMNS = ("n", "sum_err2", "sum_abs", "sum_x", "sum_y", "sum_xy", "sum_x2", "sum_y2")


def regression_statistics(predictions: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Per-example, per-attribute sums (columns `REGRESSION_STAT_COLUMNS`), shape `(B, K, 8)`, float64, zero where missing.

    Columns `REGRESSION_STAT_COLUMNS`. Summing over all examples of a set gives exact RMSE, MAE and Pearson correlation per attribute, whatever the
    batch sizes or the number of processes.
    """
    x, y = predictions.detach().double(), targets.double()  # (B, K)
    mask = ~torch.isnan(y)
    x, y = torch.where(mask, x, 0.0), torch.nan_to_num(y)
    err = x - y
    columns = [mask.double(), err**2, err.abs(), x, y, x * y, x**2, y**2]
    return torch.stack(columns, dim=-1)


def summarize_regression_statistics(stats: torch.Tensor, attributes: Sequence[str]) -> dict[str, float]:
    """Set-level metrics from summed `regression_statistics` (`(K, 8)`, or `(B, K, 8)` summed here).

    Returns:
        `loss` (MSE over every present value) and, per attribute, `<attr>_rmse`, `<attr>_mae`, `<attr>_pearson`
        (NaN when the attribute has no value, or Pearson's r when predictions or targets are constant).
    """
    if stats.dim() == 3:
        stats = stats.sum(0)
    stats = stats.double().cpu()
    total = stats[:, 0].sum().item()
    out = {"loss": stats[:, 1].sum().item() / total if total else math.nan}
    for name, row in zip(attributes, stats.tolist()):
        n, err2, abs_err, sx, sy, sxy, sx2, sy2 = row
        if n == 0:
            out.update({f"{name}_{metric}": math.nan for metric in ATTRIBUTE_METRICS})
            continue
        var_x, var_y = n * sx2 - sx * sx, n * sy2 - sy * sy
        denominator = math.sqrt(var_x * var_y) if var_x > 0 and var_y > 0 else 0.0
        out[f"{name}_rmse"] = math.sqrt(err2 / n)
        out[f"{name}_mae"] = abs_err / n
        out[f"{name}_pearson"] = (n * sxy - sx * sy) / denominator if denominator else math.nan
    return out
