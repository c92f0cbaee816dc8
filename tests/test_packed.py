"""The packed layout (`prefix_sharing="packed"`, the GPU's default): one padding-free row per micro-batch.

Exactness on the CPU (fp32, 1e-5): scores, per-record losses and gradients equal one-at-a-time plain scoring, for
1-, 2- and many-completion groups, empty contexts, ties, left truncation, a padding bucket, two-label (regression)
heads, eager and SDPA models, activation checkpointing. On the CPU the packed attention is ONE SDPA call per layer
under the row's block mask (the `mask` kernel). The GPU's branch (`varlen`: each segment's keys gathered, cast, GQA
heads, one kernel call, its backward) runs here too, with `kernels.reference_varlen_attn` in place of the CUDA
kernel (the `reference_varlen` fixture): only the kernel itself is left to `tests/gpu/`.
"""

from __future__ import annotations

import math

import pytest
import torch
from helpers import _one_thread, ranked_trainer, watch_passes  # noqa: F401

from trl_rm_env import RankedRewardConfig, RankedRewardTrainer, load_rank_dataset
from trl_rm_env.compat import CHECKPOINTING_FIELD
from trl_rm_env.sharing import pack_groups, packed_scores, shared_prefix_length, training_layout
from trl_rm_env.sharing.layouts import PACKED
from trl_rm_env.sharing.packed import PACKED_ATTENTION
from trl_rm_env.tiny_models import build_tiny_reward_model
from trl_rm_env.trainer.collator import DataCollatorForRankedPreference
from trl_rm_env.trainer.examples import tokenize_rank_record
from trl_rm_env.trainer.loss import ranked_bradley_terry_loss

SHAPES = [(30, [5, 9, 1]), (7, [12, 3]), (0, [6, 2]), (50, [4, 4, 4, 4]), (1, [6]), (12, [3, 3])]
"""(context length, [own lengths]): many, two and one completion(s), an empty context, ties (equal sequences)."""


def random_groups(seed: int, shapes, vocab: int) -> list[list[list[int]]]:
    g = torch.Generator().manual_seed(seed)
    groups = []
    for prefix_len, lengths in shapes:
        prefix = torch.randint(10, vocab, (prefix_len,), generator=g).tolist()
        group = [prefix + torch.randint(10, vocab, (n,), generator=g).tolist() for n in lengths]
        groups.append(group)
    groups[-1][1] = list(groups[-1][0])  # a tie: the same sequence twice
    return groups


@torch.no_grad()
def one_at_a_time(model, groups) -> torch.Tensor:
    return torch.stack([model(input_ids=torch.tensor([seq])).logits[0] for group in groups for seq in group])


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
@pytest.mark.parametrize("bucket", [None, 64])
def test_packed_scores_equal_one_at_a_time(tiny_tokenizer, attention, bucket):
    model = build_tiny_reward_model(tiny_tokenizer, seed=1, num_labels=2, attn_implementation=attention).eval()
    groups = random_groups(0, SHAPES, model.config.vocab_size)
    # The last group's tie makes its longest shared prefix the whole first sequence minus one token: use the given
    # context lengths instead (any prefix shared by the group is exact).
    prefixes = [p for p, _ in SHAPES]
    batch = pack_groups(groups, prefixes, tiny_tokenizer.pad_token_id, pad_to_multiple_of=bucket)
    unique = sum(p + sum(n for n in own) for p, own in SHAPES)
    assert batch["num_tokens"] == unique and batch["input_ids"].shape[0] == 1
    length = batch["input_ids"].shape[1]
    assert length == (unique if bucket is None else -(-unique // bucket) * bucket)
    with torch.no_grad():
        every, _ = packed_scores(model, batch, label_index=None)
        second, _ = packed_scores(model, batch, label_index=1)
    reference = one_at_a_time(model, groups)
    torch.testing.assert_close(every, reference, atol=1e-5, rtol=0)
    torch.testing.assert_close(second, reference[:, 1], atol=1e-5, rtol=0)
    assert model.config._attn_implementation == attention  # restored after the call


def test_block_mask_is_the_varlen_layout(tiny_tokenizer):
    """The layout's two readings agree: emulating the varlen kernel segment by segment (each segment's queries
    against its gathered keys, causal aligned to the end of the keys) equals SDPA under the block mask."""
    groups = random_groups(3, SHAPES, 500)
    packed = pack_groups(groups, [p for p, _ in SHAPES], 0, pad_to_multiple_of=16)["packed"]
    length = packed.length
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(length, 2, 8, generator=g) for _ in range(3))
    masked = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None], attn_mask=packed.block_mask()
    )[0].transpose(0, 1)
    from trl_rm_env.sharing.kernels import reference_varlen_attn

    emulated = reference_varlen_attn(  # the varlen kernel's contract: each segment against its gathered keys
        q, k[packed.key_index], v[packed.key_index], packed.cu_seqlens_q, packed.cu_seqlens_k, packed.max_q,
        packed.max_k, window_size=(-1, 0),
    )
    torch.testing.assert_close(emulated, masked, atol=1e-6, rtol=0)


