"""`trl-rm-env eval --model RM --judge JUDGE --cascade`'s bookkeeping, against values worked out by hand: a reward
model's picks and margins, the agreement of two sources, a reward model's cost, the cascade run as GRPO runs it (a
real `JudgeEnvironment(mode="genrm")` whose engine writes scripted verdicts, tests/test_genrm_eval_by_hand.py) and the
printed comparison table.

The end-to-end runs on models are tests/test_eval_judge.py (slow); these are fast.
"""

from __future__ import annotations

import re
import time

import pytest
from test_genrm_eval_by_hand import Scripted, record

from trl_rm_env.evaluation.judge import agreement, evaluate_cascade, format_comparison_table, rm_cost, rm_picks

PAIRS = {
    "s": [record("q zero", ("goodzero", 0), ("badzero", 1)), record("q one", ("goodone", 0), ("badone", 1)),
          record("q two", ("goodtwo", 0), ("badtwo", 1)), record("q three", ("tieathree", 0), ("badthree", 1))],
    "t": [record("q four", ("afour", 0), ("bfour", 1)), record("q five", ("xfive", 0), ("zfive", 1))],
}  # fmt: skip
# The reward model's scores (better, worse) of each pair, in order.
RM_SCORES = [(2.0, 0.0), (0.01, 0.0), (0.0, 0.01), (0.0, 3.0), (0.5, 0.0), (0.0, 0.0)]


def rm_rows():
    rows, n = [], 0
    for name, records in PAIRS.items():
        for r, _ in enumerate(records):
            for k, score in enumerate(RM_SCORES[n]):
                rows.append({"set": name, "record": r, "completion": k, "score": score})
            n += 1
    return rows


def test_reward_model_picks_margins_and_agreement():
    picks, margins = rm_picks(rm_rows(), PAIRS)
    assert margins == pytest.approx([2.0, 0.01, -0.01, -3.0, 0.5, 0.0])
    assert picks == ["better", "better", "worse", "worse", "better", "tie"]
    # Agreement counts the pairs both sources decided (neither a tie nor no verdict): pairs 0, 1, 2, 4 here.
    other = ["better", "worse", "worse", None, "better", "better"]
    assert agreement(picks, other) == {"pairs": 4, "same": 3, "rate": 0.75}
    assert agreement(["tie"], ["better"])["pairs"] == 0 and agreement(["tie"], ["better"])["rate"] != 0  # NaN


def test_reward_model_cost_counts_the_tokens_it_scores():
    class Scorer:  # every completion's sequence: its context's length + its own (None: over-length, not scored)
        def encode(self, contexts, completions):
            self.seen = list(zip(contexts, completions))
            ids = [None if c[0]["content"] == "badtwo" else [0] * (len(x[0]["content"]) + len(c[0]["content"]))
                   for x, c in zip(contexts, completions)]  # fmt: skip
            return type("Encoded", (), {"ids": ids})()

    scorer = Scorer()
    cost = rm_cost(scorer, PAIRS, seconds=2.5)
    by_hand = sum(len(r["context"][0]["content"]) + len(c["completion"][0]["content"])
                  for records in PAIRS.values() for r in records for c in r["completions"]
                  if c["completion"][0]["content"] != "badtwo")  # fmt: skip
    assert len(scorer.seen) == 12 and scorer.seen[3] == (PAIRS["s"][1]["context"], PAIRS["s"][1]["completions"][1]["completion"])
    assert cost["tokens"] == by_hand and cost["seconds"] == 2.5 and cost["judgements"] is None
    assert cost["memory_mb"] > 0
    assert rm_cost(object(), PAIRS, 1.0)["tokens"] is None  # a scorer that does not encode here (a server)


@pytest.fixture(scope="module")
def genrm_judge(tiny_dir):
    from trl_rm_env import JudgeEnvironment

    judge = JudgeEnvironment(str(tiny_dir / "policy"), mode="genrm", max_new_tokens=8, parse_retries=0,
                             temperature=0.0)  # fmt: skip
    return judge


