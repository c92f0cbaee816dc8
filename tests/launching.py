"""Launching the recipes with `accelerate launch` from tests: 2 CPU processes, gloo, offline.

Shared by tests/test_distributed.py (one run per backend) and tests/test_clean_exit.py (fresh checkouts, repeated
runs, exit status).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
ACCELERATE_CONFIGS = ROOT / "accelerate_configs"
SAMPLE = ROOT / "trl_rm_env" / "data" / "sample"
TIMEOUT = 600  # seconds per launch; a first DeepSpeed run also JIT-builds its shm comm op (~1-2 min, cached)


def _has_deepspeed() -> bool:
    try:
        import deepspeed  # noqa: F401
    except Exception:
        return False
    return True


# DeepSpeed's CPU backend JIT-compiles its shared-memory comm op when it starts: it needs a C++ compiler.
needs_deepspeed = pytest.mark.skipif(
    not _has_deepspeed() or shutil.which(os.environ.get("CXX", "c++")) is None,
    reason="needs deepspeed and a C++ compiler (DeepSpeed JIT-builds its CPU comm op)",
)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def launch(
    config: str,
    script: str,
    *args: str,
    timeout: int = TIMEOUT,
    processes: int | None = None,
    env: dict[str, str] | None = None,
    cwd: Path = ROOT,
) -> str:
    """`accelerate launch --config_file accelerate_configs/<config> <script> args...`; returns its output.

    `script` is relative to the repository root; `processes` overrides the config's `num_processes`; `env` adds
    variables (a `PYTHONPATH` there goes in front of the repository's). Fails the test, with the output's tail, on a
    non-zero exit or a run over `timeout` seconds (then the launcher and its workers are killed together).
    """
    port = free_port()
    cmd = [
        sys.executable, "-m", "accelerate.commands.launch",
        "--config_file", str(ACCELERATE_CONFIGS / config),
        "--main_process_port", str(port),
        *(["--num_processes", str(processes)] if processes else []),
        str(ROOT / script), *args,
    ]  # fmt: skip
    variables = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("ACCELERATE_", "FSDP_"))
        and k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
    }
    extra = dict(env or {})
    variables.update(
        MASTER_PORT=str(port),
        OMP_NUM_THREADS="1",
        MKL_NUM_THREADS="1",
        TOKENIZERS_PARALLELISM="false",
        HF_HUB_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        TRANSFORMERS_NO_ADVISORY_WARNINGS="1",
        HF_DATASETS_DISABLE_PROGRESS_BARS="1",
        TQDM_DISABLE="1",
        PYTHONUNBUFFERED="1",
        PYTHONPATH=os.pathsep.join(
            p for p in (extra.pop("PYTHONPATH", None), str(ROOT), os.environ.get("PYTHONPATH")) if p
        ),
    )
    variables.update(extra)
    proc = subprocess.Popen(
        cmd, cwd=cwd, env=variables, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )  # fmt: skip
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        pytest.fail(f"{config} {script} ran over {timeout}s:\n{output[-6000:]}")
    assert proc.returncode == 0, f"{config} {script} exited with {proc.returncode}:\n{output[-6000:]}"
    return output
