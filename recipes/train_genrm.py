"""Train a generative reward model (GenRM) from ranked preference data with GRPO: the model reads two responses in
NeMo Gym's `genrm_compare` protocol, writes a JSON verdict, and is rewarded when the verdict agrees with the human
order (docs/genrm_training.md).

    trl-rm-env train-genrm --config genrm_tiny.yaml                                        # installed: offline, CPU
    accelerate launch recipes/train_genrm.py --config recipes/configs/genrm_tiny.yaml     # from a checkout
    accelerate launch --config_file accelerate_configs/zero3.yaml recipes/train_genrm.py --config recipes/configs/genrm.yaml

Order: the run's settings checked and the comparisons loaded (every source we read, each pair in both orders, ties as
tie targets: a bad file fails before any model loads), the model and its chat template (the protocol's roles), an
optional supervised warm start (TRL's `SFTTrainer` on the target verdicts), GRPO (TRL's `GRPOTrainer`,
`genrm_agreement` + `genrm_format`), the model saved with its tokenizer, and the held-out evaluation (pairwise
accuracy, position consistency, failed verdicts, listwise Kendall tau) written to `genrm_eval.json`. The saved model
is a `JudgeEnvironment(mode="genrm")` judge as it is. The steps are `trl_rm_env.trainer.genrm_training`'s.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the heavy imports happen in main()/make_parser(), after the cheap checks of run_recipe
    from trl import GRPOConfig, ModelConfig, TrlParser

    from trl_rm_env.trainer.genrm_training import GenRMArguments


def main(genrm_args: GenRMArguments, training_args: GRPOConfig, model_args: ModelConfig) -> dict[str, Any]:
    from accelerate import PartialState
    from datasets import Dataset
    from trl import GRPOTrainer, get_peft_config
    from trl_rm_env.recipes import shared_steps as steps

    from trl_rm_env.trainer import genrm_training as genrm
    from trl_rm_env.trainer.checkpoints import with_atomic_checkpoints

    resume = steps.start(training_args)  # FSDP on CPU; a missing resume checkpoint fails here, in one line
    rewards = genrm.check_run(genrm_args, training_args)  # what cannot apply is refused before anything loads
    comparisons, counts, eval_sets = genrm.load_comparisons(genrm_args, training_args.seed)

    # --- model and its template (the protocol's roles, or the built-in template saved with the model) ---------
    model_path = steps.prepare_model(
        model_args, training_args, build_tiny=genrm_args.build_tiny_model, kind="policy", what="GenRM base model"
    )
    tokenizer, template = genrm.genrm_tokenizer(model_path, genrm_args, model_args.model_revision)
    PartialState().print(genrm.describe(counts, template))
    results: dict[str, Any] = {}
    at_start = genrm_args.eval_at_start and bool(eval_sets)  # one process (check_run): no process group to wait on
    if at_start:
        results["start"] = genrm.evaluate_genrm(model_path, tokenizer, eval_sets, training_args, "start")

    # --- warm start: supervised verdicts, when the base model cannot yet write them -----------------------------
    if genrm_args.warm_start_steps and resume is None:  # resumed: the checkpoint holds the weights GRPO goes on from
        model_path = genrm.warm_start(model_path, tokenizer, comparisons, genrm_args, training_args, model_args)
        if at_start:
            results["warm_start"] = genrm.evaluate_genrm(model_path, None, eval_sets, training_args, "warm_start")

    # --- GRPO -------------------------------------------------------------------------------------------------
    trainer = with_atomic_checkpoints(GRPOTrainer)(  # checkpoints appear complete or not at all
        model=model_path, reward_funcs=rewards, args=training_args, train_dataset=Dataset.from_list(comparisons),
        processing_class=tokenizer, peft_config=get_peft_config(model_args),
    )  # fmt: skip
    steps.train(trainer, resume)
    trainer.save_model(training_args.output_dir)  # the tokenizer too, with the template the GenRM was trained on
    trainer.save_state()
    trainer.accelerator.wait_for_everyone()
    trainer.accelerator.print(f"GenRM saved to {training_args.output_dir}")
    main_process = trainer.accelerator.is_main_process
    trainer.end()  # the process group ends here: the other processes are done, none waits on the evaluation

    # --- held-out evaluation on the main process, as `trl-rm-env eval --judge-mode genrm` ---------------------
    if eval_sets and main_process:
        del trainer
        results["final"] = genrm.evaluate_after_training(training_args.output_dir, eval_sets, training_args)
    return results


def make_parser(prog: str | None = None) -> TrlParser:
    from trl import GRPOConfig, ModelConfig, TrlParser

    from trl_rm_env.compat import accept_activation_checkpointing  # transformers < 5.20: the old name
    from trl_rm_env.trainer.genrm_training import GenRMArguments

    return accept_activation_checkpointing(TrlParser((GenRMArguments, GRPOConfig, ModelConfig), prog=prog))


if __name__ == "__main__":
    from trl_rm_env.errors import run_recipe

    run_recipe(make_parser, main)  # expected errors end in one line (TRL_RM_ENV_DEBUG=1: the traceback)
