"""NeMo Gym's `genrm_compare` protocol, the pieces that need no model: what a pairwise generative reward model (GenRM)
is sent, how its verdict is read, which pairs of a group are compared, and how a group's comparisons become one
reward per sample. `rewards/shaping.py` holds the group adjustments that follow (bonuses, length, style).

- **Messages**: the prompt's messages unchanged, then optionally a `principle` message, then `response_1` and
  `response_2`, each a response's final answer (its reasoning left out; an empty answer is the string "None"). No
  instruction is added: the GenRM's chat template renders these roles.
- **Verdict**: `{"score_1": 1-5, "score_2": 1-5, "ranking": 1-6}` (ranking 1: response 1 much better, 6: response 2
  much better). The fenced ```json blocks are read first (the first valid object wins), else every top-level `{...}` of
  the text (the last valid one wins). An object is valid when it has at least one of the three keys (read inside
  `"overall"` when that key holds an object); a missing key is the default (3, 3, 3.5); values go through `float()`,
  and a value that is not a finite number makes the object invalid. The judge (`GenRM`) also holds the verdict to
  the protocol's ranges: one that writes a value outside them (`{"score_1": 100, "ranking": 42}`, from a broken GenRM
  or one talked into it by the policy's answer) is no verdict, asked again and then a failed judgement
  (`verdict_ranges="protocol"`, the default; `"any"` takes any finite value, as NeMo Gym's parser does, for a GenRM
  with other ranges). `parse_genrm_verdict` is Gym's parser and leaves ranges unchecked.
- **Pairs**: `circular` (i against i+1 mod N) or `all_pairs` (i < j).
- **Aggregation** into one reward per sample, the mean of what it received (`default_score` where it got nothing):
  `simple_tiebreaker` (equal scores are split by the ranking: d = 3.5 - ranking, score_1 + d, score_2 - d),
  `individual_scores` (the scores as given) or `weighted_win_loss` (points from the ranking, rounded half to even as
  NeMo RL rounds: 1, .75, .6, .4, .25, 0 for response 1 from ranking 1 to 6, the rest of 1 for response 2; NeMo RL's
  own gives the points of rankings 4 to 6 to response 2, the better one, so the loser scores higher there).

The cases of NeMo Gym's tests for these functions pass as written (tests/test_genrm.py), its newest included: a
non-finite value (NaN, Infinity) is no verdict.

`GenRM` is the judge mode (`JudgeEnvironment(mode="genrm")`) that asks a GenRM these comparisons in GRPO: its options
are `JudgeOptions`' GenRM keys (`comparison_strategy`, `judges_per_comparison`, `aggregator`, `principle`,
`principle_column`, `default_score`, `default_ranking`, `failed_judgement`, `verdict_ranges`).
"""

from __future__ import annotations

import itertools
import json
import logging
import math
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple

from ..data.messages import reasoning_and_answer, strip_reasoning_text
from .mode_base import Ask, EvalPair, JudgeMode, PairVerdicts

logger = logging.getLogger(__name__)
_warned_ranges: list[bool] = []  # the out-of-range warning, once per process

DEFAULT_SCORE = 3.0
DEFAULT_RANKING = 3.5  # no preference
EMPTY_ANSWER = "None"  # what the GenRM is shown for an empty answer
PAIR_STRATEGIES = ("circular", "all_pairs")
AGGREGATORS = ("simple_tiebreaker", "individual_scores", "weighted_win_loss")
FAILED_JUDGEMENTS = ("neutral", "masked")
WIN_POINTS = {1: 1.0, 2: 0.75, 3: 0.6, 4: 0.4, 5: 0.25, 6: 0.0}  # response 1's points by ranking
VERDICT_KEYS = ("score_1", "score_2", "ranking")
PROTOCOL_RANGES = {"score_1": (1.0, 5.0), "score_2": (1.0, 5.0), "ranking": (1.0, 6.0)}
VERDICT_RANGES = ("protocol", "any")
TIE_BAND = 0.5  # a ranking within this of the middle (3 to 4) says the two responses are equal
FENCED_JSON = re.compile(r"```json\s*([\s\S]*?)\s*```", re.I)

