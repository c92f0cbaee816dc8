"""A generative judge, and a cascade of a reward model with a judge, on preference sets: what `trl-rm-env eval
--judge` reports beside the reward model's own evaluation (`preference.py`).

Every strictly ordered pair of every record (better `i`, worse `j`: lower rank) is judged as the judge would judge it
in GRPO:

- pointwise: each completion of a record is rated once; the pair goes to the better one when its rating is strictly
  higher (equal ratings are a tie, counted as such and as wrong, as equal RM scores are);
- pairwise: the pair is shown with the better answer first and, with `swap`, again with it second; the preference for
  the better one is the mean over the orders, `(p_ij + 1 - p_ji) / 2`, and it wins above 0.5 (0.5 exactly is a tie).
  Without `swap` the better answer is first in every other pair, so position bias cannot pass for accuracy.
  Position consistency (pairwise with `swap`) is the share of pairs whose winner survives the swap;
- listwise, and any mode registered later without its own rule: the pair is a GRPO group of two (the better answer
  first in every other pair), judged as GRPO judges a group, and it goes to the completion with the higher reward.

Each mode says how (`trl_rm_env.judges.mode_base.JudgeMode.judge_pairs`).

A pair without a verdict (unparseable, or over-length) is counted as such and as wrong. Costs are measured: judgements,
prompt tokens and seconds per 1,000 pairs, and the peak memory during each source's run (CUDA's peak allocation, or
the peak resident memory of this process and the engines it started; a model loaded for another source counts too).

The cascade (`evaluate_cascade`) is the `CascadeReward` that GRPO runs, with a margin rule: each pair is a GRPO group
of two, decided by the reward model where its margin `|s_i - s_j|` is at least `margin`, and by the judge, asked for
those pairs only, where it is smaller (the count of pairs sent is reported and equals the pairs asked).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from typing import Any

from ..data.schema import iter_pairs
from .listwise import format_listwise_table, judge_listwise, rounds_by_context
from .memory import peak_mb, reset_peak_memory
from .rewardbench import rewardbench_sections
from .rewardbench2 import rewardbench2_scores


def pairs_of_sets(datasets: Mapping[str, Sequence[Mapping[str, Any]]]) -> list[tuple[str, int, int, int]]:
    """Every strictly ordered pair, `(set, record index, better completion, worse completion)`, set by set."""
    return [
        (name, r, i, j)
        for name, records in datasets.items()
        for r, record in enumerate(records)
        for i, j in iter_pairs([c["rank"] for c in record["completions"]])
    ]


def tied_pairs_of_sets(datasets: Mapping[str, Sequence[Mapping[str, Any]]]) -> list[tuple[str, int, int, int]]:
    """Every pair of equally ranked completions of a record, `(set, record index, i, j)`, `i < j`, set by set."""
    return [
        (name, r, i, j)
        for name, records in datasets.items()
        for r, record in enumerate(records)
        for i in range(len(record["completions"]))
        for j in range(i + 1, len(record["completions"]))
        if record["completions"][i]["rank"] == record["completions"][j]["rank"]
    ]


def eval_pairs(
    datasets: Mapping[str, Sequence[Mapping[str, Any]]], pairs: Sequence[tuple[str, int, int, int]]
) -> list[Any]:
    """`pairs` as the `EvalPair`s a judge's mode judges (`i` as `better`, `j` as `worse`; `index`: the position in
    `pairs`, which decides the order a mode that shows one order uses: better first at even ones)."""
    from ..judges.mode_base import EvalPair

    asked = []
    for n, (name, r, i, j) in enumerate(pairs):
        record = datasets[name][r]
        asked.append(
            EvalPair(
                context=record["context"],
                better=record["completions"][i]["completion"],
                worse=record["completions"][j]["completion"],
                better_key=(name, r, i),
                worse_key=(name, r, j),
                index=n,
            )
        )
    return asked


def tie_metrics(judge: Any, datasets: Mapping[str, Sequence[Mapping[str, Any]]], sets: dict[str, dict]) -> None:
    """Accuracy with ties, for a judge whose mode has a tie verdict (`JudgeMode.judge_ties`, the GenRM's): each set's
    `tie_pairs` (equally ranked pairs), `ties_correct` (those the judge calls a tie) and `accuracy_with_ties`
    (`(correct + ties_correct) / (pairs + tie_pairs)`), added to `sets`. Ties the loader dropped (a record whose
    completions all tie, HelpSteer3's `overall_preference == 0`) are not there to count."""
    tied = tied_pairs_of_sets(datasets)
    called = judge.judge_ties(eval_pairs(datasets, tied)) if tied and hasattr(judge, "judge_ties") else None
    if called is None:
        return
    for m in sets.values():
        m["tie_pairs"] = m["ties_correct"] = 0
    for (name, *_), tie in zip(tied, called):
        sets[name]["tie_pairs"] += 1
        sets[name]["ties_correct"] += bool(tie)
    for m in sets.values():
        total = m["pairs"] + m["tie_pairs"]
        m["accuracy_with_ties"] = (m["correct"] + m["ties_correct"]) / total if total else float("nan")


def judge_pair_verdicts(
    judge: Any, datasets: Mapping[str, Sequence[Mapping[str, Any]]], pairs: Sequence[tuple[str, int, int, int]]
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Judge `pairs` as the judge's mode judges a preference pair (`JudgeMode.judge_pairs`): one row per pair,
    `{"preference": for the better one (None: no verdict; the mode's `neutral` is a tie), "orders": its preference in
    each order shown (modes that show both)}`, and the cost (`judgements`, `tokens`, `seconds`, `rating_mass`,
    `unparsed`, `overlength`, and `ratings`: each completion rated alone, by `(set, record, completion)`)."""
    reset_peak_memory()
    start = time.perf_counter()
    asked = eval_pairs(datasets, pairs)
    verdicts = judge.judge_pairs(asked)
    found = verdicts.found
    rows = [
        {"preference": p, **({} if verdicts.orders is None else {"orders": verdicts.orders[n]})}
        for n, p in enumerate(verdicts.preferences)
    ]
    cost = {
        "judgements": int(found.counts["num_judgements"]),
        "tokens": found.tokens,
        "seconds": time.perf_counter() - start,
        "rating_mass": sum(found.masses) / len(found.masses) if found.masses else None,
        "unparsed": int(found.counts["num_unparsed"]),
        "overlength": int(found.counts["num_overlength"]),
        "ratings": verdicts.ratings,
    }
    return rows, cost


def _pick(preference: float | None, neutral: float) -> str | None:
    """`better`, `worse`, `tie`, or None (no verdict)."""
    if preference is None:
        return None
    return "better" if preference > neutral else "worse" if preference < neutral else "tie"


def verdict_metrics(
    pairs: Sequence[tuple[str, int, int, int]],
    picks: Sequence[str | None],
    orders: Sequence[Sequence[Any]] | None,
    neutral: float = 0.5,
) -> dict[str, dict[str, Any]]:
    """Per set: `pairs`, `correct`, `verdict_ties`, `no_verdict`, `accuracy` (ties and pairs without a verdict are
    wrong) and, given both orders of each pair (preferences for the better one, `neutral` a tie),
    `position_consistency`: the share of pairs with a verdict in both orders that pick the same one in both."""
    sets: dict[str, dict[str, Any]] = {}
    for n, ((name, *_), pick) in enumerate(zip(pairs, picks)):
        m = sets.setdefault(
            name, {"pairs": 0, "correct": 0, "verdict_ties": 0, "no_verdict": 0, "consistent": 0, "both": 0}
        )
        m["pairs"] += 1
        m["correct"] += pick == "better"
        m["verdict_ties"] += pick == "tie"
        m["no_verdict"] += pick is None
        if orders is not None and len(orders[n]) == 2 and None not in orders[n]:
            first, second = orders[n]  # preferences for the better one, shown first and shown second
            m["both"] += 1
            m["consistent"] += (first > neutral) == (second > neutral) and neutral not in (first, second)
    for m in sets.values():
        m["accuracy"] = m["correct"] / m["pairs"] if m["pairs"] else float("nan")
        both = m["both_orders"] = m.pop("both")  # pairs with a verdict in both orders
        consistent = m.pop("consistent")
        m["position_consistency"] = consistent / both if both else None
    return sets


def per_1k(cost: Mapping[str, Any], pairs: int) -> dict[str, Any]:
    """Seconds, judgements and tokens per 1,000 pairs."""
    scale = 1000 / pairs if pairs else float("nan")
    return {
        "seconds": cost["seconds"] * scale,
        "judgements": cost.get("judgements", 0) * scale if cost.get("judgements") is not None else None,
        "tokens": cost["tokens"] * scale if cost.get("tokens") is not None else None,
    }


def evaluate_judge(judge: Any, datasets: Mapping[str, Sequence[Mapping[str, Any]]]) -> tuple[dict[str, Any], list]:
    """A `JudgeEnvironment` on preference sets, each pair judged as its mode judges one (see the module docstring).

    Returns:
        `({"sets": {name: {"pairs", "correct", "verdict_ties", "no_verdict", "accuracy", "position_consistency"}},
        "rewardbench": {...}, "cost": {...}, "per_1k_pairs": {...}, "mode", "scoring"}, picks)`: `picks` is each
        pair's `better` / `worse` / `tie` / None, in `pairs_of_sets` order.
    """
    if judge.mode.failed_verdict(judge.options) is not None and hasattr(judge, "replace"):
        judge = judge.replace(failed_judgement="masked")  # a judgement that failed is no verdict here, not a neutral one
    pairs = pairs_of_sets(datasets)
    rows, cost = judge_pair_verdicts(judge, datasets, pairs)
    neutral = judge.mode.neutral
    picks = [_pick(row["preference"], neutral) for row in rows]
    orders = [row["orders"] for row in rows] if all("orders" in row for row in rows) and rows else None
    sets = verdict_metrics(pairs, picks, orders, neutral)
    tie_metrics(judge, datasets, sets)  # a GenRM: equally ranked pairs judged a tie or not
    for name, listwise in judge_listwise(judge, datasets).items():  # records with 3+ completions, as GRPO groups
        sets[name]["n_way"] = listwise
    ratings = cost.pop("ratings")
    cost["memory_mb"] = peak_mb()
    results = {
        "mode": judge.options.mode,
        "scoring": judge.options.scoring,
        "sets": sets,
        "rewardbench": rewardbench_sections({n: m["accuracy"] for n, m in sets.items() if m["pairs"]}),
        "cost": cost,
        "per_1k_pairs": per_1k(cost, len(pairs)),
    }
    rewardbench2 = [records for records in datasets.values() if any("num_correct" in r for r in records)]
    if rewardbench2 and ratings:  # best-of-N from each completion's own rating (no rating: below every other)
        by_set = {
            name: [
                ratings.get((name, r, k)) if ratings.get((name, r, k)) is not None else float("-inf")
                for r, record in enumerate(records)
                for k in range(len(record["completions"]))
            ]
            for name, records in datasets.items()
        }
        results["rewardbench2"] = rewardbench2_scores(datasets, by_set)
    return results, picks


def rm_picks(rows: Sequence[Mapping[str, Any]], datasets: Mapping[str, Sequence[Any]]) -> tuple[list, list[float]]:
    """A reward model's pick and margin for every pair (`pairs_of_sets` order) from `evaluate_with_scores` rows."""
    score = {(row["set"], row["record"], row["completion"]): row["score"] for row in rows}
    picks, margins = [], []
    for name, r, i, j in pairs_of_sets(datasets):
        margin = score[(name, r, i)] - score[(name, r, j)]
        margins.append(margin)
        picks.append(_pick(margin, 0.0))
    return picks, margins


def agreement(first: Sequence[str | None], second: Sequence[str | None]) -> dict[str, Any]:
    """How often two sources pick the same answer, over the pairs both decided (neither a tie nor without a verdict)."""
    both = [(a, b) for a, b in zip(first, second) if a in ("better", "worse") and b in ("better", "worse")]
    same = sum(a == b for a, b in both)
    return {"pairs": len(both), "same": same, "rate": same / len(both) if both else float("nan")}


def cascade_rounds(
    datasets: Mapping[str, Sequence[Mapping[str, Any]]], pairs: Sequence[tuple[str, int, int, int]]
) -> list[list[int]]:
    """The pairs (positions in `pairs`) in rounds that hold at most one pair per context: each pair of a round is a
    GRPO group of its own (a group is the samples with equal prompts)."""
    return rounds_by_context([datasets[name][r]["context"] for name, r, _, _ in pairs])


def evaluate_cascade(
    judge: Any,
    datasets: Mapping[str, Sequence[Mapping[str, Any]]],
    rm_rows: Sequence[Mapping[str, Any]],
    margin: float,
    rm_seconds: float,
    rm_tokens: int | None = None,
    rm_memory: float = 0.0,
) -> tuple[dict[str, Any], list]:
    """What `CascadeReward([reward model, judge], margin=margin)` gives each pair, run as GRPO runs it: each pair is a
    group of two (the better answer first at even positions), the reward model's scores (`rm_rows`, from
    `evaluate_with_scores`) stand where they separate the two by at least `margin`, and the judge rewards the
    others; the pair goes to the higher reward.

    Returns:
        Results shaped as `evaluate_judge`'s, plus `"margin"`, `"sent"` (pairs the judge rewarded) and `"share"`;
        and each pair's pick.
    """
    from ..rewards.cascade import CascadeReward

    pairs = pairs_of_sets(datasets)
    score = {(row["set"], row["record"], row["completion"]): row["score"] for row in rm_rows}

    def reward_model(prompts: Any, completions: Any, item: Sequence[tuple], **kwargs: Any) -> list[float]:
        return [score[key] for key in item]

    source = judge
    if hasattr(judge, "replace"):  # a pair without a verdict is undecided (None), as `evaluate_judge` counts it
        if judge.mode.failed_verdict(judge.options) is not None:  # a GenRM: a failed judgement is no comparison
            source = judge.replace(failed_judgement="masked")
        else:
            source = judge.replace(unparsed_reward=float("nan"))
        source.overlength_reward = float("nan")
    cascade = CascadeReward([reward_model, source], name="cascade", margin=margin)
    picks: list[str | None] = [None] * len(pairs)
    judged = {"judgements": 0.0, "tokens": 0, "seconds": 0.0}
    counts_tokens = bool(getattr(judge, "tokens", False))
    sent = 0
    for members in cascade_rounds(datasets, pairs):
        prompts, completions, items = [], [], []
        for n in members:
            name, r, i, j = pairs[n]
            shown = (i, j) if n % 2 == 0 else (j, i)
            for k, (prompt, completion) in zip(shown, _as_grpo_samples(datasets[name][r], shown, name, r)):
                prompts.append(prompt)
                completions.append(completion)
                items.append((name, r, k))
        logged: dict[str, float] = {}
        start = time.perf_counter()
        called = _run(cascade.call(prompts, completions, item=items, log_metric=logged.__setitem__))
        rewards, to_judge = called.rewards, called.calls[1]
        if to_judge:
            judged["seconds"] += time.perf_counter() - start
            judged["judgements"] += logged.get("judge_env/num_judgements", 0.0)
            if counts_tokens:
                judgements = called.sources[1].judgements
                judged["tokens"] += sum(len(j.prompt) for j in judgements if not j.overlength)
        sent += to_judge // 2
        for m, n in enumerate(members):
            first, second = rewards[2 * m], rewards[2 * m + 1]
            better, worse = (first, second) if n % 2 == 0 else (second, first)
            picks[n] = None if better is None or worse is None else _pick(better - worse, 0.0)
    sets = verdict_metrics(pairs, picks, None)
    tokens = judged["tokens"] + rm_tokens if counts_tokens and rm_tokens is not None else None
    total = {
        "judgements": int(judged["judgements"]),
        "tokens": tokens,  # the reward model's on every pair, and the judge's on the pairs sent
        "seconds": rm_seconds + judged["seconds"],
        "memory_mb": max(rm_memory, peak_mb()),
    }
    results = {
        "margin": margin,
        "sent": sent,
        "share": sent / len(pairs) if pairs else float("nan"),
        "sets": sets,
        "rewardbench": rewardbench_sections({n: m["accuracy"] for n, m in sets.items() if m["pairs"]}),
        "cost": total,
        "per_1k_pairs": per_1k(total, len(pairs)),
    }
    return results, picks


def _as_grpo_samples(
    record: Mapping[str, Any], shown: Sequence[int], name: str, r: int
) -> list[tuple[Any, Any]]:
    """`(prompt, completion)` of the completions `shown` of a record, as a GRPO reward function takes them: the
    record's context, or, for a record without one whose completions are whole conversations, their shared turns
    before the last assistant turn(s).

    Raises:
        ValueError: a record without a context whose conversations differ before their last turn (no GRPO prompt).
    """
    completions = [record["completions"][k]["completion"] for k in shown]
    if record["context"] or not all(isinstance(c, list) for c in completions):
        return [(record["context"], c) for c in completions]
    from ..scoring.scorer import split_conversation

    folded = [split_conversation(c) for c in completions]
    if any(context != folded[0][0] for context, _ in folded):
        raise ValueError(
            f"eval --cascade: set {name!r}, record {r} has no context and its completions differ before their last "
            "assistant turn: the cascade runs GRPO's reward functions, which take one prompt per group"
        )
    return folded


def _run(result: Any) -> Any:
    return asyncio.run(result) if asyncio.iscoroutine(result) else result


def _cell(value: Any, fmt: str = "{:.1f}") -> str:
    if value is None or value != value:
        return "-"
    return fmt.format(value)


def format_comparison_table(sources: Mapping[str, Mapping[str, Any]], agreements: Mapping[str, Any]) -> str:
    """One row per source (`reward model`, `judge`, `cascade`): accuracy per set, position consistency, the share of
    pairs the judge was asked, and the cost per 1,000 pairs; then the agreement between sources."""
    names = list(dict.fromkeys(name for results in sources.values() for name in results["sets"]))
    header = ["source", *names, "pos. consistency", "no verdict", "verdict mass", "judged", "s / 1k pairs",
              "judgements / 1k", "tokens / 1k", "peak MB"]  # fmt: skip
    rows = []
    for source, results in sources.items():
        sets = results["sets"]
        both = [
            (m["position_consistency"], m["both_orders"])
            for m in sets.values()
            if m.get("position_consistency") is not None
        ]
        overall = sum(c * n for c, n in both) / sum(n for _, n in both) if both and sum(n for _, n in both) else None
        judged = results.get("share", 1.0 if source.startswith("judge") else None)
        per = results["per_1k_pairs"]
        pairs = sum(m["pairs"] for m in sets.values())
        judged_sets = all("no_verdict" in m for m in sets.values()) and pairs
        no_verdict = sum(m["no_verdict"] for m in sets.values()) / pairs if judged_sets else None
        rows.append([
            source,
            *(_cell(100 * sets[n]["accuracy"], "{:.2f}%") if n in sets else "-" for n in names),
            _cell(None if overall is None else 100 * overall, "{:.1f}%"),
            _cell(None if no_verdict is None else 100 * no_verdict, "{:.1f}%"),
            _cell(results["cost"].get("rating_mass"), "{:.3f}"),
            _cell(None if judged is None else 100 * judged, "{:.0f}%"),
            _cell(per["seconds"]), _cell(per.get("judgements"), "{:.0f}"), _cell(per.get("tokens"), "{:.0f}"),
            _cell(results["cost"].get("memory_mb"), "{:.0f}"),
        ])  # fmt: skip
    widths = [max(len(str(x)) for x in column) for column in zip(header, *rows)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths)), "  ".join("-" * w for w in widths)]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths)) for row in rows]
    listwise = format_listwise_table(sources)
    if listwise:
        lines += ["", listwise]
    for source, results in sources.items():
        score = (results.get("rewardbench") or {}).get("Score")
        if score is not None:
            lines.append(f"RewardBench v1 score, {source}: {_cell(100 * score['score'], '{:.2f}%')}")
        for name, m in results["sets"].items():
            if m.get("tie_pairs"):
                lines.append(f"accuracy with ties, {source}, {name}: {_cell(100 * m['accuracy_with_ties'], '{:.2f}%')} "
                             f"({m['ties_correct']} of {m['tie_pairs']} tied pairs judged a tie)")  # fmt: skip
        rb2 = (results.get("rewardbench2") or {}).get("Score")
        if rb2 is not None:
            lines.append(f"RewardBench 2 score, {source}: {_cell(100 * rb2['score'], '{:.2f}%')}")
    for pair, agreed in agreements.items():
        lines.append(
            f"agreement, {pair}: {_cell(100 * agreed['rate'], '{:.1f}%')} of the {agreed['pairs']} pairs both decided"
        )
    return "\n".join(lines)


def rm_cost(scorer: Any, datasets: Mapping[str, Sequence[Mapping[str, Any]]], seconds: float) -> dict[str, Any]:
    """A reward model's cost on `datasets`, scored in `seconds`: its tokens (every completion's sequence as scored;
    None for a scorer that does not encode here) and the resident memory now."""
    tokens = None
    if hasattr(scorer, "encode"):
        contexts = [r["context"] for records in datasets.values() for r in records for _ in r["completions"]]
        completions = [c["completion"] for records in datasets.values() for r in records for c in r["completions"]]
        tokens = sum(len(ids) for ids in scorer.encode(contexts, completions).ids if ids is not None)
    return {"judgements": None, "tokens": tokens, "seconds": seconds, "memory_mb": peak_mb()}
