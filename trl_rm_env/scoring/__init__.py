"""Scoring conversations with a reward model: the `Scorer` seam, the local scorer and its engines (loaded through
`trl_rm_env.runtime`, which also declares `ScoringOptions` and `ModelOptions`).

- `interfaces.py`: the `Scorer` protocol (what the environment, `eval` and the server use), the `ScoredPairs` each
  call returns, and the `Engine` protocol;
- `scorer.py`: `RewardScorer`, the local backend (templates, truncation, fallbacks; an engine runs the model);
- `hf.py`: `HFEngine`, the model run by transformers in this process;
- `vllm_engine.py`: `VLLMEngine`, vLLM's pooling runner fed with our token ids;
- `loading.py`: the scorer of a planned reward model (`trl_rm_env.runtime.plan_model`).

Conversations become token ids in `trl_rm_env.tokenization`; shared contexts are planned in `trl_rm_env.sharing`.
"""

from __future__ import annotations

from ..lazy import lazy_exports

_MODULES = {
    ".hf": ("HFEngine",),
    ".loading": ("load_reward_scorer", "load_scorer"),
    "..runtime.model_options": ("ScoringOptions",),
    ".interfaces": ("Engine", "NonfiniteScores", "ScoredPairs", "Scorer"),
    ".scorer": ("EncodedBatch", "RewardScorer", "as_pairs", "split_conversation"),
    ".vllm_engine": ("VLLMEngine",),
}
"""Public names, imported on first use (importing the package loads no engine)."""


__getattr__, __dir__, __all__ = lazy_exports(__name__, _MODULES)
