"""The reward functions' plumbing that only slow end-to-end runs exercised before, held fast: a reward function
unpickled where its accelerator is missing (AsyncGRPO's CPU child), a regression RM's attribute rewards served by one
forward per batch (GDPO; and one attribute reward over a stand-in environment's fixed table), each ensemble head's
exact statistics, and TRL's pair layout.

Expected values are literals worked out by hand, or one forward of the plain transformers model.
"""

from __future__ import annotations

import logging
import pickle

import pytest
import torch
from helpers import reference_ids

from trl_rm_env import JudgeEnvironment, RewardModelEnvironment
from trl_rm_env.rewards import pickling
from trl_rm_env.runtime.model_options import ModelOptions, ScoringOptions
from trl_rm_env.tiny_models import build_tiny_reward_model
from trl_rm_env.trainer.ensemble import head_statistics
from trl_rm_env.trainer.loss import PairwiseOutput, pair_layout

# ------------------------------------------------------------------------------------------ pickling without a GPU


def test_on_cpu_drops_what_places_a_model_on_an_accelerator():
    """`device` and `engine` become None and "hf", vLLM's own options their defaults (0.9 memory share is vLLM's
    default only when asked: ours is None; tensor parallel 1; eager False), an explicit `fsdp_shard` None, and a
    `device_map` or `attn_implementation` in `model_init_kwargs` is dropped; everything else is kept."""
    options = ScoringOptions(device="cuda:1", engine="vllm", vllm_gpu_memory_utilization=0.5,
                             vllm_tensor_parallel_size=2, vllm_enforce_eager=True, batch_size=3,
                             model_init_kwargs={"device_map": "cuda", "attn_implementation": "flash_attention_2",
                                                "revision": "main"})  # fmt: skip
    arguments = {"model": "org/rm", "options": options, "fsdp_shard": True, "name": "rm", "device": "cuda",
                 "model_init_kwargs": {"device_map": "auto", "low_cpu_mem_usage": True}}  # fmt: skip
    out = pickling._on_cpu(arguments)
    moved = out["options"]
    assert (moved.device, moved.engine, moved.vllm_gpu_memory_utilization) == (None, "hf", None)
    assert (moved.vllm_tensor_parallel_size, moved.vllm_enforce_eager) == (1, False)
    assert moved.batch_size == 3 and moved.model_init_kwargs == {"revision": "main"}
    assert out["fsdp_shard"] is None and out["device"] is None and out["engine"] == "hf"
    assert out["model_init_kwargs"] == {"low_cpu_mem_usage": True}
    assert out["model"] == "org/rm" and out["name"] == "rm"
    assert arguments["options"] is options and arguments["fsdp_shard"] is True  # the caller's arguments untouched
    judge = pickling._on_cpu({"scoring_options": ModelOptions(device="cuda", engine="vllm")})["scoring_options"]
    assert (judge.device, judge.engine) == (None, "hf")
    assert pickling._on_cpu({"fsdp_shard": False})["fsdp_shard"] is False  # only an explicit True is dropped
    # A judge's JudgeOptions (no device) and anything that is not an options dataclass are kept as given.
    from types import SimpleNamespace

    from trl_rm_env import JudgeOptions

    judge_options, other = JudgeOptions(mode="pairwise"), SimpleNamespace(device="cuda")
    out = pickling._on_cpu({"options": judge_options, "scoring_options": other})
    assert out["options"] is judge_options and out["scoring_options"] is other


def test_available_asks_the_device_module(monkeypatch):
    assert pickling._available("cpu") is True
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert pickling._available("cuda") is True
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert pickling._available("cuda") is False
    assert pickling._available("no_such_device") is False
    assert pickling.accelerator_type(None) == "cpu" and pickling.accelerator_type("cuda:3") == "cuda"


