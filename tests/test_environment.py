"""RewardModelEnvironment: TRL reward-function parity, bad inputs, metrics, normalization, NeMo RL config, GRPO."""

from __future__ import annotations

import copy
import json
import re
import shutil

import numpy as np
import pytest
import torch
from datasets import Dataset
from helpers import (  # noqa: F401
    _one_thread,
    grpo_config,
    record_scored_batches,
    reference_ids,
    reference_scores,
    reference_text,
    score_one,
    watch_passes,
)
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from trl_rm_env import RewardModelEnvironment


def assert_scores(got, want, atol=1e-4):
    torch.testing.assert_close(torch.as_tensor(got, dtype=torch.float32), want, atol=atol, rtol=0)


# ---------------------------------------------------------------------------------------------------- data

LONG = " ".join(f"Step {i}: add {i} and {i + 1} to get {2 * i + 1}." for i in range(8))


def grpo_batch(num_prompts=3, num_generations=3):
    """A batch as GRPOTrainer builds it: each prompt object repeated `num_generations` times, one completion each."""
    answers = ["4", "", LONG, "The answer is 4.", "Ok", "2 + 2 = 5. The answer is 5.", LONG[:90], "four", "   x"]
    prompts, completions = [], []
    for p in range(num_prompts):
        prompt = [{"role": "system", "content": "You are a careful math tutor."}] * (p % 2) + [
            {"role": "user", "content": f"What is {p} plus {p + 2}?" + " Explain." * p}
        ]
        for g in range(num_generations):
            prompts.append(prompt)
            completions.append([{"role": "assistant", "content": answers[(p * num_generations + g) % len(answers)]}])
    return prompts, completions


def msg(content):
    return [{"role": "assistant", "content": content}]


USER = [{"role": "user", "content": "What is 2+2?"}]


@pytest.fixture(scope="module")
def make_env(tiny_rm, tiny_tokenizer):
    def make(**kwargs):
        return RewardModelEnvironment(tiny_rm, tiny_tokenizer, device="cpu", **kwargs)

    return make


@pytest.fixture(scope="module")
def saved_rm(tiny_dir):
    """The saved tiny RM folder, with its tokenizer and fp32 model loaded independently of the env."""
    path = tiny_dir / "reward_model"
    return path, AutoTokenizer.from_pretrained(path), AutoModelForSequenceClassification.from_pretrained(path).eval()


@pytest.fixture(scope="module")
def batch_reference(tiny_rm, tiny_tokenizer):
    prompts, completions = grpo_batch()
    return prompts, completions, reference_scores(tiny_rm, tiny_tokenizer, prompts, completions)


# ---------------------------------------------------------------------------------------------------- parity


@pytest.mark.parametrize(
    "options",
    [
        {"batch_size": 1},
        {"batch_size": 3},
        {"batch_size": 8},
        {},
        {"batch_size": 10_000},
        {"max_tokens_per_batch": 256},
    ],
    ids=["bs1", "bs3", "bs8", "default", "all", "budget"],
)
@pytest.mark.parametrize("sharing", [False, True], ids=["plain", "shared"])
def test_call_parity(make_env, batch_reference, options, sharing):
    prompts, completions, want = batch_reference
    env = make_env(prefix_sharing=sharing, **options)
    with watch_passes(env) as passes:
        rewards = env(prompts=prompts, completions=completions, completion_ids=None)
    assert isinstance(rewards, list) and len(rewards) == len(prompts)
    assert all(isinstance(r, float) for r in rewards)
    assert_scores(rewards, want)
    assert want.unique().numel() == len(prompts)  # distinct scores, so an order mix-up would be seen
    shapes = passes.shapes
    if sharing:  # every item of a group shares its prompt; passes keep to the row and token bounds
        assert passes.shared == list(range(len(prompts)))
        assert max(rows for rows, _ in shapes) <= options.get("batch_size", 32)
        if "max_tokens_per_batch" in options:
            assert all(rows * keys <= 256 for rows, keys in passes.key_shapes)
    elif "max_tokens_per_batch" in options:
        assert all(rows * length <= 256 for rows, length in shapes) and len(shapes) > 1
    else:
        assert max(rows for rows, _ in shapes) == min(options.get("batch_size", 32), len(prompts))
    # Input order is kept: a shuffled batch gives the shuffled rewards.
    perm = torch.randperm(len(prompts), generator=torch.Generator().manual_seed(0)).tolist()
    shuffled = env(prompts=[prompts[i] for i in perm], completions=[completions[i] for i in perm])
    assert_scores(shuffled, want[perm])


def test_plain_text_parity(make_env, tiny_rm, tiny_tokenizer):
    eos = tiny_tokenizer.eos_token
    prompts = ["What is 1 + 1? ", "Compute 7 + 8. ", "Please add 3 and 4. " * 4, "Hi"]
    completions = ["The answer is 2.", "15" + eos, LONG, " there"]
    env = make_env(batch_size=3)
    want = reference_scores(tiny_rm, tiny_tokenizer, prompts, completions)
    assert_scores(env(prompts, completions), want)
    # The reference appends EOS: without it the score would differ, so the EOS rule is really checked.
    assert abs(score_one(tiny_rm, tiny_tokenizer(prompts[0] + completions[0])["input_ids"]) - want[0].item()) > 1e-4


