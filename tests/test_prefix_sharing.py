"""Prefix sharing and packing give the plain path's scores, loss and gradients (fp32, 1e-4)."""

from __future__ import annotations

import pytest
import torch
from helpers import assert_same_loss_and_gradients, ranked_trainer, watch_passes

from trl_rm_env import RankedRewardConfig, RankedRewardTrainer, load_rank_dataset
from trl_rm_env.compat import CHECKPOINTING_FIELD
from trl_rm_env.sharing import plan_rows, record_row, shared_prefix_length, shared_prefix_mask, shared_prefix_scores
from trl_rm_env.sharing.layouts import BLOCK_MASK, KV_CACHE, PLAIN
from trl_rm_env.tiny_models import build_tiny_reward_model
from trl_rm_env.trainer.collator import DataCollatorForRankedPreference
from trl_rm_env.trainer.examples import tokenize_rank_record
from trl_rm_env.trainer.loss import ranked_bradley_terry_loss


def examples_for(tokenizer, dataset, n):
    return [tokenize_rank_record(r, tokenizer)[0] for r in dataset.select(range(n))]


def plain_scores(model, tokenizer, examples):
    batch = DataCollatorForRankedPreference(tokenizer.pad_token_id)(examples)
    return model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits[:, 0], batch


def test_record_row_layout():
    tokens, positions, segments, offsets = record_row([[1, 2, 3, 4], [1, 2, 5], [1, 2, 3, 6, 7]])
    # Shared prefix [1, 2] (the third sequence diverges after 1, 2, 3 from the second's 1, 2, 5).
    assert tokens == [1, 2, 3, 4, 5, 3, 6, 7]
    assert positions == [0, 1, 2, 3, 2, 2, 3, 4]
    assert segments == [0, 0, 1, 1, 2, 3, 3, 3]
    assert offsets == [3, 4, 7]
    # A completion that is a prefix of another still keeps one token of its own.
    assert shared_prefix_length([[1, 2, 3], [1, 2, 3, 4]]) == 2


def test_mask_blocks_other_completions_and_records():
    record_ids = torch.tensor([[0, 0, 0, 0, 1, 1, 1, -1]])
    segment_ids = torch.tensor([[0, 1, 2, 2, 0, 1, 2, -1]])
    allowed = shared_prefix_mask(record_ids, segment_ids, torch.float32)[0, 0] == 0
    expected = torch.tensor(
        [
            [1, 0, 0, 0, 0, 0, 0, 0],
            [1, 1, 0, 0, 0, 0, 0, 0],
            [1, 0, 1, 0, 0, 0, 0, 0],  # completion 2 does not see completion 1
            [1, 0, 1, 1, 0, 0, 0, 0],
            [0, 0, 0, 0, 1, 0, 0, 0],  # the next record sees nothing of the first
            [0, 0, 0, 0, 1, 1, 0, 0],
            [0, 0, 0, 0, 1, 0, 1, 0],
            [0, 0, 0, 0, 0, 0, 0, 1],  # padding attends to itself only
        ],
        dtype=torch.bool,
    )
    assert torch.equal(allowed, expected)


