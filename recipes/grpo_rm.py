"""GRPO with a reward model as the reward: TRL's `GRPOTrainer` + `RewardModelEnvironment`, and/or a generative judge
(`reward_judge`: `JudgeEnvironment`), weighed by TRL's `reward_weights` in that order. With `reward_per_attribute:
true` a regression RM's attributes are separate rewards (GDPO with `multi_objective_aggregation: normalize_then_sum`).

TRL's AsyncGRPO (`trl.experimental.async_grpo.AsyncGRPOTrainer`: generation overlapped with training) scores in a
spawned process without GPUs: serve the RM on its own GPUs (`trl-rm-env serve --engine vllm --model RM`) and give
AsyncGRPOTrainer `RewardModelEnvironment(remote_url=...)`; docs/environment.md, "AsyncGRPO", and the commented block
in configs/grpo_rm.yaml.

    trl-rm-env grpo --config grpo_rm_tiny.yaml                                         # installed: offline, CPU
    accelerate launch recipes/grpo_rm.py --config recipes/configs/grpo_rm_tiny.yaml   # from a checkout, ~1 min
    accelerate launch recipes/grpo_rm.py --config recipes/configs/grpo_rm.yaml        # Qwen3-0.6B + Skywork-Reward-V2
    accelerate launch --config_file accelerate_configs/zero3.yaml recipes/grpo_rm.py --config recipes/configs/grpo_rm.yaml

Order: set up the reward model, the prompts and the policy; train; save the policy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the heavy imports happen in main()/make_parser(), after the cheap checks of run_recipe
    from trl import GRPOConfig, GRPOTrainer, ModelConfig, TrlParser
    from trl_rm_env.recipes.grpo_args import RewardModelArguments


def main(rm_args: RewardModelArguments, training_args: GRPOConfig, model_args: ModelConfig) -> GRPOTrainer:
    from trl import GRPOTrainer, get_peft_config
    from trl_rm_env.recipes import shared_steps as steps

    from trl_rm_env.data.loaders import load_prompt_dataset
    from trl_rm_env.model_source import check_model_source
    from trl_rm_env.trainer import model_flags
    from trl_rm_env.trainer.checkpoints import with_atomic_checkpoints

    resume = steps.start(training_args)  # FSDP on CPU; a missing resume checkpoint fails here, in one line
    sources = rm_args.reward_sources()  # a bad reward_* value, or a combination that cannot apply, fails here
    if training_args.ddp_find_unused_parameters is None:  # every policy parameter gets a gradient: skip DDP's search
        training_args.ddp_find_unused_parameters = False

    # --- models ----------------------------------------------------------------------------------------------
    quantization_config = model_flags.quantization(model_args)  # the policy: --load_in_4bit/8bit (QLoRA)
    if sources.reward_model is not None and not rm_args.reward_remote_url:  # never a random stand-in RM
        check_model_source(sources.reward_model, "reward model",
                           hint="train it first, e.g. `trl-rm-env train --config rm_tiny.yaml`")  # fmt: skip
    # The untrained tiny policy (and RM) only at a missing .../policy folder; never a stand-in RM.
    policy_path = steps.prepare_model(
        model_args, training_args, build_tiny=rm_args.build_tiny_model, kind="policy", what="policy"
    )
    if sources.judge_options is not None and not rm_args.reward_judge_url:  # after the tiny models are built
        check_model_source(sources.judge, "judge")
    rewards, training_args.reward_weights = sources.build(training_args.reward_weights)

    # --- train -----------------------------------------------------------------------------------------------
    trainer = with_atomic_checkpoints(GRPOTrainer)(  # checkpoints appear complete or not at all
        model=policy_path,
        reward_funcs=rewards,
        args=training_args,
        train_dataset=load_prompt_dataset(rm_args.prompt_data, rm_args.prompt_column),
        quantization_config=quantization_config,
        peft_config=get_peft_config(model_args),
    )
    steps.train(trainer, resume)
    trainer.save_model(training_args.output_dir)
    trainer.save_state()  # trainer_state.json: the full log history (rewards/<name>/mean per step)
    trainer.accelerator.print(f"Policy saved to {training_args.output_dir}")
    trainer.end()
    return trainer


def make_parser(prog: str | None = None) -> TrlParser:
    from trl import GRPOConfig, ModelConfig, TrlParser
    from trl_rm_env.recipes.grpo_args import RewardModelArguments

    from trl_rm_env.compat import accept_activation_checkpointing  # transformers < 5.20: the old name

    return accept_activation_checkpointing(TrlParser((RewardModelArguments, GRPOConfig, ModelConfig), prog=prog))


if __name__ == "__main__":
    from trl_rm_env.errors import run_recipe

    run_recipe(make_parser, main)  # expected errors end in one line (TRL_RM_ENV_DEBUG=1: the traceback)
