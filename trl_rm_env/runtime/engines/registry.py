"""Engines by name: the values of the `engine` option. `vllm` and `hf` are built in (`runtime.loading.load_engine`
builds them, with the vLLM-to-transformers fallback and the weights' sharding); `auto` picks one of them
(`runtime.plan.choose_engine`). Any other engine is one module answering the engine contract (`contract.py`) whose
builder is registered here by name; from then on `engine="<name>"` reaches it from every surface that loads a model
in this process (`RewardModelEnvironment`, `JudgeEnvironment`, `load_reward_scorer`, `trl-rm-env eval` from Python),
for reward models and judges alike:

    from trl_rm_env.runtime.engines import register_engine

    register_engine("sglang", lambda plan, tokenizer: SGLangEngine(plan.model, plan.config, plan.options, plan.kind))
    RewardModelEnvironment("Skywork/Skywork-Reward-V2-Llama-3.1-8B", engine="sglang")

A builder gets the resolved `ModelPlan` (`plan.model`: the path or Hub id, `plan.loaded`: a model given loaded,
`plan.config`, `plan.options`, `plan.kind`: `"reward"` or `"judge"`) and the model's tokenizer, and returns the engine:
for a reward model one with `outputs`, `num_labels`, `model` (None when it holds the weights itself) and `sharding`;
for a judge one with `label_logprobs` and `generate`; every engine with `close`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ...options import ENGINES

BUILT_IN = tuple(name for name in ENGINES if name != "auto")
"""The engines `load_engine` builds itself (`options.ENGINES` without `auto`)."""

Builder = Callable[[Any, Any], Any]
"""`build(plan, tokenizer) -> engine`."""

_REGISTERED: dict[str, Builder] = {}


def register_engine(name: str, build: Builder) -> None:
    """Make `engine=name` build its engine with `build(plan, tokenizer)`; registering a name again replaces its
    builder.

    Raises:
        ValueError: `auto` or a built-in name, or a name that is not a lowercase identifier.
    """
    if name == "auto" or name in BUILT_IN:
        raise ValueError(f"engine {name!r} is built in; register another name")
    if not name.isidentifier() or name != name.lower():
        raise ValueError(f"an engine's name is a lowercase identifier (it is the `engine` option's value), got {name!r}")
    if not callable(build):
        raise TypeError(f"register_engine({name!r}, build): build must be callable as build(plan, tokenizer)")
    _REGISTERED[name] = build


def unregister_engine(name: str) -> None:
    """Forget a registered engine (a test's, once it is done)."""
    _REGISTERED.pop(name, None)


def registered_engine(name: str) -> Builder | None:
    """The builder registered for `name`, or None (the built-in engines and `auto` have none here)."""
    return _REGISTERED.get(name)


def engine_names() -> tuple[str, ...]:
    """Every value the `engine` option takes now: `auto`, the built-in engines, then the registered ones."""
    return ("auto", *BUILT_IN, *_REGISTERED)


def check_engine(value: Any, field: str = "engine") -> None:
    """Refuse an `engine` value that names no engine, in one line listing those that exist.

    Raises:
        ValueError: the value is not in `engine_names()`.
    """
    if value not in engine_names():
        raise ValueError(f"{field} must be one of {list(engine_names())}, got {value!r}")
