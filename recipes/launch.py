"""`trl-rm-env train | train-regression | grpo`: a recipe run through Accelerate, as TRL's `trl reward` and
`trl grpo` run theirs, from an install as from a checkout.

    trl-rm-env train --config rm_tiny.yaml --accelerate_config cpu                  # shipped configs, by name
    trl-rm-env train --config my_rm.yaml --accelerate_config zero3 --learning_rate 1e-5
    trl-rm-env grpo --config grpo_rm_tiny.yaml --accelerate_config ddp_cpu          # 2 CPU processes

The recipe's own `TrlParser` reads the flags and the YAML first, so a bad flag, key or value fails here in one line
before anything is launched; a flag it does not know goes to `accelerate launch` (`--num_processes`,
`--main_process_port`, ...), a YAML key it does not know is an error (Accelerate's settings belong on the command
line or in `--accelerate_config`). `--config` and `--accelerate_config` take a path, or the name of a config shipped with the package
(`trl_rm_env/recipes/configs`, `trl_rm_env/accelerate_configs`; `.yaml` optional). The recipe that runs is
the package's `recipes/<name>.py`, the same file `accelerate launch recipes/<name>.py` runs in a checkout.
"""

from __future__ import annotations

import importlib
import importlib.resources
import subprocess
import sys
from pathlib import Path
from typing import Any

RECIPES = {
    "train": "train_rm", "train-regression": "train_regression_rm", "grpo": "grpo_rm", "train-genrm": "train_genrm",
}
"""Each command and the recipe script it runs."""
HELP = {
    "train": "Train a Bradley-Terry reward model (recipes/train_rm.py) through accelerate launch.",
    "train-regression": "Train a regression reward model (recipes/train_regression_rm.py) through accelerate launch.",
    "grpo": "GRPO with a reward model as the reward (recipes/grpo_rm.py) through accelerate launch.",
    "train-genrm": "Train a generative reward model with GRPO on ranked data (recipes/train_genrm.py) through "
    "accelerate launch.",
}


def shipped(folder: str) -> dict[str, Path]:
    """The YAML configs shipped in `folder` (`configs`: the recipes'; `accelerate_configs`: Accelerate's), by name
    (without `.yaml`)."""
    if folder == "accelerate_configs":  # beside the recipes: the checkout's top level, or trl_rm_env/ installed
        root = Path(importlib.import_module("trl_rm_env.recipes").__file__).resolve().parent.parent / folder
    else:
        root = Path(str(importlib.resources.files("trl_rm_env.recipes").joinpath(folder)))
    return {Path(entry.name).stem: entry for entry in root.iterdir() if entry.name.endswith(".yaml")}


def resolve(value: str, folder: str, flag: str) -> str:
    """`value` when it is a file, else the shipped config of that name.

    Raises:
        SystemExit: neither, listing the shipped names.
    """
    if Path(value).is_file():
        return value
    configs = shipped(folder)
    name = Path(value).name.removesuffix(".yaml")
    if Path(value).parent == Path(".") and name in configs:
        return str(configs[name])
    names = ", ".join(sorted(configs))
    raise SystemExit(f"trl-rm-env: error: {flag} {value}: no such file, nor a shipped config (shipped: {names})")


def _replace_value(argv: list[str], flag: str, folder: str) -> list[str]:
    """`argv` with `--flag=value` split in two and the value of `flag` resolved (`resolve`)."""
    out: list[str] = []
    for arg in argv:
        out += arg.split("=", 1) if arg.startswith(flag + "=") else [arg]
    for i, arg in enumerate(out[:-1]):
        if arg == flag:
            out[i + 1] = resolve(out[i + 1], folder, flag)
    return out


def _without(items: list[str], subsequence: list[str]) -> list[str]:
    """`items` with the ordered `subsequence` taken out (the arguments left for Accelerate, in order)."""
    rest, it = [], iter(subsequence)
    current = next(it, None)
    for item in items:
        if current is not None and item == current:
            current = next(it, None)
        else:
            rest.append(item)
    return rest


LAUNCH_HELP = (
    "Launch options: --config FILE (a YAML of the flags above: a shipped config's name, e.g. rm_tiny.yaml, or a "
    "path; flags on the command line override it), --accelerate_config NAME|FILE (a shipped Accelerate config, e.g. "
    "cpu, ddp_cpu, zero3, or a path), and any flag of `accelerate launch` (e.g. --num_processes 2)."
)


def add_launch_parsers(sub: Any) -> None:
    """The recipe commands of `trl-rm-env` (listed in its help; each parses its own flags, `--help` included)."""
    for command in RECIPES:
        sub.add_parser(command, help=HELP[command], add_help=False)


def launch(command: str, argv: list[str]) -> int:
    """Run `trl-rm-env <command> <argv>`: check the flags with the recipe's parser, then `accelerate launch` the
    recipe with them; return the exit status (the recipe's own on failure, which it has already reported)."""
    from trl_rm_env.errors import debug_enabled, expected_errors, report_expected_error

    prog = f"trl-rm-env {command}"
    module = importlib.import_module(f"trl_rm_env.recipes.{RECIPES[command]}")
    try:
        argv = _replace_value(_replace_value(argv, "--config", "configs"), "--accelerate_config", "accelerate_configs")
        parser = module.make_parser(prog=prog)
        parser.epilog = LAUNCH_HELP
        *_, from_config, from_flags = parser.parse_args_and_config(
            argv, return_remaining_strings=True, separate_remaining_strings=True
        )
    except expected_errors() as err:
        if debug_enabled():
            raise
        report_expected_error(err, prog)
        return 1
    if from_config:  # the recipe would refuse them when it starts: say so now, naming them
        keys = [arg.removeprefix("--") for arg in from_config if arg.startswith("--")]
        report_expected_error(ValueError(f"unknown key(s) {keys} in the --config YAML"), prog)
        return 1
    accelerate_args = list(from_flags)  # what the recipe does not read is Accelerate's (`--num_processes 2`)
    if "--accelerate_config" in accelerate_args:
        i = accelerate_args.index("--accelerate_config")
        accelerate_args[i : i + 2] = ["--config_file", accelerate_args[i + 1]]
    script = importlib.resources.files("trl_rm_env.recipes").joinpath(f"{RECIPES[command]}.py")
    from accelerate.commands.launch import launch_command, launch_command_parser

    args = launch_command_parser().parse_args([*accelerate_args, str(script), *_without(argv, from_flags)])
    try:
        launch_command(args)
    except subprocess.CalledProcessError as err:  # one process: the recipe printed its error
        return err.returncode or 1
    except Exception as err:  # several processes: torch's launcher reports which one failed, and how
        if debug_enabled() or type(err).__name__ != "ChildFailedError":
            raise
        print(f"{prog}: error: a recipe process failed ({type(err).__name__}); its output is above", file=sys.stderr)
        return 1
    return 0
