"""Converters: TRL binary preference, HelpSteer3 and Tulu 3 rows turned into rank records."""

from __future__ import annotations

import json
import logging

import pytest

from trl_rm_env.data import (
    CONVERTERS,
    DataValidationError,
    binary_to_rank,
    helpsteer3_to_rank,
    load_rank_dataset,
    load_rank_records,
    tulu3_to_rank,
)


def m(role: str, content: str) -> dict[str, str]:
    return {"role": role, "content": content}


def test_registry_names():
    assert CONVERTERS == {"binary": binary_to_rank, "helpsteer3": helpsteer3_to_rank, "tulu3": tulu3_to_rank}


# --- binary ---


def test_binary_explicit_string_prompt_is_plain_text():
    row = {"prompt": "2+2?", "chosen": "4", "rejected": "5", "score": 9}
    assert binary_to_rank(row, "f.jsonl", 1) == {
        "context": "2+2?",
        "completions": [{"rank": 0, "completion": "4"}, {"rank": 1, "completion": "5"}],
    }


def test_binary_explicit_message_prompt_keeps_margin():
    row = {
        "prompt": [m("system", "Be brief."), m("user", "2+2?")],
        "chosen": [m("assistant", "4")],
        "rejected": [m("assistant", "5")],
        "margin": 1.5,
    }
    assert binary_to_rank(row, "f.jsonl", 1) == {
        "context": [m("system", "Be brief."), m("user", "2+2?")],
        "completions": [
            {"rank": 0, "completion": [m("assistant", "4")]},
            {"rank": 1, "completion": [m("assistant", "5")]},
        ],
        "margin": 1.5,
    }


def test_binary_implicit_prompt_splits_at_common_prefix():
    shared = [m("user", "Hi"), m("assistant", "Hello!"), m("user", "2+2?")]
    row = {"chosen": [*shared, m("assistant", "4")], "rejected": [*shared, m("assistant", "5"), m("user", "Sure?")]}
    out = binary_to_rank(row, "f.jsonl", 1)
    assert out["context"] == shared
    assert out["completions"] == [
        {"rank": 0, "completion": [m("assistant", "4")]},
        {"rank": 1, "completion": [m("assistant", "5"), m("user", "Sure?")]},
    ]


def test_binary_implicit_prompt_splits_as_trl_reads_it():
    # TRL's implicit-prompt rows are accepted: the shared prefix is the context, "" or [] when nothing is shared,
    # and a conversation that is a prefix of the other keeps at least one message of its own.
    shared = [m("user", "2+2?"), m("assistant", "4")]
    out = binary_to_rank({"chosen": shared, "rejected": [*shared, m("user", "ok")]}, "f", 7)
    assert out["context"] == [m("user", "2+2?")]
    assert [c["completion"] for c in out["completions"]] == [
        [m("assistant", "4")],
        [m("assistant", "4"), m("user", "ok")],
    ]
    out = binary_to_rank({"chosen": [m("user", "a")], "rejected": [m("user", "b")]}, "f", 7)
    assert out["context"] == [] and [c["completion"] for c in out["completions"]] == [
        [m("user", "a")],
        [m("user", "b")],
    ]
    assert binary_to_rank({"chosen": "4", "rejected": "5"}, "f", 7)["context"] == ""
    out = binary_to_rank({"chosen": "Q: 2+2? A: 4", "rejected": "Q: 2+2? A: 5"}, "f", 7)
    assert out["context"] == "Q: 2+2? A: " and [c["completion"] for c in out["completions"]] == ["4", "5"]


def test_binary_implicit_prompt_errors():
    shared = [m("user", "2+2?"), m("assistant", "4")]
    with pytest.raises(DataValidationError, match=r"field 'rejected\[0\]\.role': message has no 'role'"):
        binary_to_rank({"chosen": shared, "rejected": [{"content": "x"}]}, "f", 7)


def test_binary_custom_keys():
    row = {"question": "2+2?", "good": "4", "bad": "5"}
    out = binary_to_rank(row, "f", 0, prompt_key="question", chosen_key="good", rejected_key="bad")
    assert out == {"context": "2+2?", "completions": [{"rank": 0, "completion": "4"}, {"rank": 1, "completion": "5"}]}