def test_the_cascade_sends_the_pairs_under_the_margin_to_the_judge_as_grpo_groups(genrm_judge):
    scripted = Scripted(genrm_judge.tokenizer, {r["context"][0]["content"] for rs in PAIRS.values() for r in rs})
    scripted.silent = {"afour", "bfour"}
    verdict = scripted.verdict
    scripted.verdict = lambda a, b: "no verdict" if a in scripted.silent else verdict(a, b)
    prompts = []
    genrm_judge.engine.generate = lambda ids, *args, **kwargs: prompts.extend(ids) or scripted(ids, *args, **kwargs)
    results, picks = evaluate_cascade(genrm_judge, PAIRS, rm_rows(), 1.0, rm_seconds=1.0, rm_tokens=100,
                                      rm_memory=1e9)  # fmt: skip
    # Margin 1: the RM decides pairs 0 (+2: better) and 3 (-3: worse). The judge gets pairs 1, 2, 4 and 5, each a GRPO
    # group of two (the better answer first at even positions, second at odd ones), in which the GenRM compares the
    # two both ways (comparison_strategy "circular": 0 against 1, 1 against 0) and each gets the mean it received:
    #   pair 1 (goodone, badone: "response 1 is much better" whatever is shown): 3 and 3, a tie;
    #   pair 2 (goodtwo 3, badtwo 1): better; pair 4 (afour, bfour): no verdict at all, undecided;
    #   pair 5 (xfive 4, zfive 2), shown worse first: better.
    assert picks == ["better", "tie", "better", "worse", None, "better"]
    assert results["sent"] == 4 and results["share"] == pytest.approx(4 / 6) and results["margin"] == 1.0
    assert results["rewardbench"] == {}  # no RewardBench v1 subset among the sets
    assert scripted.shown[-2:] == [("zfive", "xfive"), ("xfive", "zfive")]  # the last group, in its order
    assert not {w for pair in scripted.shown for w in pair} & {"goodzero", "badzero", "tieathree", "badthree"}
    s, t = results["sets"]["s"], results["sets"]["t"]
    assert (s["pairs"], s["correct"], s["verdict_ties"], s["accuracy"]) == (4, 2, 1, 0.5)
    assert (t["pairs"], t["correct"], t["no_verdict"], t["verdict_ties"]) == (2, 1, 1, 0)
    # Costs: the judge's judgements and prompt tokens on the pairs sent, the reward model's on every pair
    cost = results["cost"]
    assert cost["judgements"] == len(prompts) and cost["tokens"] == 100 + sum(len(p) for p in prompts)
    assert cost["seconds"] > 1.0 and cost["memory_mb"] == 1e9
    assert results["per_1k_pairs"]["judgements"] == pytest.approx(len(prompts) * 1000 / 6)