def test_a_reward_built_on_a_gpu_is_rebuilt_on_the_cpu_where_none_is(tiny_dir, monkeypatch, caplog):
    """Unpickled in a process without the accelerator it was built on: rebuilt on the CPU with transformers, warned
    once naming it, its rewards those of the same model built here, its running statistics carried over."""
    path = str(tiny_dir / "reward_model")
    env = RewardModelEnvironment(path, device="cpu", name="gpu_rm", normalization="running")
    prompts = [[{"role": "user", "content": "Hi"}]] * 2
    completions = [[{"role": "assistant", "content": "Hello."}], [{"role": "assistant", "content": "Go away."}]]
    want = env(prompts, completions)  # the running statistics now hold two rewards
    env._built_on = "cuda"
    env._arguments = {**env._arguments, "device": "cuda"}  # as it would have been given on the GPU machine
    blob = pickle.dumps(env)
    monkeypatch.setattr(pickling, "_available", lambda device_type: device_type == "cpu")
    monkeypatch.setattr(pickling, "_warned", set())
    copy = pickle.loads(blob)
    assert copy.__name__ == "gpu_rm" and "_pending" in copy.__dict__  # nothing loaded yet
    with caplog.at_level(logging.WARNING, logger="trl_rm_env.rewards.pickling"):
        again = copy(prompts, completions)
        copy(prompts, completions)
        pickle.loads(blob)(prompts, completions)  # another copy of the same reward function: not warned again
    assert [r.getMessage() for r in caplog.records if r.name == pickling.logger.name] == [
        "gpu_rm: built on cuda, but this process has none (AsyncGRPO's reward workers run with CUDA_VISIBLE_DEVICES=''): "
        "the model runs on the CPU here, slowly. Serve it on its own GPUs (`trl-rm-env serve --engine vllm --model "
        "...`) and pass remote_url."
    ]
    assert copy.engine == "hf" and copy._arguments["device"] == "cuda"  # pickled again as given
    assert copy._count == 6  # 2 before pickling, then 2 per call: the statistics came along
    # The same two completions normalized by the running statistics of 2, then 4, then 6 rewards: the first call
    # here sees the statistics of its 4 rewards (twice the same pair), so its z-scores equal those of the 2.
    assert again == pytest.approx(want, abs=1e-5)


def reporting_cuda(engine):
    """The same engine, reporting the device a GPU machine would have put it on (`cuda:0`)."""
    engine.__class__ = type("OnCuda", (type(engine),), {"device": property(lambda self: torch.device("cuda", 0))})
    return engine


def test_a_local_judge_remembers_the_accelerator_it_was_built_on(tiny_dir, monkeypatch, caplog):
    """A judge loaded in this process pickles the accelerator type of its engine's device (`cuda` for `cuda:0`):
    unpickled where there is none, it is rebuilt on the CPU and warned once naming it; one built on the CPU is
    rebuilt as given, without a warning."""
    from trl_rm_env.runtime import loading

    real = loading.load_engine
    monkeypatch.setattr(loading, "load_engine", lambda *args, **kwargs: reporting_cuda(real(*args, **kwargs)))
    built_on_gpu = JudgeEnvironment(str(tiny_dir / "policy"), engine="hf", name="gpu_judge")
    monkeypatch.setattr(loading, "load_engine", real)
    assert built_on_gpu.__getstate__()["built_on"] == "cuda"
    monkeypatch.setattr(pickling, "_available", lambda device_type: device_type == "cpu")
    monkeypatch.setattr(pickling, "_warned", set())
    with caplog.at_level(logging.WARNING, logger="trl_rm_env.rewards.pickling"):
        copy = pickle.loads(pickle.dumps(built_on_gpu))
        assert copy.engine.device.type == "cpu"  # loads it
        here = pickle.loads(pickle.dumps(JudgeEnvironment(str(tiny_dir / "policy"), engine="hf", name="cpu_judge")))
        assert here.engine.device.type == "cpu"
    assert [r.getMessage() for r in caplog.records if r.name == pickling.logger.name] == [
        "gpu_judge: built on cuda, but this process has none (AsyncGRPO's reward workers run with "
        "CUDA_VISIBLE_DEVICES=''): the model runs on the CPU here, slowly. Serve it on its own GPUs (`trl-rm-env "
        "serve --engine vllm --model ...`) and pass remote_url."
    ]


def test_a_local_reward_model_remembers_the_accelerator_it_was_built_on(tiny_dir, monkeypatch):
    """As for a judge: the accelerator type of the scoring engine's device (`cuda` for `cuda:0`) is what pickles."""
    from trl_rm_env.rewards import backend

    real = backend.load_reward_scorer

    def on_cuda(*args, **kwargs):
        scorer = real(*args, **kwargs)
        reporting_cuda(scorer.engine)
        return scorer

    monkeypatch.setattr(backend, "load_reward_scorer", on_cuda)
    assert RewardModelEnvironment(str(tiny_dir / "reward_model")).__getstate__()["built_on"] == "cuda"


