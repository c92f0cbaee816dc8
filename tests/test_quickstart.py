"""The README's offline quickstart: train the tiny RM, then GRPO with it, on the shipped configs (run in this process;
the README's commands themselves are launched by the docs run and from the installed wheel).

The RM run is the shipped `rm_tiny.yaml` unchanged (400 steps); it must learn (in_domain accuracy >= 0.90), and the
saved checkpoint must reload with plain transformers and reproduce the logged accuracy. The GRPO run is the shipped
`grpo_rm_tiny.yaml`; the logged reward mean must rise over its steps.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from trl_rm_env import load_rank_dataset
from trl_rm_env.data.schema import iter_pairs
from trl_rm_env.tokenization import encode_conversation

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.slow


def launch(
    recipe: str, config: str, *overrides: str, timeout: int = 600, processes: int = 1, env: dict | None = None
) -> subprocess.CompletedProcess:
    # The test's cores (helpers.threads: 2, or 1 under `pytest -n 2`); nothing here depends on the digits. Two
    # processes run as accelerate_configs/ddp_cpu.yaml says (one thread each).
    from helpers import threads

    env = {**os.environ, "HF_HUB_OFFLINE": "1", "CI": "true", "TOKENIZERS_PARALLELISM": "false",
           "OMP_NUM_THREADS": threads(processes), **(env or {})}  # fmt: skip
    where = ["--num_processes", "1", "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"]
    if processes > 1:
        from helpers import free_port

        where = ["--config_file", "accelerate_configs/ddp_cpu.yaml", "--num_processes", str(processes),
                 "--main_process_port", str(free_port())]  # fmt: skip
    cmd = [sys.executable, "-m", "accelerate.commands.launch", *where,
           f"recipes/{recipe}.py", "--config", f"recipes/configs/{config}", *overrides]
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    assert out.returncode == 0, f"{recipe} failed:\n{out.stdout[-3000:]}\n{out.stderr[-5000:]}"
    return out


@pytest.fixture(scope="module")
def quickstart(tmp_path_factory):
    """The shipped configs, unchanged but for the folders, run in this process (`recipe_in_process`, what their
    launched worker runs): the README's own commands are launched by the docs run (tests/test_docs_run.py) and from an
    installed wheel (tests/test_install.py); what is checked here is what the runs learn."""
    import contextlib
    import io

    from helpers import recipe_in_process

    work = tmp_path_factory.mktemp("quickstart")
    rm_dir, tiny = work / "rm-tiny", work / "tiny-models"
    configs = ROOT / "recipes" / "configs"
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        recipe_in_process("train_rm", "--config", str(configs / "rm_tiny.yaml"), "--output_dir", str(rm_dir),
                          "--model_name_or_path", str(tiny / "reward_model"))  # fmt: skip
    recipe_in_process("grpo_rm", "--config", str(configs / "grpo_rm_tiny.yaml"), "--output_dir",
                      str(work / "grpo-tiny"), "--model_name_or_path", str(tiny / "policy"), "--reward_model",
                      str(rm_dir))  # fmt: skip
    return {"rm_dir": rm_dir, "grpo_dir": work / "grpo-tiny", "rm_out": printed.getvalue()}


def test_rm_quickstart_learns_and_reports_both_sets(quickstart):
    metrics = json.loads((quickstart["rm_dir"] / "eval_results.json").read_text())
    for name in ("in_domain", "harder"):
        for key in ("accuracy", "loss", "margin", "num_pairs"):
            assert f"eval_{name}_{key}" in metrics
        assert name in quickstart["rm_out"]  # the printed per-set table
    assert metrics["eval_in_domain_accuracy"] >= 0.90
    history = json.loads((quickstart["rm_dir"] / "trainer_state.json").read_text())["log_history"]
    assert any("eval_harder_accuracy" in h for h in history)


@torch.no_grad()
def test_rm_checkpoint_reloads_with_plain_transformers_and_reproduces_accuracy(quickstart):
    model = AutoModelForSequenceClassification.from_pretrained(quickstart["rm_dir"]).eval()
    tokenizer = AutoTokenizer.from_pretrained(quickstart["rm_dir"])
    assert model.config.reward_mean is not None and model.config.reward_std > 0
    metrics = json.loads((quickstart["rm_dir"] / "eval_results.json").read_text())
    correct = pairs = fragile = 0
    for record in load_rank_dataset("sample:in_domain"):
        scores = [
            model(input_ids=torch.tensor([encode_conversation(tokenizer, record["context"], c["completion"])]))
            .logits[0, 0].item()
            for c in record["completions"]
        ]
        for i, j in iter_pairs([c["rank"] for c in record["completions"]]):
            pairs += 1
            correct += scores[i] > scores[j]
            fragile += abs(scores[i] - scores[j]) < 1e-5
    assert pairs == metrics["eval_in_domain_num_pairs"]
    assert abs(correct / pairs - metrics["eval_in_domain_accuracy"]) <= fragile / pairs + 1e-12


def test_grpo_quickstart_reward_rises(quickstart):
    history = json.loads((quickstart["grpo_dir"] / "trainer_state.json").read_text())["log_history"]
    rewards = [h["rewards/tiny_rm/mean"] for h in history if "rewards/tiny_rm/mean" in h]
    assert len(rewards) >= 20
    first, last = sum(rewards[:5]) / 5, sum(rewards[-5:]) / 5
    print(f"rewards/tiny_rm/mean: first-5 {first:.3f}, last-5 {last:.3f}")
    assert last > first
    assert any("reward_model_env/mean_reward" in h for h in history)
    # The live diagnostics are in TRL's logs (docs/reward_hacking.md), each in its range.
    correlations = [h["reward_model_env/length_corr"] for h in history if "reward_model_env/length_corr" in h]
    flat = [h["reward_model_env/flat_groups"] for h in history if "reward_model_env/flat_groups" in h]
    assert correlations and all(-1.0 <= c <= 1.0 for c in correlations)
    assert len(flat) == len(rewards) and all(0.0 <= f <= 1.0 for f in flat)
    assert (quickstart["grpo_dir"] / "model.safetensors").exists()


def table_rows(text: str) -> dict[str, list[str]]:
    """The rows of the recipe's per-set table (`set accuracy loss ... runtime`) in `text`, runtime left out."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.split()[:2] == ["set", "accuracy"])
    rows = {}
    for line in lines[start + 2:]:
        cells = line.split()
        if len(cells) != 8:
            break
        rows[cells[0]] = cells[1:7]
    return rows


