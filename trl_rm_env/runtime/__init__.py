"""The model runtime: how any model we run for rewards (a reward model or a judge, in this process or on vLLM) is
loaded, each step once.

- `model_options.py`: `ModelOptions`, how any model loads and runs (engine, precision, device, batch bounds, vLLM's
  memory and parallel sizes), and `ScoringOptions`, those plus a reward model's own (its head, truncation, NaN
  scores), declared once;
- `plan.py`: `plan_model` -> `ModelPlan` (source, config, kind, a reward model's head, the engine and why);
- `loading.py`: the plan's weights on transformers (`load_weights`) and its tokenizer (`load_tokenizer`);
- `vllm.py`: vLLM's arguments from the options, its start-up and shutdown.

Its users are thin: `trl_rm_env.scoring` (the reward model's scorer and engines), `trl_rm_env.judges.engines` (the
judge's), `trl_rm_env.serving.plan` (what `serve` runs).
"""

from __future__ import annotations

from ..lazy import lazy_exports

_MODULES = {
    ".plan": ("ModelPlan", "choose_engine", "plan_model"),
    ".loading": ("load_tokenizer", "load_weights"),
    ".model_options": ("PRECISIONS", "ModelOptions", "ScoringOptions"),
}
"""Public names, imported on first use (the command line reads `runtime.model_options` before torch loads)."""


__getattr__, __dir__, __all__ = lazy_exports(__name__, _MODULES)
