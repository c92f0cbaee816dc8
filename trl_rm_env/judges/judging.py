"""From a batch to judgements and back, without a model: GRPO groups, the pairs judged, a verdict from log-probabilities
or text, and each sample's reward as the mean of its share of the verdicts (`JudgeEnvironment` renders the prompts and
runs the engine around these)."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from . import templates as T
from .options import MAX_LIST
from .verdicts import distribution, parse_ranking, parse_score, parse_winner


@dataclass
class Judgement:
    """One request to the judge: the batch samples it judges, in the order the judge sees them, and its prompt
    (token ids, or the message list sent to a chat server); `overlength` when the prompt does not fit."""

    samples: tuple[int, ...]
    prompt: Any
    overlength: bool = False


@dataclass
class JudgeVerdicts:
    """What `JudgeEnvironment.verdicts` found: one verdict per item (None: none could be read, or over-length), the
    call's counts (`num_judgements`, `num_overlength`, `num_retried`, `num_unparsed`), the verdict tokens' mass of
    each `logprobs` judgement, and the prompt tokens sent (None when a server rendered them)."""

    values: list[Any]
    counts: dict[str, float]
    masses: list[float]
    tokens: int | None


def group_samples(
    prompts: Sequence[Any], to_score: Sequence[int], columns: Mapping[str, Sequence[Any]] | None = None
) -> list[list[int]]:
    """The samples to judge grouped by equal prompts (a GRPO group) and equal values of the dataset `columns` the
    template reads (two rows with one prompt but different references are two groups), in order of first appearance."""
    groups: dict[str, list[int]] = {}
    for i in to_score:
        values = [prompts[i], *(column[i] for column in (columns or {}).values())]
        key = json.dumps(values, sort_keys=True, default=str)
        groups.setdefault(key, []).append(i)
    return list(groups.values())


def pairs_of(n: int, pairs: str) -> list[tuple[int, int]]:
    """The positions compared in a group of `n`: `all` (each unordered pair once) or `circular` (i against i+1, the
    last against the first; for `n == 2` the one pair)."""
    if pairs == "all" or n == 2:
        return [(a, b) for a in range(n) for b in range(a + 1, n)]
    return [(a, (a + 1) % n) for a in range(n)]


def from_logprobs(mode: str, judgement: Judgement, logprobs: Sequence[float]) -> tuple[Any, float]:
    """A judgement's verdict from the verdict tokens' log-probabilities, and the mass they held; the verdict is None
    when they held none (nothing to read, never a 0). Pointwise: the expected rating (the labels are `1..max_score`);
    pairwise: the preference for the first; listwise: each position's probability of being the best."""
    if mode == "listwise":
        logprobs = logprobs[: len(judgement.samples)]
    probs, mass = distribution(logprobs)
    if mass <= 0:
        return None, 0.0
    if mode == "pointwise":
        return sum((k + 1) * p for k, p in enumerate(probs)), mass
    if mode == "pairwise":
        return probs[0], mass
    return probs, mass


def from_text(mode: str, judgement: Judgement, text: str, max_score: int) -> Any:
    """A judgement's verdict parsed from the judge's text (`trl_rm_env.judges.verdicts`), or None. Listwise: each
    position's `(N - 1 - rank) / (N - 1)`."""
    if mode == "pointwise":
        return parse_score(text, max_score)
    if mode == "pairwise":
        return parse_winner(text)
    n = len(judgement.samples)
    ranking = parse_ranking(text, n)
    if ranking is None:
        return None
    values = [0.0] * n
    for rank, position in enumerate(ranking):
        values[position] = (n - 1 - rank) / (n - 1)
    return values


def aggregate(
    mode: str,
    judgements: Sequence[Judgement],
    verdicts: Sequence[Any],
    to_score: Sequence[int],
    alone: Sequence[int],
    single_reward: float,
) -> tuple[dict[int, float], dict[str, list[int]]]:
    """Each sample's reward, the mean of its share of every verdict (`single_reward` alone in its group), and the
    samples without any verdict by why: `{"overlength": [...], "unparsed": [...]}`."""
    shares: dict[int, list[float]] = {i: [] for i in to_score}
    failed: dict[int, str] = {}
    for judgement, verdict in zip(judgements, verdicts):
        samples = judgement.samples
        if verdict is None:
            for i in samples:
                failed.setdefault(i, "overlength" if judgement.overlength else "unparsed")
        elif mode == "pointwise":
            shares[samples[0]].append(verdict)
        elif mode == "pairwise":
            shares[samples[0]].append(verdict)
            shares[samples[1]].append(1.0 - verdict)
        else:
            for i, value in zip(samples, verdict):
                shares[i].append(value)
    values: dict[int, float] = {}
    missing: dict[str, list[int]] = {"overlength": [], "unparsed": []}
    lone = set(alone)
    for i in to_score:
        if shares[i]:
            values[i] = sum(shares[i]) / len(shares[i])
        elif i in lone:
            values[i] = float(single_reward)
        else:
            missing[failed.get(i, "unparsed")].append(i)
    return values, missing