def test_binary_missing_key_lists_present_keys_and_option():
    row = {"question": "2+2?", "good": "4", "rejected": "5"}
    with pytest.raises(
        DataValidationError,
        match=r"^data\.jsonl, line 4, field 'chosen': missing 'chosen'; the row has keys \['question', 'good', "
        r"'rejected'\]; set chosen_key= to the column that holds it",
    ):
        binary_to_rank(row, "data.jsonl", 4, "line")
    with pytest.raises(DataValidationError, match=r"field 'bad': missing 'bad'; .* set rejected_key="):
        binary_to_rank(row, "data.jsonl", 4, "line", chosen_key="good", rejected_key="bad")


def test_binary_type_errors():
    with pytest.raises(
        DataValidationError, match=r"field 'rejected': the prompt is plain text, so rejected must be a"
    ):
        binary_to_rank({"prompt": "q", "chosen": "a", "rejected": [m("assistant", "b")]}, "f", 0)
    with pytest.raises(DataValidationError, match=r"field 'chosen': the prompt is a list of messages, so chosen must"):
        binary_to_rank({"prompt": [m("user", "q")], "chosen": "a", "rejected": "b"}, "f", 0)
    with pytest.raises(DataValidationError, match=r"field 'margin': margin must be a number, got str 'big'"):
        binary_to_rank({"prompt": "q", "chosen": "a", "rejected": "b", "margin": "big"}, "f", 0)
    with pytest.raises(DataValidationError, match=r"^f, row 0: a row must be an object, got list"):
        binary_to_rank(["q", "a", "b"], "f", 0)


def test_binary_through_loader_with_custom_keys_and_validation(tmp_path):
    path = tmp_path / "pairs.jsonl"
    rows = [{"q": "2+2?", "good": "4", "bad": "5"}, {"q": "3+3?", "good": "6", "bad": " "}]
    path.write_text("\n".join(json.dumps(r) for r in rows))
    with pytest.raises(
        DataValidationError, match=r"pairs\.jsonl, line 2, field 'completions\[1\]\.completion': empty completion"
    ):
        load_rank_dataset(str(path), data_format="binary", prompt_key="q", chosen_key="good", rejected_key="bad")
    records, report = load_rank_records(
        str(path), data_format="binary", prompt_key="q", chosen_key="good", rejected_key="bad", on_invalid="skip"
    )
    assert records == [
        {"context": "2+2?", "completions": [{"rank": 0, "completion": "4"}, {"rank": 1, "completion": "5"}]}
    ]
    assert (report.kept, report.skipped) == (1, 1)


# --- HelpSteer3 ---


def hs3(pref: int, i: int = 0) -> dict:
    return {
        "domain": "general",
        "language": "english",
        "context": [m("user", f"Question {i}?")],
        "response1": f"first {i}",
        "response2": f"second {i}",
        "overall_preference": pref,
        "individual_preference": [{"score": pref, "reasoning": "..."}],
    }


def test_helpsteer3_negative_prefers_response1():
    assert helpsteer3_to_rank(hs3(-2), "hs3", 0) == {
        "context": [m("user", "Question 0?")],
        "completions": [
            {"rank": 0, "completion": [m("assistant", "first 0")]},
            {"rank": 1, "completion": [m("assistant", "second 0")]},
        ],
        "domain": "general",
        "language": "english",
        "overall_preference": -2,
    }


def test_helpsteer3_positive_prefers_response2_and_zero_is_a_tie():
    out = helpsteer3_to_rank(hs3(1), "hs3", 0)
    assert [(c["rank"], c["completion"][0]["content"]) for c in out["completions"]] == [
        (1, "first 0"),
        (0, "second 0"),
    ]
    assert helpsteer3_to_rank(hs3(0), "hs3", 0) is None


@pytest.mark.parametrize(
    ("pref", "shown"), [(4, "int 4"), (True, "bool True"), ("-1", "str '-1'"), (None, "NoneType")]
)
def test_helpsteer3_bad_preference(pref, shown):
    with pytest.raises(
        DataValidationError, match=rf"field 'overall_preference': must be an int in -3\.\.3, got {shown}"
    ):
        helpsteer3_to_rank(hs3(pref), "hs3", 5)


