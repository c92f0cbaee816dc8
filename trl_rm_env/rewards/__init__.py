"""Every GRPO reward function of the package, each one module on one base (`RewardFunction`), whatever scores it:

    from trl_rm_env import RewardModelEnvironment, JudgeEnvironment, CascadeReward

    reward = RewardModelEnvironment("Skywork/Skywork-Reward-V2-Qwen3-0.6B", max_tokens_per_batch=16384)
    trainer = GRPOTrainer(model=..., reward_funcs=[reward], args=..., train_dataset=...)

- `reward_model.py`: `RewardModelEnvironment` (and `RemoteRewardModelEnvironment`), a reward model as the reward:
  renders each conversation with the RM's own chat template, scores in bounded micro-batches, left-truncates
  over-long contexts; scores equal one-at-a-time scoring with the plain model (fp32, within 1e-4);
- `attributes.py`: one reward per attribute of a regression RM, all from one forward
  (`RewardModelEnvironment.attribute_rewards`);
- `nemo.py`: NeMo RL's `env.reward_model` and `grpo.reward_shaping` blocks read as arguments
  (`RewardModelEnvironment.from_config`, `length_shaping_arguments`);
- `judge.py`: `JudgeEnvironment`, a generative judge as the reward (its modes, templates and verdicts:
  `trl_rm_env.judges`);
- `cascade.py`: `CascadeReward`, reward functions chained (a rule check, then a judge; or a reward model's margin);
- `ensemble.py`: `EnsembleReward`, reward functions aggregated as an ensemble (and a multi-head model's heads:
  `RewardModelEnvironment(..., ensemble=...)`);
- `reference_bound.py`: a reward bounded against a reference answer (PAR: `reference_column`);
- `base.py`: `Reward` (TRL's call, sync or awaited; `call(...)` returns the whole `RewardCall`), `RewardFunction`
  (TRL's input checks, empty completions, NaN/inf, normalization, clipping, metrics) and its `RewardOptions`;
- `shaping.py`: group shaping of any reward (NeMo Gym's bonuses and adjustments) and NeMo RL's length shaping;
- `reward_sources.py`: a GRPO run's reward functions from its sources, and their weights (`RewardSources`);
- `pickling.py`: `PicklesByArguments` (a reward function crosses to AsyncGRPO's spawned workers as the arguments it
  was built with);
- `backend.py`: the one way a reward function reaches its model, a reward model or a judge, loaded here (sharded
  under ZeRO-3/FSDP2) or behind servers (`connect`, returning a `Backend`).
"""

from __future__ import annotations

from ..lazy import lazy_exports

_MODULES = {
    ".cascade": ("CascadeCall", "CascadeReward"),
    ".ensemble": ("EnsembleReward",),
    ".judge": ("JudgeCall", "JudgeEnvironment"),
    ".base": ("NORMALIZATIONS", "Reward", "RewardCall", "RewardFunction", "RewardOptions"),
    ".nemo": ("PASSTHROUGH_TEMPLATE",),
    ".reward_model": ("RemoteRewardModelEnvironment", "RewardModelEnvironment"),
}
"""Public names, imported on first use."""


__getattr__, __dir__, __all__ = lazy_exports(__name__, _MODULES)
