"""Scoring conversations with a reward model: the options, the `Scorer` seam, the local scorer and its engines.

- `options.py`: `ScoringOptions`, declared once;
- `protocol.py`: the `Scorer` protocol (what the environment, `eval` and the server use) and the `Engine` protocol;
- `scorer.py`: `RewardScorer`, the local backend (templates, truncation, fallbacks; an engine runs the model);
- `hf.py`: `HFEngine`, the model run by transformers in this process;
- `vllm.py`: `VLLMEngine`, vLLM's pooling runner fed with our token ids;
- `loading.py`: the plan of a reward model (source, config, head, engine, resolved once) and the scorer it loads.

Conversations become token ids in `trl_rm_env.tokenization`; shared contexts are planned in `trl_rm_env.sharing`.
"""

from __future__ import annotations

from ..lazy import lazy_exports

_WHERE = {
    "HFEngine": ".hf",
    "ScoringPlan": ".loading",
    "choose_engine": ".loading",
    "load_reward_scorer": ".loading",
    "load_scorer": ".loading",
    "plan_scoring": ".loading",
    "PRECISIONS": ".options",
    "ScoringOptions": ".options",
    "Engine": ".protocol",
    "Scorer": ".protocol",
    "EncodedBatch": ".scorer",
    "RewardScorer": ".scorer",
    "as_pairs": ".scorer",
    "split_conversation": ".scorer",
    "VLLMEngine": ".vllm",
}
"""Public names, imported on first use (the command line reads `scoring.options` before torch loads)."""

__all__ = sorted(_WHERE)


__getattr__, __dir__ = lazy_exports(__name__, _WHERE)
