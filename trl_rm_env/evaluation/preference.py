"""Evaluate a reward model on preference sets: pairwise accuracy, margin, and RewardBench v1 section scores.

Every completion of every record is scored once, in one batched `RewardScorer` call (exact: the same numbers for
any batch size or token budget). A record with N ranked completions counts every strictly ordered pair (i better
than j, lower rank); tied ranks give no pair. A pair is correct when the better completion scores strictly higher:
equal scores count as wrong (RewardBench's rule)::

    from trl_rm_env.data import load_rank_records
    from trl_rm_env.evaluation import evaluate_reward_model, format_results_table

    records, _ = load_rank_records("natural.json", data_format="llmbar")
    results = evaluate_reward_model("outputs/rm-tiny", {"llmbar-natural": records}, batch_size=16)
    print(format_results_table(results))

or from the shell: `trl-rm-env eval --model outputs/rm-tiny --data natural.json --format llmbar`.

When set names are RewardBench v1 subsets the section scores are added (`rewardbench.py`).

Every set also gets its length bias (Pearson r of score and completion tokens; accuracy on pairs whose better answer
is the shorter / the longer one) and its calibration (accuracy per |margin| bucket, `MARGIN_BUCKETS`, beside the
Bradley-Terry expectation). RewardBench 2 rows (`trl_rm_env.evaluation.rewardbench2.load_rewardbench2`) add its subset scores.
`evaluate_with_scores` also returns one row per scored completion (`eval --scores`; `trl_rm_env.evaluation.report` plots them).

An ensemble checkpoint (`ensemble_heads` in its config: `RankedRewardConfig(ensemble_heads=K)`) is evaluated on the
mean of its heads, read from one forward (unless `label_index`, `reward_model_type` or `attribute_weights` picks a
reward of its outputs); each set also gets every head's accuracy and the aggregate's accuracy by
quartile of the heads' disagreement on the pair (the std over heads of the pair's margin): an ensemble that knows when
it is wrong is less accurate where its heads disagree (`ensemble_metrics`).
"""

from __future__ import annotations

import asyncio
import json
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from ..data.schema import iter_pairs
from ..scoring.scorer import load_reward_scorer
from .listwise import listwise_metrics
from .rewardbench import rewardbench_sections
from .rewardbench2 import rewardbench2_scores


def score_all(scorer: Any, contexts: list[Any], completions: list[Any], progress: bool) -> list[float]:
    """Every pair's score, through the `Scorer` protocol (a remote backend's coroutine is run here), or any object
    with `score(contexts, completions) -> sequence of floats`."""
    if hasattr(scorer, "score_pairs"):
        scored = scorer.score_pairs(contexts, completions, progress)
        if getattr(scorer, "is_async", False):
            scored = asyncio.run(scored)
        scores = scored.scores
    else:
        scores = scorer.score(contexts, completions)
    scores = torch.as_tensor(scores, dtype=torch.float32).flatten().tolist()
    if len(scores) != len(contexts):
        raise ValueError(f"the scorer returned {len(scores)} scores for {len(contexts)} completions")
    return scores


def _token_counts(scorer: Any, contexts: list[Any], completions: list[Any]) -> list[int | None]:
    """Completion tokens of each item, as the scorer encodes it (None: not scored, or a scorer without `encode`)."""
    if not hasattr(scorer, "encode"):
        return [None] * len(contexts)
    encoded = scorer.encode(contexts, completions)
    return [None if ids is None else len(ids) - n for ids, n in zip(encoded.ids, encoded.context_lengths)]


# --- length bias and calibration ---

MARGIN_BUCKETS: tuple[float, ...] = (0.0, 0.5, 1.0, 2.0, 4.0)
"""Lower edges of the |score margin| buckets: [0, 0.5), [0.5, 1), [1, 2), [2, 4), [4, inf). In Bradley-Terry terms a
margin m says the better answer wins with probability sigmoid(m): about 0.50-0.62, 0.62-0.73, 0.73-0.88, 0.88-0.98
and over 0.98 in these buckets; a calibrated model's accuracy in a bucket is near its `bt_expected`."""


