"""Train a Bradley-Terry reward model on ranked preference data.

    accelerate launch recipes/train_rm.py --config recipes/configs/rm_tiny.yaml          # offline, CPU, ~1 min
    accelerate launch recipes/train_rm.py --config recipes/configs/rm.yaml               # Qwen3-0.6B on HelpSteer3
    accelerate launch --config_file accelerate_configs/zero3.yaml recipes/train_rm.py --config recipes/configs/rm.yaml

YAML gives the defaults, command-line flags override them (`--learning_rate 5e-5`, `--eval_data a=x.jsonl b=y.jsonl`).
Order: load the data and set up the model (a bad file or a typo'd path fails in one line before any model loads);
train; evaluate every validation set; save a plain `AutoModelForSequenceClassification` checkpoint (LoRA adapters
merged) with its tokenizer and reward statistics.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the heavy imports happen in main()/make_parser(), after the cheap checks of run_recipe
    from trl import ModelConfig, TrlParser

    from trl_rm_env.data.arguments import RankedDataArguments
    from trl_rm_env.trainer import RankedRewardConfig


def main(data_args: RankedDataArguments, training_args: RankedRewardConfig, model_args: ModelConfig) -> dict:
    from trl import get_peft_config

    from trl_rm_env.data.schema import MAX_COMPLETIONS_PER_RECORD
    from trl_rm_env.distributed import describe_sharding, enable_fsdp_on_cpu
    from trl_rm_env.model_source import check_model_source, ensure_tiny_model
    from trl_rm_env.trainer import RankedRewardTrainer
    from trl_rm_env.trainer.saving import (
        check_distributed_setup,
        format_metrics_table,
        resolve_resume_checkpoint,
        save_reward_model,
        tty_aware_progress,
    )

    enable_fsdp_on_cpu()  # an FSDP accelerate config shards on CPU too (accelerate alone falls back to DDP there)
    # Fail in one line before loading anything: a missing resume checkpoint, a typo'd model folder.
    resume = resolve_resume_checkpoint(training_args.resume_from_checkpoint, training_args.output_dir)

    # --- data ------------------------------------------------------------------------------------------------
    limit = getattr(training_args, "max_completions", MAX_COMPLETIONS_PER_RECORD)  # the trainer's guard, one place
    train_dataset, eval_datasets = data_args.load(on_invalid=training_args.on_invalid, max_completions=limit)
    if not eval_datasets:
        training_args.eval_strategy = "no"

    # --- model -----------------------------------------------------------------------------------------------
    model_path = model_args.model_name_or_path
    if data_args.build_tiny_model:  # only at .../reward_model: any other missing path is a typo
        ensure_tiny_model(model_path, "reward_model")
    check_model_source(model_path, "model")
    model_init_kwargs = dict(
        revision=model_args.model_revision,
        attn_implementation=model_args.attn_implementation,
        dtype=model_args.dtype,
    )
    model_init_kwargs.update(training_args.model_init_kwargs or {})
    training_args.model_init_kwargs = {k: v for k, v in model_init_kwargs.items() if v is not None}

    # --- train -----------------------------------------------------------------------------------------------
    trainer = RankedRewardTrainer(
        model=model_path,
        args=training_args,
        train_dataset=train_dataset,
        eval_dataset=eval_datasets or None,
        peft_config=get_peft_config(model_args),
    )
    trainer.accelerator.print(check_distributed_setup(trainer.accelerator))
    tty_aware_progress(trainer)  # no nested evaluation bar (escape codes) in a log file
    trainer.train(resume_from_checkpoint=resume)
    trainer.accelerator.print(describe_sharding(trainer.model))  # ZeRO-3 / FSDP: about 1/processes

    # --- evaluate and save -----------------------------------------------------------------------------------
    metrics = trainer.final_evaluation() if eval_datasets else {}  # reuses train()'s evaluation at this step
    save_reward_model(trainer, training_args.output_dir)
    if eval_datasets:
        trainer.save_metrics("eval", metrics)  # eval_results.json, per-set names
    trainer.save_state()  # trainer_state.json: the full log history
    if eval_datasets:
        trainer.accelerator.print(format_metrics_table(metrics, list(eval_datasets)))
    trainer.accelerator.print(f"Reward model saved to {training_args.output_dir}")
    trainer.end()
    return metrics


def make_parser(subparsers: argparse._SubParsersAction | None = None) -> TrlParser:
    from trl import ModelConfig, TrlParser

    from trl_rm_env.data.arguments import RankedDataArguments
    from trl_rm_env.trainer import RankedRewardConfig

    dataclass_types = (RankedDataArguments, RankedRewardConfig, ModelConfig)
    if subparsers is not None:
        return subparsers.add_parser("train-rm", help="Train a reward model", dataclass_types=dataclass_types)
    return TrlParser(dataclass_types)


if __name__ == "__main__":
    from trl_rm_env.errors import run_recipe

    run_recipe(make_parser, main)  # expected errors end in one line (TRL_RM_ENV_DEBUG=1: the traceback)
