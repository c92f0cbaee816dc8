"""`trl-rm-env eval --report DIR`: the PNG files are real images, and every number in report.md is the JSON result's."""

from __future__ import annotations

import json
import struct
import subprocess
import sys

import pytest
from trl_rm_env.recipes.cli import main

from trl_rm_env.data import load_rank_records

pytest.importorskip("matplotlib")

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def png_size(path):
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC, f"{path.name} is not a PNG"
    assert data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def table_rows(markdown, heading):
    """The cells of the table under `## heading`, header and rule left out."""
    section = markdown.split(f"## {heading}\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("|")]
    return [[c.strip() for c in line.strip("|").split("|")] for line in rows[2:]]


def as_number(cell):
    """ "81.25%" -> 0.8125, "0.1234" -> 0.1234, "n/a" -> None."""
    if cell == "n/a":
        return None
    return float(cell[:-1]) / 100 if cell.endswith("%") else float(cell)


def same(cell, value, digits):
    number = as_number(cell)
    if value is None:
        return number is None
    return number is not None and abs(number - value) <= 0.5 * 10**-digits + 1e-12


@pytest.mark.slow
def test_report_files_and_numbers_equal_the_json(tiny_dir, tmp_path, capsys):
    data = []
    for split in ("in_domain", "harder"):
        records, _ = load_rank_records(f"sample:{split}")
        path = tmp_path / f"{split}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in records[:24]))
        data.append(str(path))
    out, report = tmp_path / "results.json", tmp_path / "report"
    model = str(tiny_dir / "reward_model")
    assert (
        main(
            ["eval", "--model", model, "--data", *data, "--no-progress", "--output", str(out), "--report", str(report)]
        )
        == 0
    )
    assert "report written to" in capsys.readouterr().out
    results = json.loads(out.read_text())
    for name in ("accuracy.png", "score_histograms.png", "margin_calibration.png", "score_vs_length.png"):
        path = report / name
        width, height = png_size(path)
        assert 200 <= width <= 2000 and 150 <= height <= 2000, (name, width, height)
        assert path.stat().st_size < 200_000
    markdown = (report / "report.md").read_text()
    for name in ("accuracy.png", "score_histograms.png", "margin_calibration.png", "score_vs_length.png"):
        assert f"]({name})" in markdown  # embedded, relative to report.md

    sets = results["sets"]
    rows = table_rows(markdown, "Accuracy per set")
    assert [r[0] for r in rows] == list(sets)
    for name, records, pairs, accuracy, margin in rows:
        m = sets[name]
        assert (int(records), int(pairs)) == (m["records"], m["pairs"])
        assert same(accuracy, m["accuracy"], 4) and same(margin, m["margin"], 4)
    rows = table_rows(markdown, "Length bias")
    assert [r[0] for r in rows] == list(sets)
    for name, r, short_acc, short_n, long_acc, long_n in rows:
        m = sets[name]
        assert same(r, m["length_pearson"], 4)
        assert same(short_acc, m["shorter_better"]["accuracy"], 4) and int(short_n) == m["shorter_better"]["pairs"]
        assert same(long_acc, m["longer_better"]["accuracy"], 4) and int(long_n) == m["longer_better"]["pairs"]
    rows = table_rows(markdown, "Calibration: accuracy by |margin|")
    expected = [(name, b) for name, m in sets.items() for b in m["margin_buckets"]]
    assert len(rows) == len(expected)
    for (name, bucket, pairs, accuracy, bt), (set_name, b) in zip(rows, expected):
        assert (name, bucket, int(pairs)) == (set_name, b["bucket"], b["pairs"])
        assert same(accuracy, b["accuracy"], 4) and same(bt, b["bt_expected"], 4)
    assert sum(b["pairs"] for b in sets["harder"]["margin_buckets"]) == sets["harder"]["pairs"]


def test_report_without_matplotlib_is_one_line(tiny_dir, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    from trl_rm_env.evaluation.report import write_report

    with pytest.raises(ImportError, match=r"pip install trl-rm-env\[report\]"):
        write_report({"sets": {}}, [], tmp_path)
    args = ["eval", "--model", str(tiny_dir / "reward_model"), "--data", "sample:harder", "--report", str(tmp_path)]
    with pytest.raises(SystemExit, match=r"^error: eval --report needs matplotlib: pip install trl-rm-env\[report\]$"):
        main(args)


@pytest.mark.slow  # a fresh interpreter importing the package: seconds
def test_report_without_matplotlib_fails_before_loading_anything(tiny_dir, tmp_path):
    args = ["eval", "--model", str(tiny_dir / "reward_model"), "--data", "sample:harder", "--report", str(tmp_path)]
    # Before anything heavy is imported or loaded (transformers and the model take seconds): in a fresh process.
    code = (
        "import sys; sys.modules['matplotlib'] = None\n"
        "from trl_rm_env.recipes.cli import main\n"
        f"try:\n    main({args!r})\nexcept SystemExit as err:\n    print(err)\n"
        "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True).stdout
    assert out == "error: eval --report needs matplotlib: pip install trl-rm-env[report]\n[]\n"
