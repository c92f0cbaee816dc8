"""Deprecated name of `trl_rm_env.tiny_models` (the tiny offline models of `trl-rm-env make-tiny`, the quickstart and
the tests): importing it warns, and every name resolves there; `python -m trl_rm_env.testing` still runs it."""

from __future__ import annotations

import warnings

from . import tiny_models
from .tiny_models import *  # noqa: F403 - the old module's names, unchanged
from .tiny_models import _main

warnings.warn(
    "trl_rm_env.testing is now trl_rm_env.tiny_models (it builds the tiny offline models); import it from there",
    DeprecationWarning,
    stacklevel=2,
)
__all__ = [name for name in dir(tiny_models) if not name.startswith("_")]

if __name__ == "__main__":
    raise SystemExit(_main())
