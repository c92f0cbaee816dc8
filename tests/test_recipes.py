"""Every shipped YAML parses with its recipe's TrlParser; the CLI's make-tiny and validate work."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer
from trl_rm_env.recipes.cli import main as cli_main

from trl_rm_env.compat import CHECKPOINTING_FIELD

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = sorted((ROOT / "recipes" / "configs").glob("*.yaml"))
ACCELERATE_CONFIGS = sorted((ROOT / "accelerate_configs").glob("*.yaml"))


def load_recipe(name: str):
    spec = importlib.util.spec_from_file_location(f"recipe_{name}", ROOT / "recipes" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def recipe_for(config: Path) -> str:
    if config.name.startswith("genrm"):
        return "train_genrm"
    if config.name.startswith("grpo"):
        return "grpo_rm"
    if config.name.startswith("rm_regression"):
        return "train_regression_rm"
    return "train_rm"


def test_there_are_configs_for_both_recipes():
    names = {c.name for c in CONFIGS}
    assert {"rm.yaml", "rm_tiny.yaml", "grpo_rm.yaml", "grpo_rm_tiny.yaml", "grpo_judge_tiny.yaml", "genrm.yaml",
            "genrm_tiny.yaml"} <= names


@pytest.mark.parametrize("config", CONFIGS, ids=lambda p: p.name)
def test_shipped_yaml_parses_with_its_recipe(config, monkeypatch):
    recipe = load_recipe(recipe_for(config))
    if not config.stem.endswith("_tiny"):
        # The Hub configs are meant for bf16 GPUs; this machine has none, so pretend for the parse.
        import transformers.training_args as training_args

        monkeypatch.setattr(training_args, "is_torch_bf16_gpu_available", lambda: True)
    monkeypatch.setattr(sys, "argv", [f"{recipe_for(config)}.py", "--config", str(config)])
    parsed = recipe.make_parser().parse_args_and_config()
    assert len(parsed) == 3
    raw = yaml.safe_load(config.read_text())
    # Every key of the YAML reaches one of the dataclasses with its value (nothing silently dropped).
    values = {k: v for args in parsed for k, v in vars(args).items()}
    for key, value in raw.items():
        key = CHECKPOINTING_FIELD if key == "activation_checkpointing" else key  # its name before transformers 5.20
        assert key in values, f"{config.name}: {key} is not an argument of {recipe_for(config)}.py"
        if isinstance(value, (int, float, str, bool)) and key not in ("report_to", "lr_scheduler_type"):
            got = values[key]
            got = getattr(got, "value", got)  # enums
            assert got == value or str(got) == str(value), (key, got, value)


@pytest.mark.parametrize("config", ACCELERATE_CONFIGS, ids=lambda p: p.name)
def test_accelerate_configs_are_valid_yaml_with_a_header(config):
    text = config.read_text()
    assert text.lstrip().startswith("#"), f"{config.name} needs a header comment saying what it is for"
    data = yaml.safe_load(text)
    assert data["compute_environment"] == "LOCAL_MACHINE"
    assert int(data["num_processes"]) >= 1
    if config.stem.endswith("_cpu"):
        assert data["use_cpu"] is True and int(data["num_processes"]) == 2


def test_accelerate_configs_cover_every_backend():
    stems = {c.stem for c in ACCELERATE_CONFIGS}
    for backend in ("ddp", "zero2", "zero3", "fsdp2"):
        assert backend in stems and f"{backend}_cpu" in stems, backend


def test_cli_make_tiny_writes_loadable_models(tmp_path):
    assert cli_main(["make-tiny", str(tmp_path)]) == 0
    rm = AutoModelForSequenceClassification.from_pretrained(tmp_path / "reward_model")
    policy = AutoModelForCausalLM.from_pretrained(tmp_path / "policy")
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "reward_model")
    assert rm.config.num_labels == 1 and rm.config.model_type == "qwen3"
    assert policy.config.vocab_size == rm.config.vocab_size == len(tokenizer)
    assert (tmp_path / "reward_model" / "model.safetensors").exists()
    assert not list(tmp_path.rglob("*.bin"))
    text = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)
    assert text.startswith("<|im_start|>user")


@pytest.mark.slow
def test_cli_is_installed_as_a_console_script(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "trl_rm_env.recipes.cli", "validate", "sample:in_domain"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert "200" in out.stdout


def test_cli_validate_names_the_bad_line(tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    good = (
        '{"context": [{"role": "user", "content": "q"}], "completions": ['
        '{"rank": 0, "completion": [{"role": "assistant", "content": "a"}]}, '
        '{"rank": 1, "completion": [{"role": "assistant", "content": "b"}]}]}'
    )
    bad.write_text(good + "\n" + good.replace('"rank": 1', '"rank": "1"') + "\n")
    code = cli_main(["validate", str(bad)])
    out = capsys.readouterr()
    text = out.out + out.err
    assert code != 0
    assert "line 2" in text and "completions[1].rank" in text


@pytest.mark.slow
def test_no_nested_evaluation_bar_in_logs(tmp_path, tiny_tokenizer, monkeypatch, capsys):
    from transformers.trainer_callback import ProgressCallback
    from trl_rm_env.recipes.shared_steps import tty_aware_progress

    from trl_rm_env import RankedRewardConfig, RankedRewardTrainer, load_rank_dataset
    from trl_rm_env.tiny_models import build_tiny_reward_model

    data = load_rank_dataset("sample:in_domain").select(range(16))
    args = RankedRewardConfig(
        str(tmp_path),
        max_steps=2,
        per_device_train_batch_size=8,
        use_cpu=True,
        report_to="none",
        eval_strategy="steps",
        eval_steps=1,
        disable_tqdm=False,
        save_strategy="no",
    )
    trainer = RankedRewardTrainer(
        model=build_tiny_reward_model(tiny_tokenizer),
        args=args,
        train_dataset=data,
        eval_dataset=data,
        processing_class=tiny_tokenizer,
    )
    monkeypatch.setattr(sys.stderr, "isatty", lambda: False, raising=False)
    tty_aware_progress(trainer)
    bars = [cb for cb in trainer.callback_handler.callbacks if isinstance(cb, ProgressCallback)]
    assert len(bars) == 1 and type(bars[0]) is not ProgressCallback
    capsys.readouterr()
    trainer.train()
    err = capsys.readouterr().err
    assert "\x1b[A" not in err  # the cursor-up code a nested bar writes


def test_grpo_remote_reward_dialect_reaches_the_environment():
    # The recipe's --reward_remote_api picks the server dialect; OpenRLHF's text protocol also needs the RM's
    # tokenizer to render conversations on the client, the other dialects send messages and take none.
    from trl_rm_env.recipes.grpo_args import RewardModelArguments

    urls = ["http://127.0.0.1:1"]
    pooling = RewardModelArguments(reward_model="rm", reward_remote_url=urls).environment_kwargs()
    assert "remote_api" not in pooling and pooling["tokenizer"] is None  # the default dialect: nothing to pass
    openrlhf = RewardModelArguments(
        reward_model="rm", reward_remote_url=urls, reward_remote_api="openrlhf"
    ).environment_kwargs()
    assert openrlhf["remote_api"] == "openrlhf" and openrlhf["tokenizer"] == "rm"
    explicit = RewardModelArguments(
        reward_model="rm", reward_tokenizer="tok", reward_remote_url=urls, reward_remote_api="openrlhf"
    )
    assert explicit.environment_kwargs()["tokenizer"] == "tok"
