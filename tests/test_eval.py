"""`trl-rm-env eval`: accuracy by hand, batch-size invariance, RewardBench weighting, converters of real formats."""

from __future__ import annotations

import gzip
import json

import pytest
import torch
from trl_rm_env.recipes.cli import main

from trl_rm_env.data import DataValidationError, load_rank_records
from trl_rm_env.data.converters import hh_to_rank, llmbar_to_rank, pandalm_to_rank
from trl_rm_env.evaluation import (
    REWARDBENCH_EXAMPLE_COUNTS,
    evaluate_reward_model,
    format_results_table,
    rewardbench_sections,
)
from trl_rm_env.scoring.scorer import RewardScorer
from trl_rm_env.tokenization import encode_conversation

# ---------------------------------------------------------------------------------------------------- helpers


def user(text):
    return [{"role": "user", "content": text}]


def answer(text):
    return [{"role": "assistant", "content": text}]


def record(*ranked):
    """`record((rank, "0.9"), (rank, "0.1"))`: each completion's content is the score the fake scorer gives it."""
    return {"context": user("q"), "completions": [{"rank": r, "completion": answer(s)} for r, s in ranked]}


class ContentScorer:
    """A scorer whose score is the completion's text read as a float: known scores, no model."""

    def __init__(self):
        self.calls = 0

    def score(self, contexts, completions):
        self.calls += 1
        return torch.tensor([float(c[-1]["content"]) for c in completions])


# ---------------------------------------------------------------------------------------------------- accuracy


def test_accuracy_margin_and_counts_by_hand():
    records = [
        record((0, "0.9"), (1, "0.1")),  # right, margin 0.8
        record((0, "0.2"), (1, "0.5")),  # wrong, margin -0.3
        record((0, "0.4"), (1, "0.4")),  # equal scores count as wrong, margin 0
        # 3-way with a rank tie: pairs (0,1) right +0.6 and (0,2) wrong -0.05; the tied (1,2) is no pair
        record((0, "0.9"), (1, "0.3"), (1, "0.95")),
    ]
    scorer = ContentScorer()
    results = evaluate_reward_model(scorer, {"toy": records}, skipped={"toy": 2}, ties={"toy": 1}, progress=False)
    m = results["sets"]["toy"]
    assert scorer.calls == 1  # every completion of every set in one scoring call
    assert (m["records"], m["pairs"], m["correct"], m["score_ties"]) == (4, 5, 2, 1)
    assert m["accuracy"] == pytest.approx(2 / 5)
    assert m["margin"] == pytest.approx((0.8 - 0.3 + 0.0 + 0.6 - 0.05) / 5)
    assert m["rewards_better_mean"] == pytest.approx((0.9 + 0.2 + 0.4 + 0.9 + 0.9) / 5)
    assert (m["skipped"], m["ties"]) == (2, 1)
    assert results["rewardbench"] == {}  # "toy" is no RewardBench subset


def test_sets_are_kept_apart_and_table_lists_them():
    datasets = {
        "all-right": [record((0, "1"), (1, "0"))] * 3,
        "all-wrong": [record((0, "0"), (1, "1"))] * 2,
    }
    results = evaluate_reward_model(ContentScorer(), datasets, progress=False)
    assert results["sets"]["all-right"]["accuracy"] == 1.0
    assert results["sets"]["all-wrong"]["accuracy"] == 0.0
    table = format_results_table(results)
    assert "all-right" in table and "100.00%" in table and "0.00%" in table


def test_same_results_for_any_batch_size_and_equal_to_one_at_a_time(tiny_rm, tiny_tokenizer):
    records, _ = load_rank_records("sample:harder")
    records = records[:12]  # N-way records with rank ties
    # Reference: every completion scored alone with the plain model, then the pairs counted by hand.
    correct = pairs = 0
    margins = []
    with torch.no_grad():
        for rec in records:
            scores = []
            for c in rec["completions"]:
                ids = torch.tensor([encode_conversation(tiny_tokenizer, rec["context"], c["completion"])])
                scores.append(tiny_rm(input_ids=ids, attention_mask=torch.ones_like(ids)).logits[0][0].item())
            for i, ci in enumerate(rec["completions"]):
                for j, cj in enumerate(rec["completions"]):
                    if ci["rank"] < cj["rank"]:
                        pairs += 1
                        correct += scores[i] > scores[j]
                        margins.append(scores[i] - scores[j])
    runs = [
        evaluate_reward_model(RewardScorer(tiny_rm, tiny_tokenizer, **kw), {"harder": records}, progress=False)
        for kw in ({"batch_size": 1}, {"batch_size": 16}, {"max_tokens_per_batch": 300})
    ]
    for results in runs:
        m = results["sets"]["harder"]
        assert (m["pairs"], m["correct"]) == (pairs, correct)
        assert m["margin"] == pytest.approx(sum(margins) / pairs, abs=1e-5)
    assert runs[0]["sets"]["harder"]["accuracy"] == runs[1]["sets"]["harder"]["accuracy"]


