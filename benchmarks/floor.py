"""What the benchmarks share: the FLOP floor of a set of groups that share a prefix, and the machine's matmul rate.

Imported by `bench_score.py` and `bench_train.py` (run from the repository root: `python benchmarks/bench_*.py`).
"""

from __future__ import annotations

import os
import statistics
import subprocess
import time
from collections.abc import Callable, Iterable, Sequence

DATASHEET_BF16_TFLOPS = {"H100": 989.4, "H200": 989.4, "H800": 989.4, "A100": 312.0, "L40S": 362.0, "B200": 2250.0}
"""Dense bf16 tensor-core peaks of NVIDIA's datasheets (TFLOP/s, no sparsity; SXM parts), by name fragment."""


def datasheet_tflops(device_name: str) -> float | None:
    """The datasheet's dense bf16 peak of a CUDA device by its name (`torch.cuda.get_device_name()`), or None."""
    for fragment, tflops in DATASHEET_BF16_TFLOPS.items():
        if fragment in device_name:
            return tflops
    return None


def fresh_memory() -> None:
    """Before a method runs in a process others ran in: garbage collected, and on CUDA the cache emptied and the peak
    reset (so the method's peak memory is its own)."""
    import gc

    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def rotations(methods: Sequence[str], rounds: int) -> list[list[str]]:
    """`rounds` orders of `methods`, each the last rotated by one (A B C, B C A, C A B, ...): no method always first."""
    return [list(methods[r % len(methods):]) + list(methods[: r % len(methods)]) for r in range(rounds)]


def run_rounds(ctx, target: Callable, methods: Sequence[str], rounds: int, args: tuple, timeout: float,
               one_process: bool, log: Callable[[str, dict], None], deadline: float | None = None,
               ) -> dict[str, list[dict]]:
    """Every method `rounds` times, interleaved (`rotations`), run by `target(names, *args, queue)` in a fresh child,
    which puts one result on the queue per name as each finishes. With `one_process` (CUDA) one child runs every
    round's methods in turn (the model built once; peak memory reset between them), else one child per method and
    round (CPU: a peak RSS is the process's). A method may take `timeout` seconds (then its child is killed and the
    methods after it run in a fresh one); at `deadline` (`time.monotonic()`) the child in flight is killed and
    nothing more starts: those methods get `{"error"}` results and the caller still prints its table. Returns each
    method's results, in round order; `log(name, result)` is called as each arrives."""
    results: dict[str, list[dict]] = {m: [] for m in methods}
    orders = rotations(methods, rounds)
    batches = [[m for order in orders for m in order]] if one_process else [[m] for order in orders for m in order]
    for names in batches:
        while names:  # a child stopped at one method (killed, died): the methods after it in a fresh child
            def arrived(index: int, result: dict, names: list[str] = names) -> None:
                if not result.get("not_reached"):
                    results[names[index]].append(result)
                    log(names[index], result)

            out = run_in_child(ctx, target, (names, *args), timeout, len(names), deadline, arrived)
            names = names[len(out) - sum(bool(r.get("not_reached")) for r in out):]
    return results


def spread(values: Sequence[float], fmt: str = "{:.2f}") -> tuple[float, str]:
    """(median, "median (min-max)") of `values` (one value: itself)."""
    median = statistics.median(values)
    if len(values) == 1:
        return median, fmt.format(median)
    return median, f"{fmt.format(median)} ({fmt.format(min(values))}-{fmt.format(max(values))})"


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


def matmul_gflops(threads: int, precision: str = "fp32") -> float:
    """This machine's dense matmul rate (GFLOP/s, best of 10), for the floor / MFU column. CPU: fp32, an MLP
    projection of 2,048 tokens at hidden 1,024 (whatever `precision`). CUDA: 8192 x 8192 x 8192 in the run's dtype
    (`precision`: fp32 or bf16; fp32 without TF32, as torch's default), timed with CUDA events after warm-ups."""
    import torch

    torch.set_num_threads(threads)
    if torch.cuda.is_available():
        return cuda_matmul_gflops(precision)
    a, b = torch.randn(2048, 1024), torch.randn(1024, 3072)  # an MLP projection of 2,048 tokens at hidden 1,024
    best = float("inf")
    for _ in range(10):
        start = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - start)
    return 2 * 2048 * 1024 * 3072 / best / 1e9


