"""RewardBench 2 in `eval`: rows read from files, best-of-N with shared credit for ties, the Ties weighted score and
the six-subset mean, each checked against values worked out by hand from scores the test controls."""

from __future__ import annotations

import json
import math

import pytest
import torch
from helpers import _one_thread, reference_scores  # noqa: F401
from trl_rm_env.recipes.cli import main

from trl_rm_env.data import DataValidationError
from trl_rm_env.evaluation import evaluate_reward_model
from trl_rm_env.evaluation.rewardbench2 import REWARDBENCH2_SUBSETS, load_rewardbench2, split_by_subset, ties_score


class ContentScorer:
    """Scores each completion by reading its text as a float: known scores, no model."""

    def score(self, contexts, completions):
        return torch.tensor([float(c[-1]["content"]) for c in completions], dtype=torch.float64)


def row(subset, chosen, rejected, row_id="0", prompt="q"):
    return {
        "id": row_id,
        "prompt": prompt,
        "chosen": [str(s) for s in chosen],
        "rejected": [str(s) for s in rejected],
        "num_correct": len(chosen),
        "subset": subset,
    }


# Every score is a float written as the completion text; the expected values below are worked out by hand.
FIXTURE = [
    row("Factuality", [0.9], [0.1, 0.2, 0.3], "1"),  # chosen strictly on top: 1
    row("Factuality", [0.5], [0.5, 0.1, 0.2], "2"),  # chosen shares the top with one rejected: 1/2
    row("Factuality", [0.2], [0.9, 0.1, 0.0], "3"),  # a rejected on top: 0
    row("Factuality", [0.7], [0.7, 0.7, 0.7], "4"),  # all four equal: 1/4
    row("Precise IF", [2.0], [1.0, 0.0, -1.0], "5"),  # 1
    row("Math", [0.0], [1.0, -1.0, -2.0], "6"),  # 0
    row("Safety", [3.0], [2.0, 1.0, 0.0], "7"),  # 1
    row("Safety", [1.0], [2.0, 1.0, 0.0], "8"),  # 0
    row("Focus", [5.0], [4.0, 4.0, 4.0], "9"),  # 1
    # Ties, prompt 0: ref margin 3-2 = 1 (accurate); tied margin min(3, 2.5, 2.8) - max(1, .5) = 1.5 (accurate),
    # spread 3 - 2.5 = 0.5; hard margin min(1, 1.5) = 1 -> preferred 1, preferred_hard 1, tanh(1 / 0.5 - 1) = tanh(1).
    row("Ties", [3.0], [1.0, 2.0], "ref:0"),
    row("Ties", [3.0, 2.5, 2.8], [1.0, 0.5], "tied:0"),
    # Ties, prompt 1: ref margin 1 - 2 = -1 (wrong); tied margin min(4, 2) - 3 = -1 (wrong), spread 4 - 2 = 2;
    # hard margin -1 -> preferred 0, preferred_hard 0, tanh(-1 / 2 - 1) = tanh(-1.5).
    row("Ties", [1.0], [2.0], "ref:1"),
    row("Ties", [4.0, 2.0], [3.0], "tied:1"),
]
EXPECTED = {
    "Factuality": (1 + 0.5 + 0 + 0.25) / 4,
    "Precise IF": 1.0,
    "Math": 0.0,
    "Safety": 0.5,
    "Focus": 1.0,
    # 0.30 tied acc (1/2) + 0.30 ref acc (1/2) + 0.20 preferred (1/2) + 0.20 preferred_hard (1/2) + 0.01 margin
    "Ties": 0.3 * 0.5 + 0.3 * 0.5 + 0.2 * 0.5 + 0.2 * 0.5 + 0.01 * (math.tanh(1.0) + math.tanh(-1.5)) / 2,
}


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_subset_scores_and_mean_by_hand(tmp_path):
    records, report = load_rewardbench2(str(write_jsonl(tmp_path / "rb2.jsonl", FIXTURE)))
    assert report.kept == len(FIXTURE) and report.skipped == 0
    datasets = split_by_subset(records)
    assert list(datasets) == list(REWARDBENCH2_SUBSETS)
    rb2 = evaluate_reward_model(ContentScorer(), datasets, progress=False)["rewardbench2"]
    got = {subset: rb2[subset]["score"] for subset in REWARDBENCH2_SUBSETS}
    print("eval:", got)
    print("hand:", EXPECTED)
    assert got == pytest.approx(EXPECTED, abs=1e-12)
    assert rb2["Score"]["score"] == pytest.approx(sum(EXPECTED.values()) / 6, abs=1e-12)
    ties = rb2["Ties"]
    assert (ties["ref_accuracy"], ties["tied_accuracy"], ties["preferred"], ties["preferred_hard"]) == (
        0.5,
        0.5,
        0.5,
        0.5,
    )
    assert (rb2["Factuality"]["rows"], rb2["Factuality"]["correct"], ties["prompts"]) == (4, 1.75, 2)


