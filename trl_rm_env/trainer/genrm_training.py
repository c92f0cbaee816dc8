"""Training a GenRM with GRPO from ranked data (`recipes/train_genrm.py`, docs/genrm_training.md): the recipe's
arguments (`GenRMArguments`) and its steps, here so that a library user gets the same checks: the run's settings
checked (`check_run`), the comparisons loaded (`load_comparisons`), the model's chat template readied
(`genrm_tokenizer`), the supervised warm start (`warm_start`) and the held-out evaluation (`evaluate_genrm`)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..data.arguments import RankedDataArguments
from ..data.rows import ON_INVALID_MODES
from ..judges.genrm_template import GENRM_TEMPLATES
from ..rewards.genrm_verdicts import MARGIN_CREDIT


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
    margin_credit: float = field(
        default=MARGIN_CREDIT, metadata={"help": "Share of the agreement from the score margin."}
    )
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
        from ..rewards.genrm_verdicts import ReasoningLength, VerdictAgreement, VerdictFormat

        rewards: list = [VerdictAgreement(margin_credit=self.margin_credit), VerdictFormat()]
        weights = [self.agreement_weight, self.format_weight]
        if self.reasoning_target_words is not None:
            rewards.append(ReasoningLength(self.reasoning_target_words))
            weights.append(self.reasoning_length_weight)
        return rewards, weights


def check_run(genrm_args: GenRMArguments, training_args: Any) -> list:
    """The run's rewards, with their weights set on `training_args` (TRL's `reward_weights`).

    Raises:
        ValueError: `reward_weights` given (the recipe's weights are `agreement_weight`, ...), or `eval_at_start`
            under several processes (the evaluation runs in one).
    """
    if training_args.reward_weights is not None:
        raise ValueError(
            "reward_weights: the GenRM recipe weighs its rewards with agreement_weight, format_weight and "
            "reasoning_length_weight"
        )
    if genrm_args.eval_at_start and training_args.world_size > 1:
        raise ValueError(
            f"eval_at_start: the evaluation before training runs in one process, this launch has "
            f"{training_args.world_size}; evaluate the base model with `trl-rm-env eval --judge MODEL --judge-mode "
            "genrm --data ...`, or launch with one process (the held-out evaluation at the end runs either way)"
        )
    rewards, training_args.reward_weights = genrm_args.reward_functions()
    return rewards


def load_comparisons(genrm_args: GenRMArguments, seed: int) -> tuple[list[dict], Any, dict[str, list]]:
    """The training comparisons (`judges.genrm_data.genrm_comparisons` of `train_data`), their counts, and the
    held-out sets' records by name."""
    from ..judges.genrm_data import genrm_comparisons

    train, eval_datasets = genrm_args.load(on_invalid=genrm_args.on_invalid)
    comparisons, counts = genrm_comparisons(
        train.to_list(), ties=genrm_args.include_ties, pairs_per_record=genrm_args.pairs_per_record,
        principle=genrm_args.principle, principle_column=genrm_args.principle_column, seed=seed,
        source=genrm_args.train_data,
    )  # fmt: skip
    return comparisons, counts, {name: dataset.to_list() for name, dataset in eval_datasets.items()}


def genrm_tokenizer(model_path: str, genrm_args: GenRMArguments, revision: str | None = None) -> tuple[Any, str]:
    """The model's tokenizer, rendering the `genrm_compare` roles (`genrm_template`), and which template it uses."""
    from transformers import AutoTokenizer

    from ..judges.genrm_template import prepare_genrm_tokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_path, revision=revision)
    principle = genrm_args.principle is not None or genrm_args.principle_column is not None
    return tokenizer, prepare_genrm_tokenizer(tokenizer, genrm_args.genrm_template, principle=principle)


def describe(counts: Any, template: str) -> str:
    """The line the recipe prints about its data."""
    left = f" ({counts.sampled_out} pair(s) left out by pairs_per_record)" if counts.sampled_out else ""
    return (
        f"GenRM data: {counts.records} record(s) -> {counts.pairs} ordered pair(s) and {counts.ties} tie(s), each in "
        f"both orders: {counts.comparisons} comparisons{left}; chat template: {template}"
    )


