"""Ensemble reward models in one forward (`RankedRewardConfig(ensemble_heads=K)`, issue 39): K bootstrapped score
heads on one backbone. Held here: the bootstrap weights (reproducible by seed, different between heads, the same for
a record anywhere), the loss (the mean of each head's weighted Bradley-Terry loss), every training layout's K-head
scores against K single-head models scored one at a time (fp32, 1e-5), scoring with K heads in one forward, the
trainer end to end (per-head eval metrics, a checkpoint any tool loads, the environment aggregating its heads) and
the refusals."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from helpers import reference_text, training_args
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from trl_rm_env import RankedRewardConfig, RankedRewardTrainer, RewardModelEnvironment, load_rank_dataset
from trl_rm_env.runtime.engines import HFEngine
from trl_rm_env.runtime.model_options import ScoringOptions
from trl_rm_env.sharing import shared_prefix_length
from trl_rm_env.sharing.layouts import BLOCK_MASK, KV_CACHE, PACKED, PLAIN
from trl_rm_env.tiny_models import build_tiny_reward_model
from trl_rm_env.tokenization import encode_conversation
from trl_rm_env.trainer.collator import DataCollatorForRankedPreference
from trl_rm_env.trainer.config import RegressionRewardConfig
from trl_rm_env.trainer.ensemble import bootstrap_weights, ensemble_loss
from trl_rm_env.trainer.saving import save_reward_model

HEADS = 4


def records(seed: int, count: int) -> list[list[list[int]]]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(count):
        context = torch.randint(10, 200, (int(torch.randint(1, 20, (1,), generator=g)),), generator=g).tolist()
        n = int(torch.randint(2, 5, (1,), generator=g))
        out.append([context + torch.randint(10, 200, (int(torch.randint(1, 8, (1,), generator=g)),), generator=g).tolist()
                    for _ in range(n)])  # fmt: skip
    return out


def single_head(model, k: int):
    """A one-label copy of `model` holding only head k's weights."""
    config = model.config.__class__.from_dict({**model.config.to_dict(), "num_labels": 1, "id2label": {0: "LABEL_0"},
                                               "label2id": {"LABEL_0": 0}})  # fmt: skip
    one = type(model)(config).eval()
    state = {name: value for name, value in model.state_dict().items() if not name.startswith("score.")}
    state["score.weight"] = model.score.weight[k : k + 1].detach().clone()
    one.load_state_dict(state, strict=True)
    return one


@torch.no_grad()
def per_head_reference(model, groups) -> torch.Tensor:
    """`(C, K)`: each head's single-head model on each sequence alone."""
    heads = [single_head(model, k) for k in range(model.config.num_labels)]
    return torch.tensor([[h(input_ids=torch.tensor([seq])).logits[0, 0].item() for h in heads]
                         for group in groups for seq in group])  # fmt: skip


# --- bootstrap -----------------------------------------------------------------------------------------------------
def test_bootstrap_weights_are_reproducible_by_seed_differ_between_heads_and_follow_the_record():
    batch = records(0, 400)
    weights = bootstrap_weights(batch, HEADS, seed=7)
    assert weights.shape == (400, HEADS) and weights.dtype == torch.float32
    assert torch.equal(weights, bootstrap_weights(batch, HEADS, seed=7))  # reproducible by seed
    assert not torch.equal(weights, bootstrap_weights(batch, HEADS, seed=8))  # another seed, another resample
    assert all(not torch.equal(weights[:, a], weights[:, b]) for a in range(HEADS) for b in range(a))  # heads differ
    # A record's weights are its own, whatever its batch or position (shuffling, processes, chunks).
    assert torch.equal(bootstrap_weights(batch[::-1][:50], HEADS, seed=7), weights.flip(0)[:50])
    assert torch.equal(bootstrap_weights(batch[:20], 12, seed=7)[:, :HEADS], weights[:20])  # K heads or 12: the same
    # Poisson(1): integers, mean 1, about e^-1 of the records left out of each head's resample.
    assert torch.equal(weights, weights.round()) and weights.min() >= 0
    assert weights.mean().item() == pytest.approx(1.0, abs=0.08)
    assert (weights == 0).float().mean().item() == pytest.approx(0.3679, abs=0.04)


