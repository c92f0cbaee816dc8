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

_EXPORTS = {
    "DataValidationError": "trl_rm_env.data.schema",
    "validate_rank_record": "trl_rm_env.data.schema",
    "load_rank_dataset": "trl_rm_env.data.loaders",
    "load_rank_records": "trl_rm_env.data.loaders",
    "RankedRewardConfig": "trl_rm_env.trainer.config",
    "RankedRewardTrainer": "trl_rm_env.trainer.trainer",
    "DataCollatorForRankedPreference": "trl_rm_env.trainer.collator",
    "RewardModelEnvironment": "trl_rm_env.rewards.reward_model",
    "RemoteRewardModelEnvironment": "trl_rm_env.rewards.reward_model",
    "RegressionRewardConfig": "trl_rm_env.trainer.config",
    "RegressionRewardTrainer": "trl_rm_env.trainer.regression",
    "load_regression_dataset": "trl_rm_env.data.regression",
    "load_regression_records": "trl_rm_env.data.regression",
    "RewardScorer": "trl_rm_env.scoring.scorer",
    "JudgeEnvironment": "trl_rm_env.rewards.judge",
    "JudgeOptions": "trl_rm_env.judges.judge_options",
    "CascadeReward": "trl_rm_env.rewards.cascade",
}

__all__ = ["__version__", *sorted(_EXPORTS)]


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
