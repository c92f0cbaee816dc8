"""Encoding a scoring call while the model runs it (`overlap_encoding`).

A GRPO reward call renders every `(prompt, completion)` with the reward model's chat template and tokenizes it on the
CPU before the first forward; on an H200 that was 16% of a 16 x 8 call at the 0.6B width, with the GPU idle. Here the
call is encoded in waves instead: consecutive items, whole groups of one context at a time (a GRPO group's prompt is
never split), until a wave holds what one forward pass of the engine takes (`HFEngine.wave_bounds`: the packed row's
token budget, or the batch bounds). A worker thread encodes the next wave while this thread runs the current one's
passes (the GIL is free while it waits for the device), so the model waits at most for the first wave.

Each wave is planned and run as a call of its own, so every score is what the whole call gives (each sequence's score
is that of running it alone, whatever else is in its pass: tests/test_overlap_encoding.py). Errors keep the call's
item numbers; an error in the worker is raised here, and a worker that ends without its results is an error too (no
silent wait).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import torch

_DONE = object()
WAIT_STEP_S = 1.0
"""How often the waiting thread checks that the encoding thread is still alive (seconds)."""


def context_groups(contexts: Sequence[Any]) -> Iterator[tuple[int, int]]:
    """`[start, end)` runs of consecutive items with the same context (a GRPO group)."""
    start = 0
    for i in range(1, len(contexts) + 1):
        if i == len(contexts) or not (contexts[i] is contexts[start] or contexts[i] == contexts[start]):
            yield start, i
            start = i


def waves(scorer: Any, contexts: Sequence[Any], completions: Sequence[Any], tokens: int | None,
          rows: int | None) -> Iterator[tuple[list[int], list[list[int]], list[int], list[int]]]:
    """`(items, ids, context_lengths, overlength)` of each wave: whole context groups, encoded in order
    (`scorer.encode`), a wave closing once it holds `tokens` tokens or `rows` sequences (None: no bound)."""
    items, ids, lengths, overlength, held = [], [], [], [], 0
    for start, end in context_groups(contexts):
        encoded = scorer.encode(contexts[start:end], completions[start:end], first=start)
        overlength += [start + i for i in encoded.overlength]
        for i, (seq, length) in enumerate(zip(encoded.ids, encoded.context_lengths)):
            if seq is not None:
                items.append(start + i)
                ids.append(seq)
                lengths.append(length)
                held += len(seq)
        if items and ((tokens is not None and held >= tokens) or (rows is not None and len(items) >= rows)):
            yield items, ids, lengths, overlength
            items, ids, lengths, overlength, held = [], [], [], [], 0
    if items or overlength:
        yield items, ids, lengths, overlength


class _Progress:
    """A progress bar over a call's items, as `HFEngine` shows one over its passes: when `progress` is True, or None
    and `show_progress` is True, or both None and the call runs more than 8 waves (opened at the ninth)."""

    def __init__(self, progress: bool | None, show_progress: bool | None, total: int):
        self.wanted = progress if progress is not None else show_progress
        self.total, self.done, self.waves, self.bar = total, 0, 0, None

    def advance(self, items: int) -> None:
        self.waves += 1
        if self.bar is None and (self.wanted or (self.wanted is None and self.waves > 8)):
            from tqdm.auto import tqdm

            self.bar = tqdm(total=self.total, initial=self.done, desc="Scoring", unit="item")
        self.done += items
        if self.bar is not None:
            self.bar.update(items)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def overlapped_outputs(scorer: Any, contexts: Sequence[Any], completions: Sequence[Any],
                       bounds: tuple[int | None, int | None],
                       progress: bool | None = None) -> tuple[torch.Tensor, list[int], list[int]]:
    """`RewardScorer._outputs` in waves (`waves`), each encoded on a worker thread while the previous one runs:
    `(outputs, scored items, over-length items)`; `progress` as the engine's (`_Progress`)."""
    if len(contexts) != len(completions):  # what `encode` says for the whole call
        raise ValueError(f"Got {len(contexts)} contexts but {len(completions)} completions; they must match.")
    outputs = torch.full((len(contexts), scorer.config.num_labels), float("nan"), dtype=torch.float32)
    present: list[int] = []
    overlength: list[int] = []
    ready: queue.Queue = queue.Queue(maxsize=2)  # at most one wave encoded ahead of the one waiting to run
    stop = threading.Event()

    def put(item: Any) -> bool:
        while not stop.is_set():
            try:
                ready.put(item, timeout=WAIT_STEP_S)
                return True
            except queue.Full:
                continue
        return False

    def encode_ahead() -> None:
        try:
            for wave in waves(scorer, contexts, completions, *bounds):
                if not put(wave):
                    return
            put(_DONE)
        except BaseException as err:  # raised in the calling thread
            put(err)

    bar = _Progress(progress, scorer.options.show_progress, len(contexts))
    worker = threading.Thread(target=encode_ahead, name="trl-rm-env-encode-ahead", daemon=True)
    worker.start()
    try:
        while True:
            try:
                item = ready.get(timeout=WAIT_STEP_S)
            except queue.Empty:
                if not worker.is_alive() and ready.empty():
                    raise RuntimeError("The encoding thread of this scoring call ended without handing over its "
                                       "results.") from None
                continue
            if item is _DONE:
                break
            if isinstance(item, BaseException):
                raise item
            items, ids, lengths, skipped = item
            overlength += skipped
            if items:
                outputs[torch.tensor(items)] = scorer.engine.outputs(ids, lengths, False)
                present += items
            bar.advance(len(items) + len(skipped))
    finally:
        stop.set()
        worker.join()
        bar.close()
    return outputs, present, overlength
