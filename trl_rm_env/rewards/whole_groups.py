"""A comparing judge's call under several training processes: the GRPO groups judged whole.

TRL splits a step's batch between the processes, so a group spans two of them when a process's batch is smaller than
`num_generations`. A judge that compares a group's completions (pairwise, listwise, a GenRM) then gathers the call's
samples from every process (`whole_call`), each process judges its share of the whole groups (each comparison once),
and the processes exchange their rewards (`shared_values`), every process returning its own samples' rewards as one
process judging the whole batch would.

The exchanges are requests of the call's generator (`Gather`), answered by `gather`:

- over a gloo process group of the reward function's own (`own_group`, made once, on its first call, at the same
  point of every process's program), on the CPU: a served judge runs in TRL's event-loop thread, where the CUDA
  device of the process is not set, and two judges must not take each other's exchanges;
- off the event loop for an asynchronous call (a thread), so one judge waiting for the other processes never blocks
  another judge's requests;
- bounded by the process group's timeout, a timeout naming what was awaited (`waiting.gather_objects`);
- with any process's error: a process that fails still enters the exchanges, and every process raises (the one that
  failed its own error), so none waits on a collective the others left.
"""

from __future__ import annotations

import asyncio
from collections.abc import Generator, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from ..distributed import rank, world_size
from ..waiting import gather_objects


@dataclass(frozen=True)
class Gather:
    """A request of a call's generator: answered by every process's `value`, in rank order; `what` names the exchange
    (in a timeout's message)."""

    value: Any
    what: str


@dataclass
class WholeCall:
    """A reward call as judged: the samples of every process (one process: its own), the template's columns, the
    samples to judge and the empty ones (indices into these lists), where this process's samples start, and this
    process's rank among `world` processes."""

    prompts: list[Any]
    completions: list[Any]
    columns: dict[str, list[Any]]
    to_score: list[int]
    empty: list[int]
    offset: int = 0
    rank: int = 0
    world: int = 1


def processes(compares: bool, sharding: str) -> int:
    """How many processes judge a call together: all of them for a comparing judge whose forwards are its own (not
    a judge sharded across the processes, whose forwards are collectives each process runs), else 1."""
    return world_size() if compares and sharding == "none" else 1


def own_group() -> Any:
    """A gloo process group of all processes, for one reward function's exchanges (a collective: every process makes
    it at the same point of its program)."""
    return torch.distributed.new_group(backend="gloo")


def gather(request: Gather, group: Any, asynchronous: bool) -> Any:
    """Answer a `Gather` request: every process's value over `group`; an awaitable of them (run in a thread) for an
    asynchronous call."""
    if asynchronous:
        return asyncio.to_thread(gather_objects, request.value, request.what, group)
    return gather_objects(request.value, request.what, group)


def _raise_any(found: list[tuple[Any, str | None]], own: BaseException | None, what: str) -> None:
    """Raise on every process when any process failed: its own error on the one that failed."""
    if own is not None:
        raise own
    failed = [(k, message) for k, (_, message) in enumerate(found) if message]
    if failed:
        k, message = failed[0]
        raise RuntimeError(f"process {k} failed while {what}: {message}")


def whole_call(
    prompts: list[Any],
    completions: list[Any],
    columns: Mapping[str, list[Any]],
    to_score: list[int],
    empty: list[int],
    world: int,
    what: str,
    error: BaseException | None = None,
) -> Generator[Gather, Any, WholeCall]:
    """The call as a whole: every process's samples in rank order (this process's own when `world` is 1). `error`:
    this process's failure so far, carried through the exchange and raised on every process."""
    if world == 1:
        if error is not None:
            raise error
        return WholeCall(list(prompts), list(completions), {c: list(v) for c, v in columns.items()}, to_score, empty)
    local = (list(prompts), list(completions), {c: list(v) for c, v in columns.items()}, to_score, empty)
    found = yield Gather((local, None if error is None else f"{type(error).__name__}: {error}"), what)
    _raise_any(found, error, what)
    call = WholeCall([], [], {c: [] for c in columns}, [], [], rank=rank(), world=world)
    for k, ((p, c, cols, scored, blank), _) in enumerate(found):
        if k == call.rank:
            call.offset = len(call.prompts)
        base = len(call.prompts)
        call.prompts += p
        call.completions += c
        for name in call.columns:
            call.columns[name] += cols[name]
        call.to_score += [base + i for i in scored]
        call.empty += [base + i for i in blank]
    return call


def shared_values(
    values: dict[int, float], world: int, what: str, error: BaseException | None = None
) -> Generator[Gather, Any, dict[int, float]]:
    """Every process's share of the rewards, merged (this process's own when `world` is 1); `error` as for
    `whole_call`."""
    if world == 1:
        if error is not None:
            raise error
        return values
    found = yield Gather((values, None if error is None else f"{type(error).__name__}: {error}"), what)
    _raise_any(found, error, what)
    return {i: value for share, _ in found for i, value in share.items()}
