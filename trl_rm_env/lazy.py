"""Public names of a package imported on first use (PEP 562), so that importing the package costs nothing heavy."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any


def lazy_exports(
    package: str, modules: Mapping[str, Sequence[str]]
) -> tuple[Callable[[str], Any], Callable[[], list[str]], list[str]]:
    """`(__getattr__, __dir__, __all__)` for `package`, whose public names live in the modules `modules` maps to
    them (each module relative to `package` or absolute); a name is imported when first read, then kept in the
    package."""
    where = {name: module for module, names in modules.items() for name in names}
    names = sorted(where)

    def __getattr__(name: str) -> Any:
        if name not in where:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(where[name], package), name)
        setattr(importlib.import_module(package), name, value)
        return value

    def __dir__() -> list[str]:
        return sorted(set(names) | set(vars(importlib.import_module(package))))

    return __getattr__, __dir__, names
