"""Pickling by arguments moved to `trl_rm_env.rewards.pickling` (its room); its names are still importable here."""

from ..rewards.pickling import (  # noqa: F401
    ACCELERATOR_LOADING,
    ACCELERATOR_ONLY,
    NOT_LOADING,
    PicklesByArguments,
    accelerator_type,
)
