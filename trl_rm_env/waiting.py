"""Waits between processes, each bounded and each saying what it waited for when it runs out.

Two kinds, and the only ones this package adds (the trainers' own collectives are TRL's and transformers'):

- `wait_for_path`: a process waits for a file or folder another process writes (the tiny offline models, built by
  local process 0). A poll of the file system, not a collective: it cannot deadlock with a collective that another
  process is stuck in. Bounded by `TRL_RM_ENV_WAIT_TIMEOUT` seconds (default 600).
- `wait_for_everyone`: a barrier of all processes (around checkpoint saves). Bounded by the process group's
  timeout (`TrainingArguments.ddp_timeout`, 1800 s by default); when it runs out, the error says which barrier it
  was and what to look at instead of a backend's "Timed out waiting ... for recv operation".
- `gather_objects`: every process's value (a judge's share of whole GRPO groups), bounded and named the same way.

Stdlib only at import (the barrier calls the accelerator it is given; `gather_objects` imports `torch.distributed`
when it runs).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

__all__ = [
    "WAIT_TIMEOUT_ENV",
    "WaitTimeoutError",
    "default_wait_timeout",
    "gather_objects",
    "wait_for_everyone",
    "wait_for_path",
]

WAIT_TIMEOUT_ENV = "TRL_RM_ENV_WAIT_TIMEOUT"
DEFAULT_WAIT_TIMEOUT = 600.0


class WaitTimeoutError(TimeoutError):
    """A wait for another process ran out of time. The message names what was awaited and what to check."""


def default_wait_timeout() -> float:
    """Seconds `wait_for_path` waits: `TRL_RM_ENV_WAIT_TIMEOUT`, else 600.

    Raises:
        ValueError: the variable is set to something that is not a positive number.
    """
    raw = os.environ.get(WAIT_TIMEOUT_ENV, "").strip()
    if not raw:
        return DEFAULT_WAIT_TIMEOUT
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise ValueError(f"{WAIT_TIMEOUT_ENV}={raw!r} must be a positive number of seconds")
    return value


def wait_for_path(
    path: str | os.PathLike,
    what: str,
    hint: str,
    timeout: float | None = None,
    poll: float = 0.2,
    ready: Callable[[str], bool] = os.path.exists,
) -> None:
    """Return once `ready(path)` (default: it exists), polling every `poll` seconds for at most `timeout` seconds
    (None: `default_wait_timeout()`).

    Raises:
        WaitTimeoutError: `waited 600 s for <what> (<path> did not appear); <hint>. Set TRL_RM_ENV_WAIT_TIMEOUT
            to wait longer.`
    """
    limit = default_wait_timeout() if timeout is None else timeout
    path = os.fspath(path)
    deadline = time.monotonic() + limit
    while not ready(path):
        if time.monotonic() >= deadline:
            raise WaitTimeoutError(
                f"waited {limit:g} s for {what} ({path} did not appear); {hint}. Set {WAIT_TIMEOUT_ENV} to wait longer."
            )
        time.sleep(poll)


def _is_timeout(err: BaseException) -> bool:
    text = str(err).lower()
    return isinstance(err, TimeoutError) or "timed out" in text or "timeout" in text


def wait_for_everyone(accelerator: Any, what: str) -> None:
    """`accelerator.wait_for_everyone()`, with a timeout error that names the barrier.

    Args:
        accelerator: An `accelerate.Accelerator` (or anything with `wait_for_everyone` and `num_processes`).
        what: What every process is about to do or has done, e.g. `"finish writing checkpoint-10"`.

    Raises:
        WaitTimeoutError: the process group's timeout ran out: some process never reached this point.
    """
    _collective(accelerator.wait_for_everyone, getattr(accelerator, "num_processes", "?"), what)


def gather_objects(value: Any, what: str, group: Any = None) -> list[Any]:
    """Every process's `value` (picklable), in rank order, from `torch.distributed.all_gather_object` on `group`
    (None: the default process group); every process of it must call it, the same number of times.

    Raises:
        WaitTimeoutError: the process group's timeout ran out: some process never got to `what`.
    """
    import torch.distributed as dist

    found: list[Any] = [None] * dist.get_world_size(group)
    _collective(lambda: dist.all_gather_object(found, value, group=group), len(found), what)
    return found


def _collective(run: Callable[[], Any], processes: Any, what: str) -> None:
    """Run a collective; its timeout becomes a `WaitTimeoutError` that names `what` every process was to do."""
    try:
        run()
    except Exception as err:  # gloo: RuntimeError; NCCL: DistBackendError (a RuntimeError too)
        if not _is_timeout(err):
            raise
        raise WaitTimeoutError(
            f"timed out waiting for all {processes} processes to {what}: at least one never got there. Look at the "
            "other processes' output above for an error or a process stuck elsewhere; the wait is the process "
            "group's timeout (`ddp_timeout`, default 1800 s)."
        ) from err
