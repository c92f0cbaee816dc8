"""`trl-rm-env serve`: its flags and what it runs, our server (`--engine hf`) or vLLM's (`--engine vllm`; `auto`
picks vLLM where it is installed and can serve the model).

Which server runs, and every refusal of a flag the other server would apply, is the library's
(`trl_rm_env.serving.plan.plan_serving`, its messages naming the flags); this module parses and starts it.
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

from trl_rm_env.serving.server.limits import SERVER_TOKEN_BUDGET, ServerLimits

from .spellings import add_flags, flags, options_from_flags

SERVE_DEFAULTS = {"max_tokens_per_batch": SERVER_TOKEN_BUDGET}
"""`serve`'s defaults that differ from `ScoringOptions`': a server batches many clients' requests, so its token
budget is always bounded."""


def add_serve_parser(sub: Any) -> None:
    """The `serve` subcommand of `trl-rm-env`."""
    from trl_rm_env.runtime.model_options import ScoringOptions

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
    from trl_rm_env.runtime.model_options import ScoringOptions
    from trl_rm_env.scoring.scorer import load_scorer
    from trl_rm_env.serving.dialects import default_served_name
    from trl_rm_env.serving.plan import plan_serving
    from trl_rm_env.serving.server import run_server
    from trl_rm_env.serving.server.vllm_server import run_vllm_server

    options = options_from_flags(args, ScoringOptions, show_progress=False)
    limits = options_from_flags(args, ServerLimits)
    plan = plan_serving(
        args.model, options, limits, data_parallel_size=args.data_parallel_size, spelled=lambda n: _flag(n, options)
    )
    served_name = args.served_model_name or default_served_name(args.model)
    listening = {"host": args.host, "port": args.port, "api_key": args.api_key}
    if plan.server == "vllm":
        return run_vllm_server(
            plan.model.model, plan.vllm_arguments, served_name=served_name, **listening,
            data_parallel_size=args.data_parallel_size, cpu_backend=plan.cpu_backend, routes=plan.routes,
        )  # fmt: skip
    scorer = load_scorer(plan.model)
    head = plan.model.head
    if head.weights is not None:
        terms = " + ".join(f"{w:g} * {name}" for name, w in zip(head.attributes, head.weights))
        print(f"Regression RM: score = {terms}", flush=True)
    # The folder's name, never its path: responses must not reveal the server's file system. verl sends the model
    # path as `model`: accepted (`aliases`), never echoed.
    run_server(scorer, model_name=served_name, **listening, limits=limits, aliases=[args.model])
    return 0


def _flag(name: str, options: Any) -> str:
    """The flag of an option of `ScoringOptions`, `ServerLimits` or `serve` itself, for messages."""
    for cls in (type(options), ServerLimits):
        if name in {f.name for f in dataclasses.fields(cls)}:
            return flags(cls, [name])
    return "--" + name.replace("_", "-")
