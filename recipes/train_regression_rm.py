"""Train a regression reward model: one output per attribute (HelpSteer2-style), masked MSE.

    accelerate launch recipes/train_regression_rm.py --config recipes/configs/rm_regression_tiny.yaml   # offline CPU
    accelerate launch recipes/train_regression_rm.py --config recipes/configs/rm_regression.yaml        # Qwen3-0.6B

YAML gives the defaults, command-line flags override them (`--attributes helpfulness correctness`,
`--eval_data a=x.jsonl b=y.jsonl`). Order: load the data (the attribute names decide the model's outputs); set up the
model; train; evaluate every validation set; save a plain `AutoModelForSequenceClassification` checkpoint (LoRA
adapters merged) whose config names the attributes (`id2label`, `reward_model_type: regression`); print per set and
attribute the RMSE, MAE and Pearson r next to the RMSE of always predicting the training mean.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the heavy imports happen in main()/make_parser(), after the cheap checks of run_recipe
    from trl import ModelConfig, TrlParser

    from trl_rm_env.data.regression import RegressionDataArguments
    from trl_rm_env.trainer.regression import RegressionRewardConfig


def main(data_args: RegressionDataArguments, training_args: RegressionRewardConfig, model_args: ModelConfig) -> dict:
    from trl import get_peft_config

    from trl_rm_env.data.regression import dataset_attributes, mean_baseline_rmse
    from trl_rm_env.distributed import describe_sharding, enable_fsdp_on_cpu
    from trl_rm_env.model_source import check_model_source, ensure_tiny_model
    from trl_rm_env.trainer.regression import RegressionRewardTrainer, format_regression_table
    from trl_rm_env.trainer.saving import (
        check_distributed_setup,
        resolve_resume_checkpoint,
        save_reward_model,
        tty_aware_progress,
    )

    enable_fsdp_on_cpu()  # an FSDP accelerate config shards on CPU too (accelerate alone falls back to DDP there)
    # Fail in one line before loading anything: a missing resume checkpoint, a typo'd model folder.
    resume = resolve_resume_checkpoint(training_args.resume_from_checkpoint, training_args.output_dir)

    # --- data ------------------------------------------------------------------------------------------------
    train_dataset, eval_datasets = data_args.load(training_args.attributes, on_invalid=training_args.on_invalid)
    attributes = training_args.attributes or dataset_attributes(train_dataset)
    if not eval_datasets:
        training_args.eval_strategy = "no"

    # --- model -----------------------------------------------------------------------------------------------
    model_path = model_args.model_name_or_path
    if data_args.build_tiny_model:  # at .../regression_model or in a new folder; elsewhere a missing path is a typo
        ensure_tiny_model(model_path, "regression_model", exact_name=False, num_labels=len(attributes))
    check_model_source(model_path, "model")
    model_init_kwargs = dict(
        revision=model_args.model_revision,
        attn_implementation=model_args.attn_implementation,
        dtype=model_args.dtype,
    )
    model_init_kwargs.update(training_args.model_init_kwargs or {})
    training_args.model_init_kwargs = {k: v for k, v in model_init_kwargs.items() if v is not None}

    # --- train -----------------------------------------------------------------------------------------------
    trainer = RegressionRewardTrainer(
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
        trainer.save_metrics("eval", metrics)  # eval_results.json, per-set, per-attribute names
    trainer.save_state()  # trainer_state.json: the full log history
    if eval_datasets:
        baseline = mean_baseline_rmse(train_dataset, eval_datasets, trainer.attributes)
        trainer.accelerator.print(format_regression_table(metrics, list(eval_datasets), trainer.attributes, baseline))
    trainer.accelerator.print(
        f"Regression reward model ({', '.join(trainer.attributes)}) saved to {training_args.output_dir}"
    )
    trainer.end()
    return metrics


def make_parser(subparsers: argparse._SubParsersAction | None = None) -> TrlParser:
    from trl import ModelConfig, TrlParser

    from trl_rm_env.data.regression import RegressionDataArguments
    from trl_rm_env.trainer.regression import RegressionRewardConfig

    dataclass_types = (RegressionDataArguments, RegressionRewardConfig, ModelConfig)
    if subparsers is not None:
        return subparsers.add_parser(
            "train-regression-rm", help="Train a regression reward model", dataclass_types=dataclass_types
        )
    return TrlParser(dataclass_types)


if __name__ == "__main__":
    from trl_rm_env.errors import run_recipe

    run_recipe(make_parser, main)  # expected errors end in one line (TRL_RM_ENV_DEBUG=1: the traceback)