def template_columns(names: Sequence[str], kwargs: Mapping[str, Any], n: int, what: str) -> dict[str, Sequence[Any]]:
    """The dataset columns a template reads (`names`), one value per sample, from TRL's keyword arguments.

    Raises:
        ValueError: a column not passed, not one value per sample, or None for some sample (an empty reference or
            rubric would be judged as if it were one), naming it.
    """
    out = {}
    for name in names:
        value = kwargs.get(name)
        if value is None:
            given = sorted(k for k, v in kwargs.items() if isinstance(v, list | tuple) and len(v) == n)
            raise ValueError(
                f"{what}: the judge template reads {{{name}}}, but the reward function got no column {name!r}; the "
                f"dataset columns TRL passed: {given}"
            )
        if isinstance(value, str) or not isinstance(value, Sequence) or len(value) != n:
            raise ValueError(f"{what}: column {name!r} must hold one value per sample ({n}), as TRL passes it")
        missing = [i for i, v in enumerate(value) if v is None]
        if missing:
            raise ValueError(
                f"{what}: column {name!r}, which the judge template reads, is None for samples {missing[:10]}"
            )
        out[name] = value
    return out


def failure_message(judge: Any, reason: str, samples: list[int]) -> str:
    """The one-line error of samples left without a verdict (`reason`: `overlength` or `unparsed`) and no fallback."""
    shown = f"{samples[:10]}{' ...' if len(samples) > 10 else ''}"
    if reason == "overlength":
        return (
            f"{judge.name}: the judge's prompt for completions {shown} is longer than its max length "
            f"{judge.engine.max_length} (with room for its answer); set overlength_reward, or raise max_length"
        )
    if judge.options.scoring == "logprobs":
        return (
            f"{judge.name}: the verdict tokens held no probability for completions {shown} (the judge's logits are "
            "NaN/inf, or with remote_input='messages' no verdict token was among the server's top_logprobs); set "
            "unparsed_reward, or send token ids"
        )
    return (
        f"{judge.name}: no verdict could be read for completions {shown} after {judge.options.parse_retries} retries "
        f"(one of the judge's last answers began {judge._unparsed_text[:200]!r}); set unparsed_reward, or fix the "
        "template's answer format"
    )


def build_judgements(
    judge: Any,
    prompts: Sequence[Any],
    texts: Mapping[int, str],
    groups: Sequence[Sequence[int]],
    columns: Mapping[str, Sequence[Any]],
    render: Callable[[dict[str, Any]], tuple[Any, bool]],
    what: str,
) -> tuple[list[Judgement], list[int]]:
    """Every judgement of a call (`judge`: the `JudgeOptions`; `texts`: each sample's completion text; `render`:
    template values -> `(prompt, overlength)`), and the samples alone in their group (pairwise, listwise).

    Raises:
        ValueError: a listwise `logprobs` group of more than `MAX_LIST` completions.
    """
    out: list[Judgement] = []
    alone: list[int] = []

    def add(samples: tuple[int, ...], **fields: Any) -> None:
        first = samples[0]
        values = {"prompt": T.prompt_text(prompts[first]), **{c: columns[c][first] for c in columns}, **fields}
        out.append(Judgement(samples, *render(values)))

    for members in groups:
        if judge.mode == "pointwise":
            for i in members:
                add((i,), completion=texts[i], max_score=judge.max_score)
            continue
        if len(members) == 1:
            alone.append(members[0])
            continue
        if judge.mode == "pairwise":
            for a, b in pairs_of(len(members), judge.pairs):
                orders = [(members[a], members[b])] + ([(members[b], members[a])] if judge.swap else [])
                for x, y in orders:
                    add((x, y), completion_a=texts[x], completion_b=texts[y])
            continue
        if judge.scoring == "logprobs" and len(members) > MAX_LIST:
            raise ValueError(
                f"{what}: a listwise judgement by logprobs ranks at most {MAX_LIST} answers (one verdict token each); "
                f"this group has {len(members)}. Use mode='pairwise' or scoring='generate'."
            )
        orders = [list(members)] + ([list(reversed(members))] if judge.swap else [])
        for order in orders:
            add(tuple(order), completions=T.numbered([texts[i] for i in order]), count=len(order))
    return out, alone
