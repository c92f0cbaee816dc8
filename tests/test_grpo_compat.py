"""GRPO drop-in compatibility: TRL's reward-model cases of its GRPO tests, with `RewardModelEnvironment`.

TRL's ``GRPOTrainer`` takes a reward model as ``reward_funcs`` (a Hub id or path, a loaded
``*ForSequenceClassification``, or a mix with plain functions, with ``reward_processing_classes`` and
``reward_weights``). Each case below runs twice: once with TRL's own model-reward path (``source="model"``) and once
with ``RewardModelEnvironment`` in the model's place (``source="env"``); where both run the same policy and seed, the
rewards they log are compared (the environment must score exactly like TRL's path, within 1e-4 in fp32).

Cases learned from ``tests/test_grpo_trainer.py`` of huggingface/trl at commit
``f2cd57710ae345ea6428ae95363267fcf38a3dc8`` (2026-07-24); the code here is our own. Offline: the tiny Qwen3 policy and
reward model of ``trl_rm_env.tiny_models.make_tiny`` (fixture ``tiny_dir``) replace ``trl-internal-testing/*`` models,
and small local prompt-only datasets replace ``trl-internal-testing/zen``. One optimizer step, 4-token completions.

==========================================================  ===========================================================
TRL ``tests/test_grpo_trainer.py`` (reward-model cases)     here (each x ``model`` / ``env``)
==========================================================  ===========================================================
test_init_minimal                                           test_init_minimal
test_train[policy architectures] (RM id as reward)          test_train_dataset_format[standard_prompt_only] (the RM
                                                              side is the same for every policy; one tiny policy)
test_train_dataset_format[standard, conversational]         test_train_dataset_format[2 configs] (+ reward parity)
test_train_with_eval                                        test_train_with_eval
test_train_different_reward_model                           test_train_different_reward_model
test_train_multiple_mixed_reward_funcs                      test_mixed_reward_funcs
test_train_multiple_reward_funcs_with_weights               test_reward_weights_logged_per_func
test_reward_metric_reflects_reward_weights[2 aggregations]  test_reward_metric_is_weighted[2 aggregations]
test_mismatched_reward_processing_classes_length            test_processing_classes_length_mismatch
test_correct_reward_processing_classes_list                 test_processing_classes_list
test_single_reward_model_with_single_processing_class       test_single_processing_class
==========================================================  ===========================================================
"""

from __future__ import annotations

import functools
import math
import statistics
from pathlib import Path
from typing import Any

import pytest
import torch
from datasets import Dataset, DatasetDict
from helpers import grpo_config, record_scored_batches
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from trl_rm_env import RewardModelEnvironment

QUESTIONS = ["Name a color.", "Count to three.", "Say hello.", "Name a fruit.", "What is one plus one?", "Spell cat."]
STANDARD_PROMPTS = ["The sky is", "My favorite fruit is", "One plus one is", "Cats like", "The sea is", "Bread is"]

RM_NAME = "reward_model"  # TRL names a model reward by its folder; the environment gets the same name


def prompt_only(config: str) -> Dataset:
    if config == "standard_prompt_only":
        return Dataset.from_list([{"prompt": p} for p in STANDARD_PROMPTS])
    return Dataset.from_list([{"prompt": [{"role": "user", "content": q}]} for q in QUESTIONS])


def grpo_args(tmp_path: Path, **overrides):
    values: dict[str, Any] = dict(
        learning_rate=0.1, per_device_train_batch_size=3, num_generations=3, max_completion_length=4
    )
    return grpo_config(tmp_path, **{**values, **overrides})


def reward_source(source: str, tiny_dir: Path, **env_kwargs):
    """TRL's own model reward (the folder path) or the environment built from the same folder."""
    path = tiny_dir / "reward_model"
    if source == "model":
        return str(path)
    return RewardModelEnvironment(path, name=RM_NAME, device="cpu", **env_kwargs)


def length_reward(completions, **kwargs) -> list[float]:
    """A plain reward function: longer completions are better."""
    return [float(len(str(c))) for c in completions]


def constant_one(completions, **kwargs) -> list[float]:
    return [1.0] * len(completions)


def train_and_check(trainer) -> dict[str, float]:
    """One GRPO step: a finite loss, every policy parameter moved; returns the step's log row."""
    before = {name: p.detach().clone() for name, p in trainer.model.named_parameters()}
    trainer.train()
    assert math.isfinite(trainer.state.log_history[-1]["train_loss"])
    frozen = [name for name, old in before.items() if torch.equal(old, trainer.model.get_parameter(name))]
    assert not frozen, f"policy parameters not updated: {frozen}"
    return next(row for row in trainer.state.log_history if f"rewards/{RM_NAME}/mean" in row)


