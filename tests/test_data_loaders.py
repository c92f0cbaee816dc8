"""Loaders: local files, the bundled sample, memory and (monkeypatched) Hub sources; skip mode; data specs."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from datasets import Dataset

from trl_rm_env.data import DataValidationError, load_rank_dataset, load_rank_records, parse_data_spec, sources


def rec(i: int, ranks=(0, 1), **extra) -> dict:
    return {
        "context": [{"role": "user", "content": f"question {i}"}],
        "completions": [
            {"rank": r, "completion": [{"role": "assistant", "content": f"answer {i}.{j}"}]}
            for j, r in enumerate(ranks)
        ],
        **extra,
    }


def write_jsonl(path: Path, lines: list) -> Path:
    """Write each item as one line: dicts as JSON, strings verbatim (for blank or broken lines)."""
    path.write_text("\n".join(x if isinstance(x, str) else json.dumps(x) for x in lines) + "\n")
    return path


# --- local files ---


def test_jsonl_loads_records_and_skips_blank_lines(tmp_path):
    path = write_jsonl(tmp_path / "train.jsonl", [rec(0, task="a"), "", "   ", rec(1, (2, 0, 1), task="b")])
    ds = load_rank_dataset(str(path))
    assert ds.column_names == ["context", "completions", "task"]
    assert ds["task"] == ["a", "b"]
    assert [c["rank"] for c in ds[1]["completions"]] == [2, 0, 1]
    assert ds[1]["context"] == [{"role": "user", "content": "question 1"}]


def test_jsonl_invalid_record_on_line_3_names_file_line_and_field(tmp_path):
    bad = rec(2)
    bad["completions"][1]["rank"] = "1"
    path = write_jsonl(tmp_path / "prefs.jsonl", [rec(0), rec(1), bad])
    with pytest.raises(DataValidationError, match=r"prefs\.jsonl, line 3, field 'completions\[1\]\.rank': rank must"):
        load_rank_dataset(str(path))


def test_jsonl_invalid_json_line(tmp_path):
    path = write_jsonl(tmp_path / "broken.jsonl", [rec(0), "", '{"context": [', rec(1)])
    # The position is within the line (15: past the newline after the cut), never the JSON parser's own "line 2".
    with pytest.raises(DataValidationError, match=r"broken\.jsonl, line 3: invalid JSON: Expecting value at character "
                       r"15 of the line$") as info:
        load_rank_records(str(path))
    assert (info.value.row, info.value.field) == (3, None)


def test_validate_names_one_line_for_a_truncated_json_line(tmp_path, capsys):
    from trl_rm_env.recipes.cli import main as cli_main

    path = write_jsonl(tmp_path / "cut.jsonl", [rec(0), rec(1), '{"context": [{"role": "user", "content": "1 +'])
    assert cli_main(["validate", str(path)]) == 1
    out = capsys.readouterr().out
    assert f"{path}, line 3: invalid JSON: Invalid control character at character 46 of the line\n" in out
    assert "column" not in out and "line 1" not in out and "line 2" not in out  # nothing of the parser's own lines


def test_json_list_file_uses_zero_based_rows(tmp_path):
    path = tmp_path / "prefs.json"
    path.write_text(json.dumps([rec(0), rec(1)]))
    assert len(load_rank_dataset(str(path))) == 2
    path.write_text(json.dumps([rec(0), {"context": "x"}]))
    with pytest.raises(DataValidationError, match=r"prefs\.json, row 1, field 'completions': missing required"):
        load_rank_dataset(str(path))


def test_json_object_with_one_list_value(tmp_path):
    path = tmp_path / "wrapped.json"
    path.write_text(json.dumps({"version": 2, "data": [rec(0), rec(1), rec(2)]}))
    records, report = load_rank_records(str(path))
    assert [r["context"][0]["content"] for r in records] == ["question 0", "question 1", "question 2"]
    assert (report.kept, report.skipped) == (3, 0)
    path.write_text(json.dumps({"a": [rec(0)], "b": [rec(1)]}))
    with pytest.raises(
        DataValidationError, match=r"wrapped\.json: a \.json file must hold a list of rows or an object"
    ):
        load_rank_records(str(path))


def test_missing_file_and_split_on_local_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="data file not found: .*nope.jsonl"):
        load_rank_dataset(str(tmp_path / "nope.jsonl"))
    path = write_jsonl(tmp_path / "x.jsonl", [rec(0)])
    with pytest.raises(ValueError, match="split='test' applies to Hub datasets only"):
        load_rank_dataset(str(path), split="test")


# --- bundled sample, memory ---


def test_sample_train_loads_bundled_data():
    records, report = load_rank_records("sample:train")
    assert report.kept == len(records) > 1000 and report.skipped == 0
    assert report.source.endswith("train.jsonl")
    assert {len(r["completions"]) for r in records} <= {3, 4}
    assert "task" in records[0]
    ds = load_rank_dataset("sample:train")
    assert len(ds) == len(records)


def test_sample_easy_is_one_right_and_one_wrong_answer_per_question():
    records, report = load_rank_records("sample:easy")
    assert report.kept == len(records) == 40 and report.skipped == 0
    assert len({r["context"][0]["content"] for r in records}) == 40  # no question twice
    for r in records:
        assert [c["rank"] for c in r["completions"]] == [0, 1]
        assert r["completions"][0]["completion"] != r["completions"][1]["completion"]


def test_sample_unknown_split_lists_available():
    with pytest.raises(FileNotFoundError, match="no bundled sample split 'nope'; available: .*train"):
        load_rank_dataset("sample:nope")


def test_in_memory_dataset_and_list(caplog):
    rows = [rec(0), rec(1, (1, 0)), rec(2, (0, 0))]
    with pytest.raises(DataValidationError, match=r"^<dataset>, row 2, field 'completions': all ranks are equal"):
        load_rank_dataset(rows)
    with pytest.raises(DataValidationError, match=r"^mine, row 2, field 'completions'"):
        load_rank_dataset(Dataset.from_list(rows), name="mine")
    ds = load_rank_dataset(Dataset.from_list(rows[:2]))
    assert len(ds) == 2 and [c["rank"] for c in ds[1]["completions"]] == [1, 0]


def test_metadata_keys_from_any_row_become_columns():
    ds = load_rank_dataset([rec(0), rec(1, margin=2.0), rec(2, task="t")])
    assert ds.column_names == ["context", "completions", "margin", "task"]
    assert ds["margin"] == [None, 2.0, None] and ds["task"] == [None, None, "t"]


def test_mixed_plain_and_message_records_rejected():
    plain = {"context": "q", "completions": [{"rank": 0, "completion": "a"}, {"rank": 1, "completion": "b"}]}
    with pytest.raises(ValueError, match="mix: mixes plain-text records"):
        load_rank_dataset([rec(0), plain], name="mix")


# --- skip mode, empty result, options ---


def test_skip_mode_counts_and_logs_once(tmp_path, caplog):
    bad_rank = rec(3, (1, 1))
    path = write_jsonl(tmp_path / "mixed.jsonl", [rec(0), "not json", bad_rank, rec(4), {"context": "c"}, rec(5)])
    with caplog.at_level(logging.INFO, logger="trl_rm_env.data"):
        records, report = load_rank_records(str(path), on_invalid="skip")
    assert [r["context"][0]["content"] for r in records] == ["question 0", "question 4", "question 5"]
    assert (report.kept, report.skipped, report.ties) == (3, 3, 0)
    assert sum(report.reasons.values()) == 3
    assert report.reasons["all ranks are equal, so the record has no preference pair"] == 1
    assert any(reason.startswith("invalid JSON") for reason in report.reasons)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "mixed.jsonl: skipped 3 invalid row(s) of 6" in warnings[0]
    assert "mixed.jsonl, line 2: invalid JSON" in warnings[0]


def test_empty_result_names_source(tmp_path):
    path = write_jsonl(tmp_path / "allbad.jsonl", [rec(0, (1, 1)), rec(1, (0,))])
    with pytest.raises(ValueError, match=r"allbad\.jsonl: no valid records \(skipped 2 invalid, dropped 0 tied\)"):
        load_rank_dataset(str(path), on_invalid="skip")
    empty = write_jsonl(tmp_path / "empty.jsonl", [""])
    with pytest.raises(ValueError, match=r"empty\.jsonl: no valid records"):
        load_rank_dataset(str(empty))


def test_bad_options():
    with pytest.raises(ValueError, match="unknown data_format 'csv'; choose 'rank' or one of"):
        load_rank_dataset([rec(0)], data_format="csv")
    with pytest.raises(ValueError, match="on_invalid must be 'raise' or 'skip'"):
        load_rank_dataset([rec(0)], on_invalid="warn")
    with pytest.raises(ValueError, match="chosen_key only apply when converting"):
        load_rank_dataset([rec(0)], chosen_key="good")
    with pytest.raises(ValueError, match="data_format='helpsteer3' does not take prompt_key"):
        load_rank_dataset([rec(0)], data_format="helpsteer3", prompt_key="q")


# --- Hub (monkeypatched: no network) ---


@pytest.fixture
def fake_hub(monkeypatch):
    calls = []

    def fake_load_dataset(path, name=None, split=None):
        calls.append((path, name, split))
        return Dataset.from_list([rec(0), rec(1, (2, 1, 0))])

    monkeypatch.setattr(sources, "load_dataset", fake_load_dataset)
    return calls


def test_hub_id_passes_id_config_and_split(fake_hub):
    ds = load_rank_dataset("org/prefs", hub_config="main", split="test")
    assert fake_hub == [("org/prefs", "main", "test")]
    assert len(ds) == 2 and len(ds[1]["completions"]) == 3


def test_hub_id_default_and_inline_split(fake_hub):
    load_rank_dataset("org/prefs")
    _, report = load_rank_records("org/prefs:validation")
    assert fake_hub == [("org/prefs", None, "train"), ("org/prefs", None, "validation")]
    assert report.source == "org/prefs:validation"
    with pytest.raises(ValueError, match="inline split 'validation' conflicts with split='test'"):
        load_rank_dataset("org/prefs:validation", split="test")


def test_hub_errors_name_dataset_config_and_split(monkeypatch):
    monkeypatch.setattr(sources, "load_dataset", lambda path, name=None, split=None: Dataset.from_list([{"x": 1}]))
    with pytest.raises(DataValidationError, match=r"^org/prefs\[cfg\]:dev, row 0, field 'context'"):
        load_rank_dataset("org/prefs", hub_config="cfg", split="dev")


def _hub_clone(root: Path, repo: str, config: str, splits: dict[str, list[dict]]) -> None:
    """A folder laid out as a Hub data set's repository: data files per split, the config declared in README.md."""
    lines = ["---", "configs:", f"- config_name: {config}", "  data_files:"]
    for split, rows in splits.items():
        (root / repo / config).mkdir(parents=True, exist_ok=True)
        (root / repo / config / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        lines += [f"  - split: {split}", f"    path: {config}/{split}.jsonl"]
    (root / repo / "README.md").write_text("\n".join([*lines, "---", ""]))


def test_a_local_clone_of_a_hub_set_loads_as_its_id_does(tmp_path, monkeypatch):
    """As `datasets.load_dataset` does: a folder named like the id comes before the Hub (config and splits read from
    its README.md), e.g. a `git clone` of the data set's repository for an offline machine."""
    row = {"domain": "general", "language": "english", "context": [{"role": "user", "content": "Hi?"}],
           "response1": "Hello.", "response2": "Go away.", "overall_preference": -2}  # fmt: skip
    _hub_clone(tmp_path, "nvidia/HelpSteer3", "preference", {"train": [row] * 3, "validation": [row]})
    monkeypatch.chdir(tmp_path)
    import datasets

    # datasets caches a folder's table under its name, not its contents: another run's folder of that name would do
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "cache")
    train = load_rank_dataset("nvidia/HelpSteer3:train", hub_config="preference", data_format="helpsteer3")
    _, report = load_rank_records("nvidia/HelpSteer3", split="validation", hub_config="preference",
                                  data_format="helpsteer3")  # fmt: skip
    assert len(train) == 3 and report.kept == 1 and report.source == "nvidia/HelpSteer3[preference]:validation"
    assert train[0]["completions"][0] == {"rank": 0, "completion": [{"role": "assistant", "content": "Hello."}]}
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(ValueError, match="unsupported local data file"):  # a file that is no data set stays refused
        load_rank_dataset("notes.txt")


