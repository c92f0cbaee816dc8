"""The vLLM engine's judge logic (`VLLMEngine(kind="judge")`), without vLLM: stub `vllm` / `vllm.inputs` modules (a `SamplingParams` and a
`TokensPrompt` that record their keyword arguments) and a fake `LLM` whose `generate` records its arguments and
answers objects shaped like vLLM's `RequestOutput` (`outputs[0].text`, `outputs[0].logprobs[0][token_id].logprob`).
The engine on a real vLLM is held to the transformers engine's numbers in tests/test_judges_vllm.py.

Expected values are the literals the fakes answer and what vLLM's API asks for (`SamplingParams(max_tokens=1,
temperature=0.0, logprob_token_ids=[...])`, `TokensPrompt(prompt_token_ids=[int, ...])`, `use_tqdm` a bool), plus the
documented rules: a label token vLLM did not return has log-probability -inf; `show_progress=None` shows a bar for
more than 256 prompts.
"""

from __future__ import annotations

import math
import sys
import types
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from trl_rm_env.runtime import loading
from trl_rm_env.runtime.engines import vllm_engine as engines
from trl_rm_env.runtime.engines.transformers_engine import HFEngine
from trl_rm_env.runtime.engines.vllm_engine import VLLMEngine
from trl_rm_env.runtime.model_options import ModelOptions
from trl_rm_env.runtime.plan import ModelPlan


class Recorded:
    """A stand-in for a vLLM class: keeps its keyword arguments (positional ones are refused, as the engine uses
    none)."""

    def __init__(self, **kwargs):
        self.kwargs = kwargs


class FakeLLM:
    """`LLM.generate(prompts, params, use_tqdm=...)`: records each call and answers, per prompt, two outputs (the
    engine must read the first) whose first step's logprobs hold `logprobs` and whose second step holds other
    values (the engine must read the first step)."""

    def __init__(self, logprobs=None):
        self.calls: list[tuple] = []
        self.logprobs = logprobs or {}

    def generate(self, prompts, params, use_tqdm="not given"):
        self.calls.append((prompts, params, use_tqdm))
        out = []
        for k, _ in enumerate(prompts):
            first = {t: SimpleNamespace(logprob=v + k) for t, v in self.logprobs.items()}
            second = {t: SimpleNamespace(logprob=99.0) for t in self.logprobs}
            outputs = [SimpleNamespace(text=f"verdict {k}", logprobs=[first, second]),
                       SimpleNamespace(text="other sample", logprobs=[second, second])]  # fmt: skip
            out.append(SimpleNamespace(outputs=outputs))
        return out


@pytest.fixture
def fake_vllm(monkeypatch):
    """Stub vLLM modules and runtime hooks; yields the record of the runtime calls."""
    vllm = types.ModuleType("vllm")
    vllm.SamplingParams = vllm.PoolingParams = Recorded
    inputs = types.ModuleType("vllm.inputs")
    inputs.TokensPrompt = Recorded
    vllm.inputs = inputs
    monkeypatch.setitem(sys.modules, "vllm", vllm)
    monkeypatch.setitem(sys.modules, "vllm.inputs", inputs)
    record: dict[str, list] = {"engine_arguments": [], "start_llm": [], "stop_llm": []}
    llm = FakeLLM({5: -0.25, 7: -1.5})

    def engine_arguments(*args, **kwargs):
        record["engine_arguments"].append((args, kwargs))
        return {"max_model_len": 77, "model": "ignored"}

    def start_llm(*args):
        record["start_llm"].append(args)
        return llm

    monkeypatch.setattr(engines, "engine_arguments", engine_arguments)
    monkeypatch.setattr(engines, "start_llm", start_llm)
    monkeypatch.setattr(engines, "stop_llm", lambda *args: record["stop_llm"].append(args))
    monkeypatch.setattr(engines, "vllm_device", lambda: "cuda:3")
    record["llm"] = llm
    return record


@pytest.mark.parametrize(
    ("kind", "asked", "engine_kwargs", "caching"),
    [
        ("reward", "auto", None, True),  # vLLM's default: its prefix caching shares a group's prompt
        ("judge", True, None, True),
        ("reward", False, None, False),
        ("judge", "false", None, False),
        ("reward", "packed", {"enable_prefix_caching": False}, False),  # what vLLM is started with wins
    ],
)
def test_vllm_engine_reports_the_prefix_caching_it_starts_with(fake_vllm, monkeypatch, kind, asked, engine_kwargs,
                                                               caching):  # fmt: skip
    from trl_rm_env.runtime import vllm as runtime_vllm

    monkeypatch.setattr(engines, "engine_arguments", runtime_vllm.engine_arguments)  # the runtime's own arguments
    monkeypatch.setattr(runtime_vllm, "vllm_installed", lambda: False)  # (the stub module has no import spec)
    config = SimpleNamespace(max_position_embeddings=4096, num_labels=1)
    engine = VLLMEngine("m", config, ModelOptions(prefix_sharing=asked), kind=kind, engine_kwargs=engine_kwargs)
    started = fake_vllm["start_llm"][-1][1]
    assert started["enable_prefix_caching"] is caching and engine.prefix_sharing is caching


