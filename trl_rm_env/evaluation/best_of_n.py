"""Best-of-n over-optimization: how the sample a proxy reward picks out of n scores on a gold reward, as n grows.

Gao et al. (2022, "Scaling Laws for Reward Model Overoptimization") measure it this way: draw N samples per prompt
from the policy once; for each n <= N, the best-of-n policy returns the sample of n with the highest proxy reward.
Its KL divergence from the policy is `log n - (n-1)/n` (their eq. 1), and its gold reward, as a function of
`d = sqrt(KL)`, follows `d (alpha - beta d)` above the policy's own (their fit for best-of-n). Over-optimization is
the gold reward falling while the proxy's rises. Coste et al. (2023) use the same estimate to compare an ensemble's
conservative aggregates (`min`, uncertainty-weighted `mean_minus_std`) with one proxy.

The expected value of the best-of-n pick is computed exactly from the N samples, over every subset of n of them
(Nakano et al. 2021, appendix; Gao et al. 2022, appendix): with the samples in increasing order of proxy reward, the
i-th (1-based) is the pick of a uniformly drawn n-subset with probability `C(i-1, n-1) / C(N, n)`; samples the proxy
ties share their values' mean (a tie broken uniformly at random).

The `trl-rm-env best-of-n` command (`best_of_n_command.py`) runs it on your policy, proxies, gold and prompts; the curves, fits and
per-defence summaries go to a JSON file and a plot. docs/reward_hacking.md shows what it measured on a real model.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np


def kl_best_of_n(n: int) -> float:
    """The KL divergence of the best-of-n policy from the policy it samples: `log n - (n-1)/n` (Gao et al. eq. 1)."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    return math.log(n) - (n - 1) / n


def pick_probabilities(total: int, n: int) -> np.ndarray:
    """`p[i]`: the probability that the (i+1)-th smallest of `total` distinct values is the largest of a uniformly
    drawn n-subset, `C(i, n-1) / C(total, n)` (exact integers, then floats)."""
    if not 1 <= n <= total:
        raise ValueError(f"n must be between 1 and the {total} samples, got {n}")
    denominator = math.comb(total, n)
    return np.array([math.comb(i, n - 1) / denominator for i in range(total)], dtype=np.float64)


def best_of_n_expectation(proxy: Sequence[float], values: np.ndarray, n: int) -> np.ndarray:
    """The expected `values` of the best-of-n pick by `proxy` over every n-subset of one prompt's samples.

    Args:
        proxy: The proxy reward of each of the prompt's N samples.
        values: `(N,)` or `(N, M)`: what to average (the gold reward, the proxy itself, ...), one row per sample.
        n: How many samples the best-of-n policy draws (1 <= n <= N).

    Returns: `values`' expectation (a scalar's array, or `(M,)`). Tied proxy rewards are broken uniformly.
    """
    scores = np.asarray(proxy, dtype=np.float64)
    values = np.asarray(values, dtype=np.float64)
    if scores.ndim != 1 or values.shape[0] != scores.shape[0]:
        raise ValueError(f"proxy has shape {scores.shape} and values {values.shape}: one row per sample")
    if np.isnan(scores).any():
        raise ValueError("a proxy reward is NaN: a best-of-n pick is undefined")
    order = np.argsort(scores, kind="stable")
    ordered, tied = scores[order], values[order].copy()
    start = 0
    for end in range(1, len(ordered) + 1):  # a tie group's members share their values' mean
        if end == len(ordered) or ordered[end] != ordered[start]:
            tied[start:end] = tied[start:end].mean(axis=0)
            start = end
    return pick_probabilities(len(scores), n) @ tied


