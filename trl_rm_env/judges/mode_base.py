"""The base of every judge mode (`JudgeMode`) and what a mode hands `trl-rm-env eval` (`EvalPair`, `PairVerdicts`).
The built-in modes and their registry are `builtin_modes.py`."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from ..data.messages import strip_completion_reasoning
from . import templates as T


@dataclass(frozen=True)
class EvalPair:
    """One strictly ordered preference pair to judge in evaluation: its context, the better and the worse completion,
    a key for each completion (a completion in several pairs is the same item), and its position among all pairs
    (which decides its order when the judge shows one order only)."""

    context: Any
    better: Any
    worse: Any
    better_key: Any
    worse_key: Any
    index: int


@dataclass
class PairVerdicts:
    """A mode's verdicts on preference pairs: each pair's preference for the better completion (None: no verdict;
    `neutral` is a tie), its preference in each order shown (for position consistency; None when the mode shows one),
    each rated item's own value by key (modes that judge a completion alone), and the judge's `JudgeVerdicts`."""

    preferences: list[float | None]
    orders: list[list[float | None]] | None
    ratings: dict[Any, float | None]
    found: Any


Ask = Callable[[Sequence[Any], Sequence[Sequence[Any]]], Any]
"""`ask(contexts, shown)`: one judgement per item, showing `shown[k]`'s completions in that order for `contexts[k]`;
returns the judge's `JudgeVerdicts` (one verdict per item, in the mode's verdict format)."""


class JudgeMode:
    """How a judge judges: subclass it for a new mode (class attributes and the methods below), and register it.

    Class attributes: `name`; `template` (the built-in prompt); `fields` (the template fields the mode fills; any
    other field is a dataset column); `completion_fields` (those a template must contain, or the judge would not see
    what it judges); `answer_formats` (`{answer_format}` by scoring: `logprobs`, `generate`); `compares` (the mode
    judges a group's completions together: a completion alone in its group gets `single_reward`); `neutral` (the
    preference of a pair that is a tie in evaluation); `shows` (completions per judgement; None: any number).
    """

    name: ClassVar[str]
    template: ClassVar[str]
    fields: ClassVar[frozenset[str]]
    completion_fields: ClassVar[frozenset[str]]
    answer_formats: ClassVar[Mapping[str, str]]
    compares: ClassVar[bool] = True
    neutral: ClassVar[float] = 0.0
    shows: ClassVar[int | None] = None
    scorings: ClassVar[tuple[str, ...]] = ("logprobs", "generate")  # what it can read; the first is its default
    own_options: ClassVar[frozenset[str]] = frozenset()  # `JudgeOptions` that this mode alone reads
    refuses: ClassVar[frozenset[str]] = frozenset()  # other modes' `JudgeOptions` that this one cannot apply
    templated: ClassVar[bool] = True  # False: the mode writes the judge's messages itself (`messages`)

    def labels(self, options: Any) -> list[str]:
        """The verdicts a `logprobs` judge is read on, each one token of the judge's tokenizer."""
        raise NotImplementedError

    def fill(self, texts: Sequence[str], options: Any) -> dict[str, Any]:
        """The template fields (of `fields`, but `prompt` and `answer_format`) of a judgement showing `texts`."""
        raise NotImplementedError

    def judgements(self, members: Sequence[int], options: Any, what: str) -> Iterator[tuple[int, ...]]:
        """The judgements of a group of samples (more than one when `compares`), each as the samples it shows, in
        that order."""
        raise NotImplementedError

    def from_probabilities(self, shown: Sequence[int], probabilities: Sequence[float]) -> Any:
        """A verdict from the verdict tokens' probabilities (renormalized over `labels`)."""
        raise NotImplementedError

    def from_text(self, shown: Sequence[int], text: str, options: Any) -> Any:
        """A verdict parsed from the judge's text, or None."""
        raise NotImplementedError

    def shares(self, shown: Sequence[int], verdict: Any) -> Iterable[tuple[int, float]]:
        """Each shown sample's share of a verdict: its reward from this judgement (a sample's reward is the mean of
        its shares)."""
        raise NotImplementedError

    # ------------------------------------------------------------------ shared by every mode (a mode may override)
    def messages(
        self, context: Any, texts: Sequence[str], options: Any, row: Mapping[str, Any]
    ) -> list[dict[str, Any]] | None:
        """The judge's messages for a judgement showing `texts` (`row`: the dataset columns the mode reads, this
        sample's values); None: the template is filled (`fill`) and sent as one user message."""
        return None

    def columns(self, options: Any, template: str) -> list[str]:
        """The dataset columns a judgement reads: the template's own fields (`templates.check_template`)."""
        return sorted(T.check_template(template, self))

    def optional_columns(self, options: Any) -> list[str]:
        """The columns whose None the mode fills in itself (none: a None is an error naming the samples)."""
        return []

    def shown_text(self, completion: Any, strip_reasoning: bool) -> str:
        """What the judge is shown of a completion: its text (`templates.completion_text`), reasoning stripped
        with `strip_reasoning`."""
        return T.completion_text(strip_completion_reasoning(completion) if strip_reasoning else completion)

    def lone_reward(self, options: Any) -> float:
        """The reward of a completion alone in its group (nothing to compare it with)."""
        return float(options.single_reward)

    def failed_verdict(self, options: Any) -> Any:
        """The verdict of a judgement none could be read from (after the retries); None: it has none."""
        return None

    def check_tokenizer(self, tokenizer: Any, options: Any, template_kwargs: Mapping[str, Any]) -> None:
        """Refuse, at construction, a judge tokenizer that cannot render this mode's judgements (nothing to check for
        a templated mode: one user message)."""

    def metrics(self, verdicts: Sequence[Any]) -> dict[str, float]:
        """The mode's own metrics of a call's verdicts (logged under `judge_env/`)."""
        return {}

    def answer_format(self, scoring: str, **values: Any) -> str:
        """`{answer_format}`: what the judge is told to answer."""
        return self.answer_formats[scoring].format(**values)

    def labels_shown(self, shown: Sequence[int], labels: Sequence[Any]) -> Sequence[Any]:
        """The labels that apply to a judgement showing `shown` (all of them, but for a list of fewer than 9)."""
        return labels

    def judge_ties(self, ask: Ask, pairs: Sequence[EvalPair], options: Any) -> list[bool] | None:
        """Whether the judge calls each pair of equally ranked completions (`better` and `worse` tied) a tie, for
        `eval`'s accuracy with ties; None: the mode has no verdict that means a tie."""
        return None

    def judge_pairs(self, ask: Ask, pairs: Sequence[EvalPair], options: Any) -> PairVerdicts:
        """Judge preference pairs for evaluation. By default each pair is a group of two, judged as GRPO judges a
        group (`judgements`, with the better completion first at even positions), and its preference is the better
        one's reward minus the worse one's (`neutral` 0)."""
        shown = []
        for pair in pairs:
            members = (0, 1) if pair.index % 2 == 0 else (1, 0)
            for order in self.judgements(members, options, "eval"):
                shown.append((pair, order))
        found = ask(
            [pair.context for pair, _ in shown],
            [[(pair.better, pair.worse)[k] for k in order] for pair, order in shown],
        )
        rewards: dict[int, list[list[float]]] = {}
        for (pair, order), verdict in zip(shown, found.values):
            shares = rewards.setdefault(pair.index, [[], []])
            if verdict is None:
                continue
            for k, value in self.shares(order, verdict):
                shares[k].append(value)
        preferences: list[float | None] = []
        for pair in pairs:
            better, worse = rewards.get(pair.index, [[], []])
            preferences.append(sum(better) / len(better) - sum(worse) / len(worse) if better and worse else None)
        return PairVerdicts(preferences, None, {}, found)