def cuda_matmul_gflops(precision: str = "fp32", n: int = 8192, warmup: int = 3, repeats: int = 10) -> float:
    """The current CUDA device's dense matmul rate in `precision`'s dtype (GFLOP/s, the best of `repeats` timed
    `n x n x n` products after `warmup` untimed ones); its buffers are freed before it returns."""
    import torch

    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[precision]
    a = torch.randn(n, n, device="cuda", dtype=dtype)
    b = torch.randn(n, n, device="cuda", dtype=dtype)
    for _ in range(warmup):
        a @ b
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        a @ b
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end) / 1e3)
    del a, b
    torch.cuda.empty_cache()
    return 2 * n**3 / best / 1e9


def rate_column() -> str:
    """The name of the column of floor FLOPs at the measured matmul rate over the measured time: `MFU %` on CUDA
    (the rate of the run's dtype), `floor %` on CPU (fp32)."""
    import torch

    return "MFU %" if torch.cuda.is_available() else "floor %"


def load_line() -> str:
    """`uptime`'s line (the load averages), or the load averages alone where `uptime` is not installed."""
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    except OSError:
        return "load average: " + ", ".join(f"{x:.2f}" for x in os.getloadavg())


def run_in_child(ctx, target, args: tuple, timeout: float, count: int = 1, deadline: float | None = None,
                 arrived: Callable[[int, dict], None] | None = None) -> list[dict]:
    """Run `target(*args, queue)` in a fresh child process of `ctx` and return the `count` results it puts on the
    queue, one at a time (`arrived(index, result)` called as each comes). A child that dies, or whose next result
    takes longer than `timeout` seconds or comes past `deadline` (`time.monotonic()`; it is killed), leaves
    `{"error"}` in the place of the result it did not give, and `{"error", "not_reached": True}` in those after it
    (`{"error"}` past the deadline): a child that died is an error, not a wait forever."""
    results: list[dict] = []

    def add(result: dict) -> None:
        results.append(result)
        if arrived is not None:
            arrived(len(results) - 1, result)

    if deadline is not None and time.monotonic() >= deadline:
        for _ in range(count):
            add({"error": "not run: the benchmark's --deadline had passed"})
        return results
    queue = ctx.Queue()
    proc = ctx.Process(target=target, args=(*args, queue))
    proc.start()
    due = time.monotonic() + timeout
    error = None
    while len(results) < count:
        try:
            add(queue.get(timeout=2))
            due = time.monotonic() + timeout
        except Exception:
            now = time.monotonic()
            if not proc.is_alive():
                try:  # what it put just before it ended
                    add(queue.get(timeout=1))
                    continue
                except Exception:
                    error = f"the benchmark process ended with status {proc.exitcode}"
            elif deadline is not None and now > deadline:
                error = "stopped at the benchmark's --deadline"
            elif now > due:
                error = f"not done in {timeout:.0f} s"
            if error:
                break
    if error:
        proc.kill()
    proc.join()
    if len(results) < count:
        add({"error": error})
    while len(results) < count:  # after the one it stopped at; not at the deadline: `run_rounds` runs them again
        add({"error": error} if deadline is not None and time.monotonic() > deadline else
            {"error": error, "not_reached": True})
    return results


def short_error(message: str, limit: int = 100) -> str:
    """An error's first line, at most `limit` characters, without Markdown's column separator."""
    line = (message.strip().splitlines() or [""])[0].replace("|", "/")
    return line if len(line) <= limit else line[: limit - 3] + "..."
