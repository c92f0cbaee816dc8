"""Judge modes as objects: everything that differs between a pointwise, a pairwise and a listwise judge, in one class
each (on `mode_base.JudgeMode`), and their registry; the GenRM mode (NeMo Gym's `genrm_compare`) is `genrm.py`'s,
registered here. Nothing outside the modes tests a mode's name: the judge, the evaluation and the cascade ask the
mode.

A mode owns its built-in template and the fields it fills, what the judge is told to answer (`answer_format`, by
scoring), its verdict labels (read by log-probabilities), the judgements of a GRPO group, how a verdict is read from
the verdict tokens' probabilities or from text, each sample's share of a verdict, and how a preference pair is
judged for `trl-rm-env eval --judge` (with the value that is a tie).

A new mode is one subclass of `JudgeMode`, registered with `register_mode`; its name is then a valid `mode=` of
`JudgeOptions` (and `--judge-mode`, `reward_judge_mode`):

    @register_mode
    class Absolute(JudgeMode):
        name = "absolute"
        template = "... {prompt} ... {completion} ... {answer_format}"
        ...
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from . import templates as T
from .genrm import GenRM
from .mode_base import Ask, EvalPair, JudgeMode, PairVerdicts
from .verdicts import parse_ranking, parse_score, parse_winner

MAX_LIST = 9
"""Most completions a listwise judgement can rank by log-probabilities: one single-token label each (1..9)."""


MODES: dict[str, JudgeMode] = {}
"""The registered modes by name (`JudgeOptions.mode`'s choices)."""


def register_mode(cls: type[JudgeMode]) -> type[JudgeMode]:
    """Register a mode class (a decorator): its `name` becomes a valid `mode`.

    Raises:
        ValueError: a name already registered by another class.
    """
    known = MODES.get(cls.name)
    if known is not None and type(known) is not cls:
        raise ValueError(f"judge mode {cls.name!r} is already registered ({type(known).__name__})")
    MODES[cls.name] = cls()
    return cls


def mode_of(name: str) -> JudgeMode:
    """The registered mode called `name`.

    Raises:
        ValueError: an unknown name, listing the modes.
    """
    try:
        return MODES[name]
    except KeyError:
        raise ValueError(f"mode must be one of {list(MODES)}, got {name!r}") from None


class _Templates(Mapping):
    """The built-in template of each registered mode, by name (a live view: a mode registered later is in it)."""

    def __getitem__(self, name: str) -> str:
        return mode_of(name).template

    def __iter__(self) -> Iterator[str]:
        return iter(MODES)

    def __len__(self) -> int:
        return len(MODES)


TEMPLATES: Mapping[str, str] = _Templates()
"""The built-in template of each mode (`trl_rm_env.judges.TEMPLATES["pairwise"]`)."""


def pairs_of(n: int, pairs: str) -> list[tuple[int, int]]:
    """The positions compared in a group of `n`: `all` (each unordered pair once) or `circular` (i against i+1, the
    last against the first; for `n == 2` the one pair)."""
    if pairs == "all" or n == 2:
        return [(a, b) for a in range(n) for b in range(a + 1, n)]
    return [(a, (a + 1) % n) for a in range(n)]


@register_mode
class Pointwise(JudgeMode):
    """Rates each completion alone, 1..`max_score`; the reward is the rating (`logprobs`: the expected rating)."""

    name = "pointwise"
    template = T.POINTWISE
    fields = frozenset({"prompt", "completion", "max_score", "answer_format"})
    completion_fields = frozenset({"completion"})
    answer_formats = {
        "logprobs": "Reply with the rating alone: a single number from 1 to {max_score}.",
        "generate": "Explain your reasoning briefly, then end with a line `Score: <rating>`.",
    }
    compares = False
    shows = 1

    def labels(self, options: Any) -> list[str]:
        return [str(k) for k in range(1, options.max_score + 1)]

    def fill(self, texts: Sequence[str], options: Any) -> dict[str, Any]:
        (text,) = texts
        return {"completion": text, "max_score": options.max_score}

    def judgements(self, members: Sequence[int], options: Any, what: str) -> Iterator[tuple[int, ...]]:
        for i in members:
            yield (i,)

    def from_probabilities(self, shown: Sequence[int], probabilities: Sequence[float]) -> Any:
        return sum((k + 1) * p for k, p in enumerate(probabilities))

    def from_text(self, shown: Sequence[int], text: str, options: Any) -> Any:
        return parse_score(text, options.max_score)

    def shares(self, shown: Sequence[int], verdict: Any) -> Iterable[tuple[int, float]]:
        return [(shown[0], verdict)]

    def judge_pairs(self, ask: Ask, pairs: Sequence[EvalPair], options: Any) -> PairVerdicts:
        """Each completion is rated once, whatever the pairs it is in; a pair's preference is the better one's
        rating minus the worse one's (equal ratings: a tie)."""
        items: dict[Any, tuple[Any, Any]] = {}
        for pair in pairs:
            items.setdefault(pair.better_key, (pair.context, pair.better))
            items.setdefault(pair.worse_key, (pair.context, pair.worse))
        keys = sorted(items) if _sortable(items) else list(items)  # the order the judge sees them in
        found = ask([items[k][0] for k in keys], [[items[k][1]] for k in keys])
        ratings = dict(zip(keys, found.values))
        preferences = [
            None
            if ratings[p.better_key] is None or ratings[p.worse_key] is None
            else ratings[p.better_key] - ratings[p.worse_key]
            for p in pairs
        ]
        return PairVerdicts(preferences, None, ratings, found)


def _sortable(items: Mapping[Any, Any]) -> bool:
    try:
        sorted(items)
    except TypeError:
        return False
    return True


@register_mode
class Pairwise(JudgeMode):
    """Compares a group's completions in pairs (`pairs`: `all` or `circular`; `swap`: both orders); each gets its
    mean preference, 0..1 (`logprobs`: `p(A) / (p(A) + p(B))`)."""

    name = "pairwise"
    template = T.PAIRWISE
    fields = frozenset({"prompt", "completion_a", "completion_b", "answer_format"})
    completion_fields = frozenset({"completion_a", "completion_b"})
    answer_formats = {
        "logprobs": "Reply with the letter of the better answer alone: A or B.",
        "generate": "Explain your reasoning briefly, then end with your verdict: [[A]] or [[B]].",
    }
    neutral = 0.5
    shows = 2

    def labels(self, options: Any) -> list[str]:
        return ["A", "B"]

    def fill(self, texts: Sequence[str], options: Any) -> dict[str, Any]:
        a, b = texts
        return {"completion_a": a, "completion_b": b}

    def judgements(self, members: Sequence[int], options: Any, what: str) -> Iterator[tuple[int, ...]]:
        for a, b in pairs_of(len(members), options.pairs):
            yield members[a], members[b]
            if options.swap:
                yield members[b], members[a]

    def from_probabilities(self, shown: Sequence[int], probabilities: Sequence[float]) -> Any:
        return probabilities[0]

    def from_text(self, shown: Sequence[int], text: str, options: Any) -> Any:
        return parse_winner(text)

    def shares(self, shown: Sequence[int], verdict: Any) -> Iterable[tuple[int, float]]:
        return [(shown[0], verdict), (shown[1], 1.0 - verdict)]

    def judge_pairs(self, ask: Ask, pairs: Sequence[EvalPair], options: Any) -> PairVerdicts:
        """The better completion first and, with `swap`, second (without: first at even positions, so position bias
        cannot pass for accuracy); the preference is the mean over the orders, `(p_ij + 1 - p_ji) / 2`."""
        shown = []  # (pair, better shown first)
        for pair in pairs:
            shown += [(pair, True), (pair, False)] if options.swap else [(pair, pair.index % 2 == 0)]
        found = ask(
            [pair.context for pair, _ in shown],
            [(p.better, p.worse) if first else (p.worse, p.better) for p, first in shown],
        )
        per_pair = 2 if options.swap else 1
        preferences, orders = [], []
        for n in range(len(pairs)):
            order = []
            for k in range(per_pair):
                value = found.values[n * per_pair + k]
                first = shown[n * per_pair + k][1]
                order.append(None if value is None else value if first else 1.0 - value)
            known = [p for p in order if p is not None]
            preferences.append(sum(known) / len(known) if known else None)
            orders.append(order)
        return PairVerdicts(preferences, orders, {}, found)


@register_mode
class Listwise(JudgeMode):
    """Shows the whole group at once (`swap`: also reversed); each completion gets its standing (`logprobs`: its
    probability of being the best; `generate`: `(N - 1 - rank) / (N - 1)` of the ranking written)."""

    name = "listwise"
    template = T.LISTWISE
    fields = frozenset({"prompt", "completions", "count", "answer_format"})
    completion_fields = frozenset({"completions"})
    answer_formats = {
        "logprobs": "Reply with the number of the best answer alone (1 to {count}).",
        "generate": (
            "Explain your reasoning briefly, then end with a line ranking every answer from best to worst by number, "
            "e.g. `Ranking: 2 > 1 > 3`."
        ),
    }

    def labels(self, options: Any) -> list[str]:
        return [str(k) for k in range(1, MAX_LIST + 1)]

    def labels_shown(self, shown: Sequence[int], labels: Sequence[Any]) -> Sequence[Any]:
        return labels[: len(shown)]

    def fill(self, texts: Sequence[str], options: Any) -> dict[str, Any]:
        return {"completions": T.numbered(texts), "count": len(texts)}

    def judgements(self, members: Sequence[int], options: Any, what: str) -> Iterator[tuple[int, ...]]:
        if options.scoring == "logprobs" and len(members) > MAX_LIST:
            raise ValueError(
                f"{what}: a listwise judgement by logprobs ranks at most {MAX_LIST} answers (one verdict token each); "
                f"this group has {len(members)}. Use mode='pairwise' or scoring='generate'."
            )
        yield tuple(members)
        if options.swap:
            yield tuple(reversed(members))

    def from_probabilities(self, shown: Sequence[int], probabilities: Sequence[float]) -> Any:
        return list(probabilities)

    def from_text(self, shown: Sequence[int], text: str, options: Any) -> Any:
        n = len(shown)
        ranking = parse_ranking(text, n)
        if ranking is None:
            return None
        values = [0.0] * n
        for rank, position in enumerate(ranking):
            values[position] = (n - 1 - rank) / (n - 1)
        return values

    def shares(self, shown: Sequence[int], verdict: Any) -> Iterable[tuple[int, float]]:
        return list(zip(shown, verdict))


register_mode(GenRM)  # NeMo Gym's `genrm_compare` (`judges/genrm.py`)
