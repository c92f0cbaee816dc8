"""`trl-rm-env eval --judge` (and `--cascade`): the judge's flags (read into an `EvalRequest`'s `judge` and
`judge_options`; the evaluation itself: `trl_rm_env.evaluation.command`)."""

from __future__ import annotations

import argparse

from .spellings import add_flags


def add_judge_flags(parser: argparse.ArgumentParser) -> None:
    """`eval`'s judge flags: the judge, its servers and options (`--judge-<option>` for every `JudgeOptions` one),
    and the cascade."""
    from trl_rm_env.judges.judge_options import JudgeOptions, JudgeSource

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