def fit_gao(d: Sequence[float], gain: Sequence[float]) -> dict[str, float]:
    """Least-squares fit of Gao et al.'s best-of-n form `gain = d (alpha - beta d)` (no intercept: no gain at d=0).

    Returns: `alpha`, `beta`, `d_peak` (`alpha / (2 beta)`, the d of the highest gold; inf when beta <= 0: no peak),
    `gain_peak` (the fitted gain there) and `r2` (of the fit, against the gains' mean).
    """
    d, gain = np.asarray(d, dtype=np.float64), np.asarray(gain, dtype=np.float64)
    if len(d) < 2 or len(d) != len(gain):
        raise ValueError(f"fit_gao needs two or more (d, gain) points of equal count, got {len(d)} and {len(gain)}")
    (alpha, beta), *_ = np.linalg.lstsq(np.stack([d, -(d**2)], axis=1), gain, rcond=None)
    fitted = d * (alpha - beta * d)
    spread = float(((gain - gain.mean()) ** 2).sum())
    r2 = 1.0 - float(((gain - fitted) ** 2).sum()) / spread if spread > 0 else float("nan")
    d_peak = alpha / (2 * beta) if beta > 0 else math.inf
    gain_peak = d_peak * (alpha - beta * d_peak) if beta > 0 else math.inf
    return {"alpha": float(alpha), "beta": float(beta), "d_peak": float(d_peak), "gain_peak": float(gain_peak),
            "r2": r2}  # fmt: skip


def pair_accuracy(rewards: np.ndarray, gold: np.ndarray) -> float:
    """How often the proxy orders two samples of one prompt as the gold does: over every pair of a prompt's samples
    with different gold rewards, the share the proxy rewards the better one higher (a proxy tie counts 1/2; NaN
    without such pairs)."""
    right = total = 0.0
    for r, g in zip(rewards, gold):
        better = g[:, None] > g[None, :]  # [i, j]: i is better than j by the gold
        total += better.sum()
        right += ((r[:, None] > r[None, :]) & better).sum() + 0.5 * ((r[:, None] == r[None, :]) & better).sum()
    return float(right / total) if total else math.nan


def default_ns(samples: int) -> list[int]:
    """1, 2, 4, ... up to `samples` (which is included)."""
    ns, n = [], 1
    while n < samples:
        ns.append(n)
        n *= 2
    return ns + [samples]


def curve(proxy: np.ndarray, gold: np.ndarray, ns: Sequence[int]) -> list[dict[str, float]]:
    """The best-of-n curve of one proxy: for each n, `kl`, `d`, and the pick's expected `proxy` and `gold` reward,
    averaged over prompts (`proxy`, `gold`: `(P, N)`, a row per prompt)."""
    if proxy.shape != gold.shape:
        raise ValueError(f"proxy rewards {proxy.shape} and gold rewards {gold.shape} differ in shape")
    points = []
    for n in ns:
        picks = np.array([best_of_n_expectation(p, np.stack([p, g], axis=1), n) for p, g in zip(proxy, gold)])
        kl = kl_best_of_n(n)
        points.append({"n": n, "kl": kl, "d": math.sqrt(kl), "proxy": float(picks[:, 0].mean()),
                       "gold": float(picks[:, 1].mean())})  # fmt: skip
    return points


# ---------------------------------------------------------------------------------------------------- proxies
@dataclass
class Proxy:
    """A proxy reward: `label` (the defence it stands for; proxies sharing a label are its seeds), and each sample's
    outputs `(P, N, K)` (K heads; `aggregate` reads them)."""

    label: str
    path: str
    outputs: np.ndarray = field(repr=False)


def aggregated(outputs: np.ndarray, how: str | None, penalty: float = 1.0) -> np.ndarray:
    """`(P, N)` rewards from `(P, N, K)` outputs: one head as it is, several by `how` (`rewards.ensemble.aggregate`,
    what `RewardModelEnvironment(ensemble=how)` rewards)."""
    import torch

    from ..rewards.ensemble import aggregate

    if outputs.shape[-1] == 1 and how is None:
        return outputs[..., 0]
    flat = torch.from_numpy(outputs.reshape(-1, outputs.shape[-1]))
    return aggregate(flat, how or "mean", penalty).numpy().reshape(outputs.shape[:2])


@dataclass
class Defence:
    """One curve of the report: a label and how its proxies become one reward."""

    name: str
    runs: list[np.ndarray]  # (P, N) rewards, one per seed