def test_bos_template_from_saved_folder(bos_tiny_dir):
    path = bos_tiny_dir / "reward_model"
    env = RewardModelEnvironment(path, device="cpu", batch_size=4)
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForSequenceClassification.from_pretrained(path).eval()
    prompts, completions = grpo_batch()
    encoded = env.scorer.encode(prompts, completions)
    bos = tok.bos_token_id
    assert bos is not None
    for ids, p, c in zip(encoded.ids, prompts, completions):
        assert ids[0] == bos and ids.count(bos) == 1
        assert ids == reference_ids(tok, p, c)
    assert_scores(env(prompts, completions), reference_scores(model, tok, prompts, completions))


def test_policy_tokenizer_with_other_vocabulary(make_env, tiny_rm, tiny_tokenizer, other_vocab_tokenizer):
    """The env reads strings with the RM's tokenizer; the policy's completion_ids are ignored."""
    prompts, completions = grpo_batch()
    policy_ids = [other_vocab_tokenizer(c[0]["content"], add_special_tokens=False)["input_ids"] for c in completions]
    rm_ids = [tiny_tokenizer(c[0]["content"], add_special_tokens=False)["input_ids"] for c in completions]
    assert any(a != b for a, b in zip(policy_ids, rm_ids) if a)  # the vocabularies really differ
    env = make_env(batch_size=4)
    want = reference_scores(tiny_rm, tiny_tokenizer, prompts, completions)
    assert_scores(env(prompts, completions, completion_ids=policy_ids), want)
    assert_scores(env(prompts, completions, completion_ids=[[10**6]] * len(prompts)), want)
    # Reading the policy tokenizer's ids with the RM would give other scores.
    wrong = [score_one(tiny_rm, reference_ids(other_vocab_tokenizer, p, c)) for p, c in zip(prompts, completions)]
    assert (torch.tensor(wrong) - want).abs().max() > 1e-3


def test_score_returns_fp32_tensor(make_env, tiny_rm, tiny_tokenizer):
    prompts, completions = grpo_batch(2, 2)
    env = make_env(batch_size=3, normalization="running", clip=0.01)  # score() ignores both
    want = reference_scores(tiny_rm, tiny_tokenizer, prompts, completions)
    scores = env.score([p + c for p, c in zip(prompts, completions)])
    assert isinstance(scores, torch.Tensor) and scores.dtype == torch.float32 and scores.shape == (4,)
    assert_scores(scores, want)
    assert_scores(env.score(list(zip(prompts, completions))), want)
    plain = env.score([("Q: 2+2? ", "4")])
    assert_scores(plain, reference_scores(tiny_rm, tiny_tokenizer, ["Q: 2+2? "], ["4"]))
    with pytest.raises(ValueError, match="does not end with an assistant message"):
        env.score([USER])


# ---------------------------------------------------------------------------------------------------- bad inputs


def test_empty_completions_scored_as_empty_turn_by_default(make_env, tiny_rm, tiny_tokenizer):
    prompts = [USER, USER, USER, "Plain prompt. "]
    completions = [msg(""), msg(" \n\t "), msg("4"), ""]
    env = make_env()
    logged = {}
    rewards = env(prompts, completions, log_metric=logged.__setitem__)
    assert_scores(rewards, reference_scores(tiny_rm, tiny_tokenizer, prompts, completions))
    assert logged["reward_model_env/num_empty"] == 3.0


def test_empty_completion_reward(make_env, tiny_rm, tiny_tokenizer):
    prompts = [USER, USER, USER, "Plain prompt. ", "Plain prompt. "]
    completions = [msg(""), msg(" \n\t "), msg("4"), "", "Four."]
    env = make_env(empty_completion_reward=-5.0)
    logged = {}
    rewards = env(prompts, completions, log_metric=logged.__setitem__)
    assert rewards[0] == rewards[1] == rewards[3] == -5.0
    want = reference_scores(tiny_rm, tiny_tokenizer, [USER, "Plain prompt. "], [msg("4"), "Four."])
    assert_scores([rewards[2], rewards[4]], want)
    assert logged["reward_model_env/num_empty"] == 3.0
    # All empty: nothing reaches the model.
    assert env([USER, USER], [msg(""), msg(" ")]) == [-5.0, -5.0]


def test_reasoning_only_completion_counts_as_empty(make_env):
    """With strip_reasoning, a completion that is all `<think>` (e.g. cut off mid-thought) has no answer."""
    env = make_env(strip_reasoning=True, empty_completion_reward=-5.0)
    logged = {}
    rewards = env(
        [USER, USER], [msg("<think>2+2 is</think>\n"), msg("<think>never closed")], log_metric=logged.__setitem__
    )
    assert rewards == [-5.0, -5.0] and logged["reward_model_env/num_empty"] == 2.0


@pytest.mark.parametrize(
    ("completion", "error", "match"),
    [
        (
            [{"role": "assistant", "content": None}],
            TypeError,
            r"completions\[1\]\[0\]\.content must be a string, got NoneType",
        ),
        (
            [{"role": "assistant", "content": [{"type": "text", "text": "4"}]}],
            TypeError,
            r"completions\[1\]\[0\]\.content must be a string, got list\. Multimodal content is not supported",
        ),
        ([{"role": "assistant"}], TypeError, r"completions\[1\]\[0\] must be a message with 'role' and 'content'"),
        (None, TypeError, r"completions\[1\] must be a string or a list of messages, got NoneType"),
        ({"role": "assistant", "content": "4"}, TypeError, r"completions\[1\] must be a string or a list of messages"),
        ("4", TypeError, r"prompts\[1\] and completions\[1\] must both be text or both be message lists"),
    ],
    ids=["content-none", "content-list", "no-content", "none", "dict", "mixed-format"],
)
def test_bad_completion_raises(make_env, completion, error, match):
    env = make_env()
    with pytest.raises(error, match=match):
        env([USER, USER], [msg("4"), completion])


