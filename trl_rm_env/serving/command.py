"""`trl-rm-env serve`: its flags and what it runs, our server (`--engine hf`) or vLLM's (`--engine vllm`; `auto`
picks vLLM where it is installed and can serve the model)."""

from __future__ import annotations

import argparse
from typing import Any

from ..scoring.arguments import add_model_arguments, load_scorer


def add_serve_parser(sub: Any) -> None:
    """The `serve` subcommand of `trl-rm-env`."""
    p = sub.add_parser(
        "serve",
        help="Serve a reward model over HTTP (vLLM's /pooling and /classify, OpenRLHF's /get_reward).",
        description="Concurrent requests are batched together by token budget; a full queue answers 503, an "
        "over-size body or too many items 413, a slow client 408 or a closed connection. Binds to 127.0.0.1 by "
        "default; set --api-key before binding another interface.",
    )
    add_model_arguments(p)
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
    p.add_argument("--batch-size", type=int, default=None, help="Sequences per forward pass (with no token budget).")
    p.add_argument("--max-tokens-per-batch", type=int, default=16384, help="Token budget per forward pass.")
    p.add_argument("--max-queue", type=int, default=1024, help="Requests waiting at most; more get HTTP 503.")
    p.add_argument(
        "--max-request-bytes", type=int, default=8 * 1024 * 1024, help="Largest request body; larger get HTTP 413."
    )
    p.add_argument(
        "--max-items-per-request", type=int, default=4096, help="Most sequences in one request; more get HTTP 413."
    )
    p.add_argument(
        "--header-timeout",
        type=float,
        default=10.0,
        help="Seconds a connection may take to send a request head (also the keep-alive idle time); then closed.",
    )
    p.add_argument("--body-timeout", type=float, default=30.0, help="Seconds for a request body; slower get 408.")
    p.add_argument(
        "--max-connections",
        type=int,
        default=None,
        help="Open connections at most; past it the oldest idle one is closed (default: open-file limit - 128).",
    )
    p.add_argument(
        "--attribute-weights",
        nargs="+",
        default=None,
        metavar="NAME=WEIGHT",
        help="Regression RM: the score is the weighted sum of its attributes (unnamed ones weigh 0). Default: the "
        "checkpoint's own attribute_weights.",
    )
    p.add_argument("--data-parallel-size", type=int, default=1, help="vLLM: replicas of the model behind one server.")
    p.set_defaults(func=serve)


def serve(args: argparse.Namespace) -> int:
    """Run `trl-rm-env serve` with parsed `args`; return the exit status."""
    from transformers import AutoConfig

    from ..heads import parse_attribute_weights, regression_reward_weights
    from .server import default_served_name, run_server

    # A regression RM serves one score per sample, the weighted sum of its attributes, as RewardModelEnvironment.
    weights = (
        parse_attribute_weights(args.attribute_weights, "--attribute-weights") if args.attribute_weights else None
    )
    config = AutoConfig.from_pretrained(args.model, trust_remote_code=args.trust_remote_code)
    resolved = regression_reward_weights(config, weights)
    served_name = args.served_model_name or default_served_name(args.model)
    if args.engine != "hf":
        from ..scoring.loading import choose_engine, log_engine_choice

        hf_only = None
        if getattr(config, "num_labels", 1) > 1:
            hf_only = "vLLM's server returns every output; the one reward per sample of this model is ours to compute"
        engine, why = choose_engine(args.engine, device=args.device, hf_only=hf_only)
        if args.engine == "vllm" and hf_only:
            raise SystemExit(f"error: --engine vllm cannot serve {args.model}: {hf_only} (use --engine hf)")
        log_engine_choice(engine, why)
        if engine == "vllm":
            return _serve_with_vllm(args, config, served_name=served_name, **_listening(args))
    args.engine = "hf"  # our server scores with transformers in this process
    scorer = load_scorer(
        args,
        max_tokens_per_batch=args.max_tokens_per_batch,
        show_progress=False,
        output_weights=resolved[1] if resolved else None,
    )
    if resolved:
        print("Regression RM: score = " + " + ".join(f"{w:g} * {name}" for name, w in zip(*resolved)), flush=True)
    run_server(
        scorer,
        # The folder's name, never its path: responses must not reveal the server's file system.
        model_name=served_name,
        **_listening(args),
        max_queue=args.max_queue,
        max_request_bytes=args.max_request_bytes,
        max_items_per_request=args.max_items_per_request,
        header_timeout=args.header_timeout,
        body_timeout=args.body_timeout,
        max_connections=args.max_connections,
        aliases=[args.model],  # verl sends the model path as `model`; accepted, never echoed
    )
    return 0


def _listening(args: argparse.Namespace) -> dict[str, Any]:
    """Where a server listens and the key it asks for, the same for ours and vLLM's."""
    return {"host": args.host, "port": args.port, "api_key": args.api_key}


def _serve_with_vllm(args: argparse.Namespace, config: Any, **server: Any) -> int:
    from ..scoring.arguments import scoring_options
    from ..scoring.vllm import engine_arguments, vllm_device
    from .vllm_server import run_vllm_server

    options = scoring_options(args, max_tokens_per_batch=args.max_tokens_per_batch)
    # On a GPU of its own the server keeps vLLM's memory default; on CPU that default reserves a share of the RAM
    # and refuses to start when less is free, so it gets the KV cache the in-process engine gets.
    arguments = engine_arguments(
        config, options, precision=args.precision, trust_remote_code=args.trust_remote_code, own_device=True
    )
    return run_vllm_server(
        args.model,
        arguments,
        **server,
        data_parallel_size=args.data_parallel_size,
        cpu_backend=vllm_device() == "cpu",
    )
