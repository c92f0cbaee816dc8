"""What both benchmarks share: the FLOP floor of a set of groups that share a prefix, and the machine's matmul rate.

Imported by `bench_score.py` and `bench_train.py` (run from the repository root: `python benchmarks/bench_*.py`).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence


def group_floor(groups: Iterable[tuple[Sequence[Sequence[int]], int]], config: dict) -> tuple[int, float]:
    """(unique tokens, forward FLOPs on them) of `groups`, each `(sequences, shared prefix length)`: the prefix
    once, each sequence's own tokens once, causal attention of each over the prefix and itself. Per layer, a token
    costs the projections and MLP (`linear`) and a (query, key) pair `4 * q` (q = heads x head_dim)."""
    h, ffn = config["hidden_size"], config["intermediate_size"]
    q, kv = config["num_attention_heads"] * config["head_dim"], config["num_key_value_heads"] * config["head_dim"]
    linear = 2 * (h * q + 2 * h * kv + q * h + 3 * h * ffn)  # per token per layer
    tokens, pairs = 0, 0
    for seqs, p in groups:
        tokens += p
        pairs += p * (p + 1) // 2
        for s in seqs:
            c = len(s) - p
            tokens += c
            pairs += c * p + c * (c + 1) // 2
    return tokens, config["num_hidden_layers"] * (tokens * linear + pairs * 4 * q)


def matmul_gflops(threads: int) -> float:
    """This machine's fp32 matmul rate (GFLOP/s, best of 10), for the floor column."""
    import torch

    torch.set_num_threads(threads)
    a, b = torch.randn(2048, 1024), torch.randn(1024, 3072)  # an MLP projection of 2,048 tokens at hidden 1,024
    best = float("inf")
    for _ in range(10):
        start = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - start)
    return 2 * 2048 * 1024 * 3072 / best / 1e9
