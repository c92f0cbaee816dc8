"""`recipes/train_genrm.py` end to end on the CPU: a tiny model learns to judge a preference task with a visible cue
of quality (held-out agreement from no verdict at all to >= 85%, GRPO's sampled agreement rising after the warm
start), the trained GenRM rewards a GRPO run as `JudgeEnvironment(mode="genrm")`, and `trl-rm-env train-genrm` runs
the shipped tiny config under 2-process DDP."""

from __future__ import annotations

import json
import sys

import pytest
from helpers import ROOT, free_port, launch_env, run_process, visible_cue_records, write_jsonl

pytestmark = pytest.mark.slow
CONFIG = str(ROOT / "recipes" / "configs" / "genrm_tiny.yaml")


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """The GenRM trained on 300 records (40 supervised warm-start steps, then 40 GRPO steps), evaluated on 60
    held-out records before training, after the warm start and at the end."""
    import contextlib
    import io

    from helpers import recipe_in_process

    work = tmp_path_factory.mktemp("genrm")
    train = write_jsonl(work / "train.jsonl", visible_cue_records(300, seed=0))
    held_out = write_jsonl(work / "held_out.jsonl", visible_cue_records(60, seed=1))
    # In this process, from `work` (the config's tiny model is built there): the launch is the CLI test's below.
    printed = io.StringIO()
    with contextlib.chdir(work), contextlib.redirect_stdout(printed):
        recipe_in_process("train_genrm", "--config", CONFIG, "--train_data", str(train), "--eval_data",
                          f"held_out={held_out}", "--eval_at_start", "true", "--pairs_per_record", "null",
                          "--warm_start_steps", "40", "--learning_rate", "5e-4", "--max_steps", "40",
                          "--output_dir", str(work / "genrm"))  # fmt: skip
    return work, printed.getvalue()


def test_genrm_learns_the_human_order_from_no_verdict_at_all(trained):
    work, output = trained
    curve = json.loads((work / "genrm" / "genrm_eval.json").read_text())
    start, final = (curve[when]["sets"]["held_out"] for when in ("start", "final"))
    assert start["accuracy"] <= 0.6  # the random model writes no verdict: at or below chance
    assert final["accuracy"] >= 0.85
    assert final["position_consistency"] is not None and final["position_consistency"] >= 0.85
    assert final["no_verdict"] == 0
    assert final["tie_pairs"] == 20 and final["accuracy_with_ties"] >= 0.85  # the tied refusals judged a tie too
    assert final["n_way"]["records"] == 20 and final["n_way"]["top1_accuracy"] >= 0.85
    assert "pos. consistency" in output and "judge (genrm, final)" in output  # the table printed
    # GRPO after the warm start: the agreement of its sampled verdicts rises
    history = json.loads((work / "genrm" / "trainer_state.json").read_text())["log_history"]
    agreement = [row["rewards/genrm_agreement/mean"] for row in history if "rewards/genrm_agreement/mean" in row]
    assert len(agreement) == 40
    assert sum(agreement[-10:]) / 10 > sum(agreement[:10]) / 10
    # the saved GenRM is a plain checkpoint with the tokenizer it was trained with
    from transformers import AutoModelForCausalLM, AutoTokenizer

    AutoModelForCausalLM.from_pretrained(work / "genrm")
    assert AutoTokenizer.from_pretrained(work / "genrm").chat_template


def test_the_trained_genrm_rewards_grpo_as_a_genrm_judge(trained, tmp_path):
    from datasets import Dataset
    from helpers import grpo_config
    from trl import GRPOTrainer

    from trl_rm_env.rewards.judge import JudgeEnvironment

    work, _ = trained
    judge = JudgeEnvironment(str(work / "genrm"), mode="genrm", max_new_tokens=32, name="genrm")
    # held-out questions, each group a worked answer and a refusal: the worked one gets the higher reward
    for record in visible_cue_records(6, seed=7):
        ordered = sorted(record["completions"], key=lambda c: c["rank"])[:2]
        rewards = judge(prompts=[record["context"]] * 2, completions=[c["completion"] for c in ordered])
        assert rewards[0] > rewards[1], rewards
    # and it rewards a GRPO run of the tiny policy
    prompts = Dataset.from_list([{"prompt": r["context"]} for r in visible_cue_records(8, seed=9)])
    trainer = GRPOTrainer(
        model=str(work / "tiny-models" / "policy"), reward_funcs=[judge], train_dataset=prompts,
        args=grpo_config(tmp_path, max_steps=2, per_device_train_batch_size=8, num_generations=4,
                         max_completion_length=8),
    )  # fmt: skip
    trainer.train()
    rows = [row for row in trainer.state.log_history if "rewards/genrm/mean" in row]
    assert len(rows) == 2
    assert all(row["judge_env/num_judgements"] == 8 for row in rows)  # 2 groups of 4, compared in a circle


@pytest.mark.distributed
def test_cli_train_genrm_runs_the_shipped_tiny_config_under_two_process_ddp(tmp_path):
    """The shipped config by name through the installed command, with small data (the bundled sets' 4,000
    comparisons and 706 held-out pairs would only take longer)."""
    train = write_jsonl(tmp_path / "train.jsonl", visible_cue_records(60, seed=0))
    held_out = write_jsonl(tmp_path / "held_out.jsonl", visible_cue_records(9, seed=1))
    port = free_port()
    command = [sys.executable, "-m", "trl_rm_env.recipes.cli", "train-genrm", "--config", "genrm_tiny.yaml",
               "--accelerate_config", "ddp_cpu", "--main_process_port", str(port), "--warm_start_steps", "4",
               "--max_steps", "2", "--train_data", str(train), "--eval_data", f"held_out={held_out}",
               "--output_dir", str(tmp_path / "out")]  # fmt: skip
    output = run_process(command, tmp_path, launch_env(port), 600, "trl-rm-env train-genrm")
    assert "x2 on cpu" in output, output[-3000:]
    assert (tmp_path / "out" / "model.safetensors").exists()
    curve = json.loads((tmp_path / "out" / "genrm_eval.json").read_text())
    assert set(curve) == {"final"} and curve["final"]["mode"] == "genrm"
    assert curve["final"]["sets"]["held_out"]["pairs"] == 12  # 9 records, 3 with two refusals: 6 + 3 x 2 pairs
