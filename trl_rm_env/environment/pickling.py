"""Pickling by arguments moved to `trl_rm_env.rewards.pickling` (its room); its names are still importable here."""

from ..rewards.pickling import PicklesByArguments, accelerator_type  # noqa: F401