def defences(proxies: Sequence[Proxy], aggregations: Sequence[str], ensembles: Mapping[str, str],
             penalty: float = 1.0) -> list[Defence]:  # fmt: skip
    """Every curve: a one-head proxy label as `label`; a K-head label as `label/<aggregation>` for each of
    `aggregations`; each of `ensembles` (`name -> label`) as the proxies of that label, one reward model a member,
    aggregated (`name/<aggregation>`: one run)."""
    out: dict[str, Defence] = {}
    for proxy in proxies:
        heads = proxy.outputs.shape[-1]
        for how in [None] if heads == 1 else aggregations:
            name = proxy.label if how is None else f"{proxy.label}/{how}"
            out.setdefault(name, Defence(name, [])).runs.append(aggregated(proxy.outputs, how, penalty))
    for name, label in ensembles.items():
        members = [p for p in proxies if p.label == label]
        if len(members) < 2 or any(p.outputs.shape[-1] != 1 for p in members):
            raise ValueError(f"ensemble {name}={label}: needs two or more one-head proxies labelled {label!r}, got "
                             f"{len(members)} ({[p.outputs.shape[-1] for p in members]} heads)")  # fmt: skip
        stacked = np.concatenate([p.outputs for p in members], axis=-1)
        for how in aggregations:
            out[f"{name}/{how}"] = Defence(f"{name}/{how}", [aggregated(stacked, how, penalty)])
    return list(out.values())


def report(gold: np.ndarray, found: Sequence[Defence], ns: Sequence[int]) -> dict[str, Any]:
    """The curves of every defence and seed against the gold rewards `(P, N)`, Gao's fit of each, and each
    defence's summary across seeds (the proxy also as z-scores over every sample, so proxies of different scales
    share an axis)."""
    policy_gold = float(gold.mean())
    result: dict[str, Any] = {"prompts": len(gold), "samples_per_prompt": gold.shape[1], "ns": list(ns),
                              "policy_gold": policy_gold, "oracle_gold": float(gold.max(axis=1).mean()),
                              "defences": {}}  # fmt: skip
    for defence in found:
        runs = []
        for rewards in defence.runs:
            points = curve(rewards, gold, ns)
            mean, std = float(rewards.mean()), float(rewards.std()) or 1.0
            for p in points:
                p["proxy_z"] = (p["proxy"] - mean) / std
            fit = fit_gao([p["d"] for p in points], [p["gold"] - points[0]["gold"] for p in points])
            best = max(points, key=lambda p: p["gold"])
            runs.append({"points": points, "fit": fit, "best_n": best["n"], "gold_best": best["gold"],
                         "gold_last": points[-1]["gold"], "fall": best["gold"] - points[-1]["gold"],
                         "pair_accuracy": pair_accuracy(rewards, gold)})  # fmt: skip
        result["defences"][defence.name] = {"runs": runs, "summary": summary(runs)}
    return result


