"""Bad data (issue 13): every case gets one error naming file, line/row and field, or is skipped and counted with
`on_invalid="skip"`; `trl-rm-env validate` catches every class training would choke on; nothing non-finite reaches
the loss. One test per case, each asserting the exact behaviour."""

from __future__ import annotations

import gzip
import json
import logging
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from trl_rm_env.recipes.cli import build_parser, main

from trl_rm_env.data import DataValidationError, load_rank_dataset, load_rank_records, validate_rank_record
from trl_rm_env.data.converters import ALL_CONVERTERS
from trl_rm_env.data.regression import REGRESSION_FORMATS, load_regression_records
from trl_rm_env.data.schema import KNOWN_ROLES, MAX_COMPLETIONS_PER_RECORD
from trl_rm_env.trainer.loss import ranked_bradley_terry_loss, ranked_pairs


def msg(role: str, content) -> dict:
    return {"role": role, "content": content}


def record(*ranks: int, **extra) -> dict:
    return {
        "context": [msg("user", "What is 2+2?")],
        "completions": [{"rank": r, "completion": [msg("assistant", f"answer {i}")]} for i, r in enumerate(ranks)],
        **extra,
    }


GOOD = record(0, 1)
GOOD_LINE = json.dumps(GOOD).encode()


def write_lines(tmp_path: Path, *lines: bytes, name: str = "prefs.jsonl") -> Path:
    """A file of the given raw lines (bytes), each ended by a newline."""
    path = tmp_path / name
    path.write_bytes(b"".join(line + b"\n" for line in lines))
    return path


def bad_second_line(tmp_path: Path, bad: bytes | dict, name: str = "prefs.jsonl") -> Path:
    """A .jsonl file: a good record, then `bad` (raw bytes, or a record written with json.dumps) on line 2."""
    raw = bad if isinstance(bad, bytes) else json.dumps(bad).encode()
    return write_lines(tmp_path, GOOD_LINE, raw, GOOD_LINE, name=name)


def assert_rejected(path: Path, where: str, reason: str, loader=load_rank_records) -> None:
    """`raise` stops with exactly `<file>, <where>: <reason...>`; `skip` keeps the 2 good lines and counts 1."""
    with pytest.raises(DataValidationError, match="^" + re.escape(f"{path}, {where}: ") + reason):
        loader(str(path))
    records, report = loader(str(path), on_invalid="skip")
    assert (len(records), report.kept, report.skipped) == (2, 2, 1)
    assert re.match(reason, next(iter(report.reasons)))