# ---------------------------------------------------------------------------------------------------- RewardBench


def test_rewardbench_sections_weight_subsets_by_example_count():
    accuracies = {
        "llmbar-natural": 0.5,
        "LLMBar-Adver-Neighbor": 0.25,  # matched case-insensitively
        "mt-bench-hard": 1.0,
        "alpacaeval-easy": 0.9,
        "my-own-set": 0.0,  # not a subset: ignored
    }
    sections = rewardbench_sections(accuracies)
    assert set(sections) == {"Chat", "Chat Hard"}
    # (0.5 * 100 + 0.25 * 134 + 1.0 * 37) / (100 + 134 + 37), RewardBench's calculate_scores_per_section
    assert sections["Chat Hard"]["score"] == pytest.approx(120.5 / 271)
    assert sections["Chat Hard"]["subsets"] == ["mt-bench-hard", "llmbar-natural", "llmbar-adver-neighbor"]
    assert "llmbar-adver-GPTInst" in sections["Chat Hard"]["missing"]
    assert sections["Chat"]["score"] == pytest.approx(0.9)


def test_rewardbench_overall_score_needs_all_four_sections():
    accuracies = {"alpacaeval-easy": 1.0, "mt-bench-hard": 0.5, "donotanswer": 0.5, "math-prm": 0.0, "hep-go": 1.0}
    sections = rewardbench_sections(accuracies)
    # Reasoning: math-prm weighs 984 (RewardBench's upweighting) against 164 for hep-go.
    reasoning = (0.0 * 984 + 1.0 * 164) / (984 + 164)
    assert sections["Reasoning"]["score"] == pytest.approx(reasoning)
    assert sections["Score"]["score"] == pytest.approx((1.0 + 0.5 + 0.5 + reasoning) / 4)
    assert REWARDBENCH_EXAMPLE_COUNTS["math-prm"] == 984


def test_evaluate_reports_sections_for_subset_names():
    datasets = {"llmbar-natural": [record((0, "1"), (1, "0"))], "mt-bench-hard": [record((0, "0"), (1, "1"))]}
    results = evaluate_reward_model(ContentScorer(), datasets, progress=False)
    assert results["rewardbench"]["Chat Hard"]["score"] == pytest.approx(100 / 137)
    assert "Chat Hard" in format_results_table(results)


# ---------------------------------------------------------------------------------------------------- converters


def test_llmbar_rows():
    row = {"input": "Say hi.", "output_1": "bye", "output_2": "hi", "label": 2}
    rec = llmbar_to_rank(row, "llmbar.json", 0)
    assert rec["context"] == user("Say hi.")
    assert [(c["rank"], c["completion"][0]["content"]) for c in rec["completions"]] == [(1, "bye"), (0, "hi")]
    assert llmbar_to_rank({**row, "label": 1}, "x", 0)["completions"][0]["rank"] == 0
    with pytest.raises(DataValidationError, match=r"x\.json, row 3, field 'label': must be 1 .* or 2 .*got 3"):
        llmbar_to_rank({**row, "label": 3}, "x.json", 3)
    with pytest.raises(DataValidationError, match=r"row 4, field 'output_2': missing 'output_2'"):
        llmbar_to_rank({"input": "a", "output_1": "b", "label": 1}, "x.json", 4)
    with pytest.raises(DataValidationError, match=r"field 'input': must be a string, got int"):
        llmbar_to_rank({**row, "input": 5}, "x.json", 5)


def test_llmbar_file_errors_name_the_row(tmp_path):
    path = tmp_path / "natural.json"
    rows = [{"input": "a", "output_1": "b", "output_2": "c", "label": 1}, {"input": "a", "output_1": "b", "label": 1}]
    path.write_text(json.dumps(rows))
    with pytest.raises(DataValidationError, match=r"natural\.json, row 1, field 'output_2'"):
        load_rank_records(str(path), data_format="llmbar")
    records, report = load_rank_records(str(path), data_format="llmbar", on_invalid="skip")
    assert (len(records), report.skipped) == (1, 1)


