"""The engines: what runs any model we use for rewards, one per backend, each running both kinds of model (a reward
model scored: `outputs`; a judge asked: `label_logprobs`, `generate`), on token ids already rendered.

- `contract.py`: what every engine answers (`Engine`, `RewardModelEngine`, `JudgeEngine`), declared once, and the
  `generate` of the engines in this process (`GeneratesHere`: each writes its `_sample(Sampling)`);
- `registry.py`: engines by name (`register_engine`): a new engine is one module and its builder registered there;
- `transformers_engine.py`: `HFEngine`, the model loaded with transformers in this process (the exact reference);
- `vllm_engine.py`: `VLLMEngine`, vLLM in this process (pooling runner for a reward model, generate for a judge).

`trl_rm_env.runtime.loading.load_engine(plan, tokenizer)` builds the engine of a plan (the prefix sharing its plan
asks, which `HFEngine` resolves once against its weights), with the vLLM-to-transformers
fallback and the weights' sharding under ZeRO-3 or FSDP2, for both kinds. Reward functions reach them through one factory,
`trl_rm_env.rewards.backend.connect`: the reward model's `RewardScorer` (`trl_rm_env.scoring`) holds one, the judge
(`trl_rm_env.rewards.judge`) calls one. A judge behind servers is
`trl_rm_env.serving.client.judge_engine.RemoteJudgeEngine`, a reward model behind servers `trl_rm_env.serving.RemoteScorer`.
"""

from __future__ import annotations

from ...lazy import lazy_exports

_MODULES = {
    ".contract": ("Engine", "GeneratesHere", "JudgeEngine", "RewardModelEngine", "Sampling"),
    ".registry": ("engine_names", "register_engine", "unregister_engine"),
    ".transformers_engine": ("HFEngine",),
    ".vllm_engine": ("VLLMEngine",),
}
"""Public names, imported on first use (importing the package loads no engine)."""


__getattr__, __dir__, __all__ = lazy_exports(__name__, _MODULES)
