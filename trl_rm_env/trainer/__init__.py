"""Reward-model training: configs, trainers, collators, losses, checkpoints.

- `config.py`: `RankedRewardConfig`, `RegressionRewardConfig`;
- `trainer.py`: `RankedRewardTrainer` (Bradley-Terry over N-way ranks, exact per-set metrics);
- `regression.py`: `RegressionRewardTrainer` (one output per attribute, masked MSE);
- `examples.py`: every accepted dataset shape -> training examples; `collator.py`: examples -> batches;
- `loss.py`: the losses (the exact statistics are in `trl_rm_env.metrics`);
- `checkpoints.py`: atomic checkpoints and resume; `saving.py`: the final checkpoint and the printed tables.
"""

from .collator import DataCollatorForRankedPreference
from .config import RankedRewardConfig, RegressionRewardConfig
from .examples import tokenize_rank_record
from .loss import ranked_bradley_terry_loss, ranked_pairs
from .trainer import RankedRewardTrainer

__all__ = [
    "DataCollatorForRankedPreference",
    "RankedRewardConfig",
    "RankedRewardTrainer",
    "RegressionRewardConfig",
    "ranked_bradley_terry_loss",
    "ranked_pairs",
    "tokenize_rank_record",
]
