"""Batching queued scoring requests: the server's worker, without HTTP.

Each request's token ids wait in a bounded queue; one worker takes the queued requests, as many as fit in a token
budget, and scores them in one `RewardScorer.score_ids` call on a scoring thread, so the event loop keeps answering
(that call shares the prefixes the sequences have in common, within a request and across the batched ones).
Scores are exact: batching never changes a score. If a batched call fails, each request in it is scored again alone,
so one bad request cannot fail the others.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

logger = logging.getLogger(__name__)


class QueueFullError(Exception):
    """The queue holds `max_queue` requests already."""


@dataclass
class Job:
    """One request's token ids, waiting for its scores (a list of floats, NaN/inf kept)."""

    ids: list[list[int]]
    future: asyncio.Future
    tokens: int = field(init=False)

    def __post_init__(self) -> None:
        self.tokens = sum(len(x) for x in self.ids)


class ScoreBatcher:
    """The queue and the batching worker of a scoring server.

    Args:
        scorer: Anything with `score_ids(sequences, progress=False) -> scores` (a `RewardScorer`).
        max_queue: Requests that may wait; one more raises `QueueFullError`.
        max_batch_tokens: Tokens the worker gathers from the queue for one scoring call. A single larger request is
            still scored, in several forward passes.
    """

    def __init__(self, scorer: Any, max_queue: int, max_batch_tokens: int):
        self.scorer = scorer
        self.max_queue = max_queue
        self.max_batch_tokens = max_batch_tokens
        # requests: accepted into the queue; scored: sequences; batches: scoring calls; rejected_full: queue full.
        self.stats = {"requests": 0, "scored": 0, "batches": 0, "rejected_full": 0}
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rm-score")
        self._queue: asyncio.Queue[Job] | None = None
        self._task: asyncio.Task | None = None

    @property
    def alive(self) -> bool:
        return self._task is not None and not self._task.done()

    def queued(self) -> int:
        return self._queue.qsize() if self._queue is not None else 0

    def start(self) -> None:
        """Create the queue and start the worker (in the running event loop)."""
        self._queue = asyncio.Queue(maxsize=self.max_queue)
        self._task = asyncio.create_task(self.run(), name="rm-score-worker")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        self.executor.shutdown(wait=False, cancel_futures=True)

    async def submit(self, ids: list[list[int]]) -> list[float]:
        """Queue `ids` and wait for their scores.

        Raises:
            QueueFullError: the queue is full.
            Exception: whatever scoring this request alone raised.
        """
        job = Job(ids, asyncio.get_running_loop().create_future())
        try:
            self._queue.put_nowait(job)
        except asyncio.QueueFull:
            self.stats["rejected_full"] += 1
            raise QueueFullError from None
        self.stats["requests"] += 1
        return await job.future

    async def run(self) -> None:
        """Take queued requests up to the token budget, score them in one call, hand each its scores.

        If the batched call fails, each request is scored again on its own, so one bad request cannot fail the
        others."""
        loop = asyncio.get_running_loop()
        carry: Job | None = None
        while True:
            job = carry if carry is not None else await self._queue.get()
            carry = None
            jobs, tokens = [job], job.tokens
            while not self._queue.empty():
                nxt = self._queue.get_nowait()
                if tokens + nxt.tokens > self.max_batch_tokens:
                    carry = nxt  # first in line for the next call
                    break
                jobs.append(nxt)
                tokens += nxt.tokens
            jobs = [j for j in jobs if not j.future.done()]  # a client that went away
            if not jobs:
                continue
            sequences = [seq for j in jobs for seq in j.ids]
            try:
                scores = await loop.run_in_executor(self.executor, self._score, sequences)
            except Exception as err:  # noqa: BLE001
                if len(jobs) == 1:
                    logger.warning("scoring failed: %s: %s", type(err).__name__, err)
                    jobs[0].future.done() or jobs[0].future.set_exception(err)
                    continue
                logger.warning("a batch of %d requests failed (%s); scoring each alone", len(jobs), type(err).__name__)
                for j in jobs:
                    try:
                        result = await loop.run_in_executor(self.executor, self._score, j.ids)
                    except Exception as alone:  # noqa: BLE001 - this request's own failure
                        logger.warning("scoring failed: %s: %s", type(alone).__name__, alone)
                        j.future.done() or j.future.set_exception(alone)
                    else:
                        self.stats["batches"] += 1
                        self.stats["scored"] += len(j.ids)
                        j.future.done() or j.future.set_result(result)
                continue
            self.stats["batches"] += 1
            self.stats["scored"] += len(sequences)
            offset = 0
            for j in jobs:
                if not j.future.done():
                    j.future.set_result(scores[offset : offset + len(j.ids)])
                offset += len(j.ids)

    def _score(self, sequences: Sequence[Sequence[int]]) -> list[float]:
        return self.scorer.score_ids(sequences, progress=False).tolist()
