"""`trl-rm-env best-of-n` (trl_rm_env.evaluation.best_of_n): the best-of-n estimate against every n-subset
enumerated, Gao et al.'s KL and fit by hand, aggregations by numpy, bad files named, and the command end to end on
the tiny models (the proxy's scores one plain forward per sample)."""

from __future__ import annotations

import itertools
import json
import math
import re
import statistics

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trl_rm_env.data.schema import DataValidationError
from trl_rm_env.evaluation import best_of_n as bon
from trl_rm_env.evaluation import best_of_n_command as cmd


def enumerated(proxy, values, n):
    """Every n-subset of the samples, its pick the highest proxy reward, a tie broken uniformly: the mean of the
    picks' values (the definition, by brute force)."""
    total = []
    for subset in itertools.combinations(range(len(proxy)), n):
        top = max(proxy[i] for i in subset)
        tied = [i for i in subset if proxy[i] == top]
        total.append(sum(values[i] for i in tied) / len(tied))
    return sum(total) / len(total)


def test_kl_of_best_of_n_by_hand():
    # Gao et al. eq. 1, log n - (n-1)/n: n=1: 0; n=2: 0.693147 - 0.5; n=64: 4.158883 - 0.984375.
    assert bon.kl_best_of_n(1) == 0.0
    assert bon.kl_best_of_n(2) == pytest.approx(0.193147, abs=1e-6)
    assert bon.kl_best_of_n(64) == pytest.approx(3.174508, abs=1e-6)
    with pytest.raises(ValueError, match="n must be >= 1"):
        bon.kl_best_of_n(0)


def test_best_of_n_by_hand():
    # proxy 1 < 2 < 3, gold 0, 1, 0. n=1: the mean, 1/3. n=2: {1,2} picks 2 (gold 1), {1,3} and {2,3} pick 3 (gold 0):
    # 1/3. n=3: always 3, gold 0.
    proxy, gold = [1.0, 2.0, 3.0], np.array([0.0, 1.0, 0.0])
    assert [float(bon.best_of_n_expectation(proxy, gold, n)) for n in (1, 2, 3)] == pytest.approx([1 / 3, 1 / 3, 0])
    # proxy 2, 3, 1 (the same values in another order): n=2: {2,3} picks 3 (gold 1), {2,1} picks 2 (gold 0), {3,1}
    # picks 3 (gold 1): 2/3.
    assert float(bon.best_of_n_expectation([2.0, 3.0, 1.0], np.array([0.0, 1.0, 0.0]), 2)) == pytest.approx(2 / 3)
    # a tie at the top is broken uniformly: {a, b} tied, gold 0 and 1: 1/2 at n=2.
    assert float(bon.best_of_n_expectation([1.0, 1.0], np.array([0.0, 1.0]), 2)) == pytest.approx(0.5)


@settings(max_examples=150, deadline=None, derandomize=True)
@given(st.integers(1, 7).flatmap(lambda size: st.tuples(
    st.lists(st.integers(0, 3), min_size=size, max_size=size),  # few values: many ties
    st.lists(st.floats(-5, 5, allow_nan=False), min_size=size, max_size=size),
    st.integers(1, size))))  # fmt: skip
def test_best_of_n_equals_every_subset_enumerated(case):
    proxy, values, n = case
    got = float(bon.best_of_n_expectation([float(p) for p in proxy], np.array(values), n))
    assert got == pytest.approx(enumerated(proxy, values, n), abs=1e-9)


def test_best_of_n_refuses_nan_and_bad_n():
    with pytest.raises(ValueError, match="NaN"):
        bon.best_of_n_expectation([1.0, float("nan")], np.array([0.0, 1.0]), 1)
    with pytest.raises(ValueError, match="between 1 and the 2 samples"):
        bon.best_of_n_expectation([1.0, 2.0], np.array([0.0, 1.0]), 3)


def test_pick_probabilities_sum_to_one_at_user_sizes():
    for total in (8, 16, 64):
        for n in bon.default_ns(total):
            p = bon.pick_probabilities(total, n)
            assert p.sum() == pytest.approx(1.0, abs=1e-12)
            assert p[-1] == pytest.approx(n / total)  # the top sample is in the subset with probability n/N


