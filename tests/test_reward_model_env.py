"""`RewardModelEnvironment` around its scorer (the arithmetic of its rewards is tests/test_environment.py's): a
regression model's attribute rewards and what they refuse; NaN/inf outputs named by the caller's indices; options that
cannot go together, refused in one line; behind a real scoring server (in this process), the model name and token ids
it is sent, from the arguments or a NeMo RL block; its repr; no progress bar in a reward call; the gathering of a
sharded model around each call and where the weights are said to be (stand-ins for FSDP2 and a ZeRO-3 world of 2);
checkpoint normalization; and pickling (built from a loaded model it refuses; unpickled, it loads on first use, with
every argument it was given, and warns once where the accelerator it was built on is missing).

Expected scores are one plain forward of the transformers model per conversation (`helpers.reference_scores`,
`plain_outputs`) or literals worked out by hand; messages are the product's text, asserted whole.
"""

from __future__ import annotations

import ast
import asyncio
import copy
import logging
import pickle
import re

import pytest
import torch
from helpers import record_full_weights, reference_ids, reference_scores, reference_text

from trl_rm_env import RemoteRewardModelEnvironment, RewardModelEnvironment
from trl_rm_env.rewards import pickling

ATTRIBUTES = ["helpfulness", "safety"]
POISON = "~"  # its embedding row is NaN in `poisoned`: a completion holding it scores NaN, the others do not


def say(text):
    return [{"role": "assistant", "content": text}]


@pytest.fixture(scope="module")
def regression(tiny_tokenizer):
    """A two-attribute regression RM (weights 1 and -0.5), and a copy whose embedding of `POISON` is NaN."""
    from trl_rm_env.heads import set_regression_labels
    from trl_rm_env.tiny_models import build_tiny_reward_model

    def build():
        model = build_tiny_reward_model(tiny_tokenizer, seed=4, num_labels=2)
        set_regression_labels(model.config, ATTRIBUTES, [1.0, -0.5])
        return model

    model, poisoned = build(), build()
    (poison,) = tiny_tokenizer.encode(POISON, add_special_tokens=False)
    with torch.no_grad():
        poisoned.get_input_embeddings().weight[poison] = float("nan")
    return model, poisoned


@torch.no_grad()
def plain_outputs(model, tokenizer, prompts, completions) -> torch.Tensor:
    """`(N, attributes)` outputs of the plain model, one conversation per forward."""
    rows = [model(input_ids=torch.tensor([reference_ids(tokenizer, p, c)])).logits[0] for p, c in zip(prompts, completions)]
    return torch.stack(rows).float()


def test_attribute_rewards_refuse_what_they_cannot_apply(regression, tiny_rm, tiny_tokenizer):
    model, _ = regression
    env = RewardModelEnvironment(model, tiny_tokenizer, device="cpu", name="rm", normalization="running", clip=1.0,
                                 reference_column="gold", answer_length_coeff=0.1, stop_properly_penalty_coef=0.5,
                                 eos_token_id=2)  # fmt: skip
    with pytest.raises(ValueError, match=re.escape(
            "rm: attribute_rewards() returns raw attribute values (GDPO normalizes them per group); drop normalization, "
            "clip, reference_column, group shaping, length shaping") + "$"):  # fmt: skip
        env.attribute_rewards()
    heads = RewardModelEnvironment(model, tiny_tokenizer, device="cpu", name="rm", ensemble="min")
    with pytest.raises(ValueError, match=re.escape(
            "rm: attribute_rewards() returns raw attribute values (GDPO normalizes them per group); drop ensemble") + "$"):  # fmt: skip
        heads.attribute_rewards()
    one = RewardModelEnvironment(tiny_rm, tiny_tokenizer, device="cpu", name="bt")  # a Bradley-Terry head
    with pytest.raises(ValueError, match=re.escape("bt: attribute_rewards(weighted=True) needs attribute_weights") + "$"):
        one.attribute_rewards(weighted=True)
    with pytest.raises(ValueError, match=re.escape(
            "bt: attribute_rewards() needs a regression reward model loaded here (several outputs); this one has one "
            "reward") + "$"):  # fmt: skip
        one.attribute_rewards()
    served = RewardModelEnvironment("rm", remote_url="http://127.0.0.1:9", remote_input="messages", name="served")
    with pytest.raises(ValueError, match=re.escape(
            "served: attribute_rewards() needs a regression reward model loaded here (several outputs); this one is "
            "behind servers, which return one reward per item") + "$"):  # fmt: skip
        served.attribute_rewards()
    # Two attributes are enough.
    two = RewardModelEnvironment(model, tiny_tokenizer, device="cpu").attribute_rewards()
    assert [f.__name__ for f in two] == ATTRIBUTES and [f.weight for f in two] == [1.0, 1.0]


