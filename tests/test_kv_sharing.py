"""Shared-context (KV cache) prefix sharing: scores, losses and gradients equal one-at-a-time plain scoring (fp32,
1e-4) for several groups per call, ragged completions, BOS templates, left truncation, eager and SDPA, PEFT; the
`"auto"` default and its fallbacks; `--prefix_sharing auto|true|false` on the command line."""

from __future__ import annotations

import logging
import random

import pytest
import torch
from helpers import _one_thread, assert_same_loss_and_gradients, score_one, watch_passes  # noqa: F401

from trl_rm_env import RankedRewardConfig, RewardScorer, load_rank_dataset
from trl_rm_env.options import normalize_prefix_sharing
from trl_rm_env.sharing import (
    collate_shared_context,
    kv_sharing_unsupported,
    plan_passes,
    share_plan,
    shared_context_scores,
    shared_prefixes_in,
    sharing_saves,
)
from trl_rm_env.sharing.layouts import KV_CACHE
from trl_rm_env.tiny_models import build_tiny_reward_model
from trl_rm_env.tokenization import encode_conversation
from trl_rm_env.trainer.collator import DataCollatorForRankedPreference
from trl_rm_env.trainer.examples import tokenize_rank_record
from trl_rm_env.trainer.loss import ranked_bradley_terry_loss

WORDS = "add two and 3 please the answer is 4 because numbers".split()


def random_groups(seed: int, shapes: list[tuple[int, list[int]]], vocab: int) -> list[list[list[int]]]:
    """Token groups: each `(prefix length, [completion lengths])` a random shared prefix and random suffixes."""
    g = torch.Generator().manual_seed(seed)
    groups = []
    for prefix_len, lengths in shapes:
        prefix = torch.randint(10, vocab, (prefix_len,), generator=g).tolist()
        groups.append([prefix + torch.randint(10, vocab, (n,), generator=g).tolist() for n in lengths])
    return groups


def chat_groups(num_prompts: int, generations: int, seed: int = 0, prompt_words=(3, 60), answer_words=(0, 12)):
    rng = random.Random(seed)
    prompts, completions = [], []
    for _ in range(num_prompts):
        prompt = [{"role": "user", "content": " ".join(rng.choice(WORDS) for _ in range(rng.randint(*prompt_words)))}]
        for _ in range(generations):
            prompts.append(prompt)
            n = rng.randint(*answer_words)
            completions.append([{"role": "assistant", "content": " ".join(rng.choice(WORDS) for _ in range(n)) or "4"}])
    return prompts, completions


# ---------------------------------------------------------------------------------------------------- the kernel


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_several_groups_ragged_completions_equal_one_at_a_time(tiny_tokenizer, attention):
    model = build_tiny_reward_model(tiny_tokenizer, seed=1, num_labels=2, attn_implementation=attention)
    shapes = [(30, [5, 9, 1]), (7, [12, 3]), (50, [4, 4, 4, 4]), (1, [6])]
    groups = random_groups(0, shapes, model.config.vocab_size)
    with torch.no_grad():
        reference = torch.stack([
            model(input_ids=torch.tensor([seq])).logits[0] for group in groups for seq in group
        ])
        batch = collate_shared_context(groups, [p for p, _ in shapes], tiny_tokenizer.pad_token_id)
        assert batch["prefix_ids"].shape == (4, 50) and batch["completion_ids"].shape == (10, 12)
        scores, _ = shared_context_scores(model, batch)
        every, _ = shared_context_scores(model, batch, label_index=None)
        # Contexts and completion rows in passes of at most two rows (trimmed to their longest), longest first.
        lengths = batch["completion_mask"].sum(1).tolist()
        chunks = {"prefix_chunks": plan_passes([p for p, _ in shapes], max_rows=2),
                  "completion_chunks": plan_passes(lengths, max_rows=2)}
        assert chunks["prefix_chunks"] == [([2, 0], 50), ([1], 7), ([3], 1)]
        assert sorted(i for rows, _ in chunks["completion_chunks"] for i in rows) == list(range(10))
        assert all(len(rows) <= 2 for rows, _ in chunks["completion_chunks"])
        chunked, _ = shared_context_scores(model, {**batch, **chunks}, label_index=1)
    torch.testing.assert_close(scores, reference[:, 0], atol=1e-4, rtol=0)
    torch.testing.assert_close(every, reference, atol=1e-4, rtol=0)
    torch.testing.assert_close(chunked, reference[:, 1], atol=1e-4, rtol=0)
    assert reference[:, 0].unique().numel() == 10  # a mix-up of rows would show