def test_pair_accuracy_by_hand():
    # gold 1, 0, 0: two pairs with a better sample (0 over 1, 0 over 2)
    assert bon.pair_accuracy(np.array([[3.0, 1.0, 2.0]]), np.array([[1.0, 0.0, 0.0]])) == 1.0
    assert bon.pair_accuracy(np.array([[1.0, 1.0, 2.0]]), np.array([[1.0, 0.0, 0.0]])) == 0.25  # a tie 1/2, a miss 0
    # prompt 1: 0 over 1 right, 0 over 2 wrong; prompt 2: both wrong: 1 of 4 pairs
    rewards, gold = np.array([[2.0, 1.0, 3.0], [0.0, 1.0, 2.0]]), np.array([[1.0, 0.0, 0.0], [1.0, 0.0, 0.0]])
    assert bon.pair_accuracy(rewards, gold) == pytest.approx(1 / 4)
    assert math.isnan(bon.pair_accuracy(np.array([[1.0, 2.0]]), np.array([[0.0, 0.0]])))


def test_default_ns():
    assert bon.default_ns(64) == [1, 2, 4, 8, 16, 32, 64]
    assert bon.default_ns(12) == [1, 2, 4, 8, 12]
    assert bon.default_ns(1) == [1]


def test_gao_fit_recovers_a_curve_computed_by_hand():
    # gain = d (0.5 - 0.1 d): peak at d = 0.5 / 0.2 = 2.5, gain there 2.5 * 0.25 = 0.625.
    d = [math.sqrt(bon.kl_best_of_n(n)) for n in bon.default_ns(64)]
    fit = bon.fit_gao(d, [x * (0.5 - 0.1 * x) for x in d])
    assert fit["alpha"] == pytest.approx(0.5) and fit["beta"] == pytest.approx(0.1)
    assert fit["d_peak"] == pytest.approx(2.5) and fit["gain_peak"] == pytest.approx(0.625)
    assert fit["r2"] == pytest.approx(1.0)
    rising = bon.fit_gao(d, [0.3 * x + 0.05 * x * x for x in d])  # no over-optimization: beta < 0, no peak
    assert rising["beta"] == pytest.approx(-0.05) and rising["d_peak"] == math.inf
    with pytest.raises(ValueError, match="two or more"):
        bon.fit_gao([1.0], [0.1])


def test_curve_at_n_equal_one_is_the_policys_mean():
    rng = np.random.default_rng(0)
    proxy, gold = rng.normal(size=(5, 8)), (rng.random((5, 8)) < 0.3).astype(float)
    points = bon.curve(proxy, gold, [1, 8])
    assert points[0]["gold"] == pytest.approx(gold.mean()) and points[0]["proxy"] == pytest.approx(proxy.mean())
    # n = N: each prompt's top sample
    top = gold[np.arange(5), proxy.argmax(axis=1)]
    assert points[1]["gold"] == pytest.approx(top.mean())
    assert points[1]["proxy"] == pytest.approx(proxy.max(axis=1).mean())
    assert points[1]["d"] == pytest.approx(math.sqrt(math.log(8) - 7 / 8))


@pytest.mark.parametrize("heads", [4, 5])
def test_aggregations_against_numpy(heads):
    rng = np.random.default_rng(heads)
    outputs = rng.normal(size=(3, 6, heads))
    expected = {"mean": outputs.mean(-1), "min": outputs.min(-1), "median": np.median(outputs, -1),
                "mean_minus_std": outputs.mean(-1) - 0.5 * outputs.std(-1)}  # fmt: skip
    for how, want in expected.items():
        got = bon.aggregated(outputs, how, penalty=0.5 if how == "mean_minus_std" else 1.0)
        np.testing.assert_allclose(got, want, atol=1e-12)
    np.testing.assert_array_equal(bon.aggregated(outputs[..., :1], None), outputs[..., 0])


def test_the_commands_aggregations_are_the_ensembles():
    from trl_rm_env.rewards.ensemble import ENSEMBLES

    assert cmd.AGGREGATIONS == ENSEMBLES


def test_defences_name_each_curve():
    rng = np.random.default_rng(0)
    one = [bon.Proxy("single", f"p{s}", rng.normal(size=(2, 4, 1))) for s in range(3)]
    heads = [bon.Proxy("heads4", f"h{s}", rng.normal(size=(2, 4, 3))) for s in range(3)]
    found = {d.name: d for d in bon.defences(one + heads, ["mean", "min"], {"ens": "single"})}
    assert list(found) == ["single", "heads4/mean", "heads4/min", "ens/mean", "ens/min"]
    assert [len(found[name].runs) for name in found] == [3, 3, 3, 1, 1]
    np.testing.assert_allclose(found["ens/min"].runs[0], np.concatenate([p.outputs for p in one], -1).min(-1))
    with pytest.raises(ValueError, match=re.escape("one-head proxies labelled 'heads4', got 3 ([3, 3, 3] heads)")):
        bon.defences(one + heads, ["mean"], {"bad": "heads4"})


def fake_result(baseline, others):
    def runs(lasts):
        return [{"gold_last": x} for x in lasts]

    return {"ns": [1, 64], "defences": {"single": {"runs": runs(baseline)},
                                        **{k: {"runs": runs(v)} for k, v in others.items()}}}  # fmt: skip


