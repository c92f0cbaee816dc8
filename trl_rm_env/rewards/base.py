"""What every reward-model reward function does around its scorer: TRL's inputs checked (`trl_rm_env.data.messages`),
empty completions, NaN/inf scores, normalization, clipping and the `reward_model_env/*` metrics, with the options
of that post-processing (`RewardOptions`).

`RewardModelEnvironment` builds on `RewardFunction` with a local or a remote scorer; `_plan` and `_finish` bracket
its scoring call, synchronous or asynchronous.
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ..data.messages import check_sample, message_is_blank, strip_completion_reasoning
from ..options import check_choices, document, option
from ..scoring.interfaces import Scorer

logger = logging.getLogger(__name__)

# TRL's reward-function arguments: one prompt and one completion per sample (text or messages), and their token ids.
Samples = Sequence[Any]
Ids = Sequence[Sequence[int]] | None

NORMALIZATIONS = ("none", "running", "checkpoint")


@document
@dataclass(frozen=True)
class RewardOptions:
    """What a reward function does with the scores: its name, normalization, clipping and the reward of empty
    completions (the `Args` below are generated from the fields).

    Raises:
        ValueError: an unknown normalization, or `clip <= 0`.
    """

    name: str = option(
        "reward_model_env",
        help="The reward function's `__name__`: TRL logs `rewards/<name>/mean` (our own metrics are under "
        "`reward_model_env/*`).",
    )
    normalization: str = option(
        "none",
        choices=NORMALIZATIONS,
        help="`none`; `running` (running mean/std of all rewards so far); `checkpoint` (the `reward_mean` and "
        "`reward_std` that training saved into the model config).",
    )
    clip: float | None = option(None, help="Clip rewards (after normalization) to [-clip, clip].")
    empty_completion_reward: float | None = option(
        None,
        help="The reward of an empty or whitespace-only completion (judged after `strip_reasoning`). None: the RM "
        "scores it like any other answer; the count is logged as `reward_model_env/num_empty` either way.",
    )

    def __post_init__(self) -> None:
        check_choices(self)
        if self.clip is not None and self.clip <= 0:
            raise ValueError(f"clip must be > 0, got {self.clip}")


def is_empty(completion: Any) -> bool:
    """True for a completion with no text and no tool call (blank text, or only blank messages)."""
    if isinstance(completion, str):
        return not completion.strip()
    return all(message_is_blank(m) for m in completion)


class RewardFunction:
    """The reward pipeline around a `Scorer`: checks, empties, NaN/inf, normalization, clipping, metrics.

    Subclasses build their scorer and call `_setup`; `_plan` and `_finish` bracket the scoring
    call of their `__call__` (sync or async).
    """

    scorer: Scorer
    reward_options: RewardOptions
    metric_prefix = "reward_model_env"  # where `_log` puts the metrics
    name = property(lambda self: self.reward_options.name)
    normalization = property(lambda self: self.reward_options.normalization)
    clip = property(lambda self: self.reward_options.clip)
    empty_completion_reward = property(lambda self: self.reward_options.empty_completion_reward)

    def _setup(
        self,
        scorer: Scorer,
        options: RewardOptions,
        *,
        strip_reasoning: bool = False,
        checkpoint_stats: tuple[float, float] | None = None,
        attributes: Sequence[str] = (),
    ) -> None:
        """What every reward function holds (`checkpoint_stats`: `(mean, std)` for `normalization="checkpoint"`).

        Raises:
            ValueError: `checkpoint` normalization without statistics.
        """
        if options.normalization == "checkpoint" and checkpoint_stats is None:
            raise ValueError(
                "normalization='checkpoint' needs `reward_mean` and `reward_std` in the model config; "
                "RankedRewardTrainer writes them when it trains with validation sets (a served reward model gives "
                "no config). Use 'running' instead."
            )
        self.scorer = scorer
        # One call at a time into a model loaded here: AsyncGRPO calls sync reward functions from several threads,
        # and a model's forward (prefix sharing's KV path above all) is not safe to run concurrently.
        self._calls = threading.Lock()
        self.reward_options = options
        self.__name__ = options.name  # TRL reads the reward function's name here
        self.strip_reasoning = strip_reasoning
        self.attributes = list(attributes)  # a regression RM's: the mean of each is logged
        self._checkpoint_stats = checkpoint_stats
        self._count, self._mean, self._m2 = 0, 0.0, 0.0  # running statistics (Welford)
        self.num_nonfinite = 0  # samples given `nonfinite_reward` so far (the first time is warned)
        self._warned_nonfinite = False

    @contextlib.contextmanager
    def _nonfinite_named(self, indices: Sequence[int], what: str):
        """Around one `scorer.score` call on the samples `indices`: yields a list that receives the samples the
        model scored NaN/inf (given `nonfinite_reward`); warns the first time it happens, naming the count; and
        re-raises the scorer's `FloatingPointError` naming the caller's sample indices, not the scorer's."""
        found: list[int] = []
        try:
            yield found
        except FloatingPointError as err:
            bad = [indices[i] for i in getattr(self.scorer, "last_nonfinite", [])]
            if not bad:
                raise
            raise FloatingPointError(
                f"{self.name}: the reward model returned NaN/inf for item(s) {bad[:10]}{'...' if len(bad) > 10 else ''}"
                f" of the {what} ({len(bad)} of {len(indices)} scored). Check the model dtype (fp16 overflows are "
                "common) or set `nonfinite_reward`."
            ) from err
        found.extend(indices[i] for i in getattr(self.scorer, "last_nonfinite", []))
        if found:
            self.num_nonfinite += len(found)
            if not self._warned_nonfinite:
                self._warned_nonfinite = True
                shown = ", ".join(f"{what}[{i}]" for i in found[:10]) + (" ..." if len(found) > 10 else "")
                logger.warning(
                    "%s: the reward model returned NaN/inf for %d of %d samples (%s); they get nonfinite_reward=%s. "
                    "Warned once: later ones are counted in `reward_model_env/num_nonfinite` and `num_nonfinite`.",
                    self.name,
                    len(found),
                    len(indices),
                    shown,
                    self.scorer.nonfinite_reward,
                )

    def _check_inputs(self, prompts: Sequence[Any], completions: Sequence[Any]) -> list[int]:
        """Validate TRL's inputs; return the indices of empty completions."""
        for what, value in (("prompts", prompts), ("completions", completions)):
            if isinstance(value, str | bytes | Mapping) or not isinstance(value, Sequence):
                raise TypeError(
                    f"{what} must be a list (one item per completion, as TRL passes them), got {type(value).__name__}"
                )
        if len(prompts) != len(completions):
            raise ValueError(
                f"{self.name}: got {len(prompts)} prompts but {len(completions)} completions; there must be one "
                "prompt per completion (TRL repeats each prompt num_generations times)."
            )
        for i, (prompt, completion) in enumerate(zip(prompts, completions)):
            check_sample(prompt, f"prompts[{i}]")
            check_sample(completion, f"completions[{i}]", completion=True)
            if isinstance(prompt, str) != isinstance(completion, str):
                raise TypeError(
                    f"prompts[{i}] and completions[{i}] must both be text or both be message lists, got "
                    f"{type(prompt).__name__} and {type(completion).__name__}."
                )
        # With strip_reasoning, a completion that is all `<think>` (or cut off mid-thought) has no answer: empty.
        strip = self.strip_reasoning
        return [i for i, c in enumerate(completions) if is_empty(strip_completion_reasoning(c) if strip else c)]

    def _plan(self, prompts: Samples, completions: Samples) -> tuple[list[int], list[int], torch.Tensor]:
        """Check TRL's inputs; return the empty completions, the samples to score and the rewards to fill."""
        empty = self._check_inputs(prompts, completions)
        skip = set(empty) if self.empty_completion_reward is not None else set()
        to_score = [i for i in range(len(prompts)) if i not in skip]
        return empty, to_score, torch.empty(len(prompts), dtype=torch.float32)

    def _finish(
        self, rewards: torch.Tensor, empty: list[int], log_metric, nonfinite: int | None = None
    ) -> list[float]:
        """Fallback for empty completions, normalization, clipping, metrics (`nonfinite`: how many samples got
        `nonfinite_reward`, logged as `reward_model_env/num_nonfinite` when known)."""
        if self.empty_completion_reward is not None and empty:
            rewards[torch.tensor(empty)] = float(self.empty_completion_reward)
        raw = rewards.clone()
        rewards = self._normalize(rewards)
        if self.clip is not None:
            rewards = rewards.clamp(-self.clip, self.clip)
        self._log(log_metric, raw, rewards, len(empty), nonfinite)
        return rewards.tolist()

    # ------------------------------------------------------------------ normalization and metrics
    def _normalize(self, rewards: torch.Tensor) -> torch.Tensor:
        if self.normalization == "none" or rewards.numel() == 0:
            return rewards
        if self.normalization == "checkpoint":
            mean, std = self._checkpoint_stats
        else:
            for value in rewards.double().tolist():  # Welford's update, all rewards seen so far
                self._count += 1
                delta = value - self._mean
                self._mean += delta / self._count
                self._m2 += delta * (value - self._mean)
            mean = self._mean
            std = math.sqrt(self._m2 / self._count) if self._count > 1 else 1.0
        return (rewards - mean) / max(std, 1e-6)

    def _log(
        self,
        log_metric: Callable[[str, float], None] | None,
        raw: torch.Tensor,
        rewards: torch.Tensor,
        empty: int,
        nonfinite: int | None = None,
    ):
        if log_metric is None or rewards.numel() == 0:
            return
        prefix = self.metric_prefix
        log_metric(f"{prefix}/num_samples", float(rewards.numel()))
        log_metric(f"{prefix}/mean_reward", rewards.mean().item())
        log_metric(f"{prefix}/std_reward", rewards.std(unbiased=False).item())
        log_metric(f"{prefix}/min_reward", rewards.min().item())
        log_metric(f"{prefix}/max_reward", rewards.max().item())
        log_metric(f"{prefix}/num_empty", float(empty))
        if nonfinite is not None:
            log_metric(f"{prefix}/num_nonfinite", float(nonfinite))
        attributes = self.attributes
        outputs = self.scorer.last_outputs if attributes else None
        if attributes and outputs is not None:  # regression RM: mean of each predicted attribute
            for k, attribute in enumerate(attributes):
                column = outputs[:, k][~torch.isnan(outputs[:, k])]
                if column.numel():
                    log_metric(f"{prefix}/{attribute}_mean", column.mean().item())
        if self.normalization != "none":
            log_metric(f"{prefix}/raw_mean_reward", raw.mean().item())