Verdict = tuple[float, float, float]


class GenRMVerdictError(ValueError):
    """A GenRM's text holds no valid verdict object."""


def genrm_messages(
    prompt: Sequence[Mapping[str, Any]], answer_1: str, answer_2: str, principle: str | None = None
) -> list[dict[str, Any]]:
    """The messages a GenRM is sent for one comparison: the prompt's, an optional `principle`, the two answers."""
    messages = [dict(m) for m in prompt]
    if principle is not None:
        messages.append({"role": "principle", "content": principle})
    for role, answer in (("response_1", answer_1), ("response_2", answer_2)):
        messages.append({"role": role, "content": answer if answer.strip() else EMPTY_ANSWER})
    return messages


def _objects(text: str) -> list[str]:
    """The top-level `{...}` spans of `text`, braces inside JSON strings ignored; a `{` that never closes is skipped
    and the scan goes on after it (an object inside it still counts)."""
    found, i = [], 0
    while i < len(text):
        end = _closing_brace(text, i) if text[i] == "{" else None
        if end is not None:
            found.append(text[i : end + 1])
            i = end
        i += 1
    return found


def _closing_brace(text: str, start: int) -> int | None:
    """The index of the `}` that closes the `{` at `start`, or None."""
    depth, in_string, escaped = 0, False, False
    for i in range(start, len(text)):
        ch = text[i]
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return i
    return None


def _written(candidate: str) -> dict[str, float] | None:
    """The values a verdict object writes (its keys of `VERDICT_KEYS`, read inside `"overall"` when that holds an
    object), or None when `candidate` is no verdict object: not JSON, none of the keys, or a value that is not a finite
    number."""
    try:
        value = json.loads(candidate)
    except json.JSONDecodeError:
        return None
    if isinstance(value, dict) and isinstance(value.get("overall"), dict):
        value = value["overall"]
    if not isinstance(value, dict) or not any(key in value for key in VERDICT_KEYS):
        return None
    try:
        written = {key: float(value[key]) for key in VERDICT_KEYS if key in value}
    except (TypeError, ValueError):
        return None
    return written if all(math.isfinite(v) for v in written.values()) else None


def written_verdicts(text: str) -> list[tuple[str, dict[str, float]]]:
    """Every valid verdict object of `text`, in order: its source text and what it writes."""
    return [(candidate, written) for candidate in _objects(text) if (written := _written(candidate)) is not None]


def written_verdict(text: str) -> dict[str, float] | None:
    """What the verdict object of a GenRM's answer writes, chosen as NeMo Gym chooses it (the first valid object of
    the fenced ```json blocks, else the last valid top-level object), or None when it holds none."""
    for block in FENCED_JSON.finditer(text):
        for candidate in _objects(block.group(1)):
            if (written := _written(candidate)) is not None:
                return written
    valid = written_verdicts(text)
    return valid[-1][1] if valid else None


def verdict_of(written: Mapping[str, float], default_score: float, default_ranking: float) -> Verdict:
    """`(score_1, score_2, ranking)` of a written verdict, a missing key its default."""
    defaults = (default_score, default_score, default_ranking)
    return tuple(written.get(key, default) for key, default in zip(VERDICT_KEYS, defaults))  # type: ignore[return-value]


def out_of_range(written: Mapping[str, float]) -> dict[str, float]:
    """The written values outside the protocol's ranges (`score_1`, `score_2` in 1-5, `ranking` in 1-6)."""
    return {key: v for key, v in written.items() if not PROTOCOL_RANGES[key][0] <= v <= PROTOCOL_RANGES[key][1]}


