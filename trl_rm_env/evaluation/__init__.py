"""Evaluating reward models: preference sets (pairwise accuracy, length bias, calibration, RewardBench v1 and v2),
regression RMs (RMSE, MAE, Pearson r per attribute), the terminal tables and the plotted report.

    from trl_rm_env.data import load_rank_records
    from trl_rm_env.evaluation import evaluate_reward_model, format_results_table

    records, _ = load_rank_records("natural.json", data_format="llmbar")
    results = evaluate_reward_model("outputs/rm-tiny", {"llmbar-natural": records}, batch_size=16)
    print(format_results_table(results))

- `command.py`: `trl-rm-env eval` as a typed `EvalRequest` and its `run_eval`; `data.py`: its data sets; `memory.py`:
  peak memory of a source;
- `preference.py`: scoring every record once and its per-set metrics; `judge.py`: a generative judge and a cascade
  of a reward model with a judge (`CascadeReward` with a margin) on the same pairs, side by side with their costs; `rewardbench.py`: v1 sections;
  `rewardbench2.py`: RewardBench 2 rows and scores; `regression.py`: regression RMs; `tables.py`: the terminal
  tables; `report.py`: PNG plots and `report.md`.

Scoring goes through the `Scorer` protocol (`trl_rm_env.scoring.interfaces`): a `RewardScorer`, a `RemoteScorer`, or
a model path loaded with `load_reward_scorer`.
"""

from __future__ import annotations

from ..lazy import lazy_exports

_WHERE = {
    "MARGIN_BUCKETS": ".preference",
    "evaluate_reward_model": ".preference",
    "evaluate_with_scores": ".preference",
    "margin_bucket": ".preference",
    "pearson": ".preference",
    "write_scores_file": ".preference",
    "evaluate_regression_model": ".regression",
    "EvalRequest": ".command",
    "EvalRequestError": ".data",
    "run_eval": ".command",
    "evaluate_judge": ".judge",
    "evaluate_cascade": ".judge",
    "format_comparison_table": ".judge",
    "LLMBAR_FILE_SUBSETS": ".rewardbench",
    "REWARDBENCH_EXAMPLE_COUNTS": ".rewardbench",
    "REWARDBENCH_SUBSET_MAPPING": ".rewardbench",
    "rewardbench_sections": ".rewardbench",
    "rewardbench_subset": ".rewardbench",
    "format_bias_table": ".tables",
    "format_regression_results_table": ".tables",
    "format_results_table": ".tables",
}
"""Public names, imported on first use: `trl_rm_env.evaluation.report` (what `eval --report` checks before anything
loads) and the RewardBench constants cost no torch import."""

__all__ = sorted(_WHERE)


__getattr__, __dir__ = lazy_exports(__name__, _WHERE)
