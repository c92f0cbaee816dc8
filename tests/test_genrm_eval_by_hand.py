"""A GenRM's evaluation (`trl-rm-env eval --judge-mode genrm`, `evaluation/judge.py` and `evaluation/listwise.py`)
against values worked out by hand from the definitions in docs/genrm_training.md.

The judge is a real `JudgeEnvironment(mode="genrm")` on the tiny model whose engine writes a scripted verdict for
each prompt it is sent (`Scripted`): the answers shown are read back from the rendered prompt, so everything between
the data and the engine (pairs, both orders, tied pairs, GRPO groups, the verdict's parsing, the aggregator) is the
code a user runs. Each answer has a quality `q`; the scripted GenRM writes `score_1 = q(response 1)`, `score_2 =
q(response 2)` and `ranking = 3.5 + (q(response 2) - q(response 1)) / 2`, except where a record is scripted otherwise
(a position-biased verdict, no verdict). Every expected number below is computed in the comments from those rules.

Also: `judge_listwise`'s GRPO groups (one group size per call, equal contexts in different calls) with a recording
judge, and the listwise metrics' top-1 with ties at the top.
"""

from __future__ import annotations

import math
import re

import pytest

from trl_rm_env.evaluation.listwise import judge_listwise, listwise_metrics, top1_correct


def answer(text):
    return [{"role": "assistant", "content": text}]


def record(question, *completions):
    return {"context": [{"role": "user", "content": question}],
            "completions": [{"rank": rank, "completion": answer(text)} for text, rank in completions]}  # fmt: skip


# Answer words: none is a substring of another, so a prompt's answers are found by position.
Q = {"goodzero": 5, "badzero": 1, "goodone": 5, "badone": 1, "goodtwo": 3, "midtwo": 5, "badtwo": 1,
     "tieathree": 4, "tiebthree": 3, "badthree": 3, "afour": 5, "bfour": 5, "cfour": 2, "dfour": 1,
     "xfive": 4, "yfive": 4, "zfive": 2, "psix": 5, "qsix": 3, "rsix": 1}  # fmt: skip
BIASED = {"goodone", "badone"}  # always "response 1 is much better": (5, 1, 1)
SILENT_SWAPPED = ("badzero", "goodzero")  # shown in this order, the GenRM writes no verdict

DATASETS = {
    "s": [
        record("question zero", ("goodzero", 0), ("badzero", 1)),
        record("question one", ("goodone", 0), ("badone", 1)),
        record("question two", ("goodtwo", 0), ("midtwo", 1), ("badtwo", 2)),
        record("question three", ("tieathree", 0), ("tiebthree", 0), ("badthree", 1)),
    ],
    "t": [
        record("question four", ("afour", 0), ("bfour", 1), ("cfour", 2), ("dfour", 3)),
        record("question five", ("xfive", 0), ("yfive", 0), ("zfive", 1)),
        record("question five", ("psix", 0), ("qsix", 0), ("rsix", 1)),  # the same context: another GRPO group
    ],
}


class Scripted:
    """The engine's `generate`: the verdict of each rendered prompt, from the two answers it shows."""

    def __init__(self, tokenizer, questions=()):
        self.tokenizer, self.shown, self.questions = tokenizer, [], set(questions)
        self.pattern = re.compile("|".join(sorted(Q, key=len, reverse=True)))

    def verdict(self, first: str, second: str) -> str:
        if (first, second) == SILENT_SWAPPED:
            return "I cannot tell."
        if first in BIASED:
            return '{"score_1": 5, "score_2": 1, "ranking": 1}'
        q1, q2 = Q[first], Q[second]
        return f'{{"score_1": {q1}, "score_2": {q2}, "ranking": {3.5 + (q2 - q1) / 2}}}'

    def __call__(self, prompts, max_new_tokens, temperature, seeds, top_p=1.0, keep_failures=False):
        out = []
        for ids in prompts:
            text = self.tokenizer.decode(ids)
            found = self.pattern.findall(text)
            assert len(found) == 2, found
            assert not self.questions or any(q in text for q in self.questions), text  # the record's own question
            self.shown.append(tuple(found))
            out.append(self.verdict(*found))
        return out


