"""GRPO with a reward model as the reward: TRL's `GRPOTrainer` + `RewardModelEnvironment`.

    accelerate launch recipes/grpo_rm.py --config recipes/configs/grpo_rm_tiny.yaml   # offline, CPU, ~1 min
    accelerate launch recipes/grpo_rm.py --config recipes/configs/grpo_rm.yaml        # Qwen3-0.6B + Skywork-Reward-V2
    accelerate launch --config_file accelerate_configs/zero3.yaml recipes/grpo_rm.py --config recipes/configs/grpo_rm.yaml

Order: set up the reward model, the prompts and the policy; train; save the policy.
"""

from __future__ import annotations

import argparse
import os

from trl import GRPOConfig, GRPOTrainer, ModelConfig, TrlParser, get_peft_config

from trl_rm_env import RewardModelEnvironment
from trl_rm_env.distributed import describe_sharding, enable_fsdp_on_cpu
from trl_rm_env.grpo_args import RewardModelArguments
from trl_rm_env.trainer.saving import check_distributed_setup


def main(rm_args: RewardModelArguments, training_args: GRPOConfig, model_args: ModelConfig) -> GRPOTrainer:
    from accelerate import PartialState

    enable_fsdp_on_cpu()  # an FSDP accelerate config shards on CPU too (accelerate alone falls back to DDP there)

    # --- models ----------------------------------------------------------------------------------------------
    policy_path = model_args.model_name_or_path
    if rm_args.build_tiny_model:
        with PartialState().main_process_first():
            if not os.path.exists(policy_path):
                from trl_rm_env.testing import make_tiny

                make_tiny(os.path.dirname(os.path.normpath(policy_path)) or ".")
        if not rm_args.reward_remote_url and not os.path.exists(rm_args.reward_model):  # the quickstart RM was not trained: use the untrained one
            fallback = os.path.join(os.path.dirname(os.path.normpath(policy_path)), "reward_model")
            PartialState().print(f"{rm_args.reward_model} not found; using the untrained tiny RM {fallback}")
            rm_args.reward_model = fallback
    reward = RewardModelEnvironment(rm_args.reward_model, **rm_args.environment_kwargs())
    training_args.model_init_kwargs = {
        k: v
        for k, v in dict(
            revision=model_args.model_revision, attn_implementation=model_args.attn_implementation, dtype=model_args.dtype
        ).items()
        if v is not None
    } | (training_args.model_init_kwargs or {})

    # --- data ------------------------------------------------------------------------------------------------
    prompts = rm_args.load_prompts()

    # --- train -----------------------------------------------------------------------------------------------
    trainer = GRPOTrainer(
        model=policy_path,
        reward_funcs=[reward],
        args=training_args,
        train_dataset=prompts,
        peft_config=get_peft_config(model_args),
    )
    trainer.accelerator.print(check_distributed_setup(trainer.accelerator))
    trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
    trainer.accelerator.print(describe_sharding(trainer.model))  # ZeRO-3 / FSDP: about 1/processes
    trainer.save_model(training_args.output_dir)
    trainer.save_state()  # trainer_state.json: the full log history (rewards/<name>/mean per step)
    trainer.accelerator.print(f"Policy saved to {training_args.output_dir}")
    trainer.end()
    return trainer


def make_parser(subparsers: argparse._SubParsersAction | None = None) -> TrlParser:
    dataclass_types = (RewardModelArguments, GRPOConfig, ModelConfig)
    if subparsers is not None:
        return subparsers.add_parser("grpo-rm", help="GRPO with a reward model", dataclass_types=dataclass_types)
    return TrlParser(dataclass_types)


if __name__ == "__main__":
    rm_args, training_args, model_args = make_parser().parse_args_and_config()
    main(rm_args, training_args, model_args)