def test_a_judge_pickles_by_name_without_loading():
    from trl.trainer.utils import is_async_callable

    judge = JudgeEnvironment(remote_url="http://127.0.0.1:9", remote_input="messages", mode="pointwise",
                             scoring="generate", name="strict_judge")  # fmt: skip
    copy = pickle.loads(pickle.dumps(judge))
    assert "_pending" not in copy.__dict__ and is_async_callable(copy)  # behind servers: rebuilt as it unpickles
    assert copy.__name__ == "strict_judge" and copy.remote_url == ["http://127.0.0.1:9/v1"]
    rm = RewardModelEnvironment(remote_url="http://127.0.0.1:9", remote_input="messages", name="served_rm")
    rm_copy = pickle.loads(pickle.dumps(rm))
    assert "_pending" not in rm_copy.__dict__ and is_async_callable(rm_copy) and rm_copy.__name__ == "served_rm"
    assert JudgeEnvironment._pending_name({}) == "judge" and JudgeEnvironment._pending_name({"name": "x"}) == "x"
    names = JudgeEnvironment.argument_names()
    assert {"remote_url", "mode", "max_score", "precision", "normalization", "timeout", "answer_bonus",
            "stop_properly_penalty_coef"} <= names  # fmt: skip
    assert "model" not in names and "fsdp_shard" not in names


# ------------------------------------------------------------------------------------------ attribute rewards (GDPO)

ATTRIBUTES = ["helpfulness", "verbosity", "safety"]


@pytest.fixture(scope="module")
def regression_dir(tmp_path_factory, tiny_tokenizer):
    out = tmp_path_factory.mktemp("attribute-rm")
    model = build_tiny_reward_model(tiny_tokenizer, seed=4, num_labels=3)
    model.config.id2label = dict(enumerate(ATTRIBUTES))
    model.config.label2id = {name: i for i, name in enumerate(ATTRIBUTES)}
    model.config.reward_model_type = model.config.problem_type = "regression"
    model.config.attribute_weights = {"helpfulness": 1.0, "verbosity": -0.5, "safety": 2.0}
    model.save_pretrained(out)
    tiny_tokenizer.save_pretrained(out)
    return out, model


@torch.no_grad()
def plain_outputs(model, tokenizer, prompts, completions) -> torch.Tensor:
    """`(N, 3)` outputs of the plain model, one conversation per forward."""
    rows = [model(input_ids=torch.tensor([reference_ids(tokenizer, p, c)])).logits[0] for p, c in zip(prompts, completions)]
    return torch.stack(rows).float()


def test_attribute_rewards_share_one_forward_and_equal_the_plain_model(regression_dir, tiny_tokenizer):
    path, model = regression_dir
    env = RewardModelEnvironment(path, device="cpu", empty_completion_reward=-9.0)
    calls = []
    original = env.scorer.score_pairs
    env.scorer.score_pairs = lambda *a, **k: calls.append(len(a[0])) or original(*a, **k)
    prompts = [[{"role": "user", "content": "Tell me a joke."}]] * 3 + [[{"role": "user", "content": "2+2?"}]]
    completions = [[{"role": "assistant", "content": t}] for t in ("A pun.", "No.", "  ", "Four.")]
    funcs = env.attribute_rewards()
    assert [f.__name__ for f in funcs] == ATTRIBUTES
    columns = [f(prompts, completions) for f in funcs]
    assert calls == [3]  # one scoring call for the three functions, the empty completion not scored
    want = plain_outputs(model, tiny_tokenizer, prompts, completions)
    for k, column in enumerate(columns):
        assert column[2] == -9.0  # the empty completion
        kept = [column[i] for i in (0, 1, 3)]
        assert kept == pytest.approx(want[[0, 1, 3], k].tolist(), abs=1e-4), ATTRIBUTES[k]
    assert len({round(c[0], 6) for c in columns}) == 3  # three different attributes: a wrong column would show
    weighted = env.attribute_rewards(weighted=True)
    values = [f(prompts, completions) for f in weighted]
    assert calls == [3, 3]  # new reward functions: their own cache, scored once again
    for k, w in enumerate([1.0, -0.5, 2.0]):
        assert values[k][0] == pytest.approx(w * columns[k][0], abs=1e-6)
    again = [list(p) for p in prompts]  # a new batch (new list objects) is scored again
    funcs[0](again, completions)
    assert calls == [3, 3, 3]
    copy = pickle.loads(pickle.dumps(funcs[1].shared))
    assert copy._batch is None and copy._outputs is None  # the cache and lock stay in this process