def parse_genrm_verdict(
    text: str,
    default_score: float = DEFAULT_SCORE,
    default_ranking: float = DEFAULT_RANKING,
    *,
    raise_on_fail: bool = False,
) -> Verdict:
    """`(score_1, score_2, ranking)` read from a GenRM's answer (see the module docstring), NeMo Gym's
    `parse_genrm_output`: any finite values, the protocol's ranges unchecked (the `GenRM` judge checks them); the
    defaults where it holds no valid verdict.

    Raises:
        GenRMVerdictError: no valid verdict, with `raise_on_fail`.
    """
    written = written_verdict(text)
    if written is not None:
        return verdict_of(written, default_score, default_ranking)
    if raise_on_fail:
        preview = text if len(text) <= 200 else text[:200] + "..."
        raise GenRMVerdictError(f"no verdict object {{{', '.join(VERDICT_KEYS)}}} in the GenRM's answer: {preview!r}")
    return default_score, default_score, default_ranking


def comparison_pairs(strategy: str, n: int) -> list[tuple[int, int]]:
    """The pairs `(i, j)` of a group of `n` to compare, `i` shown as response 1.

    Raises:
        ValueError: an unknown strategy, or fewer than 2 samples.
    """
    if strategy not in PAIR_STRATEGIES:
        raise ValueError(f"Unknown comparison strategy {strategy!r}; choose one of {', '.join(PAIR_STRATEGIES)}")
    if n < 2:
        raise ValueError(f"Need at least 2 responses to compare, got {n}")
    if strategy == "all_pairs":
        return list(itertools.combinations(range(n), 2))
    return [(i, (i + 1) % n) for i in range(n)]


def received(verdict: Verdict, method: str) -> tuple[float, float]:
    """What response 1 and response 2 each receive from one comparison, by aggregator (see the module docstring)."""
    score_1, score_2, ranking = verdict
    if method == "weighted_win_loss":
        score_1 = WIN_POINTS.get(min(6, max(1, round(ranking))), 0.5)
        return score_1, 1.0 - score_1
    if method == "simple_tiebreaker" and score_1 == score_2:
        shift = DEFAULT_RANKING - ranking
        return score_1 + shift, score_2 - shift
    return score_1, score_2


def aggregate_verdicts(
    verdicts: Sequence[Verdict],
    pairs: Sequence[tuple[int, int]],
    n: int,
    method: str = "simple_tiebreaker",
    default_score: float = DEFAULT_SCORE,
) -> tuple[list[float], float]:
    """One reward per sample of a group of `n` from its comparisons (`verdicts[k]` judged `pairs[k]`; a pair judged
    k times appears k times), and the share of comparisons whose scores tied (what the tie-breaker split).

    Raises:
        ValueError: an unknown method, or verdicts and pairs of different lengths.
    """
    if method not in AGGREGATORS:
        raise ValueError(f"Unknown aggregator {method!r}; choose one of {', '.join(AGGREGATORS)}")
    if len(verdicts) != len(pairs):
        raise ValueError(f"one verdict per compared pair: {len(verdicts)} verdicts, {len(pairs)} pairs")
    totals, counts, ties = [0.0] * n, [0] * n, 0
    for verdict, (i, j) in zip(verdicts, pairs):
        ties += verdict[0] == verdict[1]
        score_1, score_2 = received(verdict, method)
        totals[i] += score_1
        totals[j] += score_2
        counts[i] += 1
        counts[j] += 1
    rewards = [total / count if count else default_score for total, count in zip(totals, counts)]
    return rewards, ties / len(verdicts) if verdicts else 0.0


def _in_both_orders(ask: Any, pairs: Sequence[Any], copies: int) -> tuple[list[tuple[int, bool]], Any]:
    """Every evaluation pair asked in both orders, `better` first and then second, `copies` times each: the
    judgements as `(pair index, better shown first)`, and what `ask` found for them."""
    shown = [(n, first) for n in range(len(pairs)) for first in (True, False) for _ in range(copies)]
    found = ask(
        [pairs[n].context for n, _ in shown],
        [(pairs[n].better, pairs[n].worse) if first else (pairs[n].worse, pairs[n].better) for n, first in shown],
    )
    return shown, found


