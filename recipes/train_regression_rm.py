"""Train a regression reward model: one output per attribute (HelpSteer2-style), masked MSE.

    trl-rm-env train-regression --config rm_regression_tiny.yaml                              # installed: offline CPU
    accelerate launch recipes/train_regression_rm.py --config recipes/configs/rm_regression_tiny.yaml   # a checkout
    accelerate launch recipes/train_regression_rm.py --config recipes/configs/rm_regression.yaml        # Qwen3-0.6B

YAML gives the defaults, command-line flags override them (`--attributes helpfulness correctness`,
`--eval_data a=x.jsonl b=y.jsonl`). Order: load the data (the attribute names decide the model's outputs); set up the
model; train; evaluate every validation set; save a plain `AutoModelForSequenceClassification` checkpoint (LoRA
adapters merged) whose config names the attributes (`id2label`, `reward_model_type: regression`); print per set and
attribute the RMSE, MAE and Pearson r next to the RMSE of always predicting the training mean.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the heavy imports happen in main()/make_parser(), after the cheap checks of run_recipe
    from trl import ModelConfig, TrlParser

    from trl_rm_env.data.regression import RegressionDataArguments
    from trl_rm_env.trainer.config import RegressionRewardConfig


def main(data_args: RegressionDataArguments, training_args: RegressionRewardConfig, model_args: ModelConfig) -> dict:
    from trl_rm_env.recipes import shared_steps as steps

    from trl_rm_env.data.regression import dataset_attributes, mean_baseline_rmse
    from trl_rm_env.trainer import model_flags
    from trl_rm_env.trainer.regression import RegressionRewardTrainer
    from trl_rm_env.trainer.saving import format_regression_table

    resume = steps.start(training_args)  # FSDP on CPU; a missing resume checkpoint fails here, in one line

    # --- data ------------------------------------------------------------------------------------------------
    train_dataset, eval_datasets = data_args.load(training_args.attributes, on_invalid=training_args.on_invalid)
    attributes = training_args.attributes or dataset_attributes(train_dataset)
    if not eval_datasets:
        training_args.eval_strategy = "no"

    # --- model: one output per attribute (built at .../regression_model or in a new folder when asked) ---------
    quantization_config = model_flags.quantization(model_args, training_args)  # --load_in_4bit/8bit: QLoRA, as TRL
    model_path = steps.prepare_model(
        model_args,
        training_args,
        build_tiny=data_args.build_tiny_model,
        kind="regression_model",
        exact_name=False,
        num_labels=len(attributes),
    )

    # --- train -----------------------------------------------------------------------------------------------
    trainer = RegressionRewardTrainer(
        model=model_path,
        args=training_args,
        train_dataset=train_dataset,
        eval_dataset=eval_datasets or None,
        quantization_config=quantization_config,
        peft_config=model_flags.peft_config(model_args),  # LoRA's task: SEQ_CLS
    )
    steps.train(trainer, resume)

    # --- evaluate and save: per set and attribute, beside the RMSE of predicting the training mean -------------
    def table(metrics: dict) -> str:
        baseline = mean_baseline_rmse(train_dataset, eval_datasets, trainer.attributes)
        return format_regression_table(metrics, list(eval_datasets), trainer.attributes, baseline)

    return steps.finish_reward_model(
        trainer,
        training_args.output_dir,
        eval_datasets,
        table=table,
        saved=f"Regression reward model ({', '.join(trainer.attributes)}) saved to {training_args.output_dir}",
    )


def make_parser(prog: str | None = None) -> TrlParser:
    from trl import ModelConfig, TrlParser

    from trl_rm_env.compat import accept_activation_checkpointing  # transformers < 5.20: the old name
    from trl_rm_env.data.regression import RegressionDataArguments
    from trl_rm_env.trainer.config import RegressionRewardConfig

    return accept_activation_checkpointing(TrlParser((RegressionDataArguments, RegressionRewardConfig, ModelConfig), prog=prog))


if __name__ == "__main__":
    from trl_rm_env.errors import run_recipe

    run_recipe(make_parser, main)  # expected errors end in one line (TRL_RM_ENV_DEBUG=1: the traceback)
