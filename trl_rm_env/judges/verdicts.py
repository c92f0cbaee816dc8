"""Verdicts: the tokens a `logprobs` judge is read on, and how a `generate` judge's text is parsed.

`logprobs`: the judge's next-token distribution at the first generated position, over the single tokens of the
verdicts (`1..max_score`; `A`, `B`; `1..N`), renormalized over them. The mass they held (`rating_mass`) says how
well the template steers the judge: a low mass means its first token is mostly something else.

`generate`: the last verdict in the text once `<think>...</think>` is removed: `Score: k` (or `[[k]]`, or JSON
`{"score": k}`); `[[A]]` / `[[B]]`; `Ranking: 2 > 1 > 3` (or a JSON list). Anything else is unparsed (None).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence

from ..data.messages import strip_reasoning_text


def label_token_ids(tokenizer, labels: Sequence[str], what: str) -> list[int]:
    """The token id of each label, as the judge would write it first in its answer.

    Raises:
        ValueError: a label that is not exactly one token of `tokenizer`, naming it.
    """
    ids = []
    for label in labels:
        encoded = tokenizer.encode(label, add_special_tokens=False)
        if len(encoded) != 1:  # SentencePiece prepends a word boundary ("▁1"): the bare token may still exist
            bare = tokenizer.convert_tokens_to_ids(label)
            if isinstance(bare, int) and bare != tokenizer.unk_token_id:
                encoded = [bare]
        if len(encoded) != 1:
            raise ValueError(
                f"{what}: the verdict {label!r} is {len(encoded)} tokens in the judge's tokenizer {encoded}; scoring="
                "'logprobs' reads each verdict as one token (lower max_score, or use scoring='generate')"
            )
        ids.append(int(encoded[0]))
    if len(set(ids)) != len(ids):
        raise ValueError(f"{what}: two verdicts {list(labels)} share a token in the judge's tokenizer")
    return ids


def distribution(logprobs: Sequence[float]) -> tuple[list[float], float]:
    """`(probabilities renormalized over the labels, the mass they held)` from their full-vocabulary logprobs."""
    probs = [math.exp(lp) if lp is not None and math.isfinite(lp) else 0.0 for lp in logprobs]
    mass = sum(probs)
    if mass <= 0:
        return [1.0 / len(probs)] * len(probs), 0.0
    return [p / mass for p in probs], mass


_SCORE = re.compile(
    r'(?i)\bscore\s*[:=]\s*\**\s*(\d+(?:\.\d+)?)|\[\[\s*(\d+(?:\.\d+)?)\s*\]\]|"score"\s*:\s*(\d+(?:\.\d+)?)'
)
_WINNER = re.compile(r"\[\[\s*([AB])\s*\]\]")
_RANKING = re.compile(r"(?i)ranking\s*[:=]\s*\**\s*(\[?\s*\d+(?:\s*(?:>|,)\s*\d+)*\s*\]?)")


def _last(pattern: re.Pattern, text: str) -> re.Match | None:
    matches = list(pattern.finditer(text))
    return matches[-1] if matches else None


def parse_score(text: str, max_score: int) -> float | None:
    """The last `Score: k` (or `[[k]]`, or `"score": k`) of `text` in `1..max_score`, else None."""
    text = strip_reasoning_text(text)
    found = _last(_SCORE, text)
    if found is None:
        return None
    value = float(next(g for g in found.groups() if g is not None))
    return value if 1 <= value <= max_score else None


def parse_winner(text: str) -> float | None:
    """The preference for A of the last `[[A]]` / `[[B]]` in `text` (1.0 or 0.0), else None."""
    found = _last(_WINNER, strip_reasoning_text(text))
    return None if found is None else float(found.group(1) == "A")


def parse_ranking(text: str, count: int) -> list[int] | None:
    """The last ranking of `text` as 0-based positions from best to worst, when it is a permutation of 1..count."""
    text = strip_reasoning_text(text)
    found = _last(_RANKING, text)
    numbers = [int(n) for n in re.findall(r"\d+", found.group(1))] if found else None
    if numbers is None:
        tail = text[text.rfind("[") :] if "[" in text else ""
        try:
            value = json.loads(tail[: tail.find("]") + 1]) if tail else None
        except ValueError:
            value = None
        numbers = value if isinstance(value, list) and all(isinstance(n, int) for n in value) else None
    if numbers is None or sorted(numbers) != list(range(1, count + 1)):
        return None
    return [n - 1 for n in numbers]
