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

When set names are RewardBench v1 subsets (`llmbar-natural`, `mt-bench-hard`, `xstest-should-refuse`, ...), the
section scores (Chat, Chat Hard, Safety, Reasoning) are computed as RewardBench does: each section is the mean of its
subsets' accuracies weighted by RewardBench's own example counts (`REWARDBENCH_EXAMPLE_COUNTS`), over the subsets
present. The overall score is the mean of the four sections, reported only when all four are present. The prior
sets (Anthropic HH, SHP, ...) are not part of v1's score ("without prior").

Every set also gets its length bias (Pearson r of score and completion tokens; accuracy on pairs whose better answer
is the shorter / the longer one) and its calibration (accuracy per |margin| bucket, `MARGIN_BUCKETS`, beside the
Bradley-Terry expectation). RewardBench 2 rows (`trl_rm_env.rewardbench2.load_rewardbench2`) add its subset scores.
`evaluate_with_scores` also returns one row per scored completion (`eval --scores`; `trl_rm_env.report` plots them).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from trl_rm_env.data.schema import iter_pairs
from trl_rm_env.scoring.scorer import RewardScorer

# --- RewardBench v1 (allenai/reward-bench, rewardbench/constants.py) ---

REWARDBENCH_SUBSET_MAPPING: dict[str, list[str]] = {
    "Chat": ["alpacaeval-easy", "alpacaeval-length", "alpacaeval-hard", "mt-bench-easy", "mt-bench-med"],
    "Chat Hard": [
        "mt-bench-hard",
        "llmbar-natural",
        "llmbar-adver-neighbor",
        "llmbar-adver-GPTInst",
        "llmbar-adver-GPTOut",
        "llmbar-adver-manual",
    ],
    "Safety": [
        "refusals-dangerous",
        "refusals-offensive",
        "xstest-should-refuse",
        "xstest-should-respond",
        "donotanswer",
    ],
    "Reasoning": ["math-prm", "hep-cpp", "hep-go", "hep-java", "hep-js", "hep-python", "hep-rust"],
}
"""RewardBench v1 sections and their subsets."""

REWARDBENCH_EXAMPLE_COUNTS: dict[str, int] = {
    "alpacaeval-easy": 100,
    "alpacaeval-length": 95,
    "alpacaeval-hard": 95,
    "mt-bench-easy": 28,
    "mt-bench-med": 40,
    "mt-bench-hard": 37,
    "math-prm": 984,  # 447 prompts, upweighted by RewardBench to weigh as much as the code subsets together
    "refusals-dangerous": 100,
    "refusals-offensive": 100,
    "llmbar-natural": 100,
    "llmbar-adver-neighbor": 134,
    "llmbar-adver-GPTInst": 92,
    "llmbar-adver-GPTOut": 47,
    "llmbar-adver-manual": 46,
    "xstest-should-refuse": 250,
    "xstest-should-respond": 154,
    "donotanswer": 136,
    "hep-cpp": 164,
    "hep-go": 164,
    "hep-java": 164,
    "hep-js": 164,
    "hep-python": 164,
    "hep-rust": 164,
}
"""The weights RewardBench v1 gives each subset inside its section (its `EXAMPLE_COUNTS`, copied as published)."""

LLMBAR_FILE_SUBSETS: dict[str, str] = {
    "natural": "llmbar-natural",
    "adversarial-neighbor": "llmbar-adver-neighbor",
    "adversarial-gptinst": "llmbar-adver-GPTInst",
    "adversarial-gptout": "llmbar-adver-GPTOut",
    "adversarial-manual": "llmbar-adver-manual",
}
"""LLMBar's file names (`Dataset/LLMBar/<Natural|Adversarial/...>`, lower-cased) -> their RewardBench subset."""

_SUBSET_BY_LOWER = {name.lower(): name for name in REWARDBENCH_EXAMPLE_COUNTS}


def rewardbench_subset(name: str) -> str | None:
    """The RewardBench v1 subset a set name refers to (case-insensitive), or None."""
    return _SUBSET_BY_LOWER.get(name.lower())


