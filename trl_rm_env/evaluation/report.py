"""`trl-rm-env eval --report DIR`: plots of what a reward model does, and one `report.md` that embeds them.

Needs matplotlib (`pip install trl-rm-env[report]`). Four PNG files and the Markdown page::

    accuracy.png            per-set pairwise accuracy (and RewardBench 2 subset scores, when present)
    score_histograms.png    scores of the best-ranked ("chosen") vs the other ("rejected") completions, per set
    margin_calibration.png  accuracy per |score margin| bucket, beside the Bradley-Terry expectation sigmoid(|m|)
    score_vs_length.png     score against completion tokens, per set, with Pearson r
    report.md               the tables of the JSON results (same numbers, same rounding as the terminal) and plots

    from trl_rm_env.evaluation import evaluate_with_scores
    from trl_rm_env.evaluation.report import write_report

    results, rows = evaluate_with_scores("outputs/rm", {"harder": records})
    write_report(results, rows, "report/")
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

PLOTS = ("accuracy.png", "score_histograms.png", "margin_calibration.png", "score_vs_length.png")
"""The PNG files `write_report` writes."""


def pyplot() -> Any:
    """matplotlib's pyplot on the Agg backend, or an `ImportError` naming the extra to install."""
    try:
        import matplotlib
    except ImportError:
        raise ImportError("eval --report needs matplotlib: pip install trl-rm-env[report]") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def percent(value: float | None) -> str:
    """`0.8125` -> `"81.25%"`; NaN or None -> `"n/a"` (the rounding the report and the terminal table use)."""
    return "n/a" if value is None or value != value else f"{100 * value:.2f}%"


def number(value: float | None, digits: int = 4) -> str:
    """A float to `digits` decimals; NaN or None -> `"n/a"`."""
    return "n/a" if value is None or value != value else f"{value:.{digits}f}"


def _by_set(rows: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, list]]:
    """Per set: chosen scores (the best rank of their record), rejected scores, and (score, tokens) points."""
    best: dict[tuple[str, int], int] = {}
    for row in rows:
        key = (row["set"], row["record"])
        best[key] = min(best.get(key, row["rank"]), row["rank"])
    out: dict[str, dict[str, list]] = {}
    for row in rows:
        data = out.setdefault(row["set"], {"chosen": [], "rejected": [], "points": []})
        data["chosen" if row["rank"] == best[(row["set"], row["record"])] else "rejected"].append(row["score"])
        if row["tokens"] is not None:
            data["points"].append((row["tokens"], row["score"]))
    return out


def _grid(plt: Any, count: int, title: str) -> tuple[Any, list[Any]]:
    cols = min(count, 3)
    rows = (count + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(3.6 * cols, 2.8 * rows), squeeze=False)
    fig.suptitle(title, fontsize=10)
    flat = [ax for line in axes for ax in line]
    for ax in flat[count:]:
        ax.axis("off")
    return fig, flat[:count]


def _save(fig: Any, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=72)
    fig.clf()