def test_vllm_engine_starts_from_the_runtimes_arguments_and_stops(fake_vllm):
    config = SimpleNamespace(max_position_embeddings=4096)
    options = ModelOptions(show_progress=True)
    engine = VLLMEngine("judge", config, options, kind="judge")
    # The runtime plans the engine's arguments for a generating runner; vLLM starts with them, owned by the engine.
    assert fake_vllm["engine_arguments"] == [((config, options), {"runner": "generate"})]
    (started,) = fake_vllm["start_llm"]
    assert started[0] == "judge" and started[1] == {"max_model_len": 77, "model": "ignored"} and started[2] is engine
    assert engine.llm is fake_vllm["llm"]
    assert engine.max_length == 77 and engine.show_progress is True and engine.device == torch.device("cuda:3")
    engine.close()
    assert len(fake_vllm["stop_llm"]) == 1 and fake_vllm["stop_llm"][0][0] is fake_vllm["llm"]

    # engine_kwargs win over the arguments the runtime planned
    VLLMEngine("judge", config, options, kind="judge", engine_kwargs={"max_model_len": 99, "seed": 3})
    assert fake_vllm["start_llm"][-1][1] == {"max_model_len": 99, "model": "ignored", "seed": 3}

    # No options: the defaults (show_progress None), handed to the runtime as an object.
    default = VLLMEngine("judge", config, kind="judge")
    ((_, given), _kwargs) = fake_vllm["engine_arguments"][-1]
    assert given == ModelOptions() and default.show_progress is None


def test_vllm_label_logprobs_read_the_first_step_of_the_first_output(fake_vllm):
    engine = VLLMEngine("judge", None, ModelOptions(), kind="judge")
    llm = fake_vllm["llm"]
    labels = [np.int64(5), np.int64(6), np.int64(7)]  # 6: not among vLLM's logprobs -> -inf
    got = engine.label_logprobs([[1, 2, 3], np.array([4, 5])], labels)
    # The fake answers prompt k's logprob of token t as its base value + k; token 6 is missing.
    assert got == [[-0.25, -math.inf, -1.5], [0.75, -math.inf, -0.5]]
    ((prompts, params, use_tqdm),) = llm.calls
    assert params.kwargs == {"max_tokens": 1, "temperature": 0.0, "logprob_token_ids": [5, 6, 7]}
    assert all(type(t) is int for t in params.kwargs["logprob_token_ids"])
    assert [p.kwargs for p in prompts] == [{"prompt_token_ids": [1, 2, 3]}, {"prompt_token_ids": [4, 5]}]
    assert all(type(t) is int for p in prompts for t in p.kwargs["prompt_token_ids"])
    assert use_tqdm is False
    # Nothing to judge: no request.
    assert engine.label_logprobs([], labels) == [] and len(llm.calls) == 1


def test_vllm_generate_samples_each_prompt_with_its_own_seed(fake_vllm):
    engine = VLLMEngine("judge", None, ModelOptions(), kind="judge")
    llm = fake_vllm["llm"]
    got = engine.generate([[1, 2], [3]], 12, 0.7, np.array([11, 12]))
    assert got == ["verdict 0", "verdict 1"]
    ((prompts, params, use_tqdm),) = llm.calls
    assert [p.kwargs for p in params] == [
        {"max_tokens": 12, "temperature": 0.7, "top_p": 1.0, "seed": 11, "skip_special_tokens": True},
        {"max_tokens": 12, "temperature": 0.7, "top_p": 1.0, "seed": 12, "skip_special_tokens": True},
    ]
    assert all(type(p.kwargs["seed"]) is int and p.kwargs["skip_special_tokens"] is True for p in params)
    assert [p.kwargs for p in prompts] == [{"prompt_token_ids": [1, 2]}, {"prompt_token_ids": [3]}]
    assert use_tqdm is False
    engine.generate([[1]], 3, 0.0, [4], top_p=0.5)
    assert llm.calls[-1][1][0].kwargs["top_p"] == 0.5
    assert engine.generate([], 3, 0.0, []) == [] and len(llm.calls) == 2


