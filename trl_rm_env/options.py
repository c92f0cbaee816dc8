"""How an option is declared: once, as a field of an options dataclass that carries its help, its choices and the
names it has on each surface.

    batch_size: int | None = option(None, help="At most this many sequences per forward pass.")

A field made with `option(...)` is everything a surface needs to offer the option: the command line
(`trl_rm_env.recipes.spellings.add_flags`: `--batch-size`), the recipes' YAML keys and flags (`recipe_fields`:
`reward_batch_size`), NeMo RL's block (`trl_rm_env.rewards.nemo`, a table onto these names) and the keyword
arguments of the classes that take the options by name (`build`, `route`). A new option is one field; the surfaces
are generated from it, and `tests/test_options.py` holds each spelling to exactly one field and each documented
default to the field's.

The same `choices` rule serves every dataclass whose fields say `metadata={"choices": [...]}` (TRL's convention, read
by `TrlParser`): `check_choices` refuses any other value in one line that names the field and the choices.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from dataclasses import MISSING, dataclass
from typing import Any

SPELLING = "trl_rm_env.spelling"
"""The metadata key of a field's `Spelling`."""


@dataclass(frozen=True)
class Spelling:
    """Where an option appears besides its class, and how text becomes its value.

    Args:
        flag: Its command-line flag; `""` (default): `--` and the name with dashes; None: not on the command line.
        aliases: Older command-line flags, still accepted with a warning that names the one to use.
        recipe: Its key in the recipes (YAML and `--flag`); `""` (default): the surface's prefix and the name;
            None: not in the recipes.
        text: What a command line gives, for the parsers: `int`, `float`, `str`, `bool`, `list` (of strings) or `dict`
            (JSON text). None: the field's own type. The options class turns it into the option's value (its
            `__post_init__`), whatever the surface.
        remote: The option also applies when a server scores (`remote_url`); otherwise it is local only, and giving
            it with `remote_url` is an error.
        engine: The one scoring engine it applies to (`"vllm"`), or None for both.
        metavar: The command line's name for its value in the help (None: the parser's default).
    """

    flag: str | None = ""
    aliases: tuple[str, ...] = ()
    recipe: str | None = ""
    text: type | None = None
    remote: bool = False
    engine: str | None = None
    metavar: str | None = None


def option(
    default: Any = MISSING,
    *,
    help: str,
    choices: Iterable[Any] | None = None,
    default_factory: Callable[[], Any] | Any = MISSING,
    **spelling: Any,
) -> Any:
    """A dataclass field declaring an option: its default, `help`, `choices` and `Spelling` (keyword arguments).
    `choices` given as a mapping (a registry, such as the judge modes) stays live: its names at the time of use."""
    # Only a field spelled some other way carries its `Spelling`: TRL's parser hands every metadata key but `help`,
    # `choices` and `aliases` to argparse, so the trainer configs' fields (declared here too) carry none.
    metadata: dict[str, Any] = {"help": help, **({SPELLING: Spelling(**spelling)} if spelling else {})}
    if choices is not None:
        metadata["choices"] = choices if isinstance(choices, Mapping) else list(choices)
    return dataclasses.field(default=default, default_factory=default_factory, metadata=metadata)


def spelling(f: dataclasses.Field) -> Spelling:
    """A field's `Spelling` (the default one for a field not made with `option`)."""
    return f.metadata.get(SPELLING, Spelling())


RECIPE_PREFIX = "reward_"
"""The recipes' keys are the option names behind this prefix (`Spelling.recipe` gives any other key)."""


def flag_of(f: dataclasses.Field) -> str | None:
    """An option's command-line flag (None: not on the command line)."""
    flag = spelling(f).flag
    return None if flag is None else flag or "--" + f.name.replace("_", "-")


def recipe_key(f: dataclasses.Field) -> str | None:
    """An option's key in the recipes (None: not in the recipes)."""
    key = spelling(f).recipe
    return None if key is None else key or RECIPE_PREFIX + f.name


def spelled(cls: type, names: Iterable[str]) -> str:
    """Options named with every spelling a user may have typed: `vllm_tensor_parallel_size (--tensor-parallel-size,
    reward_vllm_tensor_parallel_size)`, for one-line errors that every surface can read."""
    fields = {f.name: f for f in option_fields(cls)}
    out = []
    for name in names:
        other = [s for s in (flag_of(fields[name]), recipe_key(fields[name])) if s] if name in fields else []
        out.append(f"{name} ({', '.join(other)})" if other else name)
    return ", ".join(out)


