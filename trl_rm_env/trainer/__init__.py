"""Ranked reward-model training: config, collator, loss and trainer."""

from .collator import DataCollatorForRankedPreference, tokenize_rank_record
from .config import RankedRewardConfig
from .loss import ranked_bradley_terry_loss, ranked_pairs, record_statistics, summarize_statistics
from .trainer import RankedRewardTrainer

__all__ = [
    "DataCollatorForRankedPreference",
    "RankedRewardConfig",
    "RankedRewardTrainer",
    "ranked_bradley_terry_loss",
    "ranked_pairs",
    "record_statistics",
    "summarize_statistics",
    "tokenize_rank_record",
]
