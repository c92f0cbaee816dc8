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

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the heavy imports happen in main()/make_parser(), after the cheap checks of run_recipe
    from trl import GRPOConfig, GRPOTrainer, ModelConfig, TrlParser
    from trl_rm_env.recipes.grpo_args import RewardModelArguments


def main(rm_args: RewardModelArguments, training_args: GRPOConfig, model_args: ModelConfig) -> GRPOTrainer:
    from trl import GRPOTrainer, get_peft_config
    from trl_rm_env.recipes import steps

    from trl_rm_env import CascadeReward, JudgeEnvironment, RewardModelEnvironment
    from trl_rm_env.model_source import check_model_source
    from trl_rm_env.options import changed
    from trl_rm_env.trainer.checkpoints import with_atomic_checkpoints

    resume = steps.start(training_args)  # FSDP on CPU; a missing resume checkpoint fails here, in one line
    reward_options = rm_args.environment_kwargs()  # a bad reward_* value fails here, naming its key
    judge_options = rm_args.judge_kwargs()  # ... and a bad reward_judge_* value
    with_rm = rm_args.reward_model is not None or bool(rm_args.reward_remote_url)  # served: the server's own model
    if not with_rm and judge_options is None:
        raise ValueError("reward_model is null and no reward_judge is given: GRPO needs a reward source")
    others = {name: value for name, value in reward_options.items() if name != "options"}
    given = sorted([*changed(reward_options["options"]), *(n for n, v in others.items() if n != "tokenizer" or v)])
    if not with_rm and given:
        raise ValueError(f"reward_model is null (no reward model), but options of one are given: {', '.join(given)}")
    margin = rm_args.reward_cascade_margin
    if margin is not None and not (math.isfinite(margin) and margin > 0):
        raise ValueError(f"reward_cascade_margin must be > 0, got {margin}")
    if margin is not None and not (with_rm and judge_options is not None):
        raise ValueError("reward_cascade_margin routes between a reward model and a judge: give reward_judge and a "
                         "reward model (reward_model or reward_remote_url)")
    if margin is not None and rm_args.reward_per_attribute:
        raise ValueError("reward_cascade_margin routes one reward model's rewards; reward_per_attribute splits them")
    if training_args.ddp_find_unused_parameters is None:  # every policy parameter gets a gradient: skip DDP's search
        training_args.ddp_find_unused_parameters = False

    # --- models ----------------------------------------------------------------------------------------------
    quantization_config = steps.quantization(model_args)  # the policy: --load_in_4bit/8bit with --use_peft (QLoRA)
    if rm_args.reward_model is not None and not rm_args.reward_remote_url:  # never a random stand-in RM
        check_model_source(
            rm_args.reward_model,
            "reward model",
            hint="train it first, e.g. `trl-rm-env train --config rm_tiny.yaml`",
        )
    # The untrained tiny policy (and RM) only at a missing .../policy folder; never a stand-in RM.
    policy_path = steps.prepare_model(
        model_args, training_args, build_tiny=rm_args.build_tiny_model, kind="policy", what="policy"
    )
    if judge_options is not None and not rm_args.reward_judge_url:  # after the tiny models are built, if asked
        check_model_source(rm_args.reward_judge, "judge")
    rewards, weights = [], []
    if with_rm:
        environment = RewardModelEnvironment(rm_args.reward_model, **reward_options)
        if rm_args.reward_per_attribute:  # GDPO: each attribute normalized within its group on its own
            rewards += environment.attribute_rewards()
            weights += environment.attribute_weights or [1.0] * len(rewards)
        else:
            rewards.append(environment)
            weights.append(1.0)
    elif rm_args.reward_per_attribute:
        raise ValueError("reward_per_attribute needs a reward model (reward_model is null)")
    if judge_options is not None:
        judge = JudgeEnvironment(rm_args.reward_judge, **judge_options)
        if margin is not None:  # one reward: the RM where it separates a group, else the judge
            rewards = [CascadeReward([rewards[0], judge], margin=margin)]
        else:
            rewards.append(judge)
            weights.append(1.0)
    if rm_args.reward_per_attribute and training_args.reward_weights is None:
        training_args.reward_weights = weights  # the model's own attribute weights (TRL's default: all 1)
    given_weights = training_args.reward_weights
    if given_weights is not None and len(given_weights) != len(rewards):  # in our words, before TRL's message
        built = ("one reward (reward_cascade_margin: the reward model's where it separates a group, else the "
                 "judge's)" if margin is not None else f"{len(rewards)} reward function(s)")
        raise ValueError(f"reward_weights has {len(given_weights)} weight(s) but the recipe builds {built}: give "
                         f"{len(rewards)} weight(s) or drop reward_weights")

    # --- data ------------------------------------------------------------------------------------------------
    prompts = rm_args.load_prompts()

    # --- train -----------------------------------------------------------------------------------------------
    trainer = with_atomic_checkpoints(GRPOTrainer)(  # checkpoints appear complete or not at all
        model=policy_path,
        reward_funcs=rewards,
        args=training_args,
        train_dataset=prompts,
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
