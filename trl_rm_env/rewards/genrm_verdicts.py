"""Rewards of a GenRM in training: TRL reward functions of the GenRM's own completions (its verdicts) on comparisons
with a known human preference (`judges.genrm_data.genrm_comparisons`: the `preference` column, 1, 2, or 0 for a tie).
Usable in any `GRPOTrainer` whose dataset has that column.

The verdict is read as the `genrm` judge reads it (`judges.genrm.written_verdict` on the text without its
`<think>` reasoning): the first valid object of the fenced ```json blocks, else the last valid `{...}`; a value
outside the protocol's ranges (scores 1-5, ranking 1-6) makes it no verdict, as the judge's default
`verdict_ranges="protocol"` does. A completion without a verdict gets 0 from every reward here, never an exception.

- **`VerdictAgreement`** (`genrm_agreement`), with `r` the written ranking (no ranking written: 0):
  response 1 preferred: `side = 1 if r < 3.5 else 0`; response 2 preferred: `side = 1 if r > 3.5 else 0`; a tie:
  `side = clip(1.5 - |r - 3.5|, 0, 1)` (1 for rankings 3 to 4, 0.5 for 2.5 and 4.5, 0 for 2 and 5 and beyond). With
  `margin_credit = c`, the reward is `(1 - c) side + c margin`, `margin` the score margin the verdict gives the
  preferred response, `clip((s_preferred - s_other) / 4, 0, 1)`, or for a tie `1 - |s_1 - s_2| / 4` (a missing score
  is the protocol's default 3).
- **`VerdictFormat`** (`genrm_format`): 1 when the text holds exactly one valid verdict object, writing all three
  keys, every value in range; else 0.
- **`ReasoningLength`** (`genrm_reasoning_length`): `-min(1, max(0, w - target) / target)`, `w` the words of the
  completion outside its verdict object(s): 0 within `target_words`, -1 at twice it and beyond.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..data.messages import strip_reasoning_text
from ..judges.genrm import (
    DEFAULT_RANKING,
    DEFAULT_SCORE,
    VERDICT_KEYS,
    out_of_range,
    written_verdict,
    written_verdicts,
)
from ..judges.genrm_data import RESPONSE_1, RESPONSE_2, TIE
from ..judges.templates import completion_text

PREFERENCE_COLUMN = "preference"
MARGIN_CREDIT = 0.25
"""The default share of the agreement reward given by the score margin: the `genrm` judge's default aggregator
(`simple_tiebreaker`) reads the scores first and the ranking only to split equal scores, so a GenRM rewarded on its
ranking alone lets its scores drift (on the CPU learning task: to equal scores everywhere, and its tied pairs from
"equal" to "response 1 is better"); this share keeps them with the human order."""
SCORE_SPAN = 4.0  # the width of the protocol's 1-5 scores


def verdict_text(completion: Any) -> str:
    """A GenRM completion's text without its `<think>` reasoning (a string, or the assistant messages TRL passes)."""
    return strip_reasoning_text(completion_text(completion))


def read_verdict(completion: Any) -> dict[str, float] | None:
    """What the verdict of a GenRM completion writes, as the `genrm` judge reads it; None when it holds no verdict or
    writes a value outside the protocol's ranges."""
    written = written_verdict(verdict_text(completion))
    return None if written is None or out_of_range(written) else written


def _preference(value: Any, i: int) -> int:
    if isinstance(value, bool) or value not in (RESPONSE_1, RESPONSE_2, TIE):
        raise ValueError(
            f"genrm rewards: sample {i}: {PREFERENCE_COLUMN!r} must be 1 (response 1 better), 2 (response 2) or 0 "
            f"(a tie), got {value!r}"
        )
    return int(value)


def agreement(written: dict[str, float] | None, preference: int, margin_credit: float = 0.0) -> float:
    """The agreement of one verdict with the human `preference` (see the module docstring)."""
    if written is None or "ranking" not in written:
        return 0.0
    ranking = written["ranking"]
    score_1, score_2 = (written.get(key, DEFAULT_SCORE) for key in VERDICT_KEYS[:2])
    if preference == TIE:
        side = min(1.0, max(0.0, 1.5 - abs(ranking - DEFAULT_RANKING)))
        margin = 1.0 - abs(score_1 - score_2) / SCORE_SPAN
    else:
        first = preference == RESPONSE_1
        side = float(ranking < DEFAULT_RANKING if first else ranking > DEFAULT_RANKING)
        gap = (score_1 - score_2) if first else (score_2 - score_1)
        margin = min(1.0, max(0.0, gap / SCORE_SPAN))
    return (1.0 - margin_credit) * side + margin_credit * margin


def well_formed(text: str) -> bool:
    """Exactly one valid verdict object in `text`, with all three keys, every value in range."""
    found = written_verdicts(text)
    return len(found) == 1 and set(found[0][1]) == set(VERDICT_KEYS) and not out_of_range(found[0][1])


def reasoning_words(text: str) -> int:
    """The words of a GenRM completion outside its verdict object(s), its `<think>` reasoning included."""
    for candidate, _ in written_verdicts(text):
        text = text.replace(candidate, " ")
    return len(text.split())


class VerdictAgreement:
    """TRL reward function: how well each verdict agrees with the human preference of its comparison (the dataset's
    `preference` column); see the module docstring for the formula.

    Args:
        margin_credit: Weight in [0, 1] of the score margin beside the side of the ranking (0: the side alone;
            default `MARGIN_CREDIT`).
        preference_column: The column holding the human preference.
    """

    __name__ = "genrm_agreement"

    def __init__(self, margin_credit: float = MARGIN_CREDIT, preference_column: str = PREFERENCE_COLUMN):
        if not (isinstance(margin_credit, (int, float)) and 0.0 <= margin_credit <= 1.0):
            raise ValueError(f"margin_credit must be a number in [0, 1], got {margin_credit!r}")
        self.margin_credit = float(margin_credit)
        self.preference_column = preference_column

    def __call__(self, prompts: Sequence[Any], completions: Sequence[Any], **kwargs: Any) -> list[float]:
        if self.preference_column not in kwargs:
            raise ValueError(
                f"genrm_agreement: the dataset has no {self.preference_column!r} column (the human preference of "
                "each comparison: trl_rm_env.judges.genrm_data.genrm_comparisons writes it)"
            )
        preferences = [_preference(p, i) for i, p in enumerate(kwargs[self.preference_column])]
        return [agreement(read_verdict(c), p, self.margin_credit) for c, p in zip(completions, preferences)]


class VerdictFormat:
    """TRL reward function: 1 for a completion holding exactly one verdict the `genrm` judge reads, all three keys
    written and in range; else 0."""

    __name__ = "genrm_format"

    def __call__(self, prompts: Sequence[Any], completions: Sequence[Any], **kwargs: Any) -> list[float]:
        return [float(well_formed(verdict_text(c))) for c in completions]


class ReasoningLength:
    """TRL reward function: 0 for a completion whose words outside its verdict are at most `target_words`, falling
    linearly to -1 at twice that (see the module docstring)."""

    __name__ = "genrm_reasoning_length"

    def __init__(self, target_words: int):
        if isinstance(target_words, bool) or not isinstance(target_words, int) or target_words < 1:
            raise ValueError(f"target_words must be a positive int, got {target_words!r}")
        self.target_words = target_words

    def __call__(self, prompts: Sequence[Any], completions: Sequence[Any], **kwargs: Any) -> list[float]:
        out = []
        for completion in completions:
            words = reasoning_words(completion_text(completion))
            out.append(-min(1.0, max(0.0, words - self.target_words) / self.target_words))
        return out

