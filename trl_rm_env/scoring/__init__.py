"""Scoring conversations with a reward model: the options, the `Scorer` seam, the local scorer and its engines.

- `options.py`: `ScoringOptions`, declared once;
- `protocol.py`: the `Scorer` protocol (what the environment, `eval` and the server use) and the `Engine` protocol;
- `scorer.py`: `RewardScorer`, the local backend (templates, truncation, fallbacks; an engine runs the model);
- `hf.py`: `HFEngine`, the model run by transformers in this process;
- `loading.py`: loading a reward model and its tokenizer for inference.

Conversations become token ids in `trl_rm_env.tokenization`; shared contexts are planned in `trl_rm_env.sharing`.
"""

from .hf import HFEngine
from .loading import PRECISIONS, load_reward_model, load_reward_scorer
from .options import ScoringOptions
from .protocol import Engine, Scorer
from .scorer import EncodedBatch, RewardScorer, as_pairs, split_conversation

__all__ = [
    "PRECISIONS",
    "EncodedBatch",
    "Engine",
    "HFEngine",
    "RewardScorer",
    "Scorer",
    "ScoringOptions",
    "as_pairs",
    "load_reward_model",
    "load_reward_scorer",
    "split_conversation",
]