def run_validate(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(["validate", *map(str, argv)])
    out = capsys.readouterr()
    return code, out.out, out.err


# --- margin ---


@pytest.mark.parametrize("value", ["NaN", "Infinity", "-Infinity", "1e999"])
def test_non_finite_margin_is_rejected_by_loader_and_validate(tmp_path, capsys, value):
    path = bad_second_line(tmp_path, GOOD_LINE[:-1] + f', "margin": {value}}}'.encode())
    assert_rejected(path, "line 2, field 'margin'", r"margin must be a finite number, got float (nan|inf|-inf)")
    code, out, _ = run_validate(capsys, path)
    assert code == 1
    assert "2 valid record(s), 1 invalid" in out and "line 2, field 'margin': margin must be a finite number" in out


def test_margin_string_is_one_line_error_naming_the_field(tmp_path):
    path = bad_second_line(tmp_path, record(0, 1, margin="big"))
    assert_rejected(path, "line 2, field 'margin'", re.escape("margin must be a finite number, got str 'big'"))


def test_huge_int_margin_is_not_finite(tmp_path):
    with pytest.raises(DataValidationError, match=r"field 'margin': margin must be a finite number, got int"):
        validate_rank_record(record(0, 1, margin=10**400), "mem", 0, "row")


@pytest.mark.parametrize("value", ["1e30", "-1e30", "1000.5"])
def test_margin_too_large_to_be_a_reward_difference_is_rejected(tmp_path, capsys, value):
    path = bad_second_line(tmp_path, GOOD_LINE[:-1] + f', "margin": {value}}}'.encode())
    assert_rejected(path, "line 2, field 'margin'", rf"margin {re.escape(f'{float(value):g}')} is larger than 1000 in "
                    r"size: margins are in reward units .*; rescale the column")
    code, out, _ = run_validate(capsys, path)
    assert code == 1 and "2 valid record(s), 1 invalid" in out
    assert validate_rank_record(record(0, 1, margin=1000), "mem", 0, "row")["margin"] == 1000.0  # the bound itself


def test_margin_too_large_in_trl_preference_rows_is_rejected():
    rows = [{"prompt": "2 + 2 =", "chosen": " 4", "rejected": " 5", "margin": 1e30}]
    with pytest.raises(DataValidationError, match=r"row 0, field 'margin': margin 1e\+30 is larger than 1000"):
        load_rank_records(rows, data_format="binary", name="mem")


def test_margin_is_normalised_to_float_and_null_means_none():
    assert validate_rank_record(record(0, 1, margin=2))["margin"] == 2.0
    assert isinstance(validate_rank_record(record(0, 1, margin=2))["margin"], float)
    assert validate_rank_record(record(0, 1, margin=None))["margin"] is None


def test_margin_on_some_records_loads_and_trains(tmp_path, tiny_tokenizer):
    """The docs call `margin` optional per record: records without one get margin 0 (collator fix by the trainer)."""
    from trl_rm_env.tiny_models import build_tiny_reward_model
    from trl_rm_env.trainer import RankedRewardConfig, RankedRewardTrainer

    rows = [record(0, 1, margin=0.5), record(1, 0), record(0, 2, 1, margin=1), record(0, 1)]
    path = write_lines(tmp_path, *(json.dumps(r).encode() for r in rows))
    dataset = load_rank_dataset(str(path))
    assert dataset["margin"] == [0.5, None, 1.0, None]
    args = RankedRewardConfig(
        output_dir=str(tmp_path / "out"), max_steps=2, per_device_train_batch_size=4, learning_rate=1e-3,
        use_cpu=True, report_to="none", save_strategy="no", logging_steps=1, disable_tqdm=True, seed=0,
        dataloader_num_workers=0,
    )  # fmt: skip
    model = build_tiny_reward_model(tiny_tokenizer, seed=0).train()
    trainer = RankedRewardTrainer(model=model, args=args, train_dataset=dataset, processing_class=tiny_tokenizer)
    trainer.train()
    losses = [log["loss"] for log in trainer.state.log_history if "loss" in log]
    assert len(losses) == 2 and all(math.isfinite(loss) and loss > 0 for loss in losses)
    assert all(torch.isfinite(p).all() for p in model.parameters())


# --- bytes and parsing ---


def test_non_utf8_byte_names_file_and_line(tmp_path, capsys):
    path = bad_second_line(tmp_path, json.dumps(record(0, 1)).replace("answer 0", "caf\u00e9").encode("latin-1"))
    assert_rejected(path, "line 2", r"not valid UTF-8: byte 0xe9 at byte \d+; save the file as UTF-8")
    code, out, _ = run_validate(capsys, path)
    assert code == 1 and "line 2: not valid UTF-8: byte 0xe9" in out


def test_utf8_bom_is_accepted_on_line_1(tmp_path, capsys):
    path = write_lines(tmp_path, b"\xef\xbb\xbf" + GOOD_LINE, GOOD_LINE)
    records, report = load_rank_records(str(path))
    assert (len(records), report.skipped) == (2, 0) and records[0]["context"] == GOOD["context"]
    assert run_validate(capsys, path)[:2] == (0, f"{path}: 2 valid record(s), 0 invalid, 0 tie(s) dropped\n")


def test_utf8_bom_is_accepted_in_json_and_gz_files(tmp_path):
    json_path = tmp_path / "prefs.json"
    json_path.write_bytes(b"\xef\xbb\xbf" + json.dumps([GOOD, GOOD]).encode())
    assert len(load_rank_records(str(json_path))[0]) == 2
    gz_path = tmp_path / "prefs.jsonl.gz"
    gz_path.write_bytes(gzip.compress(b"\xef\xbb\xbf" + GOOD_LINE + b"\n"))
    assert len(load_rank_records(str(gz_path))[0]) == 1


def test_utf16_file_is_one_error_naming_the_file(tmp_path, capsys):
    path = tmp_path / "prefs.jsonl"
    path.write_bytes((json.dumps(GOOD) + "\n").encode("utf-16"))
    for on_invalid in ("raise", "skip"):
        with pytest.raises(
            DataValidationError, match=f"^{re.escape(str(path))}: the file is UTF-16 .* save it as UTF-8"
        ):
            load_rank_records(str(path), on_invalid=on_invalid)
    code, out, err = run_validate(capsys, path)
    assert (code, out) == (
        1,
        "",
    ) and err == f"error: {path}: the file is UTF-16 (it starts with a UTF-16 byte-order mark); save it as UTF-8\n"


def test_non_utf8_byte_in_json_file_names_line(tmp_path):
    path = tmp_path / "prefs.json"
    path.write_bytes(b"[\n" + GOOD_LINE + b",\n" + GOOD_LINE.replace(b"answer 0", b"caf\xe9") + b"\n]\n")
    with pytest.raises(DataValidationError, match=re.escape(f"{path}, line 3: not valid UTF-8: byte 0xe9 at byte")):
        load_rank_records(str(path))


def test_deeply_nested_line_names_the_line(tmp_path):
    path = bad_second_line(tmp_path, b"[" * 100_000 + b"]" * 100_000)
    assert_rejected(path, "line 2", re.escape("invalid JSON: nested too deeply to parse"))


def test_deeply_nested_json_file_is_one_error(tmp_path):
    path = tmp_path / "prefs.json"
    path.write_bytes(b"[" * 100_000 + b"]" * 100_000)
    with pytest.raises(DataValidationError, match=re.escape(f"{path}: invalid JSON: nested too deeply to parse")):
        load_rank_records(str(path))


def test_deeply_nested_in_memory_record_names_the_field():
    deep: list = []
    for _ in range(500):
        deep = [deep]
    with pytest.raises(DataValidationError, match=r"^mem, row 0, field 'notes(\[0\])+': nested more than 100 levels"):
        validate_rank_record(record(0, 1, notes=deep), "mem", 0, "row")


def test_integer_of_5000_digits_is_invalid_json_naming_the_line(tmp_path):
    path = bad_second_line(tmp_path, GOOD_LINE.replace(b'"rank": 1', b'"rank": 1' + b"0" * 5000))
    assert_rejected(path, "line 2", re.escape("invalid JSON: a number of more than 4300 digits"))


def test_corrupt_gz_is_one_error_naming_the_file(tmp_path):
    path = tmp_path / "prefs.jsonl.gz"
    path.write_bytes(gzip.compress(GOOD_LINE + b"\n")[:-12] + b"garbage!")
    with pytest.raises(DataValidationError, match=f"^{re.escape(str(path))}: cannot read the file: "):
        load_rank_records(str(path), on_invalid="skip")


@pytest.mark.parametrize(
    ("where", "field"),
    [
        ("completion", "completions[1].completion[0].content"),
        ("context", "context[0].content"),
        ("metadata", "task"),
        ("key", "x\ud800"),
    ],
)
def test_lone_surrogate_names_the_field(tmp_path, where, field):
    bad = record(0, 1, task="t")
    if where == "completion":
        bad["completions"][1]["completion"][0]["content"] = "ok \ud800"
    elif where == "context":
        bad["context"][0]["content"] = "\ud800"
    elif where == "metadata":
        bad["task"] = "\udfff!"
    else:
        bad["x\ud800"] = 1
    path = bad_second_line(tmp_path, json.dumps(bad).encode())  # json.dumps writes the \ud800 escape
    assert b"\\ud" in path.read_bytes()
    assert_rejected(path, f"line 2, field {field!r}", r"text holds a lone surrogate '\\ud[8-9a-f]\w\w' at character")


def test_rank_out_of_int64_names_the_field(tmp_path):
    path = bad_second_line(tmp_path, record(0, 2**64))
    assert_rejected(
        path, "line 2, field 'completions[1].rank'", re.escape(f"rank must fit in a 64-bit integer, got {2**64}")
    )
    assert validate_rank_record(record(-(2**63), 2**63 - 1))["completions"][1]["rank"] == 2**63 - 1


def test_empty_context_is_valid(tmp_path, capsys):
    """No shared context (what TRL's implicit-prompt data gives when the conversations share nothing)."""
    rows = [{"context": [], "completions": [{"rank": 0, "completion": [msg("user", "hi"), msg("assistant", "a")]},
                                            {"rank": 1, "completion": [msg("assistant", "b")]}]}, GOOD]  # fmt: skip
    path = write_lines(tmp_path, *(json.dumps(r).encode() for r in rows))
    records, report = load_rank_records(str(path))
    assert report.skipped == 0 and records[0]["context"] == []
    assert records[0]["completions"][0]["completion"][0] == msg("user", "hi")  # a whole conversation
    assert run_validate(capsys, path)[0] == 0


def test_empty_context_trains(tmp_path, tiny_tokenizer):
    """Records with `context: []` load and train (tokenized as the completion's conversation alone)."""
    from trl_rm_env.tiny_models import build_tiny_reward_model
    from trl_rm_env.trainer import RankedRewardConfig, RankedRewardTrainer

    whole = [msg("user", "2+2?"), msg("assistant", "4")]
    rows = [{"context": [], "completions": [{"rank": 0, "completion": whole},
                                            {"rank": 1, "completion": [whole[0], msg("assistant", "5")]}]},
            record(0, 1)]  # fmt: skip
    dataset = load_rank_dataset(rows)
    args = RankedRewardConfig(
        output_dir=str(tmp_path / "out"), max_steps=1, per_device_train_batch_size=2, learning_rate=1e-3,
        use_cpu=True, report_to="none", save_strategy="no", logging_steps=1, disable_tqdm=True, seed=0,
        dataloader_num_workers=0,
    )  # fmt: skip
    model = build_tiny_reward_model(tiny_tokenizer, seed=0).train()
    trainer = RankedRewardTrainer(model=model, args=args, train_dataset=dataset, processing_class=tiny_tokenizer)
    assert len(trainer.train_dataset) == 2
    trainer.train()
    losses = [log["loss"] for log in trainer.state.log_history if "loss" in log]
    assert len(losses) == 1 and math.isfinite(losses[0])


# --- roles and tool calls ---


@pytest.mark.parametrize(
    ("part", "field"), [("context", "context[0].role"), ("completion", "completions[1].completion[0].role")]
)
def test_unknown_role_lists_the_accepted_roles(tmp_path, capsys, part, field):
    bad = record(0, 1)
    (bad["context"] if part == "context" else bad["completions"][1]["completion"])[0]["role"] = "wizard"
    path = bad_second_line(tmp_path, bad)
    reason = "unknown role 'wizard'; accepted roles: system, developer, user, assistant, tool"
    assert_rejected(path, f"line 2, field {field!r}", re.escape(reason))
    assert KNOWN_ROLES == ("system", "developer", "user", "assistant", "tool")
    code, out, _ = run_validate(capsys, path)
    assert code == 1 and reason in out


@pytest.mark.parametrize("role", ["user", "system", "developer"])
def test_completion_with_a_non_assistant_role_names_the_field(tmp_path, role):
    bad = record(0, 1)
    bad["completions"][0]["completion"] = [msg("assistant", "4"), msg(role, "now say 5")]
    path = bad_second_line(tmp_path, bad)
    assert_rejected(
        path,
        "line 2, field 'completions[0].completion[1].role'",
        re.escape(
            f"a completion may hold only assistant and tool messages, got {role!r}; put earlier turns in 'context'"
        ),
    )


TOOL_CALL = {"type": "function", "function": {"name": "add", "arguments": {"a": 2, "b": 2}}}


def test_tool_call_completion_is_valid_and_keeps_tool_keys():
    raw = record(0, 1)
    raw["completions"][0]["completion"] = [
        {"role": "assistant", "tool_calls": [TOOL_CALL]},  # no content at all
        {"role": "tool", "content": "4", "tool_call_id": "call_1", "name": "add"},
        {"role": "assistant", "content": "4", "extra": "dropped"},
    ]
    raw["completions"][1]["completion"] = [{"role": "assistant", "content": None, "tool_calls": [TOOL_CALL]}]
    out = validate_rank_record(raw, "mem", 0, "row")
    assert out["completions"][0]["completion"] == [
        {"role": "assistant", "content": None, "tool_calls": [TOOL_CALL]},
        {"role": "tool", "content": "4", "tool_call_id": "call_1", "name": "add"},
        {"role": "assistant", "content": "4"},
    ]
    # A completion that is only a tool call is not "empty".
    assert out["completions"][1]["completion"] == [{"role": "assistant", "content": None, "tool_calls": [TOOL_CALL]}]


@pytest.mark.parametrize(
    ("message", "field", "reason"),
    [
        ({"role": "assistant", "content": None}, "content", "content must be a string, got NoneType"),
        ({"role": "assistant", "content": None, "tool_calls": []}, "content", "content must be a string, got NoneType"),
        ({"role": "assistant", "tool_calls": "add(2, 2)"}, "tool_calls",
         "tool_calls must be a list of objects, got str"),
        ({"role": "tool", "content": "4", "tool_calls": [TOOL_CALL]}, "tool_calls",
         "only assistant messages carry tool_calls, this one is 'tool'"),
        ({"role": "tool", "content": "4", "tool_call_id": 7}, "tool_call_id", "tool_call_id must be a string, got int"),
        ({"role": "assistant", "content": [{"type": "text", "text": "4"}]}, "content",
         "content must be a string, got list (a list of content parts is not supported: join the text into one string)"),
    ],
)  # fmt: skip
def test_malformed_tool_messages_name_the_field(message, field, reason):
    raw = record(0, 1)
    raw["completions"][0]["completion"] = [msg("assistant", "x"), message]
    with pytest.raises(
        DataValidationError, match=re.escape(f"field 'completions[0].completion[1].{field}': {reason}")
    ):
        validate_rank_record(raw, "mem", 0, "row")


# --- many completions ---


def test_record_above_the_completion_limit_names_record_and_fix(tmp_path, capsys):
    n = 10_000
    plain = [{"rank": i, "completion": f"answer {i}"} for i in range(n)]
    rows = [{"context": "q", "completions": plain[:2]}, {"context": "q", "completions": plain}]
    path = write_lines(tmp_path, *(json.dumps(r).encode() for r in [*rows, rows[0]]))
    reason = (
        f"{n} completions, more than the limit of {MAX_COMPLETIONS_PER_RECORD} per record (all of a record's "
        f"completions are scored in one batch and every ordered pair is a loss term, up to {n * (n - 1) // 2} here); "
        "split it into several records with the same context, or raise max_completions"
    )
    assert_rejected(path, "line 2, field 'completions'", re.escape(reason))
    code, out, _ = run_validate(capsys, path)
    assert code == 1 and reason in out
    assert len(load_rank_records(str(path), max_completions=None)[0]) == 3
    assert run_validate(capsys, path, "--max-completions", "0")[0] == 0
    assert run_validate(capsys, path, "--max-completions", str(n))[0] == 0


def test_trainer_applies_its_max_completions_to_in_memory_records(tmp_path, tiny_tokenizer):
    # A Dataset handed straight to the trainer skips the loaders: the trainer's own validation holds the limit,
    # and a user who raised it (config max_completions) is not refused by a default elsewhere.
    from datasets import Dataset

    from trl_rm_env.tiny_models import build_tiny_reward_model
    from trl_rm_env.trainer import RankedRewardConfig, RankedRewardTrainer

    dataset = Dataset.from_list([record(0, 1, 2, 3), record(0, 1)])
    model = build_tiny_reward_model(tiny_tokenizer, seed=0)

    def trainer(limit):
        args = RankedRewardConfig(
            output_dir=str(tmp_path / "out"), max_steps=1, use_cpu=True, report_to="none", max_completions=limit
        )
        return RankedRewardTrainer(model=model, args=args, train_dataset=dataset, processing_class=tiny_tokenizer)

    with pytest.raises(
        DataValidationError, match=r"row 0, field 'completions': 4 completions, more than the limit of 3"
    ):
        trainer(3)
    assert len(trainer(4).train_dataset) == 2
    assert len(trainer(0).train_dataset) == 2  # 0: no limit
    with pytest.raises(ValueError, match="max_completions must be >= 0"):
        RankedRewardConfig(output_dir=str(tmp_path / "out"), max_completions=-1)


def test_pairs_are_formed_within_records_only_in_row_order():
    """Same pairs, same order as the all-pairs definition, for contiguous and interleaved records."""
    gen = torch.Generator().manual_seed(0)
    for trial in range(200):
        rows = int(torch.randint(1, 30, (1,), generator=gen))
        ranks = torch.randint(0, 4, (rows,), generator=gen)
        record_index = torch.randint(0, 5, (rows,), generator=gen)
        if trial % 2:
            record_index = record_index.sort().values
        expected = [(i, j) for i in range(rows) for j in range(rows)
                    if record_index[i] == record_index[j] and ranks[i] < ranks[j]]  # fmt: skip
        better, worse = ranked_pairs(ranks, record_index)
        assert list(zip(better.tolist(), worse.tolist())) == expected


@pytest.mark.slow
def test_pair_memory_grows_with_records_not_with_the_batch_squared():
    """20,000 completions in 4,000 records: ~40k index entries. A (C, C) matrix would be 400 MB (x3)."""
    loss_py = Path(ranked_pairs.__code__.co_filename)  # loaded alone: no transformers/TRL import in the child
    code = (
        "import importlib.util, resource, sys, torch\n"
        f"spec = importlib.util.spec_from_file_location('loss', {str(loss_py)!r})\n"
        "loss = importlib.util.module_from_spec(spec); sys.modules['loss'] = loss; spec.loader.exec_module(loss)\n"
        "ranked_bradley_terry_loss = loss.ranked_bradley_terry_loss\n"
        "C = 20000\n"
        "ranks = torch.arange(C) % 5\n"
        "record_index = torch.arange(C) // 5\n"
        "scores = torch.zeros(C, requires_grad=True)\n"
        "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "out = ranked_bradley_terry_loss(scores, ranks, record_index)\n"
        "out.loss.backward()\n"
        "after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "print(out.better.numel(), round(out.loss.item(), 6), (after - before) // 1024)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    pairs, loss, grown_mib = result.stdout.split()
    assert int(pairs) == 4000 * 10 and float(loss) == round(math.log(2), 6)
    assert int(grown_mib) < 100, f"pair code grew RSS by {grown_mib} MiB"


def test_3000_completions_in_one_record_through_the_pair_code():
    n = 3000
    ranks = torch.arange(n) % 3  # 3 distinct ranks: 3 * 1000 * 1000 pairs
    scores = -ranks.float().requires_grad_()
    out = ranked_bradley_terry_loss(scores, ranks, torch.zeros(n, dtype=torch.long))
    assert out.better.numel() == 3 * 1000 * 1000
    expected = (2 * 1000 * 1000 * math.log1p(math.exp(-1)) + 1000 * 1000 * math.log1p(math.exp(-2))) / 3e6
    assert out.loss.item() == pytest.approx(expected, rel=1e-5)


def test_non_finite_margin_that_bypassed_validation_stops_the_loss():
    """Pre-tokenized data (`chosen_ids`, `rejected_ids`, `margin`) is not re-validated: the loss refuses NaN/inf and
    margins over the bound, as validation does."""
    scores = torch.tensor([1.0, 0.0, 2.0, 0.5], requires_grad=True)
    ranks, record_index = torch.tensor([0, 1, 0, 1]), torch.tensor([0, 0, 1, 1])
    for value in (math.nan, math.inf, 1e30):
        with pytest.raises(
            ValueError,
            match=r"margin is not finite or larger than 1000 in size for batch record\(s\) \[1\] \(values "
            r"\[(nan|inf|1\.0+\d*e\+30)\]\)",
        ):
            ranked_bradley_terry_loss(scores, ranks, record_index, margin=torch.tensor([0.5, value]))
    assert torch.isfinite(ranked_bradley_terry_loss(scores, ranks, record_index, margin=torch.tensor([0.5, 0.0])).loss)


# --- skip and count ---


EVERY_BAD_LINE = [
    GOOD_LINE[:-1] + b', "margin": NaN}',
    json.dumps(record(0, 1, margin="big")).encode(),
    json.dumps(record(0, 1)).replace("answer 0", "caf\u00e9").encode("latin-1"),
    b"[" * 100_000 + b"]" * 100_000,
    json.dumps(record(0, 1, task="\ud800")).encode(),
    json.dumps(record(0, 2**64)).encode(),
    GOOD_LINE.replace(b'"role": "user"', b'"role": "wizard"'),
    GOOD_LINE.replace(b'"role": "assistant", "content": "answer 1"', b'"role": "user", "content": "answer 1"'),
    json.dumps({"context": "q", "completions": [{"rank": i, "completion": "a"} for i in range(1025)]}).encode(),
]


def test_skip_counts_every_class_and_logs_the_summary_once(tmp_path, caplog):
    path = write_lines(tmp_path, b"\xef\xbb\xbf" + GOOD_LINE, *EVERY_BAD_LINE, json.dumps({"context": []}).encode(),
                       json.dumps(record(0, 1, margin=1)).encode())  # fmt: skip
    with caplog.at_level(logging.WARNING):
        records, report = load_rank_records(str(path), on_invalid="skip")
    assert (report.kept, report.skipped) == (2, len(EVERY_BAD_LINE) + 1)
    assert sum(report.reasons.values()) == report.skipped
    summaries = [
        r for r in caplog.records if "invalid row(s)" in r.getMessage() or "invalid record(s)" in r.getMessage()
    ]
    assert len(summaries) == 1
    assert f"skipped {report.skipped} invalid row(s) of {report.skipped + 2}" in summaries[0].getMessage()
    dataset = load_rank_dataset(str(path), on_invalid="skip")  # and the kept rows form a table
    assert dataset["margin"] == [None, 1.0]


def test_validate_prints_the_summary_once_and_logs_nothing(tmp_path, capsys, caplog):
    path = write_lines(tmp_path, GOOD_LINE, *EVERY_BAD_LINE)
    with caplog.at_level(logging.INFO):
        code, out, err = run_validate(capsys, path)
    assert code == 1 and err == ""
    assert out.count(f"{path}: 1 valid record(s), {len(EVERY_BAD_LINE)} invalid, 0 tie(s) dropped") == 1
    assert out.count("First invalid rows:") == 1
    assert [r for r in caplog.records if r.name.startswith("trl_rm_env")] == []


def test_only_the_main_process_logs_the_summary(tmp_path, caplog, monkeypatch):
    path = write_lines(tmp_path, GOOD_LINE, EVERY_BAD_LINE[0])
    monkeypatch.setenv("RANK", "1")
    with caplog.at_level(logging.WARNING):
        _, report = load_rank_records(str(path), on_invalid="skip")
    assert report.skipped == 1 and caplog.records == []


def test_validate_file_errors_are_one_line(tmp_path, capsys):
    code, out, err = run_validate(capsys, tmp_path / "missing.jsonl")
    assert (code, out, err) == (1, "", f"error: data file not found: {tmp_path / 'missing.jsonl'}\n")
    path = write_lines(tmp_path, b"[" * 100_000 + b"]" * 100_000)
    code, out, err = run_validate(capsys, path)  # nothing valid: still the summary, exit 1
    assert code == 1 and out.startswith(f"{path}: 0 valid record(s), 1 invalid") and err == ""


@pytest.mark.parametrize(
    ("second", "message"),
    [
        ({"context": "q", "completions": [{"rank": 0, "completion": "a"}, {"rank": 1, "completion": "b"}]},
         "mixes plain-text records (context is a string) with conversational ones"),
        (record(0, 1, task=["a", "list"]), "records do not fit one table"),
    ],
)  # fmt: skip
def test_validate_catches_records_that_cannot_form_one_table(tmp_path, capsys, second, message):
    """Each record is valid alone, but training could not build its dataset: validate says so, as training would."""
    path = write_lines(tmp_path, json.dumps(record(0, 1, task="x")).encode(), json.dumps(second).encode())
    with pytest.raises(ValueError, match=re.escape(message)):
        load_rank_dataset(str(path))
    code, out, err = run_validate(capsys, path)
    assert (code, out) == (1, "") and err.startswith(f"error: {path}: {message}") and err.count("\n") == 1


def test_validate_help_lists_every_format_the_loaders_accept():
    validate = build_parser()._subparsers._group_actions[0].choices["validate"]
    fmt = next(a for a in validate._actions if a.dest == "format")
    assert set(fmt.choices) == {"rank", *ALL_CONVERTERS, *REGRESSION_FORMATS}
    assert all(name in validate.format_help() for name in fmt.choices)
    limit = next(a for a in validate._actions if a.dest == "max_completions")
    assert f"default {MAX_COMPLETIONS_PER_RECORD}" in limit.help


# --- regression data: the same checks, shared ---


def regression(value=3, **extra) -> dict:
    return {"context": [msg("user", "2+2?")], "completion": [msg("assistant", "4")],
            "attributes": {"helpfulness": value}, **extra}  # fmt: skip


REG_LINE = json.dumps(regression()).encode()


@pytest.mark.parametrize(
    ("line", "where", "reason"),
    [
        (REG_LINE.replace(b": 3}", b": NaN}"), "line 2, field 'attributes.helpfulness'", "must be a finite number, got nan"),
        (REG_LINE.replace(b": 3}", b": -Infinity}"), "line 2, field 'attributes.helpfulness'", "must be a finite number, got -inf"),
        (REG_LINE.replace(b": 3}", b": " + b"9" * 400 + b"}"), "line 2, field 'attributes.helpfulness'", "must be a finite number, got 9"),
        (REG_LINE.replace(b": 3}", b': "high"}'), "line 2, field 'attributes.helpfulness'", "must be a number, got str 'high'"),
        (REG_LINE.replace(b"2+2?", b"2+2\xff"), "line 2", "not valid UTF-8: byte 0xff"),
        (b'{"a":' * 50_000 + b"1" + b"}" * 50_000, "line 2", "invalid JSON: nested too deeply"),
        (REG_LINE.replace(b"2+2?", b"\\ud800"), "line 2, field 'context[0].content'", "text holds a lone surrogate"),
        (REG_LINE.replace(b'"role": "user"', b'"role": "wizard"'), "line 2, field 'context[0].role'", "unknown role 'wizard'"),
        (REG_LINE.replace(b'"role": "assistant"', b'"role": "system"'), "line 2, field 'completion[0].role'",
         "a completion may hold only assistant and tool messages, got 'system'"),
    ],
)  # fmt: skip
def test_regression_data_gets_the_same_checks(tmp_path, capsys, line, where, reason):
    path = write_lines(tmp_path, b"\xef\xbb\xbf" + REG_LINE, line, REG_LINE)
    assert_rejected(path, where, re.escape(reason), loader=load_regression_records)
    code, out, _ = run_validate(capsys, path, "--format", "regression")
    assert code == 1 and "2 valid record(s), 1 invalid" in out and reason in out
