"""The engine contract, declared once: what every engine that runs a model for rewards answers, local or remote, reward
model or judge. `HFEngine` and `VLLMEngine` (`runtime/engines/`) answer all of it; `RemoteJudgeEngine`
(`serving/client/judge_engine.py`) the judge's part, awaitably (`is_async`).

A reward model's engine answers `outputs`; a judge's `label_logprobs` and `generate`. An engine that cannot answer a
kind of call does not define it. Every engine has `close`, which its users call once they are done with it (a command
that runs two engines stops each when it is done, never leaving vLLM's processes to the exit handlers).

A judge's call asks its engine through typed requests (`LabelLogprobs`, `Generate`), which the judge answers with
the contract's methods. An engine that runs the judge in this process writes its sampling once (`_sample`, a
`Sampling`) and takes `generate` from `GeneratesHere`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch


@runtime_checkable
class Engine(Protocol):
    """Any engine.

    Attributes:
        name: Its backend: `"hf"`, `"vllm"`, `"remote"`, or a registered engine's name (`registry.py`).
        is_async: Whether its calls return awaitables (servers) rather than results.
        sharding: How its weights are held across processes: `"none"`, `"zero3"` or `"fsdp2"`.
        model: The `torch.nn.Module` it runs in this process, or None where it holds the weights itself (vLLM) or
            servers do (for a remote judge: the model name sent to them).
    """

    name: str
    is_async: bool
    sharding: str
    model: Any

    def close(self) -> None:
        """Release what the engine holds beyond its Python objects (vLLM's processes); idempotent."""
        ...


class RewardModelEngine(Engine, Protocol):
    """What runs a local reward model's forward passes for `RewardScorer`: token ids in, `(N, num_labels)` fp32
    outputs out, in input order, each equal to running that sequence alone (fp32: within 1e-4). The scorer hands it
    each item's context length (`context_lengths`; None for token ids that came without them): an engine that shares
    contexts uses them, or finds shared prefixes in the ids, and one that does not ignores them.

    Attributes:
        num_labels: The model's outputs per sequence.
        prefix_sharing: The sharing that runs (logged; `False`, `True` or `"packed"`; vLLM: its prefix caching).
        device: Where the model runs.
    """

    num_labels: int
    prefix_sharing: bool | str
    device: torch.device

    def outputs(
        self, sequences: Sequence[Sequence[int]], context_lengths: Sequence[int] | None = None,
        progress: bool | None = None,
    ) -> torch.Tensor: ...


class JudgeEngine(Engine, Protocol):
    """What runs a judge: each prompt's log-probabilities of the verdict labels, and generation. One in this process
    also has `device` (where the judge runs).

    Attributes:
        max_length: The longest prompt plus answer it takes, in tokens (a longer judgement is over length, never
            sent); None: unchecked here.
    """

    max_length: int | None

    def label_logprobs(self, prompts: Sequence[Any], label_ids: Sequence[int], labels: Sequence[str]) -> Any:
        """Per prompt, the log-probability of each label's token as the next token (an awaitable when `is_async`)."""
        ...

    def generate(
        self, prompts: Sequence[Any], max_new_tokens: int, temperature: float, seeds: Sequence[int],
        top_p: float = 1.0, *, keep_failures: bool = False,
    ) -> Any:
        """Per prompt, the text generated (seeded per prompt; an awaitable when `is_async`)."""
        ...


# ---------------------------------------------------------------------------------------- a judge's requests
@dataclass(frozen=True)
class LabelLogprobs:
    """A judge's call asking its engine for `label_logprobs` of `prompts` (`judges.judgements.ask_verdicts` yields it;
    the judge answers with its engine)."""

    prompts: list[Any]


@dataclass(frozen=True)
class Generate:
    """A judge's call asking its engine to `generate` for `prompts` at `temperature`, one seed per prompt."""

    prompts: list[Any]
    temperature: float
    seeds: list[int]


# ---------------------------------------------------------------------------------------- engines in this process
@dataclass(frozen=True)
class Sampling:
    """What an engine in this process generates (`GeneratesHere`): per prompt of token ids, up to `max_new_tokens`
    tokens, greedy at `temperature` 0, else sampled with nucleus `top_p`, seeded by `seeds` (one per prompt)."""

    prompts: Sequence[Sequence[int]]
    max_new_tokens: int
    temperature: float
    seeds: Sequence[int]
    top_p: float = 1.0


class GeneratesHere:
    """The contract's `generate` for an engine that runs the judge in this process (transformers, vLLM), written
    once: such an engine has no failure by request to keep (`keep_failures` is a server client's), and samples in
    its own `_sample(Sampling)`."""

    def generate(
        self, prompts: Sequence[Sequence[int]], max_new_tokens: int, temperature: float, seeds: Sequence[int],
        top_p: float = 1.0, *, keep_failures: bool = False,
    ) -> list[str]:
        """The judge's text for each prompt, special tokens skipped (`Sampling`; seeding as the engine's `_sample`
        says). Nothing here fails by request, so `keep_failures` changes nothing."""
        return self._sample(Sampling(prompts, max_new_tokens, temperature, seeds, top_p))

    def _sample(self, sampling: Sampling) -> list[str]:
        raise NotImplementedError