def test_verdicts_by_hand():
    result = fake_result([0.10, 0.20, 0.15], {"a": [0.30, 0.41, 0.33], "b": [0.05, 0.30, 0.20], "c": [0.5],
                                              "d": [0.0, 0.1, 0.05]})  # fmt: skip
    got = bon.verdicts(result, "single")
    # a: diffs 0.20, 0.21, 0.18, mean 0.1967, stdev 0.01528 / sqrt(3) = 0.00882: helps.
    assert got["a"] == "helps (+0.197 gold at n=64)"
    # b: diffs -0.05, 0.10, 0.05: mean 0.0333, stdev 0.0764 / sqrt(3) = 0.0441; and the signs differ.
    assert got["b"] == "cannot be told at this size (+0.033 +- 0.044 gold at n=64)"
    # c: one run against the seeds' mean 0.15.
    assert got["c"] == "+0.350 gold against the seeds' mean (one run)"
    # d: diffs -0.10 each: hurts.
    assert got["d"] == "hurts (-0.100 gold at n=64)"
    assert "single" not in got


def test_number_gold():
    row = {"answer": 25}
    assert cmd.number_gold(row, "The answer is 25.") == 1.0
    assert cmd.number_gold(row, "25") == 1.0
    assert cmd.number_gold(row, "12 + 13 = 25") == 1.0  # the last number is the answer
    assert cmd.number_gold(row, "25 is more than 12") == 0.0
    assert cmd.number_gold(row, "It is -25.") == 0.0
    assert cmd.number_gold(row, "twenty-five") == 0.0
    assert cmd.number_gold({"answer": 1234}, "It is 1,234.") == 1.0
    assert cmd.number_gold({"answer": 5}, "5.0") == 1.0


