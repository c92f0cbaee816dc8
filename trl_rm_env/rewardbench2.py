"""RewardBench 2, under the import path it had before the `trl_rm_env.evaluation` package: the code is in
`trl_rm_env.evaluation.rewardbench2`."""

from .evaluation.rewardbench2 import (  # noqa: F401
    REWARDBENCH2_HUB_ID,
    REWARDBENCH2_SUBSETS,
    TIES_WEIGHTS,
    best_of_n_result,
    format_rewardbench2_table,
    load_rewardbench2,
    rewardbench2_row_to_record,
    rewardbench2_scores,
    split_by_subset,
    ties_score,
)
