"""`trl-rm-env eval --judge` (and `--cascade`): a judge's per-set accuracy, position consistency and costs on the
same pairs as the reward model, equal to a one-at-a-time reference; the cascade asks the judge exactly for the pairs
under the margin. On transformers here; tests/test_judges_vllm.py holds vLLM to the same numbers."""

from __future__ import annotations

import json

import pytest
import torch
from trl_rm_env.recipes.cli import main as cli_main

from trl_rm_env.data.loaders import load_rank_records
from trl_rm_env.data.schema import iter_pairs
from trl_rm_env.judges.builtin_modes import MODES
from trl_rm_env.judges.templates import PAIRWISE, POINTWISE

LLMBAR = [
    {"input": "What is 2+2?", "output_1": "4", "output_2": "5", "label": 1},
    {"input": "Name a colour.", "output_1": "Seven.", "output_2": "Blue.", "label": 2},
    {"input": "Say hi.", "output_1": "Hello!", "output_2": "Bye.", "label": 1},
    {"input": "Count to three.", "output_1": "1, 2, 3.", "output_2": "3, 2, 1.", "label": 1},
]


@pytest.fixture(scope="module")
def llmbar_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("llmbar") / "natural.json"
    path.write_text(json.dumps(LLMBAR))
    return path


@pytest.fixture(scope="module")
def in_domain_head(tmp_path_factory):
    """The bundled `sample:in_domain` set's first 40 records (about 140 pairs) as a JSONL file: the cascade's tests
    judge every pair, so the whole set (200 records, 706 pairs) would only repeat the same checks."""
    records, _ = load_rank_records("sample:in_domain")
    path = tmp_path_factory.mktemp("in-domain") / "in_domain_head.jsonl"
    path.write_text("".join(json.dumps(record) + "\n" for record in records[:40]), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def plain(tiny_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = tiny_dir / "policy"
    return AutoModelForCausalLM.from_pretrained(path).eval(), AutoTokenizer.from_pretrained(path)


@torch.no_grad()
def next_token(model, tok, text, labels):
    rendered = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False)
    logprobs = torch.log_softmax(model(**tok(rendered, return_tensors="pt")).logits[0, -1].double(), -1)
    p = logprobs[[tok.convert_tokens_to_ids(label) for label in labels]].exp()
    return p / p.sum()


def reference(plain, records, mode):
    """Each pair judged alone with the plain model: (accuracy, position consistency)."""
    model, tok = plain
    correct = consistent = pairs = 0
    for record in records:
        prompt = record["context"][0]["content"]
        texts = [c["completion"][0]["content"] for c in record["completions"]]
        for i, j in iter_pairs([c["rank"] for c in record["completions"]]):
            pairs += 1
            if mode == "pointwise":
                fmt = MODES["pointwise"].answer_formats["logprobs"].format(max_score=9)
                rating = [
                    float((next_token(model, tok, POINTWISE.format(prompt=prompt, completion=t, max_score=9,
                                                                    answer_format=fmt), [str(k) for k in range(1, 10)])
                           * torch.arange(1, 10)).sum())
                    for t in (texts[i], texts[j])
                ]  # fmt: skip
                correct += rating[0] > rating[1]
                continue
            fmt = MODES["pairwise"].answer_formats["logprobs"]
            first = float(next_token(model, tok, PAIRWISE.format(prompt=prompt, completion_a=texts[i],
                                                                 completion_b=texts[j], answer_format=fmt), "AB")[0])
            second = 1 - float(next_token(model, tok, PAIRWISE.format(prompt=prompt, completion_a=texts[j],
                                                                      completion_b=texts[i], answer_format=fmt), "AB")[0])
            correct += (first + second) / 2 > 0.5
            consistent += (first > 0.5) == (second > 0.5)
    return correct / pairs, consistent / pairs


@pytest.mark.parametrize("mode", ["pointwise", "pairwise"])
def test_judge_accuracy_and_consistency_equal_one_at_a_time_reference(tiny_dir, llmbar_file, plain, tmp_path, mode):
    out = tmp_path / "results.json"
    code = cli_main(["eval", "--judge", str(tiny_dir / "policy"), "--judge-mode", mode, "--data", str(llmbar_file),
                     "--format", "llmbar", "--output", str(out), "--no-progress"])  # fmt: skip
    assert code == 0
    results = json.loads(out.read_text())["judge"]
    records, _ = load_rank_records(str(llmbar_file), data_format="llmbar")
    accuracy, consistency = reference(plain, records, mode)
    got = results["sets"]["llmbar-natural"]  # LLMBar's natural.json is named after its RewardBench subset
    assert got["pairs"] == 4 and got["accuracy"] == pytest.approx(accuracy)
    assert got["no_verdict"] == 0
    assert results["cost"]["judgements"] == 8  # 8 completions rated once, or 4 pairs judged in both orders
    if mode == "pairwise":
        assert got["position_consistency"] == pytest.approx(consistency)
    assert results["per_1k_pairs"]["judgements"] == pytest.approx(2000)
    assert results["cost"]["tokens"] > 0 and 0 < results["cost"]["rating_mass"] <= 1


@pytest.mark.slow
def test_side_by_side_and_the_cascade_asks_the_judge_exactly_under_the_margin(tiny_dir, in_domain_head, capsys, tmp_path):
    out = tmp_path / "results.json"
    code = cli_main(["eval", "--model", str(tiny_dir / "reward_model"), "--judge", str(tiny_dir / "policy"),
                     "--judge-engine", "hf", "--judge-mode", "pairwise", "--cascade", "--cascade-margin", "0.05",
                     "--data", str(in_domain_head),
                     "--output", str(out), "--no-progress", "--scores", str(tmp_path / "scores.jsonl")])  # fmt: skip
    assert code == 0
    printed = capsys.readouterr().out
    assert "reward model" in printed and "judge (pairwise, logprobs)" in printed and "cascade (|margin| < 0.05" in printed
    results = json.loads(out.read_text())
    scores = {}
    for line in (tmp_path / "scores.jsonl").read_text().splitlines():
        row = json.loads(line)
        scores[(row["record"], row["completion"])] = row["score"]
    records, _ = load_rank_records(str(in_domain_head))
    margins = [scores[(r, i)] - scores[(r, j)] for r, record in enumerate(records)
               for i, j in iter_pairs([c["rank"] for c in record["completions"]])]  # fmt: skip
    under = sum(abs(m) < 0.05 for m in margins)
    cascade = results["cascade"]
    assert cascade["sent"] == under and 0 < under < len(margins)
    assert cascade["cost"]["judgements"] == 2 * under  # each pair sent, in both orders; no other
    assert cascade["share"] == pytest.approx(under / len(margins))
    assert results["agreement"]["pairs"] == sum(m != 0 for m in margins) - results["judge"]["sets"]["in_domain_head"][
        "verdict_ties"] - results["judge"]["sets"]["in_domain_head"]["no_verdict"]  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["pairwise", "pointwise"])