class TableEnv:
    """A stand-in environment (picklable, at module level): the same `(N, 2)` outputs for any batch."""

    def __init__(self, name):
        self.name = name

    def _attribute_outputs(self, prompts, completions, kwargs):
        return torch.tensor([[1.0, -2.0], [0.5, 4.0]])[: len(prompts)]


def test_an_attribute_reward_is_its_column_at_weight_one_and_its_shared_outputs_pickle_their_env():
    from trl_rm_env.rewards.attributes import AttributeReward, SharedOutputs

    shared = SharedOutputs(TableEnv("table"))
    prompts, completions = ["p", "q"], ["x", "y"]
    assert AttributeReward(shared, 1, "b")(prompts, completions) == [-2.0, 4.0]  # column 1, weight 1 by default
    assert AttributeReward(shared, 1, "b", weight=-0.5)(prompts, completions) == [1.0, -2.0]  # -0.5 * (-2, 4)
    copy = pickle.loads(pickle.dumps(shared))  # the environment goes along; the cache and lock are new
    assert copy.env.name == "table" and copy._batch is None
    assert AttributeReward(copy, 0, "a")(prompts, completions) == [1.0, 0.5]


# ------------------------------------------------------------------------------------------ ensemble heads and pairs


def test_head_statistics_are_each_heads_own_sums():
    """Two records: completions 0-2 ranked 0, 1, 2 (pairs 0>1, 0>2, 1>2), completions 3-4 ranked 0, 1 (pair 3>4).
    Head 0 scores [3, 1, 2, 0, 5], head 1 [1, 2, 3, 4, 4]. Written out per head from the columns of
    `metrics.STAT_COLUMNS`: pairs, correct pairs (better strictly higher), margin sum, better and worse sums, loss
    sum (the given pair losses), completions, score sum, squared score sum."""
    scores = torch.tensor([[3.0, 1.0], [1.0, 2.0], [2.0, 3.0], [0.0, 4.0], [5.0, 4.0]])
    record_index = torch.tensor([0, 0, 0, 1, 1])
    better, worse = torch.tensor([0, 0, 1, 3]), torch.tensor([1, 2, 2, 4])
    heads = [PairwiseOutput(torch.tensor(0.0), better, worse, torch.tensor([0.1, 0.2, 0.3, 0.4])),
             PairwiseOutput(torch.tensor(0.0), better, worse, torch.tensor([1.0, 2.0, 3.0, 4.0]))]  # fmt: skip
    stats = head_statistics(scores, record_index, heads, num_records=2)
    assert stats.shape == (2, 2, 9)
    # head 0, record 0: pairs 3>1 yes, 3>2 yes, 1>2 no -> 2 correct; margins 2 + 1 - 1 = 2; better 3+3+1 = 7,
    # worse 1+2+2 = 5; losses .6; 3 completions summing 6, squares 9+1+4 = 14. Record 1: 0>5 no; margin -5.
    assert stats[0, 0].tolist() == pytest.approx([3, 2, 2, 7, 5, 0.6, 3, 6, 14])
    assert stats[1, 0].tolist() == pytest.approx([1, 0, -5, 0, 5, 0.4, 2, 5, 25])
    # head 1, record 0: 1>2 no, 1>3 no, 2>3 no; margins -1 - 2 - 1 = -4; better 1+1+2 = 4, worse 2+3+3 = 8; losses 6;
    # scores 1+2+3 = 6, squares 14. Record 1: 4>4 no (a tie is wrong); margin 0.
    assert stats[0, 1].tolist() == pytest.approx([3, 0, -4, 4, 8, 6, 3, 6, 14])
    assert stats[1, 1].tolist() == pytest.approx([1, 0, 0, 4, 4, 4, 2, 8, 32])


def test_pair_layout_is_trls_chosen_then_rejected():
    """TRL's pair layout of 6 rows: rows 0-2 chosen (rank 0), 3-5 rejected (rank 1), row i and i + 3 one record."""
    ranks, record_index = pair_layout(6, torch.device("cpu"))
    assert ranks.tolist() == [0, 0, 0, 1, 1, 1] and record_index.tolist() == [0, 1, 2, 0, 1, 2]
    assert ranks.dtype == record_index.dtype == torch.long
    ranks, record_index = pair_layout(2, torch.device("cpu"))
    assert ranks.tolist() == [0, 1] and record_index.tolist() == [0, 0]
