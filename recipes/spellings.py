"""How the command line and the recipes spell the options: generated from their declarations (`trl_rm_env.options`),
one function each way, so that a new option is one field.

- the command line (`trl-rm-env eval`, `serve`): `add_flags` offers every option of a class as a flag
  (`--max-tokens-per-batch`, with its help, default and choices), `options_from_flags` reads them back;
- the recipes (`recipes/grpo_rm.py`'s `TrlParser`): `recipe_fields` declares every option as a YAML key and flag
  (`reward_max_tokens_per_batch`), `options_from_recipe` reads back the ones given.

Either way the options class turns what was given into the option's value, in one place (`__post_init__`).

NeMo RL's block is the third spelling; it is mapped in `trl_rm_env.rewards.nemo` (`NEMO_OPTIONS`), where library
users reach it too.
"""

from __future__ import annotations

import argparse
import dataclasses
import types
import typing
import warnings
from collections.abc import Iterable, Mapping
from typing import Any

from trl_rm_env.options import build_spelled, changed, default_of, flag_of, option_fields, recipe_key, spelling


def text_type(cls: type, f: dataclasses.Field) -> type:
    """What a command line or YAML gives for an option before it is parsed: `Spelling.text`, else the field's own
    type without `None` (`int | None` -> `int`)."""
    if spelling(f).text is not None:
        return spelling(f).text
    hint = typing.get_type_hints(cls)[f.name]
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        hint = next(a for a in typing.get_args(hint) if a is not type(None))
    return typing.get_origin(hint) or hint


def text_choices(f: dataclasses.Field) -> list[str] | None:
    """An option's choices as text (`True` -> `"true"`)."""
    choices = f.metadata.get("choices")
    return None if choices is None else [str(c).lower() if isinstance(c, bool) else c for c in choices]


# --------------------------------------------------------------------------------------------- the command line
class _Alias(argparse.Action):
    """An old flag of an option: sets it, and warns once with the flag to use."""

    def __init__(self, *args: Any, preferred: str, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.preferred = preferred

    def __call__(self, parser: Any, namespace: Any, values: Any, option_string: str | None = None) -> None:
        warnings.warn(f"{option_string} is an old spelling of {self.preferred}; use {self.preferred}", FutureWarning, 2)
        setattr(namespace, self.dest, values)


def add_flags(
    parser: argparse.ArgumentParser,
    cls: type,
    *,
    exclude: Iterable[str] = (),
    defaults: Mapping[str, Any] | None = None,
) -> None:
    """Add a flag for every option of `cls` that has one (`flag_of`), but those in `exclude`; `defaults` replace
    some options' defaults on this command (each is said in the flag's help)."""
    defaults = dict(defaults or {})
    for f in option_fields(cls):
        flag = flag_of(f)
        if flag is None or f.name in exclude:
            continue
        default = defaults.get(f.name, default_of(f))
        if isinstance(default, bool) and f.metadata.get("choices") is not None:
            default = str(default).lower()
        kwargs: dict[str, Any] = {"dest": f.name, "default": default, "help": f.metadata.get("help", "")}
        if default not in (None, "", {}, False):
            kwargs["help"] += f" Default: {default}."
        text = text_type(cls, f)
        if text is bool:
            kwargs["action"] = argparse.BooleanOptionalAction if default else "store_true"
        elif text is list:
            kwargs.update(nargs="+", metavar=spelling(f).metavar or "NAME=VALUE")
        elif text is dict:
            kwargs.update(type=str, metavar=spelling(f).metavar or "JSON")
        else:
            kwargs.update(type=text, choices=text_choices(f))
            if spelling(f).metavar:
                kwargs["metavar"] = spelling(f).metavar
        parser.add_argument(flag, **kwargs)
        for alias in spelling(f).aliases:
            alias_kwargs = {k: v for k, v in kwargs.items() if k in ("type", "nargs", "choices", "metavar")}
            parser.add_argument(alias, dest=f.name, action=_Alias, preferred=flag, help=argparse.SUPPRESS,
                                default=argparse.SUPPRESS, **alias_kwargs)  # fmt: skip


def options_from_flags(args: argparse.Namespace, cls: type, **fixed: Any) -> Any:
    """The `cls` options of parsed flags (`add_flags`), with `fixed` values for the ones a command sets itself (the
    class turns text into values: `"true"`, JSON, `name=value` entries; a bad one is an error naming its flag)."""
    values = {f.name: getattr(args, f.name) for f in option_fields(cls) if hasattr(args, f.name)}
    return build_spelled(cls, {**values, **fixed}, flag_of)


# --------------------------------------------------------------------------------------------- the recipes
def recipe_fields(cls: type) -> list[tuple[str, Any, dataclasses.Field]]:
    """`(key, type, field)` of every option of `cls` in the recipes, for `dataclasses.make_dataclass`: the type
    `TrlParser` reads (a JSON mapping as text, `name=value` entries as a list of strings), the option's default
    (None where it is a mapping or list), its help and choices."""
    out = []
    for f in option_fields(cls):
        key = recipe_key(f)
        if key is None:
            continue
        text = text_type(cls, f)
        default = default_of(f)
        metadata = {"help": f.metadata.get("help", "")}
        if text is dict:
            kind, default = dict | str | None, None
        elif text is list:
            kind, default = list[str] | None, None
        elif text is bool:
            kind = bool
        else:
            kind = text if default is not None else text | None
            if text_choices(f) is not None:
                metadata["choices"] = text_choices(f)
            if isinstance(default, bool):
                default = str(default).lower()
        out.append((key, kind, dataclasses.field(default=default, metadata=metadata)))
    return out


def recipe_options(args: Any, cls: type) -> Any:
    """The `cls` instance a recipe's arguments (`recipe_fields`) describe, built once, as the class reads them
    (`"true"`, JSON text, `name=value` entries turned into values; a bad one is an error naming its key)."""
    given = {f.name: getattr(args, key) for f in option_fields(cls) if (key := recipe_key(f)) and hasattr(args, key)}
    return build_spelled(cls, given, recipe_key)


def options_from_recipe(args: Any, cls: type) -> dict[str, Any]:
    """The options of `cls` given in a recipe's arguments and not at their defaults, by option name."""
    return changed(recipe_options(args, cls))


def flags(cls: type, names: Iterable[str]) -> str:
    """The command-line flags of options of `cls`, for a message."""
    fields = {f.name: f for f in option_fields(cls)}
    return ", ".join(flag_of(fields[name]) or name for name in names)


def recipe_spellings(cls: type) -> dict[str, str]:
    """`{recipe key: option name}` of the options of `cls` in the recipes."""
    return {key: f.name for f in option_fields(cls) if (key := recipe_key(f)) is not None}
