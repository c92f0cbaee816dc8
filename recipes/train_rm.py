"""Train a Bradley-Terry reward model on ranked preference data.

    trl-rm-env train --config rm_tiny.yaml                                              # installed: offline, CPU, ~1 min
    trl-rm-env train --config rm.yaml --accelerate_config zero3                         # Qwen3-0.6B on HelpSteer3
    accelerate launch recipes/train_rm.py --config recipes/configs/rm_tiny.yaml         # from a checkout
    accelerate launch --config_file accelerate_configs/zero3.yaml recipes/train_rm.py --config recipes/configs/rm.yaml

YAML gives the defaults, command-line flags override them (`--learning_rate 5e-5`, `--eval_data a=x.jsonl b=y.jsonl`).
Order: load the data and set up the model (a bad file or a typo'd path fails in one line before any model loads);
train; evaluate every validation set; save a plain `AutoModelForSequenceClassification` checkpoint (LoRA adapters
merged) with its tokenizer and reward statistics.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the heavy imports happen in main()/make_parser(), after the cheap checks of run_recipe
    from trl import ModelConfig, TrlParser

    from trl_rm_env.data.arguments import RankedDataArguments
    from trl_rm_env.trainer import RankedRewardConfig


def main(data_args: RankedDataArguments, training_args: RankedRewardConfig, model_args: ModelConfig) -> dict:
    from trl_rm_env.recipes import shared_steps as steps

    from trl_rm_env.trainer import RankedRewardTrainer, model_flags
    from trl_rm_env.trainer.saving import format_metrics_table

    resume = steps.start(training_args)  # FSDP on CPU; a missing resume checkpoint fails here, in one line

    # --- data ------------------------------------------------------------------------------------------------
    train_dataset, eval_datasets = data_args.load(
        on_invalid=training_args.on_invalid, max_completions=training_args.max_completions
    )
    if not eval_datasets:
        training_args.eval_strategy = "no"

    # --- model (a typo'd folder fails in one line; the tiny offline model is built only at .../reward_model) ----
    quantization_config = model_flags.quantization(model_args, training_args)  # --load_in_4bit/8bit: QLoRA, as TRL
    model_path = steps.prepare_model(model_args, training_args, build_tiny=data_args.build_tiny_model)

    # --- train -----------------------------------------------------------------------------------------------
    trainer = RankedRewardTrainer(
        model=model_path,
        args=training_args,
        train_dataset=train_dataset,
        eval_dataset=eval_datasets or None,
        quantization_config=quantization_config,
        peft_config=model_flags.peft_config(model_args),  # LoRA's task: SEQ_CLS
    )
    steps.train(trainer, resume)

    # --- evaluate and save -----------------------------------------------------------------------------------
    return steps.finish_reward_model(
        trainer,
        training_args.output_dir,
        eval_datasets,
        table=lambda metrics: format_metrics_table(metrics, list(eval_datasets)),
        saved=f"Reward model saved to {training_args.output_dir}",
    )


def make_parser(prog: str | None = None) -> TrlParser:
    from trl import ModelConfig, TrlParser

    from trl_rm_env.compat import accept_activation_checkpointing  # transformers < 5.20: the old name
    from trl_rm_env.data.arguments import RankedDataArguments
    from trl_rm_env.trainer import RankedRewardConfig

    return accept_activation_checkpointing(TrlParser((RankedDataArguments, RankedRewardConfig, ModelConfig), prog=prog))


if __name__ == "__main__":
    from trl_rm_env.errors import run_recipe

    run_recipe(make_parser, main)  # expected errors end in one line (TRL_RM_ENV_DEBUG=1: the traceback)