@pytest.fixture(scope="module")
def evaluated(tiny_dir):
    from trl_rm_env import JudgeEnvironment
    from trl_rm_env.evaluation.judge import evaluate_judge

    judge = JudgeEnvironment(str(tiny_dir / "policy"), mode="genrm", max_new_tokens=8, parse_retries=0,
                             temperature=0.0)  # fmt: skip
    scripted = Scripted(judge.tokenizer, {r["context"][0]["content"] for rs in DATASETS.values() for r in rs})
    judge.engine.generate = scripted
    results, picks = evaluate_judge(judge, DATASETS)
    return results, picks, scripted


def test_pairs_are_judged_in_both_orders_and_read_as_defined(evaluated):
    results, picks, scripted = evaluated
    # Set s, pairs in order (better, worse), each shown better-first then worse-first; preference = what the
    # better one received minus what the worse one received, averaged over the orders with a verdict:
    #   r0 goodzero/badzero: +4, then no verdict                  -> +4: better (a verdict in one order only)
    #   r1 goodone/badone (biased 5, 1): +4, then 1 - 5 = -4     -> 0: a tie, inconsistent
    #   r2 goodtwo(3)/midtwo(5): -2, -2 -> worse (consistent); goodtwo/badtwo(1): +2, +2; midtwo/badtwo: +4, +4
    #   r3 tieathree(4)/badthree(3): +1, +1; tiebthree(3)/badthree(3): equal scores, ranking 3.5 splits nothing: 0, 0
    # Set t: r4 afour(5)/bfour(5): 0, 0 (a tie); the 5 other pairs of r4 and the 2 + 2 of r5 and r6 go to the
    #   better one in both orders.
    assert picks == ["better", "tie", "worse", "better", "better", "better", "tie",
                     "tie", "better", "better", "better", "better", "better", "better", "better", "better", "better"]
    s, t = results["sets"]["s"], results["sets"]["t"]
    # s: 7 pairs, 4 right (r0, r2's two, r3's first), 2 ties (r1, r3's second), none without a verdict at all.
    assert (s["pairs"], s["correct"], s["verdict_ties"], s["no_verdict"]) == (7, 4, 2, 0)
    assert s["accuracy"] == pytest.approx(4 / 7)
    # Position consistency: pairs with a verdict in both orders (all but r0): 6; the same winner in both orders: r2's
    # three and r3's first (a tie in both orders picks no winner; r1 flips): 4 of 6.
    assert (s["both_orders"], s["position_consistency"]) == (6, pytest.approx(4 / 6))
    # t: 10 pairs, 9 right, the tie r4 (afour, bfour); consistent 9 of 10.
    assert (t["pairs"], t["correct"], t["verdict_ties"], t["no_verdict"]) == (10, 9, 1, 0)
    assert (t["accuracy"], t["both_orders"], t["position_consistency"]) == (pytest.approx(0.9), 10, pytest.approx(0.9))
    assert results["cost"]["judgements"] == 2 * 17  # the 17 pairs, each in both orders


def test_tied_pairs_are_judged_in_both_orders_and_count_only_when_both_rank_them_3_to_4(evaluated):
    results, _, scripted = evaluated
    # Tied pairs: s r3 (tieathree 4, tiebthree 3): rankings 3.5 - 0.5 = 3.0 and 4.0, both within 3 to 4: a tie.
    # t r5 (xfive 4, yfive 4): 3.5 and 3.5: a tie. t r6 (psix 5, qsix 3): 2.5 and 4.5: no tie.
    for pair in [("tieathree", "tiebthree"), ("xfive", "yfive"), ("psix", "qsix")]:
        assert pair in scripted.shown and pair[::-1] in scripted.shown  # both orders asked
    s, t = results["sets"]["s"], results["sets"]["t"]
    assert (s["tie_pairs"], s["ties_correct"]) == (1, 1)
    assert s["accuracy_with_ties"] == pytest.approx((4 + 1) / (7 + 1))
    assert (t["tie_pairs"], t["ties_correct"]) == (2, 1)
    assert t["accuracy_with_ties"] == pytest.approx((9 + 1) / (10 + 2))


