"""`trl-rm-env eval --judge` (and `--cascade`): the judge's flags, and the judge's evaluation beside the reward
model's, printed side by side (`trl_rm_env.evaluation.judge`)."""

from __future__ import annotations

import argparse
from typing import Any

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
    if args.cascade_margin is not None and not args.cascade:
        raise SystemExit("--cascade-margin applies to --cascade")
    if args.cascade:
        args.cascade_margin = 1.0 if args.cascade_margin is None else args.cascade_margin
        if not args.cascade_margin > 0:
            raise SystemExit(f"--cascade-margin must be > 0, got {args.cascade_margin}")
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


def make_judge(judge_args: dict) -> Any:
    """The `JudgeEnvironment` of `judge_arguments` (built before any scoring, so a bad judge fails first)."""
    from trl_rm_env import JudgeEnvironment

    arguments = dict(judge_args)
    return JudgeEnvironment(arguments.pop("model"), **arguments)


def eval_judge_only(args: argparse.Namespace, judge_args: dict, load_sets: Any, scoring_flags: list[str]) -> dict:
    """`eval --judge` without `--model`: the judge's table alone; returns the results."""
    if scoring_flags:
        raise SystemExit(
            f"{', '.join(scoring_flags)}: options of --model's reward model; the judge's go in --judge-options"
        )
    if args.scores or args.report:
        raise SystemExit("--scores and --report write a reward model's scores; give --model too")
    datasets, skipped, ties = load_sets(args, args.format, regression=False)
    results: dict = {"format": args.format, "skipped": skipped, "ties": ties}
    eval_judge(args, make_judge(judge_args), judge_args, datasets, results, None)
    return results


def eval_judge(
    args: argparse.Namespace, judge: Any, judge_args: dict, datasets: dict, results: dict, rm_rows: list | None
) -> None:
    """Evaluate `judge` (and the cascade) on `datasets`, print the side-by-side table, and add it all to `results`
    (written by `--output`)."""
    model = judge_args["model"]
    try:
        _judge_sources(args, judge, model, judge_args, datasets, results, rm_rows)
    finally:
        close = getattr(judge.engine, "close", None)
        if close is not None:  # vLLM's engine processes: stopped now, not at interpreter exit
            close()


def _judge_sources(args, judge, model, judge_args, datasets, results, rm_rows) -> None:
    from trl_rm_env.evaluation.judge import (
        agreement,
        evaluate_cascade,
        evaluate_judge,
        format_comparison_table,
        per_1k,
        rm_picks,
    )

    judge_results, judge_picks = evaluate_judge(judge, datasets)
    judge_results["judge"] = model or judge_args.get("remote_url")
    results["judge"] = judge_results
    sources = {f"judge ({judge.options.mode}, {judge.options.scoring})": judge_results}
    agreements = {}
    if rm_rows is not None:
        rm_results = {"sets": results["sets"], "cost": results["cost"]}
        rm_results["per_1k_pairs"] = per_1k(results["cost"], sum(m["pairs"] for m in results["sets"].values()))
        sources = {"reward model": rm_results, **sources}
        picks, _ = rm_picks(rm_rows, datasets)
        agreements["reward model vs judge"] = results["agreement"] = agreement(picks, judge_picks)
        if args.cascade:
            cost = results["cost"]
            cascade, _ = evaluate_cascade(
                judge, datasets, rm_rows, args.cascade_margin, cost["seconds"], cost["tokens"], cost["memory_mb"]
            )
            results["cascade"] = cascade
            sources[f"cascade (|margin| < {args.cascade_margin:g}: judge)"] = cascade
    print()
    print(format_comparison_table(sources, agreements))
    if args.report:
        from trl_rm_env.evaluation.report import write_comparison_figure

        print(f"side-by-side figure written to {write_comparison_figure(sources, args.report)}")