@pytest.mark.parametrize("kv_heads", [2, 4], ids=["gqa", "mha"])
@pytest.mark.parametrize("bucket", [None, 16])
def test_varlen_branch_scores_equal_one_at_a_time(reference_varlen, tiny_tokenizer, kv_heads, bucket):
    """The GPU's branch, every line but the CUDA kernel: gathered keys, causal alignment, GQA heads, padding bucket."""
    model = build_tiny_reward_model(tiny_tokenizer, seed=1, num_key_value_heads=kv_heads).eval()
    groups = random_groups(0, SHAPES, model.config.vocab_size)
    batch = pack_groups(groups, [p for p, _ in SHAPES], tiny_tokenizer.pad_token_id, pad_to_multiple_of=bucket)
    with torch.no_grad():
        scores, _ = packed_scores(model, batch)
    assert len(reference_varlen) == model.config.num_hidden_layers  # one kernel call per layer: the branch ran
    torch.testing.assert_close(scores, one_at_a_time(model, groups)[:, 0], atol=1e-5, rtol=0)


def test_varlen_branch_loss_and_gradients_equal_the_plain_path(reference_varlen, tiny_tokenizer):
    """Backward through the branch (the gather's `index_select`, the casts) gives the plain path's gradients."""
    model = build_tiny_reward_model(tiny_tokenizer, seed=2)
    examples = rank_examples(tiny_tokenizer, 8)
    plain = DataCollatorForRankedPreference(tiny_tokenizer.pad_token_id)(examples)
    reference = model(input_ids=plain["input_ids"], attention_mask=plain["attention_mask"]).logits[:, 0]
    pairwise = ranked_bradley_terry_loss(reference, plain["ranks"], plain["record_index"])
    grads_ref = torch.autograd.grad(pairwise.loss, list(model.parameters()))
    batch = DataCollatorForRankedPreference(tiny_tokenizer.pad_token_id, layout=PACKED)(examples)
    scores, _ = packed_scores(model, batch)
    assert reference_varlen
    packed = ranked_bradley_terry_loss(scores, batch["ranks"], batch["record_index"])
    torch.testing.assert_close(packed.pair_losses, pairwise.pair_losses, atol=1e-5, rtol=0)
    for g, g_ref in zip(torch.autograd.grad(packed.loss, list(model.parameters())), grads_ref):
        torch.testing.assert_close(g, g_ref, atol=1e-5, rtol=1e-4)


def test_varlen_branch_on_a_torch_without_gqa_or_scale(reference_varlen, tiny_tokenizer, monkeypatch):
    """PyTorch releases whose kernel takes `is_causal` and neither `enable_gqa` nor `scale`: the key/value heads are
    repeated to the query heads, the default scale is the model's."""
    from trl_rm_env.sharing import kernels

    def legacy(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, is_causal=False):
        reference_varlen.append({"is_causal": is_causal})
        return kernels.reference_varlen_attn(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, is_causal=is_causal)

    monkeypatch.setattr(kernels, "varlen_kernel", lambda: legacy)
    model = build_tiny_reward_model(tiny_tokenizer, seed=1).eval()
    groups = random_groups(0, SHAPES, model.config.vocab_size)
    with torch.no_grad():
        scores, _ = packed_scores(model, pack_groups(groups, [p for p, _ in SHAPES], tiny_tokenizer.pad_token_id))
    assert reference_varlen == [{"is_causal": True}] * model.config.num_hidden_layers
    torch.testing.assert_close(scores, one_at_a_time(model, groups)[:, 0], atol=1e-5, rtol=0)


def test_reference_kernel_refuses_what_the_cuda_kernel_would_misread():
    from trl_rm_env.sharing.kernels import reference_varlen_attn

    q, k = torch.randn(5, 4, 8), torch.randn(7, 2, 8)
    cu_q, cu_k = torch.tensor([0, 2, 5], dtype=torch.int32), torch.tensor([0, 3, 7], dtype=torch.int32)
    out = reference_varlen_attn(q, k, k, cu_q, cu_k, 3, 4, window_size=(-1, 0), enable_gqa=True)
    assert out.shape == q.shape
    with pytest.raises(ValueError, match="query heads"):  # mismatched heads without enable_gqa
        reference_varlen_attn(q, k, k, cu_q, cu_k, 3, 4, window_size=(-1, 0))
    with pytest.raises(ValueError, match="cu_seq_k at 7 for 5 keys"):  # keys not gathered
        reference_varlen_attn(q, k[:5], k[:5], cu_q, cu_k, 3, 4, enable_gqa=True)
    with pytest.raises(ValueError, match="over max_q"):
        reference_varlen_attn(q, k, k, cu_q, cu_k, 2, 4, enable_gqa=True)


def test_pack_groups_rejects_a_sequence_without_its_own_token():
    with pytest.raises(ValueError, match="longer than its prefix"):
        pack_groups([[[1, 2, 3], [1, 2]]], [2], 0)


def test_attention_without_a_layout_is_an_error(tiny_tokenizer):
    model = build_tiny_reward_model(tiny_tokenizer, seed=0)
    from trl_rm_env.sharing import packed_attention

    with packed_attention(model), pytest.raises(RuntimeError, match="without a packed layout"):
        model(input_ids=torch.tensor([[5, 6, 7]]))
    assert model.config._attn_implementation != PACKED_ATTENTION


# ---------------------------------------------------------------------------------------------------- training


def rank_examples(tokenizer, n: int, truncation: str = "none", max_length: int | None = None):
    records = load_rank_dataset("sample:harder").select(range(n))
    return [tokenize_rank_record(r, tokenizer, max_length, truncation)[0] for r in records]