def write_report(
    results: Mapping[str, Any], rows: Sequence[Mapping[str, Any]], out_dir: str | os.PathLike
) -> list[Path]:
    """Write the four PNG plots and `report.md` into `out_dir` (created), and return their paths.

    Args:
        results: `evaluate_reward_model` / `evaluate_with_scores` results (with "model" when known).
        rows: The per-completion rows of `evaluate_with_scores`.
        out_dir: Folder for the files.

    Raises:
        ImportError: matplotlib is not installed (one line naming `pip install trl-rm-env[report]`).
    """
    plt = pyplot()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    sets = results["sets"]
    names = list(sets)
    data = _by_set(rows)

    fig, ax = plt.subplots(figsize=(max(4.0, 1.2 * len(names) + 2), 3.0))
    values = [sets[n]["accuracy"] if sets[n]["accuracy"] == sets[n]["accuracy"] else 0.0 for n in names]
    bars = ax.bar(names, values, color="#4C72B0")
    ax.bar_label(bars, labels=[percent(sets[n]["accuracy"]) for n in names], fontsize=7)
    ax.axhline(0.5, color="grey", lw=0.8, ls="--")
    ax.set_ylim(0, 1.1)
    ax.set_ylabel("pairwise accuracy")
    ax.set_title("Accuracy per set", fontsize=10)
    ax.tick_params(axis="x", labelrotation=20, labelsize=8)
    _save(fig, out / PLOTS[0])

    fig, axes = _grid(plt, len(names), "Scores: chosen (best rank) vs rejected")
    for ax, name in zip(axes, names):
        chosen, rejected = data.get(name, {}).get("chosen", []), data.get(name, {}).get("rejected", [])
        ax.hist([chosen, rejected], bins=20, label=["chosen", "rejected"], color=["#55A868", "#C44E52"], alpha=0.8)
        ax.set_title(name, fontsize=9)
        ax.set_xlabel("score", fontsize=8)
        ax.legend(fontsize=7)
    _save(fig, out / PLOTS[1])

    fig, ax = plt.subplots(figsize=(5.5, 3.2))
    for name in names:
        buckets = [(k, b) for k, b in enumerate(sets[name]["margin_buckets"]) if b["pairs"]]
        xs = [k for k, _ in buckets]
        (line,) = ax.plot(xs, [b["accuracy"] for _, b in buckets], marker="o", label=name)
        ax.plot(xs, [b["bt_expected"] for _, b in buckets], color=line.get_color(), ls="--")
    labels = [b["bucket"] for b in sets[names[0]]["margin_buckets"]]
    ax.set_xticks(range(len(labels)), labels, fontsize=8)
    ax.plot([], [], color="grey", ls="--", label="expected: mean sigmoid(|m|)")
    ax.set_ylim(0, 1.05)
    ax.set_xlabel("|score margin| bucket")
    ax.set_ylabel("accuracy")
    ax.set_title("Accuracy vs |margin|", fontsize=10)
    ax.legend(fontsize=7)
    _save(fig, out / PLOTS[2])

    fig, axes = _grid(plt, len(names), "Score vs completion length")
    for ax, name in zip(axes, names):
        points = data.get(name, {}).get("points", [])
        ax.scatter([p[0] for p in points], [p[1] for p in points], s=8, alpha=0.6)
        ax.set_title(f"{name} (r = {number(sets[name]['length_pearson'], 3)})", fontsize=9)
        ax.set_xlabel("completion tokens", fontsize=8)
        ax.set_ylabel("score", fontsize=8)
    _save(fig, out / PLOTS[3])
    plt.close("all")

    report = out / "report.md"
    report.write_text(format_report_markdown(results), encoding="utf-8")
    return [out / p for p in PLOTS] + [report]


