"""The entry points, in one room: the `trl-rm-env` command and the recipes with their configs.

In a checkout this is the `recipes/` folder; installed, it is the package `trl_rm_env.recipes` (`pyproject.toml` maps
one onto the other), so `accelerate launch recipes/train_rm.py` and `trl-rm-env train` run the same file.

- `train_rm.py`, `train_regression_rm.py`, `grpo_rm.py`: the recipes, each read top to bottom (model, data, train,
  evaluate and save), with `configs/` (their YAML) and `accelerate_configs/` (DDP, ZeRO-2/3, FSDP2, CPU variants);
- `shared_steps.py`: the steps they share; `grpo_args.py`: the GRPO recipe's reward-model section;
- `cli.py`: the `trl-rm-env` command (`make-tiny`, `validate`, `eval`, and the commands of `serve.py` and
  `launch.py`: `serve`, `train`, `train-regression`, `grpo`);
- `spellings.py`: the flags and YAML keys of every option, generated from its declaration; `reference.py`: the
  options reference page (docs/options.md) generated from the same declarations.
"""