@pytest.mark.parametrize("tokenizer_name", ["tiny_tokenizer", "bos_tokenizer"])
@pytest.mark.parametrize("truncation", ["none", "left"])
def test_training_loss_and_gradients_equal_the_plain_path(request, tokenizer_name, truncation):
    tokenizer = request.getfixturevalue(tokenizer_name)
    model = build_tiny_reward_model(tokenizer, seed=2)
    examples = rank_examples(tokenizer, 10, truncation, max_length=60 if truncation == "left" else None)
    plain = DataCollatorForRankedPreference(tokenizer.pad_token_id)(examples)
    reference = model(input_ids=plain["input_ids"], attention_mask=plain["attention_mask"]).logits[:, 0]
    pairwise = ranked_bradley_terry_loss(reference, plain["ranks"], plain["record_index"])
    grads_ref = torch.autograd.grad(pairwise.loss, list(model.parameters()))

    batch = DataCollatorForRankedPreference(tokenizer.pad_token_id, layout=PACKED)(examples)
    assert batch["input_ids"].shape == (1, batch["num_tokens"])  # no padding
    assert batch["num_tokens"] < plain["attention_mask"].sum()  # each context once
    scores, _ = packed_scores(model, batch)
    torch.testing.assert_close(scores, reference, atol=1e-5, rtol=0)
    packed = ranked_bradley_terry_loss(scores, batch["ranks"], batch["record_index"])
    torch.testing.assert_close(packed.pair_losses, pairwise.pair_losses, atol=1e-5, rtol=0)  # each record's loss
    grads = torch.autograd.grad(packed.loss, list(model.parameters()))
    for g, g_ref in zip(grads, grads_ref):
        torch.testing.assert_close(g, g_ref, atol=1e-5, rtol=1e-4)


def test_pairs_keep_trls_layout(tiny_tokenizer):
    pairs = [{"chosen_ids": [5, 6, 7, 8], "rejected_ids": [5, 6, 9]}, {"chosen_ids": [3, 2], "rejected_ids": [4]}]
    batch = DataCollatorForRankedPreference(tiny_tokenizer.pad_token_id, layout=PACKED)(pairs)
    assert "ranks" not in batch and "record_index" not in batch
    tokens = batch["input_ids"][0].tolist()
    # every chosen, then every rejected: each score read at its sequence's last token
    assert [tokens[c] for c in batch["score_index"][:, 1].tolist()] == [8, 2, 9, 4]


@pytest.mark.slow
def test_trainer_packed_trains_like_the_plain_path(tmp_path, tiny_tokenizer):
    """`prefix_sharing="packed"` trains (losses, evaluation) exactly as the plain path, with and without activation
    checkpointing (the layers recompute under the packed attention in backward)."""
    train = load_rank_dataset("sample:train").select(range(32))
    eval_sets = {"harder": load_rank_dataset("sample:harder").select(range(21))}
    runs = {}
    for name, overrides in {
        "plain": {"prefix_sharing": False},
        "packed": {"prefix_sharing": "packed"},
        "checkpointed": {"prefix_sharing": "packed", CHECKPOINTING_FIELD: True},
    }.items():
        trainer = ranked_trainer(tmp_path / name, tiny_tokenizer, train, eval_sets, max_steps=4, **overrides)
        assert trainer._layout.name == ("plain" if name == "plain" else "packed")
        assert (trainer.data_collator.layout is PACKED) == (name != "plain")
        trainer.train()
        losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
        tokens = [h["num_tokens"] for h in trainer.state.log_history if "num_tokens" in h]
        runs[name] = (losses, trainer.evaluate(), tokens)
        assert trainer.model.config._attn_implementation == "sdpa"  # restored after every step
    for name in ("packed", "checkpointed"):
        assert runs[name][0] == pytest.approx(runs["plain"][0], abs=1e-5)
        for key in ("eval_harder_loss", "eval_harder_accuracy", "eval_harder_margin"):
            assert runs[name][1][key] == pytest.approx(runs["plain"][1][key], abs=1e-5)
        assert runs[name][2][-1] < runs["plain"][2][-1]  # fewer tokens through the model


def one_step(trainer):
    """One training step of `trainer` on its first batch: the loss, the gradients of every parameter, and the
    `(batch, length)` of every forward of the model's decoder."""
    shapes = []
    body = trainer.model.model
    handle = body.register_forward_pre_hook(lambda module, args, kwargs: shapes.append(tuple(
        (kwargs.get("input_ids") if kwargs.get("input_ids") is not None else args[0]).shape)), with_kwargs=True)
    trainer.create_optimizer_and_scheduler(num_training_steps=1)
    batch = next(iter(trainer.get_train_dataloader()))
    trainer.model.zero_grad()
    trainer.current_gradient_accumulation_steps = 1  # set by the training loop
    try:
        loss = trainer.training_step(trainer.model, batch)
    finally:
        handle.remove()
    return loss.item(), [p.grad.clone() for p in trainer.model.parameters()], shapes, batch


