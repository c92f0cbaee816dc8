"""Scoring conversations with a reward model: the `Scorer` seam and the local scorer (its engines, loading and
options are the model runtime's: `trl_rm_env.runtime`).

- `interfaces.py`: the `Scorer` protocol (what the environment, `eval` and the server use), the `ScoredPairs` each
  call returns, and the `Engine` protocol;
- `scorer.py`: `RewardScorer`, the local backend (templates, truncation, fallbacks; an engine runs the model), and
  the scorer of a planned reward model (`load_scorer`, `load_reward_scorer`: `trl_rm_env.runtime.plan_model`).

Conversations become token ids in `trl_rm_env.tokenization`; shared contexts are planned in `trl_rm_env.sharing`.
"""

from __future__ import annotations

from ..lazy import lazy_exports

_MODULES = {
    "..runtime.engines": ("HFEngine", "VLLMEngine"),
    "..runtime.model_options": ("ScoringOptions",),
    ".interfaces": ("Engine", "NonfiniteScores", "ScoredPairs", "Scorer"),
    ".scorer": ("EncodedBatch", "RewardScorer", "as_pairs", "load_reward_scorer", "load_scorer", "split_conversation"),
}
"""Public names, imported on first use (importing the package loads no engine)."""


__getattr__, __dir__, __all__ = lazy_exports(__name__, _MODULES)
