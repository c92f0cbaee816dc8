"""`trl-rm-env eval --judge` (and `--cascade`): the judge's flags, and `JudgeEnvironment`'s arguments read from them
(the evaluation itself: `trl_rm_env.evaluation.command`)."""

from __future__ import annotations

import argparse

from .spellings import add_flags, options_from_flags


def add_judge_flags(parser: argparse.ArgumentParser) -> None:
    """`eval`'s judge flags: the judge, its servers and options (`--judge-<option>` for every `JudgeOptions` one),
    and the cascade."""
    from trl_rm_env.judges.options import JudgeOptions, JudgeSource

    judges = parser.add_argument_group(
        "generative judge",
        "Evaluate a causal-LM judge on the same pairs (docs/judges.md), alone or beside --model, with --cascade: the "
        "reward model where its margin is at least --cascade-margin, the judge elsewhere.",
    )
    add_flags(judges, JudgeSource)  # --judge, --judge-url, --judge-tokenizer, --judge-options
    judges.add_argument("--cascade", action="store_true", help="Add the cascade of --model and --judge.")
    judges.add_argument(
        "--cascade-margin",
        type=float,
        default=None,
        help="The cascade asks the judge where |RM margin| is below this (> 0). Default: 1.0.",
    )
    add_flags(judges, JudgeOptions, exclude=("single_reward",))


def judge_arguments(args: argparse.Namespace) -> dict | None:
    """`JudgeEnvironment`'s arguments from `eval`'s judge flags (None: no judge), as `JudgeSource.arguments` reads
    them (the GRPO recipe reads its `reward_judge*` keys the same way)."""
    from trl_rm_env.judges.options import JudgeOptions, JudgeSource
    from trl_rm_env.options import changed, flag_of, option_fields

    options = changed(options_from_flags(args, JudgeOptions))
    source = options_from_flags(args, JudgeSource)
    flags = {f.name: flag_of(f) for cls in (JudgeOptions, JudgeSource) for f in option_fields(cls)}
    try:
        arguments = source.arguments(options, lambda name: flags.get(name) or name, show_progress=False)
    except ValueError as err:
        raise SystemExit(str(err)) from None
    if arguments is not None and "remote_url" in arguments:
        arguments.pop("show_progress", None)  # servers: no progress bar to hide
    return arguments
