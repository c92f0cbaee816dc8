"""`trl-rm-env eval --judge` (and `--cascade`): the judge's flags, and `JudgeEnvironment`'s arguments read from them
(the evaluation itself: `trl_rm_env.evaluation.command`)."""

from __future__ import annotations

import argparse

from .spellings import add_flags, options_from_flags


def add_judge_flags(parser: argparse.ArgumentParser) -> None:
    """`eval`'s judge flags: the judge, its servers and options (`--judge-<option>` for every `JudgeOptions` one),
    and the cascade."""
    from trl_rm_env.judges.options import JudgeOptions

    judges = parser.add_argument_group(
        "generative judge",
        "Evaluate a causal-LM judge on the same pairs (docs/judges.md), alone or beside --model, with --cascade: the "
        "reward model where its margin is at least --cascade-margin, the judge elsewhere.",
    )
    judges.add_argument("--judge", default=None, help="A causal LM (folder or Hub id); with --judge-url its served name.")
    judges.add_argument("--judge-url", nargs="+", default=None, help="Judge on OpenAI-compatible servers at these URLs.")
    judges.add_argument("--judge-tokenizer", default=None, help="The judge's tokenizer (default: the judge's own).")
    judges.add_argument(
        "--judge-options",
        default=None,
        metavar="JSON",
        help='More JudgeEnvironment options, e.g. \'{"engine": "hf", "template_kwargs": {"enable_thinking": false}}\'.',
    )
    judges.add_argument("--cascade", action="store_true", help="Add the cascade of --model and --judge.")
    judges.add_argument(
        "--cascade-margin",
        type=float,
        default=None,
        help="The cascade asks the judge where |RM margin| is below this (> 0). Default: 1.0.",
    )
    add_flags(judges, JudgeOptions, exclude=("single_reward",))


def judge_arguments(args: argparse.Namespace) -> dict | None:
    """`JudgeEnvironment`'s arguments from `eval`'s judge flags (None: no judge)."""
    from trl_rm_env.judges.options import JudgeOptions
    from trl_rm_env.options import changed
    from trl_rm_env.scoring.options import json_object

    options = changed(options_from_flags(args, JudgeOptions))
    if args.judge is None and not args.judge_url:
        given = [name for name in ("judge_tokenizer", "judge_options") if getattr(args, name)] + sorted(options)
        if given:
            raise SystemExit(f"{', '.join(given)}: options of a judge; give --judge (or --judge-url)")
        return None
    try:
        more = json_object(args.judge_options)
    except ValueError as err:
        raise SystemExit(f"--judge-options: {err}") from None
    if {"model", "remote_url"} & set(more):
        raise SystemExit("--judge-options: the judge is --judge and its servers --judge-url")
    kwargs = {"show_progress": False, **more, **options}
    if args.judge_tokenizer is not None:
        kwargs["tokenizer"] = args.judge_tokenizer
    if args.judge_url:
        kwargs["remote_url"] = list(args.judge_url)
        kwargs.pop("show_progress", None)
    return {"model": args.judge, **kwargs}