SOURCES = ["model", "env"]
# TRL's own path alone (no environment in the case): in the full suite
TRL_ALONE_SLOW = [pytest.param("model", marks=pytest.mark.slow), "env"]


@pytest.mark.parametrize("source", SOURCES)
def test_init_minimal(tiny_dir, tmp_path, source):
    from trl import GRPOTrainer

    trainer = GRPOTrainer(
        model=str(tiny_dir / "policy"),
        reward_funcs=reward_source(source, tiny_dir),
        args=grpo_args(tmp_path),
        train_dataset=prompt_only("standard_prompt_only"),
    )
    assert trainer.reward_func_names == [RM_NAME]


def reference_score(model, tokenizer, prompt, completion, add_eos: bool) -> float:
    """One sample through the plain model: the chat template for messages, `prompt + completion` for text."""
    if isinstance(prompt, str):
        text = prompt + completion
        if add_eos and not text.endswith(tokenizer.eos_token):
            text += tokenizer.eos_token
    else:
        text = tokenizer.apply_chat_template(prompt + completion, tokenize=False)
    ids = tokenizer(text, return_tensors="pt", add_special_tokens=False)
    with torch.no_grad():
        return model(**ids).logits[0, 0].item()


@functools.cache
def plain_reward_model(path: Path):
    """The reward model folder loaded with transformers alone (fp32, eval), and its tokenizer."""
    model = AutoModelForSequenceClassification.from_pretrained(path, dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(path)


def check_logged_rewards(row, batch, name, want) -> None:
    """A reward function's logged `rewards/<name>/mean` and `/std` (TRL: the batch's mean and Bessel-corrected std)
    equal those of `want`, the values computed outside our code for the batch's completions (`batch`: one of
    `record_scored_batches`), and TRL's per-sample rewards equal `want` (1e-4: fp32 forwards)."""
    assert batch["rewards"][name] == pytest.approx(want, abs=1e-4), name
    assert row[f"rewards/{name}/mean"] == pytest.approx(statistics.fmean(want), abs=1e-4), name
    assert row[f"rewards/{name}/std"] == pytest.approx(statistics.stdev(want), abs=1e-4), name


def lengths(batch) -> list[float]:
    """`length_reward` worked out from the logged completions (plain text here): their lengths in characters."""
    assert all(isinstance(c, str) for c in batch["completion"])
    return [float(len(c)) for c in batch["completion"]]


def rm_rewards(batch, source: str, tiny_dir: Path) -> list[float]:
    """The tiny reward model's plain forward on each logged sample, scored as each source documents it (the
    environment appends EOS to plain text, TRL's model path does not; messages: the chat template)."""
    model, tokenizer = plain_reward_model(tiny_dir / "reward_model")
    add_eos = source == "env"
    return [reference_score(model, tokenizer, p, c, add_eos) for p, c in zip(batch["prompt"], batch["completion"])]


@pytest.mark.slow
@pytest.mark.parametrize("config", ["standard_prompt_only", "conversational_prompt_only"])
def test_train_dataset_format(tiny_dir, tmp_path, config):
    """Both reward sources train the policy; per sample, each scores as documented.

    Conversational data: the environment's reward equals TRL's model reward (same rendering). Plain text: TRL's GRPO
    path scores `prompt + completion` as is, while the environment appends the EOS token as TRL's `RewardTrainer`
    does when it trains on text (so a reward model is scored the way it was trained): a documented difference.
    """
    from trl import GRPOTrainer

    path = tiny_dir / "reward_model"
    model = AutoModelForSequenceClassification.from_pretrained(path, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(path)
    samples = {}
    for source in SOURCES:
        trainer = GRPOTrainer(
            model=str(tiny_dir / "policy"),
            reward_funcs=reward_source(source, tiny_dir),
            args=grpo_args(tmp_path / source),
            train_dataset=prompt_only(config),
        )
        train_and_check(trainer)
        logs = trainer._logs  # TRL keeps each step's prompts, completions and per-function rewards here
        samples[source] = (list(logs["prompt"]), list(logs["completion"]), list(logs["rewards"][RM_NAME]))
    # Same policy and seed: the same generations, so the rewards can be compared sample by sample.
    assert samples["env"][:2] == samples["model"][:2]
    prompts, completions, _ = samples["model"]
    assert len(prompts) == 3
    for source in SOURCES:
        add_eos = source == "env"
        want = [reference_score(model, tokenizer, p, c, add_eos) for p, c in zip(prompts, completions)]
        torch.testing.assert_close(torch.tensor(samples[source][2]), torch.tensor(want), atol=1e-4, rtol=0)
    if config == "conversational_prompt_only":
        torch.testing.assert_close(
            torch.tensor(samples["env"][2]), torch.tensor(samples["model"][2]), atol=1e-4, rtol=0
        )


@pytest.mark.slow
@pytest.mark.parametrize("source", SOURCES)
def test_train_with_eval(tiny_dir, tmp_path, source):
    """The evaluation's logged `eval_rewards/<name>/mean` is the mean over its batches of the plain reward model's
    forwards on the completions TRL generated for them (recorded from TRL's own completion logs)."""
    from trl import GRPOTrainer

    data = prompt_only("conversational_prompt_only")
    splits = DatasetDict({"train": data, "test": data.select(range(3))})
    args = grpo_args(tmp_path, eval_strategy="steps", eval_steps=1, per_device_eval_batch_size=3)
    trainer = GRPOTrainer(
        model=str(tiny_dir / "policy"),
        reward_funcs=reward_source(source, tiny_dir),
        args=args,
        train_dataset=splits["train"],
        eval_dataset=splits["test"],
    )
    batches = record_scored_batches(trainer)
    trainer.train()
    evals = [row for row in trainer.state.log_history if "eval_loss" in row]
    assert len(evals) == 1, "one evaluation, after the one step"
    scored = [batch for batch in batches if batch["mode"] == "eval"]
    assert len(scored) == 3  # 3 prompts x 3 generations, 3 samples an evaluation batch
    # TRL logs the mean over the evaluation batches of each batch's mean reward: here from the plain model's forwards.
    wants = [rm_rewards(batch, source, tiny_dir) for batch in scored]
    for batch, want in zip(scored, wants):
        assert batch["rewards"][RM_NAME] == pytest.approx(want, abs=1e-4)  # each sample's, in order
    mean = statistics.fmean(statistics.fmean(want) for want in wants)
    assert evals[0][f"eval_rewards/{RM_NAME}/mean"] == pytest.approx(mean, abs=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("source", SOURCES)
def test_train_different_reward_model(tmp_path, source, other_vocab_tokenizer, tiny_dir):
    """The reward model has its own tokenizer (another vocabulary) and is passed as a loaded model; the logged reward
    mean and std are those of the plain model's forwards on the step's completions rendered with its tokenizer."""
    from trl import GRPOTrainer

    from trl_rm_env.tiny_models import build_tiny_reward_model

    reward_model = build_tiny_reward_model(other_vocab_tokenizer, seed=3)
    reward_model.config._name_or_path = RM_NAME
    kwargs: dict[str, Any] = {}
    if source == "model":
        reward, kwargs["reward_processing_classes"] = reward_model, other_vocab_tokenizer
    else:
        reward = RewardModelEnvironment(reward_model, other_vocab_tokenizer, name=RM_NAME, device="cpu")
    trainer = GRPOTrainer(
        model=str(tiny_dir / "policy"),
        reward_funcs=reward,
        args=grpo_args(tmp_path),
        train_dataset=prompt_only("conversational_prompt_only"),
        **kwargs,
    )
    batches = record_scored_batches(trainer)
    row = train_and_check(trainer)
    (batch,) = batches
    # The policy's completions, re-read by the reward model's own tokenizer: its chat template, its vocabulary.
    want = [reference_score(reward_model.eval(), other_vocab_tokenizer, p, c, add_eos=False)
            for p, c in zip(batch["prompt"], batch["completion"])]  # fmt: skip
    check_logged_rewards(row, batch, RM_NAME, want)


@pytest.mark.slow
@pytest.mark.parametrize("source", SOURCES)
def test_mixed_reward_funcs(tiny_dir, tmp_path, source):
    """A plain function beside the reward model: each one's logged mean and std are its own values on the step's
    completions (the lengths; the plain model's forwards)."""
    from trl import GRPOTrainer

    trainer = GRPOTrainer(
        model=str(tiny_dir / "policy"),
        reward_funcs=[length_reward, reward_source(source, tiny_dir)],
        args=grpo_args(tmp_path),
        train_dataset=prompt_only("standard_prompt_only"),
    )
    batches = record_scored_batches(trainer)
    row = train_and_check(trainer)
    (batch,) = batches
    check_logged_rewards(row, batch, "length_reward", lengths(batch))
    check_logged_rewards(row, batch, RM_NAME, rm_rewards(batch, source, tiny_dir))


@pytest.mark.parametrize("source", TRL_ALONE_SLOW)
def test_reward_weights_logged_per_func(tiny_dir, tmp_path, source):
    """With weights, each function's mean and std are logged unweighted (its own values on the step's completions)
    and `reward` is the mean of the weighted sum."""
    from trl import GRPOTrainer

    trainer = GRPOTrainer(
        model=str(tiny_dir / "policy"),
        reward_funcs=[reward_source(source, tiny_dir), length_reward],
        args=grpo_args(tmp_path, reward_weights=[0.7, 0.3]),
        train_dataset=prompt_only("standard_prompt_only"),
    )
    batches = record_scored_batches(trainer)
    row = train_and_check(trainer)
    (batch,) = batches
    rm, length = rm_rewards(batch, source, tiny_dir), lengths(batch)
    check_logged_rewards(row, batch, RM_NAME, rm)  # each function's own, unweighted
    check_logged_rewards(row, batch, "length_reward", length)
    weighted = [0.7 * a + 0.3 * b for a, b in zip(rm, length)]
    assert row["reward"] == pytest.approx(statistics.fmean(weighted), abs=1e-4)  # the weighted sum's mean


@pytest.mark.slow
@pytest.mark.parametrize("aggregation", ["sum_then_normalize", "normalize_then_sum"])
@pytest.mark.parametrize("source", SOURCES)
def test_reward_metric_is_weighted(tiny_dir, tmp_path, source, aggregation):
    from trl import GRPOTrainer

    args = grpo_args(tmp_path, reward_weights=[0.7, 0.3], multi_objective_aggregation=aggregation)
    trainer = GRPOTrainer(
        model=str(tiny_dir / "policy"),
        reward_funcs=[reward_source(source, tiny_dir), constant_one],
        args=args,
        train_dataset=prompt_only("standard_prompt_only"),
    )
    trainer.train()
    row = next(row for row in trainer.state.log_history if "reward" in row)
    # The logged reward is the weighted sum: 0.7 * (reward model's mean) + 0.3 * 1.
    assert row["reward"] == pytest.approx(0.7 * row[f"rewards/{RM_NAME}/mean"] + 0.3, abs=1e-5)


@pytest.mark.parametrize("source", TRL_ALONE_SLOW)
def test_processing_classes_length_mismatch(tiny_dir, tmp_path, source):
    from trl import GRPOTrainer

    tokenizer = AutoTokenizer.from_pretrained(tiny_dir / "reward_model")
    with pytest.raises(ValueError, match="must match"):
        GRPOTrainer(
            model=str(tiny_dir / "policy"),
            reward_funcs=[reward_source(source, tiny_dir), reward_source(source, tiny_dir)],
            reward_processing_classes=tokenizer,
            args=grpo_args(tmp_path),
            train_dataset=prompt_only("standard_prompt_only"),
        )


@pytest.mark.parametrize("source", TRL_ALONE_SLOW)
def test_processing_classes_list(tiny_dir, tmp_path, source):
    """Two rewards, a processing class for each; the environment's slot is not used (it has its own tokenizer)."""
    from trl import GRPOTrainer

    tokenizers = [AutoTokenizer.from_pretrained(tiny_dir / "reward_model") for _ in range(2)]
    second = str(tiny_dir / "reward_model")
    trainer = GRPOTrainer(
        model=str(tiny_dir / "policy"),
        reward_funcs=[reward_source(source, tiny_dir), second],
        reward_processing_classes=tokenizers,
        args=grpo_args(tmp_path),
        train_dataset=prompt_only("standard_prompt_only"),
    )
    assert len(trainer.reward_processing_classes) == 2
    assert trainer.reward_processing_classes[1] is tokenizers[1]


@pytest.mark.parametrize("source", TRL_ALONE_SLOW)
def test_single_processing_class(tiny_dir, tmp_path, source):
    from trl import GRPOTrainer

    tokenizer = AutoTokenizer.from_pretrained(tiny_dir / "reward_model")
    trainer = GRPOTrainer(
        model=str(tiny_dir / "policy"),
        reward_funcs=reward_source(source, tiny_dir),
        reward_processing_classes=tokenizer,
        args=grpo_args(tmp_path),
        train_dataset=prompt_only("standard_prompt_only"),
    )
    assert trainer.reward_processing_classes == [tokenizer]


@pytest.mark.slow
def test_loaded_model_rewards_equal_environment(tiny_dir, tmp_path):
    """TRL's path with a loaded model object and the environment built from that object log the same rewards."""
    from trl import GRPOTrainer

    path = tiny_dir / "reward_model"
    logs = {}
    for source in SOURCES:
        model = AutoModelForSequenceClassification.from_pretrained(path, dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(path)
        model.config._name_or_path = RM_NAME
        kwargs: dict[str, Any] = {}
        if source == "model":
            reward, kwargs["reward_processing_classes"] = model, tokenizer
        else:
            reward = RewardModelEnvironment(model, tokenizer, name=RM_NAME, device="cpu")
        trainer = GRPOTrainer(
            model=str(tiny_dir / "policy"),
            reward_funcs=reward,
            args=grpo_args(tmp_path / source),
            train_dataset=prompt_only("conversational_prompt_only"),
            **kwargs,
        )
        logs[source] = train_and_check(trainer)
    for stat in ("mean", "std"):
        key = f"rewards/{RM_NAME}/{stat}"
        assert logs["env"][key] == pytest.approx(logs["model"][key], abs=1e-4), key