TABLE_COLUMNS = ("accuracy", "loss", "margin", "rewards_chosen_mean", "rewards_rejected_mean", "num_pairs")


def test_printed_table_is_the_saved_metrics_and_the_published_one_has_its_shape(quickstart):
    """What holds on any CPU: the printed table reports both sets with finite numbers equal to the saved
    `eval_results.json` (rounded as printed), the model learned (in-domain far above chance, harder above it), and
    the table in docs/quickstart.md has the same sets and pair counts (the data decides those). Its float columns
    are one machine's run: 400 steps at lr 3e-3 amplify float rounding, which the CPU model and thread count change
    (docs/quickstart.md says so), so they are not compared."""
    printed = table_rows(quickstart["rm_out"])
    metrics = json.loads((quickstart["rm_dir"] / "eval_results.json").read_text())
    assert set(printed) == {"in_domain", "harder"}
    for name, row in printed.items():
        for column, cell in zip(TABLE_COLUMNS, row):
            saved = metrics[f"eval_{name}_{column}"]
            assert math.isfinite(float(cell)) and math.isfinite(saved), (name, column)
            assert cell == (f"{saved:d}" if isinstance(saved, int) else f"{saved:.4f}"), (name, column, cell, saved)
    assert metrics["eval_in_domain_accuracy"] >= 0.90
    assert metrics["eval_harder_accuracy"] > 0.60  # unseen two-digit sums: above chance (0.5), below in-domain
    assert metrics["eval_in_domain_margin"] > 0 and metrics["eval_harder_margin"] > 0
    published = table_rows((ROOT / "docs" / "quickstart.md").read_text())
    assert set(published) == set(printed)
    for name in published:
        assert published[name][5] == printed[name][5], name  # num_pairs: 706 and 758 on any machine


def test_grpo_with_a_pairwise_judge_beside_the_rm_logs_both_rewards(quickstart, tmp_path):
    # The shipped grpo_judge_tiny.yaml: the trained tiny RM and the tiny causal LM as a pairwise judge, weighed by
    # TRL's reward_weights. Each step judges 2 groups of 8 in circular pairs, both orders: 2 x 8 x 2 judgements.
    # In this process (`recipe_in_process`): the run's rewards are checked here; the recipe's launches are the docs
    # run's and the installed wheel's.
    from helpers import recipe_in_process

    tiny = quickstart["rm_dir"].parent / "tiny-models"
    out = tmp_path / "grpo-judge"
    recipe_in_process("grpo_rm", "--config", str(ROOT / "recipes" / "configs" / "grpo_judge_tiny.yaml"),
                      "--output_dir", str(out), "--max_steps", "2", "--model_name_or_path", str(tiny / "policy"),
                      "--reward_model", str(quickstart["rm_dir"]), "--reward_judge", str(tiny / "policy"))  # fmt: skip
    history = json.loads((out / "trainer_state.json").read_text())["log_history"]
    steps = [h for h in history if "rewards/judge/mean" in h]
    assert len(steps) == 2
    for step in steps:
        assert "rewards/tiny_rm/mean" in step and 0.0 <= step["rewards/judge/mean"] <= 1.0
        assert step["judge_env/num_judgements"] == 32 and step["judge_env/num_single"] == 0


