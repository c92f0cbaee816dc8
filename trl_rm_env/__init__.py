"""trl-rm-env: train Bradley-Terry reward models on ranked preferences and use them as GRPO rewards (TRL plugin).

The layers, the data flow and where each concept lives: docs/architecture.md.

Public names are imported lazily, so `import trl_rm_env` (and the CLI) does not pay for torch/transformers until a
name that needs them is used.
"""

from __future__ import annotations

from .lazy import lazy_exports
from .quiet import quiet_import_noise

quiet_import_noise()

__version__ = "0.1.0"

_MODULES = {
    "trl_rm_env.data.schema": ("DataValidationError", "validate_rank_record"),
    "trl_rm_env.data.loaders": ("load_rank_dataset", "load_rank_records"),
    "trl_rm_env.trainer.config": ("RankedRewardConfig", "RegressionRewardConfig"),
    "trl_rm_env.trainer.trainer": ("RankedRewardTrainer",),
    "trl_rm_env.trainer.collator": ("DataCollatorForRankedPreference",),
    "trl_rm_env.rewards.reward_model": ("RewardModelEnvironment", "RemoteRewardModelEnvironment"),
    "trl_rm_env.trainer.regression": ("RegressionRewardTrainer",),
    "trl_rm_env.data.regression": ("load_regression_dataset", "load_regression_records"),
    "trl_rm_env.scoring.scorer": ("RewardScorer",),
    "trl_rm_env.rewards.judge": ("JudgeEnvironment",),
    "trl_rm_env.judges.judge_options": ("JudgeOptions",),
    "trl_rm_env.rewards.cascade": ("CascadeReward",),
    "trl_rm_env.rewards.ensemble": ("EnsembleReward",),
}


__getattr__, __dir__, _names = lazy_exports(__name__, _MODULES)
__all__ = ["__version__", *_names]
