"""TRL's reward script (`trl/scripts/reward.py`, TRL 1.16) with one line changed: the `RewardTrainer` import.

Used by `tests/test_trl_dropin.py` to show that an existing TRL reward script runs on `RankedRewardTrainer`.
Run: python tests/scripts/trl_reward_script.py --model_name_or_path DIR --dataset_name DATA_DIR --output_dir OUT ...
"""

import argparse


def main(script_args, training_args, model_args, dataset_args):
    import transformers
    from accelerate.logging import get_logger
    from datasets import load_dataset
    from packaging.version import Version
    from trl import get_dataset, get_peft_config, get_quantization_config

    from trl_rm_env import RankedRewardTrainer as RewardTrainer  # the only change: was `from trl import RewardTrainer`

    logger = get_logger(__name__)

    model_init_kwargs = dict(
        revision=model_args.model_revision,
        trust_remote_code=training_args.trust_remote_code,
        attn_implementation=model_args.attn_implementation,
        dtype=model_args.dtype,
    )
    if training_args.model_init_kwargs is not None:
        model_init_kwargs.update(training_args.model_init_kwargs)
    training_args.model_init_kwargs = model_init_kwargs

    if dataset_args.datasets and script_args.dataset_name:
        logger.warning("Both `datasets` and `dataset_name` are provided: `datasets` is used.")
        dataset = get_dataset(dataset_args)
    elif dataset_args.datasets and not script_args.dataset_name:
        dataset = get_dataset(dataset_args)
    elif not dataset_args.datasets and script_args.dataset_name:
        dataset = load_dataset(
            script_args.dataset_name, name=script_args.dataset_config, streaming=script_args.dataset_streaming
        )
    else:
        raise ValueError("Either `datasets` or `dataset_name` must be provided.")

    trainer = RewardTrainer(
        model=model_args.model_name_or_path,
        args=training_args,
        train_dataset=dataset[script_args.dataset_train_split],
        eval_dataset=dataset[script_args.dataset_test_split] if training_args.eval_strategy != "no" else None,
        quantization_config=get_quantization_config(model_args),
        peft_config=get_peft_config(model_args),
    )

    trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
    trainer.accelerator.print("Training completed.")

    trainer.save_model(training_args.output_dir)
    trainer.accelerator.print(f"Model saved to {training_args.output_dir}.")

    if training_args.push_to_hub:
        trainer.push_to_hub(dataset_name=script_args.dataset_name)

    if Version(transformers.__version__) >= Version("5.18.0"):
        trainer.end()


def make_parser(subparsers: argparse._SubParsersAction | None = None, prog: str | None = None):
    from trl import DatasetMixtureConfig, ModelConfig, RewardConfig, ScriptArguments, TrlParser

    dataclass_types = (ScriptArguments, RewardConfig, ModelConfig, DatasetMixtureConfig)
    if subparsers is not None:
        parser = subparsers.add_parser("reward", help="Run the reward training script", dataclass_types=dataclass_types)
    else:
        parser = TrlParser(dataclass_types, prog=prog)
    return parser


if __name__ == "__main__":
    parser = make_parser()
    script_args, training_args, model_args, dataset_args = parser.parse_args_and_config(fail_with_unknown_args=False)
    main(script_args, training_args, model_args, dataset_args)
