"""Evaluating a regression reward model: per set and attribute, RMSE, MAE and Pearson r, as the trainer logs them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from ..data.regression import attribute_matrix, attribute_names
from ..heads import attribute_names as head_attribute_names
from ..heads import is_regression_model
from ..metrics import regression_statistics, summarize_regression_statistics
from .preference import scorer_for


def evaluate_regression_model(
    model_or_scorer: Any,
    datasets: Mapping[str, Sequence[Mapping[str, Any]]],
    *,
    skipped: Mapping[str, int] | None = None,
    progress: bool = True,
    **scorer_kwargs: Any,
) -> dict[str, Any]:
    """Per-set, per-attribute RMSE, MAE and Pearson r of a regression reward model on regression records.

    Every record is scored once in one batched `RewardScorer` call; the metrics are those the trainer logs
    (`summarize_regression_statistics`): attribute values missing from a record are left out, and attributes in the
    data that the model does not predict are ignored (listed under `"ignored_attributes"`).

    Args:
        model_or_scorer: A `RewardScorer` over a regression RM, or a model path or Hub id (loaded with
            `load_reward_scorer(**scorer_kwargs)`).
        datasets: Set name -> validated regression records (`load_regression_records` output).
        skipped: Set name -> rows skipped as invalid while loading, copied into the results.
        progress: Show a progress bar over scoring batches.

    Returns:
        `{"type": "regression", "attributes": [...], "sets": {name: {"records", "skipped", "unscored", "loss",
        "<attr>_rmse", "<attr>_mae", "<attr>_pearson", "<attr>_count"}}, "ignored_attributes": [...]}`.

    Raises:
        ValueError: no set given, or a model that is not a regression reward model.
    """
    scorer = scorer_for(datasets, model_or_scorer, scorer_kwargs, one_reward=False)
    config = scorer.config
    if not is_regression_model(config):
        raise ValueError(
            f"{config._name_or_path!r} is not a regression reward model (config.reward_model_type is "
            f"{getattr(config, 'reward_model_type', None)!r}); use evaluate_reward_model for preference data."
        )
    attributes = head_attribute_names(config)
    contexts = [r["context"] for records in datasets.values() for r in records]
    completions = [r["completion"] for records in datasets.values() for r in records]
    if not hasattr(scorer, "outputs"):
        raise ValueError(f"{type(scorer).__name__} gives one score per sample; per-attribute metrics need a RewardScorer")
    outputs = scorer.outputs(contexts, completions, progress=progress)  # (N, K); NaN rows: not scored
    results: dict[str, Any] = {"type": "regression", "attributes": attributes, "sets": {}}
    ignored: set[str] = set()
    offset = 0
    for name, records in datasets.items():
        ignored |= set(attribute_names(records)) - set(attributes)
        predictions = outputs[offset : offset + len(records)]
        targets = torch.tensor(attribute_matrix(records, attributes), dtype=torch.float64).reshape(len(records), -1)
        unscored = torch.isnan(predictions).any(dim=1)
        targets[unscored] = float("nan")  # an unscored record counts for nothing
        stats = regression_statistics(torch.nan_to_num(predictions), targets)
        metrics: dict[str, Any] = {
            "records": len(records),
            "skipped": int((skipped or {}).get(name, 0)),
            "unscored": int(unscored.sum()),
        }
        metrics.update(summarize_regression_statistics(stats, attributes))
        for k, attribute in enumerate(attributes):
            metrics[f"{attribute}_count"] = int(stats[:, k, 0].sum().item())
        results["sets"][name] = metrics
        offset += len(records)
    results["ignored_attributes"] = sorted(ignored)
    return results
