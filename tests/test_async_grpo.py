"""TRL's newest GRPO paths with our reward functions.

AsyncGRPO (`trl.experimental.async_grpo`) pickles `reward_funcs` into a spawned child with `CUDA_VISIBLE_DEVICES=""`
and scores each group with `_AsyncRolloutLoop._score_group`: async callables awaited, sync ones in
`asyncio.to_thread`, all groups concurrently. The test reproduces that contract with TRL's own code (its child-env
scrub, `get_callable_name`, `is_async_callable` and `_score_group`, driven on CPU) against a real `trl-rm-env serve`,
and with a local environment, which must pickle small and reload in the child.

GDPO: `RewardModelEnvironment.attribute_rewards()` in a real `GRPOTrainer` step with `reward_weights` and
`multi_objective_aggregation="normalize_then_sum"`: one forward per batch, TRL's per-attribute means equal to local
scoring, and its advantages equal to a reference computed here from those columns.
"""

from __future__ import annotations

import pickle

import pytest
import torch
from helpers import ASYNC_GRPO_GROUPS as GROUPS
from helpers import ServerProcess, score_like_async_grpo

from trl_rm_env import JudgeEnvironment, RewardModelEnvironment

pytestmark = pytest.mark.slow  # end to end: trainers, servers or spawned processes (`-m "not slow"` skips them)


def local_rewards(env) -> list[list[float]]:
    return [env([prompt] * len(answers), [[{"role": "assistant", "content": a}] for a in answers])
            for prompt, answers in GROUPS]  # fmt: skip


def test_async_grpo_contract_remote_and_local_environments(tiny_dir):
    rm = str(tiny_dir / "reward_model")
    local = RewardModelEnvironment(rm, name="local_rm")
    judge = JudgeEnvironment(str(tiny_dir / "policy"), name="judge", engine="hf")
    want = local_rewards(local)
    want_judge = local_rewards(judge)
    server = ServerProcess(rm)
    try:
        url = server.wait()
        remote = RewardModelEnvironment("reward_model", tokenizer=rm, remote_url=url, name="remote_rm")
        sizes = {f.__name__: len(pickle.dumps(f)) for f in (local, remote, judge)}
        assert max(sizes.values()) < 8192, sizes  # construction arguments, not weights (the tiny RM is 1.6 MB)
        result = score_like_async_grpo([remote, local, judge])
    finally:
        server.stop()
    assert result["async"] == [True, False, False] and result["cuda"] is False
    for g, metrics in enumerate(result["metrics"]):
        for name, reference in (("remote_rm", want), ("local_rm", want), ("judge", want_judge)):
            got = [m[f"rewards/{name}"] for m in metrics]
            torch.testing.assert_close(torch.tensor(got), torch.tensor(reference[g]), atol=1e-4, rtol=0)


def test_a_model_object_refuses_to_pickle_and_copy_shares_the_model(tiny_rm, tiny_tokenizer, tiny_dir):
    import copy

    env = RewardModelEnvironment(tiny_rm, tiny_tokenizer)
    with pytest.raises(TypeError, match="built from a loaded model.*path or Hub id.*remote_url"):
        pickle.dumps(env)
    shallow = copy.copy(env)  # as before: the same model, nothing loaded again
    assert shallow.model is env.model and shallow.scorer is env.scorer
    judge = JudgeEnvironment(str(tiny_dir / "policy"), engine="hf")
    pairwise = pickle.loads(pickle.dumps(judge.replace(mode="pairwise", name="pairwise_judge")))
    assert pairwise.__name__ == "pairwise_judge" and pairwise.options.mode == "pairwise"


def test_unpickled_local_environment_built_for_a_gpu_warns_once_and_runs_on_cpu(tiny_dir, caplog, monkeypatch):
    from trl_rm_env.rewards import pickling
    from trl_rm_env.runtime.model_options import ScoringOptions

    monkeypatch.setattr(pickling, "_available", lambda device_type: device_type == "cpu")  # a child without GPUs
    monkeypatch.setattr(pickling, "_warned", set())
    env = RewardModelEnvironment(str(tiny_dir / "reward_model"), name="gpu_rm", normalization="running")
    local_rewards(env)  # running statistics, carried over by pickling
    env._built_on = "cuda"  # as if built on a GPU, with the options that put it there
    env._remember(**{**env._arguments, "options": ScoringOptions(device="cuda:0"), "engine": "vllm",
                     "vllm_enforce_eager": True, "vllm_tensor_parallel_size": 2,
                     "model_init_kwargs": {"attn_implementation": "flash_attention_2"}})  # fmt: skip
    blob = pickle.dumps(env)
    want = local_rewards(env)  # the original's next call
    copy = pickle.loads(blob)
    assert "_pending" in copy.__dict__ and copy.__name__ == "gpu_rm"  # nothing loaded until used
    assert pickle.loads(pickle.dumps(copy)).__name__ == "gpu_rm"  # re-pickled unloaded, as it came
    with caplog.at_level("WARNING"):
        copy._count, copy._mean, copy._m2  # noqa: B018 - loads it
        running = (copy._count, copy._mean, copy._m2)
        got = local_rewards(copy)
    assert running[0] == sum(len(a) for _, a in GROUPS)
    assert sum(got, []) == pytest.approx(sum(want, []), abs=1e-5)  # the same running normalization
    assert copy.engine == "hf" and copy.scorer.engine.device.type == "cpu"
    assert sum("built on cuda" in r.getMessage() and "remote_url" in r.getMessage() for r in caplog.records) == 1