@pytest.mark.parametrize("margin", [None, [0.5, -0.25, 0.0]], ids=["no-margin", "margin"])
def test_the_loss_is_the_mean_of_each_heads_bootstrap_weighted_bradley_terry_loss(margin):
    g = torch.Generator().manual_seed(0)
    scores = torch.randn(7, 3, generator=g, dtype=torch.float64)
    ranks = torch.tensor([0, 1, 2, 0, 1, 1, 0])
    record_index = torch.tensor([0, 0, 0, 1, 1, 1, 2])  # record 2 has one completion: no pair
    weights = torch.tensor([[2.0, 0.0, 1.0], [1.0, 0.0, 3.0], [0.0, 5.0, 1.0]])
    m = [0.0] * 3 if margin is None else margin  # a record's margin is subtracted from each of its pairs' differences
    margin = None if margin is None else torch.tensor(margin, dtype=torch.float64)
    loss, pairwise, heads = ensemble_loss(scores, ranks, record_index, margin, 0.01, weights)
    pairs = [(0, 1, 0), (0, 2, 0), (1, 2, 0), (3, 4, 1), (3, 5, 1)]  # (better, worse, record)
    want = []
    for k in range(3):
        w = torch.tensor([weights[r, k] for *_, r in pairs], dtype=torch.float64)
        losses = torch.stack([-F.logsigmoid(scores[i, k] - scores[j, k] - m[r]) for i, j, r in pairs])
        centre = torch.stack([(scores[i, k] + scores[j, k]) ** 2 for i, j, _ in pairs]).mean()
        want.append((w * losses).sum() / len(pairs) + 0.01 * centre)  # head 1: records 0 and 1 weigh 0: only centring
    assert loss.item() == pytest.approx(torch.stack(want).mean().item(), abs=1e-12)
    mean = scores.mean(dim=1)
    assert pairwise.pair_losses.tolist() == pytest.approx([-F.logsigmoid(mean[i] - mean[j] - m[r]).item()
                                                           for i, j, r in pairs])  # fmt: skip
    # Each head's own pairs and unweighted losses (its evaluation metrics), the same pairs as the aggregate's.
    for k, head in enumerate(heads):
        assert list(zip(head.better.tolist(), head.worse.tolist())) == [(i, j) for i, j, _ in pairs]
        assert head.pair_losses.tolist() == pytest.approx([-F.logsigmoid(scores[i, k] - scores[j, k] - m[r]).item()
                                                           for i, j, r in pairs])  # fmt: skip
        assert head.loss.item() == pytest.approx(want[k].item(), abs=1e-12)


# --- K heads in one forward: training layouts and scoring ---------------------------------------------------------
@pytest.mark.parametrize("layout", [PLAIN, KV_CACHE, PACKED, BLOCK_MASK], ids=lambda layout: layout.name)
def test_every_training_layout_gives_each_heads_scores_of_its_single_head_model(tiny_tokenizer, layout):
    model = build_tiny_reward_model(tiny_tokenizer, seed=3, num_labels=HEADS).eval()
    groups = records(1, 5)
    examples = [{"completion_ids": g, "ranks": list(range(len(g)))} for g in groups]
    settings = {"pad_token_id": tiny_tokenizer.pad_token_id, "ensemble_heads": HEADS, "ensemble_seed": 5}
    batch = DataCollatorForRankedPreference(**settings, layout=layout)(examples)
    assert torch.equal(batch.pop("bootstrap_weights"), bootstrap_weights(groups, HEADS, 5))
    for key in ("ranks", "record_index"):
        batch.pop(key)
    with torch.no_grad(), layout.attention(model):
        scores, _, _ = layout.scores(model, batch, HEADS)
    assert scores.shape == (sum(len(g) for g in groups), HEADS)
    torch.testing.assert_close(scores, per_head_reference(model, groups), atol=1e-5, rtol=0)


