"""Group shaping: reward adjustments that read a whole GRPO group (NeMo Gym's `genrm_compare` adjustments).

Any reward of a group of N samples (a reward model's, a judge's, a GenRM's) can be shaped, in this order, each step
only when its coefficient is > 0:

1. **Top-performer bonuses.** The threshold is the `max(0, int(N * top_percentile) - 1)`-th best score (0-based,
   best first). The sample with the shortest non-empty reasoning (the first of equals) gets `reasoning_bonus` if its
   score reaches the threshold; then the sample with the shortest non-empty answer gets `answer_bonus` the same way
   (its score counted with a reasoning bonus it just got).
2. **Group length adjustment.** For lengths L (characters of the stripped text), w_k = 1 - (L_k - min L) /
   (max L - min L), minus the group's mean of w (all 0 when every length is equal): shorter is higher, the group's
   adjustments sum to 0. Reasoning and answer each with their coefficient.
3. **Style.** The answer's style density, (markdown headers + numbered and bulleted list items + bold spans + emoji) /
   characters, code blocks left out of both, weighted the same way (lower density higher) times the style coefficient.

A group of one is left as it is. The formulas and the order are NeMo Gym's (tests/test_genrm.py holds its cases).
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ..data.messages import reasoning_and_answer
from ..options import document, option

logger = logging.getLogger(__name__)
_warned_negative: set[str] = set()

CODE_BLOCK = re.compile(r"```[\s\S]*?```")
HEADER = re.compile(r"^#{1,6}\s", re.M)
ORDERED_ITEM = re.compile(r"^\s*\d+\.\s", re.M)
BULLET_ITEM = re.compile(r"^\s*[-*+]\s", re.M)
BOLD = re.compile(r"\*\*[^*\n]+\*\*|__[^_\n]+__")
# Emoji: single code points in the common emoji blocks (a ZWJ sequence counts each of its emoji). Gym's ranges, kept
# for parity: U+24C2..U+1F251 also holds the CJK ideographs, so Chinese or Japanese text counts as emoji-dense.
EMOJI = re.compile(
    "[\U0001f600-\U0001f64f\U0001f300-\U0001f5ff\U0001f680-\U0001f6ff\U0001f1e0-\U0001f1ff\u2702-\u27b0"
    "\u24c2-\U0001f251\U0001f900-\U0001f9ff\U0001fa00-\U0001fa6f\U0001fa70-\U0001faff\u2600-\u26ff\u2700-\u27bf]"
)


def style_counts(text: str) -> dict[str, int]:
    """Markdown headers (h1-h6), list items (numbered and bulleted), bold spans and emoji in `text`, code blocks
    left out."""
    text = CODE_BLOCK.sub("", text)
    return {
        "header_count": len(HEADER.findall(text)),
        "list_count": len(ORDERED_ITEM.findall(text)) + len(BULLET_ITEM.findall(text)),
        "bold_count": len(BOLD.findall(text)),
        "emoji_count": len(EMOJI.findall(text)),
    }


def style_density(text: str) -> float:
    """Style elements per character of `text` without its code blocks (stripped); 0 for nothing left."""
    text = CODE_BLOCK.sub("", text)
    length = len(text.strip())
    return sum(style_counts(text).values()) / length if length else 0.0


def centered_weights(values: Sequence[float]) -> list[float]:
    """1 for the smallest value, 0 for the largest, linear between, minus their mean (all 0 when all are equal)."""
    low, high = min(values), max(values)
    if low == high:
        return [0.0] * len(values)
    raw = [1.0 - (v - low) / (high - low) for v in values]
    mean = sum(raw) / len(raw)
    return [w - mean for w in raw]


@document
@dataclass(frozen=True)
class GroupShaping:
    """The adjustments of a group's rewards (see the module docstring), for any reward function of ours (its options
    by name: `RewardModelEnvironment(..., answer_length_coeff=0.35)`); every coefficient 0 (the default) is no
    shaping. The `Args` below are generated from the fields.

    Raises:
        ValueError: a negative coefficient or bonus, or `top_percentile` outside [0, 1].
    """

    reasoning_bonus: float = option(
        0.0,
        help="Added to the reward of the group's shortest non-empty reasoning when it is among the top rewards "
        "(NeMo Gym's `reasoning_bonus`).",
    )
    answer_bonus: float = option(
        0.0, help="The same for the shortest non-empty answer (NeMo Gym's `answer_bonus`)."
    )
    top_percentile: float = option(
        0.2,
        help="The share of a group counted as its top rewards for the bonuses (at least the best one; NeMo Gym's "
        "`top_percentile`).",
    )
    reasoning_length_coeff: float = option(
        0.0,
        help="Times each reasoning's centred length weight, shorter higher (NeMo Gym's "
        "`group_reasoning_length_penalty_coeff`).",
    )
    answer_length_coeff: float = option(
        0.0,
        help="The same for answers (NeMo Gym's `group_answer_length_penalty_coeff`).",
    )
    style_coeff: float = option(
        0.0,
        help="Times each answer's centred markdown-density weight, plainer higher (NeMo Gym's "
        "`group_style_penalty_coeff`).",
    )

    def __post_init__(self) -> None:
        for name in ("reasoning_bonus", "answer_bonus", "reasoning_length_coeff", "answer_length_coeff", "style_coeff"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if not 0 <= self.top_percentile <= 1:
            raise ValueError(f"top_percentile must be in [0, 1], got {self.top_percentile}")

    @property
    def active(self) -> bool:
        """Whether any adjustment applies."""
        return any(c > 0 for c in (self.reasoning_bonus, self.answer_bonus, self.reasoning_length_coeff,
                                   self.answer_length_coeff, self.style_coeff))  # fmt: skip

    def apply(
        self, scores: Sequence[float], reasonings: Sequence[str], answers: Sequence[str]
    ) -> tuple[list[float], list[float]]:
        """The group's shaped scores and each sample's total adjustment.

        Args:
            scores: One score per sample of the group.
            reasonings: Each sample's reasoning text ("" where it has none).
            answers: Each sample's final answer text.
        """
        if not len(scores) == len(reasonings) == len(answers):
            raise ValueError(f"one reasoning and one answer per score: {len(scores)}, {len(reasonings)}, {len(answers)}")
        shaped, adjustments = list(map(float, scores)), [0.0] * len(scores)
        if len(scores) < 2 or not self.active:
            return shaped, adjustments

        def add(index: int, amount: float) -> None:
            shaped[index] += amount
            adjustments[index] += amount

        reasoning_lengths = [len(r.strip()) for r in reasonings]
        answer_lengths = [len(a.strip()) for a in answers]
        threshold = sorted(shaped, reverse=True)[max(0, int(len(shaped) * self.top_percentile) - 1)]
        for bonus, lengths in ((self.reasoning_bonus, reasoning_lengths), (self.answer_bonus, answer_lengths)):
            candidates = [(length, i) for i, length in enumerate(lengths) if length > 0]
            if bonus > 0 and candidates:
                shortest = min(candidates)[1]
                if shaped[shortest] >= threshold:
                    add(shortest, bonus)
        if self.reasoning_length_coeff > 0 or self.answer_length_coeff > 0:
            for i, (w_r, w_a) in enumerate(zip(centered_weights(reasoning_lengths), centered_weights(answer_lengths))):
                add(i, w_r * self.reasoning_length_coeff + w_a * self.answer_length_coeff)
        if self.style_coeff > 0:
            for i, weight in enumerate(centered_weights([style_density(a) for a in answers])):
                add(i, weight * self.style_coeff)
        return shaped, adjustments

    def shape(self, rewards: torch.Tensor, prompts: Sequence[Any], completions: Sequence[Any]) -> torch.Tensor:
        """A call's rewards shaped group by group (the samples with equal prompts, TRL's GRPO groups); a NaN reward
        (no reward) is left out of its group."""
        groups: dict[str, list[int]] = {}
        for i, prompt in enumerate(prompts):
            if not torch.isnan(rewards[i]):
                groups.setdefault(json.dumps(prompt, sort_keys=True, default=str), []).append(i)
        out = rewards.clone()
        for members in groups.values():
            parts = [reasoning_and_answer(completions[i]) for i in members]
            shaped, _ = self.apply(
                [float(rewards[i]) for i in members], [r for r, _ in parts], [a for _, a in parts]
            )
            out[torch.tensor(members)] = torch.tensor(shaped, dtype=out.dtype)
        return out


@document
@dataclass(frozen=True)
class LengthShaping:
    """NeMo RL's GRPO reward shaping by response length (`grpo.reward_shaping`), for any reward function of ours, with
    its keys and formulas; applied to the rewards after normalization, before `clip`. The `Args` below are generated
    from the fields.

    - **Overlong buffer** (DAPO's): with `L` the completion's tokens, the reward gets `min(0, -(L - (max_response_length
      - overlong_buffer_length)) / overlong_buffer_length * overlong_buffer_penalty)`: nothing up to the buffer, then a
      linear penalty reaching `overlong_buffer_penalty` at `max_response_length`.
    - **Stop properly**: a truncated completion (its last token is not an `eos_token_id`: TRL's rule) gets its reward
      times `stop_properly_penalty_coef`.

    Lengths and truncation are read from TRL's `completion_ids`.

    Raises:
        ValueError: an overlong key without the other two, a stop-properly coefficient outside [0, 1] or without
            `eos_token_id`, or both kinds at once (NeMo RL ignores the overlong keys then: here that is refused).
    """

    overlong_buffer_length: int | None = option(
        None, help="DAPO's overlong buffer: the last tokens before `max_response_length` over which the penalty grows."
    )
    overlong_buffer_penalty: float | None = option(
        None, help="DAPO's overlong buffer: the penalty at `max_response_length` (>= 0)."
    )
    max_response_length: int | None = option(
        None, help="DAPO's overlong buffer: the longest completion (TRL's `max_completion_length`)."
    )
    stop_properly_penalty_coef: float | None = option(
        None,
        help="The factor (0-1) of a truncated completion's reward (NeMo RL's `stop_properly_penalty_coef`); needs "
        "`eos_token_id`.",
    )
    eos_token_id: int | list[int] | None = option(
        None,
        help="The policy's end-of-sequence token id(s) (TRL's `eos_token_ids`; add its pad id, which TRL also counts "
        "as a stop): a completion not ending with one was truncated.",
        text=list,
    )

    def __post_init__(self) -> None:
        overlong = (self.overlong_buffer_length, self.overlong_buffer_penalty, self.max_response_length)
        if any(v is not None for v in overlong) and not all(v is not None for v in overlong):
            raise ValueError(
                "overlong_buffer_length, overlong_buffer_penalty and max_response_length go together (DAPO's "
                f"overlong buffer), got {overlong}"
            )
        if self.overlong_buffer_length is not None and (
            self.overlong_buffer_length < 1
            or self.overlong_buffer_penalty < 0
            or self.max_response_length < self.overlong_buffer_length
        ):
            raise ValueError(
                "need overlong_buffer_length >= 1, overlong_buffer_penalty >= 0 and max_response_length >= "
                f"overlong_buffer_length, got {overlong}"
            )
        coef = self.stop_properly_penalty_coef
        if coef is not None and not 0 <= coef <= 1:
            raise ValueError(f"stop_properly_penalty_coef must be in [0, 1], got {coef}")
        if coef is not None and self.eos_token_id is None:
            raise ValueError("stop_properly_penalty_coef needs eos_token_id: the policy's end token(s) tell truncation")
        if coef is not None and self.overlong_buffer_length is not None:
            raise ValueError(
                "stop_properly_penalty_coef and the overlong buffer keys are two kinds of length shaping; NeMo RL "
                "applies the first and ignores the others: give one kind"
            )
        if self.eos_token_id is not None:
            object.__setattr__(self, "eos_token_id", _token_ids(self.eos_token_id))

    @property
    def active(self) -> bool:
        """Whether any shaping applies."""
        return self.overlong_buffer_length is not None or self.stop_properly_penalty_coef is not None

    def shape(self, rewards: torch.Tensor, completion_ids: Sequence[Sequence[int]] | None, what: str) -> torch.Tensor:
        """The rewards shaped (see the class docstring). NeMo RL's stop-properly penalty scales a reward: meant for
        rewards >= 0, it raises a negative one (warned once).

        Raises:
            ValueError: no `completion_ids` (TRL passes them to reward functions; `what` names the function).
        """
        if not self.active:
            return rewards
        if completion_ids is None or len(completion_ids) != len(rewards):
            raise ValueError(f"{what}: length shaping reads TRL's completion_ids (one list per completion); got none")
        out = rewards.clone()
        if self.stop_properly_penalty_coef is not None:
            ends = set(self.eos_token_id)
            truncated = [i for i, ids in enumerate(completion_ids) if not len(ids) or int(ids[-1]) not in ends]
            if any(out[i] < 0 for i in truncated) and what not in _warned_negative:
                _warned_negative.add(what)
                logger.warning(
                    "%s: stop_properly_penalty_coef scales the reward of a truncated completion, as NeMo RL does; a "
                    "negative reward (a reward model's score, a normalized reward) is raised by it. Use it with "
                    "rewards >= 0 (normalization='none', a judge's, a reference-bounded one). Warned once.",
                    what,
                )
            for i in truncated:
                out[i] = out[i] * self.stop_properly_penalty_coef
            return out
        expected = self.max_response_length - self.overlong_buffer_length
        for i, ids in enumerate(completion_ids):
            exceed = len(ids) - expected
            out[i] = out[i] + min(-exceed / self.overlong_buffer_length * self.overlong_buffer_penalty, 0.0)
        return out


def _token_ids(value: Any) -> list[int]:
    """Token ids from an id, a list of ids, or their digit strings (a command line's).

    Raises:
        ValueError: anything else (a token's text: give its id).
    """
    values = value if isinstance(value, list | tuple) else [value]
    out = []
    for v in values:
        if isinstance(v, bool) or not (isinstance(v, int) or (isinstance(v, str) and v.strip().isdigit())):
            raise ValueError(f"eos_token_id takes token ids (integers), got {value!r}: give the token's id")
        out.append(int(v))
    return out
