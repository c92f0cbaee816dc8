"""The installed package is whole: a wheel built from this checkout, installed in a fresh virtual environment and
run from a folder outside the checkout, trains a reward model and runs GRPO with it on the shipped tiny configs,
through `trl-rm-env train` in two processes (`--accelerate_config ddp_cpu`) and `trl-rm-env grpo` in one (`cpu`),
as docs/quickstart.md's commands.

The fresh environment gets the wheel alone (`pip install --no-deps`); its dependencies (torch, TRL, ...) are the
test environment's, reached through a `.pth` file, so the test needs no download and proves what the wheel itself
carries: the package, the recipes, their YAML and Accelerate configs, and the sample data.
"""

from __future__ import annotations

import os
import shutil
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest
from helpers import free_port, run_process, threads

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.slow


def run(cmd: list[str], cwd: Path, timeout: int = 600) -> str:
    """Run `cmd` outside the checkout's reach (no `PYTHONPATH`), offline; its output (`run_process`)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", OMP_NUM_THREADS=threads(), CI="true")
    return run_process(cmd, cwd, env, timeout, " ".join(cmd[:4]))


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    leftover = not (ROOT / "build").exists()  # setuptools builds in the checkout's build/ (git-ignored): tidy it
    try:
        run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out),
             str(ROOT)], cwd=out)  # fmt: skip
    finally:
        if leftover:
            shutil.rmtree(ROOT / "build", ignore_errors=True)
    (built,) = out.glob("trl_rm_env-*.whl")
    return built


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory) -> Path:
    """A fresh venv with the wheel installed; its `bin` folder."""
    venv = tmp_path_factory.mktemp("venv")
    run([sys.executable, "-m", "venv", str(venv)], cwd=venv)
    site = Path(sysconfig.get_paths(vars={"base": str(venv), "platbase": str(venv)})["purelib"])
    (site / "_test_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)], cwd=venv)
    return venv / "bin"


def test_the_wheel_carries_the_recipes_their_configs_and_the_sample_data(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    for recipe in ("train_rm", "train_regression_rm", "grpo_rm", "cli", "launch", "shared_steps", "grpo_args",
                   "spellings"):
        assert f"trl_rm_env/recipes/{recipe}.py" in names
    for config in (ROOT / "recipes" / "configs").glob("*.yaml"):
        assert f"trl_rm_env/recipes/configs/{config.name}" in names
    for config in (ROOT / "accelerate_configs").glob("*.yaml"):
        assert f"trl_rm_env/accelerate_configs/{config.name}" in names
    for sample in (ROOT / "trl_rm_env" / "data" / "sample").iterdir():
        assert f"trl_rm_env/data/sample/{sample.name}" in names
    packages = {str(p.parent.relative_to(ROOT)).replace("/", ".") for p in (ROOT / "trl_rm_env").rglob("__init__.py")}
    assert {name.rsplit("/", 1)[0].replace("/", ".") for name in names if name.endswith("__init__.py")} >= packages
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    assert "trl-rm-env = trl_rm_env.recipes.cli:main" in zipfile.ZipFile(wheel).read(entry_points).decode()


def test_installed_commands_train_and_run_grpo_outside_the_checkout(installed, tmp_path):
    work = tmp_path / "work"  # no checkout here: configs and recipes come from the installed package
    work.mkdir()
    where = run([str(installed / "python"), "-c", "import trl_rm_env.recipes as r; print(r.__file__)"], cwd=work)
    assert str(installed.parent) in where and str(ROOT) not in where
    cli = str(installed / "trl-rm-env")
    # docs/quickstart.md's commands, each shipped Accelerate config once: training in two processes (`ddp_cpu`), then
    # GRPO in one (`cpu`) rewarded by that model. (Training in one process from a checkout is the docs run's and
    # tests/test_quickstart.py's; GRPO under DDP is tests/test_distributed.py's.)
    out_dir = "outputs/rm-ddp_cpu"
    out = run([cli, "train", "--config", "rm_tiny.yaml", "--accelerate_config", "ddp_cpu", "--main_process_port",
               str(free_port()), "--max_steps", "6", "--eval_steps", "6", "--output_dir", out_dir], cwd=work)  # fmt: skip
    assert f"Reward model saved to {out_dir}" in out
    assert "gemm_4bit_forward" not in out and "Setting accelerator to CPU" not in out  # no import noise
    assert "x2 on cpu" in out  # "Distributed: MULTI_CPU x2 on cpu"
    assert (work / out_dir / "model.safetensors").is_file() and (work / out_dir / "eval_results.json").is_file()
    grpo_dir = "outputs/grpo-cpu"
    out = run([cli, "grpo", "--config", "grpo_rm_tiny.yaml", "--accelerate_config", "cpu", "--reward_model",
               out_dir, "--max_steps", "2", "--output_dir", grpo_dir], cwd=work)  # fmt: skip
    assert f"Policy saved to {grpo_dir}" in out
    assert "gemm_4bit_forward" not in out and "x1 on cpu" in out
    assert (work / grpo_dir / "trainer_state.json").is_file()
    assert (work / "tiny-models" / "reward_model").is_dir()  # the quickstart's tiny models, built where it ran