@pytest.mark.parametrize("sharing", ["auto", pytest.param(False, marks=pytest.mark.slow), "packed"])
def test_scoring_reads_every_head_from_one_forward(tiny_tokenizer, sharing):
    model = build_tiny_reward_model(tiny_tokenizer, seed=4, num_labels=HEADS).eval()
    groups = records(2, 4)
    sequences = [seq for group in groups for seq in group]
    context_lengths = [shared_prefix_length(group) for group in groups for _ in group]
    engine = HFEngine(model, tiny_tokenizer, ScoringOptions(prefix_sharing=sharing))
    torch.testing.assert_close(engine.outputs(sequences, context_lengths), per_head_reference(model, groups),
                               atol=1e-5, rtol=0)  # fmt: skip


# --- the trainer ---------------------------------------------------------------------------------------------------
@torch.no_grad()
def accuracies_of_plain_forwards(model, tokenizer, records) -> tuple[list[float], float]:
    """`(each head's accuracy, the heads' mean's accuracy)` on a set: the share of its strictly ordered pairs (lower
    rank better; equal ranks are no pair) whose better completion's logit is strictly higher, from one plain forward
    of `model` per completion: the conversation rendered by the tokenizer's chat template (`helpers.reference_text`),
    read alone, no padding. A tie in logit counts as wrong, as `trl_rm_env.metrics.record_statistics` counts it
    (`s_better > s_worse`); none occurs here (each margin is checked to exceed 1e-4)."""
    correct = torch.zeros(model.config.num_labels + 1, dtype=torch.int64)  # each head, then the mean
    pairs = 0
    for record in records:
        logits = []
        for c in record["completions"]:
            enc = tokenizer(reference_text(tokenizer, record["context"], c["completion"]), return_tensors="pt")
            assert enc["input_ids"].shape[1] <= 256  # the trainer's max_length: nothing was truncated in evaluation
            heads = model(**enc).logits[0].double()
            logits.append(torch.cat([heads, heads.mean().reshape(1)]))
        ranks = [c["rank"] for c in record["completions"]]
        for i, j in ((i, j) for i in range(len(ranks)) for j in range(len(ranks)) if ranks[i] < ranks[j]):
            pairs += 1
            correct += (logits[i] > logits[j]).long()
            # The trainer scores in another layout (fp32, within about 1e-5): no pair may sit that close to a tie.
            assert (logits[i] - logits[j]).abs().min().item() > 1e-4
    found = (correct.double() / pairs).tolist()
    return found[:-1], found[-1]