def test_bad_prompt_and_count_mismatch(make_env):
    env = make_env()
    with pytest.raises(ValueError, match=r"got 3 prompts but 2 completions; there must be one prompt per completion"):
        env([USER] * 3, [msg("4")] * 2)
    with pytest.raises(TypeError, match=r"prompts\[0\]\[0\]\.content must be a string, got NoneType"):
        env([[{"role": "user", "content": None}]], [msg("4")])


def test_nonfinite_reward(tiny_rm, tiny_tokenizer):
    broken = copy.deepcopy(tiny_rm)
    with torch.no_grad():
        broken.score.weight.fill_(float("nan"))
    prompts, completions = grpo_batch(1, 3)
    env = RewardModelEnvironment(broken, tiny_tokenizer, device="cpu")
    with pytest.raises(FloatingPointError, match=r"NaN/inf for item\(s\) \[0, 1, 2\].*set `nonfinite_reward`"):
        env(prompts, completions)
    env = RewardModelEnvironment(broken, tiny_tokenizer, device="cpu", nonfinite_reward=-3.0)
    assert env(prompts, completions) == [-3.0] * 3


def poisoned_lengths(monkeypatch, model, value: float) -> list[int]:
    """`model`'s forward writes `value` on the rows whose token count is in the returned list (the test fills it). It
    finds them by their attention mask: the plain path (prefix sharing's KV-cache passes see contexts and completions
    apart)."""
    forward, lengths = model.forward, []

    def poisoned(*args, **kwargs):
        out = forward(*args, **kwargs)
        out.logits[torch.isin(kwargs["attention_mask"].sum(-1), torch.tensor(lengths))] = value
        return out

    monkeypatch.setattr(model, "forward", poisoned)
    return lengths


def test_nonfinite_reward_only_replaces_bad_rows(make_env, batch_reference, monkeypatch, tiny_rm, tiny_tokenizer):
    prompts, completions, want = batch_reference
    model = copy.deepcopy(tiny_rm)
    bad = 2
    bad_length = len(reference_ids(tiny_tokenizer, prompts[bad], completions[bad]))
    assert [len(reference_ids(tiny_tokenizer, p, c)) for p, c in zip(prompts, completions)].count(bad_length) == 1
    poisoned_lengths(monkeypatch, model, float("inf")).append(bad_length)
    env = RewardModelEnvironment(
        model, tiny_tokenizer, device="cpu", batch_size=4, nonfinite_reward=-1.0, prefix_sharing=False
    )
    expected = want.clone()
    expected[bad] = -1.0
    assert_scores(env(prompts, completions), expected)


def test_overlength_left_truncation_and_fallback(make_env, tiny_rm, tiny_tokenizer):
    max_length = 40
    long_prompt = [{"role": "user", "content": LONG}]
    answer = msg("The answer is 4.")
    full = reference_ids(tiny_tokenizer, long_prompt, answer)
    assert len(full) > max_length
    expected_ids = full[-max_length:]  # no BOS for this tokenizer: keep the last max_length tokens
    turn = tiny_tokenizer("<|im_start|>assistant\nThe answer is 4.<|im_end|>\n")["input_ids"]
    assert expected_ids[-len(turn) :] == turn  # the completion is intact
    env = make_env(max_length=max_length)
    rewards = env([long_prompt, USER], [answer, answer])
    want = [score_one(tiny_rm, expected_ids), score_one(tiny_rm, reference_ids(tiny_tokenizer, USER, answer))]
    assert_scores(rewards, torch.tensor(want))
    # A completion that alone is too long: clear error, or the fallback reward.
    with pytest.raises(ValueError, match=r"over max_length=40 even after cutting its whole context"):
        env([USER], [msg(LONG)])
    env = make_env(max_length=max_length, overlength_reward=-2.0)
    assert env([USER, USER], [msg(LONG), answer])[0] == -2.0
    env = make_env(max_length=max_length, truncation="none", overlength_reward=-2.0)
    assert env([long_prompt, USER], [answer, answer])[0] == -2.0


# ---------------------------------------------------------------------------------------------------- metrics, name


@pytest.mark.parametrize("options", [{}, {"normalization": "running", "clip": 1.0}], ids=["raw", "normalized"])
def test_metrics(make_env, batch_reference, options):
    prompts, completions, raw = batch_reference
    env = make_env(batch_size=4, **options)
    logged = {}

    def log_metric(name, value):
        assert isinstance(value, float)
        logged[name] = value

    rewards = np.array(env(prompts, completions, completion_ids=None, log_metric=log_metric, trainer_state=None))
    assert logged["reward_model_env/num_samples"] == len(prompts)
    assert logged["reward_model_env/mean_reward"] == pytest.approx(rewards.mean(), abs=1e-5)
    assert logged["reward_model_env/std_reward"] == pytest.approx(rewards.std(), abs=1e-5)
    assert logged["reward_model_env/min_reward"] == pytest.approx(rewards.min(), abs=1e-6)
    assert logged["reward_model_env/max_reward"] == pytest.approx(rewards.max(), abs=1e-6)
    assert logged["reward_model_env/num_empty"] == 1.0  # grpo_batch has one empty answer
    if options:
        assert logged["reward_model_env/raw_mean_reward"] == pytest.approx(raw.mean().item(), abs=1e-5)
        assert not np.allclose(rewards, raw.numpy(), atol=1e-3)
    else:
        assert "reward_model_env/raw_mean_reward" not in logged
    assert all(name.startswith("reward_model_env/") for name in logged)