def test_the_genrm_recipe_config_runs_in_two_processes_and_judges_each_split_group_whole(quickstart, tmp_path):
    # recipes/configs/grpo_genrm.yaml (the Super stage's GenRM reward) on the tiny policy, on the CPU, in 2 processes
    # with 2 samples each: every step's one group of 4 is split between them. Its GenRM is the scripted
    # OpenAI-compatible server of tests/test_genrm_judge.py. The group is still compared whole (the 4 comparisons of
    # its circle, each once), and each sample's reward in TRL's completions log (gathered from both processes) is the
    # one a single process judging the whole group gives it.
    import asyncio

    import pandas as pd
    import yaml
    from test_genrm_judge import genrm_text, scripted_genrm
    from trl_rm_env.recipes.grpo_args import RewardModelArguments

    from trl_rm_env import JudgeEnvironment

    tiny = quickstart["rm_dir"].parent / "tiny-models"
    out = tmp_path / "grpo-genrm"
    with scripted_genrm(genrm_text) as (url, bodies):
        launch("grpo_rm", "grpo_genrm.yaml", "--output_dir", str(out), "--max_steps", "2", "--use_cpu", "true",
               "--model_name_or_path", str(tiny / "policy"), "--dtype", "float32", "--bf16", "false",
               "--attn_implementation", "sdpa", "--activation_checkpointing", "false", "--reward_judge_url", url,
               "--prompt_data", "sample:train", "--per_device_train_batch_size", "2", "--num_generations", "4",
               "--gradient_accumulation_steps", "1", "--max_completion_length", "12", "--save_strategy", "no",
               "--log_completions", "true", processes=2)  # fmt: skip
        asked = [dict(b) for b in bodies]
        config = yaml.safe_load((ROOT / "recipes" / "configs" / "grpo_genrm.yaml").read_text())
        args = RewardModelArguments(**{k: v for k, v in config.items() if k.startswith("reward_")})
        one_process = JudgeEnvironment(args.reward_judge, **{**args.judge_kwargs(), "remote_url": [url]})
        history = json.loads((out / "trainer_state.json").read_text())["log_history"]
        steps = [h for h in history if "rewards/genrm/mean" in h]
        assert len(steps) == 2 and len(asked) == 8
        assert {(b["temperature"], b["top_p"], b["max_tokens"]) for b in asked} == {(0.6, 0.95, 16384)}
        for step, step_bodies in zip((1, 2), (asked[:4], asked[4:])):  # steps run one after another
            logged = pd.read_parquet(out / "completions" / f"completions_{step:05d}.parquet")
            assert len(logged) == 4  # the group, process 0's two samples then process 1's
            prompts = [[dict(m) for m in row] for row in logged["prompt"]]
            completions = [[dict(m) for m in row] for row in logged["completion"]]
            answers = [c[-1]["content"] for c in completions]
            # The circle i -> i + 1 of the whole group, each comparison asked once.
            assert sorted((b["messages"][-2]["content"], b["messages"][-1]["content"]) for b in step_bodies) == sorted(
                (answers[i], answers[(i + 1) % 4]) for i in range(4))
            want = asyncio.run(one_process(prompts, completions))
            assert logged["genrm"].tolist() == pytest.approx(want, abs=1e-5)
        for step in steps:
            assert step["judge_env/num_failed"] == 0
            assert 0.0 <= step["judge_env/flat_groups"] <= 1.0  # the diagnostics in TRL's logs (process 0's share)


def test_grpo_rewarded_by_an_ensemble_of_a_local_and_a_served_reward_model(quickstart, tmp_path):
    # `reward_ensemble_members`: the quickstart's trained RM here and the tiny RM behind `trl-rm-env serve`, one
    # EnsembleReward aggregated by `min` (the conservative choice), its metrics in TRL's logs.
    # The GRPO run in this process (`recipe_in_process`), the served member in its own.
    from helpers import ServerProcess, recipe_in_process

    tiny = quickstart["rm_dir"].parent / "tiny-models"
    out = tmp_path / "grpo-ensemble"
    server = ServerProcess(str(tiny / "reward_model"))
    try:
        url = server.wait(timeout=300)
        member = json.dumps({"model": str(tiny / "reward_model"), "remote_url": [url], "name": "served_rm"})
        recipe_in_process("grpo_rm", "--config", str(ROOT / "recipes" / "configs" / "grpo_rm_tiny.yaml"),
                          "--output_dir", str(out), "--max_steps", "2", "--model_name_or_path", str(tiny / "policy"),
                          "--reward_model", str(quickstart["rm_dir"]), "--reward_ensemble", "min",
                          "--reward_ensemble_members", member)  # fmt: skip
    finally:
        server.shut_down()
    history = json.loads((out / "trainer_state.json").read_text())["log_history"]
    steps = [h for h in history if "rewards/ensemble/mean" in h]
    assert len(steps) == 2 and not any("rewards/tiny_rm/mean" in h for h in history)  # one reward function
    for step in steps:
        first, second = step["reward_model_env/ensemble_member_0_mean"], step["reward_model_env/ensemble_member_1_mean"]
        assert step["rewards/ensemble/mean"] <= min(first, second) + 1e-6  # the mean of a min is at most either mean
        assert step["reward_model_env/ensemble_std"] > 0  # two different models disagree