def test_the_bundled_samples_are_rank_records_whatever_the_data_format(tmp_path):
    """`rm.yaml` puts `sample=sample:in_domain` beside its HelpSteer3 sets: `data_format` and `hub_config` are the Hub
    sets', the sample is read as the rank records it is."""
    from trl_rm_env.data.arguments import RankedDataArguments

    row = {"context": [{"role": "user", "content": "Hi?"}], "response1": "Hello.", "response2": "No.",
           "overall_preference": 1}  # fmt: skip
    (tmp_path / "hs3.jsonl").write_text(json.dumps(row) + "\n")
    arguments = RankedDataArguments(train_data=str(tmp_path / "hs3.jsonl"), data_format="helpsteer3",
                                    hub_config="preference", eval_data=["sample=sample:in_domain"])  # fmt: skip
    train, evals = arguments.load()
    best = next(c for c in train[0]["completions"] if c["rank"] == 0)
    assert best["completion"][0]["content"] == "No."  # helpsteer3: +1 prefers response2
    assert len(evals["sample"]) == len(load_rank_dataset("sample:in_domain"))


# --- data specs ---


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("data/x.jsonl", (None, "data/x.jsonl", None)),
        ("train.json", (None, "train.json", None)),
        ("sample:train", (None, "sample:train", None)),
        ("sample:in_domain", (None, "sample:in_domain", None)),
        ("org/name", (None, "org/name", None)),
        ("org/name:test", (None, "org/name", "test")),
        ("eval=org/name:test", ("eval", "org/name", "test")),
        ("eval=org/name", ("eval", "org/name", None)),
        ("train=sample:train", ("train", "sample:train", None)),
        ("hs3=data/hs3.jsonl", ("hs3", "data/hs3.jsonl", None)),
        (" eval = org/name:test ", ("eval", "org/name", "test")),
        ("data/a=b.jsonl", (None, "data/a=b.jsonl", None)),
        ("https://host/x.jsonl", (None, "https://host/x.jsonl", None)),
    ],
)
def test_parse_data_spec(spec, expected):
    assert parse_data_spec(spec) == expected


@pytest.mark.parametrize(
    ("spec", "message"), [("", "no source"), ("=x", "empty name"), ("org/name:", "empty split"), ("n=", "no source")]
)
def test_parse_data_spec_errors(spec, message):
    with pytest.raises(ValueError, match=message):
        parse_data_spec(spec)