def rewardbench_sections(accuracies: Mapping[str, float]) -> dict[str, dict[str, Any]]:
    """RewardBench v1 section scores from per-subset accuracies, weighted as RewardBench weights them.

    A section's score is `sum(acc[s] * EXAMPLE_COUNTS[s]) / sum(EXAMPLE_COUNTS[s])` over its subsets that are present
    (RewardBench's `calculate_scores_per_section`). Sections with no subset present are left out.

    Args:
        accuracies: Set name -> accuracy in [0, 1]. Names are matched to subsets case-insensitively; other names are
            ignored.

    Returns:
        `{section: {"score": float in [0, 1], "subsets": [present subsets], "missing": [absent subsets]}}`, plus
        `"Score"` (`{"score": mean of the four sections}`) when all four sections are present.
    """
    present = {}
    for name, accuracy in accuracies.items():
        subset = rewardbench_subset(name)
        if subset is not None:
            present[subset] = accuracy
    sections: dict[str, dict[str, Any]] = {}
    for section, subsets in REWARDBENCH_SUBSET_MAPPING.items():
        found = [s for s in subsets if s in present]
        if not found:
            continue
        weight = sum(REWARDBENCH_EXAMPLE_COUNTS[s] for s in found)
        score = sum(present[s] * REWARDBENCH_EXAMPLE_COUNTS[s] for s in found) / weight
        sections[section] = {"score": score, "subsets": found, "missing": [s for s in subsets if s not in present]}
    if len(sections) == len(REWARDBENCH_SUBSET_MAPPING):
        sections["Score"] = {"score": sum(v["score"] for v in sections.values()) / len(REWARDBENCH_SUBSET_MAPPING)}
    return sections


# --- scoring ---


def load_reward_scorer(
    model: str | os.PathLike,
    *,
    batch_size: int | None = None,
    max_tokens_per_batch: int | None = None,
    max_length: int | None = None,
    precision: str = "fp32",
    device: str | None = None,
    trust_remote_code: bool = False,
    show_progress: bool | None = None,
    output_weights: Sequence[float] | None = None,
) -> RewardScorer:
    """Load a `*ForSequenceClassification` checkpoint (path or Hub id) and its tokenizer into a `RewardScorer`.

    Args:
        model: Local folder or Hub id of the reward model.
        batch_size: Sequences per forward pass (RewardScorer's default 32 when no token budget is given).
        max_tokens_per_batch: Token budget per forward pass, padding included.
        max_length: Longest sequence scored; longer ones lose context from the left.
        precision: "fp32", "bf16" or "fp16". Scores are returned in fp32 whatever the precision.
        device: "cpu", "cuda", "cuda:1", ... Default: CUDA when available, else CPU.
        trust_remote_code: Allow custom model code from the Hub.
        show_progress: Progress bar over batches (None: only for more than 8 batches).
        output_weights: For a regression RM: the score is `outputs @ output_weights` (see
            `regression_reward_weights`); None scores output column 0.

    Raises:
        ValueError: an unknown precision.
    """
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
    if precision not in dtypes:
        raise ValueError(f"precision must be one of {sorted(dtypes)}, got {precision!r}")
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    rm = AutoModelForSequenceClassification.from_pretrained(
        str(model), dtype=dtypes[precision], trust_remote_code=trust_remote_code
    )
    tokenizer = AutoTokenizer.from_pretrained(str(model), trust_remote_code=trust_remote_code)
    rm.requires_grad_(False)
    rm.eval().to(device)
    return RewardScorer(
        rm,
        tokenizer,
        batch_size=batch_size,
        max_tokens_per_batch=max_tokens_per_batch,
        max_length=max_length,
        show_progress=show_progress,
        output_weights=output_weights,
    )


def _score_all(scorer: Any, contexts: list[Any], completions: list[Any], progress: bool) -> list[float]:
    if isinstance(scorer, RewardScorer):
        scores = scorer.score(contexts, completions, progress=progress)
    else:  # any object with score(contexts, completions) -> sequence of floats
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


def _scorer_for(
    datasets: Mapping[str, Any], model_or_scorer: RewardScorer | str | os.PathLike, scorer_kwargs: Mapping[str, Any]
) -> RewardScorer:
    """The evaluation functions' shared start: refuse an empty `datasets`, load a path or Hub id, and refuse loading
    options given with an already-built scorer."""
    if not datasets:
        raise ValueError("no data set to evaluate; pass {name: records}")
    if isinstance(model_or_scorer, str | os.PathLike):
        return load_reward_scorer(model_or_scorer, **scorer_kwargs)
    if scorer_kwargs:
        raise ValueError(f"{sorted(scorer_kwargs)} only apply when model_or_scorer is a path or Hub id")
    return model_or_scorer


