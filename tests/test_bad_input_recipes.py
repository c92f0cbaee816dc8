"""Typos and bad input in the CLI and the recipes: one line, no traceback, exit status 1 or 2, before heavy work."""

from __future__ import annotations

import importlib.util
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
from trl_rm_env.recipes.cli import main as cli_main

from trl_rm_env.errors import run_recipe
from trl_rm_env.model_source import ModelSourceError, check_model_source, ensure_tiny_model

ROOT = Path(__file__).resolve().parent.parent


def load_recipe(name: str):
    spec = importlib.util.spec_from_file_location(f"recipe_{name}", ROOT / "recipes" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    """A working directory with `outputs/rm-tiny` (a model folder), as after the quickstart."""
    (tmp_path / "outputs" / "rm-tiny").mkdir(parents=True)
    (tmp_path / "outputs" / "rm-tiny" / "config.json").write_text("{}")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    return tmp_path


# --- check_model_source -----------------------------------------------------------------------------------------
def test_typo_in_local_folder_is_not_a_hub_id(workdir):
    with pytest.raises(ModelSourceError, match=r"^reward model folder not found: outputs/rm-tinyy \(did you mean "
                       r"outputs/rm-tiny\?\)$"):
        check_model_source("outputs/rm-tinyy")


@pytest.mark.parametrize("path", ["./rm", "../rm", "/no/such/rm", "~/no-such-rm", "a/b/c", "bad name/x"])
def test_paths_that_can_only_be_local_must_exist(workdir, path):
    with pytest.raises(ModelSourceError, match=f"^policy folder not found: {path}$".replace(".", r"\.")):
        check_model_source(path, "policy")


def test_hub_ids_and_existing_folders_pass_unchanged(workdir):
    assert check_model_source("Skywork/Skywork-Reward-V2-Qwen3-0.6B") == "Skywork/Skywork-Reward-V2-Qwen3-0.6B"
    assert check_model_source("gpt2") == "gpt2"
    assert check_model_source("outputs/rm-tiny") == "outputs/rm-tiny"
    assert check_model_source(workdir / "outputs" / "rm-tiny") == str(workdir / "outputs" / "rm-tiny")


def test_offline_hub_id_not_in_cache_fails(workdir, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(workdir / "empty-cache"))
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(workdir / "empty-cache"))
    with pytest.raises(ModelSourceError, match=r"^reward model folder not found: org/missing-rm \(HF_HUB_OFFLINE=1 is "
                       r"set and the Hub cache does not hold it either\)$"):
        check_model_source("org/missing-rm")


def test_folder_without_config_is_not_a_model(workdir):
    (workdir / "outputs" / "empty").mkdir()
    with pytest.raises(ModelSourceError, match=r"^model folder outputs/empty has no config.json"):
        check_model_source("outputs/empty", "model")


def test_tiny_models_are_built_only_where_asked(workdir):
    built = []
    (workdir / "tiny-models").mkdir()
    with pytest.raises(ModelSourceError, match=r"^model folder not found: tiny-models/reward_modle .*builds only a "
                       r"missing folder named reward_model"):
        ensure_tiny_model("tiny-models/reward_modle", "reward_model", lambda: built.append(1))
    with pytest.raises(ModelSourceError, match=r"did you mean outputs/rm-tiny\?"):
        ensure_tiny_model("outputs/rm-tinyy", "reward_model", lambda: built.append(1))
    assert built == []
    ensure_tiny_model("tiny-models/reward_model", "reward_model", lambda: built.append(1))
    ensure_tiny_model("fresh/model", "regression_model", lambda: built.append(2), exact_name=False)
    assert built == [1, 2]


# --- CLI ----------------------------------------------------------------------------------------------------------
def test_cli_eval_typo_is_one_line_exit_1(workdir, capsys):
    assert cli_main(["eval", "--model", "outputs/rm-tinyy", "--data", "sample:in_domain"]) == 1
    err = capsys.readouterr().err
    assert err == "trl-rm-env: error: reward model folder not found: outputs/rm-tinyy (did you mean outputs/rm-tiny?)\n"


def test_cli_serve_typo_is_one_line_and_debug_shows_traceback(workdir, capsys, monkeypatch):
    assert cli_main(["serve", "--model", "./nope"]) == 1
    assert capsys.readouterr().err == "trl-rm-env: error: reward model folder not found: ./nope\n"
    with pytest.raises(ModelSourceError):
        cli_main(["serve", "--model", "./nope", "--debug"])
    monkeypatch.setenv("TRL_RM_ENV_DEBUG", "1")
    with pytest.raises(ModelSourceError):
        cli_main(["serve", "--model", "./nope"])