@pytest.mark.slow
def test_training_k_heads_logs_each_head_and_saves_a_checkpoint_any_tool_loads(tmp_path, tiny_dir, tiny_tokenizer):
    """Three heads trained 4 steps: each `eval_<set>_head_<k>_accuracy` equals head k's accuracy computed from the
    saved checkpoint's plain per-completion forwards (`accuracies_of_plain_forwards`; `eval_<set>_accuracy` the
    heads' mean's), and the heads' accuracies differ on these sets, so a metric that reported one head for all of
    them would not pass; then the checkpoint loads in transformers and the environment, which reads its heads from one
    forward."""
    sets = {"in_domain": load_rank_dataset("sample:in_domain").select(range(24)),
            "harder": load_rank_dataset("sample:harder").select(range(24))}  # fmt: skip
    args = training_args(RankedRewardConfig, tmp_path, max_steps=4, per_device_train_batch_size=8,
                         per_device_eval_batch_size=16, learning_rate=3e-3, warmup_steps=0, logging_steps=2,
                         max_length=256, ensemble_heads=3, eval_strategy="steps", eval_steps=4)  # fmt: skip
    trainer = RankedRewardTrainer(model=str(tiny_dir / "reward_model"), args=args, eval_dataset=sets,
                                  train_dataset=load_rank_dataset("sample:train").select(range(64)),
                                  processing_class=tiny_tokenizer)  # fmt: skip
    trainer.train()
    metrics = trainer.evaluate()
    out = tmp_path / "rm"
    save_reward_model(trainer, str(out))
    saved = json.loads((out / "config.json").read_text())
    assert saved["ensemble_heads"] == 3 and len(saved["id2label"]) == 3
    plain = AutoModelForSequenceClassification.from_pretrained(out, dtype=torch.float32).eval()  # any tool loads it
    assert plain.config.num_labels == 3
    tokenizer = AutoTokenizer.from_pretrained(out)
    for name, records in sets.items():
        heads, mean = accuracies_of_plain_forwards(plain, tokenizer, records)
        assert [metrics[f"eval_{name}_head_{k}_accuracy"] for k in range(3)] == pytest.approx(heads, abs=1e-12), name
        assert metrics[f"eval_{name}_accuracy"] == pytest.approx(mean, abs=1e-12), name
    # The heads disagree: on each set not every head has one accuracy, and on `harder` each has its own (head k's
    # metric reported as another head's, or head 0's for all, would not pass).
    heads_of = {name: [metrics[f"eval_{name}_head_{k}_accuracy"] for k in range(3)] for name in sets}
    assert all(len(set(heads)) > 1 for heads in heads_of.values()) and len(set(heads_of["harder"])) == 3, heads_of
    # The environment reads every head from one forward and rewards their mean (the checkpoint says it is an
    # ensemble); its normalization is the checkpoint's statistics of that mean.
    env = RewardModelEnvironment(str(out), device="cpu", normalization="none")
    raw = RewardModelEnvironment(str(out), device="cpu", normalization="none", label_index=1)
    prompts = [[{"role": "user", "content": "What is 2 + 2?"}]] * 2
    completions = [[{"role": "assistant", "content": text}] for text in ("4", "It is five.")]
    with torch.no_grad():
        logits = torch.stack([plain(input_ids=torch.tensor([encode_conversation(env.tokenizer, p, c)])).logits[0]
                              for p, c in zip(prompts, completions)])  # fmt: skip
    assert env(prompts, completions) == pytest.approx(logits.mean(dim=1).tolist(), abs=1e-5)
    assert raw(prompts, completions) == pytest.approx(logits[:, 1].tolist(), abs=1e-5)  # one head, when asked
    first = RewardModelEnvironment(str(out), device="cpu", normalization="none", label_index=0)
    assert first(prompts, completions) == pytest.approx(logits[:, 0].tolist(), abs=1e-5)  # head 0 too, when asked
    for index in (3, -1):  # refused before the weights load
        with pytest.raises(ValueError, match=rf"label_index {index} is not an output of this model \(it has 3: 0 to 2\)"):
            RewardModelEnvironment(str(out), device="cpu", label_index=index)
    with pytest.raises(ValueError, match=r"label_index 3 is not an output"):  # a loaded model too
        RewardModelEnvironment(plain, env.tokenizer, device="cpu", label_index=3)


def test_what_cannot_apply_is_refused(tmp_path, tiny_tokenizer):
    with pytest.raises(ValueError, match=r"ensemble_heads must be >= 1"):
        RankedRewardConfig(str(tmp_path), ensemble_heads=0)
    with pytest.raises(ValueError, match=r"ensemble_heads=2 trains bootstrapped Bradley-Terry heads"):
        RegressionRewardConfig(str(tmp_path), ensemble_heads=2)
    args = training_args(RankedRewardConfig, tmp_path, max_steps=1, ensemble_heads=2)
    train = load_rank_dataset("sample:train").select(range(4))
    with pytest.raises(ValueError, match=r"ensemble_heads=2 needs a model with num_labels=2 .* got num_labels=1"):
        RankedRewardTrainer(model=build_tiny_reward_model(tiny_tokenizer), args=args, train_dataset=train,
                            processing_class=tiny_tokenizer)  # fmt: skip
    from trl_rm_env.trainer.collator import DataCollatorForRankedPreference

    with pytest.raises(ValueError, match=r"draws none: give one of ours with ensemble_heads=2"):
        RankedRewardTrainer(model=build_tiny_reward_model(tiny_tokenizer, num_labels=2), args=args,
                            train_dataset=train, processing_class=tiny_tokenizer,
                            data_collator=DataCollatorForRankedPreference(pad_token_id=0))  # fmt: skip


