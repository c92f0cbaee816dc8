"""`GenRMArguments`: the data, reward and evaluation section of the GenRM training recipe's `TrlParser`
(`recipes/train_genrm.py`); the rest is TRL's `GRPOConfig` and `ModelConfig`. Its data keys are the reward-model
recipe's (`RankedDataArguments`: `train_data`, `eval_data`, `data_format`, `hub_config`, the binary keys), read the
same way."""

from __future__ import annotations

from dataclasses import dataclass, field

from trl_rm_env.data.arguments import RankedDataArguments
from trl_rm_env.data.rows import ON_INVALID_MODES
from trl_rm_env.judges.genrm_template import GENRM_TEMPLATES


@dataclass
class GenRMArguments(RankedDataArguments):
    """Which ranked data the GenRM learns from, how it is shown, how its verdicts are rewarded and evaluated.

    The data keys are `RankedDataArguments`' (`train_data`: the comparisons' source; `eval_data`: held-out sets,
    `name=source`, on which the GenRM is evaluated at the end, and at the start with `eval_at_start`, as `trl-rm-env
    eval --judge-mode genrm` evaluates it; `data_format`, `hub_config`, ...); `build_tiny_model` builds the tiny
    offline models when the model path, a folder named `policy`, is missing.

    Args:
        on_invalid: A record that fails validation (fewer than two distinct ranks, a bad message, ...): `skip` counts
            and logs it, `raise` stops at it, naming file, row and field.
        pairs_per_record: Most pairs of one record made into comparisons, sampled with `seed` (None: every pair).
        include_ties: Make the pairs of equal rank comparisons too, with a tie target.
        principle: A principle message sent before the two responses (role `principle`); with `principle_column`,
            the principle of rows without one.
        principle_column: A record field holding each record's principle.
        genrm_template: How the model renders the `genrm_compare` roles: `auto` (its own template where it renders
            them, else the built-in one, saved with the model), `model` (its own, refused where it cannot), `builtin`.
        agreement_weight: Weight of `genrm_agreement` (the verdict's agreement with the human order).
        format_weight: Weight of `genrm_format` (exactly one verdict the parser reads, in range).
        margin_credit: Share in [0, 1] of the agreement reward given by the score margin.
        reasoning_target_words: Words of reasoning beyond which `genrm_reasoning_length` penalizes (None: no such
            reward).
        reasoning_length_weight: Weight of `genrm_reasoning_length` when `reasoning_target_words` is set.
        warm_start_steps: Optimizer steps of a supervised warm start (TRL's `SFTTrainer` on the target verdicts)
            before GRPO; 0: none. Use it when the base model does not yet write a verdict the parser reads (a base
            or tiny model: GRPO has no signal while every verdict fails).
        warm_start_learning_rate: Learning rate of the warm start (None: the GRPO learning rate).
        eval_at_start: Evaluate the base model on `eval_data` before training too, and after the warm start (the
            learning curve: `start`, `warm_start`, `final` in `genrm_eval.json`); one-process launches only.
    """

    on_invalid: str = field(
        default="skip", metadata={"help": "Invalid records: skip (counted) or raise.", "choices": ON_INVALID_MODES}
    )
    pairs_per_record: int | None = field(
        default=None, metadata={"help": "Most pairs per record, sampled (None: every pair)."}
    )
    include_ties: bool = field(default=True, metadata={"help": "Pairs of equal rank as tie comparisons."})
    principle: str | None = field(default=None, metadata={"help": "A principle message before the responses."})
    principle_column: str | None = field(default=None, metadata={"help": "Record field holding the principle."})
    genrm_template: str = field(
        default="auto", metadata={"help": "auto, model or builtin chat template.", "choices": GENRM_TEMPLATES}
    )
    agreement_weight: float = field(default=1.0, metadata={"help": "Weight of the agreement reward."})
    format_weight: float = field(default=0.25, metadata={"help": "Weight of the format reward."})
    margin_credit: float = field(default=0.0, metadata={"help": "Share of the agreement from the score margin."})
    reasoning_target_words: int | None = field(
        default=None, metadata={"help": "Reasoning words beyond which a length penalty applies (None: none)."}
    )
    reasoning_length_weight: float = field(default=0.1, metadata={"help": "Weight of the length penalty."})
    warm_start_steps: int = field(default=0, metadata={"help": "Supervised warm-start steps before GRPO (0: none)."})
    warm_start_learning_rate: float | None = field(
        default=None, metadata={"help": "Warm-start learning rate (None: the GRPO one)."}
    )
    eval_at_start: bool = field(default=False, metadata={"help": "Evaluate the base model on eval_data too."})

    def __post_init__(self) -> None:
        if self.warm_start_steps < 0:
            raise ValueError(f"warm_start_steps must be >= 0, got {self.warm_start_steps}")
        if self.pairs_per_record is not None and self.pairs_per_record < 1:
            raise ValueError(f"pairs_per_record must be >= 1 (null: every pair), got {self.pairs_per_record}")
        if not 0.0 <= self.margin_credit <= 1.0:
            raise ValueError(f"margin_credit must be in [0, 1], got {self.margin_credit}")
        if self.reasoning_target_words is not None and self.reasoning_target_words < 1:
            raise ValueError(f"reasoning_target_words must be >= 1 (null: no length reward), got "
                             f"{self.reasoning_target_words}")  # fmt: skip

    def reward_functions(self) -> tuple[list, list[float]]:
        """The GenRM's reward functions and their weights: agreement, format, and the length penalty when
        `reasoning_target_words` is set."""
        from trl_rm_env.rewards.genrm_verdicts import ReasoningLength, VerdictAgreement, VerdictFormat

        rewards: list = [VerdictAgreement(margin_credit=self.margin_credit), VerdictFormat()]
        weights = [self.agreement_weight, self.format_weight]
        if self.reasoning_target_words is not None:
            rewards.append(ReasoningLength(self.reasoning_target_words))
            weights.append(self.reasoning_length_weight)
        return rewards, weights