def option_fields(cls: type) -> list[dataclasses.Field]:
    """The fields of an options dataclass, in declaration order."""
    return [f for f in dataclasses.fields(cls) if f.init]


def names(cls: type) -> tuple[str, ...]:
    """Every option's name."""
    return tuple(f.name for f in option_fields(cls))


def default_of(f: dataclasses.Field) -> Any:
    """A field's default value (a fresh one for a `default_factory`)."""
    if f.default_factory is not MISSING:
        return f.default_factory()
    return f.default


def check_choices(obj: Any, skip: Iterable[str] = ()) -> None:
    """Refuse a field value outside its declared `choices` (None passes where it is the default); `skip`: fields
    checked another way (a value normalized from several spellings).

    Raises:
        ValueError: one line naming the field, the allowed values and the value given.
    """
    for f in dataclasses.fields(obj):
        choices = f.metadata.get("choices")
        if not choices or f.name in skip:
            continue
        value = getattr(obj, f.name)
        if value is None and f.default is None:
            continue
        if value not in choices:
            raise ValueError(f"{f.name} must be one of {list(choices)}, got {value!r}")


ENGINES = ("auto", "vllm", "hf")
"""What runs a model loaded in this process, for reward models and judges alike: vLLM, transformers (`hf`), or
`auto` (vLLM where it is installed and can run the case, else transformers)."""

TRUNCATION = ("left", "none")
"""`truncation`'s vocabulary, in training and in scoring alike: `left` cuts the context from the left (never the
completion); `none` cuts nothing (training drops the record, as TRL does; scoring gives `overlength_reward`)."""
RENAMED = {"truncation": {"drop": "none", "fallback": "none"}}
"""Values renamed when training and scoring took one vocabulary: refused, naming the new spelling."""


def refuse_renamed(obj: Any) -> None:
    """Refuse a value that `RENAMED` lists for one of `obj`'s fields, in one line that gives the new spelling.

    Raises:
        ValueError: a renamed value.
    """
    for name, renames in RENAMED.items():
        value = getattr(obj, name, None)
        if isinstance(value, str) and value in renames:
            raise ValueError(
                f"{name}={value!r} is now {name}={renames[value]!r} (training and scoring share one vocabulary: "
                f"{' or '.join(repr(v) for v in TRUNCATION)})"
            )


def build(cls: type, base: Any = None, **values: Any) -> Any:
    """`base` (default: the defaults) with `values` replacing some of its options.

    Raises:
        TypeError: a name that is not an option of `cls`, listing the options.
    """
    unknown = sorted(set(values) - set(names(cls)))
    if unknown:
        raise TypeError(f"unknown {cls.__name__} option(s) {unknown}; the options are {list(names(cls))}")
    if base is None:
        return cls(**values)
    return dataclasses.replace(base, **values) if values else base  # immutable: nothing to copy


def build_spelled(cls: type, values: dict[str, Any], spelled: Callable[[dataclasses.Field], str | None]) -> Any:
    """`cls(**values)`; a bad value is a `ValueError` that starts with the spelling the user typed, `spelled(field)`
    (`flag_of`: `--batch-size: batch_size must be >= 1, got 0`; `recipe_key`: `reward_batch_size: ...`)."""
    try:
        return cls(**values)
    except ValueError:
        fields = {f.name: f for f in option_fields(cls)}
        for name, value in values.items():
            try:
                cls(**{name: value})
            except ValueError as err:  # this value alone is bad: say so under the spelling it was given in
                raise ValueError(f"{spelled(fields[name]) or name}: {err}") from err
        raise  # only a combination is bad


def changed(obj: Any) -> dict[str, Any]:
    """The options of `obj` that differ from their defaults, by name. An options class whose default of a field
    depends on another (None resolved at construction) says what it resolved to in `resolved_defaults()`."""
    resolved = obj.resolved_defaults() if hasattr(obj, "resolved_defaults") else {}
    return {
        f.name: value
        for f in option_fields(type(obj))
        if (value := getattr(obj, f.name)) != resolved.get(f.name, default_of(f))
    }


PREFIX_SHARING_TEXT: dict[str, bool | str] = {"auto": "auto", "true": True, "false": False, "packed": "packed"}
"""`prefix_sharing`'s values by their text (a command line's, a YAML file's)."""

