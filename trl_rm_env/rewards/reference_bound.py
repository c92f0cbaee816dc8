"""Bounded rewards against a reference answer: Preference As Reward (PAR, arXiv 2502.18770).

The reward of a completion is `sigmoid((r - r_ref) / reference_temperature)`, where `r_ref` is the reward model's score
of the dataset's reference answer to the same prompt: bounded in (0, 1), so exploiting the reward model past the
reference gains little. The reference is scored with the group, one more completion behind the same prompt in the same
scoring call (with prefix sharing, the same forward: no extra pass).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ..options import document, option


@document
@dataclass(frozen=True)
class ReferenceBound:
    """A reward bounded against the dataset's reference answer (see the module docstring); the `Args` below are
    generated from the fields.

    Raises:
        ValueError: `reference_temperature <= 0`.
    """

    reference_column: str | None = option(
        None,
        help="The dataset column holding each prompt's reference answer (text, or the assistant's messages): the "
        "reward becomes sigmoid((r - r_ref) / reference_temperature), PAR's bounded reward. None: the RM's score.",
    )
    reference_temperature: float = option(1.0, help="PAR's temperature: the score gap that moves the reward most.")

    def __post_init__(self) -> None:
        if self.reference_temperature <= 0:
            raise ValueError(f"reference_temperature must be > 0, got {self.reference_temperature}")

    @property
    def active(self) -> bool:
        return self.reference_column is not None

    def references(self, completions: Sequence[Any], kwargs: Mapping[str, Any], what: str) -> list[Any]:
        """Each sample's reference, shaped as its completion (a text, or a list of messages).

        Raises:
            ValueError: the column not passed by TRL (naming the columns it passed), or None for some samples.
        """
        name, n = self.reference_column, len(completions)
        column = kwargs.get(name)
        if column is None or isinstance(column, str) or not isinstance(column, Sequence) or len(column) != n:
            given = sorted(k for k, v in kwargs.items() if isinstance(v, list | tuple) and len(v) == n)
            raise ValueError(
                f"{what}: reference_column={name!r}, but TRL passed no such column with one value per sample; the "
                f"dataset columns it passed: {given}"
            )
        missing = [i for i, value in enumerate(column) if value is None]
        if missing:
            raise ValueError(f"{what}: reference column {name!r} is None for samples {missing[:10]}")
        out = []
        for completion, value in zip(completions, column):
            if isinstance(completion, str) or not isinstance(value, str):
                out.append(value)
            else:  # conversational completions: the reference is the assistant's answer
                out.append([{"role": "assistant", "content": value}])
        return out

    def pairs(
        self, prompts: Sequence[Any], references: Sequence[Any], samples: Sequence[int]
    ) -> tuple[list[Any], list[Any], dict[int, int]]:
        """The `(prompt, reference)` pairs to score for `samples`, each once, and each sample's pair index."""
        contexts, answers, index, found = [], [], {}, {}
        for i in samples:
            key = repr((prompts[i], references[i]))
            if key not in found:
                found[key] = len(contexts)
                contexts.append(prompts[i])
                answers.append(references[i])
            index[i] = found[key]
        return contexts, answers, index

    def bounded(self, scores: torch.Tensor, reference_scores: torch.Tensor) -> torch.Tensor:
        """`sigmoid((r - r_ref) / reference_temperature)`."""
        gap = (scores.double() - reference_scores.double()) / self.reference_temperature
        return torch.sigmoid(gap).to(scores.dtype)
