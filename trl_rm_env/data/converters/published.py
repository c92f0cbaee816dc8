"""Converters for published human-judged preference sets: LLMBar, PandaLM's test set, Anthropic hh-rlhf.

Same contract as every converter (`common.py`): `(row, source, row_num, row_label) -> record | None`, `None` for a tie (the
loader counts and drops it), `DataValidationError` naming source, row and field for a row that cannot be read.
They are registered in the loader, so `load_rank_records(path, data_format="llmbar" | "pandalm" | "hh")` works::

    from trl_rm_env.data import load_rank_records

    records, report = load_rank_records("natural.json", data_format="llmbar")
    records, report = load_rank_records("testset-v1.json", data_format="pandalm")   # report.ties: no-majority rows
    records, report = load_rank_records("test.jsonl.gz", data_format="hh")

Formats:
- LLMBar (princeton-nlp/LLMBar, RewardBench's "Chat Hard"): `{"input", "output_1", "output_2", "label": 1 | 2}`;
  `label` names the better output. The MT-Bench human judgments LLMBar ships use the same shape.
- PandaLM test set (WeOpenML/PandaLM `data/testset-v1.json`): `{"instruction", "input", "response1",
  "response2", "annotator1", "annotator2", "annotator3"}`, each annotator 0 (tie), 1 or 2 (the better response).
  The majority label wins; a majority of 0, or three different labels, is a tie.
- hh-rlhf (anthropics/hh-rlhf): `{"chosen", "rejected"}`, whole transcripts `"\\n\\nHuman: ...\\n\\nAssistant: ..."`.
  The longest common prefix of turns is the context; what is left of each (the last assistant turn or turns) is its
  completion.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

from ..schema import DataValidationError
from .common import require_keys, string_field, two_way

# --- LLMBar (and LLMBar's copy of MT-Bench human judgments) ---


def llmbar_to_rank(row: Any, source: str, row_num: int | None, row_label: str = "row") -> dict[str, Any]:
    """Turn an LLMBar row into a two-completion rank record.

    Args:
        row: `{"input": str, "output_1": str, "output_2": str, "label": 1 | 2}`.
        source: Where it came from, used in errors.
        row_num: Its line or row number, used in errors.
        row_label: "line" or "row", the word used in errors.

    Returns:
        `{"context": [user: input], "completions": [output_1, output_2]}`, the labelled output with rank 0.

    Raises:
        DataValidationError: a missing key, a non-string field, or a label other than 1 or 2.
    """
    require_keys(row, ("input", "output_1", "output_2", "label"), source, row_num, row_label)
    prompt, first, second = (
        string_field(row, k, source, row_num, row_label) for k in ("input", "output_1", "output_2")
    )
    label = row["label"]
    if isinstance(label, bool) or label not in (1, 2):
        raise DataValidationError(
            source, row_num, "label", f"must be 1 (output_1 better) or 2 (output_2 better), got {label!r}", row_label
        )
    return two_way(prompt, first, second, int(label))


# --- PandaLM test set ---

PANDALM_ANNOTATORS = ("annotator1", "annotator2", "annotator3")


def pandalm_to_rank(row: Any, source: str, row_num: int | None, row_label: str = "row") -> dict[str, Any] | None:
    """Turn a PandaLM test-set row into a rank record by majority vote, or `None` for a tie.

    The user turn is the instruction, followed by a blank line and the input when there is one (PandaLM's own
    prompt puts them in separate sections). Each annotator says 1 (response1 better), 2 (response2 better) or
    0 (tie). A response stored as a JSON boolean (the published file has six `true` answers) is read as its text
    "True"/"False". The label at least two annotators give wins; when that label is 0, or all three differ, the row
    is a tie and is returned as `None` (the loader counts it in `report.ties`, as HelpSteer3's ties).

    Args:
        row: `{"instruction": str, "input": str, "response1": str, "response2": str, "annotator1..3": 0|1|2, ...}`.
        source: Where it came from, used in errors.
        row_num: Its line or row number, used in errors.
        row_label: "line" or "row", the word used in errors.

    Returns:
        `{"context", "completions": [response1, response2], "annotators": [a1, a2, a3], ["idx"], ["cmp_key"]}` or
        `None` for a tie.

    Raises:
        DataValidationError: a missing key, a non-string field, or an annotator label other than 0, 1, 2.
    """
    require_keys(row, ("instruction", "input", "response1", "response2", *PANDALM_ANNOTATORS), source, row_num, row_label)
    # The published file stores six one-word answers "True" as JSON booleans; read them back as the text they were.
    row = {**row, **{k: str(row[k]) for k in ("response1", "response2") if isinstance(row[k], bool)}}
    instruction, extra, first, second = (
        string_field(row, k, source, row_num, row_label) for k in ("instruction", "input", "response1", "response2")
    )
    votes = []
    for key in PANDALM_ANNOTATORS:
        vote = row[key]
        if isinstance(vote, bool) or vote not in (0, 1, 2):
            raise DataValidationError(
                source, row_num, key, f"must be 0 (tie), 1 or 2 (the better response), got {vote!r}", row_label
            )
        votes.append(int(vote))
    label, count = Counter(votes).most_common(1)[0]
    if count < 2 or label == 0:
        return None
    prompt = f"{instruction}\n\n{extra}" if extra.strip() else instruction
    metadata = {key: row[key] for key in ("idx", "cmp_key") if key in row}
    return {**two_way(prompt, first, second, label), **metadata, "annotators": votes}


# --- Anthropic hh-rlhf transcripts ---

_HH_TURN = re.compile(r"\n\n(Human|Assistant):")
_HH_ROLES = {"Human": "user", "Assistant": "assistant"}


def parse_hh_transcript(
    text: str, key: str, source: str, row_num: int | None, row_label: str = "row"
) -> list[dict[str, str]]:
    """Split an hh-rlhf transcript (`"\\n\\nHuman: ...\\n\\nAssistant: ..."`) into messages.

    Human turns become `user`, Assistant turns `assistant`; each content is stripped of surrounding whitespace.

    Raises:
        DataValidationError: text before the first turn marker, or no turn at all.
    """
    parts = _HH_TURN.split(text)
    if parts[0].strip():
        raise DataValidationError(
            source,
            row_num,
            key,
            f"text before the first turn: {parts[0][:40]!r}; a transcript starts with '\\n\\nHuman:'",
            row_label,
        )
    if len(parts) < 3:
        raise DataValidationError(
            source, row_num, key, "no '\\n\\nHuman:' or '\\n\\nAssistant:' turn found in the transcript", row_label
        )
    return [{"role": _HH_ROLES[parts[i]], "content": parts[i + 1].strip()} for i in range(1, len(parts), 2)]


def hh_to_rank(row: Any, source: str, row_num: int | None, row_label: str = "row") -> dict[str, Any] | None:
    """Turn an hh-rlhf row (two whole transcripts) into a two-completion rank record.

    Both transcripts are parsed into messages; their longest common prefix of turns is the context and the rest of
    each, which must be assistant turns only (normally the one last answer), is its completion: chosen rank 0,
    rejected rank 1. Identical transcripts carry no preference and are returned as `None` (a tie).

    Args:
        row: `{"chosen": str, "rejected": str}`.
        source: Where it came from, used in errors.
        row_num: Its line or row number, used in errors.
        row_label: "line" or "row", the word used in errors.

    Returns:
        `{"context": shared turns, "completions": [chosen rest (rank 0), rejected rest (rank 1)]}`, or `None`.

    Raises:
        DataValidationError: a missing key, a non-string transcript, text before the first turn, no shared opening
            turn, or transcripts that differ before their last assistant turn(s).
    """
    require_keys(row, ("chosen", "rejected"), source, row_num, row_label)
    chosen = parse_hh_transcript(
        string_field(row, "chosen", source, row_num, row_label), "chosen", source, row_num, row_label
    )
    rejected = parse_hh_transcript(
        string_field(row, "rejected", source, row_num, row_label), "rejected", source, row_num, row_label
    )
    if chosen == rejected:
        return None
    shared = 0
    while shared < min(len(chosen), len(rejected)) and chosen[shared] == rejected[shared]:
        shared += 1
    if shared == 0:
        raise DataValidationError(
            source, row_num, "chosen", "chosen and rejected share no opening turn, so there is no context", row_label
        )
    for key, messages in (("chosen", chosen), ("rejected", rejected)):
        rest = messages[shared:]
        if not rest:
            raise DataValidationError(
                source, row_num, key, f"nothing is left of {key} after the turns it shares with the other", row_label
            )
        if any(m["role"] != "assistant" for m in rest):
            raise DataValidationError(
                source,
                row_num,
                key,
                f"chosen and rejected differ at turn {shared + 1}, before their last assistant turn; only the final "
                "assistant answer may differ",
                row_label,
            )
    return {
        "context": chosen[:shared],
        "completions": [{"rank": 0, "completion": chosen[shared:]}, {"rank": 1, "completion": rejected[shared:]}],
    }