class Comparison(NamedTuple):
    """One GenRM verdict: the scores and ranking it wrote, and what each shown response receives (`received`)."""

    score_1: float
    score_2: float
    ranking: float
    value_1: float
    value_2: float


class GenRM(JudgeMode):
    """NeMo Gym's `genrm_compare`: the pairs of a group (`comparison_strategy`, each `judges_per_comparison` times)
    shown to a pairwise GenRM as the protocol's messages (each completion's final answer, its reasoning and tool calls
    left out: `data.messages.reasoning_and_answer`); its JSON verdict read from what it writes; each completion
    gets the mean of what it received (`aggregator`), `default_score` alone in its group; a verdict outside the
    protocol's ranges is none (`verdict_ranges`); a judgement without a verdict after the retries (or whose request
    failed) counts as `(default_score, default_score, default_ranking)` (`failed_judgement="neutral"`) or masks its
    samples' rewards (`"masked"`)."""

    name = "genrm"
    template = ""
    fields = frozenset()
    completion_fields = frozenset()
    answer_formats: Mapping[str, str] = {}
    neutral = 0.0
    shows = 2
    scorings = ("generate",)
    templated = False
    own_options = frozenset({"comparison_strategy", "judges_per_comparison", "aggregator", "principle",
                             "principle_column", "default_score", "default_ranking", "failed_judgement",
                             "verdict_ranges"})  # fmt: skip
    refuses = frozenset({"pairs", "swap", "max_score", "single_reward", "unparsed_reward"})  # Gym's own keys instead

    def labels(self, options: Any) -> list[str]:
        return []  # read from text only

    def fill(self, texts: Sequence[str], options: Any) -> dict[str, Any]:
        return {}

    def messages(
        self, context: Any, texts: Sequence[str], options: Any, row: Mapping[str, Any]
    ) -> list[dict[str, Any]]:
        prompt = [{"role": "user", "content": context}] if isinstance(context, str) else context
        principle = row.get(options.principle_column) if options.principle_column else None
        return genrm_messages(prompt, *texts, principle=options.principle if principle is None else principle)

    def columns(self, options: Any, template: str) -> list[str]:
        return [options.principle_column] if options.principle_column else []

    def optional_columns(self, options: Any) -> list[str]:
        return self.columns(options, "") if options.principle is not None else []  # None: the default principle

    def shown_text(self, completion: Any, strip_reasoning: bool) -> str:
        return reasoning_and_answer(completion)[1]

    def judgements(self, members: Sequence[int], options: Any, what: str) -> Iterator[tuple[int, ...]]:
        for i, j in comparison_pairs(options.comparison_strategy, len(members)):
            for _ in range(options.judges_per_comparison):
                yield members[i], members[j]

    def from_probabilities(self, shown: Sequence[int], probabilities: Sequence[float]) -> Any:
        raise NotImplementedError("a GenRM's verdict is read from its text")

    def from_text(self, shown: Sequence[int], text: str, options: Any) -> Comparison | None:
        written = written_verdict(strip_reasoning_text(text))
        if written is None:
            return None
        outside = out_of_range(written) if options.verdict_ranges == "protocol" else {}
        if outside:  # a broken GenRM, or one talked into it by a policy's answer: no verdict (asked again, then failed)
            if not _warned_ranges:
                _warned_ranges.append(True)
                logger.warning(
                    "a GenRM verdict wrote %s, outside the genrm_compare ranges (scores 1-5, ranking 1-6): it is no "
                    "verdict (asked again, then a failed judgement, counted in judge_env/num_failed). A GenRM with "
                    "other ranges: verdict_ranges='any'. Warned once.",
                    ", ".join(f"{key}={value:g}" for key, value in outside.items()),
                )
            return None
        verdict = verdict_of(written, options.default_score, options.default_ranking)
        return Comparison(*verdict, *received(verdict, options.aggregator))

    def failed_verdict(self, options: Any) -> Comparison | None:
        if options.failed_judgement != "neutral":
            return None
        verdict = (options.default_score, options.default_score, options.default_ranking)
        return Comparison(*verdict, *received(verdict, options.aggregator))

    def lone_reward(self, options: Any) -> float:
        return float(options.default_score)

    def shares(self, shown: Sequence[int], verdict: Comparison) -> Iterable[tuple[int, float]]:
        return [(shown[0], verdict.value_1), (shown[1], verdict.value_2)]

    def check_tokenizer(self, tokenizer: Any, options: Any, template_kwargs: Mapping[str, Any]) -> None:
        """The GenRM's chat template must render the protocol's roles with their text (a probe comparison).

        Raises:
            ValueError: the template fails on them, or drops a message's text, naming the role.
        """
        row = {options.principle_column: "PROBE-PRINCIPLE"} if options.principle_column else {}
        principle = "PROBE-PRINCIPLE" if options.principle is not None or row else None
        probe = self.messages("PROBE-PROMPT", ["PROBE-RESPONSE-1", "PROBE-RESPONSE-2"], options, row)
        if principle is not None:
            probe = [m if m["role"] != "principle" else {**m, "content": principle} for m in probe]
        try:
            text = tokenizer.apply_chat_template(probe, tokenize=False, add_generation_prompt=True, **template_kwargs)
        except Exception as err:  # a template that raises on an unknown role (Jinja's raise_exception)
            roles = [m["role"] for m in probe]
            raise ValueError(
                f"the GenRM's chat template cannot render the genrm_compare roles {roles}: {err}. A GenRM's template "
                "reads `response_1` and `response_2` (and `principle` when one is sent)"
            ) from err
        dropped = [m["role"] for m in probe if m["content"] not in text]
        if dropped:
            raise ValueError(
                f"the GenRM's chat template drops the text of the role(s) {dropped}: it does not read the "
                "genrm_compare roles (`response_1`, `response_2`, `principle`); use the GenRM's own tokenizer"
                + (", or no principle" if "principle" in dropped else "")
            )

    def judge_pairs(self, ask: Ask, pairs: Sequence[EvalPair], options: Any) -> PairVerdicts:
        """Each pair shown in both orders, the better answer first and then second (`judges_per_comparison` times
        each): its preference in an order is what the better one received minus what the worse one received (the
        mean over the judges with a verdict; `neutral` 0 is a tie), its preference the mean over the orders with a
        verdict, and position consistency reads the two orders."""
        shown, found = _in_both_orders(ask, pairs, options.judges_per_comparison)
        received_by: list[tuple[list[float], list[float]]] = [([], []) for _ in pairs]
        for (n, first), verdict in zip(shown, found.values):
            if verdict is not None:
                better, worse = (verdict.value_1, verdict.value_2) if first else (verdict.value_2, verdict.value_1)
                received_by[n][0 if first else 1].append(better - worse)
        orders = [[sum(v) / len(v) if v else None for v in both] for both in received_by]
        preferences = [
            sum(known) / len(known) if (known := [p for p in order if p is not None]) else None for order in orders
        ]
        return PairVerdicts(preferences, orders, {}, found)

    def judge_ties(self, ask: Ask, pairs: Sequence[EvalPair], options: Any) -> list[bool]:
        """Each tied pair shown in both orders: a tie when every verdict's ranking is within `TIE_BAND` of the
        middle (3 to 4, the rankings the GenRM's agreement reward gives full credit for a tie); a judgement without a
        verdict is no tie."""
        shown, found = _in_both_orders(ask, pairs, 1)
        tie = [True] * len(pairs)
        for (n, _), verdict in zip(shown, found.values):
            tie[n] = tie[n] and verdict is not None and abs(verdict.ranking - DEFAULT_RANKING) <= TIE_BAND
        return tie

    def metrics(self, verdicts: Sequence[Any]) -> dict[str, float]:
        """`tiebreak_rate`: the share of the call's comparisons whose two scores were equal."""
        found = [v for v in verdicts if v is not None]
        return {"tiebreak_rate": sum(v.score_1 == v.score_2 for v in found) / len(found)} if found else {}