@pytest.mark.parametrize(
    "show_progress, prompts, bar",
    [(None, 256, False), (None, 257, True), (True, 1, True), (False, 300, False)],
)
def test_vllm_progress_bar_is_show_progress_else_more_than_256_prompts(fake_vllm, show_progress, prompts, bar):
    engine = VLLMEngine("judge", None, ModelOptions(show_progress=show_progress), kind="judge")
    engine.label_logprobs([[1]] * prompts, [5])
    assert fake_vllm["llm"].calls[-1][2] is bar


def test_vllm_reward_model_outputs_are_the_raw_head_values_of_every_label_in_input_order(fake_vllm):
    """The reward-model kind (the default): vLLM's pooling runner, `classify` with `use_activation=False` (raw
    values), each result's `outputs.probs` (one per label) as that sequence's row."""
    llm = fake_vllm["llm"]
    calls = []

    def classify(prompts, pooling_params, use_tqdm="not given"):
        calls.append((prompts, pooling_params, use_tqdm))
        # prompt k's values: its length, then minus its first token (a regression head of 2 labels)
        return [SimpleNamespace(outputs=SimpleNamespace(probs=[float(len(p.kwargs["prompt_token_ids"])),
                                                                -float(p.kwargs["prompt_token_ids"][0])]))
                for p in prompts]  # fmt: skip

    llm.classify = classify
    engine = VLLMEngine("rm", SimpleNamespace(num_labels=2), ModelOptions())  # kind="reward" by default
    assert fake_vllm["engine_arguments"][-1][1] == {"runner": "pooling"} and engine.num_labels == 2
    got = engine.outputs([[7, 1, 1], [3], np.array([5, 2])])
    assert got.dtype == torch.float32 and got.tolist() == [[3.0, -7.0], [1.0, -3.0], [2.0, -5.0]]
    ((prompts, params, use_tqdm),) = calls
    assert params.kwargs == {"use_activation": False} and use_tqdm is False
    assert [p.kwargs for p in prompts] == [{"prompt_token_ids": [7, 1, 1]}, {"prompt_token_ids": [3]},
                                           {"prompt_token_ids": [5, 2]}]  # fmt: skip
    engine.outputs([[1]] * 257)
    assert calls[-1][2] is True  # a bar past 256 sequences, as for a judge
    engine.outputs([[1]] * 300, progress=False)
    engine.outputs([[1]], progress=True)
    assert [c[2] for c in calls[-2:]] == [False, True]  # the call's own choice wins
    assert engine.outputs([], None).shape == (0, 2) and len(calls) == 4  # nothing to score: no request
    one = VLLMEngine("rm", SimpleNamespace())  # a config without num_labels: one output
    assert one.num_labels == 1 and one.kind == "reward"


@pytest.fixture(scope="module")
def policy(tiny_tokenizer):
    from trl_rm_env.tiny_models import build_tiny_policy

    return build_tiny_policy(tiny_tokenizer, seed=4)


def test_a_judge_loaded_here_names_its_engine(policy, tiny_tokenizer):
    from trl_rm_env import JudgeEnvironment

    env = JudgeEnvironment(policy, tiny_tokenizer, name="local")
    assert repr(env) == "JudgeEnvironment(name='local', mode='pointwise', scoring='logprobs', engine='hf')"


def test_load_engine_builds_the_judge_engine_its_plan_names(fake_vllm, monkeypatch, policy, tiny_tokenizer):
    logged, loads, shards = [], [], []
    monkeypatch.setattr(loading, "log_engine_choice", logged.append)
    monkeypatch.setattr(loading, "load_weights", lambda plan: loads.append(plan) or policy)
    monkeypatch.setattr(loading, "shard_if_requested", lambda *args, **kw: shards.append((*args, kw)) or "zero3")
    config, options = SimpleNamespace(max_position_embeddings=64), ModelOptions(batch_size=3)
    vllm = ModelPlan("judge-dir", None, config, options, "judge", None, "vllm", "asked")
    engine = loading.load_engine(vllm, tiny_tokenizer, shard=True)
    assert isinstance(engine, VLLMEngine) and engine.kind == "judge" and logged == [vllm]
    assert fake_vllm["engine_arguments"] == [((config, options), {"runner": "generate"})]
    assert fake_vllm["start_llm"][0][0] == "judge-dir" and not loads and not shards
    # A judge given loaded runs as it is; one named by path is loaded by the runtime. Either is sharded if asked.
    loaded = ModelPlan(None, policy, policy.config, options, "judge", None, "hf", "asked")
    engine = loading.load_engine(loaded, tiny_tokenizer, shard=True)
    assert isinstance(engine, HFEngine) and engine.kind == "judge" and logged == [vllm, loaded] and not loads
    assert engine.model is policy and engine.tokenizer is tiny_tokenizer and engine.options is options
    assert engine.sharding == "zero3" and shards == [(policy, None, loading.logger, {"kind": "judge"})]
    named = ModelPlan("judge-dir", None, policy.config, options, "judge", None, "hf", "asked")
    assert loading.load_engine(named, tiny_tokenizer).model is policy and loads == [named]
    assert len(shards) == 1  # sharding only where asked (`shard=True`: a reward function on every process)