def test_attribute_rewards_score_empty_completions_unless_told_and_name_nan_outputs(regression, tiny_tokenizer):
    model, poisoned = regression
    prompts = [[{"role": "user", "content": "Tell me a joke."}], [{"role": "user", "content": "Hi"}]]
    completions = [say("A pun."), say("  ")]
    funcs = RewardModelEnvironment(model, tiny_tokenizer, device="cpu").attribute_rewards()
    want = plain_outputs(model, tiny_tokenizer, prompts, completions)  # the blank one scored like any other
    for k, f in enumerate(funcs):
        assert f(prompts, completions) == pytest.approx(want[:, k].tolist(), abs=1e-4), ATTRIBUTES[k]
    # The blank completion given -9, the other two scored; the third's NaN is named by the caller's index, 2.
    env = RewardModelEnvironment(poisoned, tiny_tokenizer, device="cpu", name="poisoned", empty_completion_reward=-9.0)
    three = [say("  "), say("A pun."), say(f"A {POISON}.")]
    with pytest.raises(FloatingPointError, match=re.escape(
            "poisoned: the reward model returned NaN/inf for item(s) [2] of the completions (1 of 2 scored). Check the "
            "model dtype (fp16 overflows are common) or set `nonfinite_reward`.") + "$"):  # fmt: skip
        env.attribute_rewards()[0]([*prompts, prompts[0]], three)
    with pytest.raises(FloatingPointError, match=re.escape(
            "poisoned: the reward model returned NaN/inf for item(s) [2] of the completions (1 of 2 scored). Check the "
            "model dtype (fp16 overflows are common) or set `nonfinite_reward`.") + "$"):  # fmt: skip
        env([*prompts, prompts[0]], three)  # the reward (the attributes weighed), named alike
    assert env(prompts[:1], [say(" ")]) == [-9.0]  # nothing to score
    conversations = [prompts[0] + say("A pun."), prompts[1] + say(f"A {POISON}.")]
    with pytest.raises(FloatingPointError, match=re.escape(
            "poisoned: the reward model returned NaN/inf for item(s) [1] of the conversations (1 of 2 scored). Check "
            "the model dtype (fp16 overflows are common) or set `nonfinite_reward`.") + "$"):  # fmt: skip
        env.score(conversations)


def test_repr_names_the_model_or_the_servers(tiny_dir):
    path = str(tiny_dir / "reward_model")
    assert repr(RewardModelEnvironment(path, device="cpu", name="rm")) == f"RewardModelEnvironment(name='rm', model={path!r})"
    served = RemoteRewardModelEnvironment(remote_url="http://127.0.0.1:9", remote_input="messages")
    assert repr(served) == "RemoteRewardModelEnvironment(name='reward_model_env', remote_url=['http://127.0.0.1:9/pooling'])"


