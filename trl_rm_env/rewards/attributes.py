"""A regression reward model's attributes as separate TRL reward functions, all served by one forward per batch:
`RewardModelEnvironment.attribute_rewards()`, for GDPO (`GRPOConfig(multi_objective_aggregation=
"normalize_then_sum")`: each reward z-scored within its group, weighted by `reward_weights`, then summed).

TRL calls every reward function of a step with the same `prompts` and `completions` lists (GRPOTrainer in turn,
AsyncGRPO concurrently in threads). The first call scores the batch (every attribute at once) and the others read
its result. The batch is recognised by those list objects, kept alive so that no later batch can take their ids, and
a lock makes the concurrent calls wait for the one that scores.
"""

from __future__ import annotations

import threading
from collections.abc import Generator, Mapping, Sequence
from typing import Any

import torch

from .base import Reward


class SharedOutputs:
    """The last batch's outputs of an environment, shared by its attribute reward functions."""

    def __init__(self, env: Any):
        self.env = env
        self._lock = threading.Lock()
        self._batch: tuple[Any, Any] | None = None
        self._outputs: torch.Tensor | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"env": self.env}  # the lock and the cache stay in this process

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["env"])

    def outputs(self, prompts: Sequence[Any], completions: Sequence[Any], kwargs: dict[str, Any]) -> torch.Tensor:
        with self._lock:
            batch = self._batch
            if batch is None or batch[0] is not prompts or batch[1] is not completions:
                self._outputs = self.env._attribute_outputs(prompts, completions, kwargs)
                self._batch = (prompts, completions)
            return self._outputs


class AttributeReward(Reward):
    """One attribute of a regression reward model as a TRL reward function, named after it (TRL logs
    `rewards/<attribute>/mean`). Made by `RewardModelEnvironment.attribute_rewards()`."""

    def __init__(self, shared: SharedOutputs, index: int, attribute: str, weight: float = 1.0):
        self.shared, self.index, self.__name__, self.weight = shared, index, attribute, float(weight)

    def _steps(
        self, prompts: Sequence[Any], completions: Sequence[Any], completion_ids: Any, kwargs: Mapping[str, Any]
    ) -> Generator[tuple, torch.Tensor, list[float]]:
        outputs = yield prompts, completions, kwargs
        return (outputs[:, self.index] * self.weight).tolist()

    def _answer(self, request: tuple) -> torch.Tensor:
        """The batch's outputs, every attribute (scored by the first of its attribute rewards called)."""
        return self.shared.outputs(*request)

    def __repr__(self) -> str:
        return f"AttributeReward({self.__name__!r}, column {self.index})"