@pytest.mark.slow  # about a second each: training runs
@pytest.mark.parametrize("layout", ["packed", "kv", "packed-varlen", "pairs", "ensemble-pairs"])
def test_pack_max_tokens_bounds_every_forward(tmp_path, tiny_tokenizer, layout, request):
    """A micro-batch over `pack_max_tokens` runs as several forwards of at most that many tokens (a record over it
    alone) in the same step; its loss and gradients equal the unbounded step's (1e-5); with `ensemble_heads` too
    (each chunk's records keep their bootstrap weights)."""
    if layout == "packed-varlen":
        request.getfixturevalue("reference_varlen")
    heads = 3 if layout.startswith("ensemble") else 1
    layout = layout.removeprefix("ensemble-")
    train = load_rank_dataset("sample:harder").select(range(8))
    if layout == "pairs":  # TRL's pair data: every chosen, then every rejected, through the chunks
        train = train.map(lambda r: {"chosen": r["completions"][0]["completion"],
                                     "rejected": r["completions"][1]["completion"], "prompt": r["context"]},
                          remove_columns=train.column_names)
    mode = "auto" if layout == "kv" else "packed"
    runs = {}
    for budget in (None, 150):
        trainer = ranked_trainer(tmp_path / str(budget), tiny_tokenizer, train, max_steps=1, prefix_sharing=mode,
                                 pack_max_tokens=budget, ensemble_heads=heads)
        assert trainer._layout.name == ("kv" if layout == "kv" else "packed")
        runs[budget] = one_step(trainer) + (trainer.evaluate(train),)
    loss, grads, shapes, batch, evaluation = runs[150]
    assert len(batch["chunks"]) > 1 and len(runs[None][2]) in (1, 2)  # unbounded: one forward (KV: two passes)
    if layout != "kv":
        assert len(shapes) == len(batch["chunks"])  # one packed forward per chunk
        lengths = [c["input_ids"].shape[1] for c in batch["chunks"]]
        assert all(n <= 150 or c["record_index"].max() == 0 for n, c in zip(lengths, batch["chunks"]))
        assert [s[1] for s in shapes] == lengths
    assert loss == pytest.approx(runs[None][0], abs=1e-5)
    for g, g_ref in zip(grads, runs[None][1]):
        torch.testing.assert_close(g, g_ref, atol=1e-5, rtol=1e-4)
    for key in ("eval_loss", "eval_accuracy", "eval_margin", "eval_mean_reward"):  # evaluation reads the chunks too
        assert evaluation[key] == pytest.approx(runs[None][4][key], abs=1e-5)
    if layout != "kv":  # transformers' token count and FLOP estimate read every chunk
        trainer.args.include_num_input_tokens_seen = "all"
        trainer._track_num_input_tokens(batch)
        assert trainer.state.num_input_tokens_seen == sum(lengths)
        whole = RankedRewardTrainer.floating_point_ops(trainer, {"input_ids": torch.zeros(1, sum(lengths))})
        assert trainer.floating_point_ops(batch) == whole > 0


def test_pack_max_tokens_is_refused_where_nothing_reads_it(tmp_path, tiny_tokenizer):
    train = load_rank_dataset("sample:harder").select(range(4))
    with pytest.raises(ValueError, match="pack_max_tokens=64 bounds the forwards of the shared layouts, but a "
                                         "data_collator was given"):
        trainer = ranked_trainer(tmp_path, tiny_tokenizer, train, pack_max_tokens=64)
        RankedRewardTrainer(model=trainer.model, args=trainer.args, train_dataset=train,
                            data_collator=DataCollatorForRankedPreference(tiny_tokenizer.pad_token_id),
                            processing_class=tiny_tokenizer)


def test_auto_is_packed_on_an_accelerator_and_kv_on_the_cpu(tiny_tokenizer):
    model = build_tiny_reward_model(tiny_tokenizer, seed=0)
    common = dict(activation_checkpointing=False, fsdp=False, plain_reason=None)
    assert training_layout(model, "auto", accelerator=True, **common).name == "packed"
    assert training_layout(model, True, accelerator=True, **common).name == "packed"
    assert training_layout(model, "auto", accelerator=False, **common).name == "kv"
    assert training_layout(model, "packed", accelerator=False, **common).name == "packed"
    checkpointed = common | {"activation_checkpointing": True}
    assert training_layout(model, "auto", accelerator=True, **checkpointed).name == "packed"
    assert training_layout(model, False, accelerator=True, **common).name == "plain"
    sliding = build_tiny_reward_model(tiny_tokenizer, seed=0, layer_types=["sliding_attention", "full_attention"],
                                      sliding_window=4, use_sliding_window=True)
    assert training_layout(sliding, "packed", accelerator=True, **common).name == "plain"


def test_shared_prefix_length_is_the_packed_context(tiny_tokenizer):
    examples = rank_examples(tiny_tokenizer, 3)
    batch = DataCollatorForRankedPreference(tiny_tokenizer.pad_token_id, layout=PACKED)(examples)
    expected = sum(shared_prefix_length(e["completion_ids"]) + sum(
        len(s) - shared_prefix_length(e["completion_ids"]) for s in e["completion_ids"]) for e in examples)
    assert batch["num_tokens"] == expected


# ---------------------------------------------------------------------------------------------------- scoring


def chat_groups(num_prompts: int, generations: int, seed: int = 0):
    import random

    words = "add two and 3 please the answer is 4 because numbers".split()
    rng = random.Random(seed)
    prompts, completions = [], []
    for _ in range(num_prompts):
        prompt = [{"role": "user", "content": " ".join(rng.choice(words) for _ in range(rng.randint(3, 60)))}]
        for _ in range(generations):
            prompts.append(prompt)
            answer = " ".join(rng.choice(words) for _ in range(rng.randint(0, 12))) or "4"
            completions.append([{"role": "assistant", "content": answer}])
    return prompts, completions


