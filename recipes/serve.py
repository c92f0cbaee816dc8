"""`trl-rm-env serve`: its flags and what it runs, our server (`--engine hf`) or vLLM's (`--engine vllm`; `auto`
picks vLLM where it is installed and can serve the model).

The reward model is planned once (`trl_rm_env.scoring.loading.plan_scoring`: source, config, head, engine); a vLLM
plan is handed to vLLM's own server, any other is loaded and served by ours. Every flag applies to the server that
runs or is refused naming itself: vLLM's server renders nothing and computes no reward of its own, so the options our
`RewardScorer` applies around the engine are ours to serve (`--engine hf`).
"""

from __future__ import annotations

import argparse
from typing import Any

from trl_rm_env.options import changed
from trl_rm_env.serving.server.options import SERVER_TOKEN_BUDGET, ServerLimits

from .spellings import add_flags, flags, options_from_flags

SERVE_DEFAULTS = {"max_tokens_per_batch": SERVER_TOKEN_BUDGET}
"""`serve`'s defaults that differ from `ScoringOptions`': a server batches many clients' requests, so its token
budget is always bounded."""
VLLM_SERVER_OPTIONS = {"data_parallel_size"}
"""`serve`'s own flags that only vLLM's server takes."""


def add_serve_parser(sub: Any) -> None:
    """The `serve` subcommand of `trl-rm-env`."""
    from trl_rm_env.scoring.options import ScoringOptions

    p = sub.add_parser(
        "serve",
        help="Serve a reward model over HTTP (vLLM's /pooling and /classify, OpenRLHF's /get_reward), or a generative "
        "judge (a causal LM) on vLLM's OpenAI-compatible server.",
        description="Concurrent requests are batched together by token budget; a full queue answers 503, an "
        "over-size body or too many items 413, a slow client 408 or a closed connection. Binds to 127.0.0.1 by "
        "default; set --api-key before binding another interface.",
    )
    p.add_argument(
        "--model",
        required=True,
        help="Reward model (or a causal-LM judge, served by vLLM): a save_pretrained folder or a Hub id.",
    )
    p.add_argument("--host", default="127.0.0.1", help="Interface to bind (default loopback only).")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument(
        "--served-model-name",
        default=None,
        help="Name in responses and accepted in requests (default: the model folder's name, or the Hub id).",
    )
    p.add_argument(
        "--api-key",
        default=None,
        help="Require 'Authorization: Bearer KEY' on every route but /health (default: the TRL_RM_ENV_API_KEY, "
        "else VLLM_API_KEY environment variable; unset: no key).",
    )
    p.add_argument("--data-parallel-size", type=int, default=1, help="vLLM: replicas of the model behind one server.")
    add_flags(p, ScoringOptions, defaults=SERVE_DEFAULTS)
    add_flags(p, ServerLimits)
    p.set_defaults(func=serve)


def serve(args: argparse.Namespace) -> int:
    """Run `trl-rm-env serve` with parsed `args`; return the exit status."""
    from trl_rm_env.scoring.loading import load_scorer, plan_scoring
    from trl_rm_env.scoring.options import ScoringOptions
    from trl_rm_env.scoring.vllm import VLLM_ENGINE_OPTIONS
    from trl_rm_env.serving.protocol import default_served_name
    from trl_rm_env.serving.server import run_server

    options = options_from_flags(args, ScoringOptions, show_progress=False)
    limits = options_from_flags(args, ServerLimits)
    if _is_judge(args.model, options):
        return _serve_judge(args, options, limits)
    # What vLLM's server cannot do: our options around the engine, our limits, a reward computed from the outputs.
    ours = sorted(set(changed(options)) - VLLM_ENGINE_OPTIONS - {"engine", "show_progress"})
    ours_flags = ", ".join(filter(None, (flags(ScoringOptions, ours), flags(ServerLimits, sorted(changed(limits))))))

    def ours_only(config: Any, head: Any) -> str | None:
        reasons = [f"{ours_flags} apply in our server"] if ours_flags else []
        if head.weights is not None or getattr(config, "num_labels", 1) > 1:
            reasons.append("vLLM's server returns every output; the one reward per sample of this model is ours")
        return "; ".join(reasons) or None

    plan = plan_scoring(args.model, options, hf_only=ours_only)
    served_name = args.served_model_name or default_served_name(args.model)
    listening = {"host": args.host, "port": args.port, "api_key": args.api_key}
    if plan.engine == "vllm":
        return _serve_with_vllm(args, plan, served_name=served_name, **listening)
    refused = [name for name in sorted(VLLM_SERVER_OPTIONS) if getattr(args, name) != 1]
    if refused:
        raise ValueError(
            f"{', '.join('--' + n.replace('_', '-') for n in refused)} applies to vLLM's server, but this reward model "
            f"is served by ours, on transformers ({plan.why})"
        )
    scorer = load_scorer(plan)
    if plan.head.weights is not None:
        terms = " + ".join(f"{w:g} * {name}" for name, w in zip(plan.head.attributes, plan.head.weights))
        print(f"Regression RM: score = {terms}", flush=True)
    run_server(
        scorer,
        # The folder's name, never its path: responses must not reveal the server's file system.
        model_name=served_name,
        **listening,
        limits=limits,
        aliases=[args.model],  # verl sends the model path as `model`; accepted, never echoed
    )
    return 0


