"""Listwise metrics of a record with three or more ranked completions, for a reward model and a judge alike: how well
the order of their scores follows the human ranks.

- **Kendall's tau-b** between the scores and the human ranks (a lower rank is better, so the ranks are negated):
  `(C - D) / sqrt((P - T_h) (P - T_s))` over the record's `P = n (n - 1) / 2` pairs, `C` those the scores order as
  the ranks do, `D` those they order the other way, `T_h` the pairs tied in rank and `T_s` the pairs tied in score (a
  pair tied in both counts in both). It is `scipy.stats.kendalltau`'s default (tau-b), tie-aware on both sides. A
  record whose scores are all equal has no tau-b (0 / 0): it counts as 0 (the scores order nothing) and is counted
  in `constant`. A record with a score that is not a finite number (a judgement that failed) is left out and counted
  in `failed`.
- **Top-1 accuracy**: the completions with the highest score are all best-ranked ones (a tie for the top between a
  best and a worse completion is a miss).

A set's `kendall_tau` and `top1_accuracy` are the means over its records with three or more completions (`records`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

MIN_COMPLETIONS = 3
"""Records with at least this many completions get listwise metrics (two completions are one pair: accuracy)."""


def kendall_tau_b(ranks: Sequence[float], scores: Sequence[float]) -> float | None:
    """Kendall's tau-b between the human `ranks` (lower is better) and `scores` (higher is better); None when the
    scores (or the ranks) are all equal."""
    concordant = discordant = rank_ties = score_ties = 0
    n = len(ranks)
    for i in range(n):
        for j in range(i + 1, n):
            by_rank = ranks[j] - ranks[i]  # > 0: i ranked better
            by_score = scores[i] - scores[j]  # > 0: i scored higher
            rank_ties += by_rank == 0
            score_ties += by_score == 0
            if by_rank and by_score:
                if (by_rank > 0) == (by_score > 0):
                    concordant += 1
                else:
                    discordant += 1
    pairs = n * (n - 1) // 2
    denominator = (pairs - rank_ties) * (pairs - score_ties)
    return (concordant - discordant) / math.sqrt(denominator) if denominator else None


def top1_correct(ranks: Sequence[float], scores: Sequence[float]) -> bool:
    """Whether every completion with the highest score is a best-ranked one."""
    best_rank, top = min(ranks), max(scores)
    return all(rank == best_rank for rank, score in zip(ranks, scores) if score == top)


def listwise_metrics(records: Sequence[Mapping[str, Any]], scores: Sequence[float | None]) -> dict[str, Any] | None:
    """`{"records", "kendall_tau", "top1_accuracy", "constant", "failed"}` of a set whose completions got `scores`
    (record by record, as `_set_metrics` reads them); None when no record has `MIN_COMPLETIONS` completions."""
    taus, tops, constant, failed, offset = [], [], 0, 0, 0
    for record in records:
        n = len(record["completions"])
        mine, offset = scores[offset : offset + n], offset + n
        if n < MIN_COMPLETIONS:
            continue
        if any(s is None or not math.isfinite(s) for s in mine):
            failed += 1
            continue
        ranks = [c["rank"] for c in record["completions"]]
        tau = kendall_tau_b(ranks, mine)  # type: ignore[arg-type]
        constant += tau is None
        taus.append(0.0 if tau is None else tau)
        tops.append(top1_correct(ranks, mine))  # type: ignore[arg-type]
    if not taus and not failed:
        return None
    return {
        "records": len(taus),
        "kendall_tau": sum(taus) / len(taus) if taus else float("nan"),
        "top1_accuracy": sum(tops) / len(tops) if tops else float("nan"),
        "constant": constant,
        "failed": failed,
    }


def judge_listwise(
    judge: Callable[..., Any], datasets: Mapping[str, Sequence[Mapping[str, Any]]]
) -> dict[str, dict[str, Any]]:
    """Listwise metrics of a judge (a `JudgeEnvironment`): each record with `MIN_COMPLETIONS` or more completions is
    one GRPO group, judged as GRPO judges a group (its rewards are the scores); records with equal contexts, or with
    different numbers of completions, go to different calls (a group is the samples with equal prompts). Sets
    without such records are left out."""
    out: dict[str, dict[str, Any]] = {}
    for name, records in datasets.items():
        chosen = [r for r in records if len(r["completions"]) >= MIN_COMPLETIONS]
        if not chosen:
            continue
        rewards: list[list[float | None]] = [[] for _ in chosen]
        rounds = []
        for size in sorted({len(r["completions"]) for r in chosen}):  # one group size per call
            same = [k for k, r in enumerate(chosen) if len(r["completions"]) == size]
            rounds += [[same[k] for k in round_] for round_ in rounds_by_context([chosen[k]["context"] for k in same])]
        for round_ in rounds:
            prompts, completions, owners = [], [], []
            for k in round_:
                for item in chosen[k]["completions"]:
                    prompts.append(chosen[k]["context"])
                    completions.append(item["completion"])
                    owners.append(k)
            values = judge(prompts=prompts, completions=completions)
            for k, value in zip(owners, values):
                rewards[k].append(value)
        found = listwise_metrics(chosen, [v for values in rewards for v in values])
        if found is not None:
            out[name] = found
    return out


def rounds_by_context(contexts: Sequence[Any]) -> list[list[int]]:
    """Positions of `contexts` in rounds that hold each context at most once: each item of a round is a GRPO group
    of its own (a group is the samples with equal prompts)."""
    rounds: list[list[int]] = []
    seen: dict[str, int] = {}
    for k, context in enumerate(contexts):
        key = json.dumps(context, sort_keys=True, default=str)
        count = seen[key] = seen.get(key, -1) + 1
        if count == len(rounds):
            rounds.append([])
        rounds[count].append(k)
    return rounds


def format_listwise_table(sources: Mapping[str, Mapping[str, Any]]) -> str:
    """One row per source and set with listwise metrics: records, Kendall's tau-b, top-1 accuracy; "" when none."""
    rows = [
        (source, name, m["n_way"])
        for source, results in sources.items()
        for name, m in results["sets"].items()
        if m.get("n_way")
    ]
    if not rows:
        return ""
    width = max(len("source / set"), *(len(f"{s} / {n}") for s, n, _ in rows))
    header = f"{'source / set':<{width}}  {'records':>7}  {'Kendall tau':>11}  {'top-1':>7}  {'constant':>8}  {'failed':>6}"
    lines = ["Listwise (records with 3+ completions)", header, "-" * len(header)]
    for source, name, m in rows:
        tau = "n/a" if m["kendall_tau"] != m["kendall_tau"] else f"{m['kendall_tau']:.4f}"
        top = "n/a" if m["top1_accuracy"] != m["top1_accuracy"] else f"{100 * m['top1_accuracy']:.2f}%"
        lines.append(
            f"{f'{source} / {name}':<{width}}  {m['records']:>7}  {tau:>11}  {top:>7}  {m['constant']:>8}  {m['failed']:>6}"
        )
    return "\n".join(lines)