@pytest.fixture(scope="module")
def served_rm(tiny_rm, tiny_tokenizer):
    """`tiny_rm` behind a real scoring server (in this process, on a thread) named "served-rm"; yields `(url,
    bodies)`, every request body received."""
    import threading

    from aiohttp import web
    from aiohttp.test_utils import TestServer

    from trl_rm_env.scoring.scorer import RewardScorer
    from trl_rm_env.serving.server.app import ScoringServer

    bodies = []

    @web.middleware
    async def record(request, handler):
        if request.method == "POST":
            bodies.append(await request.json())
        return await handler(request)

    app = ScoringServer(RewardScorer(tiny_rm, tiny_tokenizer), "served-rm").make_app()
    app.middlewares.insert(0, record)
    loop = asyncio.new_event_loop()
    server = TestServer(app, host="127.0.0.1")
    loop.run_until_complete(server.start_server())
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield str(server.make_url("")).rstrip("/"), bodies
    finally:
        asyncio.run_coroutine_threadsafe(server.close(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


def test_servers_are_sent_the_model_name_and_token_ids_of_the_given_tokenizer(served_rm, tiny_rm, tiny_tokenizer, tiny_dir):
    url, bodies = served_rm
    prompts = [[{"role": "user", "content": "Hi"}], [{"role": "user", "content": "2+2?"}]]
    completions = [say("Hello."), say("Four.")]
    want = reference_scores(tiny_rm, tiny_tokenizer, prompts, completions).tolist()
    env = RemoteRewardModelEnvironment("served-rm", tiny_tokenizer, remote_url=url, name="remote_rm")
    assert env.__name__ == "remote_rm" and env.tokenizer is tiny_tokenizer and env.engine == "remote"
    assert env.sharding == "none" and env.model is None
    bodies.clear()
    assert asyncio.run(env(prompts, completions)) == pytest.approx(want, abs=1e-4)
    assert sorted(b["input"] for b in bodies) == sorted(reference_ids(tiny_tokenizer, p, c) for p, c in zip(prompts, completions))
    assert {b["model"] for b in bodies} == {"served-rm"}
    # The model's own tokenizer where none is given and the model names one (its folder); none for messages.
    path = str(tiny_dir / "reward_model")
    assert RewardModelEnvironment(path, remote_url=url).tokenizer.name_or_path == path
    assert RewardModelEnvironment(path, remote_url=url, remote_input="messages").tokenizer is None
    assert RewardModelEnvironment(path, remote_url=url, remote_api="openrlhf").tokenizer is None  # none to render
    with pytest.raises(ValueError, match=r"(?s)^rm: remote_input='tokens' needs the reward model's tokenizer; "
                                         r"'no-such-rm' is not one \(.+\)\. Give tokenizer= \(its path or Hub id\)\.$"):  # fmt: skip
        RewardModelEnvironment("no-such-rm", remote_url=url, remote_input="tokens", name="rm")


def test_pickling_sends_arguments_and_loads_on_first_use(tiny_dir, tiny_rm, tiny_tokenizer, monkeypatch, caplog):
    path = str(tiny_dir / "reward_model")
    with pytest.raises(TypeError, match=re.escape(
            "RewardModelEnvironment was built from a loaded model, so pickling it would copy its weights and it could not "
            "be rebuilt in another process (AsyncGRPO scores in a spawned one). Build it from the model's path or Hub "
            "id, or serve the model (`trl-rm-env serve`) and pass remote_url.") + "$"):  # fmt: skip
        pickle.dumps(RewardModelEnvironment(tiny_rm, tiny_tokenizer, device="cpu"))
    env = RewardModelEnvironment(path, device="cpu", name="rm")
    twin = copy.copy(env)  # a shallow copy: the same model, its own attributes
    assert type(twin) is RewardModelEnvironment and twin.model is env.model and twin.__name__ == "rm"
    twin.__name__ = "twin"
    assert env.__name__ == "rm"
    prompts, completions = [[{"role": "user", "content": "Hi"}]], [say("Hello.")]
    want = reference_scores(env.model, env.tokenizer, prompts, completions).tolist()
    monkeypatch.setattr(pickling, "_warned", set())
    with caplog.at_level(logging.WARNING, logger="trl_rm_env.rewards.pickling"):
        blob = pickle.dumps(env)
        unpickled = pickle.loads(blob)
        assert "_pending" in unpickled.__dict__ and unpickled.__name__ == "rm"
        unnamed = pickle.loads(pickle.dumps(RewardModelEnvironment(path, device="cpu")))
        assert "_pending" in unnamed.__dict__ and unnamed.__name__ == "reward_model_env"  # RewardOptions' default name
        assert pickle.loads(pickle.dumps(unpickled)).__dict__["_pending"] == unpickled.__dict__["_pending"]
        assert "_pending" in unpickled.__dict__  # pickled again as it came, without loading
        assert unpickled(prompts, completions) == pytest.approx(want, abs=1e-4)  # built on the CPU: rebuilt as given
        # Built on an accelerator this process has: rebuilt as given, no warning.
        env._built_on = "cuda"
        monkeypatch.setattr(pickling, "_available", lambda device_type: device_type in ("cpu", "cuda"))
        again = pickle.loads(pickle.dumps(env))
        assert again(prompts, completions) == pytest.approx(want, abs=1e-4)
    assert [r for r in caplog.records if r.name == pickling.logger.name] == []


def test_where_the_model_runs_is_refused_in_one_line_when_it_cannot(tiny_rm, tiny_tokenizer):
    with pytest.raises(ValueError, match=re.escape(
            "retries, timeout: options of a reward model behind servers; this one is loaded here (give remote_url to "
            "score on servers)") + "$"):  # fmt: skip
        RewardModelEnvironment(tiny_rm, tiny_tokenizer, timeout=5.0, retries=2)
    with pytest.raises(TypeError, match=re.escape(
            "RewardModelEnvironment needs a model (a path, a Hub id or a loaded reward model), or remote_url") + "$"):
        RewardModelEnvironment()
    with pytest.raises(TypeError, match=r"^with remote_url, model is the model name sent to the servers, not a loaded "
                                        r"model$"):  # fmt: skip
        RewardModelEnvironment(tiny_rm, remote_url="http://127.0.0.1:9")
    names = RewardModelEnvironment.argument_names()  # what from_config and the recipes accept by name
    assert {"remote_url", "fsdp_shard", "batch_size", "name", "timeout", "answer_length_coeff",
            "overlong_buffer_length", "reference_column", "ensemble"} <= names  # fmt: skip
    assert "model" not in names and "tokenizer" not in names and "options" not in names


def test_an_unpickled_reward_function_loads_only_for_its_own_attributes(tiny_dir):
    env = RewardModelEnvironment(str(tiny_dir / "reward_model"), device="cpu")
    with pytest.raises(AttributeError, match=r"^'RewardModelEnvironment' object has no attribute 'nope'$"):
        env.nope  # noqa: B018
    pending = pickle.loads(pickle.dumps(env))
    # What `inspect` and `copy` look up on any object (a dunder, Python 3.12's coroutine marker): no load.
    assert not hasattr(pending, "_is_coroutine_marker") and not hasattr(pending, "__array__")
    assert "_pending" in pending.__dict__
    with pytest.raises(AttributeError, match=r"^'RewardModelEnvironment' object has no attribute '__array__'$"):
        pending.__array__  # noqa: B018
    assert pending.engine == "hf" and "_pending" not in pending.__dict__  # its own attribute: loaded


def test_checkpoint_statistics_are_the_pair_saved_in_the_config():
    from types import SimpleNamespace

    from trl_rm_env.rewards.reward_model import checkpoint_statistics

    assert checkpoint_statistics(SimpleNamespace(reward_mean=2, reward_std="4.5")) == (2.0, 4.5)
    assert checkpoint_statistics(SimpleNamespace(reward_mean=2.0)) is None  # both or neither
    assert checkpoint_statistics(SimpleNamespace(reward_std=4.0)) is None
    assert checkpoint_statistics(SimpleNamespace()) is None


def test_reward_calls_show_no_progress_bar_and_ensembles_read_every_head(regression, tiny_rm, tiny_tokenizer, capfd):
    """Nine samples scored one per forward (nine batches, past the 8 after which `show_progress=None` shows a bar
    where it is not told otherwise): a reward call shows none unless `show_progress` says so. `ensemble="min"` is each
    sample's smaller output."""
    model, _ = regression
    prompts = [[{"role": "user", "content": f"Question {i}?"}] for i in range(9)]
    completions = [say(f"Answer {i}.") for i in range(9)]
    capfd.readouterr()
    RewardModelEnvironment(model, tiny_tokenizer, device="cpu", batch_size=1, ensemble="min")(prompts, completions)
    RewardModelEnvironment(tiny_rm, tiny_tokenizer, device="cpu", batch_size=1)(prompts, completions)
    assert "Scoring" not in capfd.readouterr().err
    shown = RewardModelEnvironment(model, tiny_tokenizer, device="cpu", batch_size=1, ensemble="min", show_progress=True)
    rewards = shown(prompts[:2], completions[:2])
    assert "Scoring: 100%" in capfd.readouterr().err
    want = plain_outputs(model, tiny_tokenizer, prompts[:2], completions[:2]).min(dim=1).values
    assert rewards == pytest.approx(want.tolist(), abs=1e-4)


def test_each_call_gathers_a_sharded_model(tiny_rm, tiny_tokenizer, monkeypatch):
    """Under FSDP2 every call (a reward call, `score`) runs inside the gathering of the environment's own model (a
    stand-in for `FullWeights`, which needs several processes)."""
    gathered = record_full_weights(monkeypatch)
    env = RewardModelEnvironment(tiny_rm, tiny_tokenizer, device="cpu")
    env.sharding = "fsdp2"  # as shard_if_requested sets it under FSDP2
    prompts, completions = [[{"role": "user", "content": "Hi"}]], [say("Hello.")]
    want = reference_scores(tiny_rm, tiny_tokenizer, prompts, completions).tolist()
    assert env(prompts, completions) == pytest.approx(want, abs=1e-4)
    assert env.score([prompts[0] + completions[0]]).tolist() == pytest.approx(want, abs=1e-4)
    assert len(gathered) == 2 and all(m is tiny_rm for m in gathered)


def test_options_that_cannot_go_together_are_refused_naming_them(tiny_rm, tiny_tokenizer, tiny_dir, caplog):
    from trl_rm_env.tiny_models import build_tiny_reward_model

    path, served = str(tiny_dir / "reward_model"), {"remote_url": "http://127.0.0.1:9", "remote_input": "messages"}
    with pytest.raises(ValueError, match=re.escape(
            "reference_column bounds the reward in (0, 1); normalization='checkpoint' applies the checkpoint's "
            "statistics of raw scores, which mean nothing there: use 'running' or 'none'") + "$"):  # fmt: skip
        RewardModelEnvironment(tiny_rm, tiny_tokenizer, reference_column="gold", normalization="checkpoint")
    heads = re.escape("ensemble reads every head of a multi-head model loaded here, from one forward: not with "
                      "remote_url (servers return one reward per item) nor with reference_column") + "$"  # fmt: skip
    with pytest.raises(ValueError, match=heads):
        RewardModelEnvironment("rm", ensemble="min", **served)
    with pytest.raises(ValueError, match=heads):
        RewardModelEnvironment(tiny_rm, tiny_tokenizer, ensemble="min", reference_column="gold")
    with pytest.raises(ValueError, match=re.escape(f"ensemble aggregates the heads of a multi-head model; {path} has "
                                                   "one output") + "$"):  # fmt: skip
        RewardModelEnvironment(path, device="cpu", ensemble="min")
    with pytest.raises(ValueError, match=r"^fsdp_shard shards a reward model loaded here; with remote_url a server "
                                         r"holds it$"):  # fmt: skip
        RewardModelEnvironment("rm", fsdp_shard=True, **served)
    with pytest.raises(ValueError, match=re.escape(
            "batch_size: applied by a reward model scored in this process, not by one behind a server; give them to "
            "the server (`trl-rm-env serve --help`) or drop them") + "$"):  # fmt: skip
        RewardModelEnvironment("rm", batch_size=4, **served)
    with pytest.raises(TypeError, match=r"^unexpected keyword argument\(s\) \['bogus'\]; accepted: \[") as refused:
        RewardModelEnvironment(tiny_rm, tiny_tokenizer, bogus=1)
    accepted = ast.literal_eval(str(refused.value).split("accepted: ", 1)[1])
    assert {"model", "tokenizer", "remote_url", "fsdp_shard", "options", "batch_size", "name"} <= set(accepted)
    with pytest.raises(ValueError, match=r"^engine='vllm' cannot serve this reward model: fsdp_shard=True shards a "
                                         r"transformers model$"):  # fmt: skip
        RewardModelEnvironment(path, engine="vllm", fsdp_shard=True)
    config = {"enabled": True, "model_name": path, "tokenizer": {"name": path, "chat_template": "{{ messages }}"}}
    with pytest.raises(ValueError, match=re.escape(
            "tokenizer.chat_template is applied where conversations are rendered, here; with remote_url and no "
            "reward-model tokenizer they go as messages that the server renders with its own template. Give "
            "tokenizer.name (the reward model's tokenizer) so token ids are sent.") + "$"):  # fmt: skip
        RewardModelEnvironment.from_config(config, **served)
    # A checkpoint trained with ensemble_heads: its reward is the mean of its heads, said once at INFO.
    model = build_tiny_reward_model(tiny_tokenizer, num_labels=3)
    model.config.ensemble_heads, model.config._name_or_path = 3, "tiny-heads"
    with caplog.at_level(logging.INFO, logger="trl_rm_env.rewards.reward_model"):
        env = RewardModelEnvironment(model, tiny_tokenizer, device="cpu")
    assert [r.getMessage() for r in caplog.records if r.name == "trl_rm_env.rewards.reward_model"] == [
        "tiny-heads is an ensemble of 3 heads (ensemble_heads): its reward is their mean (ensemble='mean'; "
        "label_index=k reads head k alone)."
    ]
    assert (env.ensemble.ensemble, env.ensemble.ensemble_penalty) == ("mean", 1.0)
    # K even as well as odd: two heads are an ensemble too; the reward is their mean, as one forward of the plain
    # model gives it.
    two = build_tiny_reward_model(tiny_tokenizer, seed=3, num_labels=2)
    two.config.ensemble_heads, two.config._name_or_path = 2, "tiny-two-heads"
    env = RewardModelEnvironment(two, tiny_tokenizer, device="cpu")
    assert env.ensemble.ensemble == "mean"
    prompts, completions = [[{"role": "user", "content": "Hi"}]] * 2, [say("Hello."), say("Go away.")]
    with torch.no_grad():
        want = [two(**tiny_tokenizer(reference_text(tiny_tokenizer, p, c), return_tensors="pt")).logits[0].mean().item()
                for p, c in zip(prompts, completions)]  # fmt: skip
    assert env(prompts, completions) == pytest.approx(want, abs=1e-4)


def test_checkpoint_normalization_reads_the_configs_statistics(tiny_tokenizer):
    from trl_rm_env.tiny_models import build_tiny_reward_model

    model = build_tiny_reward_model(tiny_tokenizer, seed=1)
    model.config.reward_mean, model.config.reward_std = 0.5, 2.0  # what RankedRewardTrainer saves
    prompts, completions = [[{"role": "user", "content": "Hi"}]] * 2, [say("Hello."), say("Go away.")]
    env = RewardModelEnvironment(model, tiny_tokenizer, device="cpu", normalization="checkpoint")
    want = (reference_scores(model, tiny_tokenizer, prompts, completions) - 0.5) / 2.0
    assert env(prompts, completions) == pytest.approx(want.tolist(), abs=1e-4)


def test_an_unpickled_copy_is_rebuilt_with_every_argument_given(tiny_dir, tiny_tokenizer, monkeypatch):
    """The tokenizer (here one whose chat template shouts the roles), the `ScoringOptions` (an over-long completion
    given `overlength_reward`) and `fsdp_shard` (seen by a stand-in for the sharding step) come along."""
    from trl_rm_env.runtime import loading
    from trl_rm_env.runtime.model_options import ScoringOptions

    path = str(tiny_dir / "reward_model")
    shouting = copy.deepcopy(tiny_tokenizer)
    shouting.chat_template = tiny_tokenizer.chat_template.replace("message['role']", "message['role'] | upper")
    assert shouting.chat_template != tiny_tokenizer.chat_template
    options = ScoringOptions(max_length=64, truncation="none", overlength_reward=-5.0)
    sharded = []

    def shard_if_requested(model, fsdp_shard, log, kind):
        sharded.append(fsdp_shard)
        return "none"

    monkeypatch.setattr(loading, "shard_if_requested", shard_if_requested)
    env = RewardModelEnvironment(path, shouting, device="cpu", options=options, fsdp_shard=False)
    prompts = [[{"role": "user", "content": "Hi"}]] * 2
    completions = [say("Hello."), say("Hello. " * 20)]  # 28 and 143 tokens: the second over 64
    want = reference_scores(env.model, shouting, prompts[:1], completions[:1]).tolist() + [-5.0]
    assert env(prompts, completions) == pytest.approx(want, abs=1e-4)
    unpickled = pickle.loads(pickle.dumps(env))
    assert unpickled(prompts, completions) == pytest.approx(want, abs=1e-4)
    assert sharded == [False, False]


def test_the_local_scorer_reports_where_its_weights_are(tiny_rm, tiny_tokenizer, monkeypatch, caplog):
    """`sharding` is "none" in one process and the engine's reason is logged (a loaded model: transformers); a model
    the engine holds itself (vLLM: no `model` here) is not sharded; and the sharding step warns through the
    environment's logger (a ZeRO-3 launch whose reward model was loaded before its GRPOConfig, in a simulated world
    of 2)."""
    from types import SimpleNamespace

    from trl_rm_env.rewards import backend, reward_model
    from trl_rm_env.runtime import plan
    from trl_rm_env.runtime.model_options import ScoringOptions

    monkeypatch.setattr(plan, "_logged_choices", set())  # said once per process: here, said now
    with caplog.at_level(logging.INFO, logger="trl_rm_env.runtime.plan"):
        env = RewardModelEnvironment(tiny_rm, tiny_tokenizer, device="cpu")
    assert env.sharding == "none"
    assert [r.getMessage() for r in caplog.records if r.name == "trl_rm_env.runtime.plan"] == [
        "Reward model scoring engine: transformers (the model is already loaded in this process)"
    ]
    caplog.clear()
    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")
    monkeypatch.setenv("ACCELERATE_DEEPSPEED_ZERO_STAGE", "3")
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda group=None: 2)
    with caplog.at_level(logging.WARNING, logger=reward_model.logger.name):
        assert RewardModelEnvironment(tiny_rm, tiny_tokenizer, device="cpu").sharding == "none"
    assert [r.getMessage() for r in caplog.records if r.name == reward_model.logger.name] == [
        "The Accelerate config is DeepSpeed ZeRO-3 but the reward model is not partitioned: it was loaded before the "
        "training arguments (GRPOConfig) existed, so every process holds a full copy. Create the GRPOConfig first, "
        "then RewardModelEnvironment (as recipes/grpo_rm.py does), to partition it."
    ]

    # The scorer is loaded asking for its weights to be held as the launch says, and says how they are held (a
    # model an engine holds, vLLM's, is never sharded: tests/test_judge_engines.py, `load_engine`).
    asked = []
    engine = SimpleNamespace(sharding="fsdp2", name="hf", device=torch.device("cpu"))
    held = SimpleNamespace(engine=engine, tokenizer=tiny_tokenizer, model=None, config=None, head=None)
    monkeypatch.setattr(backend, "load_reward_scorer", lambda model, options, **kw: asked.append((model, kw)) or held)
    got = backend.connect("reward", "RM", "org/rm", tiny_tokenizer, options=ScoringOptions(), fsdp_shard=True)
    assert got.runs is held and got.sharding == "fsdp2" and got.engine == "hf"
    assert asked == [("org/rm", {"tokenizer": tiny_tokenizer, "hf_only": "fsdp_shard=True shards a transformers model",
                                 "shard": True, "fsdp_shard": True, "check_tokenizer": None, "log": backend.logger})]


def test_from_config_sends_the_blocks_model_and_tokenizer_to_servers(served_rm, tiny_rm, tiny_tokenizer, tiny_dir):
    """A NeMo RL `reward_model` block behind servers (`remote_url` given to `from_config` or in the block): its
    `model_name` is sent, its tokenizer renders token ids, and the options only a model loaded here applies
    (`batch_size`, `precision`) are the server's, not refused; `grpo.reward_shaping` applies here."""
    url, bodies = served_rm
    path = str(tiny_dir / "reward_model")
    block = {"enabled": True, "model_name": "served-rm", "tokenizer": {"name": path}, "batch_size": 4,
             "precision": "float32"}  # fmt: skip
    shaping = {"enabled": True, "stop_properly_penalty_coef": 0.5, "eos_token_id": 2}
    env = RewardModelEnvironment.from_config(block, reward_shaping=shaping, remote_url=url)
    assert env.length_shaping.stop_properly_penalty_coef == 0.5 and env.length_shaping.eos_token_id == [2]
    prompts, completions = [[{"role": "user", "content": "Hi"}]], [say("Hello.")]
    bodies.clear()
    want = reference_scores(tiny_rm, tiny_tokenizer, prompts, completions).tolist()
    assert asyncio.run(RewardModelEnvironment.from_config(block, remote_url=url)(prompts, completions)) == pytest.approx(
        want, abs=1e-4
    )
    assert bodies == [{**bodies[0], "model": "served-rm", "input": reference_ids(tiny_tokenizer, prompts[0], completions[0])}]
    in_block = RewardModelEnvironment.from_config({**block, "remote_url": url})
    assert in_block.remote_url == [f"{url}/pooling"]


def test_from_config_applies_and_pickles_the_blocks_chat_template(tiny_dir, tiny_tokenizer):
    path = str(tiny_dir / "reward_model")
    shouting = copy.deepcopy(tiny_tokenizer)
    shouting.chat_template = tiny_tokenizer.chat_template.replace("message['role']", "message['role'] | upper")
    block = {"enabled": True, "model_name": path, "tokenizer": {"name": path, "chat_template": shouting.chat_template}}
    env = RewardModelEnvironment.from_config(block, device="cpu")
    prompts, completions = [[{"role": "user", "content": "Hi"}]], [say("Hello.")]
    want = reference_scores(env.model, shouting, prompts, completions).tolist()
    assert env.tokenizer.chat_template == shouting.chat_template
    assert env(prompts, completions) == pytest.approx(want, abs=1e-4)
    assert pickle.loads(pickle.dumps(env))(prompts, completions) == pytest.approx(want, abs=1e-4)