def _is_judge(model: str, options: Any) -> bool:
    """Whether `model` is a causal LM (a generative judge) rather than a reward model: its config says so."""
    from transformers import AutoConfig

    from trl_rm_env.judges.engines import is_causal_lm
    from trl_rm_env.model_source import check_model_source

    path = check_model_source(model, "model")
    return is_causal_lm(AutoConfig.from_pretrained(path, trust_remote_code=options.trust_remote_code))


def _serve_judge(args: argparse.Namespace, options: Any, limits: ServerLimits) -> int:
    """A generative judge on vLLM's OpenAI-compatible server (the generate runner): `JudgeEnvironment(remote_url=...)`
    sends it token ids on `/v1/completions`, with the verdict tokens' log-probabilities asked by id."""
    from trl_rm_env.judges.engines import plan_judge
    from trl_rm_env.scoring.options import ScoringOptions
    from trl_rm_env.scoring.vllm import VLLM_ENGINE_OPTIONS, engine_arguments, vllm_device
    from trl_rm_env.serving.protocol import default_served_name
    from trl_rm_env.serving.server.vllm_server import run_vllm_server

    ours = sorted(set(changed(options)) - VLLM_ENGINE_OPTIONS - {"engine", "show_progress"})
    ours_flags = ", ".join(filter(None, (flags(ScoringOptions, ours), flags(ServerLimits, sorted(changed(limits))))))
    if ours_flags:
        raise ValueError(
            f"{ours_flags}: options of our reward-model server; {args.model} is a causal LM (a judge), served by vLLM's "
            "server, which does not take them"
        )
    plan = plan_judge(args.model, options)
    if plan.engine != "vllm":
        raise ValueError(
            f"{args.model} is a causal LM (a judge): it is served by vLLM's OpenAI-compatible server, and this one "
            f"would be served on transformers ({plan.why}); install vLLM and use --engine vllm"
        )
    arguments = engine_arguments(plan.config, plan.options, own_device=True, runner="generate")
    return run_vllm_server(
        plan.model,
        arguments,
        served_name=args.served_model_name or default_served_name(args.model),
        host=args.host,
        port=args.port,
        api_key=args.api_key,
        data_parallel_size=args.data_parallel_size,
        cpu_backend=vllm_device() == "cpu",
        routes="POST /v1/completions /v1/chat/completions",
    )


def _serve_with_vllm(args: argparse.Namespace, plan: Any, **server: Any) -> int:
    from trl_rm_env.scoring.vllm import engine_arguments, vllm_device
    from trl_rm_env.serving.server.vllm_server import run_vllm_server

    # On a GPU of its own the server keeps vLLM's memory default; on CPU that default reserves a share of the RAM
    # and refuses to start when less is free, so it gets the KV cache the in-process engine gets.
    arguments = engine_arguments(plan.config, plan.options, own_device=True)
    return run_vllm_server(
        plan.model,
        arguments,
        **server,
        data_parallel_size=args.data_parallel_size,
        cpu_backend=vllm_device() == "cpu",
    )