def write(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


CONTEXT = [{"role": "user", "content": "What is 2 + 3?"}]


@pytest.mark.parametrize(
    "rows, where",
    [
        ([{"context": CONTEXT, "completions": ["a", "b"], "gold": [0, 1]}, {"context": CONTEXT, "completions": ["a"],
          "gold": [1]}], "line 2, field 'completions': 1 completions; the first line has 2"),  # fmt: skip
        ([{"context": CONTEXT, "completions": ["a", "b"], "gold": [0]}], "line 1, field 'gold'"),
        ([{"context": CONTEXT, "completions": ["a", "b"], "gold": [0, float("nan")]}], "line 1, field 'gold[1]'"),
        ([{"context": CONTEXT, "completions": ["a", "b"], "gold": [True, 0]}], "line 1, field 'gold[0]'"),
        ([{"context": CONTEXT, "completions": ["a", 3], "gold": [0, 1]}], "line 1, field 'completions'"),
        ([{"completions": ["a"]}], "line 1, field 'context'"),
        (["", "{not json"], "line 2"),
        ([{"context": "hello", "completions": ["a"], "gold": [0]}],
         "line 1, field 'context': each line needs a 'context' list of messages"),
        ([{"context": [{"role": "user"}], "completions": ["a"], "gold": [0]}],
         "line 1, field 'context': context[0] must be a message with 'role' and 'content'"),
    ],
)
def test_bad_samples_files_are_named(tmp_path, rows, where):
    path = write(tmp_path / "s.jsonl", rows)
    with pytest.raises(DataValidationError, match=re.escape(f"s.jsonl, {where}")):
        cmd.read_samples(path, need_gold=True)


def test_missing_and_empty_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.jsonl: no such file"):
        cmd.read_samples(tmp_path / "nope.jsonl")
    with pytest.raises(DataValidationError, match="no prompts"):
        cmd.read_samples(write(tmp_path / "e.jsonl", [""]))


def test_gold_options_are_checked(tmp_path):
    samples = cmd.Samples([{"context": CONTEXT, "completions": ["5", "6"]}], "s.jsonl")
    with pytest.raises(ValueError, match="line 1, field 'answer'"):
        cmd.add_gold(samples, "number")
    with pytest.raises(ValueError, match="gold must be one of"):
        cmd.add_gold(samples, "exact")
    with pytest.raises(ValueError, match=re.escape("gold='model' needs gold_model (a reward model's path), and "
                                                   "gold_model needs gold='model'")):
        cmd.add_gold(samples, "model")
    with pytest.raises(ValueError, match="needs gold_model"):
        cmd.add_gold(samples, "number", gold_model="rm")
    samples.rows[0]["answer"] = 5
    cmd.add_gold(samples, "number")
    assert samples.rows[0]["gold"] == [1.0, 0.0]


def plain_scores(path, contexts, completions):
    """One forward of the plain model per sample (its chat template, no batching): the reference."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForSequenceClassification.from_pretrained(path).eval()
    out = []
    with torch.no_grad():
        for context, completion in zip(contexts, completions):
            ids = tokenizer.apply_chat_template(context + completion, tokenize=True, return_dict=True)["input_ids"]
            out.append(model(input_ids=torch.tensor([ids])).logits[0].tolist())
    return np.array(out)


@pytest.fixture(scope="module")
def three_heads(tiny_dir, tmp_path_factory):
    """The tiny reward model with 3 score heads (`ensemble_heads` 3), saved."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    torch.manual_seed(3)
    model = AutoModelForSequenceClassification.from_pretrained(tiny_dir / "reward_model", num_labels=3,
                                                               ignore_mismatched_sizes=True)  # fmt: skip
    model.config.ensemble_heads = 3
    out = tmp_path_factory.mktemp("heads3")
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(tiny_dir / "reward_model").save_pretrained(out)
    return out


def test_command_end_to_end(tiny_dir, three_heads, tmp_path, capsys):
    from trl_rm_env.recipes.cli import main

    prompts = write(tmp_path / "prompts.jsonl", [
        {"context": [{"role": "user", "content": f"What is {a} + {b}?"}], "answer": a + b}
        for a, b in ((2, 3), (7, 9), (11, 4))])  # fmt: skip
    samples, output, plot = tmp_path / "samples.jsonl", tmp_path / "curves.json", tmp_path / "curves.png"
    rm = str(tiny_dir / "reward_model")
    argv = ["best-of-n", "--policy", str(tiny_dir / "policy"), "--prompts", str(prompts), "--n", "5",
            "--max-new-tokens", "6", "--samples", str(samples), "--gold", "number", "--proxy", f"single={rm}",
            "--proxy", f"single={rm}", "--proxy", f"heads3={three_heads}", "--ensemble-of", "ens=single",
            "--output", str(output), "--plot", str(plot)]  # fmt: skip
    assert main(argv) == 0
    rows = [json.loads(line) for line in samples.read_text().splitlines()]
    assert [len(r["completions"]) for r in rows] == [5, 5, 5] and [r["answer"] for r in rows] == [5, 16, 15]
    assert all(r["gold"] == [cmd.number_gold(r, t) for t in r["completions"]] for r in rows)
    result = json.loads(output.read_text())
    assert result["ns"] == [1, 2, 4, 5] and plot.stat().st_size > 0
    assert list(result["defences"]) == ["single", "heads3/mean", "heads3/min", "heads3/median",
                                        "heads3/mean_minus_std", "ens/mean", "ens/min", "ens/median",
                                        "ens/mean_minus_std"]  # fmt: skip
    assert len(result["defences"]["single"]["runs"]) == 2 and result["baseline"] == "single"
    assert result["proxies"][0] == {"label": "single", "path": rm, "heads": 1}
    # the proxy's rewards are the plain model's, one forward per sample: its pick at n=N per prompt
    contexts = [r["context"] for r in rows for _ in r["completions"]]
    completions = [[{"role": "assistant", "content": t}] for r in rows for t in r["completions"]]
    for path, name, reduce in ((rm, "single", lambda x: x[..., 0]), (three_heads, "heads3/min", lambda x: x.min(-1))):
        plain = reduce(plain_scores(path, contexts, completions).reshape(3, 5, -1))
        last = result["defences"][name]["runs"][0]["points"][-1]
        assert last["proxy"] == pytest.approx(plain.max(axis=1).mean(), abs=1e-4)
        first = result["defences"][name]["runs"][0]["points"][0]
        assert first["proxy"] == pytest.approx(plain.mean(), abs=1e-4)
    out = capsys.readouterr().out
    assert "| defence | seeds |" in out and "heads3/min:" in out
    # a second run reuses the samples (no sampling) and takes the gold from the file
    argv2 = ["best-of-n", "--policy", str(tiny_dir / "policy"), "--samples", str(samples), "--proxy", f"a={rm}",
             "--ns", "1", "3"]  # fmt: skip
    assert main(argv2) == 0
    assert "exists: its samples are reused" in capsys.readouterr().out


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--proxy", "noequals"], "--proxy takes LABEL=VALUE, got 'noequals'"),
        (["--proxy", "a=RM", "--ns", "1", "9"], "--ns must lie within 1..2"),
        (["--proxy", "a=RM", "--baseline", "zzz"], "--baseline 'zzz' is not a proxy's label: ['a']"),
        (["--proxy", "a=RM", "--n", "4"], "--n 4, but "),
        (["--proxy", "a=RM", "--prompts", "p.jsonl", "--seed", "3"], "--prompts, --seed set how --policy is sampled"),
        (["--proxy", "a=RM", "--gold-model", "RM"], "--gold-model is the gold of --gold model, but --gold is 'field'"),
        (["--proxy", "a=RM", "--ensemble-penalty", "2", "--aggregations", "min"], "--ensemble-penalty weighs"),
        (["--proxy", "a=RM", "--policy", "P", "--samples", "missing.jsonl"], "--policy needs --prompts"),
    ],
)
def test_command_refusals_are_one_line(tiny_dir, tmp_path, capsys, extra, message):
    from trl_rm_env.recipes.cli import main

    samples = write(tmp_path / "s.jsonl", [{"context": CONTEXT, "completions": ["5", "6"], "gold": [1, 0]}])
    extra = [str(tmp_path / e) if e.endswith(".jsonl") else e.replace("RM", str(tiny_dir / "reward_model"))
             for e in extra]  # fmt: skip
    assert main(["best-of-n", "--samples", str(samples), *extra]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]


