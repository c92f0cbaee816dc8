"""The command line's spelling of loading a reward model and of its scoring options (`eval` and `serve`): one
place that maps `--engine`, `--max-length`, `--precision`, ... onto `load_reward_scorer` and `ScoringOptions`."""

from __future__ import annotations

import argparse
from typing import Any


def add_model_arguments(p: argparse.ArgumentParser) -> None:
    """The flags of the reward model to load and of its engine."""
    p.add_argument("--model", required=True, help="Reward model: a save_pretrained folder or a Hub id.")
    p.add_argument("--max-length", type=int, default=None, help="Longest sequence (contexts cut on the left).")
    p.add_argument("--precision", default="fp32", choices=["fp32", "bf16", "fp16"], help="Model weights dtype.")
    p.add_argument("--device", default=None, help="cpu, cuda, cuda:1, ... (default: cuda when available).")
    p.add_argument("--trust-remote-code", action="store_true", help="Allow custom model code from the Hub.")
    p.add_argument(
        "--engine",
        default="auto",
        choices=["auto", "vllm", "hf"],
        help="What runs the reward model: vllm, hf (transformers here) or auto (vLLM where it is installed and can "
        "serve the model, else transformers).",
    )
    p.add_argument(
        "--vllm-gpu-memory-utilization",
        type=float,
        default=None,
        help="vLLM: share of the device's memory it may take (on CPU, of the RAM). Default: a KV cache of what "
        "scoring needs (serve on a GPU: vLLM's own default).",
    )
    p.add_argument("--tensor-parallel-size", type=int, default=1, help="vLLM: GPUs the model is split over.")


def scoring_options(args: argparse.Namespace, **options: Any):
    """The `ScoringOptions` of the flags `eval` and `serve` share (`add_model_arguments`, `--batch-size`), plus
    `options`."""
    from .options import ScoringOptions

    values = dict(engine=args.engine, vllm_tensor_parallel_size=args.tensor_parallel_size, **options)
    if args.vllm_gpu_memory_utilization is not None:
        values["vllm_gpu_memory_utilization"] = args.vllm_gpu_memory_utilization
    return ScoringOptions(batch_size=args.batch_size, max_length=args.max_length, **values)


def load_scorer(args: argparse.Namespace, **options: Any):
    """`load_reward_scorer` of `args.model` with `scoring_options(args, **options)`."""
    from .loading import load_reward_scorer

    return load_reward_scorer(
        args.model,
        precision=args.precision,
        device=args.device,
        trust_remote_code=args.trust_remote_code,
        options=scoring_options(args, **options),
    )