def test_cli_eval_missing_data_file_is_one_line(tiny_dir, tmp_path, capsys):
    code = cli_main(["eval", "--model", str(tiny_dir / "reward_model"), "--data", str(tmp_path / "x.jsonl")])
    err = capsys.readouterr().err
    assert code == 1 and err.startswith("trl-rm-env: error: ") and err.count("\n") == 1 and "x.jsonl" in err


def test_cli_eval_of_a_hub_data_set_offline_is_one_line(tiny_dir, capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    code = cli_main(["eval", "--model", str(tiny_dir / "reward_model"), "--data", "allenai/reward-bench-2",
                     "--format", "rewardbench2"])
    err = capsys.readouterr().err
    assert code == 1 and err.startswith("trl-rm-env: error: ") and err.count("\n") == 1, err
    assert "allenai/reward-bench-2" in err and "a local file needs neither" in err


# --- recipes ------------------------------------------------------------------------------------------------------
def run_script(*args: str, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})}
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def test_recipe_missing_config_fails_before_imports(tmp_path):
    out = run_script(str(ROOT / "recipes" / "train_rm.py"), "--config", "nope.yaml", cwd=tmp_path)
    assert out.returncode == 2
    assert out.stderr == "train_rm.py: error: config file not found: nope.yaml\n"


def test_recipe_expected_error_is_one_line_and_env_var_shows_traceback(tmp_path, monkeypatch, capsys):
    recipe = load_recipe("train_rm")
    argv = ["--config", str(ROOT / "recipes" / "configs" / "rm_tiny.yaml"), "--train_data", str(tmp_path / "none.jsonl"),
            "--model_name_or_path", str(tmp_path / "tiny" / "reward_model"), "--output_dir", str(tmp_path / "out")]
    monkeypatch.setattr(recipe, "main", lambda *parsed: (_ for _ in ()).throw(FileNotFoundError("data file not found: x")))
    with pytest.raises(SystemExit) as exit_info:
        run_recipe(recipe.make_parser, recipe.main, argv)
    assert exit_info.value.code == 1
    assert capsys.readouterr().err.endswith("error: data file not found: x\n")
    monkeypatch.setenv("TRL_RM_ENV_DEBUG", "1")
    with pytest.raises(FileNotFoundError):
        run_recipe(recipe.make_parser, recipe.main, argv)


def test_train_rm_typo_does_not_build_tiny_models(workdir, capsys):
    recipe = load_recipe("train_rm")
    argv = ["--config", str(ROOT / "recipes" / "configs" / "rm_tiny.yaml"), "--model_name_or_path",
            "outputs/rm-tinyy", "--output_dir", "outputs/new"]
    with pytest.raises(SystemExit) as exit_info:
        run_recipe(recipe.make_parser, recipe.main, argv)
    assert exit_info.value.code == 1
    assert capsys.readouterr().err.endswith(
        "error: model folder not found: outputs/rm-tinyy (did you mean outputs/rm-tiny?; build_tiny_model builds only "
        "a missing folder named reward_model)\n")
    assert sorted(p.name for p in workdir.iterdir()) == ["outputs"]  # nothing built
    assert sorted(p.name for p in (workdir / "outputs").iterdir()) == ["rm-tiny"]


def test_grpo_missing_reward_model_is_an_error_not_a_random_rm(workdir, capsys):
    recipe = load_recipe("grpo_rm")
    argv = ["--config", str(ROOT / "recipes" / "configs" / "grpo_rm_tiny.yaml"), "--reward_model", "outputs/rm-tinyy",
            "--output_dir", "outputs/grpo"]
    with pytest.raises(SystemExit) as exit_info:
        run_recipe(recipe.make_parser, recipe.main, argv)
    assert exit_info.value.code == 1
    err = capsys.readouterr().err
    assert err.endswith("error: reward model folder not found: outputs/rm-tinyy (did you mean outputs/rm-tiny?; train "
                        "it first, e.g. `trl-rm-env train --config rm_tiny.yaml`)\n")
    assert not (workdir / "tiny-models").exists() and not (workdir / "outputs" / "grpo").exists()