@pytest.mark.parametrize(
    "batch_size, budget",
    [(None, None), pytest.param(3, None, marks=pytest.mark.slow), pytest.param(None, 400, marks=pytest.mark.slow),
     (2, 250)],  # the default and the tightest budget fast, the others in the full suite
)
@pytest.mark.parametrize(
    "tokenizer_name", ["tiny_tokenizer", pytest.param("bos_tokenizer", marks=pytest.mark.slow)]  # bos: full suite
)
def test_scorer_packs_groups_exactly_within_the_budget(request, tokenizer_name, batch_size, budget):
    from helpers import score_one

    from trl_rm_env import RewardScorer

    tokenizer = request.getfixturevalue(tokenizer_name)
    model = build_tiny_reward_model(tokenizer, seed=5)
    prompts, completions = chat_groups(5, 4, seed=3)
    plain = RewardScorer(model, tokenizer, prefix_sharing=False, max_tokens_per_batch=budget)  # the same truncation
    encoded = plain.encode(prompts, completions)
    reference = torch.tensor([score_one(model, ids) for ids in encoded.ids])
    scorer = RewardScorer(model, tokenizer, batch_size=batch_size, max_tokens_per_batch=budget,
                          prefix_sharing="packed")
    assert scorer.prefix_sharing == "packed"
    with watch_passes(scorer) as passes:
        scores = scorer.score(prompts, completions)
    torch.testing.assert_close(scores, reference, atol=1e-5, rtol=0)
    assert passes.shared == list(range(len(prompts)))
    shapes = passes.shapes
    assert shapes and all(rows == 1 for rows, _ in shapes)  # one packed row per forward
    longest = max(len(ids) for ids in encoded.ids)
    assert all(n <= max(budget or 8192, longest) for _, n in shapes)
    groups = [encoded.ids[i:i + 4] for i in range(0, len(prompts), 4)]  # each prompt once per forward
    unique = sum(shared_prefix_length(g) + sum(len(s) - shared_prefix_length(g) for s in g) for g in groups)
    assert sum(n for _, n in shapes) >= unique
    if budget is None and batch_size is None:
        assert sum(n for _, n in shapes) == unique and len(shapes) == 1
    back = scorer.score(prompts[::-1], completions[::-1])  # input order is kept
    torch.testing.assert_close(back, reference.flip(0), atol=1e-5, rtol=0)
    ids = scorer.score_ids(encoded.ids[::-1])  # token ids without contexts: the groups are found
    torch.testing.assert_close(ids, reference.flip(0), atol=1e-5, rtol=0)


def test_plan_packed_rows_respects_budget_and_sequences():
    from trl_rm_env.sharing.planning import plan_packed_rows

    lengths = [30, 25, 40, 12, 12, 100, 7]
    units = [(10, [0, 1, 2]), (5, [3, 4]), (0, [5]), (0, [6])]
    rows = plan_packed_rows(units, lengths, budget=60, max_sequences=2)
    items = sorted(i for row in rows for _, part in row for i in part)
    assert items == list(range(7))
    for row in rows:
        tokens = sum(p + sum(lengths[i] - p for i in part) for p, part in row)
        assert tokens <= 60 or (len(row) == 1 and len(row[0][1]) == 1)  # one sequence always gets a row
        assert sum(len(part) for _, part in row) <= 2


# ---------------------------------------------------------------------------------------------------- GPU proxies


def hh_like_records(n: int, seed: int = 0) -> list[dict]:
    """Records shaped like Anthropic hh-rlhf (made here, no data file): a multi-turn context of a few hundred
    tokens, two short final answers."""
    import random

    words = "the a model reward answer question because people often think about why how when where it".split()
    rng = random.Random(seed)

    def text(lo, hi):
        return " ".join(rng.choice(words) for _ in range(rng.randint(lo, hi)))

    records = []
    for _ in range(n):
        context = []
        for _ in range(rng.randint(2, 4)):
            context += [{"role": "user", "content": text(20, 60)}, {"role": "assistant", "content": text(30, 90)}]
        context.append({"role": "user", "content": text(10, 40)})
        completions = [{"rank": r, "completion": [{"role": "assistant", "content": text(10, 60)}]} for r in (0, 1)]
        records.append({"context": context, "completions": completions})
    return records


class OpCounter(torch.utils._python_dispatch.TorchDispatchMode):
    """Counts every aten op, and separately those run while a decoder layer's forward is on the stack."""

    def __init__(self, model):
        super().__init__()
        self.total, self.in_layers, self.depth = 0, [], 0
        self.handles = []
        for layer in model.model.layers:
            self.handles.append(layer.register_forward_pre_hook(lambda *a: self._enter()))
            self.handles.append(layer.register_forward_hook(lambda *a: self._leave()))

    def _enter(self):
        self.depth += 1

    def _leave(self):
        self.depth -= 1

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.total += 1
        if self.depth:
            self.in_layers.append(func.__name__.split(".")[0])
        return func(*args, **(kwargs or {}))


def count_step(trainer, examples):
    """(aten ops of one training step, ops inside the layers' forward, decoder forwards) on `examples`."""
    model = trainer.model
    forwards = []
    handle = model.model.register_forward_pre_hook(lambda *a: forwards.append(1))
    batch = trainer.data_collator(examples)
    trainer.current_gradient_accumulation_steps = 1  # set by the training loop, which this step runs outside of
    counter = OpCounter(model)
    try:
        with counter:
            trainer.training_step(model, batch, None)
    finally:
        handle.remove()
        for h in counter.handles:
            h.remove()
    return counter.total, counter.in_layers, len(forwards), batch