def test_the_comparison_table_by_hand():
    judge_sets = {
        "a": {"pairs": 4, "correct": 2, "accuracy": 0.5, "no_verdict": 1, "position_consistency": 0.5,
              "both_orders": 2, "tie_pairs": 2, "ties_correct": 1, "accuracy_with_ties": 0.5,
              "n_way": {"records": 3, "kendall_tau": 1 / 3, "top1_accuracy": 2 / 3, "constant": 1, "failed": 0}},
        "b": {"pairs": 2, "correct": 2, "accuracy": 1.0, "no_verdict": 0, "position_consistency": 1.0,
              "both_orders": 6},
    }  # fmt: skip
    sources = {
        "reward model": {"sets": {"a": {"pairs": 4, "accuracy": 0.75}, "b": {"pairs": 2, "accuracy": 0.5}},
                         "cost": {"memory_mb": 1234.4}, "per_1k_pairs": {"seconds": 12.34, "judgements": None,
                                                                         "tokens": 5000.0},
                         "rewardbench": {"Score": {"score": 0.625}}},
        "judge": {"sets": judge_sets, "cost": {"rating_mass": 0.8765, "memory_mb": 99.6},
                  "per_1k_pairs": {"seconds": 1.25, "judgements": 2000.0, "tokens": 123456.7},
                  "rewardbench2": {"Score": {"score": 0.4}}},
        "cascade": {"share": 0.25, "sets": {"a": {"pairs": 4, "accuracy": 0.25, "no_verdict": 0}},
                    "cost": {"memory_mb": 10.0}, "per_1k_pairs": {"seconds": 3.0, "judgements": 250.0, "tokens": None}},
    }  # fmt: skip
    text = format_comparison_table(sources, {"reward model vs judge": {"rate": 2 / 3, "pairs": 6}})
    lines = text.splitlines()
    header = re.split(r"\s{2,}", lines[0])
    assert header == ["source", "a", "b", "pos. consistency", "no verdict", "verdict mass", "judged", "s / 1k pairs",
                      "judgements / 1k", "tokens / 1k", "peak MB"]  # fmt: skip
    rows = {cells[0]: cells for cells in (re.split(r"\s{2,}", line.strip()) for line in lines[2:5])}
    assert rows["reward model"] == ["reward model", "75.00%", "50.00%", "-", "-", "-", "-", "12.3", "-", "5000", "1234"]
    # position consistency over both sets, weighted by the pairs with both orders: (0.5 * 2 + 1.0 * 6) / 8 = 87.5%;
    # no verdict: 1 of 6 pairs
    assert rows["judge"] == ["judge", "50.00%", "100.00%", "87.5%", "16.7%", "0.876", "100%", "1.2", "2000", "123457",
                             "100"]  # fmt: skip
    assert rows["cascade"] == ["cascade", "25.00%", "-", "-", "0.0%", "-", "25%", "3.0", "250", "-", "10"]  # no b
    # left-aligned columns, each as wide as its widest cell (the header's included), two spaces apart
    cells = [header, rows["reward model"], rows["judge"], rows["cascade"]]
    widths = [max(len(row[k]) for row in cells) for k in range(len(header))]
    assert lines[1] == "  ".join("-" * w for w in widths)
    assert lines[0] == "  ".join(c.ljust(w) for c, w in zip(header, widths))
    for k, row in enumerate(cells[1:], start=2):
        assert lines[k] == "  ".join(c.ljust(w) for c, w in zip(row, widths))
    assert lines[lines.index("Listwise (records with 3+ completions)") - 1] == ""
    assert "Listwise (records with 3+ completions)" in text
    (listwise,) = [line for line in lines if line.startswith("judge / a")]
    assert re.split(r"\s{2,}", listwise) == ["judge / a", "3", "0.3333", "66.67%", "1", "0"]
    assert "RewardBench v1 score, reward model: 62.50%" in lines
    assert "accuracy with ties, judge, a: 50.00% (1 of 2 tied pairs judged a tie)" in lines
    assert "RewardBench 2 score, judge: 40.00%" in lines
    assert lines[-1] == "agreement, reward model vs judge: 66.7% of the 6 pairs both decided"


def test_the_cascade_awaits_a_judge_that_answers_asynchronously():
    """A judge behind servers is a coroutine function (TRL awaits it): the cascade runs each round to its end."""
    asked = []

    async def judge(prompts, completions, **kwargs):  # rewards the longer answer; `q four`'s pair has no verdict
        asked.append(len(prompts))
        return [float("nan") if p[0]["content"] == "q four" else float(len(c[0]["content"]))
                for p, c in zip(prompts, completions)]  # fmt: skip

    results, picks = evaluate_cascade(judge, PAIRS, rm_rows(), 1.0, rm_seconds=0.5)
    # pairs 1, 2, 4 and 5 go to the judge: goodone (7) / badone (6): better; goodtwo (7) / badtwo (6): better;
    # pair 4: no verdict; xfive (5) / zfive (5): a tie
    assert picks == ["better", "better", "better", "worse", None, "tie"]
    assert sum(asked) == 8 and results["sent"] == 4 and results["cost"]["tokens"] is None  # no token count here


def test_the_cascade_counts_time_and_judgements_as_they_happened_and_takes_an_empty_set():
    import time

    async def judge(prompts, completions, **kwargs):  # logs nothing: no judgement is counted for it
        return [float(len(c[0]["content"])) for c in completions]

    start = time.perf_counter()
    results, _ = evaluate_cascade(judge, PAIRS, rm_rows(), 1.0, rm_seconds=1.0)
    elapsed = time.perf_counter() - start
    assert 1.0 <= results["cost"]["seconds"] <= 1.0 + elapsed
    assert results["cost"]["judgements"] == 0 and type(results["sent"]) is int
    empty, picks = evaluate_cascade(judge, {"s": []}, [], 1.0, rm_seconds=0.0)
    assert picks == [] and empty["sent"] == 0 and empty["share"] != empty["share"]  # NaN: no pair