def test_helpsteer3_missing_response():
    row = hs3(1)
    del row["response2"]
    with pytest.raises(DataValidationError, match=r"^hs3, row 5, field 'response2': missing 'response2'; the row has"):
        helpsteer3_to_rank(row, "hs3", 5)


def test_helpsteer3_loader_drops_and_counts_ties(tmp_path, caplog):
    path = tmp_path / "helpsteer3.jsonl"
    prefs = [-2, 0, 1, 0, 3, 0]
    path.write_text("\n".join(json.dumps(hs3(p, i)) for i, p in enumerate(prefs)) + "\n")
    with caplog.at_level(logging.INFO, logger="trl_rm_env.data"):
        records, report = load_rank_records(str(path), data_format="helpsteer3")
    assert (report.kept, report.skipped, report.ties) == (3, 0, 3)
    assert [r["overall_preference"] for r in records] == [-2, 1, 3]
    assert [[c["rank"] for c in r["completions"]] for r in records] == [[0, 1], [1, 0], [1, 0]]
    tie_logs = [r.getMessage() for r in caplog.records if "tied" in r.getMessage()]
    assert tie_logs == [f"{path}: dropped 3 tied row(s) (overall_preference == 0)"]
    ds = load_rank_dataset(str(path), data_format="helpsteer3")
    assert ds.column_names == ["context", "completions", "domain", "language", "overall_preference"]


def test_helpsteer3_all_ties_is_an_empty_result(tmp_path):
    path = tmp_path / "ties.jsonl"
    path.write_text(json.dumps(hs3(0)) + "\n")
    with pytest.raises(ValueError, match=r"ties\.jsonl: no valid records \(skipped 0 invalid, dropped 1 tied\)"):
        load_rank_dataset(str(path), data_format="helpsteer3")


# --- Tulu 3 ---


def tulu(chosen_last: str = "4", rejected_last: str = "5", rejected_context=None) -> dict:
    context = [m("system", "Be brief."), m("user", "2+2?")]
    return {
        "id": "row-1",
        "source": "ultrafeedback",
        "prompt": "2+2?",
        "chosen": [*context, m("assistant", chosen_last)],
        "rejected": [*(rejected_context or context), m("assistant", rejected_last)],
    }


def test_tulu3_splits_shared_context():
    assert tulu3_to_rank(tulu(), "tulu", 3) == {
        "context": [m("system", "Be brief."), m("user", "2+2?")],
        "completions": [
            {"rank": 0, "completion": [m("assistant", "4")]},
            {"rank": 1, "completion": [m("assistant", "5")]},
        ],
        "id": "row-1",
        "source": "ultrafeedback",
    }


def test_tulu3_context_mismatch_names_field():
    row = tulu(rejected_context=[m("system", "Be brief."), m("user", "3+3?")])
    with pytest.raises(
        DataValidationError,
        match=r"^tulu\.jsonl, line 3, field 'rejected': rejected\[:-1\] must equal chosen\[:-1\] .* differ at message 1",
    ):
        tulu3_to_rank(row, "tulu.jsonl", 3, "line")


def test_tulu3_bad_conversations():
    with pytest.raises(DataValidationError, match=r"field 'chosen': empty conversation"):
        tulu3_to_rank({"prompt": "q", "chosen": [], "rejected": [m("assistant", "x")]}, "tulu", 0)
    with pytest.raises(DataValidationError, match=r"field 'rejected': missing 'rejected'; the row has keys"):
        tulu3_to_rank({"prompt": "q", "chosen": [m("assistant", "x")]}, "tulu", 0)


def test_tulu3_through_loader_skip(tmp_path):
    path = tmp_path / "tulu.json"
    path.write_text(json.dumps([tulu(), tulu(rejected_context=[m("user", "other")]), tulu("8", " ")]))
    records, report = load_rank_records(str(path), data_format="tulu3", on_invalid="skip")
    assert len(records) == 1 and (report.kept, report.skipped) == (1, 2)
    assert set(report.reasons) == {
        "empty completion",
        "rejected[:-1] must equal chosen[:-1] (the shared context); they differ at message 0 (chosen has 3 "
        "messages, rejected 2)",
    }
