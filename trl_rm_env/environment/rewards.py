"""The reward-function base moved to `trl_rm_env.rewards.base` (its room); its names are still importable here."""

from ..rewards.base import NORMALIZATIONS, Ids, RewardFunction, RewardOptions, Samples, is_empty  # noqa: F401