def warm_start(
    model_path: str, tokenizer: Any, comparisons: list, genrm_args: Any, training_args: Any, model_args: Any
) -> str:
    """TRL's `SFTTrainer` on each comparison's target verdict (`genrm_data.warm_start_rows`) for `warm_start_steps`;
    the model is saved to `output_dir/warm_start` and GRPO starts from it. Its settings are the GRPO run's
    `TrainingArguments` (batch size, precision, distribution, logging) but the steps, the learning rate and
    checkpoints (none)."""
    import dataclasses

    from datasets import Dataset
    from transformers import TrainingArguments
    from trl import SFTConfig, SFTTrainer, get_peft_config

    from ..judges.genrm_data import warm_start_rows

    path = os.path.join(training_args.output_dir, "warm_start")
    shared = {f.name for f in dataclasses.fields(TrainingArguments) if f.init}  # not GRPO's own (loss_type, ...)
    values = {name: getattr(training_args, name) for name in shared}
    values.update(
        output_dir=path, max_steps=genrm_args.warm_start_steps, save_strategy="no", eval_strategy="no",
        learning_rate=genrm_args.warm_start_learning_rate or training_args.learning_rate, max_length=None,
        model_init_kwargs=training_args.model_init_kwargs, resume_from_checkpoint=None,
    )  # fmt: skip
    sft = SFTTrainer(
        model=model_path,
        args=SFTConfig(**values),
        train_dataset=Dataset.from_list(warm_start_rows(comparisons)),
        processing_class=tokenizer,
        peft_config=get_peft_config(model_args),
    )
    sft.train()
    sft.save_model(path)
    sft.accelerator.wait_for_everyone()
    sft.accelerator.print(f"Warm start: {genrm_args.warm_start_steps} supervised step(s), saved to {path}")
    del sft
    return path


def evaluate_genrm(model: str, tokenizer: Any, eval_sets: dict, training_args: Any, when: str) -> dict[str, Any]:
    """The GenRM at `model` judged on `eval_sets` in this process, as `trl-rm-env eval --judge-mode genrm` judges it
    (greedy, no retries: a verdict it cannot write is a failed one); the table printed and the results added to
    `output_dir/genrm_eval.json` under `when`. One process only (`evaluate_judge`'s group calls would wait for the
    others): the recipe calls it before the process group exists in a one-process launch, or after it has ended."""
    from ..evaluation.judge import evaluate_judge, format_comparison_table
    from ..evaluation.tables import nan_to_none
    from ..rewards.judge import JudgeEnvironment

    judge = JudgeEnvironment(
        model, tokenizer, mode="genrm", max_new_tokens=training_args.max_completion_length, temperature=0.0,
        parse_retries=0,
    )  # fmt: skip
    try:
        results, _ = evaluate_judge(judge, eval_sets)
    finally:
        judge.engine.close()
    print(f"\nGenRM on the held-out sets ({when}):")
    print(format_comparison_table({f"judge (genrm, {when})": results}, {}))
    out = os.path.join(training_args.output_dir, "genrm_eval.json")
    os.makedirs(training_args.output_dir, exist_ok=True)
    saved = json.loads(Path(out).read_text()) if os.path.exists(out) and when != "start" else {}
    with open(out, "w") as f:
        json.dump(nan_to_none({**saved, when: results}), f, indent=2, default=str)
    return results


def evaluate_after_training(output_dir: str, eval_sets: dict, training_args: Any) -> dict[str, Any]:
    """`evaluate_genrm` of the saved GenRM once the trainer is gone (its process group ended): the model loads whole,
    as one process loads it (any DeepSpeed ZeRO-3 setting of the run unset first)."""
    import gc

    from transformers.integrations.deepspeed import unset_hf_deepspeed_config

    gc.collect()
    unset_hf_deepspeed_config()
    return evaluate_genrm(output_dir, None, eval_sets, training_args, "final")