@pytest.mark.parametrize("kind, doing", [("judge", "judging"), ("reward", "scoring")])
def test_a_vllm_that_fails_to_start_falls_back_to_transformers_unless_vllm_was_asked(
    fake_vllm, monkeypatch, policy, tiny_tokenizer, caplog, kind, doing
):
    """`engine="auto"` chose vLLM, which fails to start: one warning naming the error, and transformers runs the
    model, a judge's as a reward model's (the plan says why). Asked for by name (`engine="vllm"`) or with a vLLM
    option given, the error is raised."""
    import logging

    def failing(*args):
        raise RuntimeError("no device")

    monkeypatch.setattr(engines, "start_llm", failing)
    monkeypatch.setattr(loading, "load_weights", lambda plan: policy)
    config = SimpleNamespace(max_position_embeddings=64)
    auto = ModelPlan("dir", None, config, ModelOptions(), kind, None, "vllm", "vLLM is installed")
    with caplog.at_level(logging.WARNING, logger=loading.logger.name):
        engine = loading.load_engine(auto, tiny_tokenizer)
    assert isinstance(engine, HFEngine) and engine.kind == kind and engine.model is policy
    assert [r.getMessage() for r in caplog.records if r.name == loading.logger.name] == [
        f"vLLM could not start (RuntimeError: no device); {doing} with transformers instead."
    ]
    for options in (ModelOptions(engine="vllm"), ModelOptions(vllm_enforce_eager=True)):
        asked = ModelPlan("dir", None, config, options, kind, None, "vllm", "asked")
        with pytest.raises(RuntimeError, match="no device"):
            loading.load_engine(asked, tiny_tokenizer)


def test_hf_engine_samples_every_prompt_from_one_stream_across_batches(policy, tiny_tokenizer):
    """One random stream for the call, seeded with its first seed: a prompt repeated in several micro-batches draws a
    sample of its own each time (not the same sample again), and the same seeds give the same texts."""
    from trl_rm_env.runtime.model_options import ModelOptions

    engine = HFEngine(policy, tiny_tokenizer, ModelOptions(batch_size=1), kind="judge")  # one prompt a batch
    prompt = tiny_tokenizer("Say something.")["input_ids"]
    texts = engine.generate([prompt] * 6, 6, 1.0, [5] * 6)
    assert len(set(texts)) > 1
    assert engine.generate([prompt] * 6, 6, 1.0, [5] * 6) == texts


def test_a_judge_engine_shares_no_prefixes(policy, tiny_tokenizer, caplog):
    import logging

    from trl_rm_env.runtime.model_options import ScoringOptions

    with caplog.at_level(logging.INFO, logger="trl_rm_env"):
        engine = HFEngine(policy, tiny_tokenizer, ScoringOptions(prefix_sharing=True), kind="judge")
    assert engine.prefix_sharing is False and engine.layout.name == "plain"  # its prompts are its own
    assert caplog.messages == []  # nothing to decide for a judge, so nothing said about it


def test_hf_engine_waves_are_one_pass_of_its_layout(tiny_tokenizer):
    """`wave_bounds`: what one forward pass holds, the size of an overlapped call's waves: the packed row's tokens
    (given, else sized from the device) and sequences (`batch_size`); the plain layout's tokens and rows."""
    from trl_rm_env.runtime.model_options import ScoringOptions
    from trl_rm_env.sharing.packed import device_token_budget
    from trl_rm_env.tiny_models import build_tiny_reward_model

    model = build_tiny_reward_model(tiny_tokenizer, seed=0)
    packed = HFEngine(model, tiny_tokenizer, ScoringOptions(prefix_sharing="packed", batch_size=6, max_tokens_per_batch=900))
    assert packed.wave_bounds() == (900, 6)
    sized = HFEngine(model, tiny_tokenizer, ScoringOptions(prefix_sharing="packed"))
    assert sized.wave_bounds() == (device_token_budget(model), None)
    plain = HFEngine(model, tiny_tokenizer, ScoringOptions(prefix_sharing=False, batch_size=3, max_tokens_per_batch=500))
    assert plain.wave_bounds() == (500, 3)


