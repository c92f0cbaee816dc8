"""Train a generative reward model (GenRM) from ranked preference data with GRPO: the model reads two responses in
NeMo Gym's `genrm_compare` protocol, writes a JSON verdict, and is rewarded when the verdict agrees with the human
order (docs/genrm_training.md).

    trl-rm-env train-genrm --config genrm_tiny.yaml                                        # installed: offline, CPU
    accelerate launch recipes/train_genrm.py --config recipes/configs/genrm_tiny.yaml     # from a checkout
    accelerate launch --config_file accelerate_configs/zero3.yaml recipes/train_genrm.py --config recipes/configs/genrm.yaml

Order: the model and its chat template (the protocol's roles), the comparisons (every source we read, each pair in
both orders, ties as tie targets), an optional supervised warm start (TRL's `SFTTrainer` on the target verdicts),
GRPO (TRL's `GRPOTrainer`, `genrm_agreement` + `genrm_format`), the model saved with its tokenizer, and the held-out
evaluation (pairwise accuracy, position consistency, failed verdicts, listwise Kendall tau) written to
`genrm_eval.json`. The saved model is a `JudgeEnvironment(mode="genrm")` judge as it is.
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the heavy imports happen in main()/make_parser(), after the cheap checks of run_recipe
    from trl import GRPOConfig, ModelConfig, TrlParser
    from trl_rm_env.recipes.genrm_args import GenRMArguments


def main(genrm_args: GenRMArguments, training_args: GRPOConfig, model_args: ModelConfig) -> dict[str, Any]:
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import GRPOTrainer, get_peft_config
    from trl_rm_env.recipes import shared_steps as steps

    from trl_rm_env.judges.genrm_data import genrm_comparisons
    from trl_rm_env.judges.genrm_template import prepare_genrm_tokenizer
    from trl_rm_env.trainer.checkpoints import with_atomic_checkpoints

    resume = steps.start(training_args)  # FSDP on CPU; a missing resume checkpoint fails here, in one line
    if training_args.reward_weights is not None:
        raise ValueError(
            "reward_weights: the GenRM recipe weighs its rewards with agreement_weight, format_weight and "
            "reasoning_length_weight"
        )
    rewards, training_args.reward_weights = genrm_args.reward_functions()
    if genrm_args.eval_at_start and training_args.world_size > 1:
        raise ValueError(
            f"eval_at_start: the evaluation before training runs in one process, this launch has "
            f"{training_args.world_size}; evaluate the base model with `trl-rm-env eval --judge MODEL --judge-mode "
            "genrm --data ...`, or launch with one process (the held-out evaluation at the end runs either way)"
        )

    # --- data (a bad file fails in one line before any model loads) ------------------------------------------
    train, eval_datasets = genrm_args.load(on_invalid=genrm_args.on_invalid)
    comparisons, counts = genrm_comparisons(
        train.to_list(), ties=genrm_args.include_ties, pairs_per_record=genrm_args.pairs_per_record,
        principle=genrm_args.principle, principle_column=genrm_args.principle_column, seed=training_args.seed,
        source=genrm_args.train_data,
    )  # fmt: skip
    eval_sets = {name: dataset.to_list() for name, dataset in eval_datasets.items()}

    # --- model and its template (the protocol's roles, or the built-in template saved with the model) ---------
    model_path = steps.prepare_model(
        model_args, training_args, build_tiny=genrm_args.build_tiny_model, kind="policy", what="GenRM base model"
    )
    tokenizer = AutoTokenizer.from_pretrained(model_path, revision=model_args.model_revision)
    principle = genrm_args.principle is not None or genrm_args.principle_column is not None
    template = prepare_genrm_tokenizer(tokenizer, genrm_args.genrm_template, principle=principle)
    from accelerate import PartialState

    state = PartialState()
    state.print(
        f"GenRM data: {counts.records} record(s) -> {counts.pairs} ordered pair(s) and "
        f"{counts.ties} tie(s), each in both orders: {counts.comparisons} comparisons"
        + (f" ({counts.sampled_out} pair(s) left out by pairs_per_record)" if counts.sampled_out else "")
        + f"; chat template: {template}"
    )
    results: dict[str, Any] = {}
    if genrm_args.eval_at_start and eval_sets:
        results["start"] = evaluate_genrm(model_path, tokenizer, eval_sets, training_args, "start")

    # --- warm start: supervised verdicts, when the base model cannot yet write them -----------------------------
    if genrm_args.warm_start_steps:
        model_path = warm_start(model_path, tokenizer, comparisons, genrm_args, training_args, model_args)
        if genrm_args.eval_at_start and eval_sets:
            results["warm_start"] = evaluate_genrm(model_path, None, eval_sets, training_args, "warm_start")

    # --- GRPO -------------------------------------------------------------------------------------------------
    trainer = with_atomic_checkpoints(GRPOTrainer)(  # checkpoints appear complete or not at all
        model=model_path,
        reward_funcs=rewards,
        args=training_args,
        train_dataset=Dataset.from_list(comparisons),
        processing_class=tokenizer,
        peft_config=get_peft_config(model_args),
    )
    steps.train(trainer, resume)
    trainer.save_model(training_args.output_dir)  # the tokenizer too, with the template the GenRM was trained on
    trainer.save_state()
    trainer.accelerator.wait_for_everyone()
    trainer.accelerator.print(f"GenRM saved to {training_args.output_dir}")
    main_process = trainer.accelerator.is_main_process
    trainer.end()  # the process group ends here: the other processes are done, none waits on the evaluation

    # --- held-out evaluation on the main process, as `trl-rm-env eval --judge-mode genrm` ---------------------
    if eval_sets and main_process:
        import gc

        from transformers.integrations.deepspeed import unset_hf_deepspeed_config

        del trainer
        gc.collect()
        unset_hf_deepspeed_config()  # the saved GenRM loads whole, as one process loads it
        results["final"] = evaluate_genrm(training_args.output_dir, None, eval_sets, training_args, "final")
    return results


def warm_start(
    model_path: str, tokenizer: Any, comparisons: list, genrm_args: Any, training_args: Any, model_args: Any
) -> str:
    """TRL's `SFTTrainer` on each comparison's target verdict (`genrm_data.warm_start_rows`) for `warm_start_steps`;
    the model is saved to `output_dir/warm_start` and GRPO starts from it. Its settings are the GRPO run's `TrainingArguments`
    (batch size, precision, distribution, logging) but the steps, the learning rate and checkpoints (none)."""
    import dataclasses

    from datasets import Dataset
    from transformers import TrainingArguments
    from trl import SFTConfig, SFTTrainer, get_peft_config

    from trl_rm_env.judges.genrm_data import warm_start_rows

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
    from trl_rm_env.evaluation.command import close_engine, nan_to_none
    from trl_rm_env.evaluation.judge import evaluate_judge, format_comparison_table
    from trl_rm_env.rewards.judge import JudgeEnvironment

    judge = JudgeEnvironment(
        model, tokenizer, mode="genrm", max_new_tokens=training_args.max_completion_length, temperature=0.0,
        parse_retries=0,
    )  # fmt: skip
    try:
        results, _ = evaluate_judge(judge, eval_sets)
    finally:
        close_engine(judge.engine)
    print(f"\nGenRM on the held-out sets ({when}):")
    print(format_comparison_table({f"judge (genrm, {when})": results}, {}))
    out = os.path.join(training_args.output_dir, "genrm_eval.json")
    os.makedirs(training_args.output_dir, exist_ok=True)
    saved = json.loads(open(out).read()) if os.path.exists(out) and when != "start" else {}
    with open(out, "w") as f:
        json.dump(nan_to_none({**saved, when: results}), f, indent=2, default=str)
    return results


def make_parser(prog: str | None = None) -> TrlParser:
    from trl import GRPOConfig, ModelConfig, TrlParser
    from trl_rm_env.recipes.genrm_args import GenRMArguments

    from trl_rm_env.compat import accept_activation_checkpointing  # transformers < 5.20: the old name

    return accept_activation_checkpointing(TrlParser((GenRMArguments, GRPOConfig, ModelConfig), prog=prog))


if __name__ == "__main__":
    from trl_rm_env.errors import run_recipe

    run_recipe(make_parser, main)  # expected errors end in one line (TRL_RM_ENV_DEBUG=1: the traceback)