def test_listwise_metrics_of_the_genrm_groups(evaluated):
    results, _, _ = evaluated
    # Each 3+-way record is a GRPO group; every answer receives its own q from every comparison, so its reward is q.
    # s r2: ranks [0, 1, 2], rewards [3, 5, 1]: pairs (0,1) discordant, (0,2), (1,2) concordant: tau (2 - 1) / 3;
    #   the top (midtwo) is not best-ranked.
    # s r3: ranks [0, 0, 1], rewards [4, 3, 3]: (0,1) tied in rank, (0,2) concordant, (1,2) tied in score:
    #   tau 1 / sqrt((3 - 1) (3 - 1)) = 0.5; top-1 right.
    s = results["sets"]["s"]["n_way"]
    assert (s["records"], s["constant"], s["failed"]) == (2, 0, 0)
    assert s["kendall_tau"] == pytest.approx((1 / 3 + 0.5) / 2)
    assert s["top1_accuracy"] == pytest.approx(0.5)
    # t r4: ranks [0..3], rewards [5, 5, 2, 1]: 5 concordant, 1 tied in score: 5 / sqrt(6 * 5); top tied with bfour
    #   (rank 1): a miss. r5: [0, 0, 1] and [4, 4, 2]: 2 / sqrt(2 * 2) = 1, right. r6: [0, 0, 1] and [5, 3, 1]:
    #   2 / sqrt(2 * 3); right.
    t = results["sets"]["t"]["n_way"]
    assert t["records"] == 3
    assert t["kendall_tau"] == pytest.approx((5 / math.sqrt(30) + 1 + 2 / math.sqrt(6)) / 3)
    assert t["top1_accuracy"] == pytest.approx(2 / 3)


# ------------------------------------------------------------------------------------------------ GRPO groups
class RecordingJudge:
    """A listwise judge as `judge_listwise` calls it (a GRPO reward function): records each call's prompts and
    completions, and rewards each completion with the number it holds."""

    def __init__(self):
        self.calls = []

    def __call__(self, prompts, completions, **kwargs):
        self.calls.append([(p[0]["content"], c[0]["content"]) for p, c in zip(prompts, completions)])
        return [float(c[0]["content"].split()[-1]) for c in completions]


def test_judge_listwise_calls_one_group_size_at_a_time_and_equal_contexts_in_different_calls():
    datasets = {
        "a": [
            record("p", ("a 3", 0), ("b 2", 1), ("c 1", 2)),
            record("q", ("a 1", 0), ("b 2", 1), ("c 3", 2), ("d 4", 3)),
            record("p", ("a 1", 0), ("b 3", 1), ("c 2", 2)),  # p again: a second GRPO group of prompt p
            record("r", ("a 9", 0), ("b 8", 1)),  # a pair: no listwise metrics
            record("s", ("a 5", 0), ("b 5", 0), ("c 1", 1)),
        ],
        "pairs only": [record("p", ("a 1", 0), ("b 2", 1))],
    }
    judge = RecordingJudge()
    assert set(judge_listwise(RecordingJudge(), {"pairs only": datasets["pairs only"], "a": datasets["a"]})) == {"a"}
    found = judge_listwise(judge, datasets)
    # Size 3 first: records 0 and 4 (contexts p and s) in one call, then record 2 (p again) in its own; then size 4.
    assert judge.calls == [
        [("p", "a 3"), ("p", "b 2"), ("p", "c 1"), ("s", "a 5"), ("s", "b 5"), ("s", "c 1")],
        [("p", "a 1"), ("p", "b 3"), ("p", "c 2")],
        [("q", "a 1"), ("q", "b 2"), ("q", "c 3"), ("q", "d 4")],
    ]
    assert set(found) == {"a"}
    # Rewards are the numbers: record 0 [3, 2, 1] tau 1, top right; record 1 [1, 2, 3, 4] tau -1, top wrong; record 2
    # [1, 3, 2]: (0,1) and (0,2) discordant, (1,2) concordant: -1/3, top wrong; record 4 ranks [0, 0, 1], [5, 5, 1]:
    # 2 / sqrt(2 * 2) = 1, top right (both tops best-ranked).
    assert found["a"]["records"] == 4
    assert found["a"]["kendall_tau"] == pytest.approx((1 - 1 - 1 / 3 + 1) / 4)
    assert found["a"]["top1_accuracy"] == pytest.approx(2 / 4)


