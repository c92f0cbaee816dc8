"""The model runtime: how any model we run for rewards (a reward model or a judge, in this process or on vLLM) is
loaded, each step once.

- `model_options.py`: `ModelOptions`, how any model loads and runs (engine, precision, device, batch bounds, vLLM's
  memory and parallel sizes), and `ScoringOptions`, those plus a reward model's own (its head, truncation, NaN
  scores), declared once;
- `plan.py`: `plan_model` -> `ModelPlan` (source, config, kind, a reward model's head, the engine and why);
- `engines/`: one engine per backend, each running a reward model and a judge (`HFEngine`, `VLLMEngine`);
- `loading.py`: the plan's engine (`load_engine`: the vLLM-to-transformers fallback and the weights' sharding, for
  both kinds), its weights on transformers (`load_weights`) and its tokenizer (`load_tokenizer`);
- `vllm.py`: vLLM's arguments from the options, its start-up and shutdown.

Its users are thin: `trl_rm_env.scoring` (the reward model's scorer), `trl_rm_env.rewards.judge` (the judge),
`trl_rm_env.serving.plan` (what `serve` runs).
"""

from __future__ import annotations

from ..lazy import lazy_exports

_MODULES = {
    ".plan": ("ModelPlan", "choose_engine", "plan_model"),
    ".loading": ("load_engine", "load_tokenizer", "load_weights"),
    ".engines": ("HFEngine", "VLLMEngine"),
    ".model_options": ("PRECISIONS", "ModelOptions", "ScoringOptions"),
}
"""Public names, imported on first use (the command line reads `runtime.model_options` before torch loads)."""


__getattr__, __dir__, __all__ = lazy_exports(__name__, _MODULES)