@pytest.mark.slow
def test_gpu_proxies_of_a_packed_training_step(tmp_path, tiny_tokenizer):
    """On an hh-rlhf-shaped micro-batch of 8 records: one decoder forward per step, padded positions within 1.05x
    the unique tokens, no host sync (`item`, `_local_scalar_dense`, `nonzero`) inside the decoder layers, and the
    aten ops of a training step at most 1.25x those of TRL's `RewardTrainer` step on the same pairs."""
    from datasets import Dataset
    from trl import RewardConfig, RewardTrainer

    records = hh_like_records(8)
    rows = [{"prompt": r["context"], "chosen": r["completions"][0]["completion"],
             "rejected": r["completions"][1]["completion"]} for r in records]
    common = dict(output_dir=str(tmp_path), per_device_train_batch_size=8, use_cpu=True, report_to="none",
                  save_strategy="no", disable_tqdm=True, bf16=False, max_length=4096, dataloader_num_workers=0)
    ours = RankedRewardTrainer(
        model=build_tiny_reward_model(tiny_tokenizer, seed=0).train(),
        args=RankedRewardConfig(**common, prefix_sharing="packed"), train_dataset=Dataset.from_list(records),
        processing_class=tiny_tokenizer,
    )
    trl = RewardTrainer(
        model=build_tiny_reward_model(tiny_tokenizer, seed=0).train(), args=RewardConfig(**common),
        train_dataset=Dataset.from_list(rows), processing_class=tiny_tokenizer,
    )
    ours_examples = [ours.train_dataset[i] for i in range(8)]
    trl_examples = [trl.train_dataset[i] for i in range(8)]
    ops, in_layers, forwards, batch = count_step(ours, ours_examples)
    trl_ops, trl_in_layers, trl_forwards, _ = count_step(trl, trl_examples)
    assert forwards == 1 and trl_forwards == 1
    unique = sum(shared_prefix_length(e["completion_ids"]) + sum(
        len(s) - shared_prefix_length(e["completion_ids"]) for s in e["completion_ids"]) for e in ours_examples)
    assert batch["input_ids"].numel() <= 1.05 * unique
    syncs = {"item", "_local_scalar_dense", "nonzero"}
    assert not syncs & set(in_layers), sorted(syncs & set(in_layers))
    assert in_layers and trl_in_layers  # the counter saw the layers of both
    assert ops <= 1.25 * trl_ops, (ops, trl_ops)


@pytest.mark.slow
def test_gpu_proxies_of_packed_scoring(tiny_tokenizer):
    """GRPO scoring of 4 prompts x 8 completions with `prefix_sharing="packed"`: one decoder forward, each prompt
    once, no padding, no host sync inside the decoder layers."""
    from trl_rm_env import RewardScorer

    model = build_tiny_reward_model(tiny_tokenizer, seed=0)
    records = hh_like_records(4, seed=1)
    prompts = [r["context"] for r in records for _ in range(8)]
    answers = [[{"role": "assistant", "content": f"answer number {k} " * (k + 1)}] for _ in records for k in range(8)]
    scorer = RewardScorer(model, tiny_tokenizer, prefix_sharing="packed")
    encoded = scorer.encode(prompts, answers)
    forwards = []
    handle = model.model.register_forward_pre_hook(lambda *a: forwards.append(1))
    counter = OpCounter(model)
    try:
        with counter, watch_passes(scorer) as passes:
            scorer.score(prompts, answers)
    finally:
        handle.remove()
        for h in counter.handles:
            h.remove()
    assert len(forwards) == 1 and len(passes.shapes) == 1 and passes.shapes[0][0] == 1
    groups = [encoded.ids[i:i + 8] for i in range(0, 32, 8)]
    unique = sum(shared_prefix_length(g) + sum(len(s) - shared_prefix_length(g) for s in g) for g in groups)
    assert passes.shapes[0][1] == unique
    assert not {"item", "_local_scalar_dense", "nonzero"} & set(counter.in_layers)


@pytest.mark.slow
def test_a_user_collator_under_packed_trains_plainly(tmp_path, tiny_tokenizer):
    """`prefix_sharing="packed"` with a collator the user passes (TRL's): its plain batches train as in TRL, and the
    packed attention is never entered for them."""
    from datasets import Dataset
    from trl.trainer.reward_trainer import DataCollatorForPreference

    records = hh_like_records(8)
    rows = [{"prompt": r["context"], "chosen": r["completions"][0]["completion"],
             "rejected": r["completions"][1]["completion"]} for r in records]
    args = RankedRewardConfig(output_dir=str(tmp_path), max_steps=2, per_device_train_batch_size=4, use_cpu=True,
                              report_to="none", save_strategy="no", disable_tqdm=True, prefix_sharing="packed",
                              logging_steps=1)
    trainer = RankedRewardTrainer(
        model=build_tiny_reward_model(tiny_tokenizer, seed=0).train(), args=args, train_dataset=Dataset.from_list(rows),
        processing_class=tiny_tokenizer, data_collator=DataCollatorForPreference(tiny_tokenizer.pad_token_id),
    )
    trainer.train()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert len(losses) == 2 and all(math.isfinite(x) for x in losses)


def test_a_regression_config_refuses_packed(tmp_path):
    from trl_rm_env import RegressionRewardConfig

    with pytest.raises(ValueError, match="nothing to share"):
        RegressionRewardConfig(output_dir=str(tmp_path), prefix_sharing="packed")