def test_eval_of_an_ensemble_checkpoint_reports_each_head_and_accuracy_by_disagreement(tmp_path, tiny_tokenizer):
    """`trl-rm-env eval` (`evaluate_reward_model`) on a checkpoint with `ensemble_heads`: the set's accuracy is the
    heads' mean's, each head's accuracy and the disagreement quartiles are their formulas on one-at-a-time scores."""
    from trl_rm_env.evaluation import evaluate_reward_model, format_results_table

    model = build_tiny_reward_model(tiny_tokenizer, seed=6, num_labels=3)
    model.config.ensemble_heads = 3
    model.save_pretrained(tmp_path / "rm")
    tiny_tokenizer.save_pretrained(tmp_path / "rm")
    records = list(load_rank_dataset("sample:in_domain").select(range(12)))
    results = evaluate_reward_model(str(tmp_path / "rm"), {"in_domain": records}, progress=False, engine="hf")
    got = results["sets"]["in_domain"]
    scores, pairs = [], []
    with torch.no_grad():
        for record in records:
            start = len(scores)
            scores += [model.eval()(input_ids=torch.tensor([encode_conversation(tiny_tokenizer, record["context"],
                                                                                 c["completion"])])).logits[0]
                       for c in record["completions"]]  # fmt: skip
            ranks = [c["rank"] for c in record["completions"]]
            pairs += [(start + i, start + j) for i in range(len(ranks)) for j in range(len(ranks)) if ranks[i] < ranks[j]]
    margins = torch.stack([scores[i] - scores[j] for i, j in pairs]).double()  # (P, 3)
    assert got["pairs"] == len(pairs)
    assert got["accuracy"] == pytest.approx((margins.mean(dim=1) > 0).double().mean().item())
    assert got["ensemble"]["heads"] == pytest.approx((margins > 0).double().mean(dim=0).tolist())
    quartiles = got["ensemble"]["disagreement"]
    assert [q["quantile"] for q in quartiles] == [1, 2, 3, 4] and sum(q["pairs"] for q in quartiles) == len(pairs)
    spread = margins.std(dim=1, unbiased=False)
    assert all(a["high"] <= b["low"] + 1e-12 for a, b in zip(quartiles, quartiles[1:]))  # lowest quartile first
    assert sum(q["correct"] for q in quartiles) == got["correct"] and spread.max().item() == pytest.approx(quartiles[-1]["high"])
    table = format_results_table(results)
    assert "Ensemble heads (accuracy)" in table and "head 2" in table and "lowest quartile first" in table


def test_the_trainers_loss_is_the_heads_bootstrap_weighted_loss_of_each_records_own_weights(tmp_path, tiny_tokenizer):
    """Through the collator (each record's weights), the layout (every head from one forward) and `compute_loss`:
    the loss of a batch equals `ensemble_loss` of the plain model's per-head scores with `bootstrap_weights` drawn
    for those records by `ensemble_seed`."""
    args = training_args(RankedRewardConfig, tmp_path, max_steps=1, ensemble_heads=2, ensemble_seed=11, max_length=256)
    model = build_tiny_reward_model(tiny_tokenizer, seed=2, num_labels=2)
    trainer = RankedRewardTrainer(model=model, args=args, train_dataset=load_rank_dataset("sample:train").select(range(6)),
                                  processing_class=tiny_tokenizer)  # fmt: skip
    examples = [trainer.train_dataset[i] for i in range(6)]
    batch = trainer.data_collator(examples)
    assert trainer._layout is KV_CACHE and batch["bootstrap_weights"].shape == (6, 2)
    loss = trainer.compute_loss(trainer.model.train(), dict(batch))
    groups = [e["completion_ids"] for e in examples]
    scores = per_head_reference(model, groups).to(torch.float32)
    ranks = torch.tensor([r for e in examples for r in e["ranks"]])
    record_index = torch.tensor([i for i, g in enumerate(groups) for _ in g])
    want, _, _ = ensemble_loss(scores, ranks, record_index, None, None, bootstrap_weights(groups, 2, 11))
    unweighted, _, _ = ensemble_loss(scores, ranks, record_index, None, None, None)
    assert loss.item() == pytest.approx(want.item(), abs=1e-5) and want.item() != pytest.approx(unweighted.item())