PrefixSharing = str | None
"""`prefix_sharing` as the training config declares it for TRL's parser (`RankedRewardConfig`, read by `TrlParser`,
which would read `bool | str` as a bool): its text, `auto`, `true`, `false` or `packed` (None: `auto`), or True/False
from Python; its `__post_init__` normalizes it (`normalize_prefix_sharing`) to what it then holds, True, False,
"auto" or "packed". The scoring options (`ModelOptions`) declare that type, `bool | str`, with their text spelled for
the command line (`Spelling.text`)."""


def prefix_sharing_option(help: str, **spelling: Any) -> Any:
    """The one declaration of `prefix_sharing` (default `auto`, its four values as text), for every options class;
    the class normalizes it in `__post_init__` (`normalize_prefix_sharing`) and leaves it out of `check_choices`."""
    return option("auto", choices=tuple(PREFIX_SHARING_TEXT), help=help, **spelling)


def normalize_prefix_sharing(value: bool | str | None) -> bool | str:
    """`prefix_sharing`'s four values, `True`, `False`, `"auto"` or `"packed"` (`normalize_choice` over
    `PREFIX_SHARING_TEXT`), for training's `RankedRewardConfig` and scoring's `ScoringOptions` alike.

    Raises:
        ValueError: any other value.
    """
    return normalize_choice("prefix_sharing", value, PREFIX_SHARING_TEXT)


def normalize_choice(name: str, value: bool | str | None, table: dict[str, bool | str]) -> bool | str:
    """The one normalizer of an option whose values are text or bools (`prefix_sharing`, the switches): a bool as is,
    None as `"auto"`, and text by `table` in any case and spacing.

    Raises:
        ValueError: any other value, naming the option and its values.
    """
    if value is None or isinstance(value, bool):
        return "auto" if value is None else value
    text = str(value).strip().lower()
    if text in table:
        return table[text]
    values = [str(v) for v in table.values() if isinstance(v, bool)] + [repr(v) for v in table.values() if isinstance(v, str)]
    raise ValueError(f"{name} must be {', '.join(values[:-1])} or {values[-1]}, got {value!r}.")


SWITCH_TEXT: dict[str, bool | str] = {"auto": "auto", "true": True, "false": False}
"""An `auto`/`true`/`false` switch's values by their text (`window_packing`, `fused_kernels`)."""


def switch_option(help: str, **spelling: Any) -> Any:
    """The declaration of an `auto | True | False` switch (default `auto`; text for TRL's parser, which would read
    `bool | str` as a bool); the class normalizes it in `__post_init__` (`normalize_switch`) and leaves it out of
    `check_choices`. `auto`: on where it applies (logged); `True`: on, refused in one line where it cannot apply."""
    return option("auto", choices=tuple(SWITCH_TEXT), help=help, **spelling)


def normalize_switch(name: str, value: bool | str | None) -> bool | str:
    """A switch's three values, `True`, `False` or `"auto"` (`normalize_choice` over `SWITCH_TEXT`).

    Raises:
        ValueError: any other value, naming the option.
    """
    return normalize_choice(name, value, SWITCH_TEXT)


def document(cls: type) -> type:
    """Put an `Args:` section generated from the fields' help into `cls.__doc__` (before its `Raises:`), so that
    the docstring and every parser read the same declaration."""
    args = "    Args:\n" + "".join(f"        {f.name}: {f.metadata.get('help', '')}\n" for f in option_fields(cls))
    doc = (cls.__doc__ or "").rstrip() + "\n"
    head, sep, tail = doc.partition("\n    Raises:")
    cls.__doc__ = head.rstrip() + "\n\n" + args + (sep.lstrip("\n") and "\n" + sep.lstrip("\n") + tail)
    return cls


def route(
    values: Mapping[str, Any], *classes: type, own: Iterable[str] = (), what: str = "argument"
) -> dict[type, dict[str, Any]]:
    """Split keyword arguments by the options class that declares each: `{cls: {name: value}}`, every class a key
    (an empty dict for one given nothing), read by class, never by position.

    Raises:
        TypeError: a name no class declares (and not in `own`), listing every accepted name.
    """
    groups: dict[type, dict[str, Any]] = {cls: {} for cls in classes}
    unknown = []
    for key, value in values.items():
        owner = next((cls for cls in classes if key in names(cls)), None)
        if owner is None:
            unknown.append(key)
        else:
            groups[owner][key] = value
    if unknown:
        accepted = sorted({*own, *(n for cls in classes for n in names(cls))})
        raise TypeError(f"unexpected keyword {what}(s) {sorted(unknown)}; accepted: {accepted}")
    return groups