def evaluate_reward_model(
    model_or_scorer: RewardScorer | str | os.PathLike | Any,
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
        records are RewardBench 2 rows (`trl_rm_env.rewardbench2.rewardbench2_scores`). Accuracy is correct / pairs
        (ties in score count as wrong); margin is the mean of `score(better) - score(worse)` over pairs. Sets without
        pairs have NaN accuracy and margin. See `evaluate_with_scores` for the per-completion scores too.

    Raises:
        ValueError: no set given, or a scorer that returns the wrong number of scores.
    """
    return evaluate_with_scores(
        model_or_scorer, datasets, skipped=skipped, ties=ties, progress=progress, **scorer_kwargs
    )[0]


def evaluate_with_scores(
    model_or_scorer: RewardScorer | str | os.PathLike | Any,
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
    scorer = _scorer_for(datasets, model_or_scorer, scorer_kwargs)
    # One flat list of (context, completion) over all sets: one scoring call, globally length-sorted batches.
    contexts, completions = [], []
    for records in datasets.values():
        for record in records:
            for item in record["completions"]:
                contexts.append(record["context"])
                completions.append(item["completion"])
    scores = _score_all(scorer, contexts, completions, progress)
    lengths = _token_counts(scorer, contexts, completions)
    results: dict[str, Any] = {"sets": {}}
    rows: list[dict[str, Any]] = []
    by_set: dict[str, list[float]] = {}
    offset = 0
    for name, records in datasets.items():
        count = sum(len(r["completions"]) for r in records)
        by_set[name] = scores[offset : offset + count]
        metrics = _set_metrics(records, by_set[name], lengths[offset : offset + count])
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
        from trl_rm_env.rewardbench2 import rewardbench2_scores

        results["rewardbench2"] = rewardbench2_scores(datasets, by_set)
    return results, rows


def write_scores_file(path: str | os.PathLike, rows: Sequence[Mapping[str, Any]]) -> None:
    """Write `evaluate_with_scores` rows as JSON Lines, one scored completion a line, in input order."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(dict(row)) + "\n")


# --- the terminal table ---


def _percent(value: float) -> str:
    return "n/a" if value != value else f"{100 * value:.2f}%"  # NaN check without math


def format_results_table(results: Mapping[str, Any]) -> str:
    """`evaluate_reward_model` results as a plain-text table (accuracy in percent), then the RewardBench sections."""
    sets = results["sets"]
    width = max([len("set"), *(len(name) for name in sets)])
    header = (
        f"{'set':<{width}}  {'records':>7}  {'pairs':>6}  {'skipped':>7}  {'ties':>5}  {'accuracy':>8}  {'margin':>8}"
    )
    lines = [header, "-" * len(header)]
    for name, m in sets.items():
        margin = "n/a" if m["margin"] != m["margin"] else f"{m['margin']:.4f}"
        lines.append(
            f"{name:<{width}}  {m['records']:>7}  {m['pairs']:>6}  {m['skipped']:>7}  {m['ties']:>5}  "
            f"{_percent(m['accuracy']):>8}  {margin:>8}"
        )
    sections = results.get("rewardbench") or {}
    if sections:
        lines += ["", f"{'RewardBench v1 section':<22}  {'subsets':>7}  {'score':>8}", "-" * 41]
        for section, info in sections.items():
            if section == "Score":
                continue
            found = len(info["subsets"])
            total = found + len(info["missing"])
            lines.append(f"{section:<22}  {f'{found}/{total}':>7}  {_percent(info['score']):>8}")
        if "Score" in sections:
            lines.append(f"{'Score (mean of 4)':<22}  {'':>7}  {_percent(sections['Score']['score']):>8}")
        elif len(sections) < len(REWARDBENCH_SUBSET_MAPPING):
            lines.append("(overall Score needs all four sections)")
    if results.get("rewardbench2"):
        from trl_rm_env.rewardbench2 import format_rewardbench2_table

        lines += ["", format_rewardbench2_table(results["rewardbench2"])]
    if all("margin_buckets" in m for m in sets.values()):  # results saved before these metrics existed have none
        lines += ["", format_bias_table(results)]
    return "\n".join(lines)


def _rate_cell(rate: Mapping[str, Any]) -> str:
    return f"{_percent(rate['accuracy'])} ({rate['pairs']})"


def format_bias_table(results: Mapping[str, Any]) -> str:
    """Length bias (Pearson r of score and completion tokens; accuracy when the better answer is shorter / longer,
    pairs in brackets) and accuracy by |margin| bucket, one row per set."""
    sets = results["sets"]
    width = max([len("set"), *(len(name) for name in sets)])
    head = f"{'set':<{width}}  {'r(score,len)':>12}  {'shorter better':>16}  {'longer better':>16}"
    lines = ["Length bias", head, "-" * len(head)]
    for name, m in sets.items():
        r = "n/a" if m["length_pearson"] != m["length_pearson"] else f"{m['length_pearson']:.4f}"
        lines.append(
            f"{name:<{width}}  {r:>12}  {_rate_cell(m['shorter_better']):>16}  {_rate_cell(m['longer_better']):>16}"
        )
    labels = [b["bucket"] for b in next(iter(sets.values()))["margin_buckets"]] if sets else []
    head = f"{'set':<{width}}  " + "  ".join(f"{label:>16}" for label in labels)
    lines += ["", "Accuracy by |margin| (pairs)", head, "-" * len(head)]
    for name, m in sets.items():
        lines.append(f"{name:<{width}}  " + "  ".join(f"{_rate_cell(b):>16}" for b in m["margin_buckets"]))
    return "\n".join(lines)


# --- regression reward models ---


def is_regression_model(config: Any) -> bool:
    """Whether a model config is a regression reward model (saved by `RegressionRewardTrainer`)."""
    from trl_rm_env.trainer.regression import REWARD_MODEL_TYPE

    return getattr(config, "reward_model_type", None) == REWARD_MODEL_TYPE


def evaluate_regression_model(
    model_or_scorer: RewardScorer | str | os.PathLike,
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
    from trl_rm_env.data.regression import attribute_matrix, attribute_names
    from trl_rm_env.trainer.regression import regression_statistics, summarize_regression_statistics

    scorer = _scorer_for(datasets, model_or_scorer, scorer_kwargs)
    config = scorer.model.config
    if not is_regression_model(config):
        raise ValueError(
            f"{config._name_or_path!r} is not a regression reward model (config.reward_model_type is "
            f"{getattr(config, 'reward_model_type', None)!r}); use evaluate_reward_model for preference data."
        )
    attributes = [config.id2label[i] for i in range(config.num_labels)]
    contexts = [r["context"] for records in datasets.values() for r in records]
    completions = [r["completion"] for records in datasets.values() for r in records]
    scorer.score(contexts, completions, progress=progress)
    outputs = scorer.last_outputs  # (N, K); NaN rows: not scored (over max_length with no fallback)
    if outputs is None:
        raise ValueError("the scorer kept no per-attribute outputs; build it with prefix_sharing=False")
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


def format_regression_results_table(results: Mapping[str, Any]) -> str:
    """`evaluate_regression_model` results as a plain-text table: one row per set and attribute."""
    sets, attributes = results["sets"], results["attributes"]
    header = ["set", "attribute", "count", "rmse", "mae", "pearson"]
    rows = []
    for name, m in sets.items():
        for attribute in attributes:
            values = [m[f"{attribute}_{metric}"] for metric in ("rmse", "mae", "pearson")]
            cells = ["n/a" if v != v else f"{v:.4f}" for v in values]
            rows.append([name, attribute, str(m[f"{attribute}_count"]), *cells])
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(c.rjust(w) if i > 1 else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))) for r in [header, *rows]]
    lines.insert(1, "  ".join("-" * w for w in widths))
    for name, m in sets.items():
        if m["skipped"] or m["unscored"]:
            lines.append(f"{name}: {m['skipped']} invalid row(s) skipped, {m['unscored']} record(s) not scored")
    if results.get("ignored_attributes"):
        lines.append(f"not predicted by the model, ignored: {', '.join(results['ignored_attributes'])}")
    return "\n".join(lines)