def test_the_cascade_leaves_an_unreadable_or_over_length_verdict_undecided(tiny_dir):
    """A pointwise judge that writes its rating (`scoring="generate"`): a text without a rating, or a judgement over
    `max_length`, is no verdict for its pair (None), not the reward GRPO would give it."""
    from trl_rm_env import JudgeEnvironment

    judge = JudgeEnvironment(str(tiny_dir / "policy"), mode="pointwise", scoring="generate", max_new_tokens=8,
                             parse_retries=0, max_length=1000)  # fmt: skip
    pattern = re.compile("|".join(["goodone", "badone", "goodtwo", "badtwo", "afour", "bfour", "xfive", "zfive"]))
    scores = {"goodone": 7, "badone": 2, "goodtwo": None, "badtwo": 3, "xfive": 4, "zfive": 5}

    def generate(prompts, max_new_tokens, temperature, seeds, top_p=1.0, keep_failures=False):
        out = []
        for ids in prompts:
            (word,) = pattern.findall(genrm_tokenizer.decode(ids))
            out.append("I cannot rate this." if scores[word] is None else f"Fine.\nScore: {scores[word]}")
        return out

    genrm_tokenizer = judge.tokenizer
    judge.engine.generate = generate
    long = {**PAIRS, "t": [record("q four " + "very long question " * 300, ("afour", 0), ("bfour", 1)),
                           PAIRS["t"][1]]}  # fmt: skip
    results, picks = evaluate_cascade(judge, long, rm_rows(), 1.0, rm_seconds=0.0)
    # pair 1: 7 vs 2, better; pair 2: goodtwo unrated: undecided; pair 4 over max_length: undecided; pair 5: 4 vs 5
    assert picks == ["better", "better", None, "worse", None, "worse"]
    assert results["sets"]["t"]["no_verdict"] == 1 and results["sets"]["s"]["no_verdict"] == 1