def test_summary_statistics():
    runs = [{"gold_last": g, "gold_best": g + 0.1, "fall": 0.1, "pair_accuracy": 0.6,
             "fit": {"alpha": 1.0, "beta": b, "d_peak": 2.0}}
            for g, b in ((0.2, 0.1), (0.4, 0.3))]  # fmt: skip
    s = bon.summary(runs)
    assert s["gold_last"] == pytest.approx(0.3) and s["gold_last_std"] == pytest.approx(statistics.stdev([0.2, 0.4]))
    assert s["beta"] == pytest.approx(0.2) and s["d_peak_std"] == 0.0
    runs[1]["fit"]["d_peak"] = math.inf  # no peak: the mean is inf, the spread undefined
    s = bon.summary(runs)
    assert s["d_peak"] == math.inf and math.isnan(s["d_peak_std"])


def test_report_of_two_prompts_by_hand():
    # prompt A: proxy 1, 2, 3, gold 0, 1, 0; prompt B: proxy 3, 1, 2, gold 1, 0, 0.
    # n=1: proxy 2, gold 1/3. n=2: A's subsets pick 2, 3, 3 (gold 1/3, proxy 8/3), B's pick 3, 3, 2 (gold 2/3,
    # proxy 8/3): gold 1/2, proxy 8/3. n=3: A picks 3 (gold 0), B picks 3 (gold 1): gold 1/2, proxy 3.
    proxy = np.array([[1.0, 2.0, 3.0], [3.0, 1.0, 2.0]])
    gold = np.array([[0.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    result = bon.report(gold, [bon.Defence("x", [proxy])], [1, 2, 3])
    assert (result["prompts"], result["samples_per_prompt"], result["ns"]) == (2, 3, [1, 2, 3])
    assert result["policy_gold"] == pytest.approx(1 / 3) and result["oracle_gold"] == 1.0
    run = result["defences"]["x"]["runs"][0]
    points = run["points"]
    assert [p["n"] for p in points] == [1, 2, 3]
    assert [p["gold"] for p in points] == pytest.approx([1 / 3, 1 / 2, 1 / 2])
    assert [p["proxy"] for p in points] == pytest.approx([2, 8 / 3, 3])
    assert [p["kl"] for p in points] == pytest.approx([0, math.log(2) - 1 / 2, math.log(3) - 2 / 3])
    # z over all six proxy rewards: mean 2, population std sqrt(4/6)
    assert [p["proxy_z"] for p in points] == pytest.approx([0, (2 / 3) / math.sqrt(4 / 6), 1 / math.sqrt(4 / 6)])
    # the first n of the highest gold; no fall from it; A orders 1 of its 2 pairs as the gold does, B 2 of 2
    assert (run["best_n"], run["gold_best"], run["gold_last"], run["fall"]) == (2, 0.5, 0.5, 0.0)
    assert run["pair_accuracy"] == 0.75
    # Gao's fit of the gain over n=1 (0, 1/6, 1/6), by numpy's least squares
    d = np.array([p["d"] for p in points])
    (alpha, beta), *_ = np.linalg.lstsq(np.stack([d, -d * d], 1), np.array([0, 1 / 6, 1 / 6]), rcond=None)
    assert (run["fit"]["alpha"], run["fit"]["beta"]) == pytest.approx((alpha, beta))
    row = bon.table(result).splitlines()[2]
    assert row == (f"| x | 1 | 0.750 | 0.333 | 2 | 0.500 +- 0.000 | 0.500 +- 0.000 | 0.000 | {alpha:.3f} | {beta:.3f} | "
                   f"{alpha / (2 * beta):.2f} |")  # fmt: skip
    assert bon.table(result).splitlines()[0].startswith("| defence | seeds | pair accuracy | gold n=1 | best n |")
    assert "gold n=3 |" in bon.table(result).splitlines()[0]


def test_report_with_a_constant_proxy_keeps_its_z_finite():
    result = bon.report(np.array([[0.0, 1.0]]), [bon.Defence("flat", [np.array([[2.0, 2.0]])])], [1, 2])
    assert [p["proxy_z"] for p in result["defences"]["flat"]["runs"][0]["points"]] == [0.0, 0.0]


def test_gao_fit_of_an_imperfect_curve_by_hand():
    # X = [[1, -1], [2, -4], [3, -9]], y = [1, 2, 2]: XtX = [[14, -36], [-36, 98]], Xty = [11, -27], det 76:
    # alpha = (98*11 - 36*27)/76 = 53/38, beta = (36*11 - 14*27)/76 = 9/38; residuals -3/19, 3/19, -1/19: SSR 1/19;
    # spread around 5/3: 2/3; r2 = 1 - (1/19)/(2/3) = 35/38; d_peak = 53/18, gain there alpha^2/(4 beta) = 2809/1368.
    fit = bon.fit_gao([1, 2, 3], [1, 2, 2])
    assert fit["alpha"] == pytest.approx(53 / 38) and fit["beta"] == pytest.approx(9 / 38)
    assert fit["r2"] == pytest.approx(35 / 38)
    assert fit["d_peak"] == pytest.approx(53 / 18) and fit["gain_peak"] == pytest.approx(2809 / 1368)
    flat = bon.fit_gao([1, 2, 3], [0, 0, 0])  # no spread: r2 undefined; beta 0: no peak
    assert math.isnan(flat["r2"]) and flat["d_peak"] == math.inf and flat["gain_peak"] == math.inf


def test_aggregated_defaults():
    outputs = np.array([[[1.0, 3.0, 8.0]]])
    assert bon.aggregated(outputs, None)[0, 0] == 4.0  # K heads without an aggregation: their mean
    assert bon.aggregated(outputs[..., :2], None)[0, 0] == 2.0  # two heads too
    assert bon.aggregated(outputs[..., :1], "min")[0, 0] == 1.0  # one head under any aggregation: itself
    # mean_minus_std's penalty defaults to 1: 4 - population std of (1, 3, 8) = 4 - sqrt(26/3)
    assert bon.aggregated(outputs, "mean_minus_std")[0, 0] == pytest.approx(4 - math.sqrt(26 / 3))
    wide = np.arange(24.0).reshape(2, 4, 3)  # (P, N, K) kept apart: each sample's own heads
    np.testing.assert_array_equal(bon.aggregated(wide, "min"), wide.min(-1))
    one = [bon.Proxy("a", "p", np.array([[[1.0, 5.0]]])), bon.Proxy("s", "q", np.array([[[2.0]]])),
           bon.Proxy("s", "r", np.array([[[6.0]]]))]  # fmt: skip
    found = {d.name: d.runs[0][0, 0] for d in bon.defences(one, ["mean_minus_std"], {"e": "s"}, penalty=0.5)}
    assert found == {"a/mean_minus_std": pytest.approx(3 - 0.5 * 2), "s": 2.0, "e/mean_minus_std": pytest.approx(4 - 0.5 * 2)}


def test_verdicts_at_their_edges():
    # one seed: no standard error, never a verdict; n named is the largest
    got = bon.verdicts({"ns": [1, 2, 4], "defences": {"b": {"runs": [{"gold_last": 0.2}]},
                                                      "a": {"runs": [{"gold_last": 0.9}]}}}, "b")  # fmt: skip
    assert got == {"a": "cannot be told at this size (+0.700 +- inf gold at n=4)"}
    # a zero difference among positive ones: the seeds do not all agree in sign
    got = bon.verdicts(fake_result([0.1, 0.1, 0.1], {"z": [0.1, 0.3, 0.31]}), "single")
    assert got["z"].startswith("cannot be told")
    # differences 0.5, 0.5, 0.5: stdev 0, helps; -0.5 each: hurts, naming n=64
    assert bon.verdicts(fake_result([0.1] * 3, {"u": [0.6] * 3}), "single")["u"] == "helps (+0.500 gold at n=64)"
    assert bon.verdicts(fake_result([0.6] * 3, {"u": [0.1] * 3}), "single")["u"] == "hurts (-0.500 gold at n=64)"
    # 0.2, 0.4, 0.6 (differences 0.1, 0.3, 0.5): mean 0.3, se 0.2/sqrt(3) = 0.1155: 0.3 > 0.231, helps
    assert bon.verdicts(fake_result([0.1] * 3, {"v": [0.2, 0.4, 0.6]}), "single")["v"].startswith("helps (+0.300")
    # 0.15, 0.6, 0.6 (differences 0.05, 0.5, 0.5): mean 0.35, se 0.15: 0.35 > 0.30, helps; not at 3 se
    assert bon.verdicts(fake_result([0.1] * 3, {"w": [0.15, 0.6, 0.6]}), "single")["w"].startswith("helps")


def test_gold_from_a_reward_model_is_its_plain_forward(tiny_dir):
    rm = str(tiny_dir / "reward_model")
    samples = cmd.Samples([{"context": CONTEXT, "completions": ["5", "It is 5.", "six"]},
                           {"context": [{"role": "user", "content": "Hi"}], "completions": ["Hello", "Hey", "Yo"]}])  # fmt: skip
    cmd.add_gold(samples, "model", gold_model=rm, batch_size=2)
    plain = plain_scores(rm, *samples.pairs())[:, 0].reshape(2, 3)
    np.testing.assert_allclose(samples.gold(), plain, atol=1e-4)
    assert samples.gold().dtype == np.float64


def test_sampling_asks_the_engine_for_each_prompt_with_its_generation_prompt(tiny_dir, monkeypatch):
    from transformers import AutoTokenizer

    from trl_rm_env.runtime.engines import HFEngine

    calls = []
    original = HFEngine.generate

    def spy(self, prompts, max_new_tokens, temperature, seeds, *args, **kwargs):
        calls.append((list(prompts), max_new_tokens, temperature, list(seeds), self.options.batch_size))
        return original(self, prompts, max_new_tokens, temperature, seeds, *args, **kwargs)

    monkeypatch.setattr(HFEngine, "generate", spy)
    policy = str(tiny_dir / "policy")
    prompts = [{"context": CONTEXT, "answer": 5}, {"context": [{"role": "user", "content": "What is 1 + 1?"}]}]
    samples = cmd.generate_samples(policy, prompts, 3, batch_size=4)
    tokenizer = AutoTokenizer.from_pretrained(policy)
    wanted = [tokenizer.apply_chat_template(p["context"], add_generation_prompt=True, tokenize=True,
                                            return_dict=True)["input_ids"] for p in prompts]  # fmt: skip
    (ids, max_new_tokens, temperature, seeds, batch_size), = calls
    assert ids == [wanted[0]] * 3 + [wanted[1]] * 3  # each prompt's N in a row, as the rows are cut
    assert (max_new_tokens, temperature, seeds, batch_size) == (64, 1.0, [0], 4)  # the defaults and the option given
    assert [len(r["completions"]) for r in samples.rows] == [3, 3] and samples.rows[0]["answer"] == 5
    assert samples.source == "generated"
    cmd.generate_samples(policy, prompts[:1], 1, temperature=0.7, max_new_tokens=5, seed=9)
    assert calls[-1][1:4] == (5, 0.7, [9])
    for bad in ({"per_prompt": 0}, {"temperature": 0.0}):
        with pytest.raises(ValueError, match="best-of-n needs per_prompt >= 1 and temperature > 0"):
            cmd.generate_samples(policy, prompts, **{"per_prompt": 2, **bad})


def test_labelled_arguments():
    assert cmd.labelled(["a=/tmp/x=y", "b=c"], "--proxy") == [("a", "/tmp/x=y"), ("b", "c")]
    for bad in ("=path", "label=", "nothing"):
        with pytest.raises(ValueError, match="--proxy takes LABEL=VALUE"):
            cmd.labelled([bad], "--proxy")


def test_the_plot_draws_the_reports_numbers():
    import matplotlib.pyplot as plt

    proxy = np.array([[1.0, 2.0, 3.0], [3.0, 1.0, 2.0]])
    gold = np.array([[0.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    seeds = [proxy, proxy[:, ::-1].copy()]
    result = bon.report(gold, [bon.Defence("one", seeds), bon.Defence("heads/min", [proxy * 2])], [1, 2, 3])
    fig = bon.figure(result, "title here")
    left, right = fig.axes
    lines = {line.get_label(): line for line in left.get_lines()}
    for name, defence in result["defences"].items():
        d = [p["d"] for p in defence["runs"][0]["points"]]
        for ax, key in ((left, "gold"), (right, "proxy_z")):
            line = {li.get_label(): li for li in ax.get_lines()}[name]
            np.testing.assert_allclose(line.get_xdata(), d)
            means = np.mean([[p[key] for p in r["points"]] for r in defence["runs"]], axis=0)
            np.testing.assert_allclose(line.get_ydata(), means)
    assert lines["policy (n=1)"].get_ydata()[0] == pytest.approx(1 / 3)
    assert lines["oracle (best of 3)"].get_ydata()[0] == 1.0
    assert lines["one"].get_linewidth() > lines["heads/min"].get_linewidth()  # a one-head proxy drawn heavier
    assert lines["heads/min"].get_color() == "tab:orange" and lines["one"].get_color() == "black"
    assert len(left.collections) == 1 and len(right.collections) == 1  # the seeds' band: the two-seed defence only
    band = left.collections[0].get_paths()[0].vertices[:, 1]
    golds = [[p["gold"] for p in r["points"]] for r in result["defences"]["one"]["runs"]]
    assert band.min() == pytest.approx(np.min(golds)) and band.max() == pytest.approx(np.max(golds))
    assert fig._suptitle.get_text() == "title here"
    assert left.get_xlabel() == right.get_xlabel() == "d = sqrt(KL_bon)"
    assert left.get_ylabel() == "gold reward of the pick" and "proxy" in right.get_ylabel()
    plt.close(fig)


def test_report_edges_by_hand():
    # prompt A: proxy 1, 3, 2, gold 0, 0, 1: n=1 1/3; n=2 picks 3, 2, 3 (gold 0, 1, 0): 1/3; n=3 picks 3: 0.
    # prompt B: gold all 0 (no right sample): the oracle's mean is (1 + 0) / 2.
    proxy = np.array([[1.0, 3.0, 2.0], [1.0, 2.0, 3.0]])
    gold = np.array([[0.0, 0.0, 1.0], [0.0, 0.0, 0.0]])
    result = bon.report(gold, [bon.Defence("x", [proxy, proxy])], [1, 2, 3])
    run = result["defences"]["x"]["runs"][0]
    assert result["oracle_gold"] == 0.5
    assert [p["gold"] for p in run["points"]] == pytest.approx([1 / 6, 1 / 6, 0])
    assert (run["best_n"], run["gold_last"]) == (1, 0.0) and run["fall"] == pytest.approx(1 / 6)
    header, _, row = bon.table(result).splitlines()
    assert header == ("| defence | seeds | pair accuracy | gold n=1 | best n | gold best | gold n=3 | fall | alpha | beta "
                      "| d_peak |")  # fmt: skip
    assert row.startswith("| x | 2 | 0.500 | 0.167 | 1/1 | 0.167 +- 0.000 | 0.000 +- 0.000 | 0.167 |")
    with pytest.raises(ValueError, match=re.escape("proxy rewards (2, 3) and gold rewards (2, 2) differ in shape")):
        bon.curve(proxy, gold[:, :2], [1])


def test_defences_default_penalty_is_one():
    proxy = bon.Proxy("h", "p", np.array([[[1.0, 3.0]]]))  # mean 2, population std 1
    assert bon.defences([proxy], ["mean_minus_std"], {})[0].runs[0][0, 0] == 1.0


def test_verdicts_sign_and_seed_counts():
    def result(base, other, ns=(1, 64)):
        return {"ns": list(ns), "defences": {"single": {"runs": [{"gold_last": x} for x in base]},
                                             "o": {"runs": [{"gold_last": x} for x in other]}}}  # fmt: skip

    # two seeds that agree exactly: se 0, a verdict (one seed would have none)
    assert bon.verdicts(result([0.1, 0.2], [0.6, 0.7]), "single")["o"] == "helps (+0.500 gold at n=64)"
    # differences 0, 0.5, 0.5, 0.5: mean 0.375 > 2 x 0.125, but one seed does not differ: no verdict
    assert bon.verdicts(result([0.1] * 4, [0.1, 0.6, 0.6, 0.6]), "single")["o"].startswith("cannot be told")
    assert bon.verdicts(result([0.6] * 4, [0.6, 0.1, 0.1, 0.1]), "single")["o"].startswith("cannot be told")
    # differences 0, 1, 1, 1: the same (not all above 0)
    assert bon.verdicts(result([0.0] * 4, [0.0, 1.0, 1.0, 1.0]), "single")["o"].startswith("cannot be told")
    # the largest n is named, whatever the n's before it
    assert bon.verdicts(result([0.1] * 3, [0.6] * 3, ns=(1, 2, 8)), "single")["o"] == "helps (+0.500 gold at n=8)"


def test_a_proxy_that_scores_nan_is_refused(monkeypatch):
    import torch

    from trl_rm_env import scoring

    class Scorer:
        def outputs(self, contexts, completions):
            return torch.tensor([[1.0], [float("nan")]])

    monkeypatch.setattr(scoring, "load_reward_scorer", lambda path, **options: Scorer())
    samples = cmd.Samples([{"context": CONTEXT, "completions": ["5", "6"]}])
    with pytest.raises(ValueError, match=re.escape("proxy p (some/path) scored a sample NaN")):
        cmd.score_proxy("p", "some/path", samples)