def test_name(make_env):
    from trl.trainer.utils import get_callable_name

    env = make_env()
    assert env.__name__ == "reward_model_env" and get_callable_name(env) == "reward_model_env"
    env = make_env(name="skywork_rm")
    env([USER], [msg("4")])
    assert env.__name__ == "skywork_rm" and get_callable_name(env) == "skywork_rm"
    assert "skywork_rm" in repr(env)


# ---------------------------------------------------------------------------------------------------- normalization


def test_running_normalization(make_env, tiny_rm, tiny_tokenizer):
    prompts, completions = grpo_batch(3, 3)
    first, second = slice(0, 4), slice(4, 9)
    raw = reference_scores(tiny_rm, tiny_tokenizer, prompts, completions).double()
    env = make_env(normalization="running")
    out1 = env(prompts[first], completions[first])
    out2 = env(prompts[second], completions[second])
    seen1, seen = raw[first], raw
    assert_scores(out1, ((seen1 - seen1.mean()) / seen1.std(unbiased=False)).float())
    assert_scores(out2, ((raw[second] - seen.mean()) / seen.std(unbiased=False)).float())


def test_checkpoint_normalization(saved_rm, tmp_path):
    source, tok, model = saved_rm
    path = tmp_path / "rm"
    shutil.copytree(source, path)
    mean, std = 0.25, 0.05
    config = json.loads((path / "config.json").read_text())
    config.update(reward_mean=mean, reward_std=std)
    (path / "config.json").write_text(json.dumps(config))
    prompts, completions = grpo_batch(2, 3)
    raw = reference_scores(model, tok, prompts, completions)
    env = RewardModelEnvironment(path, device="cpu", normalization="checkpoint")
    assert_scores(env(prompts, completions), (raw - mean) / std, atol=1e-3)
    env = RewardModelEnvironment(path, device="cpu", normalization="checkpoint", clip=2.0)
    assert_scores(env(prompts, completions), ((raw - mean) / std).clamp(-2.0, 2.0), atol=1e-3)
    with pytest.raises(ValueError, match="normalization='checkpoint' needs `reward_mean` and `reward_std`"):
        RewardModelEnvironment(source, device="cpu", normalization="checkpoint")


def test_clip(make_env, batch_reference):
    prompts, completions, raw = batch_reference
    clip = raw.abs().median().item()
    assert (raw.abs() > clip).any()  # the clip really bites
    env = make_env(clip=clip)
    assert_scores(env(prompts, completions), raw.clamp(-clip, clip))


def test_bad_options(make_env):
    with pytest.raises(ValueError, match="normalization must be one of"):
        make_env(normalization="batch")
    with pytest.raises(ValueError, match="clip must be > 0"):
        make_env(clip=0)
    with pytest.raises(ValueError, match="precision must be one of"):
        make_env(precision="int8")


# ---------------------------------------------------------------------------------------------------- options


def test_strip_reasoning(make_env, tiny_rm, tiny_tokenizer):
    prompts = [USER, USER, "Plain: 2+2? "]
    completions = [
        msg("<think>Two and two.\nThat is four.</think>\n\nThe answer is 4."),
        msg("Four."),
        "<think>x</think>4",
    ]
    stripped = [msg("The answer is 4."), msg("Four."), "4"]
    env = make_env(strip_reasoning=True)
    want = reference_scores(tiny_rm, tiny_tokenizer, prompts, stripped)
    assert_scores(env(prompts, completions), want)
    unstripped = reference_scores(tiny_rm, tiny_tokenizer, prompts, completions)
    assert abs(unstripped[0] - want[0]) > 1e-4


def test_bf16_on_cpu_close_to_fp32(saved_rm):
    path, tok, model = saved_rm
    prompts, completions = grpo_batch()
    want = reference_scores(model, tok, prompts, completions)
    env = RewardModelEnvironment(path, device="cpu", precision="bf16", batch_size=4)
    assert env.model.dtype == torch.bfloat16
    rewards = torch.tensor(env(prompts, completions))
    assert torch.isfinite(rewards).all()
    scale = want.abs().max().item()
    assert (rewards - want).abs().max().item() < 0.05 + 0.05 * scale
    assert torch.corrcoef(torch.stack([rewards, want]))[0, 1] > 0.95


# ---------------------------------------------------------------------------------------------------- from_config


def nemo_rl_config(path, **overrides):
    """The shape of NeMo RL's `env.reward_model` block (examples/configs/grpo_rm_*.yaml)."""
    config = {
        "enabled": True,
        "model_name": str(path),
        "tokenizer": {"name": str(path)},
        "precision": "float32",
        "batch_size": 4,
        "checkpoint_path": None,
        "max_model_len": 1024,
        "logprob_batch_size": 8,
        "resources": {"gpus_per_node": 1, "num_nodes": 1},
        "reward_model_cfg": {"enabled": True, "reward_model_type": "bradley_terry"},
        "dtensor_cfg": {"enabled": True, "cpu_offload": False, "sequence_parallel": False, "tensor_parallel_size": 1},
        "dynamic_batching": {"enabled": True, "logprob_mb_tokens": 2048, "train_mb_tokens": 2048},
        "sequence_packing": {"enabled": False},
        "max_grad_norm": None,
        "offload_optimizer_for_logprob": False,
        "make_sequence_length_divisible_by": 1,
    }
    config.update(overrides)
    return config