def test_packing_plan_respects_capacity():
    rows = plan_rows([50, 40, 30, 20, 10], max_tokens=60)
    assert sorted(i for row in rows for i in row) == [0, 1, 2, 3, 4]
    assert all(sum([50, 40, 30, 20, 10][i] for i in row) <= 60 for row in rows)
    assert plan_rows([100, 10], max_tokens=60) == [[0], [1]]  # a record longer than the budget gets its own row
    assert plan_rows([3, 4], None) == [[0], [1]]


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
@pytest.mark.parametrize("pack", [None, 160])
@pytest.mark.parametrize("tokenizer_name", ["tiny_tokenizer", "bos_tokenizer"])
def test_scores_loss_and_gradients_equal_the_plain_path(request, tokenizer_name, attention, pack):
    tokenizer = request.getfixturevalue(tokenizer_name)
    model = build_tiny_reward_model(tokenizer, seed=2, attn_implementation=attention)
    examples = examples_for(tokenizer, load_rank_dataset("sample:harder"), 10)

    reference, plain = plain_scores(model, tokenizer, examples)
    loss_ref = ranked_bradley_terry_loss(reference, plain["ranks"], plain["record_index"]).loss
    grads_ref = torch.autograd.grad(loss_ref, list(model.parameters()))

    shared = DataCollatorForRankedPreference(tokenizer.pad_token_id, pack_max_tokens=pack, layout=BLOCK_MASK)(examples)
    assert torch.equal(shared["ranks"], plain["ranks"]) and torch.equal(shared["record_index"], plain["record_index"])
    assert shared["input_ids"].numel() < plain["input_ids"].numel()  # fewer tokens through the model
    if pack:
        assert shared["input_ids"].shape[0] < len(examples)
    scores, _ = shared_prefix_scores(model, shared, torch.float32)
    assert_same_loss_and_gradients(model, scores, reference, shared, loss_ref, grads_ref)


def test_plain_text_records(tiny_tokenizer):
    records = [
        {"context": f"Question {i}: what is {i} + {i}? Answer:", "completions": [
            {"rank": 0, "completion": f" {2 * i}"}, {"rank": 1, "completion": f" {2 * i + 1}"},
            {"rank": 2, "completion": " I do not know."}]}
        for i in range(5)
    ]
    model = build_tiny_reward_model(tiny_tokenizer, seed=4)
    examples = [tokenize_rank_record(r, tiny_tokenizer)[0] for r in records]
    reference, _ = plain_scores(model, tiny_tokenizer, examples)
    shared = DataCollatorForRankedPreference(tiny_tokenizer.pad_token_id, layout=BLOCK_MASK)(examples)
    scores, _ = shared_prefix_scores(model, shared, torch.float32)
    torch.testing.assert_close(scores, reference, atol=1e-4, rtol=0)


@pytest.mark.slow
def test_trainer_with_prefix_sharing_matches_plain_training(tmp_path, tiny_tokenizer):
    """Default ("auto": KV path), forced KV, and the block-mask fallback (forced under activation checkpointing,
    packed) all train exactly like the plain path."""
    train = load_rank_dataset("sample:train").select(range(48))
    eval_sets = {"harder": load_rank_dataset("sample:harder").select(range(21))}
    runs = {}
    layouts = {
        "plain": ({"prefix_sharing": False}, PLAIN),
        "auto": ({}, KV_CACHE),
        "shared": ({"prefix_sharing": "true"}, KV_CACHE),
        "packed": ({"prefix_sharing": True, "pack_max_tokens": 256, CHECKPOINTING_FIELD: True}, BLOCK_MASK),
    }
    for name, (overrides, layout) in layouts.items():
        trainer = ranked_trainer(tmp_path / name, tiny_tokenizer, train, eval_sets, **overrides)
        assert isinstance(trainer.data_collator, DataCollatorForRankedPreference)
        assert trainer.data_collator.layout is layout and trainer._layout is layout
        trainer.train()
        losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
        runs[name] = (losses, trainer.evaluate(), [h["num_tokens"] for h in trainer.state.log_history if "num_tokens" in h])
    for name in ("auto", "shared", "packed"):
        assert runs[name][0] == pytest.approx(runs["plain"][0], abs=1e-4)
        for key in ("eval_harder_loss", "eval_harder_accuracy", "eval_harder_margin"):
            assert runs[name][1][key] == pytest.approx(runs["plain"][1][key], abs=1e-4)
        assert runs[name][2][-1] < runs["plain"][2][-1]  # fewer tokens through the model