def format_report_markdown(results: Mapping[str, Any]) -> str:
    """The `report.md` page: the results' tables (rounded as the terminal table) with the plots embedded."""
    sets = results["sets"]
    lines = ["# Reward model evaluation report", ""]
    if results.get("model"):
        lines += [f"Model: `{results['model']}`", ""]
    lines += [
        "## Accuracy per set",
        "",
        "| set | records | pairs | accuracy | margin |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, m in sets.items():
        lines.append(f"| {name} | {m['records']} | {m['pairs']} | {percent(m['accuracy'])} | {number(m['margin'])} |")
    lines += ["", f"![accuracy per set]({PLOTS[0]})", ""]
    rb2 = results.get("rewardbench2") or {}
    if rb2:
        lines += ["## RewardBench 2", "", "| subset | rows | score |", "|---|---:|---:|"]
        for subset, info in rb2.items():
            if subset != "Score":
                lines.append(f"| {subset} | {info['rows']} | {percent(info['score'])} |")
        if "Score" in rb2:
            lines.append(f"| **Score (mean of 6)** | | {percent(rb2['Score']['score'])} |")
        lines.append("")
    sections = {k: v for k, v in (results.get("rewardbench") or {}).items()}
    if sections:
        lines += ["## RewardBench v1 sections", "", "| section | score |", "|---|---:|"]
        lines += [f"| {section} | {percent(info['score'])} |" for section, info in sections.items()]
        lines.append("")
    lines += [
        "## Score distributions",
        "",
        "Chosen: each record's best-ranked completion(s); rejected: the others.",
        "",
        f"![chosen vs rejected scores]({PLOTS[1]})",
        "",
        "## Length bias",
        "",
        "Pearson r between score and completion tokens; accuracy on pairs where the better answer is the shorter "
        "one and where it is the longer one (pairs of equal length in neither). A model that mostly rewards length "
        "has r well above 0 and is much more accurate when the better answer is the longer one.",
        "",
        "| set | r(score, tokens) | shorter better: accuracy | pairs | longer better: accuracy | pairs |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, m in sets.items():
        s, lo = m["shorter_better"], m["longer_better"]
        lines.append(
            f"| {name} | {number(m['length_pearson'])} | {percent(s['accuracy'])} | {s['pairs']} | "
            f"{percent(lo['accuracy'])} | {lo['pairs']} |"
        )
    lines += ["", f"![score vs length]({PLOTS[3]})", "", "## Calibration: accuracy by |margin|", ""]
    lines += [
        "Pairs bucketed by |score(better) - score(worse)|. For a calibrated Bradley-Terry model, accuracy in a "
        "bucket is near the mean of sigmoid(|margin|) over its pairs (`expected`).",
        "",
        "| set | bucket | pairs | accuracy | expected |",
        "|---|---|---:|---:|---:|",
    ]
    for name, m in sets.items():
        for b in m["margin_buckets"]:
            lines.append(
                f"| {name} | {b['bucket']} | {b['pairs']} | {percent(b['accuracy'])} | {percent(b['bt_expected'])} |"
            )
    lines += ["", f"![accuracy vs margin]({PLOTS[2]})", ""]
    return "\n".join(lines)


COMPARISON_PLOT = "sources.png"


def write_comparison_figure(sources: Mapping[str, Mapping[str, Any]], out_dir: str | os.PathLike) -> Path:
    """`eval --judge --report`: one figure, accuracy per set for each source (reward model, judge, cascade) beside
    each source's seconds per 1,000 pairs; written to `out_dir/sources.png`.

    Raises:
        ImportError: matplotlib is not installed.
    """
    plt = pyplot()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    names = list(dict.fromkeys(n for results in sources.values() for n in results["sets"]))
    fig, (left, right) = plt.subplots(1, 2, figsize=(max(7.0, 1.6 * len(names) + 5), 3.4), width_ratios=[3, 1])
    width = 0.8 / max(len(sources), 1)
    for k, (source, results) in enumerate(sources.items()):
        values = [results["sets"].get(n, {}).get("accuracy", float("nan")) for n in names]
        xs = [i + (k - (len(sources) - 1) / 2) * width for i in range(len(names))]
        left.bar(xs, [v if v == v else 0.0 for v in values], width, label=source)
    left.axhline(0.5, color="grey", lw=0.8, ls="--")
    left.set_xticks(range(len(names)), names, rotation=20, fontsize=8)
    left.set_ylim(0, 1.1)
    left.set_ylabel("pairwise accuracy")
    left.set_title("Accuracy per set", fontsize=10)
    left.legend(fontsize=7)
    labels = list(sources)
    right.barh(labels, [results["per_1k_pairs"]["seconds"] for results in sources.values()], color="#8172B2")
    right.set_xlabel("seconds / 1k pairs", fontsize=8)
    right.tick_params(axis="y", labelsize=7)
    right.set_title("Cost", fontsize=10)
    path = out / COMPARISON_PLOT
    _save(fig, path)
    plt.close("all")
    return path
