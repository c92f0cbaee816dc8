"""From a batch to judgements and back, without a model: GRPO groups, the judgements of each (as its mode lists them),
a verdict from log-probabilities, and each sample's reward as the mean of its share of the verdicts
(`JudgeEnvironment` renders the prompts and runs the engine around these; `builtin_modes.py` and `genrm.py` say what differs by mode)."""

from __future__ import annotations

import json
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..runtime.engines.contract import Generate, LabelLogprobs
from .mode_base import JudgeMode
from .verdicts import distribution


@dataclass
class Judgement:
    """One request to the judge: the batch samples it judges, in the order the judge sees them, and its prompt
    (token ids, or the message list sent to a chat server); `overlength` when the prompt does not fit; `copy` numbers
    the judgements of the same samples in the same order (each sampled with its own seed)."""

    samples: tuple[int, ...]
    prompt: Any
    overlength: bool = False
    copy: int = 0  # the how-manieth judgement of the same samples in that order (0: the first)


@dataclass
class JudgeVerdicts:
    """What `JudgeEnvironment.verdicts` found: one verdict per item (None: none could be read, or over-length), the
    call's counts (`num_judgements`, `num_overlength`, `num_retried`, `num_unparsed`), the verdict tokens' mass of
    each `logprobs` judgement, and the prompt tokens sent (None when a server rendered them)."""

    values: list[Any]
    counts: dict[str, float]
    masses: list[float]
    tokens: int | None


SEED_STRIDE = 1000
"""A judgement asked again (`Judgement.copy`) is sampled with seed `attempt + SEED_STRIDE * copy`: the first copy
keeps the attempt's seed."""


@dataclass
class Asked:
    """What the judge answered to a call's judgements (`ask_verdicts`): a verdict each (None: over-length, or none
    could be read and the mode has no `failed_verdict`), the judgements that failed (no verdict after the retries, or
    their request failed), the counts (`num_judgements`, `num_overlength`, `num_retried`, `num_unparsed`,
    `num_failed`), the verdict tokens' mass of each `logprobs` judgement, and an answer no verdict was read from."""

    verdicts: list[Any]
    failed: list[int] = field(default_factory=list)
    counts: dict[str, float] = field(default_factory=dict)
    masses: list[float] = field(default_factory=list)
    unparsed_text: str = ""


def ask_verdicts(
    mode: JudgeMode, judge: Any, judgements: Sequence[Judgement]
) -> Generator[LabelLogprobs | Generate, Any, Asked]:
    """Each judgement's verdict, yielding the engine's requests and receiving their answers: `LabelLogprobs`, or
    `Generate` (an answer None: its request failed, not asked again).
    An unreadable `generate` answer is asked again up to `parse_retries` times (at `temperature`, or 1.0 when it is
    0); a judgement that still has no verdict gets the mode's `failed_verdict`.
    """
    asked = Asked([None] * len(judgements))
    verdicts, counts = asked.verdicts, asked.counts
    sendable = [k for k, j in enumerate(judgements) if not j.overlength]
    counts.update(num_judgements=float(len(judgements)), num_overlength=float(len(judgements) - len(sendable)))
    counts["num_retried"] = 0.0
    requests_failed: set[int] = set()
    if judge.scoring == "logprobs" and sendable:
        answers = yield LabelLogprobs([judgements[k].prompt for k in sendable])
        for k, logprobs in zip(sendable, answers):
            verdicts[k], mass = from_logprobs(mode, judgements[k], logprobs)
            asked.masses.append(mass)
    elif judge.scoring == "generate":
        pending, temperature, last_texts = sendable, judge.temperature, {}
        for attempt in range(judge.parse_retries + 1):
            if not pending:
                break
            if attempt:
                counts["num_retried"] += len(pending)
                temperature = judge.temperature if judge.temperature > 0 else 1.0
            seeds = [attempt + SEED_STRIDE * judgements[k].copy for k in pending]
            answers = yield Generate([judgements[k].prompt for k in pending], temperature, seeds)
            for k, text in zip(pending, answers):
                if text is None:
                    requests_failed.add(k)
                else:
                    verdicts[k] = mode.from_text(judgements[k].samples, text, judge)
                    last_texts[k] = text
            pending = [k for k in pending if verdicts[k] is None and k not in requests_failed]
        asked.unparsed_text = last_texts[pending[0]] if pending else ""
    asked.failed = [k for k in sendable if verdicts[k] is None]
    counts["num_unparsed"] = float(len(asked.failed) - len(requests_failed))
    counts["num_failed"] = float(len(asked.failed))
    fallback = mode.failed_verdict(judge)
    if fallback is not None:
        for k in asked.failed:
            verdicts[k] = fallback
    return asked


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