def test_attribute_rewards_in_a_gdpo_step(tmp_path, tiny_tokenizer):
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer
    from trl.trainer.utils import nanstd

    from trl_rm_env.heads import set_regression_labels
    from trl_rm_env.tiny_models import build_tiny_policy, build_tiny_reward_model

    attributes, weights = ["helpfulness", "correctness", "verbosity"], [1.0, 0.5, -0.25]
    rm = build_tiny_reward_model(tiny_tokenizer, num_labels=3)
    set_regression_labels(rm.config, attributes, weights)
    rm.save_pretrained(tmp_path / "rm")
    tiny_tokenizer.save_pretrained(tmp_path / "rm")
    build_tiny_policy(tiny_tokenizer).save_pretrained(tmp_path / "policy")
    tiny_tokenizer.save_pretrained(tmp_path / "policy")

    env = RewardModelEnvironment(str(tmp_path / "rm"))
    funcs = env.attribute_rewards()
    assert [f.__name__ for f in funcs] == attributes and env.attribute_weights == weights
    seen = []
    real = env._attribute_outputs

    def spy(prompts, completions, kwargs):
        outputs = real(prompts, completions, kwargs)
        seen.append(outputs.clone())
        return outputs

    env._attribute_outputs = spy
    forwards = []  # calls of the reward model
    env.model.register_forward_hook(lambda module, args, output: forwards.append(1))
    args = GRPOConfig(
        str(tmp_path / "out"), max_steps=2, per_device_train_batch_size=8, num_generations=4, max_completion_length=6,
        reward_weights=env.attribute_weights, multi_objective_aggregation="normalize_then_sum", use_cpu=True,
        report_to="none", logging_steps=1, save_strategy="no", learning_rate=1e-6, bf16=False,
    )  # fmt: skip
    prompts = Dataset.from_list([{"prompt": [{"role": "user", "content": f"Question {i}?"}]} for i in range(2)])
    trainer = GRPOTrainer(model=str(tmp_path / "policy"), reward_funcs=funcs, args=args, train_dataset=prompts)
    advantages = []
    generate = trainer._generate_and_score_completions

    def capture(inputs):
        out = generate(inputs)
        advantages.append(out["advantages"].clone())
        return out

    trainer._generate_and_score_completions = capture
    trainer.train()
    # Two steps: three reward functions each, one forward each, never a stale batch.
    assert len(seen) == 2 and len(forwards) == 2 and not torch.equal(seen[0], seen[1])
    logged = [h for h in trainer.state.log_history if "rewards/helpfulness/mean" in h]
    assert len(logged) == 2
    for outputs, step, step_advantages in zip(seen, logged, advantages):
        for k, name in enumerate(attributes):
            assert step[f"rewards/{name}/mean"] == pytest.approx(outputs[:, k].mean().item(), abs=1e-5)
        grouped = outputs.view(-1, 4, 3)
        z = (grouped - grouped.mean(dim=1, keepdim=True)) / (nanstd(grouped, dim=1, keepdim=True) + 1e-4)
        summed = (z.view(-1, 3) * torch.tensor(weights)).sum(dim=1)
        reference = (summed - summed.mean()) / (nanstd(summed) + 1e-4)
        torch.testing.assert_close(step_advantages.cpu(), reference, atol=1e-4, rtol=0)
    weighted = env.attribute_rewards(weighted=True)  # for trainers that sum without weights (AsyncGRPO)
    prompts_, completions_ = [[{"role": "user", "content": "q"}]] * 2, [[{"role": "assistant", "content": a}] for a in "ab"]
    raw = [f(prompts_, completions_) for f in funcs]
    got = [v for f in weighted for v in f(prompts_, completions_)]
    assert got == pytest.approx([w * v for w, r in zip(weights, raw) for v in r])


def test_attribute_rewards_refuse_a_bradley_terry_model(tiny_dir):
    with pytest.raises(ValueError, match="needs a regression reward model"):
        RewardModelEnvironment(str(tiny_dir / "reward_model")).attribute_rewards()


@pytest.mark.slow
def test_grpo_recipe_reward_per_attribute(tmp_path, tiny_dir, tiny_tokenizer):
    import json
    from pathlib import Path

    from helpers import recipe_in_process

    from trl_rm_env.heads import set_regression_labels
    from trl_rm_env.tiny_models import build_tiny_reward_model

    attributes, weights = ["helpfulness", "verbosity"], [1.0, -0.5]
    rm = build_tiny_reward_model(tiny_tokenizer, num_labels=2)
    set_regression_labels(rm.config, attributes, weights)
    rm.save_pretrained(tmp_path / "rm")
    tiny_tokenizer.save_pretrained(tmp_path / "rm")
    root = Path(__file__).resolve().parent.parent
    # The recipe in this process (`recipe_in_process`): what is checked is its rewards, not its launch.
    recipe_in_process("grpo_rm", "--config", str(root / "recipes" / "configs" / "grpo_rm_tiny.yaml"),
                      "--output_dir", str(tmp_path / "out"), "--model_name_or_path", str(tiny_dir / "policy"),
                      "--reward_model", str(tmp_path / "rm"), "--reward_per_attribute", "true",
                      "--multi_objective_aggregation", "normalize_then_sum", "--max_steps", "2",
                      "--reward_name", "rm")  # fmt: skip
    history = json.loads((tmp_path / "out" / "trainer_state.json").read_text())["log_history"]
    steps = [h for h in history if "rewards/helpfulness/mean" in h]
    assert len(steps) == 2
    for step in steps:  # TRL's logged reward is the weighted sum: the model's own weights became reward_weights
        want = sum(w * step[f"rewards/{a}/mean"] for a, w in zip(attributes, weights))
        assert step["reward"] == pytest.approx(want, abs=1e-4)