@pytest.mark.slow
def test_a_subclass_with_its_own_compute_loss_gets_the_plain_layout_under_auto(tmp_path, tiny_tokenizer):
    """A TRL-style subclass reads `input_ids`/`attention_mask` in compute_loss: "auto" keeps that layout; forcing
    prefix sharing is the user's explicit choice."""
    seen = []

    class MyTrainer(RankedRewardTrainer):
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            seen.append(sorted(inputs))
            assert inputs["input_ids"].shape == inputs["attention_mask"].shape
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)

    train = load_rank_dataset("sample:train").select(range(8))
    args = RankedRewardConfig(output_dir=str(tmp_path), use_cpu=True, report_to="none", max_steps=1,
                              per_device_train_batch_size=4, disable_tqdm=True, save_strategy="no")
    model = build_tiny_reward_model(tiny_tokenizer, seed=0)
    trainer = MyTrainer(model=model, args=args, train_dataset=train, eval_dataset=train, processing_class=tiny_tokenizer)
    assert trainer.data_collator.layout is PLAIN
    trainer.train()
    assert seen and all("input_ids" in keys for keys in seen)
    trained = len(seen)
    metrics = trainer.evaluate()  # evaluation goes through the subclass's compute_loss too, as transformers' does
    assert len(seen) > trained and 0.0 <= metrics["eval_accuracy"] <= 1.0
    forced = RankedRewardConfig(output_dir=str(tmp_path), use_cpu=True, report_to="none", prefix_sharing=True)
    trainer = MyTrainer(model=model, args=forced, train_dataset=train, processing_class=tiny_tokenizer)
    assert trainer.data_collator.layout is not PLAIN


def test_compute_metrics_with_inputs_gets_input_ids_under_auto(tmp_path, tiny_tokenizer):
    """TRL users may ask for the inputs in compute_metrics (`include_for_metrics=["inputs"]`); transformers reads
    `input_ids` from the batch, which only the plain layout has: "auto" picks it."""
    seen = []

    def metrics(pred):
        seen.append(pred.inputs.shape)
        return {"rows": float(pred.inputs.shape[0])}

    data = load_rank_dataset("sample:in_domain").select(range(6))
    args = RankedRewardConfig(output_dir=str(tmp_path), use_cpu=True, report_to="none", disable_tqdm=True,
                              per_device_eval_batch_size=3, include_for_metrics=["inputs"])
    trainer = RankedRewardTrainer(model=build_tiny_reward_model(tiny_tokenizer, seed=0), args=args,
                                  train_dataset=data, eval_dataset=data, processing_class=tiny_tokenizer,
                                  compute_metrics=metrics)
    assert trainer.data_collator.layout is PLAIN
    out = trainer.evaluate()
    assert seen and out["eval_rows"] == sum(len(r["completions"]) for r in data)


def test_unsupported_attention_falls_back_with_a_warning(tmp_path, tiny_tokenizer, caplog):
    train = load_rank_dataset("sample:train").select(range(8))
    model = build_tiny_reward_model(tiny_tokenizer, seed=0)
    model.config._attn_implementation = "flex_attention"  # as if loaded with it; only checked, never run here
    args = RankedRewardConfig(output_dir=str(tmp_path), use_cpu=True, report_to="none", prefix_sharing=True)
    trainer = RankedRewardTrainer(model=model, args=args, train_dataset=train, processing_class=tiny_tokenizer)
    assert trainer.data_collator.layout is PLAIN
    assert "flex_attention" in caplog.text and "using the plain path" in caplog.text
    for mode, budget in ((False, 128), ("false", 128), ("auto", 0)):  # no shared layout reads it; or not >= 1
        with pytest.raises(ValueError, match=rf"pack_max_tokens={budget} bounds the forwards of prefix sharing"):
            RankedRewardConfig(output_dir=str(tmp_path), pack_max_tokens=budget, prefix_sharing=mode)


# ---------------------------------------------------------------------------------------------------- scoring


def grpo_groups(num_prompts, generations, seed=0):
    import random

    rng = random.Random(seed)
    prompts, completions = [], []
    for _ in range(num_prompts):
        prompt = [{"role": "user", "content": " ".join(rng.choice(["add", "two", "and", "3", "please"])
                                                       for _ in range(rng.randint(3, 40)))}]
        for _ in range(generations):
            prompts.append(prompt)
            words = rng.randint(0, 15)
            completions.append([{"role": "assistant", "content": " ".join(["the answer is 4"] * words) or "4"}])
    return prompts, completions