def from_logprobs(mode: JudgeMode, judgement: Judgement, logprobs: Sequence[float]) -> tuple[Any, float]:
    """A judgement's verdict from the verdict tokens' log-probabilities, renormalized over the labels that apply to
    it, and the mass they held; the verdict is None when they held none (nothing to read, never a 0)."""
    probs, mass = distribution(mode.labels_shown(judgement.samples, logprobs))
    if mass <= 0:
        return None, 0.0
    return mode.from_probabilities(judgement.samples, probs), mass


def aggregate(
    mode: JudgeMode,
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
        if verdict is None:
            for i in judgement.samples:
                failed.setdefault(i, "overlength" if judgement.overlength else "unparsed")
            continue
        for i, value in mode.shares(judgement.samples, verdict):
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


def template_columns(
    names: Sequence[str], kwargs: Mapping[str, Any], n: int, what: str, optional: Sequence[str] = ()
) -> dict[str, Sequence[Any]]:
    """The dataset columns a judgement reads (`names`), one value per sample, from TRL's keyword arguments
    (`optional`: columns whose None is a value, which the mode replaces).

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
        missing = [] if name in optional else [i for i, v in enumerate(value) if v is None]
        if missing:
            raise ValueError(
                f"{what}: column {name!r}, which the judge template reads, is None for samples {missing[:10]}"
            )
        out[name] = value
    return out


def failure_message(judge: Any, reason: str, samples: list[int], unparsed_text: str = "") -> str:
    """The one-line error of samples left without a verdict (`reason`: `overlength` or `unparsed`) and no fallback
    (`unparsed_text`: one of the call's answers no verdict could be read from)."""
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
        f"(one of the judge's last answers began {unparsed_text[:200]!r}); set unparsed_reward, or fix the "
        "template's answer format"
    )


def build_judgements(
    mode: JudgeMode,
    judge: Any,
    prompts: Sequence[Any],
    texts: Mapping[int, str],
    groups: Sequence[Sequence[int]],
    columns: Mapping[str, Sequence[Any]],
    render: Callable[[Any, list[str], dict[str, Any]], tuple[Any, bool]],
    what: str,
) -> tuple[list[Judgement], list[int]]:
    """Every judgement of a call (`judge`: the `JudgeOptions`; `texts`: what the judge is shown of each sample;
    `render(context, texts, row)` -> `(prompt, overlength)`, `row` holding this group's values of `columns`), and the
    samples alone in a group of a mode that compares them. A judgement the mode asks for again (a GenRM's k judges of
    one pair) is numbered by `copy`.

    Raises:
        ValueError: a group the mode cannot judge (a listwise `logprobs` group of more than 9 completions).
    """
    out: list[Judgement] = []
    alone: list[int] = []
    for members in groups:
        if mode.compares and len(members) == 1:
            alone.append(members[0])
            continue
        seen: dict[tuple[int, ...], int] = {}
        for shown in mode.judgements(members, judge, what):
            first, shown = shown[0], tuple(shown)
            copy = seen[shown] = seen.get(shown, -1) + 1
            row = {c: columns[c][first] for c in columns}
            out.append(Judgement(shown, *render(prompts[first], [texts[i] for i in shown], row), copy=copy))
    return out, alone