def test_plan_passes_bounds_padding_rows_and_tokens():
    lengths = [100, 10, 95, 12, 50]
    assert plan_passes(lengths) == [([0, 2, 4], 100), ([3, 1], 12)]  # padding within 25% of the real tokens
    assert plan_passes(lengths, slack=10.0) == [([0, 2, 4, 3, 1], 100)]
    assert plan_passes(lengths, max_rows=1, slack=10.0) == [([i], lengths[i]) for i in (0, 2, 4, 3, 1)]
    # rows x (length + the keys of their contexts) within the budget; a row alone always gets a pass
    assert plan_passes([10, 10, 10], max_tokens=99, extra=[40, 40, 90], slack=10.0) == [([0], 10), ([1], 10), ([2], 10)]
    assert plan_passes([10, 10, 10], max_tokens=110, extra=[40, 40, 0], slack=10.0) == [([0, 1], 10), ([2], 10)]


def test_collate_rejects_an_empty_suffix():
    with pytest.raises(ValueError, match="at least one token after"):
        collate_shared_context([[[1, 2], [1, 2, 3]]], [2], 0)
    with pytest.raises(ValueError, match=">= 0"):
        collate_shared_context([[[1, 2]]], [-1], 0)


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_single_pass_out_of_order_and_empty_contexts_are_exact(tiny_tokenizer, attention):
    """One record whose completions are shortest first (the one completion pass runs its rows longest first), and
    records whose completions share no token, one of them a single token (an empty context)."""
    model = build_tiny_reward_model(tiny_tokenizer, seed=4, attn_implementation=attention).eval()
    vocab = model.config.vocab_size
    (ordered,) = random_groups(1, [(9, [9, 10, 11])], vocab)  # one completion pass, rows [2, 1, 0]
    disjoint = [[20, 30, 40], [50], [21, 60]]  # no shared token; [50] alone is one token
    examples = [{"completion_ids": group, "ranks": list(range(len(group)))} for group in (ordered, disjoint)]
    with torch.no_grad():
        reference = torch.tensor(
            [model(input_ids=torch.tensor([seq])).logits[0, 0].item() for e in examples for seq in e["completion_ids"]]
        )
        for batch in ([examples[0]], [examples[1]], examples):
            inputs = DataCollatorForRankedPreference(tiny_tokenizer.pad_token_id, layout=KV_CACHE)(batch)
            scores, _ = shared_context_scores(model, inputs)
            expected = reference[: len(scores)] if batch[0] is examples[0] else reference[3:]
            torch.testing.assert_close(scores, expected, atol=1e-4, rtol=0)
    assert reference.unique().numel() == 6


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
@pytest.mark.parametrize("tokenizer_name", ["tiny_tokenizer", "bos_tokenizer"])
def test_training_loss_and_gradients_equal_the_plain_path(request, tokenizer_name, attention):
    tokenizer = request.getfixturevalue(tokenizer_name)
    model = build_tiny_reward_model(tokenizer, seed=2, attn_implementation=attention)
    examples = [tokenize_rank_record(r, tokenizer)[0] for r in load_rank_dataset("sample:harder").select(range(10))]
    plain = DataCollatorForRankedPreference(tokenizer.pad_token_id)(examples)
    reference = model(input_ids=plain["input_ids"], attention_mask=plain["attention_mask"]).logits[:, 0]
    loss_ref = ranked_bradley_terry_loss(reference, plain["ranks"], plain["record_index"]).loss
    grads_ref = torch.autograd.grad(loss_ref, list(model.parameters()))

    shared = DataCollatorForRankedPreference(tokenizer.pad_token_id, pad_to_multiple_of=8, layout=KV_CACHE)(examples)
    assert shared["prefix_ids"].shape[1] % 8 == 0 and shared["completion_ids"].shape[1] % 8 == 0
    tokens = shared["prefix_mask"].sum() + shared["completion_mask"].sum()
    assert tokens < plain["attention_mask"].sum()  # each context once
    scores, _ = shared_context_scores(model, shared)
    assert_same_loss_and_gradients(model, scores, reference, shared, loss_ref, grads_ref)