def test_scores_are_read_where_the_model_pools_a_trailing_padding_id(tiny_tokenizer):
    """transformers' classifiers read a sequence's score at its last token that is not the padding id (a trailing
    EOS that is also the padding id is skipped); the packed layout reads the same position."""
    model = build_tiny_reward_model(tiny_tokenizer, seed=4).eval()
    groups = random_groups(5, [(9, [4, 6]), (0, [5]), (3, [2, 7])], model.config.vocab_size)
    eos = 7
    for group in groups:
        for seq in group:
            seq.append(eos)  # every sequence ends with the padding id
    groups[1][0][-2] = eos  # ... one with two of them
    context = [11, 12, 13, 14, 15]
    groups.append([context + [eos], context + [20, 21, eos]])  # a completion that is only the padding id: the
    model.config.pad_token_id = eos  # score is read at the context's last token (KV cuts its context before it)
    prefixes = [9, 0, 3, 5]
    batch = pack_groups(groups, prefixes, eos)
    from trl_rm_env.sharing import collate_shared_context, record_row, shared_context_scores, shared_prefix_mask

    reference = one_at_a_time(model, groups)
    with torch.no_grad():
        scores, _ = packed_scores(model, batch, label_index=None)
        kv, _ = shared_context_scores(model, collate_shared_context(groups, prefixes, eos), label_index=None)
        masked = []
        for group in groups:  # block-mask rows, one record each
            tokens, positions, segments, offsets = record_row(group, pad_token_id=eos)
            mask = shared_prefix_mask(torch.zeros(1, len(tokens), dtype=torch.long), torch.tensor([segments]),
                                      torch.bool)
            hidden = model.model(input_ids=torch.tensor([tokens]), position_ids=torch.tensor([positions]),
                                 attention_mask=mask).last_hidden_state
            masked.append(model.score(hidden)[0, offsets])
    torch.testing.assert_close(scores, reference, atol=1e-5, rtol=0)
    torch.testing.assert_close(kv, reference, atol=1e-5, rtol=0)
    torch.testing.assert_close(torch.cat(masked), reference, atol=1e-5, rtol=0)
    from trl_rm_env.sharing.planning import pooled_index

    assert pooled_index([3, 4, eos, eos], eos) == 1 and pooled_index([eos, eos], eos) == 0


def test_a_model_with_its_own_attention_code_is_not_packed(tiny_tokenizer):
    """The packed layout replaces attention through transformers' AttentionInterface; a model whose attention code
    does not go through it (older or remote-code classes) is never packed, and `auto` keeps its other layouts."""
    model = build_tiny_reward_model(tiny_tokenizer, seed=0)
    own = type("OwnAttentionForSequenceClassification", (type(model),), {"_supports_attention_backend": False})
    model.__class__ = own
    from trl_rm_env.sharing import packed_unsupported

    assert "AttentionInterface" in packed_unsupported(model)
    common = dict(activation_checkpointing=False, fsdp=False, plain_reason=None)
    assert training_layout(model, "auto", accelerator=True, **common).name == "kv"
    assert training_layout(model, "packed", accelerator=False, **common).name == "plain"


def test_encoding_a_sequence_type_that_builds_new_objects_on_access(tiny_tokenizer):
    """`RewardScorer.encode` over sequences whose items are new objects at every access (a `datasets` column) gives
    the ids of plain lists."""
    from trl_rm_env import RewardScorer

    prompts, completions = chat_groups(2, 3, seed=1)

    class Fresh(list):
        def __getitem__(self, i):
            import copy

            return copy.deepcopy(super().__getitem__(i))

        def __iter__(self):
            return (self[i] for i in range(len(self)))

    scorer = RewardScorer(build_tiny_reward_model(tiny_tokenizer, seed=0), tiny_tokenizer, prefix_sharing=False)
    expected = scorer.encode(prompts, completions)
    got = scorer.encode(Fresh(prompts), Fresh(completions))
    assert got.ids == expected.ids and got.context_lengths == expected.context_lengths


def test_common_prefix_length_matches_a_scan():
    import random

    from trl_rm_env.tokenization import common_prefix_length

    rng = random.Random(0)
    for _ in range(300):
        a = [rng.randint(0, 3) for _ in range(rng.randint(0, 12))]
        b = a[: rng.randint(0, len(a))] + [rng.randint(0, 3) for _ in range(rng.randint(0, 6))]
        scan = 0
        while scan < min(len(a), len(b)) and a[scan] == b[scan]:
            scan += 1
        assert common_prefix_length(a, b) == scan == common_prefix_length(tuple(b), a)


def test_a_forward_that_never_ran_the_packed_attention_raises(tiny_tokenizer, monkeypatch):
    """A model whose layers do not call the packed attention (their own attention code) would mix completions: the
    call raises instead of returning those scores."""
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    from trl_rm_env.sharing import packed as packed_module

    model = build_tiny_reward_model(tiny_tokenizer, seed=0)
    batch = pack_groups(random_groups(1, [(4, [2, 3])], model.config.vocab_size), [4], tiny_tokenizer.pad_token_id)
    packed_module._register()

    def own_attention(module, query, key, value, attention_mask, packed=None, **kwargs):
        return sdpa_attention_forward(module, query, key, value, None, **kwargs)

    monkeypatch.setitem(AttentionInterface._global_mapping, PACKED_ATTENTION, own_attention)
    with torch.no_grad(), pytest.raises(RuntimeError, match="ran its own attention"):
        packed_scores(model, batch)
    assert model.config._attn_implementation == "sdpa"


