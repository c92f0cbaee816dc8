"""Plain-text tables of evaluation results, as `trl-rm-env eval` prints them (the report rounds the same way), and
the results made strict JSON (`nan_to_none`)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from .listwise import format_listwise_table
from .rewardbench import REWARDBENCH_SUBSET_MAPPING
from .rewardbench2 import format_rewardbench2_table


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
        lines += ["", format_rewardbench2_table(results["rewardbench2"])]
    if all("margin_buckets" in m for m in sets.values()):  # results saved before these metrics existed have none
        lines += ["", format_bias_table(results)]
    listwise = format_listwise_table({"reward model": results})
    if listwise:
        lines += ["", listwise]
    if sets and all("ensemble" in m for m in sets.values()):
        lines += ["", format_ensemble_table(results)]
    return "\n".join(lines)


def format_ensemble_table(results: Mapping[str, Any]) -> str:
    """An ensemble checkpoint's heads: each head's accuracy beside the aggregate's (the mean of the heads), then the
    aggregate's accuracy by quartile of the heads' disagreement (pairs in brackets), one row per set."""
    sets = results["sets"]
    width = max([len("set"), *(len(name) for name in sets)])
    count = len(next(iter(sets.values()))["ensemble"]["heads"])
    head = f"{'set':<{width}}  {'mean':>8}  " + "  ".join(f"{f'head {k}':>8}" for k in range(count))
    lines = ["Ensemble heads (accuracy)", head, "-" * len(head)]
    for name, m in sets.items():
        lines.append(f"{name:<{width}}  {_percent(m['accuracy']):>8}  "
                     + "  ".join(f"{_percent(a):>8}" for a in m["ensemble"]["heads"]))  # fmt: skip
    head = f"{'set':<{width}}  " + "  ".join(f"{f'q{q + 1}':>16}" for q in range(4))
    lines += ["", "Accuracy by the heads' disagreement, lowest quartile first (pairs)", head, "-" * len(head)]
    for name, m in sets.items():
        lines.append(f"{name:<{width}}  " + "  ".join(f"{_rate_cell(b):>16}" for b in m["ensemble"]["disagreement"]))
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


def nan_to_none(value: Any) -> Any:
    """`value` with every NaN float replaced by None, in nested dicts and lists (strict JSON)."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: nan_to_none(v) for k, v in value.items()}
    if isinstance(value, list):
        return [nan_to_none(v) for v in value]
    return value