def test_from_config(saved_rm):
    path, tok, model = saved_rm
    env = RewardModelEnvironment.from_config(nemo_rl_config(path), device="cpu", name="nemo_rm")
    assert env.__name__ == "nemo_rm"
    assert env.scorer.options.batch_size == 4 and env.scorer.options.max_tokens_per_batch == 2048 and env.scorer.max_length == 1024
    assert env.model.dtype == torch.float32
    direct = RewardModelEnvironment(path, device="cpu")
    prompts, completions = grpo_batch()
    want = reference_scores(model, tok, prompts, completions)
    with watch_passes(env) as passes:
        rewards = env(prompts, completions)
    assert_scores(rewards, want)
    assert_scores(rewards, torch.tensor(direct(prompts, completions)), atol=1e-5)
    assert passes.shapes and all(rows <= 4 and rows * length <= 2048 for rows, length in passes.shapes)
    # Our own keys ride along; bf16 precision is mapped.
    env = RewardModelEnvironment.from_config(
        nemo_rl_config(path, precision="bfloat16", clip=0.5, dynamic_batching={"enabled": False}), device="cpu"
    )
    assert env.model.dtype == torch.bfloat16 and env.clip == 0.5 and env.scorer.options.max_tokens_per_batch is None


def test_from_config_reads_nemo_rls_reward_shaping_block(saved_rm):
    """`from_config(rm_block, reward_shaping=grpo_block)`: NeMo RL's DAPO overlong buffer on the reward model's
    rewards, read from TRL's completion_ids, equal to the same option given by our own name."""
    path, tok, model = saved_rm
    prompts, completions = grpo_batch()
    ids = [[5] * (3 + i) for i in range(len(prompts))]  # 3 to 11 tokens
    block = {"enabled": True, "overlong_buffer_length": 4, "overlong_buffer_penalty": 1.0, "max_response_length": 8}
    env = RewardModelEnvironment.from_config(nemo_rl_config(path), reward_shaping=block, device="cpu")
    ours = RewardModelEnvironment.from_config(nemo_rl_config(path), device="cpu", overlong_buffer_length=4,
                                              overlong_buffer_penalty=1.0, max_response_length=8)  # fmt: skip
    plain = RewardModelEnvironment.from_config(nemo_rl_config(path), device="cpu")
    got, want = env(prompts, completions, completion_ids=ids), ours(prompts, completions, completion_ids=ids)
    base = plain(prompts, completions, completion_ids=ids)
    assert got == want
    penalties = [min(0.0, -(len(i) - 4) / 4 * 1.0) for i in ids]  # expected length 8 - 4
    assert_scores(got, torch.tensor([b + p for b, p in zip(base, penalties)]), atol=1e-6)
    assert any(p < 0 for p in penalties)


def test_from_config_errors(tiny_dir):
    path = tiny_dir / "reward_model"
    with pytest.raises(ValueError, match=r"Unsupported reward_model config key\(s\) \['reward_scale'\]"):
        RewardModelEnvironment.from_config(nemo_rl_config(path, reward_scale=2.0), device="cpu")
    bad_type = {"enabled": True, "reward_model_type": "pairwise"}
    with pytest.raises(ValueError, match=r"reward_model_type must be one of \['bradley_terry', 'regression'\], got 'pairwise'"):
        RewardModelEnvironment.from_config(nemo_rl_config(path, reward_model_cfg=bad_type), device="cpu")
    config = nemo_rl_config(path)
    del config["model_name"]
    with pytest.raises(ValueError, match="needs `model_name`"):
        RewardModelEnvironment.from_config(config, device="cpu")
    with pytest.raises(ValueError, match="dynamic_batching.enabled needs `logprob_mb_tokens`"):
        RewardModelEnvironment.from_config(nemo_rl_config(path, dynamic_batching={"enabled": True}), device="cpu")


def test_from_config_chat_template_follows_nemo_rl(saved_rm, tmp_path):
    path, tok, model = saved_rm
    prompts, completions = grpo_batch()
    want = reference_scores(model, tok, prompts, completions)
    # "default" keeps the tokenizer's own template (not the literal text "default").
    tokenizer_cfg = {"name": str(path), "chat_template": "default"}
    env = RewardModelEnvironment.from_config(nemo_rl_config(path, tokenizer=tokenizer_cfg), device="cpu")
    assert_scores(env(prompts, completions), want)
    # None is NeMo RL's passthrough: message contents concatenated, no role markers.
    tokenizer_cfg = {"name": str(path), "chat_template": None}
    env = RewardModelEnvironment.from_config(nemo_rl_config(path, tokenizer=tokenizer_cfg), device="cpu")
    text = env.tokenizer.apply_chat_template([*prompts[0], *completions[0]], tokenize=False)
    assert text == "".join(m["content"] for m in [*prompts[0], *completions[0]])
    # A .jinja path is read.
    template = tmp_path / "t.jinja"
    template.write_text("{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}")
    tokenizer_cfg = {"name": str(path), "chat_template": str(template)}
    env = RewardModelEnvironment.from_config(nemo_rl_config(path, tokenizer=tokenizer_cfg), device="cpu")
    assert env.tokenizer.apply_chat_template(prompts[0], tokenize=False).startswith("[user] ")
    # Pickled (AsyncGRPO's spawned reward workers), it keeps the template NeMo's block set.
    import pickle

    copy = pickle.loads(pickle.dumps(env))
    assert copy.tokenizer.apply_chat_template(prompts[0], tokenize=False).startswith("[user] ")
    assert_scores(copy(prompts, completions), torch.tensor(env(prompts, completions)))
    with pytest.raises(ValueError, match="enabled: false"):
        RewardModelEnvironment.from_config(nemo_rl_config(path, enabled=False), device="cpu")
    with pytest.raises(ValueError, match="not a Hugging Face model folder"):
        RewardModelEnvironment.from_config(nemo_rl_config(path, checkpoint_path=str(tmp_path)), device="cpu")


