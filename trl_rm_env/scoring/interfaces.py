"""The seam every scoring backend plugs into: what the GRPO environment, `trl-rm-env eval` and the server need.

Two backends implement it: `RewardScorer` (local: the chat template, truncation and fallbacks here, the forward
passes by an engine of `trl_rm_env.runtime.engines`, `VLLMEngine` or `HFEngine`) and `RemoteScorer`
(`trl_rm_env.serving.client`: servers that score over HTTP). A new local engine is one module answering the engine
contract (`trl_rm_env.runtime.engines.contract`: `outputs()` for a reward model, `label_logprobs` and `generate` for a
judge, `close`), handed to `RewardScorer(engine=...)`; a new remote dialect is one entry of
`trl_rm_env.serving.dialects`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import torch

from ..runtime.engines.contract import RewardModelEngine as Engine  # noqa: F401 - the scorer's engine, one contract


@dataclass
class ScoredPairs:
    """What one `score_pairs` call returns: everything a caller reads of it, none of it left on the scorer (two
    calls in flight at once, as AsyncGRPO makes them, each get their own).

    Attributes:
        scores: `(N,)` fp32, one reward per pair in input order, fallbacks applied; `(N, num_labels)`, every output
            of each pair, when the call asked `every_output=True`.
        outputs: the model's raw `(N, num_labels)` outputs (NaN rows: not scored) where the backend has them (a
            regression RM's attributes are logged from them), else None (a server returns one score per item).
        nonfinite: the pairs the model scored NaN/inf, given `nonfinite_reward` (the environment warns and counts).
    """

    scores: torch.Tensor
    outputs: torch.Tensor | None = None
    nonfinite: list[int] = field(default_factory=list)


class NonfiniteScores(FloatingPointError):
    """The model scored pairs NaN/inf and `nonfinite_reward` is None; `items` lists them (input order of the call),
    which a reward function names by its own samples."""

    def __init__(self, message: str, items: Sequence[int]):
        super().__init__(message)
        self.items = list(items)

    @classmethod
    def naming(cls, what: str, items: Sequence[int]) -> NonfiniteScores:
        """The error for `items`, in one message that says what returned them and how to fix it."""
        shown = f"{list(items[:10])}{'...' if len(items) > 10 else ''}"
        return cls(
            f"{what} returned NaN/inf for item(s) {shown}. Check the model dtype (fp16 overflows are common) or set "
            "`nonfinite_reward`.",
            items,
        )


@runtime_checkable
class Scorer(Protocol):
    """A scoring backend.

    `score_pairs(contexts, completions, progress)` returns a `ScoredPairs`, one fp32 reward per `(context,
    completion)` pair in input order, or (`is_async`) an awaitable of one. A pair the model scored NaN/inf gets
    `nonfinite_reward` (its index is in the result's `nonfinite`), or, when that is None, `NonfiniteScores` (a
    `FloatingPointError`) names the items. A backend that has every output of a pair (a local model) also takes
    `every_output=True`; one that does not refuses it.
    """

    is_async: bool
    nonfinite_reward: float | None

    def score_pairs(
        self, contexts: Sequence[Any], completions: Sequence[Any], progress: bool | None = None, *,
        every_output: bool = False,
    ) -> ScoredPairs | Awaitable[ScoredPairs]: ...