def test_recipe_resume_from_incomplete_checkpoint_fails_before_loading(workdir, capsys):
    (workdir / "outputs" / "new" / "checkpoint-4").mkdir(parents=True)
    recipe = load_recipe("train_rm")
    argv = ["--config", str(ROOT / "recipes" / "configs" / "rm_tiny.yaml"), "--output_dir", "outputs/new",
            "--resume_from_checkpoint", "outputs/new/checkpoint-4"]
    with pytest.raises(SystemExit) as exit_info:
        run_recipe(recipe.make_parser, recipe.main, argv)
    assert exit_info.value.code == 1
    assert capsys.readouterr().err.endswith(
        "error: cannot resume from outputs/new/checkpoint-4: no trainer_state.json (the save was interrupted)\n")
    assert not (workdir / "tiny-models").exists()


# --- regression from a one-label checkpoint -----------------------------------------------------------------------
def test_regression_trainer_builds_a_new_head_on_a_one_label_rm(tmp_path, tiny_tokenizer, caplog):
    import torch

    from trl_rm_env import RegressionRewardConfig, RegressionRewardTrainer
    from trl_rm_env.data.regression import load_regression_dataset
    from trl_rm_env.tiny_models import build_tiny_reward_model

    bt_rm = build_tiny_reward_model(tiny_tokenizer, seed=3)
    bt_rm.save_pretrained(tmp_path / "bt-rm")
    tiny_tokenizer.save_pretrained(tmp_path / "bt-rm")
    attributes = ["helpfulness", "correctness", "verbosity"]
    args = RegressionRewardConfig(str(tmp_path / "out"), use_cpu=True, report_to="none", max_steps=1,
                                  attributes=attributes, disable_tqdm=True)
    with caplog.at_level(logging.WARNING):
        trainer = RegressionRewardTrainer(model=str(tmp_path / "bt-rm"), args=args,
                                          train_dataset=load_regression_dataset("sample:train").select(range(4)))
    messages = [r.getMessage() for r in caplog.records if "score head" in r.getMessage()]
    assert messages == [f"{tmp_path / 'bt-rm'} has a 1-output score head; building a new 3-output head for "
                        "helpfulness, correctness, verbosity (random, seeded)."]
    model = trainer.model
    assert model.score.weight.shape[0] == 3 and model.config.num_labels == 3
    torch.testing.assert_close(model.model.embed_tokens.weight, bt_rm.model.embed_tokens.weight, rtol=0, atol=0)
    torch.testing.assert_close(model.model.layers[0].mlp.up_proj.weight, bt_rm.model.layers[0].mlp.up_proj.weight,
                               rtol=0, atol=0)


def test_recipe_bad_data_is_one_line_naming_file_line_and_field(workdir, capsys):
    good = ('{"context": [{"role": "user", "content": "q"}], "completions": [{"rank": 0, "completion": [{"role": '
            '"assistant", "content": "a"}]}, {"rank": 1, "completion": [{"role": "assistant", "content": "b"}]}]}')
    (workdir / "bad.jsonl").write_text(good + "\n" + good.replace('"rank": 1', '"rank": "1"') + "\n")
    recipe = load_recipe("train_rm")
    argv = ["--config", str(ROOT / "recipes" / "configs" / "rm_tiny.yaml"), "--train_data", "bad.jsonl",
            "--output_dir", "outputs/new"]
    with pytest.raises(SystemExit) as exit_info:
        run_recipe(recipe.make_parser, recipe.main, argv)
    assert exit_info.value.code == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "error: " in err and "bad.jsonl" in err and "line 2" in err
    assert "completions[1].rank" in err and "Traceback" not in err
    assert not (workdir / "tiny-models").exists()  # failed before any model was built


def test_log_level_info_shows_our_info_messages(capsys):
    """`--log_level info` (a recipe's `steps.start`) prints our INFO messages (the docs' "logged"), once; the
    default level leaves them out, as before."""
    import logging

    from trl_rm_env.recipes import shared_steps as steps

    package = logging.getLogger("trl_rm_env")
    before = (package.level, list(package.handlers))
    try:
        steps.show_logs(logging.WARNING)
        logging.getLogger("trl_rm_env.sharing.model_support").info("not shown")
        steps.show_logs(logging.INFO)
        steps.show_logs(logging.INFO)  # a second recipe start adds no second handler
        logging.getLogger("trl_rm_env.sharing.model_support").info("shown")
        err = capsys.readouterr().err
        assert "not shown" not in err and err.count("INFO trl_rm_env.sharing.model_support: shown") == 1, err
    finally:
        package.setLevel(before[0])
        package.handlers[:] = before[1]