@pytest.mark.slow  # several seconds: trainers built and stepped
def test_training_token_budget_from_free_memory(tiny_tokenizer, monkeypatch):
    """The default `pack_max_tokens` on CUDA: half the free memory less the gradients and Adam's moments to come,
    over a token's activations in every layer (one hidden state per layer under checkpointing), clamped."""
    from trl_rm_env.trainer.token_budget import MAX_TRAINING_TOKENS, MIN_TRAINING_TOKENS, training_token_budget

    model = build_tiny_reward_model(tiny_tokenizer, hidden_size=1024, intermediate_size=3072, num_attention_heads=16,
                                    num_key_value_heads=8, head_dim=128, num_hidden_layers=28)
    cuda = torch.device("cuda")
    free = [80 * 2**30]
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (free[0], 2 * free[0]))
    budget = training_token_budget(model, False, torch.bfloat16, cuda)
    per_token = 2 * 28 * (8 * 1024 + 4 * (2048 + 1024) + 6 * 3072)  # 2.2 MB: the H200 run measured 79 KB a layer
    # gradients (4 bytes: fp32 weights) and Adam's moments (8), and the weights themselves (4): not on the GPU yet
    to_come = sum(p.numel() for p in model.parameters()) * (4 + 8 + 4)
    assert budget == int((free[0] - to_come) * 0.5 / per_token) // 1024 * 1024
    assert training_token_budget(model, True, torch.bfloat16, cuda) > 10 * budget  # checkpointing keeps far less
    free[0] = 2**30
    assert training_token_budget(model, False, torch.bfloat16, cuda) == MIN_TRAINING_TOKENS
    free[0] = 2**50
    assert training_token_budget(model, True, torch.bfloat16, cuda) == MAX_TRAINING_TOKENS


# ---------------------------------------------------------------------------------------------------- FlexAttention
@pytest.fixture
def packed_kernel(monkeypatch):
    """Set `TRL_RM_ENV_PACKED_KERNEL` for the test (`kernels.packed_kernel` reads it once: its cache is cleared)."""
    from trl_rm_env.sharing import kernels

    def choose(value: str) -> None:
        monkeypatch.setenv(kernels.PACKED_KERNEL_ENV, value)
        kernels.packed_kernel.cache_clear()

    yield choose
    monkeypatch.delenv(kernels.PACKED_KERNEL_ENV, raising=False)
    kernels.packed_kernel.cache_clear()


@pytest.mark.parametrize("kv_heads", [2, 4], ids=["gqa", "mha"])
@pytest.mark.parametrize("bucket", [None, 16])
def test_flex_kernel_scores_equal_one_at_a_time(packed_kernel, tiny_tokenizer, kv_heads, bucket, monkeypatch):
    """FlexAttention under the layout's BlockMask, key/value heads shared (never repeated): the same scores as each
    sequence alone (fp32, 1e-5), one FlexAttention call per layer and no SDPA call."""
    from trl_rm_env.sharing import kernels

    packed_kernel("flex")
    model = build_tiny_reward_model(tiny_tokenizer, seed=1, num_key_value_heads=kv_heads).eval()
    groups = random_groups(0, SHAPES, model.config.vocab_size)
    batch = pack_groups(groups, [p for p, _ in SHAPES], tiny_tokenizer.pad_token_id, pad_to_multiple_of=bucket)
    calls, run_flex = [], kernels.run_flex
    monkeypatch.setattr(kernels, "run_flex", lambda q, k, v, *a: calls.append((q.shape[1], k.shape[1])) or run_flex(
        q, k, v, *a))
    import transformers.integrations.sdpa_attention as sdpa

    monkeypatch.setattr(sdpa, "sdpa_attention_forward", lambda *a, **k: pytest.fail("the mask kernel ran"))
    with torch.no_grad():
        scores, _ = packed_scores(model, batch)
    assert calls == [(4, kv_heads)] * model.config.num_hidden_layers  # the key/value heads as the model has them
    torch.testing.assert_close(scores, one_at_a_time(model, groups)[:, 0], atol=1e-5, rtol=0)


def test_a_kernel_that_cannot_run_is_refused(packed_kernel, tiny_tokenizer):
    model = build_tiny_reward_model(tiny_tokenizer, seed=1).eval()
    batch = pack_groups(random_groups(0, SHAPES[:2], model.config.vocab_size), [30, 7], tiny_tokenizer.pad_token_id)
    packed_kernel("varlen")  # the CPU has no varlen kernel
    with pytest.raises(ValueError, match=r"^TRL_RM_ENV_PACKED_KERNEL=varlen: torch's varlen kernel does not run this "
                                         r"forward \(cpu, torch.float32, dropout 0.0\); unset it, or choose flex or "
                                         r"mask\.$"), torch.no_grad():
        packed_scores(model, batch)
    packed_kernel("fast")
    with pytest.raises(ValueError, match=r"^TRL_RM_ENV_PACKED_KERNEL='fast': choose one of auto, varlen, flex, mask\.$"):
        packed_scores(model, batch)
    packed_kernel("flex")  # training: FlexAttention's backward is CUDA's (tests/gpu runs it)
    with pytest.raises(ValueError, match=r"^TRL_RM_ENV_PACKED_KERNEL=flex: FlexAttention has no backward off CUDA"):
        packed_scores(build_tiny_reward_model(tiny_tokenizer, seed=1).train(), batch)
    dropping = build_tiny_reward_model(tiny_tokenizer, seed=1, attention_dropout=0.1).train()
    with pytest.raises(ValueError, match=r"^TRL_RM_ENV_PACKED_KERNEL=flex: FlexAttention has no attention dropout"):
        packed_scores(dropping, batch)