def summary(runs: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """Across seeds: the mean and std (0 for one seed) of the gold at the largest n and the best, the proxy's
    pair accuracy against the gold, the fall from the best n, and the fitted alpha, beta and d_peak."""
    out = {}
    for key, get in (("gold_last", lambda r: r["gold_last"]), ("gold_best", lambda r: r["gold_best"]),
                     ("pair_accuracy", lambda r: r["pair_accuracy"]),
                     ("fall", lambda r: r["fall"]), ("alpha", lambda r: r["fit"]["alpha"]),
                     ("beta", lambda r: r["fit"]["beta"]), ("d_peak", lambda r: r["fit"]["d_peak"])):  # fmt: skip
        values = [get(r) for r in runs]
        out[key] = statistics.fmean(values)  # inf where a run's fit has no peak
        finite = all(math.isfinite(v) for v in values)
        out[f"{key}_std"] = (statistics.stdev(values) if finite else math.nan) if len(values) > 1 else 0.0
    return out


def verdicts(result: Mapping[str, Any], baseline: str) -> dict[str, str]:
    """A plain verdict per defence against `baseline` (the one-proxy curve), on the gold at the largest n, paired
    by seed: `helps` / `hurts` when the mean difference is more than twice its standard error across seeds (and the
    seeds agree in sign), else `cannot be told at this size`; one seed: the difference, `(one seed)`."""
    base = [r["gold_last"] for r in result["defences"][baseline]["runs"]]
    out = {}
    for name, defence in result["defences"].items():
        if name == baseline:
            continue
        mine = [r["gold_last"] for r in defence["runs"]]
        if len(mine) != len(base):  # an ensemble of the baseline's seeds: one run against the seeds' mean
            diff = statistics.fmean(mine) - statistics.fmean(base)
            out[name] = f"{diff:+.3f} gold against the seeds' mean (one run)"
            continue
        diffs = [a - b for a, b in zip(mine, base)]
        mean = statistics.fmean(diffs)
        se = statistics.stdev(diffs) / math.sqrt(len(diffs)) if len(diffs) > 1 else math.inf
        if abs(mean) > 2 * se and (all(x > 0 for x in diffs) or all(x < 0 for x in diffs)):
            out[name] = f"{'helps' if mean > 0 else 'hurts'} ({mean:+.3f} gold at n={result['ns'][-1]})"
        else:
            out[name] = f"cannot be told at this size ({mean:+.3f} +- {se:.3f} gold at n={result['ns'][-1]})"
    return out


def table(result: Mapping[str, Any]) -> str:
    """A Markdown table: per defence, the proxy's pair accuracy against the gold, the gold at n=1, at the best n and
    at the largest n (mean +- std over seeds), the fall, and the fitted alpha, beta and d_peak (means over seeds)."""
    ns = result["ns"]
    lines = [f"| defence | seeds | pair accuracy | gold n=1 | best n | gold best | gold n={ns[-1]} | fall | alpha | beta "
             "| d_peak |", "|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for name, defence in result["defences"].items():
        runs, s = defence["runs"], defence["summary"]
        first = statistics.fmean(r["points"][0]["gold"] for r in runs)
        best_n = "/".join(str(r["best_n"]) for r in runs)
        lines.append(f"| {name} | {len(runs)} | {s['pair_accuracy']:.3f} | {first:.3f} | {best_n} | {s['gold_best']:.3f} +- {s['gold_best_std']:.3f}"
                     f" | {s['gold_last']:.3f} +- {s['gold_last_std']:.3f} | {s['fall']:.3f} | {s['alpha']:.3f} | "
                     f"{s['beta']:.3f} | {s['d_peak']:.2f} |")  # fmt: skip
    return "\n".join(lines)


def plot(result: Mapping[str, Any], path: str | Path, title: str = "best-of-n") -> None:
    """`figure(result, title)` written to `path` (PNG)."""
    import matplotlib.pyplot as plt

    fig = figure(result, title)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def figure(result: Mapping[str, Any], title: str = "best-of-n") -> Any:
    """Gold (left) and proxy z-score (right) of the best-of-n pick against d = sqrt(KL), a line per defence (the
    seeds' mean, their range as a band; colour: the aggregation, line style: the proxy), the policy's gold and the
    oracle's (the best sample's) as grey lines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colours = {"mean": "tab:blue", "min": "tab:orange", "median": "tab:green", "mean_minus_std": "tab:red"}
    styles: dict[str, str] = {}
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.2))
    for name, defence in result["defences"].items():
        label, _, how = name.partition("/")
        style = styles.setdefault(label, ("-", "--", ":", "-.")[len(styles) % 4])
        colour = colours.get(how, "black")
        d = np.array([p["d"] for p in defence["runs"][0]["points"]])
        for ax, key in ((left, "gold"), (right, "proxy_z")):
            values = np.array([[p[key] for p in r["points"]] for r in defence["runs"]])
            ax.plot(d, values.mean(axis=0), marker="o", markersize=3, label=name, color=colour, linestyle=style,
                    linewidth=2.2 if not how else 1.3)  # fmt: skip
            if len(values) > 1:
                ax.fill_between(d, values.min(axis=0), values.max(axis=0), alpha=0.07, color=colour)
    left.axhline(result["policy_gold"], linestyle=":", color="gray", label="policy (n=1)")
    left.axhline(result["oracle_gold"], linestyle="--", color="gray", label=f"oracle (best of {result['ns'][-1]})")
    left.set_ylabel("gold reward of the pick")
    right.set_ylabel("proxy reward of the pick (z over all samples)")
    for ax in (left, right):
        ax.set_xlabel("d = sqrt(KL_bon)")
    right.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.suptitle(title)
    fig.tight_layout()
    return fig
