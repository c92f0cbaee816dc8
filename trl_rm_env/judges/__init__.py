"""What is a generative judge's own: a causal LM asked to rate (pointwise), compare in pairs (pairwise) or rank
(listwise) the completions of a GRPO group, read exactly from its log-probabilities or parsed from its text, run by
vLLM or transformers in this process or on OpenAI-compatible servers. The reward functions built on it,
`JudgeEnvironment` and `CascadeReward` (a rule check with a judge, or anything else, as its fallback), live with
every other reward function in `trl_rm_env.rewards`.

    from trl_rm_env import JudgeEnvironment, CascadeReward

    judge = JudgeEnvironment("Qwen/Qwen3-8B", mode="pairwise", template_kwargs={"enable_thinking": False})
    trainer = GRPOTrainer(model=..., reward_funcs=[judge], ...)

- `judge_options.py`: `JudgeOptions` (mode, scoring, pairs, swap, template, ...);
- `mode_base.py`: `JudgeMode`, what every mode answers; `builtin_modes.py`: each built-in mode (`pointwise`,
  `pairwise`, `listwise`) as an object (its template, verdicts, judgements and aggregation) and the registry,
  `register_mode` adding one;
- `templates.py`: the built-in prompts' text and how prompts and completions fill them;
- `verdicts.py`: verdict tokens, and parsing a written verdict;
- `remote.py`: the judge on OpenAI-compatible servers (run here, it is `trl_rm_env.runtime.engines`', planned and
  loaded as a reward model is);
- `judgements.py`: judging a batch (groups, aggregation); `genrm.py`: NeMo Gym's `genrm_compare` protocol.
"""

from __future__ import annotations

from ..lazy import lazy_exports

_MODULES = {
    ".judge_options": ("JudgeOptions", "JudgeSource"),
    ".builtin_modes": ("JudgeMode", "TEMPLATES", "register_mode"),
}
"""Public names, imported on first use (the command line reads `JudgeOptions` without loading torch)."""


__getattr__, __dir__, __all__ = lazy_exports(__name__, _MODULES)
