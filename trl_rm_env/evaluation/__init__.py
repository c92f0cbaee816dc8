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

_MODULES = {
    ".preference": (
        "MARGIN_BUCKETS", "evaluate_reward_model", "evaluate_with_scores", "margin_bucket", "pearson",
        "write_scores_file",
    ),
    ".regression": ("evaluate_regression_model",),
    ".command": ("EvalRequest", "run_eval"),
    ".data": ("EvalRequestError",),
    ".judge": ("evaluate_judge", "evaluate_cascade", "format_comparison_table"),
    ".rewardbench": (
        "LLMBAR_FILE_SUBSETS", "REWARDBENCH_EXAMPLE_COUNTS", "REWARDBENCH_SUBSET_MAPPING", "rewardbench_sections",
        "rewardbench_subset",
    ),
    ".tables": ("format_bias_table", "format_regression_results_table", "format_results_table"),
}
"""Public names, imported on first use: `trl_rm_env.evaluation.report` (what `eval --report` checks before anything
loads) and the RewardBench constants cost no torch import."""


__getattr__, __dir__, __all__ = lazy_exports(__name__, _MODULES)