def test_from_config_with_remote_url_renders_the_nemo_template_in_the_client(saved_rm):
    """With `remote_url` the client renders the token ids, so NeMo RL's `chat_template` and `chat_template_kwargs`
    apply there (the rewards equal the local environment's from the same config); without a tokenizer to render
    them, a config that sets a template is refused in one line."""
    import asyncio

    from aiohttp.test_utils import TestServer

    from trl_rm_env.scoring.scorer import RewardScorer
    from trl_rm_env.serving.server import ScoringServer

    path, tok, model = saved_rm
    template = "{% for m in messages %}{{ m['role'] | upper if loud else m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    tokenizer_cfg = {"name": str(path), "chat_template": template, "chat_template_kwargs": {"loud": True}}
    config = nemo_rl_config(path, tokenizer=tokenizer_cfg)
    prompts, completions = grpo_batch()
    local = RewardModelEnvironment.from_config(config, device="cpu")
    want = local(prompts, completions)
    plain = RewardModelEnvironment(path, device="cpu")(prompts, completions)
    assert max(abs(a - b) for a, b in zip(want, plain)) > 1e-4  # the template and its argument change the scores

    async def remote_rewards():
        app = ScoringServer(RewardScorer(model, tok), "rm", aliases=[str(path)]).make_app()  # `model_name` is sent
        async with TestServer(app, host="127.0.0.1") as server:
            env = RewardModelEnvironment.from_config(config, remote_url=str(server.make_url("")))
            assert env.tokenizer.chat_template == template and env.scorer.options.template_kwargs == {"loud": True}
            return await env(prompts, completions)

    assert asyncio.run(remote_rewards()) == pytest.approx(want, abs=1e-4)
    with pytest.raises(ValueError, match="tokenizer.chat_template is applied where conversations are rendered"):
        RewardModelEnvironment.from_config(
            nemo_rl_config(path, tokenizer={"name": str(path), "chat_template": template}),
            remote_url="http://127.0.0.1:9", remote_input="messages",
        )


# ---------------------------------------------------------------------------------------------------- GRPO


