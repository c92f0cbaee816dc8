"""What every GRPO reward function of the package is built on, whatever scores it (a reward model, a judge):

- `base.py`: `RewardFunction` (TRL's input checks, empty completions, NaN/inf, normalization, clipping, metrics) and
  its `RewardOptions`;
- `pickling.py`: `PicklesByArguments` (a reward function crosses to AsyncGRPO's spawned workers as the arguments it
  was built with);
- `placement.py`: where a reward function's model runs, loaded here or behind servers (`loaded_here`).
"""
