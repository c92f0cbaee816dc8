"""The rank schema: every invalid class names file, line and field; valid records are normalised; pairs from ranks."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import pytest

from trl_rm_env.data import DataValidationError, iter_pairs, load_rank_records, validate_rank_record, validate_records


def msgs(text: str, role: str = "assistant") -> list[dict[str, str]]:
    return [{"role": role, "content": text}]


def record(*ranks: int, **extra) -> dict:
    return {
        "context": msgs("What is 2+2?", "user"),
        "completions": [{"rank": r, "completion": msgs(f"answer {i}")} for i, r in enumerate(ranks)],
        **extra,
    }


GOOD = record(0, 1)


def write_third_line(tmp_path: Path, bad) -> Path:
    """A .jsonl file whose third line is `bad` (as JSON), between valid records."""
    path = tmp_path / "prefs.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in (GOOD, GOOD, bad, GOOD)) + "\n")
    return path


def with_completions(completions) -> dict:
    return {"context": msgs("hi", "user"), "completions": completions}


def two(first, second=None) -> list[dict]:
    """Two completions, the first given, the second a valid rank-1 answer."""
    return [first, second or {"rank": 1, "completion": msgs("fine")}]


INVALID = [
    pytest.param(["not", "an", "object"], None, "a record must be a JSON object, got list", id="not-object"),
    pytest.param({"completions": GOOD["completions"]}, "context", "missing required field 'context'", id="no-context"),
    pytest.param({"context": "hi"}, "completions", "missing required field 'completions'", id="no-completions"),
    pytest.param(with_completions({"rank": 0}), "completions", "must be a list .* got dict", id="completions-dict"),
    pytest.param(with_completions(two({"rank": 0, "completion": msgs("a")})[:1]), "completions",
                 "needs at least 2 completions to rank, got 1", id="one-completion"),
    pytest.param(with_completions(two({"rank": "1", "completion": msgs("a")})), "completions[0].rank",
                 "rank must be an int, got str '1'", id="rank-str"),
    pytest.param(with_completions(two({"rank": True, "completion": msgs("a")})), "completions[0].rank",
                 "rank must be an int, got bool True", id="rank-bool"),
    pytest.param(with_completions(two({"rank": 0.5, "completion": msgs("a")})), "completions[0].rank",
                 "rank must be an int, got float 0.5", id="rank-float"),
    pytest.param(with_completions(two({"completion": msgs("a")})), "completions[0].rank", "missing 'rank'",
                 id="rank-missing"),
    pytest.param(record(2, 2, 2), "completions", "all ranks are equal", id="all-ties"),
    pytest.param(with_completions(two({"rank": 0, "completion": [{"content": "a"}]})),
                 "completions[0].completion[0].role", "message has no 'role'", id="no-role"),
    pytest.param({"context": [{"role": "user"}], "completions": GOOD["completions"]}, "context[0].content",
                 "message has no 'content'", id="no-content"),
    pytest.param(with_completions(two({"rank": 0, "completion": [{"role": "assistant", "content": 7}]})),
                 "completions[0].completion[0].content", "content must be a string, got int", id="content-int"),
    pytest.param(with_completions(two({"rank": 0, "completion": []})), "completions[0].completion",
                 "empty completion", id="empty-list"),
    pytest.param(with_completions(two({"rank": 0, "completion": msgs(" \n\t")})), "completions[0].completion",
                 "empty completion", id="whitespace-content"),
    pytest.param({"context": "hi", "completions": [{"rank": 0, "completion": "a"}, {"rank": 1, "completion": "  "}]},
                 "completions[1].completion", "empty completion", id="whitespace-plain"),
    pytest.param({"context": "hi", "completions": [{"rank": 0, "completion": msgs("a")}, {"rank": 1, "completion": "b"}]},
                 "completions[0].completion", "context is plain text, so the completion must be a string too",
                 id="plain-context-message-completion"),
    pytest.param({"context": "hi", "completions": [{"rank": 0}, {"rank": 1, "completion": "b"}]},
                 "completions[0].completion", "missing 'completion'", id="no-completion-key"),
]  # fmt: skip


@pytest.mark.parametrize(("bad", "field", "reason"), INVALID)
def test_invalid_record_names_file_line_and_field(tmp_path, bad, field, reason):
    path = write_third_line(tmp_path, bad)
    where = "prefs.jsonl, line 3" + (f", field '{field}'" if field else "")
    with pytest.raises(DataValidationError, match=re.escape(f"{where}: ") + reason) as info:
        load_rank_records(str(path))
    assert (info.value.row, info.value.field) == (3, field)


def test_validate_rank_record_normalises_messages_and_keeps_metadata():
    raw = record(1, 0, task="2+2", score=0.5)
    raw["completions"][0]["completion"][0]["weight"] = 3  # unknown message keys are dropped
    raw["completions"][0]["completion"][0]["name"] = "bot"  # name, tool_calls, tool_call_id are kept
    raw["completions"][1]["completion"][0]["name"] = None  # ... unless None (what Arrow fills in)
    out = validate_rank_record(raw, "mem", 0, "row")
    assert out == {
        "context": [{"role": "user", "content": "What is 2+2?"}],
        "completions": [
            {"rank": 1, "completion": [{"role": "assistant", "content": "answer 0", "name": "bot"}]},
            {"rank": 0, "completion": [{"role": "assistant", "content": "answer 1"}]},
        ],
        "task": "2+2",
        "score": 0.5,
    }


def test_plain_text_record_accepted():
    raw = {"context": "2+2?", "completions": [{"rank": 0, "completion": "4"}, {"rank": 3, "completion": "5"}]}
    assert validate_rank_record(raw) == raw


def test_error_uses_row_label_for_datasets():
    with pytest.raises(DataValidationError, match=r"^hub/ds, row 4, field 'completions': needs at least 2"):
        validate_rank_record(record(0), "hub/ds", 4, "row")


@pytest.mark.parametrize(
    ("ranks", "pairs"),
    [
        ([0, 1], [(0, 1)]),
        ([1, 0], [(1, 0)]),
        ([0, 0], []),
        ([2, 0, 1], [(1, 0), (1, 2), (2, 0)]),
        ([0, 1, 1], [(0, 1), (0, 2)]),
        ([0, 1, 1, 2], [(0, 1), (0, 2), (0, 3), (1, 3), (2, 3)]),
        ([3, 2, 1, 0], [(1, 0), (2, 0), (2, 1), (3, 0), (3, 1), (3, 2)]),
    ],
)
def test_iter_pairs_gives_strictly_ordered_pairs_only(ranks, pairs):
    assert list(iter_pairs(ranks)) == pairs


def test_validate_records_skip_counts_rows_and_reasons(caplog):
    rows = [(1, GOOD), (2, record(1, 1)), (3, {"context": "x"}), (4, record(0, 2)), (5, record(3, 3))]
    with caplog.at_level(logging.WARNING, logger="trl_rm_env.data.schema"):
        kept, report = validate_records(rows, "f.jsonl", on_invalid="skip")
    assert len(kept) == 2 and (report.kept, report.skipped) == (2, 3)
    assert report.reasons == {
        "all ranks are equal, so the record has no preference pair": 2,
        "missing required field 'completions' (a rank record has 'context' and 'completions')": 1,
    }
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "f.jsonl: skipped 3 invalid record(s) of 5" in warnings[0].getMessage()


def test_validate_records_raise_stops_at_first_bad_row():
    with pytest.raises(DataValidationError, match=r"f\.jsonl, line 2, field 'completions': all ranks are equal"):
        validate_records([(1, GOOD), (2, record(1, 1)), (3, {})], "f.jsonl")


def test_validate_records_rejects_unknown_policy():
    with pytest.raises(ValueError, match="on_invalid must be 'raise' or 'skip', got 'ignore'"):
        validate_records([], "f.jsonl", on_invalid="ignore")


def test_validation_error_survives_pickling():
    import pickle

    from trl_rm_env.data.schema import DataValidationError

    err = DataValidationError("train.jsonl", 7, "completions[1].rank", "rank must be an int", "line")
    back = pickle.loads(pickle.dumps(err))
    assert str(back) == str(err) == "train.jsonl, line 7, field 'completions[1].rank': rank must be an int"
    assert (back.source, back.row, back.field, back.reason) == ("train.jsonl", 7, "completions[1].rank", "rank must be an int")