def test_rounds_hold_each_context_once_whatever_its_key_order_or_values():
    import datetime

    from trl_rm_env.evaluation.listwise import rounds_by_context

    p = [{"role": "user", "content": "p", "sent": datetime.date(2026, 12, 5)}]  # a value JSON cannot write
    p_again = [{"sent": datetime.date(2026, 12, 5), "content": "p", "role": "user"}]  # equal, keys in another order
    q = [{"role": "user", "content": "q"}]
    assert p == p_again
    assert rounds_by_context([p, q, p_again, p, q]) == [[0, 1], [2, 4], [3]]


def test_top1_and_failed_records_at_the_edges():
    # (tests/test_listwise_metrics.py holds the usual cases.) ranks (lower is better), scores (higher is better)
    assert top1_correct([0, 0, 2], [3.0, 1.0, 1.0]) is True  # one of two best-ranked alone on top
    assert top1_correct([2, 1, 0], [1.0, 1.0, 1.0]) is False  # all tied: worse ones share the top
    assert top1_correct([0, 0, 0], [1.0, 2.0, 0.5]) is True  # every completion best-ranked
    records = [record("p", ("a", 0), ("b", 1), ("c", 2)), record("p", ("a", 0), ("b", 1), ("c", 1))]
    # a None score (a failed judgement) fails its record; the other: ranks [0, 1, 1], scores [1, 2, 3]: (0,1), (0,2)
    # discordant, (1,2) tied in rank: -2 / sqrt(3 * 2); its top (c, rank 1) is not best-ranked
    found = listwise_metrics(records, [1.0, None, 2.0, 1.0, 2.0, 3.0])
    assert found == {"records": 1, "kendall_tau": pytest.approx(-2 / math.sqrt(6)), "top1_accuracy": 0.0,
                     "constant": 0, "failed": 1}  # fmt: skip


def test_the_listwise_table_by_hand():
    from trl_rm_env.evaluation.listwise import format_listwise_table

    sources = {
        "reward model": {"sets": {"a": {"n_way": {"records": 3, "kendall_tau": 1 / 3, "top1_accuracy": 2 / 3,
                                                  "constant": 1, "failed": 0}},
                                  "b": {"pairs": 2}}},
        "judge": {"sets": {"a": {"n_way": {"records": 0, "kendall_tau": float("nan"), "top1_accuracy": float("nan"),
                                           "constant": 0, "failed": 3}}}},
    }  # fmt: skip
    # columns: "source / set" as wide as the longest name (16), then right-aligned 7, 11, 7, 8, 6, two spaces apart
    header = "source / set" + " " * 4 + "  records  Kendall tau    top-1  constant  failed"
    assert format_listwise_table(sources).splitlines() == [
        "Listwise (records with 3+ completions)",
        header,
        "-" * 65,
        "reward model / a" + " " * 8 + "3" + " " * 7 + "0.3333" + " " * 3 + "66.67%" + " " * 9 + "1" + " " * 7 + "0",
        "judge / a" + " " * 15 + "0" + " " * 10 + "n/a" + " " * 6 + "n/a" + " " * 9 + "0" + " " * 7 + "3",
    ]
    assert len(header) == 65
    assert format_listwise_table({"reward model": {"sets": {"b": {"pairs": 2}}}}) == ""