@pytest.mark.slow
def test_grpo_trainer_drop_in(tiny_dir, tmp_path):
    """Two GRPO steps with the environment as TRL's reward function: each step's logged `rewards/<name>/mean` and
    `/std` are those of the plain reward model's forwards (`reference_scores`) on that step's completions, recorded
    from TRL's own completion logs; what the environment logged through `log_metric` reaches TRL's row."""
    from trl import GRPOTrainer

    env = RewardModelEnvironment(tiny_dir / "reward_model", name="tiny_rm", max_tokens_per_batch=1024)
    questions = [f"What is {a} plus {b}?" for a, b in [(1, 2), (3, 4), (5, 6), (7, 8), (2, 2), (9, 1), (0, 3), (4, 4)]]
    dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": q}]} for q in questions])
    args = grpo_config(tmp_path, max_steps=2, per_device_train_batch_size=4, num_generations=4, max_completion_length=8)
    trainer = GRPOTrainer(model=str(tiny_dir / "policy"), reward_funcs=[env], args=args, train_dataset=dataset)
    batches = record_scored_batches(trainer)
    trainer.train()
    logs = [entry for entry in trainer.state.log_history if f"rewards/{env.__name__}/mean" in entry]
    assert len(logs) == 2 and [batch["mode"] for batch in batches] == ["train", "train"]  # one batch a step
    model = AutoModelForSequenceClassification.from_pretrained(tiny_dir / "reward_model", dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(tiny_dir / "reward_model")
    for entry, batch in zip(logs, batches):
        want = reference_scores(model, tok, batch["prompt"], batch["completion"]).double()
        assert batch["rewards"][env.__name__] == pytest.approx(want.tolist(), abs=1e-4)  # each sample's, in order
        assert entry[f"rewards/{env.__name__}/mean"] == pytest.approx(want.mean().item(), abs=1e-4)
        assert entry[f"rewards/{env.__name__}/std"] == pytest.approx(want.std().item(), abs=1e-4)  # TRL: Bessel's
        assert entry["reward_model_env/num_samples"] == 4.0  # TRL passed `log_metric` and averaged what we logged
        assert entry["reward_model_env/mean_reward"] == pytest.approx(want.mean().item(), abs=1e-4)


def test_reward_hacking_diagnostics_are_logged_from_the_rewards_returned():
    """`length_corr` is Pearson's correlation of the returned rewards with the completions' lengths (token ids where
    TRL passes them, else characters); `flat_groups` the share of groups whose rewards are all equal."""
    import numpy as np

    from trl_rm_env.rewards.base import diagnostics

    prompts = [["a"]] * 3 + [["b"]] * 3 + [["c"]]  # the lone "c" is no group
    completions = ["x", "xxxx", "xx", "y", "yyy", "yyyyyy", "z"]
    ids = [[1] * n for n in (1, 4, 2, 2, 2, 2, 5)]
    rewards = torch.tensor([0.1, 0.9, 0.4, 0.5, 0.5, 0.5, float("nan")], dtype=torch.float64)
    found = diagnostics(rewards, prompts, completions, ids)
    want = np.corrcoef([0.1, 0.9, 0.4, 0.5, 0.5, 0.5], [1, 4, 2, 2, 2, 2])[0, 1]  # NaN left out
    assert found["length_corr"] == pytest.approx(want, abs=1e-12) and found["flat_groups"] == 0.5
    by_characters = diagnostics(rewards, prompts, completions, None)["length_corr"]
    assert by_characters == pytest.approx(np.corrcoef([0.1, 0.9, 0.4, 0.5, 0.5, 0.5], [1, 4, 2, 1, 3, 6])[0, 1], abs=1e-12)
    assert "length_corr" not in diagnostics(torch.ones(3), [["a"]] * 3, ["x", "yy", "z"], None)  # constant rewards


@pytest.mark.parametrize("sharing", [False, True], ids=["plain", "shared"])
def test_reference_bounded_reward_is_pars_sigmoid_of_the_gap_scored_in_the_same_call(make_env, tiny_rm, tiny_tokenizer, sharing):
    """PAR (`reference_column`): sigmoid((r - r_ref) / T) against the plain model's one-at-a-time scores, the reference
    of each prompt scored once, in the same scoring call as the group (no extra pass)."""
    prompts, completions = grpo_batch()
    refs = [f"Reference answer {p}." for p in range(3) for _ in range(3)]
    env = make_env(reference_column="gold", reference_temperature=0.5, prefix_sharing=sharing)
    calls = []
    score = env.scorer.score_pairs
    env.scorer.score_pairs = lambda c, a, p=None, **kw: calls.append(len(c)) or score(c, a, p, **kw)
    logged = {}
    got = env(prompts, completions, gold=refs, log_metric=logged.__setitem__)
    r = reference_scores(tiny_rm, tiny_tokenizer, prompts, completions)
    r_ref = reference_scores(tiny_rm, tiny_tokenizer, prompts, [msg(t) for t in refs])
    assert_scores(got, torch.sigmoid((r - r_ref) / 0.5), atol=1e-5)
    assert calls == [len(prompts) + 3]  # one call: the 9 completions and the 3 prompts' references
    assert logged["reward_model_env/reference_mean"] == pytest.approx(r_ref[::3].mean().item(), abs=1e-4)
    with pytest.raises(ValueError, match=r"reference_column='gold', but TRL passed no such column.*\['answer'\]"):
        env(prompts, completions, answer=refs)
    with pytest.raises(ValueError, match=r"reference column 'gold' is None for samples \[4\]"):
        env(prompts, completions, gold=refs[:4] + [None] + refs[5:])


def test_a_nan_score_beside_references_names_its_sample_or_its_prompts_first(tiny_rm, tiny_tokenizer, monkeypatch):
    """With `reference_column` the references are scored in the same call (one per prompt): a NaN score is named by
    its own sample's index, a reference's by the first sample of its prompt, and the count is of the 9 completions and
    3 references scored. The model's forward writes NaN on the row of one token length, unique in the call."""
    prompts, completions = grpo_batch()
    refs = [f"Reference answer {p}." for p in range(3) for _ in range(3)]
    lengths = [len(reference_ids(tiny_tokenizer, p, c)) for p, c in zip(prompts, completions)]
    lengths += [len(reference_ids(tiny_tokenizer, prompts[3 * p], msg(refs[3 * p]))) for p in range(3)]
    unique = [k for k, n in enumerate(lengths) if lengths.count(n) == 1]
    own = next(k for k in unique if 0 < k < 9)
    reference = next(k for k in unique if k >= 9)
    model = copy.deepcopy(tiny_rm)
    bad = poisoned_lengths(monkeypatch, model, float("nan"))
    env = RewardModelEnvironment(model, tiny_tokenizer, device="cpu", reference_column="gold", prefix_sharing=False,
                                 name="par_rm")  # fmt: skip
    for row, named in ((own, own), (reference, 3 * (reference - 9))):
        bad[:] = [lengths[row]]
        with pytest.raises(FloatingPointError, match="^" + re.escape(
            f"par_rm: the reward model returned NaN/inf for item(s) [{named}] of the completions (1 of 12 scored)."
        )):  # fmt: skip
            env(prompts, completions, gold=refs)
    with pytest.raises(ValueError, match="^" + re.escape(
        "par_rm: reference_column='gold', but TRL passed no such column with one value per sample; the dataset columns "
        "it passed: ['answer']"
    ) + "$"):  # fmt: skip
        env(prompts, completions, answer=refs)


def test_group_shaping_adds_nemo_gyms_centred_length_weights_to_the_models_scores(make_env, tiny_rm, tiny_tokenizer):
    """`answer_length_coeff=1` on a reward model: within each GRPO group (equal prompts) answers of 2, 4 and 6
    characters get NeMo Gym's centred weights, 1 - (L - 2) / 4 minus their mean 0.5: +0.5, 0, -0.5, added to the
    plain model's scores one at a time. The two groups are interleaved: grouping is by prompt, not position."""
    first, second = [{"role": "user", "content": "Say a word."}], [{"role": "user", "content": "Another one."}]
    prompts = [first, second, first, second, first, second]
    completions = [msg(a) for a in ("ab", "abcdef", "abcd", "ab", "abcdef", "abcd")]
    got = make_env(answer_length_coeff=1.0)(prompts, completions)
    raw = reference_scores(tiny_rm, tiny_tokenizer, prompts, completions)
    assert_scores(got, raw + torch.tensor([0.5, -0.5, 0.0, 0.5, -0.5, 0.0]))


@pytest.mark.parametrize("how, k", [("mean", 3), ("min", 3), ("median", 4), ("mean_minus_std", 4)])
def test_a_multi_head_models_heads_from_one_forward_aggregate_as_the_plain_models_heads(tiny_tokenizer, how, k):
    """`ensemble=`: every head of a K-head checkpoint (K odd and even) read in one scoring call, aggregated per sample,
    equal to the plain model's heads scored one sample at a time (fp32, 1e-5; the median of an even K is the mean of
    the two middle heads, `statistics.median`); `ensemble_std` and each head's mean are logged."""
    import statistics

    from trl_rm_env.rewards.ensemble import EnsembleReward
    from trl_rm_env.tiny_models import build_tiny_reward_model

    model = build_tiny_reward_model(tiny_tokenizer, seed=4, num_labels=k)
    prompts, completions = grpo_batch()
    penalty = {"ensemble_penalty": 0.5} if how == "mean_minus_std" else {}
    env = RewardModelEnvironment(model, tiny_tokenizer, device="cpu", ensemble=how, **penalty)
    calls = []
    score = env.scorer.score_pairs
    env.scorer.score_pairs = lambda c, a, p=None, **kw: calls.append((len(c), kw)) or score(c, a, p, **kw)
    logged = {}
    got = torch.tensor(env(prompts, completions, log_metric=logged.__setitem__))
    with torch.no_grad():
        heads = torch.stack([model(**tiny_tokenizer(reference_text(tiny_tokenizer, p, c), return_tensors="pt")).logits[0]
                             for p, c in zip(prompts, completions)]).double()  # fmt: skip
    rows = heads.tolist()
    want = torch.tensor({"mean": [statistics.fmean(r) for r in rows], "min": [min(r) for r in rows],
                         "median": [statistics.median(r) for r in rows],
                         "mean_minus_std": [statistics.fmean(r) - 0.5 * statistics.pstdev(r) for r in rows]}[how],
                        dtype=torch.float64)  # fmt: skip
    torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=0)
    assert calls == [(len(prompts), {"every_output": True})]  # one scoring call, every head
    assert logged["reward_model_env/ensemble_std"] == pytest.approx(
        statistics.fmean(statistics.pstdev(r) for r in rows), abs=1e-5
    )
    for head in range(k):
        assert logged[f"reward_model_env/ensemble_member_{head}_mean"] == pytest.approx(
            statistics.fmean(r[head] for r in rows), abs=1e-5
        )
    # The same members as separate reward functions, one per head (label_index), give the same ensemble.
    singles = [RewardModelEnvironment(model, tiny_tokenizer, device="cpu", label_index=h, name=f"head_{h}") for h in range(k)]
    separate = EnsembleReward(singles, ensemble=how, **penalty)(prompts, completions)
    torch.testing.assert_close(torch.tensor(separate, dtype=torch.float64), want, atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="ensemble aggregates the heads of a multi-head model; .* has one output"):
        RewardModelEnvironment(build_tiny_reward_model(tiny_tokenizer), tiny_tokenizer, device="cpu", ensemble="min")
    with pytest.raises(ValueError, match="two or more members with distinct names"):
        EnsembleReward(singles[:1])
    with pytest.raises(ValueError, match="ensemble_penalty weighs mean_minus_std's std; ensemble is 'min'"):
        EnsembleReward(singles, ensemble="min", ensemble_penalty=2.0)


def test_options_that_cannot_apply_are_refused_naming_them(tiny_tokenizer, tiny_rm):
    """A reference-bounded reward with checkpoint statistics of raw scores, and attribute rewards with an ensemble, a
    reference or a shaping (each attribute is a raw value), are refused rather than ignored."""
    from trl_rm_env.tiny_models import build_tiny_reward_model

    with pytest.raises(ValueError, match="reference_column bounds the reward.*normalization='checkpoint'"):
        RewardModelEnvironment(tiny_rm, tiny_tokenizer, device="cpu", reference_column="gold", normalization="checkpoint")
    regression = build_tiny_reward_model(tiny_tokenizer, num_labels=2)
    regression.config.attribute_names, regression.config.attribute_weights = ["a", "b"], [1.0, 1.0]
    regression.config.reward_model_type = "regression"
    for option in ({"ensemble": "min"}, {"reference_column": "gold"}, {"answer_length_coeff": 0.1}):
        env = RewardModelEnvironment(regression, tiny_tokenizer, device="cpu", **option)
        with pytest.raises(ValueError, match=r"attribute_rewards\(\) returns raw attribute values.*drop"):
            env.attribute_rewards()