def test_score_needs_all_six_subsets():
    records, _ = load_rewardbench2([r for r in FIXTURE if r["subset"] != "Math"])
    rb2 = evaluate_reward_model(ContentScorer(), split_by_subset(records), progress=False)["rewardbench2"]
    assert "Math" not in rb2 and "Score" not in rb2
    assert rb2["Focus"]["score"] == 1.0


def test_ties_zero_spread_follows_numpy_division():
    # spread 0: hard margin 0 -> 0/0 = nan -> 0; hard margin 1 -> 1/0 = inf -> tanh(inf) = 1
    rows = [("ref:0", 1, [1.0, 0.0]), ("tied:0", 2, [1.0, 1.0, 1.0])]  # tied margin 0, hard min(1, 0) = 0
    assert ties_score(rows)["margin_score"] == 0.0
    rows = [("ref:0", 1, [2.0, 1.0]), ("tied:0", 2, [2.0, 2.0, 1.0])]  # margins 1 and 1, spread 0
    parts = ties_score(rows)
    assert parts["margin_score"] == 1.0 and parts["preferred"] == 1.0 and parts["preferred_hard"] == 1.0
    with pytest.raises(ValueError, match="tied row has one correct answer"):
        ties_score([("ref:0", 1, [2.0, 1.0]), ("tied:0", 1, [2.0, 1.0])])


def test_one_chosen_one_rejected_row_gives_the_v1_pairwise_result():
    scores = [(0.9, 0.1), (0.2, 0.5), (1.5, -1.0), (0.3, 0.35), (2.0, 1.0)]
    records, _ = load_rewardbench2([row("Focus", [c], [r], str(i)) for i, (c, r) in enumerate(scores)])
    results = evaluate_reward_model(ContentScorer(), {"Focus": records}, progress=False)
    v1 = results["sets"]["Focus"]["accuracy"]  # RewardBench v1's rule: chosen strictly above rejected
    assert v1 == 3 / 5
    assert results["rewardbench2"]["Focus"]["score"] == v1
    # Only an exact score tie differs: v1 counts it wrong, v2 shares the credit.
    records, _ = load_rewardbench2([row("Focus", [0.4], [0.4])])
    results = evaluate_reward_model(ContentScorer(), {"Focus": records}, progress=False)
    assert (results["sets"]["Focus"]["accuracy"], results["rewardbench2"]["Focus"]["score"]) == (0.0, 0.5)


def test_json_and_parquet_files_read_the_same(tmp_path):
    from datasets import Dataset

    jsonl = write_jsonl(tmp_path / "rb2.jsonl", FIXTURE)
    (tmp_path / "rb2.json").write_text(json.dumps(FIXTURE))
    Dataset.from_list(FIXTURE).to_parquet(str(tmp_path / "rb2.parquet"))
    expected, _ = load_rewardbench2(jsonl)
    for name in ("rb2.json", "rb2.parquet"):
        records, _ = load_rewardbench2(str(tmp_path / name))
        assert records == expected
    first = expected[0]
    assert (first["id"], first["subset"], first["num_correct"]) == ("1", "Factuality", 1)
    assert [c["rank"] for c in first["completions"]] == [0, 1, 1, 1]


@pytest.mark.parametrize(
    "change, match",
    [
        ({"rejected": []}, r"line 1.*rejected.*is empty"),
        ({"num_correct": 2}, r"line 1.*num_correct.*is 2 but the row has 1 chosen"),
        ({"chosen": "a string"}, r"line 1.*chosen.*must be a list of strings"),
        ({"subset": "Ties", "id": "7"}, r"line 1.*id.*'ref:<prompt number>'"),
        ({"prompt": None}, r"line 1.*prompt.*must be a string"),
    ],
)
def test_bad_rows_name_line_and_field(tmp_path, change, match):
    path = write_jsonl(tmp_path / "bad.jsonl", [{**row("Math", [1], [0]), **change}])
    with pytest.raises(DataValidationError, match=match):
        load_rewardbench2(str(path))
    records, report = load_rewardbench2(
        str(
            write_jsonl(tmp_path / "mixed.jsonl", [row("Math", [1], [0])] * 2 + [{**row("Math", [1], [0]), **change}])
        ),
        on_invalid="skip",
    )
    assert (len(records), report.skipped) == (2, 1)


