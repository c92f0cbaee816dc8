"""Listwise metrics of records with three or more completions (`trl_rm_env.evaluation.listwise`): Kendall's tau-b
against `scipy.stats.kendalltau` and cases by hand, top-1 by hand, and `trl-rm-env eval` reporting them for a reward
model (the same tau as scipy's on the `--scores` file) and for a judge."""

from __future__ import annotations

import json
import math

import pytest
import scipy.stats as scipy_stats  # a dev dependency: the reference
from hypothesis import given, settings
from hypothesis import strategies as st

from trl_rm_env.evaluation.listwise import kendall_tau_b, listwise_metrics, top1_correct


@pytest.mark.parametrize(
    "ranks, scores, expected",
    [
        ([0, 1, 2], [3.0, 2.0, 1.0], 1.0),
        ([0, 1, 2], [1.0, 2.0, 3.0], -1.0),
        ([0, 1, 2, 3], [4.0, 3.0, 1.0, 2.0], 4 / 6),  # C 5, D 1 of 6 pairs
        ([0, 1, 1], [2.0, 1.0, 0.0], 2 / math.sqrt(2 * 3)),  # a tie in rank: (1,2) counts in neither C nor D
        ([0, 1, 2], [1.0, 1.0, 0.0], 2 / math.sqrt(3 * 2)),  # a tie in score
        ([0, 0, 1], [1.0, 1.0, 0.0], 2 / math.sqrt(2 * 2)),  # tied in both: tau-b is 1
    ],
)
def test_kendall_tau_b_by_hand_and_as_scipy(ranks, scores, expected):
    assert kendall_tau_b(ranks, scores) == pytest.approx(expected)
    # scipy's tau-b of the same orders: higher is better for both, so the ranks are negated
    assert kendall_tau_b(ranks, scores) == pytest.approx(scipy_stats.kendalltau([-r for r in ranks], scores).statistic)


@settings(max_examples=200, deadline=None)
@given(
    st.integers(min_value=3, max_value=16).flatmap(
        lambda n: st.tuples(
            st.lists(st.integers(0, 4), min_size=n, max_size=n), st.lists(st.integers(-3, 3), min_size=n, max_size=n)
        )
    )
)
def test_kendall_tau_b_is_scipys_on_any_ranks_and_scores_with_ties(case):
    ranks, scores = case
    ours = kendall_tau_b(ranks, [float(s) for s in scores])
    theirs = scipy_stats.kendalltau([-r for r in ranks], scores).statistic
    if ours is None:
        assert math.isnan(theirs)
    else:
        assert ours == pytest.approx(theirs, abs=1e-12)
        assert -1.0 <= ours <= 1.0


def test_top1_by_hand():
    assert top1_correct([0, 1, 2], [5, 1, 0])
    assert not top1_correct([0, 1, 2], [1, 5, 0])
    assert top1_correct([0, 0, 2], [5, 5, 0])  # a top shared by two best ones
    assert not top1_correct([0, 1, 2], [5, 5, 0])  # a top shared with a worse one
    assert not top1_correct([1, 0, 2], [3, 3, 3])


def test_set_metrics_skip_pairs_count_constant_and_failed_records():
    def record(*ranks):
        return {"completions": [{"rank": r} for r in ranks]}

    records = [record(0, 1), record(0, 1, 2), record(0, 1, 2), record(0, 1, 2), record(2, 0, 1)]
    scores = [9.0, 0.0, 3.0, 2.0, 1.0, 1.0, 1.0, 1.0, 0.0, float("nan"), 1.0, 1.0, 3.0, 2.0]
    found = listwise_metrics(records, scores)
    # the pair is left to pairwise accuracy; tau 1, a constant record (0), a failed one; the last: ranks 2,0,1 scored
    # 1,3,2 -> every pair concordant
    assert found == {"records": 3, "kendall_tau": pytest.approx(2 / 3), "top1_accuracy": pytest.approx(2 / 3),
                     "constant": 1, "failed": 1}  # fmt: skip
    assert listwise_metrics([record(0, 1)], [1.0, 0.0]) is None


N_WAY = [
    {"context": [{"role": "user", "content": f"How much is {a} plus {b}?"}],
     "completions": [{"rank": r, "completion": [{"role": "assistant", "content": text}]} for r, text in
                     enumerate([f"The answer is {a + b}.", f"The answer is {a + b + 1}.", "I cannot help with that."])]}
    for a, b in ((1, 2), (3, 4), (2, 2), (5, 1))
]  # fmt: skip


@pytest.fixture
def n_way_file(tmp_path):
    path = tmp_path / "nway.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in N_WAY) + json.dumps({**N_WAY[0], "completions":
                    N_WAY[0]["completions"][:2]}) + "\n")  # fmt: skip
    return path


def test_eval_reports_a_reward_models_kendall_tau_as_scipy_computes_it(tiny_dir, n_way_file, tmp_path, capsys):
    from trl_rm_env.recipes.cli import main as cli_main

    out, scores = tmp_path / "results.json", tmp_path / "scores.jsonl"
    assert cli_main(["eval", "--model", str(tiny_dir / "reward_model"), "--data", str(n_way_file), "--output",
                     str(out), "--scores", str(scores), "--no-progress"]) == 0  # fmt: skip
    printed = capsys.readouterr().out
    assert "Listwise (records with 3+ completions)" in printed and "Kendall tau" in printed
    got = json.loads(out.read_text())["sets"]["nway"]["n_way"]
    rows = [json.loads(line) for line in scores.read_text().splitlines()]
    taus, tops = [], []
    for r in range(len(N_WAY)):  # the reference: scipy on the ranks and scores the file holds
        mine = [row for row in rows if row["record"] == r]
        taus.append(scipy_stats.kendalltau([-row["rank"] for row in mine], [row["score"] for row in mine]).statistic)
        best = max(row["score"] for row in mine)
        tops.append(all(row["rank"] == 0 for row in mine if row["score"] == best))
    assert got["records"] == 4 and got["failed"] == 0
    assert got["kendall_tau"] == pytest.approx(sum(taus) / 4)
    assert got["top1_accuracy"] == pytest.approx(sum(tops) / 4)


def test_eval_reports_a_judges_listwise_metrics_from_its_grpo_group_rewards(tiny_dir, n_way_file, tmp_path):
    """A pointwise judge's group rewards are its ratings: the listwise metrics equal those of the ratings the
    same judge gives each completion called as GRPO calls it."""
    from trl_rm_env.recipes.cli import main as cli_main

    from trl_rm_env.rewards.judge import JudgeEnvironment

    out = tmp_path / "results.json"
    assert cli_main(["eval", "--judge", str(tiny_dir / "policy"), "--judge-mode", "pointwise", "--data",
                     str(n_way_file), "--output", str(out), "--no-progress"]) == 0  # fmt: skip
    got = json.loads(out.read_text())["judge"]["sets"]["nway"]["n_way"]
    judge = JudgeEnvironment(str(tiny_dir / "policy"), mode="pointwise")
    taus, tops = [], []
    for record in N_WAY:
        ranks = [c["rank"] for c in record["completions"]]
        rewards = judge(prompts=[record["context"]] * 3, completions=[c["completion"] for c in record["completions"]])
        tau = scipy_stats.kendalltau([-r for r in ranks], rewards).statistic
        taus.append(0.0 if math.isnan(tau) else tau)
        tops.append(top1_correct(ranks, rewards))
    assert got["records"] == 4
    assert got["kendall_tau"] == pytest.approx(sum(taus) / 4)
    assert got["top1_accuracy"] == pytest.approx(sum(tops) / 4)
