"""Peak memory of an evaluation source: CUDA's peak allocation when a GPU is in use, else the peak resident memory of
this process and the processes it started (vLLM's engine processes), read from Linux's `/proc`. Used by `eval
--judge`'s side-by-side table and by the benchmarks."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path


def process_tree(roots: Sequence[int] | None = None) -> set[int]:
    """`roots` (default: this process) and every process they started (vLLM's engine processes)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir() if Path("/proc").is_dir() else []:
        if entry.name.isdigit():
            try:
                parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                pass
    roots = list(roots or [os.getpid()])
    tree, todo = set(roots), list(roots)
    while todo:
        parent = todo.pop()
        for pid, ppid in parents.items():
            if ppid == parent and pid not in tree:
                tree.add(pid)
                todo.append(pid)
    return tree


def reset_peak_memory() -> None:
    """Start a source's peak-memory window: CUDA's peak statistics, and the peak resident memory (Linux `VmHWM`,
    reset through `/proc/<pid>/clear_refs`) of this process and its children."""
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.reset_peak_memory_stats()
    for pid in process_tree():
        try:
            Path(f"/proc/{pid}/clear_refs").write_text("5")
        except OSError:
            pass


def peak_mb() -> float:
    """Peak memory (MB) since `reset_peak_memory`: CUDA's peak allocation of this process when a GPU is in use, else
    the peak resident memory of this process and every process it started, summed (the processes' peaks need not
    have been at the same moment, so this bounds the peak from above)."""
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return torch.cuda.max_memory_allocated() / 2**20
    return resident_peak_mb()


def resident_peak_mb(roots: Sequence[int] | None = None) -> float:
    """The peak resident memory (`VmHWM`, MB) of `roots` (default: this process) and every process they started,
    summed."""
    total = 0
    for pid in process_tree(roots):
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    total += int(line.split()[1])
        except OSError:
            pass
    return total / 1024