def test_peft_lora_scores_and_gradients(tiny_tokenizer):
    peft = pytest.importorskip("peft")
    base = build_tiny_reward_model(tiny_tokenizer, seed=3)
    config = peft.LoraConfig(task_type="SEQ_CLS", r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    model = peft.get_peft_model(base, config)
    examples = [tokenize_rank_record(r, tiny_tokenizer)[0] for r in load_rank_dataset("sample:harder").select(range(6))]
    plain = DataCollatorForRankedPreference(tiny_tokenizer.pad_token_id)(examples)
    reference = model(input_ids=plain["input_ids"], attention_mask=plain["attention_mask"]).logits[:, 0]
    trainable = [p for p in model.parameters() if p.requires_grad]
    grads_ref = torch.autograd.grad(reference.square().sum(), trainable)
    shared = DataCollatorForRankedPreference(tiny_tokenizer.pad_token_id, layout=KV_CACHE)(examples)
    scores, _ = shared_context_scores(model, shared)
    torch.testing.assert_close(scores, reference, atol=1e-4, rtol=0)
    for g, g_ref in zip(torch.autograd.grad(scores.square().sum(), trainable), grads_ref):
        torch.testing.assert_close(g, g_ref, atol=1e-4, rtol=1e-3)
    assert "forward" not in vars(model.get_base_model().model)  # the decoder's forward is restored


# ---------------------------------------------------------------------------------------------------- the scorer


def one_at_a_time(model, tokenizer, prompts, completions, scorer=None):
    """Reference: each item encoded (and truncated) as the plain scorer does, then scored alone."""
    plain = scorer or RewardScorer(model, tokenizer, prefix_sharing=False)
    encoded = plain.encode(prompts, completions)
    return torch.tensor([score_one(model, ids) for ids in encoded.ids])


@pytest.mark.parametrize(
    "batch_size, budget",
    [(None, None), pytest.param(3, None, marks=pytest.mark.slow), pytest.param(None, 400, marks=pytest.mark.slow),
     (2, 250)],  # the default and the tightest budget fast, the others in the full suite
)
@pytest.mark.parametrize(
    "tokenizer_name", ["tiny_tokenizer", pytest.param("bos_tokenizer", marks=pytest.mark.slow)]  # bos: full suite
)
def test_scorer_shares_groups_exactly_within_the_budget(request, tokenizer_name, batch_size, budget):
    tokenizer = request.getfixturevalue(tokenizer_name)
    model = build_tiny_reward_model(tokenizer, seed=5)
    prompts, completions = chat_groups(5, 4, seed=3)
    reference = one_at_a_time(model, tokenizer, prompts, completions)
    scorer = RewardScorer(model, tokenizer, batch_size=batch_size, max_tokens_per_batch=budget, prefix_sharing=True)
    with watch_passes(scorer) as passes:
        scored = scorer.score_pairs(prompts, completions)
    torch.testing.assert_close(scored.scores, reference, atol=1e-4, rtol=0)
    assert passes.shared == list(range(len(prompts)))
    assert scored.outputs.shape == (len(prompts), 1)
    if budget is not None:
        assert all(rows * n <= budget for rows, n in passes.shapes)
        assert all(rows * keys <= budget for rows, keys in passes.key_shapes)  # keys: context + completion
    if batch_size is not None:
        assert all(rows <= batch_size for rows, _ in passes.shapes)
    back = scorer.score(prompts[::-1], completions[::-1])  # input order is kept
    torch.testing.assert_close(back, reference.flip(0), atol=1e-4, rtol=0)


def test_shared_prefixes_are_found_in_token_ids_alone():
    """Token ids that come without context lengths (a server's requests): the members of each group are found in any
    order, each keeps a token of its own, and a lone sequence or a few shared tokens before long answers stay plain."""
    groups = random_groups(0, [(40, [5, 9, 1, 7]), (25, [12, 3, 6]), (60, [4, 4])], vocab=500)
    groups.append([groups[2][0][:30], groups[2][0][:31]])  # the first is a prefix of the second: it keeps one token
    lone = [[7] * 50]
    sequences = [seq for group in groups for seq in group] + lone
    order = random.Random(0).sample(range(len(sequences)), len(sequences))
    shuffled = [sequences[i] for i in order]
    found = shared_prefixes_in(shuffled, ratio=8.0)
    planned, plain = share_plan(shuffled, found, always=False, ratio=8.0)
    members = sorted(sorted(order[i] for i in items) for _, items in planned)
    starts = [0, 4, 7, 9, 11]
    assert members == [list(range(a, b)) for a, b in zip(starts, starts[1:])]
    assert sorted(p for p, _ in planned) == [25, 29, 40, 60]  # the prefix case: 30 tokens, one kept as its own
    assert [order[i] for i in plain] == [11]
    # Three shared template tokens before 200-token answers do not pay under "auto"; `always` shares them.
    template = [[1, 2, 3, *row] for row in random_groups(1, [(0, [200] * 4)], vocab=500)[0]]
    assert shared_prefixes_in(template, ratio=8.0) == [0] * 4
    assert shared_prefixes_in(template, ratio=8.0, always=True) == [3] * 4
    assert shared_prefixes_in([], ratio=8.0) == [] and shared_prefixes_in([[5]], ratio=8.0) == [0]


@pytest.mark.parametrize(
    "tokenizer_name", ["tiny_tokenizer", pytest.param("bos_tokenizer", marks=pytest.mark.slow)]  # bos: full suite
)
def test_score_ids_finds_the_groups_and_scores_exactly(request, tokenizer_name):
    """`score_ids` (the server's path: token ids, no contexts) shares each GRPO group's prompt, in any input order,
    and every score equals that sequence scored alone; with `prefix_sharing=False` nothing is shared."""
    tokenizer = request.getfixturevalue(tokenizer_name)
    model = build_tiny_reward_model(tokenizer, seed=9)
    prompts, completions = chat_groups(4, 5, seed=6, prompt_words=(20, 60))
    ids = RewardScorer(model, tokenizer, prefix_sharing=False).encode(prompts, completions).ids
    order = random.Random(1).sample(range(len(ids)), len(ids))
    ids = [ids[i] for i in order]
    reference = torch.tensor([score_one(model, seq) for seq in ids])
    scorer = RewardScorer(model, tokenizer, batch_size=3, max_tokens_per_batch=300)
    with watch_passes(scorer) as passes:
        torch.testing.assert_close(scorer.score_ids(ids), reference, atol=1e-4, rtol=0)
    assert passes.shared == list(range(len(ids)))
    assert passes.key_shapes and all(rows * keys <= 300 for rows, keys in passes.key_shapes)
    plain = RewardScorer(model, tokenizer, prefix_sharing=False)
    with watch_passes(plain) as passes:
        torch.testing.assert_close(plain.score_ids(ids), reference, atol=1e-4, rtol=0)
    assert passes.shared == [] and passes.key_shapes == []


@pytest.mark.parametrize("tokenizer_name", ["tiny_tokenizer", "bos_tokenizer"])
def test_left_truncation_with_sharing(request, tokenizer_name):
    """Over-length items are cut as the plain path cuts them (a kept BOS included); completions of equal length
    still share their (cut) context, the others are scored alone: every score equals the plain one."""
    tokenizer = request.getfixturevalue(tokenizer_name)
    model = build_tiny_reward_model(tokenizer, seed=6)
    prompt = [{"role": "user", "content": " ".join(["add two and 3"] * 30)}]
    answers = ["the answer is 4", "the answer is 5", "it is 4 because", "4"]
    prompts = [prompt] * len(answers)
    completions = [[{"role": "assistant", "content": a}] for a in answers]
    plain = RewardScorer(model, tokenizer, max_length=60, prefix_sharing=False)
    reference = one_at_a_time(model, tokenizer, prompts, completions, scorer=plain)
    assert plain.encode(prompts, completions).truncated == [0, 1, 2, 3]
    if tokenizer.bos_token_id is not None:
        assert all(ids[0] == tokenizer.bos_token_id for ids in plain.encode(prompts, completions).ids)
    scorer = RewardScorer(model, tokenizer, max_length=60, prefix_sharing=True)
    with watch_passes(scorer) as passes:
        torch.testing.assert_close(scorer.score(prompts, completions), reference, atol=1e-4, rtol=0)
    assert passes.shared[:2] == [0, 1]  # same length after the template: same cut, one shared context


def test_nonfinite_rows_stay_apart(tiny_tokenizer):
    """A NaN in one completion's own tokens reaches that completion's score only (rows never see each other)."""
    model = build_tiny_reward_model(tiny_tokenizer, seed=7)
    prompts, completions = chat_groups(2, 4, seed=4, prompt_words=(30, 40))
    completions[5] = [{"role": "assistant", "content": "zzz-bad"}]
    bad_ids = set(tiny_tokenizer("zzz-bad")["input_ids"]) - set(
        i for k, c in enumerate(completions) if k != 5 for i in encode_conversation(tiny_tokenizer, prompts[k], c)
    )
    assert bad_ids
    with torch.no_grad():
        model.model.embed_tokens.weight[sorted(bad_ids)] = float("nan")
    scorer = RewardScorer(model, tiny_tokenizer, prefix_sharing=True)
    with pytest.raises(FloatingPointError, match=r"item\(s\) \[5\]\."):
        scorer.score(prompts, completions)
    got = RewardScorer(model, tiny_tokenizer, prefix_sharing=True, nonfinite_reward=-3.0).score(prompts, completions)
    want = one_at_a_time(model, tiny_tokenizer, prompts, completions)
    want[5] = -3.0
    torch.testing.assert_close(got, want, atol=1e-4, rtol=0)


def test_auto_cost_model(tiny_rm, tiny_tokenizer):
    scorer = RewardScorer(tiny_rm, tiny_tokenizer)
    assert scorer.prefix_sharing == "auto"
    ratio = scorer.engine.cost_ratio  # the engine's cost model of this RM (`linear_to_attention_cost`)
    p, cs = 100, [20, 30]
    plain = sum((p + c) * ratio + (p + c) ** 2 for c in cs)
    shared = p * ratio + p**2 + sum(c * ratio + c * (p + c) for c in cs)
    assert sharing_saves(p, cs, ratio) == pytest.approx(1 - shared / plain)
    assert sharing_saves(500, [10] * 8, ratio) > 0.8  # long prompt, short answers
    assert sharing_saves(3, [200] * 8, ratio) < 0.1  # a template's few shared tokens: not worth a second pass


def test_scorer_modes_and_fallbacks(tiny_tokenizer, caplog):
    assert [normalize_prefix_sharing(v) for v in (None, "AUTO", "true", "False", True, False)] == [
        "auto", "auto", True, False, True, False,
    ]
    with pytest.raises(ValueError, match="prefix_sharing must be True, False, 'auto' or 'packed', got 'maybe'"):
        normalize_prefix_sharing("maybe")
    model = build_tiny_reward_model(tiny_tokenizer, seed=8)
    assert RewardScorer(model, tiny_tokenizer, prefix_sharing=False).prefix_sharing is False
    # FlashAttention-2 takes the same cache layout (not installable on this CPU machine: only checked).
    model.config._attn_implementation = "flash_attention_2"
    assert kv_sharing_unsupported(model) is None
    # Sliding-window layers would count the padded context slots: plain path, with a warning when forced.
    sliding = build_tiny_reward_model(tiny_tokenizer, seed=8, use_sliding_window=True, sliding_window=16,
                                      max_window_layers=0)
    assert "not all full attention" in kv_sharing_unsupported(sliding)
    with caplog.at_level(logging.INFO):
        scorer = RewardScorer(sliding, tiny_tokenizer, prefix_sharing=True)
    assert scorer.prefix_sharing is False and "scoring each sequence separately" in caplog.text
    prompts, completions = chat_groups(2, 3, seed=5)
    want = one_at_a_time(sliding, tiny_tokenizer, prompts, completions)
    torch.testing.assert_close(scorer.score(prompts, completions), want, atol=1e-4, rtol=0)


def test_training_under_activation_checkpointing_is_not_the_kv_path(tiny_tokenizer):
    model = build_tiny_reward_model(tiny_tokenizer, seed=9).train()
    assert kv_sharing_unsupported(model, training=True) is None
    model.gradient_checkpointing_enable()
    assert kv_sharing_unsupported(model, training=True) == "activation checkpointing drops the KV cache"
    assert kv_sharing_unsupported(model) is None  # scoring (no backward replay) is fine


# ---------------------------------------------------------------------------------------------------- config


@pytest.mark.parametrize("value, expected", [(None, "auto"), ("auto", "auto"), ("true", True), ("false", False)])
def test_command_line_and_yaml_values(tmp_path, value, expected):
    from trl import TrlParser

    parser = TrlParser((RankedRewardConfig,))
    argv = ["--output_dir", str(tmp_path)] + ([] if value is None else ["--prefix_sharing", value])
    (config,) = parser.parse_args_and_config(args=argv)
    assert config.prefix_sharing == expected
    yaml_file = tmp_path / "c.yaml"
    yaml_file.write_text(f"output_dir: {tmp_path}\nprefix_sharing: {'true' if expected is True else 'false'}\n")
    (from_yaml,) = parser.parse_args_and_config(args=["--config", str(yaml_file)])
    assert from_yaml.prefix_sharing is (expected is True)
    with pytest.raises(SystemExit):
        parser.parse_args_and_config(args=["--output_dir", str(tmp_path), "--prefix_sharing", "maybe"])
