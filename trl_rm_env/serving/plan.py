"""What `trl-rm-env serve` runs for a model, decided once (`plan_serving`): vLLM's OpenAI-compatible server, or ours.

The model is planned by the runtime (`trl_rm_env.runtime.plan_model`: source, config, kind, head, engine). A judge
(a causal LM) is served by vLLM's server (the generate runner, `/v1/completions` and `/v1/chat/completions`). A reward
model on vLLM is too (the pooling runner, `/pooling` and `/classify`), unless something only our server does is asked:
our options around the engine (truncation, fallbacks, limits on clients) or one reward per sample computed from
several outputs (a regression head with weights); then ours serves it (`trl_rm_env.serving.server.run_server`).
Every option applies to the server that runs or is refused, named as the caller spells it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..options import changed
from ..runtime.model_options import ScoringOptions
from ..runtime.plan import ModelPlan, plan_model
from ..runtime.vllm import VLLM_ENGINE_OPTIONS, engine_arguments, vllm_device
from .server.limits import ServerLimits

VLLM_ROUTES = {"judge": "POST /v1/completions /v1/chat/completions", "reward": "POST /pooling /classify"}
"""The routes vLLM's server announces for each kind of model."""


@dataclass(frozen=True)
class ServePlan:
    """What serves a model: built by `plan_serving`, run by `trl-rm-env serve`.

    Args:
        model: The model's `ModelPlan`.
        server: `"vllm"` (vLLM's OpenAI-compatible server) or `"ours"` (our scoring server, on transformers).
        vllm_arguments: vLLM's engine arguments, when vLLM's server runs (`trl_rm_env.runtime.vllm.engine_arguments`,
            keeping vLLM's memory default on a GPU of its own).
        routes: The routes vLLM's server announces.
        cpu_backend: Whether vLLM's server runs on vLLM's CPU build.
    """

    model: ModelPlan
    server: str
    vllm_arguments: dict[str, Any] | None = None
    routes: str | None = None
    cpu_backend: bool = False


def plan_serving(
    model: str,
    options: ScoringOptions,
    limits: ServerLimits,
    *,
    data_parallel_size: int = 1,
    spelled: Callable[[str], str] = str,
) -> ServePlan:
    """Plan the model and choose its server.

    Args:
        model: A local folder or Hub id: a reward model, or a causal LM (a judge).
        options: Its `ScoringOptions`.
        limits: The `ServerLimits` our server puts on its clients.
        data_parallel_size: vLLM's server: replicas of the model.
        spelled: How the caller spells an option's name, for messages (the command line: its flag).

    Raises:
        ValueError: an option of the server that does not run (named with `spelled`), or a judge that would run on
            transformers (only vLLM's server serves a judge).
    """
    ours = sorted(set(changed(options)) - VLLM_ENGINE_OPTIONS - {"engine", "show_progress"})
    ours += sorted(changed(limits))
    ours_named = ", ".join(spelled(name) for name in ours)

    def ours_only(plan: ModelPlan) -> str | None:
        if plan.kind == "judge":
            if ours:
                raise ValueError(
                    f"{ours_named}: options of our reward-model server; {model} is a causal LM (a judge), served by "
                    "vLLM's server, which does not take them"
                )
            return None
        reasons = [f"{ours_named} apply in our server"] if ours else []
        if plan.head.weights is not None or getattr(plan.config, "num_labels", 1) > 1:
            reasons.append("vLLM's server returns every output; the one reward per sample of this model is ours")
        return "; ".join(reasons) or None

    plan = plan_model(model, options, kind=None, hf_only=ours_only)
    if plan.engine == "vllm":
        runner = "generate" if plan.kind == "judge" else "pooling"
        arguments = engine_arguments(plan.config, plan.options, own_device=True, runner=runner)
        return ServePlan(plan, "vllm", arguments, VLLM_ROUTES[plan.kind], cpu_backend=vllm_device() == "cpu")
    if plan.kind == "judge":
        raise ValueError(
            f"{model} is a causal LM (a judge): it is served by vLLM's OpenAI-compatible server, and this one would be "
            f"served on transformers ({plan.why}); install vLLM and use {spelled('engine')} vllm"
        )
    if data_parallel_size != 1:
        raise ValueError(
            f"{spelled('data_parallel_size')} applies to vLLM's server, but this reward model is served by ours, on "
            f"transformers ({plan.why})"
        )
    return ServePlan(plan, "ours")