def _bucket_label(k: int) -> str:
    high = f"{MARGIN_BUCKETS[k + 1]:g}" if k + 1 < len(MARGIN_BUCKETS) else "inf"
    return f"[{MARGIN_BUCKETS[k]:g}, {high})"


def margin_bucket(margin: float) -> int:
    """Index into `MARGIN_BUCKETS` of `|margin|`."""
    return max(k for k, low in enumerate(MARGIN_BUCKETS) if abs(margin) >= low)


def pearson(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Pearson correlation of two equal-length sequences; NaN for fewer than 2 points or a constant one."""
    n = len(xs)
    if n < 2:
        return float("nan")
    mx, my = sum(xs) / n, sum(ys) / n
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys))
    sxx = sum((x - mx) ** 2 for x in xs)
    syy = sum((y - my) ** 2 for y in ys)
    return sxy / math.sqrt(sxx * syy) if sxx > 0 and syy > 0 else float("nan")


def _rate(correct: int, pairs: int) -> dict[str, Any]:
    return {"pairs": pairs, "correct": correct, "accuracy": correct / pairs if pairs else float("nan")}


def _set_metrics(
    records: Sequence[Mapping[str, Any]], scores: list[float], lengths: Sequence[int | None] | None = None
) -> dict[str, Any]:
    """Pairwise metrics of one set; `scores` (and `lengths`, completion tokens) are its completions', record by
    record. Adds length bias (Pearson r of score and length; accuracy where the better answer is the shorter or the
    longer one, equal lengths in neither) and accuracy per |margin| bucket (`MARGIN_BUCKETS`)."""
    lengths = lengths if lengths is not None else [None] * len(scores)
    pairs = correct = score_ties = 0
    margin_sum = better_sum = worse_sum = 0.0
    by_length = {"shorter": [0, 0], "longer": [0, 0], "equal": [0, 0]}  # [correct, pairs]
    buckets = [[0, 0, 0.0] for _ in MARGIN_BUCKETS]  # [correct, pairs, sum of sigmoid(|margin|)]
    offset = 0
    for record in records:
        ranks = [c["rank"] for c in record["completions"]]
        for i, j in iter_pairs(ranks):
            better, worse = scores[offset + i], scores[offset + j]
            right = int(better > worse)
            pairs += 1
            correct += right
            score_ties += better == worse
            margin_sum += better - worse
            better_sum += better
            worse_sum += worse
            length_b, length_w = lengths[offset + i], lengths[offset + j]
            if length_b is not None and length_w is not None:
                kind = "shorter" if length_b < length_w else "longer" if length_b > length_w else "equal"
                by_length[kind][0] += right
                by_length[kind][1] += 1
            bucket = buckets[margin_bucket(better - worse)]
            bucket[0] += right
            bucket[1] += 1
            bucket[2] += 1 / (1 + math.exp(-abs(better - worse)))
        offset += len(ranks)

    def mean(total: float) -> float:
        return total / pairs if pairs else float("nan")

    known = [(s, n) for s, n in zip(scores, lengths) if n is not None]
    return {
        "records": len(records),
        "pairs": pairs,
        "correct": correct,
        "score_ties": score_ties,
        "accuracy": mean(correct),
        "margin": mean(margin_sum),
        "rewards_better_mean": mean(better_sum),
        "rewards_worse_mean": mean(worse_sum),
        "length_pearson": pearson([s for s, _ in known], [float(n) for _, n in known]),
        "shorter_better": _rate(*by_length["shorter"]),
        "longer_better": _rate(*by_length["longer"]),
        "equal_length_pairs": by_length["equal"][1],
        "margin_buckets": [
            {
                "bucket": _bucket_label(k),
                "low": MARGIN_BUCKETS[k],
                "high": MARGIN_BUCKETS[k + 1] if k + 1 < len(MARGIN_BUCKETS) else None,
                **_rate(c, n),
                "bt_expected": total / n if n else float("nan"),
            }
            for k, (c, n, total) in enumerate(buckets)
        ],
    }


DISAGREEMENT_QUANTILES = 4
"""`ensemble_metrics` splits a set's pairs into this many groups by the heads' disagreement (quartiles)."""


def ensemble_metrics(records: Sequence[Mapping[str, Any]], heads: torch.Tensor) -> dict[str, Any]:
    """An ensemble's set metrics from its heads' scores `(C, K)` (the set's completions, record by record): each
    head's accuracy, and the aggregate's (the mean of the heads) accuracy per quantile of disagreement, a pair's
    disagreement being the std over heads (population) of its margin, lowest quantile first (the pairs sorted by
    disagreement and cut into equal counts, ties in order)."""
    pairs, offset = [], 0
    for record in records:
        ranks = [c["rank"] for c in record["completions"]]
        pairs += [(offset + i, offset + j) for i, j in iter_pairs(ranks)]
        offset += len(ranks)
    if not pairs:
        return {"heads": [float("nan")] * heads.shape[1], "disagreement": []}
    better, worse = (torch.tensor(side) for side in zip(*pairs))
    margins = heads[better] - heads[worse]  # (P, K)
    right = margins.mean(dim=1) > 0
    spread = margins.std(dim=1, unbiased=False)
    order = torch.argsort(spread, stable=True)
    quantiles = []
    for q in range(DISAGREEMENT_QUANTILES):
        chosen = order[q * len(order) // DISAGREEMENT_QUANTILES : (q + 1) * len(order) // DISAGREEMENT_QUANTILES]
        if len(chosen):
            quantiles.append({"quantile": q + 1, "low": spread[chosen].min().item(), "high": spread[chosen].max().item(),
                              **_rate(int(right[chosen].sum()), len(chosen))})  # fmt: skip
    return {"heads": (margins > 0).double().mean(dim=0).tolist(), "disagreement": quantiles}


def scorer_for(
    datasets: Mapping[str, Any], model_or_scorer: Any, scorer_kwargs: Mapping[str, Any], one_reward: bool = True
) -> Any:
    """The evaluation functions' shared start: refuse an empty `datasets`, load a path or Hub id (`one_reward=False`:
    a regression model's attributes are read one by one, no weights needed), and refuse loading options given with an
    already-built scorer."""
    if not datasets:
        raise ValueError("no data set to evaluate; pass {name: records}")
    if isinstance(model_or_scorer, str | os.PathLike):
        return load_reward_scorer(model_or_scorer, one_reward=one_reward, **scorer_kwargs)
    if scorer_kwargs:
        raise ValueError(f"{sorted(scorer_kwargs)} only apply when model_or_scorer is a path or Hub id")
    return model_or_scorer


def evaluate_reward_model(
    model_or_scorer: Any,
    datasets: Mapping[str, Sequence[Mapping[str, Any]]],
    *,
    skipped: Mapping[str, int] | None = None,
    ties: Mapping[str, int] | None = None,
    progress: bool = True,
    **scorer_kwargs: Any,
) -> dict[str, Any]:
    """Score every record of every set and report pairwise accuracy, margin, length bias and calibration per set.

    Args:
        model_or_scorer: A `RewardScorer`; a model path or Hub id (loaded with `load_reward_scorer(**scorer_kwargs)`);
            or any object with `score(contexts, completions) -> sequence of floats` (and, for the length metrics,
            `encode` as `RewardScorer.encode`).
        datasets: Set name -> validated rank records (`load_rank_records` or `load_rewardbench2` output).
        skipped: Set name -> rows skipped as invalid while loading, copied into the results.
        ties: Set name -> rows dropped as ties while loading (e.g. PandaLM's no-majority rows), copied too.
        progress: Show a progress bar over scoring batches.
        **scorer_kwargs: `load_reward_scorer` options when `model_or_scorer` is a path.

    Returns:
        `{"sets": {name: {"records", "pairs", "correct", "score_ties", "accuracy", "margin", "rewards_better_mean",
        "rewards_worse_mean", "length_pearson", "shorter_better", "longer_better", "equal_length_pairs",
        "margin_buckets", "skipped", "ties"}}, "rewardbench": {section: {...}}}`, plus `"rewardbench2"` when the
        records are RewardBench 2 rows (`trl_rm_env.evaluation.rewardbench2.rewardbench2_scores`). Accuracy is correct / pairs
        (ties in score count as wrong); margin is the mean of `score(better) - score(worse)` over pairs. Sets without
        pairs have NaN accuracy and margin. See `evaluate_with_scores` for the per-completion scores too.

    Raises:
        ValueError: no set given, or a scorer that returns the wrong number of scores.
    """
    return evaluate_with_scores(
        model_or_scorer, datasets, skipped=skipped, ties=ties, progress=progress, **scorer_kwargs
    )[0]


def evaluate_with_scores(
    model_or_scorer: Any,
    datasets: Mapping[str, Sequence[Mapping[str, Any]]],
    *,
    skipped: Mapping[str, int] | None = None,
    ties: Mapping[str, int] | None = None,
    progress: bool = True,
    **scorer_kwargs: Any,
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """`evaluate_reward_model`, and one row per scored completion, in input order: `{"set", "record" (its index in
    the set), "id" (the record's `id`, else its index), "completion" (index in the record), "rank", "score",
    "tokens" (completion tokens as scored; None if not known)}` (what `eval --scores` writes)."""
    scorer = scorer_for(datasets, model_or_scorer, scorer_kwargs)
    # One flat list of (context, completion) over all sets: one scoring call, globally length-sorted batches.
    contexts, completions = [], []
    for records in datasets.values():
        for record in records:
            for item in record["completions"]:
                contexts.append(record["context"])
                completions.append(item["completion"])
    per_head = None
    heads = getattr(getattr(scorer, "head", None), "ensemble", 1)  # `heads.RewardHead`: K for an ensemble's mean
    if heads > 1:  # an ensemble's heads from the one forward; the reward: their mean
        per_head = scorer.attribute_outputs(contexts, completions, progress)[:, :heads].double()
        scores = per_head.mean(dim=1).tolist()
    else:
        scores = score_all(scorer, contexts, completions, progress)
    lengths = _token_counts(scorer, contexts, completions)
    results: dict[str, Any] = {"sets": {}}
    rows: list[dict[str, Any]] = []
    by_set: dict[str, list[float]] = {}
    offset = 0
    for name, records in datasets.items():
        count = sum(len(r["completions"]) for r in records)
        by_set[name] = scores[offset : offset + count]
        metrics = _set_metrics(records, by_set[name], lengths[offset : offset + count])
        if per_head is not None:
            metrics["ensemble"] = ensemble_metrics(records, per_head[offset : offset + count])
        listwise = listwise_metrics(records, by_set[name])
        if listwise is not None:  # records with 3+ completions: Kendall's tau-b and top-1 accuracy
            metrics["n_way"] = listwise
        metrics["skipped"] = int((skipped or {}).get(name, 0))
        metrics["ties"] = int((ties or {}).get(name, 0))
        results["sets"][name] = metrics
        for r, record in enumerate(records):
            for k, item in enumerate(record["completions"]):
                rows.append(
                    {
                        "set": name,
                        "record": r,
                        "id": record.get("id", r),
                        "completion": k,
                        "rank": item["rank"],
                        "score": scores[offset],
                        "tokens": lengths[offset],
                    }
                )
                offset += 1
    accuracies = {name: m["accuracy"] for name, m in results["sets"].items() if m["pairs"]}
    results["rewardbench"] = rewardbench_sections(accuracies)
    if any("subset" in r and "num_correct" in r for records in datasets.values() for r in records):
        results["rewardbench2"] = rewardbench2_scores(datasets, by_set)
    return results, rows


def write_scores_file(path: str | os.PathLike, rows: Sequence[Mapping[str, Any]]) -> None:
    """Write `evaluate_with_scores` rows as JSON Lines, one scored completion a line, in input order."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(dict(row)) + "\n")
