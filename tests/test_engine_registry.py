"""A new engine is one module registered by name (`trl_rm_env.runtime.engines.registry`), and both reward kinds reach
it through `engine="<name>"` with nothing else changed.

The engine here is a small one of a test's own: it answers the engine contract (`runtime/engines/contract.py`) with
the transformers engine's answers and records each call. Expected values come from the built-in `engine="hf"` path
(held to one forward of the plain model per sequence in tests/test_scorer.py and tests/test_judge_engines.py): the
rewards through the registered engine equal those exactly, and every forward went through it.
"""

from __future__ import annotations

import pytest
import torch

from trl_rm_env import JudgeEnvironment, RewardModelEnvironment
from trl_rm_env.judges.judge_options import JudgeSource
from trl_rm_env.runtime.engines import engine_names, register_engine, unregister_engine
from trl_rm_env.runtime.engines.transformers_engine import HFEngine
from trl_rm_env.runtime.loading import load_weights
from trl_rm_env.runtime.model_options import ModelOptions, ScoringOptions

PROMPTS = [[{"role": "user", "content": f"What is {i} + {i}?"}] for i in range(3) for _ in range(4)]
ANSWERS = [[{"role": "assistant", "content": f"It is {k}." + " Let me check." * k}] for _ in range(3) for k in range(4)]


class RecordingEngine:
    """A new engine: the contract's members, answered by transformers, every call recorded; the weights its own
    (`model` None, as vLLM's)."""

    name, is_async, sharding, model, prefix_sharing = "recording", False, "none", None, False

    def __init__(self, plan, tokenizer):
        self.inner = HFEngine(load_weights(plan), tokenizer, plan.options, kind=plan.kind)
        self.kind, self.calls, self.closed = plan.kind, [], 0

    num_labels = property(lambda self: self.inner.num_labels)
    device = property(lambda self: self.inner.device)
    max_length = property(lambda self: self.inner.max_length)

    def outputs(self, sequences, context_lengths=None, progress=None) -> torch.Tensor:
        self.calls.append(("outputs", len(sequences)))
        return self.inner.outputs(sequences, context_lengths, progress)

    def label_logprobs(self, prompts, label_ids, labels=()):
        self.calls.append(("label_logprobs", len(prompts)))
        return self.inner.label_logprobs(prompts, label_ids, labels)

    def generate(self, prompts, max_new_tokens, temperature, seeds, top_p=1.0, *, keep_failures=False):
        self.calls.append(("generate", len(prompts)))
        return self.inner.generate(prompts, max_new_tokens, temperature, seeds, top_p, keep_failures=keep_failures)

    def close(self) -> None:
        self.closed += 1


@pytest.fixture
def recording():
    built = []

    def build(plan, tokenizer):
        built.append(RecordingEngine(plan, tokenizer))
        return built[-1]

    register_engine("recording", build)
    yield built
    unregister_engine("recording")


def test_a_registered_engine_scores_a_reward_model_as_the_built_in_one(recording, tiny_dir):
    path = str(tiny_dir / "reward_model")
    expected = RewardModelEnvironment(path, engine="hf", batch_size=5)(PROMPTS, ANSWERS)
    env = RewardModelEnvironment(path, engine="recording", batch_size=5)
    got = env(PROMPTS, ANSWERS)
    (engine,) = recording
    assert engine.kind == "reward" and env.scorer.engine is engine
    assert got == expected  # the same outputs from the same forwards: equal to the digit
    assert sum(n for call, n in engine.calls if call == "outputs") == len(PROMPTS)


@pytest.mark.parametrize("mode", ["pointwise", "pairwise"])
def test_a_registered_engine_runs_a_judge_as_the_built_in_one(recording, tiny_dir, mode):
    path = str(tiny_dir / "policy")
    expected = JudgeEnvironment(path, engine="hf", mode=mode)(PROMPTS[:8], ANSWERS[:8])
    judge = JudgeEnvironment(path, engine="recording", mode=mode)
    got = judge(PROMPTS[:8], ANSWERS[:8])
    (engine,) = recording
    assert engine.kind == "judge" and judge.engine is engine
    assert got == pytest.approx(expected, abs=1e-12)
    assert engine.calls and {call for call, _ in engine.calls} == {"label_logprobs"}  # the default scoring


def test_generation_reaches_a_registered_engine(recording, tiny_dir):
    judge = JudgeEnvironment(str(tiny_dir / "policy"), engine="recording", scoring="generate", max_new_tokens=4,
                             parse_retries=1, unparsed_reward=0.0)  # fmt: skip
    rewards = judge(PROMPTS[:4], ANSWERS[:4])
    (engine,) = recording
    # the random tiny model writes no verdict: each sample asked once, asked again once, then the unparsed reward
    assert engine.calls == [("generate", 4), ("generate", 4)] and rewards == [0.0] * 4


def test_an_engine_is_an_option_value_once_registered_and_not_after(tiny_dir):
    with pytest.raises(ValueError, match=r"^engine must be one of \['auto', 'vllm', 'hf'\], got 'recording'$"):
        ScoringOptions(engine="recording")
    register_engine("recording", RecordingEngine)
    try:
        assert engine_names() == ("auto", "vllm", "hf", "recording")
        assert ModelOptions(engine="recording").engine == "recording"
        assert JudgeSource(judge="judge-dir", judge_engine="recording").judge_engine == "recording"  # eval's judge
        # an option that belongs to one engine is refused on another, the registered one named
        with pytest.raises(ValueError, match="applies to engine='vllm', but this reward model scores on recording"):
            RewardModelEnvironment(str(tiny_dir / "reward_model"), engine="recording", vllm_gpu_memory_utilization=0.5)
    finally:
        unregister_engine("recording")
    with pytest.raises(ValueError, match="engine must be one of"):
        ModelOptions(engine="recording")
    with pytest.raises(ValueError, match=r"^judge_engine must be one of \['auto', 'vllm', 'hf'\], got 'recording'$"):
        JudgeSource(judge="judge-dir", judge_engine="recording")


@pytest.mark.parametrize(("name", "error"), [("auto", ValueError), ("hf", ValueError), ("vllm", ValueError),
                                             ("My-Engine", ValueError), ("", ValueError)])  # fmt: skip
def test_a_name_taken_or_not_an_option_value_is_refused(name, error):
    with pytest.raises(error):
        register_engine(name, RecordingEngine)
    assert name not in engine_names()[3:]


def test_a_builder_must_be_callable():
    with pytest.raises(TypeError, match="build must be callable"):
        register_engine("recording", "RecordingEngine")
    assert "recording" not in engine_names()