@pytest.mark.slow
@pytest.mark.parametrize("budget", [None, 600, 256])
@pytest.mark.parametrize("tokenizer_name", ["tiny_tokenizer", "bos_tokenizer"])
def test_group_shared_scoring_equals_one_at_a_time(request, tokenizer_name, budget):
    from trl_rm_env import RewardScorer
    from trl_rm_env.tokenization import encode_conversation

    tokenizer = request.getfixturevalue(tokenizer_name)
    model = build_tiny_reward_model(tokenizer, seed=5)
    prompts, completions = grpo_groups(4, 6)
    with torch.no_grad():
        reference = torch.tensor([
            model(input_ids=torch.tensor([encode_conversation(tokenizer, p, c)])).logits[0, 0].item()
            for p, c in zip(prompts, completions)
        ])
    scorer = RewardScorer(model, tokenizer, max_tokens_per_batch=budget, prefix_sharing=True)
    assert scorer.prefix_sharing
    with watch_passes(scorer) as passes:
        scores = scorer.score(prompts, completions)
    torch.testing.assert_close(scores, reference, atol=1e-4, rtol=0)
    assert passes.key_shapes  # completions ran against shared contexts
    if budget is not None:
        assert all(rows * length <= budget for rows, length in passes.shapes)
        assert all(rows * keys <= budget for rows, keys in passes.key_shapes)
    plain = RewardScorer(model, tokenizer, max_tokens_per_batch=budget, prefix_sharing=False)
    with watch_passes(plain) as plain_passes:
        plain.score(prompts, completions)
    used = sum(r * n for r, n in passes.shapes)
    assert used < sum(r * n for r, n in plain_passes.shapes)  # fewer token positions through the model


def test_group_shared_scoring_through_the_environment(tiny_rm, tiny_tokenizer):
    from trl_rm_env import RewardModelEnvironment

    prompts, completions = grpo_groups(3, 4, seed=1)
    shared = RewardModelEnvironment(tiny_rm, tiny_tokenizer, device="cpu", prefix_sharing=True)
    plain = RewardModelEnvironment(tiny_rm, tiny_tokenizer, device="cpu", prefix_sharing=False)
    assert shared(prompts, completions) == pytest.approx(plain(prompts, completions), abs=1e-4)


def test_cost_model_of_the_tiny_config(tiny_rm, tiny_tokenizer):
    from trl_rm_env.sharing.planning import linear_to_attention_cost

    # hidden 128, 4 heads x 32, 2 KV heads, MLP 256: 2 * (128*128 + 2*128*64 + 128*128 + 3*128*256) / (4 * 128)
    assert linear_to_attention_cost(tiny_rm.config) == 576.0


@pytest.mark.parametrize(
    "prompt_words, completion_words, shared", [(1, 80, False), (120, 1, True)], ids=["long-completions", "long-prompt"]
)
@pytest.mark.slow
def test_auto_shares_where_the_cost_model_says_and_stays_exact(
    tiny_rm, tiny_tokenizer, prompt_words, completion_words, shared
):
    """"auto": long completions behind a short prompt are scored plainly (little to share); a long prompt is shared."""
    from trl_rm_env import RewardScorer
    from trl_rm_env.tokenization import encode_conversation

    prompts = [[{"role": "user", "content": " ".join(["add two and 3"] * prompt_words)}]] * 6
    completions = [
        [{"role": "assistant", "content": " ".join([f"the answer is {k}"] * completion_words)}] for k in range(6)
    ]
    with torch.no_grad():
        reference = torch.tensor([
            tiny_rm(input_ids=torch.tensor([encode_conversation(tiny_tokenizer, p, c)])).logits[0, 0].item()
            for p, c in zip(prompts, completions)
        ])
    scorer = RewardScorer(tiny_rm, tiny_tokenizer)
    assert scorer.prefix_sharing == "auto"
    with watch_passes(scorer) as passes:
        torch.testing.assert_close(scorer.score(prompts, completions), reference, atol=1e-4, rtol=0)
    assert passes.shared == (list(range(6)) if shared else [])
    forced = RewardScorer(tiny_rm, tiny_tokenizer, prefix_sharing=True)
    with watch_passes(forced) as passes:
        torch.testing.assert_close(forced.score(prompts, completions), reference, atol=1e-4, rtol=0)
    assert passes.shared == list(range(6))


