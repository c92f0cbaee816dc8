"""Ranked preference records as the comparisons a GenRM is trained on: the prompts of `genrm_compare` (the messages
`genrm.genrm_messages` builds, the judge's own), the human preference of each, and the verdict a warm start teaches.

- **Pairs of a record**: every pair of completions with different ranks (the better one is the lower rank), or, with
  `pairs_per_record`, that many of them sampled per record (seeded); with `ties`, the pairs of equal rank too (a tie
  target). Records with fewer than two distinct ranks are invalid at loading (`on_invalid` skips and counts them).
- **Both orders**: each pair is two comparisons, its first completion shown as `response_1` and then as `response_2`,
  so a verdict that follows the position and not the answers is wrong half the time (position bias is trained away,
  not averaged away).
- **Columns** of a comparison (TRL passes them to the reward functions): `prompt` (the messages), `preference` (1:
  response 1 is better, 2: response 2, 0: a tie), `rank_1`, `rank_2` (the human ranks shown), `pair` (`record:i:j`,
  the same for both orders), `order` (0: the pair as listed, 1: swapped).
- **The warm start's verdict** (`target_verdict`): `{"score_1": 4, "score_2": 2, "ranking": 2}` when response 1 is
  better, `{"score_1": 2, "score_2": 4, "ranking": 5}` when response 2 is, `{"score_1": 3, "score_2": 3, "ranking":
  3.5}` for a tie (the protocol's own "no preference", so neither position is taught).
"""

from __future__ import annotations

import json
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..data.messages import reasoning_and_answer
from .genrm import genrm_messages

RESPONSE_1, RESPONSE_2, TIE = 1, 2, 0
"""The `preference` column: which response the human ranks prefer, or a tie."""
TARGET_VERDICTS = {
    RESPONSE_1: {"score_1": 4, "score_2": 2, "ranking": 2},
    RESPONSE_2: {"score_1": 2, "score_2": 4, "ranking": 5},
    TIE: {"score_1": 3, "score_2": 3, "ranking": 3.5},
}


def target_verdict(preference: int) -> str:
    """The verdict a warm start teaches for a comparison's `preference` (see the module docstring)."""
    return json.dumps(TARGET_VERDICTS[preference])


@dataclass
class ComparisonCounts:
    """What `genrm_comparisons` made of its records: `records`, `pairs` (strictly ordered pairs kept), `ties` (tied
    pairs kept), `comparisons` (rows: two per pair), `sampled_out` (pairs left out by `pairs_per_record`)."""

    records: int = 0
    pairs: int = 0
    ties: int = 0
    comparisons: int = 0
    sampled_out: int = 0
    by_preference: dict[int, int] = field(default_factory=lambda: {RESPONSE_1: 0, RESPONSE_2: 0, TIE: 0})


def record_pairs(
    ranks: Sequence[int], *, ties: bool = True, pairs_per_record: int | None = None, rng: random.Random | None = None
) -> tuple[list[tuple[int, int]], int]:
    """The pairs `(i, j)`, `i < j`, of a record's completions to compare (different ranks; equal ones too with
    `ties`), at most `pairs_per_record` of them sampled with `rng`; and how many were left out."""
    pairs = [(i, j) for i in range(len(ranks)) for j in range(i + 1, len(ranks)) if ties or ranks[i] != ranks[j]]
    if pairs_per_record is None or len(pairs) <= pairs_per_record:
        return pairs, 0
    kept = sorted((rng or random.Random(0)).sample(pairs, pairs_per_record))
    return kept, len(pairs) - len(kept)


def _preference(rank_1: int, rank_2: int) -> int:
    return TIE if rank_1 == rank_2 else RESPONSE_1 if rank_1 < rank_2 else RESPONSE_2


def genrm_comparisons(
    records: Sequence[Mapping[str, Any]],
    *,
    ties: bool = True,
    pairs_per_record: int | None = None,
    principle: str | None = None,
    principle_column: str | None = None,
    seed: int = 0,
    source: str = "<records>",
) -> tuple[list[dict[str, Any]], ComparisonCounts]:
    """The comparison rows of validated rank records (`data.loaders.load_rank_records`), both orders of each pair,
    and their counts (see the module docstring). A completion is shown as its final answer (its reasoning left out),
    as the `genrm` judge shows it; a principle is the record's `principle_column` value, else `principle`.

    Raises:
        ValueError: `pairs_per_record` below 1, or a record whose `principle_column` is not a string (naming the
            record) when no `principle` stands in for it.
    """
    if pairs_per_record is not None and pairs_per_record < 1:
        raise ValueError(f"pairs_per_record must be at least 1 (None: every pair), got {pairs_per_record}")
    rng = random.Random(seed)
    rows: list[dict[str, Any]] = []
    counts = ComparisonCounts(records=len(records))
    for r, record in enumerate(records):
        context = record["context"]
        prompt = [{"role": "user", "content": context}] if isinstance(context, str) else list(context)
        shown = principle
        if principle_column and record.get(principle_column) is not None:
            shown = record[principle_column]
            if not isinstance(shown, str):
                raise ValueError(
                    f"{source}: record {r}: {principle_column!r} must be a string (a principle), got "
                    f"{type(shown).__name__}"
                )
        completions = record["completions"]
        ranks = [c["rank"] for c in completions]
        answers = [reasoning_and_answer(c["completion"])[1] for c in completions]
        pairs, left = record_pairs(ranks, ties=ties, pairs_per_record=pairs_per_record, rng=rng)
        counts.sampled_out += left
        for i, j in pairs:
            counts.ties += ranks[i] == ranks[j]
            counts.pairs += ranks[i] != ranks[j]
            for order, (a, b) in enumerate(((i, j), (j, i))):
                preference = _preference(ranks[a], ranks[b])
                counts.by_preference[preference] += 1
                rows.append({
                    "prompt": genrm_messages(prompt, answers[a], answers[b], principle=shown),
                    "preference": preference, "rank_1": ranks[a], "rank_2": ranks[b], "pair": f"{r}:{i}:{j}",
                    "order": order,
                })  # fmt: skip
    counts.comparisons = len(rows)
    return rows, counts


def warm_start_rows(comparisons: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Prompt-completion rows for TRL's `SFTTrainer`: each comparison's prompt and its target verdict as the
    assistant's answer."""
    return [
        {"prompt": row["prompt"], "completion": [{"role": "assistant", "content": target_verdict(row["preference"])}]}
        for row in comparisons
    ]