def test_eval_cascade_is_the_grpo_cascade_reward_pair_for_pair(tiny_dir, in_domain_head, mode):
    """What `eval --cascade` reports for each pair is what `CascadeReward([RewardModelEnvironment, JudgeEnvironment],
    margin=M)` gives that pair as a GRPO group of two (the better answer first at even pairs), on the bundled data's
    first records."""
    from trl_rm_env import CascadeReward, JudgeEnvironment, RewardModelEnvironment
    from trl_rm_env.evaluation.command import EvalRequest, run_eval
    from trl_rm_env.evaluation.judge import pairs_of_sets
    from trl_rm_env.judges.judge_options import JudgeOptions, JudgeSource

    rm, policy = str(tiny_dir / "reward_model"), str(tiny_dir / "policy")
    request = dict(data=(str(in_domain_head),), model=rm, judge=JudgeSource(judge=policy),
                   judge_options=JudgeOptions(mode=mode), progress=False)  # fmt: skip
    records, _ = load_rank_records(str(in_domain_head))
    pairs = pairs_of_sets({"in_domain_head": records})
    environment = RewardModelEnvironment(rm)
    flat = [(records[r]["context"], records[r]["completions"][k]["completion"]) for _, r, i, j in pairs for k in (i, j)]
    scores = environment([p for p, _ in flat], [c for _, c in flat])
    margins = sorted(abs(a - b) for a, b in zip(scores[::2], scores[1::2]))
    k = next(k for k in range(len(margins) // 2, len(margins) - 1) if margins[k + 1] - margins[k] > 1e-4)
    margin = (margins[k] + margins[k + 1]) / 2  # about half the pairs to each source, none at the boundary
    outcome = run_eval(EvalRequest(**request, cascade_margin=margin), show=lambda text: None)

    cascade = CascadeReward([environment, JudgeEnvironment(policy, mode=mode)], margin=margin)
    picks, judged, left = [None] * len(pairs), 0, list(range(len(pairs)))
    while left:  # each call: at most one pair per context, so each pair is a group of its own
        contexts, round_ = set(), []
        for n in left:
            key = json.dumps(records[pairs[n][1]]["context"])
            if key not in contexts:
                contexts.add(key)
                round_.append(n)
        left = [n for n in left if n not in round_]
        shown = [(n, k) for n in round_ for k in ((pairs[n][2], pairs[n][3]) if n % 2 == 0 else (pairs[n][3], pairs[n][2]))]
        called = cascade.call([records[pairs[n][1]]["context"] for n, _ in shown],
                              [records[pairs[n][1]]["completions"][k]["completion"] for n, k in shown])  # fmt: skip
        rewards = called.rewards
        judged += called.calls[1] // 2
        for m, n in enumerate(round_):
            by_completion = {shown[2 * m][1]: rewards[2 * m], shown[2 * m + 1][1]: rewards[2 * m + 1]}
            diff = by_completion[pairs[n][2]] - by_completion[pairs[n][3]]
            picks[n] = "better" if diff > 0 else "worse" if diff < 0 else "tie"
    assert outcome.picks["cascade"] == picks
    assert outcome.results["cascade"]["sent"] == judged and 0 < judged < len(pairs)


def test_cascade_folds_a_contextless_conversation_into_its_grpo_prompt():
    from trl_rm_env.evaluation.judge import evaluate_cascade

    def turn(role, text):
        return {"role": role, "content": text}

    def record(question, better, worse, other_question=None):
        return {"context": [], "completions": [
            {"rank": 0, "completion": [turn("user", question), turn("assistant", better)]},
            {"rank": 1, "completion": [turn("user", other_question or question), turn("assistant", worse)]}]}

    judge = FakeJudge("pairwise", prefer=lambda a, b: 0.8 if a.startswith("good") else 0.2)
    rows = [{"set": "s", "record": 0, "completion": k, "score": 0.0} for k in (0, 1)]  # a tie: the judge decides
    results, picks = evaluate_cascade(judge, {"s": [record("q?", "good", "bad")]}, rows, 1.0, rm_seconds=0.0)
    assert picks == ["better"] and judge.prompts == [[turn("user", "q?")]] * 2  # the shared turn is the GRPO prompt
    with pytest.raises(ValueError, match=r"^eval --cascade: set 's', record 0 has no context and its completions "
                                         r"differ before their last assistant turn: the cascade runs GRPO's reward "
                                         r"functions, which take one prompt per group$"):
        evaluate_cascade(judge, {"s": [record("q?", "good", "bad", "other?")]}, rows, 1.0, rm_seconds=0.0)


@pytest.mark.slow
def test_cascade_counts_a_pair_the_judge_gives_no_verdict_as_such(tiny_dir):
    """A judge whose answers cannot be read (the tiny random LM generating 2 tokens): the cascade's judge-routed
    pairs have no verdict, counted as such (as eval --judge counts them), instead of failing the whole run."""
    from trl_rm_env import JudgeEnvironment
    from trl_rm_env.evaluation.judge import evaluate_cascade, pairs_of_sets

    records, _ = load_rank_records("sample:harder")
    datasets = {"harder": records[:6]}
    pairs = pairs_of_sets(datasets)
    rows = [{"set": "harder", "record": r, "completion": k, "score": 0.0}  # no margin: every pair to the judge
            for _, r, i, j in pairs for k in (i, j)]  # fmt: skip
    judge = JudgeEnvironment(str(tiny_dir / "policy"), mode="pairwise", scoring="generate", max_new_tokens=2,
                             parse_retries=0)  # fmt: skip
    results, picks = evaluate_cascade(judge, datasets, rows, 1.0, rm_seconds=0.0)
    assert results["sent"] == len(pairs) and picks == [None] * len(pairs)
    assert results["sets"]["harder"]["no_verdict"] == len(pairs)


def test_judge_flags_fail_in_one_line(tiny_dir, capsys):
    for argv, message in (
        (["eval", "--data", "sample:in_domain"], "needs --model"),
        (["eval", "--judge", "x", "--cascade", "--data", "sample:in_domain"], "--cascade needs --model"),
        (["eval", "--model", str(tiny_dir / "reward_model"), "--judge-mode", "pairwise", "--data", "sample:in_domain"],
         "mode: options of a judge"),
    ):  # fmt: skip
        with pytest.raises(SystemExit, match=message):
            cli_main(argv)


def test_an_eval_request_names_its_fields_and_the_command_line_names_its_flags():
    from trl_rm_env.recipes.cli import eval_flag

    from trl_rm_env.evaluation import EvalRequest, EvalRequestError
    from trl_rm_env.judges import JudgeOptions, JudgeSource
    from trl_rm_env.runtime import ScoringOptions

    for request, library, flags in (
        (dict(judge=JudgeSource(judge="j"), cascade_margin=1.0), "cascade_margin needs model: ",
         "--cascade needs --model: "),
        (dict(model="m", judge_options=JudgeOptions(mode="pairwise", swap=False)),
         "mode, swap: options of a judge; give judge (or judge_url)",
         "--judge-mode, --judge-swap: options of a judge; give --judge (or --judge-url)"),
        (dict(judge=JudgeSource(judge="j"), scoring=ScoringOptions(batch_size=2)),
         "batch_size: options of model's reward model; the judge's go in judge_options",
         "--batch-size: options of --model's reward model; the judge's go in --judge-options"),
    ):  # fmt: skip
        with pytest.raises(EvalRequestError) as caught:
            EvalRequest(data=("sample:in_domain",), **request)
        assert str(caught.value).startswith(library) and caught.value.spelled(eval_flag).startswith(flags)


@pytest.mark.slow
def test_reward_model_rows_are_todays_eval_and_report_has_the_figure(tiny_dir, llmbar_file, tmp_path):
    base = ["eval", "--model", str(tiny_dir / "reward_model"), "--data", str(llmbar_file), "--format", "llmbar",
            "--no-progress"]  # fmt: skip
    assert cli_main([*base, "--output", str(tmp_path / "alone.json")]) == 0
    judged = [*base, "--judge", str(tiny_dir / "policy"), "--output", str(tmp_path / "both.json")]
    assert cli_main([*judged, "--report", str(tmp_path / "report")]) == 0
    alone = json.loads((tmp_path / "alone.json").read_text())
    both = json.loads((tmp_path / "both.json").read_text())
    assert both["sets"] == alone["sets"] and both["judge"]["mode"] == "pointwise"
    from PIL import Image

    with Image.open(tmp_path / "report" / "sources.png") as figure:
        assert figure.size[0] > 100


def test_pointwise_judge_scores_rewardbench2_from_its_ratings(tiny_dir, tmp_path):
    from trl_rm_env import JudgeEnvironment
    from trl_rm_env.evaluation.rewardbench2 import load_rewardbench2, rewardbench2_scores, split_by_subset

    words = ["yes", "no", "maybe so", "it is four", "five"]
    rows = [
        {"id": str(i), "prompt": f"question {i}?", "chosen": [words[i % 5]],
         "rejected": [words[(i + k) % 5] for k in (1, 2, 3)], "num_correct": 1, "subset": subset}
        for i, subset in enumerate(["Factuality", "Precise IF", "Math", "Safety", "Focus"])
    ]  # fmt: skip
    data = tmp_path / "rb2.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "results.json"
    argv = ["eval", "--judge", str(tiny_dir / "policy"), "--data", str(data), "--format", "rewardbench2",
            "--output", str(out), "--no-progress"]  # fmt: skip
    assert cli_main(argv) == 0
    got = json.loads(out.read_text())["judge"]
    records, _ = load_rewardbench2(str(data))
    datasets = split_by_subset(records)
    judge = JudgeEnvironment(str(tiny_dir / "policy"))
    by_set = {}
    for name, recs in datasets.items():
        contexts = [r["context"] for r in recs for _ in r["completions"]]
        completions = [c["completion"] for r in recs for c in r["completions"]]
        by_set[name] = judge.verdicts(contexts, completions).values
    want = rewardbench2_scores(datasets, by_set)
    assert set(got["rewardbench2"]) == set(want)
    for subset, value in want.items():
        assert got["rewardbench2"][subset]["score"] == pytest.approx(value["score"])
    assert got["sets"]["Factuality"]["pairs"] == 3  # chosen against each rejected


class FakeJudge:
    """A judge with known verdicts (no model): `prefer(first_text, second_text) -> p(first better)` (pairwise) or
    `rate(text) -> rating` (pointwise); records what it was asked."""

    def __init__(self, mode, swap=True, prefer=None, rate=None):
        from types import SimpleNamespace

        from trl_rm_env.judges.builtin_modes import MODES

        self.mode = MODES[mode]
        self.options = SimpleNamespace(mode=mode, swap=swap, scoring="logprobs", pairs="all")
        self.prefer, self.rate, self.asked = prefer, rate, []

    def judge_items(self, contexts, shown):
        from trl_rm_env.judges.judgements import JudgeVerdicts

        texts = [[c[0]["content"] for c in item] for item in shown]
        if all(len(item) == 1 for item in texts):
            values = [self.rate(t) for (t,) in texts]
        else:
            values = [self.prefer(a, b) for a, b in texts]
            self.asked += [tuple(item) for item in texts]
        n = len(values)
        return JudgeVerdicts(values, {"num_judgements": n, "num_unparsed": 0, "num_overlength": 0}, [0.5] * n, 10 * n)

    def judge_pairs(self, pairs):
        return self.mode.judge_pairs(self.judge_items, pairs, self.options)

    def __call__(self, prompts, completions, completion_ids=None, log_metric=None, **kwargs):
        """As a GRPO reward function on groups of two (pairwise, both orders): each one's mean preference."""
        texts = [c[-1]["content"] for c in completions]
        self.prompts = [*getattr(self, "prompts", []), *prompts]
        rewards = []
        for a, b in zip(texts[::2], texts[1::2]):
            first = (self.prefer(a, b) + 1 - self.prefer(b, a)) / 2
            self.asked += [(a, b), (b, a)]
            rewards += [first, 1 - first]
        if log_metric is not None:
            log_metric("judge_env/num_judgements", float(len(texts)))
        return rewards


def fake_sets():
    def record(better, worse):
        return {"context": [{"role": "user", "content": "q"}],
                "completions": [{"rank": 0, "completion": [{"role": "assistant", "content": better}]},
                                {"rank": 1, "completion": [{"role": "assistant", "content": worse}]}]}  # fmt: skip

    return {"s": [record(f"good {k}", f"bad {k}") for k in range(4)]}


def test_pair_bookkeeping_with_a_judge_of_known_verdicts():
    from trl_rm_env.evaluation.judge import agreement, evaluate_cascade, evaluate_judge

    datasets = fake_sets()
    biased = FakeJudge("pairwise", prefer=lambda a, b: 0.9)  # always the first shown
    results, picks = evaluate_judge(biased, datasets)
    m = results["sets"]["s"]
    # Both orders: 0.9 and 1 - 0.9 average to 0.5, a tie on every pair, and no winner survives the swap.
    assert (m["correct"], m["verdict_ties"], m["position_consistency"], m["both_orders"]) == (0, 4, 0.0, 4)
    one_order = FakeJudge("pairwise", swap=False, prefer=lambda a, b: 0.9)
    results, picks = evaluate_judge(one_order, datasets)
    assert picks == ["better", "worse", "better", "worse"]  # better shown first at even pairs: bias is not accuracy
    assert [first.startswith("good") for first, _ in one_order.asked] == [True, False, True, False]
    fair = FakeJudge("pairwise", prefer=lambda a, b: 0.8 if a.startswith("good") else 0.2)
    results, judge_picks = evaluate_judge(fair, datasets)
    assert results["sets"]["s"]["accuracy"] == 1.0 and results["sets"]["s"]["position_consistency"] == 1.0
    assert results["cost"]["judgements"] == 8 and results["per_1k_pairs"]["judgements"] == 2000
    # The cascade: the RM decides pairs 0 (right) and 3 (wrong) by a margin of at least 1; the judge gets 1 and 2.
    rm_rows = [{"set": "s", "record": r, "completion": k, "score": score}
               for r, (b, w) in enumerate([(2.0, 0.0), (0.01, 0.0), (0.0, 0.01), (0.0, 3.0)])
               for k, score in enumerate((b, w))]  # fmt: skip
    fair.asked = []
    cascade, cascade_picks = evaluate_cascade(fair, datasets, rm_rows, 1.0, rm_seconds=1.0, rm_tokens=100)
    assert cascade["sent"] == 2 and sorted({a for a, _ in fair.asked}) == ["bad 1", "bad 2", "good 1", "good 2"]
    assert cascade_picks == ["better", "better", "better", "worse"] and cascade["sets"]["s"]["correct"] == 3
    assert cascade["cost"]["judgements"] == 4 and cascade["cost"]["tokens"] is None  # this judge counts no tokens
    rm = ["better", "better", "worse", "worse"]
    assert agreement(rm, judge_picks) == {"pairs": 4, "same": 2, "rate": 0.5}
    pointwise = FakeJudge("pointwise", rate=lambda t: None if t == "bad 3" else 5.0)
    results, picks = evaluate_judge(pointwise, datasets)
    assert picks == ["tie", "tie", "tie", None]  # equal ratings tie; a missing rating leaves the pair without a verdict
    assert results["sets"]["s"]["verdict_ties"] == 3 and results["sets"]["s"]["no_verdict"] == 1