# ---------------------------------------------------------------------------------------------------- decided once
@pytest.mark.parametrize(
    ("kind", "engine", "asked", "planned"),
    [
        ("reward", "hf", "auto", "auto"),
        ("reward", "hf", "true", True),
        ("reward", "hf", "packed", "packed"),
        ("reward", "hf", False, False),
        ("judge", "hf", True, False),  # a judge's prompts are its own: nothing shared on transformers
        ("reward", "vllm", "auto", True),  # vLLM: its prefix caching, on unless prefix_sharing=False
        ("judge", "vllm", "packed", True),
        ("judge", "vllm", "false", False),
        ("reward", "recording", "packed", "packed"),  # any other engine gets the mode as asked
    ],
)
def test_the_plan_decides_the_sharing_asked_of_its_engine(kind, engine, asked, planned):
    from trl_rm_env.runtime.model_options import ScoringOptions
    from trl_rm_env.runtime.plan import planned_sharing

    assert planned_sharing(kind, engine, ScoringOptions(prefix_sharing=asked)) == planned


def test_the_engine_resolves_its_plans_sharing_once_and_every_call_reads_it(tiny_dir, monkeypatch):
    """`plan_model` puts the mode in the plan, `load_engine` hands it to the engine, which resolves it against its
    weights once (`scoring_sharing`); the calls read that object and resolve nothing again. On the CPU `True` and
    `"auto"` run the KV layout, `"packed"` the packed one; `always` holds for `True` and `"packed"` only."""
    from trl_rm_env.runtime.loading import load_engine, load_tokenizer
    from trl_rm_env.runtime.plan import plan_model
    from trl_rm_env.scoring.scorer import RewardScorer
    from trl_rm_env.sharing import layouts, model_support
    from trl_rm_env.tokenization import encode_conversation

    resolved = []
    real = model_support.scoring_mode
    monkeypatch.setattr(layouts, "scoring_mode", lambda model, mode: resolved.append(mode) or real(model, mode))
    monkeypatch.setattr(model_support, "forces_sharing", lambda mode: pytest.fail("re-resolved on a call"))
    path = tiny_dir / "reward_model"
    prompts, completions = grpo_groups(2, 8)
    expected = {"auto": ("kv", False), True: ("kv", True), "packed": ("packed", True), False: ("plain", False)}
    scores = {}
    for asked, (layout, always) in expected.items():
        resolved.clear()
        plan = plan_model(str(path), prefix_sharing=asked, engine="hf", device="cpu")
        assert plan.prefix_sharing == asked
        tokenizer = load_tokenizer(plan)
        engine = load_engine(plan, tokenizer)
        assert (engine.sharing.layout.name, engine.sharing.always, engine.prefix_sharing) == (layout, always, asked)
        scorer = RewardScorer(engine.model, tokenizer, plan.options, engine=engine, head=plan.head)
        scores[asked] = [scorer.score(prompts, completions) for _ in range(3)]
        assert resolved == ([] if asked is False else [asked])  # once, when the engine was built
        with torch.no_grad():  # one forward of the plain model per conversation
            reference = torch.tensor([
                engine.model(input_ids=torch.tensor([encode_conversation(tokenizer, p, c)])).logits[0, 0].item()
                for p, c in zip(prompts, completions)
            ])
        for got in scores[asked]:
            torch.testing.assert_close(got, reference, atol=1e-4, rtol=0)