def pandalm_row(votes, **overrides):
    row = {
        "idx": 7,
        "cmp_key": "a_b",
        "instruction": "Fix the grammar.",
        "input": "he go home",
        "response1": "He goes home.",
        "response2": "he go home",
        "annotator1": votes[0],
        "annotator2": votes[1],
        "annotator3": votes[2],
    }
    return {**row, **overrides}


def test_pandalm_majority_vote_and_ties():
    rec = pandalm_to_rank(pandalm_row((1, 1, 2)), "p.json", 0)
    assert rec["context"] == user("Fix the grammar.\n\nhe go home")
    assert [c["rank"] for c in rec["completions"]] == [0, 1]
    assert (rec["idx"], rec["annotators"]) == (7, [1, 1, 2])
    assert [c["rank"] for c in pandalm_to_rank(pandalm_row((2, 0, 2)), "p", 0)["completions"]] == [1, 0]
    assert pandalm_to_rank(pandalm_row((0, 0, 1)), "p", 0) is None  # majority says tie
    assert pandalm_to_rank(pandalm_row((0, 1, 2)), "p", 0) is None  # no majority
    assert pandalm_to_rank(pandalm_row((1, 1, 1), input=""), "p", 0)["context"] == user("Fix the grammar.")
    # The published file has a few answers stored as JSON booleans: read as their text.
    assert pandalm_to_rank(pandalm_row((2, 2, 2), response1=True), "p", 0)["completions"][0]["completion"] == answer(
        "True"
    )
    with pytest.raises(DataValidationError, match=r"row 2, field 'annotator3': must be 0 \(tie\), 1 or 2"):
        pandalm_to_rank(pandalm_row((1, 1, 3)), "p.json", 2)
    with pytest.raises(DataValidationError, match=r"field 'annotator2': missing"):
        pandalm_to_rank({k: v for k, v in pandalm_row((1, 1, 1)).items() if k != "annotator2"}, "p.json", 2)


def test_pandalm_loader_counts_ties(tmp_path):
    path = tmp_path / "pandalm.json"
    path.write_text(json.dumps([pandalm_row((1, 1, 1)), pandalm_row((0, 0, 0)), pandalm_row((2, 2, 1))]))
    records, report = load_rank_records(str(path), data_format="pandalm")
    assert (len(records), report.ties, report.skipped) == (2, 1, 0)
    assert "annotator majority" in report.tie_rule


HH_CONTEXT = "\n\nHuman: Hi there\n\nAssistant: Hello! How can I help?\n\nHuman: Tell me a joke."


def test_hh_transcripts_split_into_context_and_last_turn():
    row = {
        "chosen": HH_CONTEXT + "\n\nAssistant: Why did the chicken...",
        "rejected": HH_CONTEXT + "\n\nAssistant: No.",
    }
    rec = hh_to_rank(row, "hh.jsonl", 1)
    assert rec["context"] == [
        {"role": "user", "content": "Hi there"},
        {"role": "assistant", "content": "Hello! How can I help?"},
        {"role": "user", "content": "Tell me a joke."},
    ]
    assert rec["completions"] == [
        {"rank": 0, "completion": answer("Why did the chicken...")},
        {"rank": 1, "completion": answer("No.")},
    ]
    assert hh_to_rank({"chosen": row["chosen"], "rejected": row["chosen"]}, "hh", 1) is None  # identical: a tie


def test_hh_malformed_rows():
    good = HH_CONTEXT + "\n\nAssistant: Sure."
    with pytest.raises(DataValidationError, match=r"hh\.jsonl, line 3, field 'rejected': missing 'rejected'"):
        hh_to_rank({"chosen": good}, "hh.jsonl", 3, "line")
    with pytest.raises(DataValidationError, match=r"field 'chosen': text before the first turn"):
        hh_to_rank({"chosen": "Hello" + good, "rejected": good}, "hh.jsonl", 3, "line")
    with pytest.raises(DataValidationError, match=r"field 'rejected': no '\\n\\nHuman:'"):
        hh_to_rank({"chosen": good, "rejected": ""}, "hh.jsonl", 3, "line")
    other = "\n\nHuman: Something else\n\nAssistant: Sure."
    with pytest.raises(DataValidationError, match="share no opening turn"):
        hh_to_rank({"chosen": good, "rejected": other}, "hh.jsonl", 3, "line")
    diverged = "\n\nHuman: Hi there\n\nAssistant: Go away.\n\nHuman: Tell me a joke.\n\nAssistant: Sure."
    with pytest.raises(DataValidationError, match="differ at turn 2, before their last assistant turn"):
        hh_to_rank({"chosen": good, "rejected": diverged}, "hh.jsonl", 3, "line")