def test_hf_engine_pads_with_the_tokenizers_pad_else_eos_else_0_and_bounds_by_options(policy):
    def tokenizer(pad, eos):
        return SimpleNamespace(pad_token_id=pad, eos_token_id=eos)

    assert [HFEngine(policy, tokenizer(*ids), kind="judge").pad_token_id for ids in ((7, 3), (None, 3), (None, None))] == [7, 3, 0]
    alone = HFEngine(policy, tokenizer(7, 3), kind="judge")
    assert alone.options == ModelOptions() and alone.max_length == policy.config.max_position_embeddings
    options = ModelOptions(max_length=100, batch_size=5)
    given = HFEngine(policy, tokenizer(7, 3), options, kind="judge")
    assert given.options is options and given.max_length == 100


def test_hf_engine_equals_a_plain_forward_per_prompt_in_batches_within_the_token_budget(policy, tiny_tokenizer):
    """Prompts of 5, 9, 3 and 7 tokens, longest first (9, 7, 5, 3), at most 3 rows and 14 padded tokens a forward:
    9 alone (2 x 9 > 14), then 7 with 5 (2 x 7 = 14), then 3 (3 x 7 > 14). At most 2 rows and no token budget:
    (9, 7), then (5, 3). Generating 2 tokens counts them too: 11, 9, 7, 5 -> 11 alone, 9 alone (2 x 9 > 14), then 7
    with 5. Each prompt's label log-probabilities and greedy text equal the plain model run on it alone."""
    generator = torch.Generator().manual_seed(0)
    prompts = [torch.randint(10, 600, (n,), generator=generator).tolist() for n in (5, 9, 3, 7)]
    labels = [5, 17, 42, 300]
    with torch.no_grad():
        want = [torch.log_softmax(policy(torch.tensor([p])).logits[0, -1].float(), -1)[labels] for p in prompts]
        texts = [tiny_tokenizer.decode(policy.generate(torch.tensor([p]), attention_mask=torch.ones(1, len(p), dtype=torch.long),
                                                       do_sample=False, max_new_tokens=2)[0, len(p):], skip_special_tokens=True)
                 for p in prompts]  # fmt: skip
    shapes = []
    hook = policy.register_forward_pre_hook(lambda m, a, kw: shapes.append(tuple(kw["input_ids"].shape)), with_kwargs=True)
    try:
        budget = HFEngine(policy, tiny_tokenizer, ModelOptions(batch_size=3, max_tokens_per_batch=14), kind="judge")
        got = budget.label_logprobs(prompts, labels)
        assert shapes == [(1, 9), (2, 7), (1, 3)]
        torch.testing.assert_close(torch.tensor(got), torch.stack(want), atol=1e-5, rtol=0)
        shapes.clear()
        rows = HFEngine(policy, tiny_tokenizer, ModelOptions(batch_size=2), kind="judge")
        torch.testing.assert_close(torch.tensor(rows.label_logprobs(prompts, labels)), torch.stack(want), atol=1e-5, rtol=0)
        assert shapes == [(2, 9), (2, 5)]
        shapes.clear()
        assert budget.generate(prompts, 2, 0.0, [0, 0, 0, 0]) == texts
        assert [s for s in shapes if s[1] > 1] == [(1, 9), (1, 7), (2, 5)]  # each generate's prompt forward
    finally:
        hook.remove()


class DeviceModel(torch.nn.Module):
    """A stand-in judge on another device than the CPU (`meta`): records the device of what each forward gets and
    answers all-zero logits over a vocabulary of 8 (log-probabilities of -log 8)."""

    config = SimpleNamespace(max_position_embeddings=64)

    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(1, device="meta"))
        self.seen: list[tuple] = []

    def forward(self, input_ids, attention_mask, position_ids, **kwargs):
        self.seen.append((input_ids.device.type, attention_mask.device.type))
        return SimpleNamespace(logits=torch.zeros(input_ids.shape[0], 1, 8))


def test_hf_engine_moves_each_batch_to_the_models_device():
    model = DeviceModel()
    got = HFEngine(model, SimpleNamespace(pad_token_id=0, eos_token_id=1), kind="judge").label_logprobs([[1, 2], [3]], [4])
    assert model.seen == [("meta", "meta")]
    assert [row for rows in got for row in rows] == pytest.approx([-math.log(8)] * 2, abs=1e-6)