def test_cli_rewardbench2_on_the_tiny_model_matches_a_direct_computation(tiny_dir, tmp_path, capsys):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    words = ["yes", "no", "maybe so", "it is four", "the answer is 4, as 2 + 2 = 4", "five"]
    rows = [
        row(subset, [words[i % 6]], [words[(i + k) % 6] for k in (1, 2, 3)], str(i), f"question {i}?")
        for i, subset in enumerate(["Factuality", "Precise IF", "Math", "Safety", "Focus"] * 2)
    ]
    for p in range(2):
        rows.append(row("Ties", ["7"], ["8", "nine"], f"ref:{p}", f"a prime {p}?"))
        rows.append(row("Ties", ["7", "11", "thirteen"], ["8", "nine"], f"tied:{p}", f"a prime {p}?"))
    data = write_jsonl(tmp_path / "rb2.jsonl", rows)
    model = str(tiny_dir / "reward_model")
    out, scores_file = tmp_path / "results.json", tmp_path / "scores.jsonl"
    args = ["eval", "--model", model, "--data", str(data), "--format", "rewardbench2", "--no-progress"]
    assert main([*args, "--batch-size", "5", "--output", str(out), "--scores", str(scores_file)]) == 0
    printed = capsys.readouterr().out
    assert "RewardBench 2 subset" in printed and "Score (mean of 6)" in printed
    results = json.loads(out.read_text())
    lines = [json.loads(line) for line in scores_file.read_text().splitlines()]
    assert len(lines) == sum(len(r["chosen"]) + len(r["rejected"]) for r in rows)

    # The file's scores are the plain model's, one sequence at a time.
    rm = AutoModelForSequenceClassification.from_pretrained(model).eval()
    tok = AutoTokenizer.from_pretrained(model)
    prompts = [[{"role": "user", "content": r["prompt"]}] for r in rows for _ in r["chosen"] + r["rejected"]]
    answers = [[{"role": "assistant", "content": t}] for r in rows for t in r["chosen"] + r["rejected"]]
    reference = reference_scores(rm, tok, prompts, answers)
    by_row = {s: [r for r in rows if r["subset"] == s] for s in REWARDBENCH2_SUBSETS}
    in_set_order = [r for s in REWARDBENCH2_SUBSETS for r in by_row[s]]  # sets are subsets, in RB2's order
    starts, at = [], 0
    for r in rows:
        starts.append(at)
        at += len(r["chosen"]) + len(r["rejected"])
    n_of = [len(r["chosen"]) + len(r["rejected"]) for r in rows]
    order = [
        i for r in in_set_order for i in range(starts[rows.index(r)], starts[rows.index(r)] + n_of[rows.index(r)])
    ]
    torch.testing.assert_close(torch.tensor([x["score"] for x in lines]), reference[order], atol=1e-4, rtol=0)

    # Aggregate directly from the scores file: best-of-N by its definition, Ties by `ties_score`, then the mean.
    expected = {}
    for subset in REWARDBENCH2_SUBSETS:
        per_row = {}
        for x in lines:
            if x["set"] == subset:
                per_row.setdefault(x["record"], []).append(x["score"])
        if subset == "Ties":
            ties_rows = [(by_row["Ties"][k]["id"], by_row["Ties"][k]["num_correct"], s) for k, s in per_row.items()]
            expected[subset] = ties_score(ties_rows)["score"]
        else:
            won = [(1 / sum(v == max(s) for v in s)) if s[0] == max(s) else 0.0 for s in per_row.values()]
            expected[subset] = sum(won) / len(won)
    got = {s: results["rewardbench2"][s]["score"] for s in REWARDBENCH2_SUBSETS}
    assert got == pytest.approx(expected, abs=1e-12)
    assert results["rewardbench2"]["Score"]["score"] == pytest.approx(sum(expected.values()) / 6, abs=1e-12)


def test_cli_rewardbench2_takes_one_source(tiny_dir, tmp_path):
    data = write_jsonl(tmp_path / "rb2.jsonl", FIXTURE)
    model = str(tiny_dir / "reward_model")
    with pytest.raises(SystemExit, match="takes one --data source"):
        main(["eval", "--model", model, "--data", str(data), f"{data}:again", "--format", "rewardbench2"])