def test_hh_gzipped_jsonl_file(tmp_path):
    path = tmp_path / "test.jsonl.gz"
    rows = [
        {"chosen": HH_CONTEXT + "\n\nAssistant: A joke.", "rejected": HH_CONTEXT + "\n\nAssistant: No."},
        {"chosen": HH_CONTEXT + "\n\nAssistant: A joke.", "rejected": HH_CONTEXT + "\n\nAssistant:"},  # empty
    ]
    with gzip.open(path, "wt", encoding="utf-8") as f:
        f.write("\n".join(json.dumps(r) for r in rows) + "\n")
    with pytest.raises(DataValidationError, match=r"test\.jsonl\.gz, line 2, field 'completions\[1\]\.completion'"):
        load_rank_records(str(path), data_format="hh")
    records, report = load_rank_records(str(path), data_format="hh", on_invalid="skip")
    assert (len(records), report.skipped) == (1, 1)


# ---------------------------------------------------------------------------------------------------- CLI


def test_cli_eval_end_to_end_writes_json(tiny_dir, tmp_path, capsys):
    llmbar = tmp_path / "natural.json"  # an LLMBar file name: reported as RewardBench's llmbar-natural
    llmbar.write_text(
        json.dumps(
            [
                {"input": f"What is {i} + {i}?", "output_1": f"{2 * i}", "output_2": f"{2 * i + 1}", "label": 1}
                for i in range(6)
            ]
        )
    )
    out = tmp_path / "out" / "results.json"
    model = str(tiny_dir / "reward_model")
    args = ["eval", "--model", model, "--format", "llmbar", "--no-progress"]
    assert main([*args, "--data", str(llmbar), "--batch-size", "1", "--output", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "llmbar-natural" in printed and "Chat Hard" in printed
    results = json.loads(out.read_text())
    m = results["sets"]["llmbar-natural"]
    assert (m["records"], m["pairs"], m["skipped"]) == (6, 6, 0)
    assert results["rewardbench"]["Chat Hard"]["score"] == pytest.approx(m["accuracy"])
    assert results["model"] == model
    # Same numbers with another batching, and FILE:name naming.
    out2 = tmp_path / "results2.json"
    assert main([*args, "--data", f"{llmbar}:mine", "--max-tokens", "64", "--output", str(out2)]) == 0
    m2 = json.loads(out2.read_text())["sets"]["mine"]
    assert (m2["correct"], m2["pairs"]) == (m["correct"], m["pairs"])
    assert m2["margin"] == pytest.approx(m["margin"], abs=1e-5)


# ---------------------------------------------------------------------------------------------------- length, margins


class ScoreAndLengthScorer:
    """Completion text "score|tokens": a known score and a known completion length (through `encode`)."""

    def score(self, contexts, completions):
        return torch.tensor([float(c[-1]["content"].split("|")[0]) for c in completions])

    def encode(self, contexts, completions):
        from trl_rm_env.scoring.scorer import EncodedBatch

        tokens = [int(c[-1]["content"].split("|")[1]) for c in completions]
        return EncodedBatch([[1] * (3 + n) for n in tokens], [3] * len(tokens))  # 3 context tokens each


def test_length_bias_and_margin_buckets_by_hand():
    import math
    import statistics

    pairs = [  # (better score|tokens, worse score|tokens)
        ("0.9|5", "0.1|10"),  # better is shorter, right, |m| 0.8 -> [0.5, 1)
        ("0.2|10", "0.5|4"),  # better is longer, wrong, |m| 0.3 -> [0, 0.5)
        ("3.0|8", "0.0|2"),  # better is longer, right, |m| 3 -> [2, 4)
        ("1.0|6", "-0.5|6"),  # equal lengths: in neither, right, |m| 1.5 -> [1, 2)
        ("5.0|3", "-1.0|9"),  # better is shorter, right, |m| 6 -> [4, inf)
    ]
    records = [record((0, b), (1, w)) for b, w in pairs]
    m = evaluate_reward_model(ScoreAndLengthScorer(), {"s": records}, progress=False)["sets"]["s"]
    assert m["shorter_better"] == {"pairs": 2, "correct": 2, "accuracy": 1.0}
    assert m["longer_better"] == {"pairs": 2, "correct": 1, "accuracy": 0.5}
    assert m["equal_length_pairs"] == 1
    flat = [x for pair in pairs for x in pair]
    scores = [float(x.split("|")[0]) for x in flat]
    lengths = [float(x.split("|")[1]) for x in flat]
    assert m["length_pearson"] == pytest.approx(statistics.correlation(scores, lengths), abs=1e-9)

    def sigmoid(x):
        return 1 / (1 + math.exp(-x))

    expected = [  # bucket, pairs, correct, mean sigmoid(|margin|)
        ("[0, 0.5)", 1, 0, sigmoid(0.3)),
        ("[0.5, 1)", 1, 1, sigmoid(0.8)),
        ("[1, 2)", 1, 1, sigmoid(1.5)),
        ("[2, 4)", 1, 1, sigmoid(3.0)),
        ("[4, inf)", 1, 1, sigmoid(6.0)),
    ]
    for bucket, (label, n, c, bt) in zip(m["margin_buckets"], expected):
        assert (bucket["bucket"], bucket["pairs"], bucket["correct"]) == (label, n, c)
        assert bucket["accuracy"] == c / n
        assert bucket["bt_expected"] == pytest.approx(bt, abs=1e-6)  # fp32 scores: margins off by ~1e-8
    table = format_results_table({"sets": {"s": m}, "rewardbench": {}})
    assert "100.00% (2)" in table and "50.00% (2)" in table and f"{m['length_pearson']:.4f}" in table


def test_margin_buckets_with_no_scorer_lengths():
    m = evaluate_reward_model(ContentScorer(), {"s": [record((0, "0.9"), (1, "0.1"))]}, progress=False)["sets"]["s"]
    assert m["length_pearson"] != m["length_pearson"]  # NaN: the scorer has no encode
    assert m["shorter_better"]["pairs"] == m["longer_better"]["pairs"] == 0
    assert [b["pairs"] for b in m["margin_buckets"]] == [0, 1, 0, 0, 0]


def test_cli_scores_file_same_for_any_batching_and_equal_to_one_at_a_time(tiny_dir, tmp_path):
    from helpers import reference_scores
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    records, _ = load_rank_records("sample:harder")
    data = tmp_path / "harder.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in records[:10]))
    model = str(tiny_dir / "reward_model")
    args = ["eval", "--model", model, "--data", str(data), "--no-progress"]
    texts = []
    for i, batching in enumerate((["--batch-size", "1"], ["--batch-size", "7"], ["--max-tokens", "200"])):
        out = tmp_path / f"scores{i}.jsonl"
        assert main([*args, *batching, "--scores", str(out)]) == 0
        texts.append(out.read_text())
    runs = [[json.loads(line) for line in text.splitlines()] for text in texts]
    lines = runs[0]
    for other in runs[1:]:  # the same lines; scores equal up to fp32 rounding (padding changes the summation order)
        assert [{**x, "score": None} for x in other] == [{**x, "score": None} for x in lines]
        torch.testing.assert_close(
            torch.tensor([x["score"] for x in other]), torch.tensor([x["score"] for x in lines]), atol=1e-6, rtol=0
        )
    expected = [
        {"set": "harder", "record": r, "id": r, "completion": k, "rank": c["rank"]}
        for r, rec in enumerate(records[:10])
        for k, c in enumerate(rec["completions"])
    ]
    assert [{k: x[k] for k in ("set", "record", "id", "completion", "rank")} for x in lines] == expected
    rm = AutoModelForSequenceClassification.from_pretrained(model).eval()
    tok = AutoTokenizer.from_pretrained(model)
    contexts = [rec["context"] for rec in records[:10] for _ in rec["completions"]]
    completions = [c["completion"] for rec in records[:10] for c in rec["completions"]]
    reference = reference_scores(rm, tok, contexts, completions)
    torch.testing.assert_close(torch.tensor([x["score"] for x in lines]), reference, atol=1e-4, rtol=0)
    # Completion tokens: the whole sequence less the context's, as the scorer encodes it.
    full = [len(encode_conversation(tok, ctx, comp)) for ctx, comp in zip(contexts, completions)]
    assert all(0 < x["tokens"] < n for x, n in zip(lines, full))
