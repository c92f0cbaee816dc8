"""`trl-rm-env eval` in one place: a typed `EvalRequest` (what the command line's flags say, built once) and
`run_eval`, which loads the data, scores it with the reward model and/or asks the judge (and the cascade of both),
shows the tables and writes the files. The command line only parses flags into the request and prints.

    from trl_rm_env.evaluation.command import EvalRequest, run_eval

    outcome = run_eval(EvalRequest(model="outputs/rm-tiny", data=("sample:in_domain",), output="results.json"))
    outcome.results["sets"]["sample:in_domain"]["accuracy"]
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..data.rows import ON_INVALID_MODES
from ..judges.judge_options import JudgeOptions, JudgeSource
from ..options import changed
from ..runtime.model_options import ScoringOptions
from .data import EvalRequestError, load_sets
from .tables import nan_to_none


@dataclass(frozen=True)
class EvalRequest:
    """One `trl-rm-env eval` run; each field is a flag of the command, and each error names fields and options as
    the library spells them (the command line gives them its flags: `EvalRequestError.spelled`).

    Args:
        data: The data sets: `FILE`, `FILE:name`, `name=SOURCE[:split]` or a Hub id`[:split]` (`--data`).
        model: The reward model, a folder or Hub id (`--model`); None: the judge alone.
        data_format: `rank`, ..., `rewardbench2`; `regression` or `helpsteer2` for a regression RM (`--format`).
        on_invalid: `skip` (count bad rows) or `raise` (`--on-invalid`).
        scoring: How the reward model loads and scores (`ScoringOptions`: `--batch-size`, `--max-tokens-per-batch`,
            ...); None: the defaults.
        judge: Which judge, and where it runs (`JudgeSource`: `--judge`, `--judge-url`, `--judge-engine`, ...);
            None: no judge.
        judge_options: How the judge judges (`JudgeOptions`: `--judge-mode`, `--judge-scoring`, ...); None: the
            defaults.
        cascade_margin: Add the cascade of the reward model and the judge, the judge deciding the pairs whose reward
            margin is below this (`--cascade --cascade-margin`); None: no cascade.
        output: Write the results as JSON here (`--output`).
        scores: Write one line per scored completion here (`--scores`).
        report: Write plots and `report.md` into this folder (`--report`).
        progress: Show progress bars (not `--no-progress`).

    Raises:
        EvalRequestError: a combination that cannot run (a cascade without both sources, no source at all, options
            of a source not given, ...).
    """

    data: tuple[str, ...]
    model: str | None = None
    data_format: str = "rank"
    on_invalid: str = "skip"
    scoring: ScoringOptions | None = None
    judge: JudgeSource | None = None
    judge_options: JudgeOptions | None = None
    cascade_margin: float | None = None
    output: str | None = None
    scores: str | None = None
    report: str | None = None
    progress: bool = True

    def __post_init__(self) -> None:
        if not self.data:
            raise EvalRequestError("eval needs at least one {data} set")
        if self.on_invalid not in ON_INVALID_MODES:
            raise EvalRequestError(f"{{on_invalid}} must be one of {list(ON_INVALID_MODES)}, got {self.on_invalid!r}")
        judged = self.judge_arguments() is not None  # the judge's options checked here, before anything loads
        if self.model is None and not judged:
            raise EvalRequestError("eval needs {model} (a reward model), {judge} or {judge_url} (a judge), or both")
        if self.model is None and self.scoring is not None and changed(self.scoring):
            named = ", ".join("{" + name + "}" for name in sorted(changed(self.scoring)))
            raise EvalRequestError(f"{named}: options of {{model}}'s reward model; the judge's go in {{judge_options}}")
        if self.cascade_margin is not None:
            if self.model is None:
                raise EvalRequestError(
                    "{cascade} needs {model}: the cascade asks the judge where the reward model's margin is small"
                )
            if not judged:
                raise EvalRequestError(
                    "{cascade} needs {judge} (or {judge_url}): the judge the reward model hands close pairs to"
                )
            if not (math.isfinite(self.cascade_margin) and self.cascade_margin > 0):
                raise EvalRequestError(f"{{cascade_margin}} must be > 0, got {self.cascade_margin}")
        if self.model is None and (self.scores or self.report):
            raise EvalRequestError("{scores} and {report} write a reward model's scores; give {model} too")

    def judge_arguments(self) -> dict[str, Any] | None:
        """`JudgeEnvironment`'s arguments (None: no judge), as `JudgeSource.arguments` reads them (the GRPO recipe
        reads its `reward_judge*` keys the same way); no progress bar of the judge's own.

        Raises:
            EvalRequestError: judge options without a judge, or a source that contradicts itself.
        """
        source = self.judge if self.judge is not None else JudgeSource()
        options = changed(self.judge_options) if self.judge_options is not None else {}
        try:
            arguments = source.arguments(options, lambda name: "{" + name + "}", show_progress=False)
        except ValueError as err:
            raise EvalRequestError(str(err)) from None
        if arguments is not None and "remote_url" in arguments:
            arguments.pop("show_progress", None)  # servers: no progress bar to hide
        return arguments


@dataclass
class EvalOutcome:
    """What `run_eval` found: the results (as written by `output`) and each source's pick per preference pair
    (`better`, `worse`, `tie` or None, in the order of `evaluation.judge.pairs_of_sets`) by source name."""

    results: dict[str, Any]
    picks: dict[str, list[str | None]] = field(default_factory=dict)


def run_eval(request: EvalRequest, show: Callable[[str], Any] = print) -> EvalOutcome:
    """Run one evaluation: the reward model's table, the judge's and the cascade's beside it, and the files asked for.
    `show` receives each table and message as it is ready (default: `print`).

    Raises:
        EvalRequestError: a data format that does not fit the model, two sets with one name, ...
        ImportError: `report` without matplotlib (before anything loads).
    """
    if request.report:  # fail before importing or loading anything (seconds), not after scoring
        from .report import pyplot

        pyplot()
    if request.model is None:
        outcome = _judge_alone(request, show)
    else:
        outcome = _with_reward_model(request, show)
    if request.output:
        path = Path(request.output)
        path.parent.mkdir(parents=True, exist_ok=True)
        # NaN (a set without pairs) is written as null: strict JSON.
        path.write_text(json.dumps(nan_to_none(outcome.results), indent=2) + "\n", encoding="utf-8")
        show(f"results written to {path}")
    return outcome


def _judge_alone(request: EvalRequest, show: Callable[[str], Any]) -> EvalOutcome:
    datasets, skipped, ties = load_sets(request.data, request.data_format, request.on_invalid, regression=False)
    outcome = EvalOutcome({"format": request.data_format, "skipped": skipped, "ties": ties})
    _judge_sources(request, make_judge(request), datasets, outcome, None, show)
    return outcome


def make_judge(request: EvalRequest) -> Any:
    """The `JudgeEnvironment` of a request (built before any scoring: a bad judge fails first)."""
    from ..rewards.judge import JudgeEnvironment

    arguments = request.judge_arguments()
    return JudgeEnvironment(arguments.pop("model"), **arguments)


def _with_reward_model(request: EvalRequest, show: Callable[[str], Any]) -> EvalOutcome:
    from ..data.regression import REGRESSION_FORMATS
    from ..heads import is_regression_model
    from ..runtime.plan import plan_model
    from ..scoring.scorer import load_scorer
    from .preference import evaluate_with_scores, write_scores_file
    from .regression import evaluate_regression_model
    from .tables import format_regression_results_table, format_results_table

    # The model's source, config and engine, resolved once: a bad option fails here, before any data loads.
    scoring = request.scoring if request.scoring is not None else ScoringOptions()
    plan = plan_model(request.model, scoring, one_reward=False)
    # A regression RM (RegressionRewardTrainer) is evaluated on regression records: RMSE/MAE/Pearson per attribute.
    regression = is_regression_model(plan.config)
    judged = request.judge_arguments() is not None
    if regression and judged:
        raise EvalRequestError(
            "{judge} compares answers to preference pairs; a regression reward model is evaluated alone"
        )
    judge = make_judge(request) if judged else None  # a bad judge fails before scoring
    data_format = request.data_format
    if regression:
        data_format = "regression" if data_format == "rank" else data_format
        if data_format not in REGRESSION_FORMATS:
            raise EvalRequestError(
                f"{request.model} is a regression reward model; {{data_format}} must be one of "
                f"{list(REGRESSION_FORMATS)}"
            )
    elif data_format in REGRESSION_FORMATS:
        raise EvalRequestError(
            f"{{data_format}} {data_format} is for regression reward models; {request.model} is not one"
        )
    if regression and (request.scores or request.report):
        raise EvalRequestError("{scores} and {report} apply to preference reward models, not to a regression one")
    datasets, skipped, ties = load_sets(request.data, data_format, request.on_invalid, regression)
    scorer = load_scorer(plan)
    try:
        if judge is not None:
            from .memory import reset_peak_memory

            reset_peak_memory()  # the reward model's peak memory, beside the judge's
        start = time.perf_counter()
        rows: list = []
        if regression:
            results = evaluate_regression_model(scorer, datasets, skipped=skipped, progress=request.progress)
        else:
            results, rows = evaluate_with_scores(
                scorer, datasets, skipped=skipped, ties=ties, progress=request.progress
            )
        rm_seconds = time.perf_counter() - start
    finally:
        scorer.engine.close()  # its memory free for the judge; two vLLM engines never left to exit handlers
    results["model"] = request.model
    results["format"] = data_format
    show(format_regression_results_table(results) if regression else format_results_table(results))
    outcome = EvalOutcome(results)
    if judge is not None:
        from .judge import rm_cost

        results["cost"] = rm_cost(scorer, datasets, rm_seconds)
        _judge_sources(request, judge, datasets, outcome, rows, show)
    if request.scores:
        write_scores_file(request.scores, rows)
        show(f"{len(rows)} per-completion scores written to {request.scores}")
    if request.report:
        from .report import write_report

        paths = write_report(nan_to_none(results), rows, request.report)
        show(f"report written to {paths[-1]} ({len(paths) - 1} plots)")
    return outcome


def _judge_sources(
    request: EvalRequest,
    judge: Any,
    datasets: Mapping[str, Sequence[Any]],
    outcome: EvalOutcome,
    rm_rows: list | None,
    show: Callable[[str], Any],
) -> None:
    """The judge (and the cascade) on `datasets`, the side-by-side table, and all of it in `outcome`."""
    from .judge import agreement, evaluate_cascade, evaluate_judge, format_comparison_table, per_1k, rm_picks

    results = outcome.results
    try:
        judge_results, judge_picks = evaluate_judge(judge, datasets)
        judge_results["judge"] = request.judge.judge or request.judge.judge_url
        results["judge"] = judge_results
        outcome.picks["judge"] = judge_picks
        sources = {f"judge ({judge.options.mode}, {judge.options.scoring})": judge_results}
        agreements = {}
        if rm_rows is not None:
            rm_results = {"sets": results["sets"], "cost": results["cost"]}
            rm_results["per_1k_pairs"] = per_1k(results["cost"], sum(m["pairs"] for m in results["sets"].values()))
            sources = {"reward model": rm_results, **sources}
            picks, _ = rm_picks(rm_rows, datasets)
            outcome.picks["reward model"] = picks
            agreements["reward model vs judge"] = results["agreement"] = agreement(picks, judge_picks)
            if request.cascade_margin is not None:
                cost = results["cost"]
                cascade, outcome.picks["cascade"] = evaluate_cascade(
                    judge, datasets, rm_rows, request.cascade_margin, cost["seconds"], cost["tokens"],
                    cost["memory_mb"],
                )  # fmt: skip
                results["cascade"] = cascade
                sources[f"cascade (|margin| < {request.cascade_margin:g}: judge)"] = cascade
    finally:
        judge.engine.close()
    show("")
    show(format_comparison_table(sources, agreements))
    if request.report:
        from .report import write_comparison_figure

        show(f"side-by-side figure written to {write_comparison_figure(sources, request.report)}")