class RatingJudge:
    """A pointwise judge with known ratings (None: no rating), as `evaluate_judge` asks one."""

    def __init__(self, ratings):
        from types import SimpleNamespace

        from trl_rm_env.judges.builtin_modes import MODES

        self.mode, self.ratings = MODES["pointwise"], ratings
        self.options = SimpleNamespace(mode="pointwise", scoring="logprobs", max_score=9)

    def judge_pairs(self, pairs):
        from trl_rm_env.judges.judgements import JudgeVerdicts

        def ask(contexts, shown):
            values = [self.ratings[item[0][0]["content"]] for item in shown]
            n = len(values)
            return JudgeVerdicts(values, {"num_judgements": n, "num_unparsed": 0, "num_overlength": 1},
                                 [0.25, 0.75] * (n // 2) + [0.5] * (n % 2), 7 * n)  # fmt: skip

        return self.mode.judge_pairs(ask, pairs, self.options)

    def __call__(self, prompts, completions, **kwargs):
        return [self.ratings[c[0]["content"]] for c in completions]


def test_evaluate_judge_reports_its_costs_and_rewardbench2_from_each_rating():
    from trl_rm_env.evaluation.judge import evaluate_judge

    def rb2(question, chosen, *rejected):
        return {**record(question, (chosen, 0), *((r, 1) for r in rejected)), "num_correct": 1, "subset": "Focus"}

    ratings = {"c1": 8.0, "r1": 2.0, "r2": 9.0, "r3": 1.0, "c2": 5.0, "r4": None, "r5": 4.0, "r6": 3.0,
               "c3": None, "r7": 1.0, "r8": 1.0, "r9": 1.0}  # fmt: skip
    datasets = {"Focus": [rb2("q1", "c1", "r1", "r2", "r3"), rb2("q2", "c2", "r4", "r5", "r6"),
                          rb2("q3", "c3", "r7", "r8", "r9")]}  # fmt: skip
    start = time.perf_counter()
    results, picks = evaluate_judge(RatingJudge(ratings), datasets)
    elapsed = time.perf_counter() - start
    # best-of-4 from each completion's rating, a missing one below every other: q1 loses to r2 (9 > 8), q2 wins (its
    # unrated r4 is below), q3 loses (its chosen is unrated)
    assert results["rewardbench2"]["Focus"]["score"] == pytest.approx(1 / 3)
    assert picks == ["better", "worse", "better", None, "better", "better", None, None, None]
    cost = results["cost"]
    assert cost["rating_mass"] == pytest.approx(0.5) and cost["overlength"] == 1 and cost["tokens"] == 7 * 12
    assert cost["memory_mb"] > 0 and 0 <= cost["seconds"] <= elapsed
    assert results["rewardbench"] == {}  # no RewardBench v1 subset among the sets
    plain, _ = evaluate_judge(RatingJudge({**ratings, "b": 1.0}), {"s": [record("q", ("c1", 0), ("b", 1))]})
    assert "rewardbench2" not in plain and "tie_pairs" not in plain["sets"]["s"]  # no RewardBench 2 rows, no ties


def test_a_genrm_reports_accuracy_with_ties_only_where_there_are_tied_pairs(tiny_dir):
    from test_genrm_eval_by_hand import Scripted

    from trl_rm_env import JudgeEnvironment
    from trl_rm_env.evaluation.judge import evaluate_judge

    judge = JudgeEnvironment(str(tiny_dir / "policy"), mode="genrm", max_new_tokens=8, parse_retries=0)
    judge.engine.generate = Scripted(judge.tokenizer)
    results, _ = evaluate_judge(judge, {"s": PAIRS["s"][:2]})
    assert "tie_pairs" not in results["sets"]["s"] and "accuracy_with_ties" not in results["sets"]["s"]


def test_costs_per_1000_pairs_by_hand():
    from trl_rm_env.evaluation.judge import per_1k

    assert per_1k({"seconds": 2.0, "judgements": 4, "tokens": 300}, 8) == {"seconds": 250.0, "judgements": 500.0,
                                                                            "tokens": 37500.0}  # fmt: skip
    assert per_1k({"seconds": 2.0, "judgements": None, "tokens": None}, 8) == {"seconds": 250.0, "judgements": None,
                                                                                "tokens": None}  # fmt: skip
    assert per_1k({"seconds": 1.0, "judgements": 0}, 4) == {"seconds": 250.0, "judgements": 0.0, "tokens": None}
    empty = per_1k({"seconds": 0.0, "judgements": 0, "tokens": 0}, 0)
    assert all(v != v for v in empty.values())  # no pairs: NaN, not a division by zero


def test_the_cascade_adds_up_the_costs_of_every_round(genrm_judge):
    """Pairs of one context are separate GRPO groups, so separate rounds: the judge's tokens and seconds are summed
    over the rounds."""
    same = {"s": [record("q one", ("goodone", 0), ("badone", 1)), record("q one", ("goodtwo", 0), ("badtwo", 1)),
                  record("q one", ("xfive", 0), ("zfive", 1))]}  # fmt: skip
    rows = [{"set": "s", "record": r, "completion": k, "score": 0.0} for r in range(3) for k in (0, 1)]
    scripted, prompts, rounds = Scripted(genrm_judge.tokenizer), [], []

    def generate(ids, *args, **kwargs):
        prompts.extend(ids)
        rounds.append(time.perf_counter())
        return scripted(ids, *args, **kwargs)

    genrm_judge.engine.generate = generate
    start = time.perf_counter()
    results, picks = evaluate_cascade(genrm_judge, same, rows, 1.0, rm_seconds=0.0, rm_tokens=0)
    elapsed = time.perf_counter() - start
    assert len(rounds) == 3 and results["sent"] == 3 and picks == ["tie", "better", "better"]
    assert results["cost"]["tokens"] == sum(len(p) for p in prompts)
    assert rounds[-1] - rounds[0] <= results["cost"]["seconds"] <= elapsed  # more than the last round alone


def test_position_consistency_reads_a_tie_at_one_half_by_default():
    from trl_rm_env.evaluation.judge import verdict_metrics

    found = verdict_metrics([("s", 0, 0, 1), ("s", 1, 0, 1)], ["better", "worse"], [[0.7, 0.3], [0.4, 0.2]])["s"]
    # 0.7 then 0.3: a different winner in each order; 0.4 then 0.2: the worse one in both (consistent, and wrong)
    assert (found["both_orders"], found["position_consistency"], found["accuracy"]) == (2, 0.5, 0.5)
