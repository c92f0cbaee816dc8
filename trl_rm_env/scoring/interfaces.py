"""The seam every scoring backend plugs into: what the GRPO environment, `trl-rm-env eval` and the server need.

Two backends implement it: `RewardScorer` (local: the chat template, truncation and fallbacks here, the forward
passes by an engine, `VLLMEngine` or `HFEngine`) and `RemoteScorer` (`trl_rm_env.serving.client`: servers that score
over HTTP). A new local engine is one module with an `outputs()` as `HFEngine`'s and `VLLMEngine`'s, handed to
`RewardScorer(engine=...)`; a new remote dialect is one entry of `trl_rm_env.serving.dialects`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Sequence
from typing import Any, Protocol, runtime_checkable

import torch


@runtime_checkable
class Scorer(Protocol):
    """A scoring backend.

    `score_pairs(contexts, completions, progress)` returns one fp32 reward per `(context, completion)` pair, in input
    order, as a tensor, or (`is_async`) an awaitable of one. A pair the model scored NaN/inf gets `nonfinite_reward`
    (its index is in `last_nonfinite`), or, when that is None, a `FloatingPointError` names the items. `last_outputs`
    is the last call's `(N, num_labels)` outputs when the backend has them (a regression RM's attributes), else None.
    """

    is_async: bool
    nonfinite_reward: float | None
    last_nonfinite: list[int]
    last_outputs: torch.Tensor | None

    def score_pairs(
        self, contexts: Sequence[Any], completions: Sequence[Any], progress: bool | None = None
    ) -> torch.Tensor | Awaitable[torch.Tensor]: ...


class Engine(Protocol):
    """What runs a local reward model's forward passes for `RewardScorer`: token ids in, `(N, num_labels)` fp32
    outputs out, in input order, each equal to running that sequence alone (fp32: within 1e-4).

    Optional members, read when present: `prefix_sharing` (truthy: the engine uses `context_lengths` to score the
    items that share a context against one encoding of it) and `device` (`HFEngine` has both).
    """

    name: str
    num_labels: int

    def outputs(
        self, sequences: Sequence[Sequence[int]], context_lengths: Sequence[int] | None = None,
        progress: bool | None = None,
    ) -> torch.Tensor: ...
