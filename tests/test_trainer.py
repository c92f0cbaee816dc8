"""RankedRewardTrainer: one forward per completion, exact per-set metrics, TRL formats, truncation, LoRA, stats."""

from __future__ import annotations

import json
import logging

import pytest
import torch
from datasets import Dataset
from helpers import training_args
from transformers import AutoModelForSequenceClassification, AutoTokenizer
from trl import RewardConfig

from trl_rm_env import DataValidationError, RankedRewardConfig, RankedRewardTrainer, load_rank_dataset
from trl_rm_env.data.schema import iter_pairs
from trl_rm_env.tiny_models import build_tiny_reward_model
from trl_rm_env.tokenization import encode_conversation
from trl_rm_env.trainer.collator import DataCollatorForRankedPreference
from trl_rm_env.trainer.examples import tokenize_rank_record
from trl_rm_env.trainer.saving import save_reward_model
from trl_rm_env.trainer.trainer import SET_METRICS


@pytest.fixture(scope="module")
def in_domain():
    return load_rank_dataset("sample:in_domain")


@pytest.fixture(scope="module")
def harder():
    return load_rank_dataset("sample:harder")


@pytest.fixture(scope="module")
def train_small():
    return load_rank_dataset("sample:train").select(range(400))


def make_args(tmp_path, **overrides) -> RankedRewardConfig:
    values = dict(
        max_steps=5,
        per_device_train_batch_size=8,
        per_device_eval_batch_size=16,
        learning_rate=3e-3,
        warmup_steps=0,
        logging_steps=5,
        dataloader_num_workers=0,
        max_length=256,
    )
    return training_args(RankedRewardConfig, tmp_path, **{**values, **overrides})


def make_trainer(tmp_path, tokenizer, train=None, eval_dataset=None, seed=0, **overrides):
    model = build_tiny_reward_model(tokenizer, seed=seed).train()
    return RankedRewardTrainer(
        model=model,
        args=make_args(tmp_path, **overrides),
        train_dataset=train,
        eval_dataset=eval_dataset,
        processing_class=tokenizer,
    )


@torch.no_grad()
def reference_scores(model, tokenizer, record) -> list[float]:
    """Each completion scored alone (batch of one, no padding) with the plain model."""
    model.eval()
    out = []
    for c in record["completions"]:
        ids = torch.tensor([encode_conversation(tokenizer, record["context"], c["completion"])])
        out.append(model(input_ids=ids).logits[0, 0].item())
    return out


def reference_metrics(model, tokenizer, dataset) -> dict[str, float]:
    """Accuracy / margin / reward moments over a set, one example at a time; `fragile` = pairs within 1e-5."""
    correct = pairs = fragile = 0
    margin = 0.0
    all_scores = []
    for record in dataset:
        scores = reference_scores(model, tokenizer, record)
        all_scores += scores
        for i, j in iter_pairs([c["rank"] for c in record["completions"]]):
            pairs += 1
            correct += scores[i] > scores[j]
            margin += scores[i] - scores[j]
            fragile += abs(scores[i] - scores[j]) < 1e-5
    scores = torch.tensor(all_scores, dtype=torch.float64)
    return {
        "accuracy": correct / pairs,
        "margin": margin / pairs,
        "num_pairs": pairs,
        "fragile": fragile,
        "mean": scores.mean().item(),
        "std": scores.std(unbiased=False).item(),
    }


def assert_matches_reference(metrics, prefix, ref):
    assert metrics[f"{prefix}_num_pairs"] == ref["num_pairs"]
    assert abs(metrics[f"{prefix}_accuracy"] - ref["accuracy"]) <= ref["fragile"] / ref["num_pairs"] + 1e-12
    assert metrics[f"{prefix}_margin"] == pytest.approx(ref["margin"], abs=1e-4)


# ---------------------------------------------------------------------------------------------------- forward


@pytest.mark.slow
def test_one_forward_per_completion(tmp_path, tiny_tokenizer, in_domain):
    records = in_domain.select(range(6))
    # The plain path (prefix sharing, on by default where the model supports it, runs contexts once instead).
    trainer = make_trainer(tmp_path, tiny_tokenizer, train=records, per_device_train_batch_size=2, max_steps=3,
                           prefix_sharing=False)
    calls = []
    hook = trainer.model.register_forward_hook(lambda m, args, kwargs, out: calls.append(kwargs["input_ids"].shape),
                                               with_kwargs=True)
    batch = trainer.data_collator([trainer.train_dataset[i] for i in range(6)])
    num_completions = sum(len(r["completions"]) for r in records)
    assert batch["input_ids"].shape[0] == num_completions
    trainer.model.train()
    trainer.compute_loss(trainer.model, dict(batch))
    assert len(calls) == 1 and calls[0][0] == num_completions

    # During training too: one forward per optimisation step; one epoch (3 steps of 2 records) runs every
    # completion through the model exactly once.
    calls.clear()
    trainer.train()
    hook.remove()
    assert len(calls) == 3
    assert sum(shape[0] for shape in calls) == num_completions


@pytest.mark.slow
def test_training_learns_and_logs_train_metrics(tmp_path, tiny_tokenizer, train_small, in_domain):
    trainer = make_trainer(tmp_path, tiny_tokenizer, train=train_small, max_steps=40, logging_steps=10)
    before = trainer.evaluate(in_domain.select(range(50)))["eval_loss"]
    trainer.train()
    after = trainer.evaluate(in_domain.select(range(50)))["eval_loss"]
    assert after < before
    logged = [h for h in trainer.state.log_history if "loss" in h and "eval_loss" not in h]
    for key in ("loss", "accuracy", "margin", "num_pairs", "min_reward", "mean_reward", "max_reward", "num_tokens"):
        assert key in logged[-1], key


# ---------------------------------------------------------------------------------------------------- evaluation


@pytest.mark.slow
@pytest.mark.parametrize("names", [("in_domain", "harder"), ("math", "math_hard", "eval")])
def test_named_sets_have_their_own_metrics(tmp_path, tiny_tokenizer, in_domain, harder, names):
    sources = [in_domain.select(range(20)), harder.select(range(17)), in_domain.select(range(20, 33))]
    sets = dict(zip(names, sources))
    trainer = make_trainer(tmp_path, tiny_tokenizer, train=in_domain.select(range(4)), eval_dataset=sets)
    metrics = trainer.evaluate()
    per_set = {name: {k for k in metrics if k.startswith(f"eval_{name}_")} for name in names}
    for name in names:
        for metric in (*SET_METRICS, "runtime"):
            assert f"eval_{name}_{metric}" in metrics
    assert "eval_total_validation_time" in metrics
    assert "eval_accuracy" not in metrics and "eval_loss" not in metrics
    # No collision: each set's value is what evaluating that set alone gives.
    for name, dataset in sets.items():
        alone = trainer.evaluate(dataset)
        for metric in SET_METRICS:
            assert metrics[f"eval_{name}_{metric}"] == pytest.approx(alone[f"eval_{metric}"], abs=1e-6), (name, metric)
    assert len({metrics[f"eval_{n}_num_pairs"] for n in names}) == len(names)
    assert sum(len(keys) for keys in per_set.values()) >= len(names) * (len(SET_METRICS) + 1)


@pytest.mark.slow
@pytest.mark.parametrize("eval_batch_size", [1, 16])
def test_accuracy_is_exact_with_uneven_last_batch(tmp_path, tiny_tokenizer, in_domain, eval_batch_size):
    dataset = in_domain.select(range(37))  # 37 = 2 * 16 + 5: the last batch is uneven
    trainer = make_trainer(
        tmp_path, tiny_tokenizer, train=dataset, eval_dataset={"in_domain": dataset},
        per_device_eval_batch_size=eval_batch_size, seed=3,
    )
    metrics = trainer.evaluate()
    ref = reference_metrics(trainer.model, tiny_tokenizer, dataset)
    assert_matches_reference(metrics, "eval_in_domain", ref)
    assert metrics["eval_in_domain_num_pairs"] == sum(
        len(list(iter_pairs([c["rank"] for c in r["completions"]]))) for r in dataset
    )


@pytest.mark.slow
def test_metric_for_best_model_on_named_set(tmp_path, tiny_tokenizer, train_small, in_domain, harder):
    sets = {"in_domain": in_domain.select(range(40)), "harder": harder.select(range(20))}
    trainer = make_trainer(
        tmp_path, tiny_tokenizer, train=train_small, eval_dataset=sets, max_steps=30,
        eval_strategy="steps", eval_steps=10, save_strategy="steps", save_steps=10,
        metric_for_best_model="eval_in_domain_accuracy", greater_is_better=True, load_best_model_at_end=True,
    )
    trainer.train()
    history = [(h["step"], h["eval_in_domain_accuracy"]) for h in trainer.state.log_history if "eval_in_domain_accuracy" in h]
    assert [s for s, _ in history][:3] == [10, 20, 30]
    best_step, best = max(history[:3], key=lambda x: (x[1], -x[0]))
    assert trainer.state.best_metric == pytest.approx(best)
    assert trainer.state.best_model_checkpoint.endswith(f"checkpoint-{best_step}")
    # The loaded model is the best one: evaluating it again gives the best metric.
    assert trainer.evaluate()["eval_in_domain_accuracy"] == pytest.approx(best)


# ---------------------------------------------------------------------------------------------------- data


@pytest.mark.slow
def test_trl_preference_formats_get_trl_pair_columns(tmp_path, tiny_tokenizer):
    prompt = [{"role": "user", "content": "What is 2 + 2?"}]
    chosen = [{"role": "assistant", "content": "The answer is 4."}]
    rejected = [{"role": "assistant", "content": "The answer is 5."}]
    explicit = Dataset.from_list([{"prompt": prompt, "chosen": chosen, "rejected": rejected}] * 4)
    implicit = Dataset.from_list([{"chosen": prompt + chosen, "rejected": prompt + rejected}] * 4)
    text = Dataset.from_list([{"prompt": "2 + 2 = ", "chosen": "4", "rejected": "5"}] * 4)
    expected_conv = [encode_conversation(tiny_tokenizer, prompt, c) for c in (chosen, rejected)]
    expected_text = [encode_conversation(tiny_tokenizer, "2 + 2 = ", c) for c in ("4", "5")]
    ids = [tiny_tokenizer("The answer is x")["input_ids"], tiny_tokenizer("Surely y")["input_ids"]]
    tokenized = Dataset.from_list([{"chosen_ids": ids[0], "rejected_ids": ids[1]}] * 4)
    for dataset, expected in [(explicit, expected_conv), (implicit, expected_conv), (text, expected_text),
                              (tokenized, ids)]:
        trainer = make_trainer(tmp_path, tiny_tokenizer, train=dataset, max_steps=1, per_device_train_batch_size=2)
        row = trainer.train_dataset[0]  # TRL's processed columns, holding the ids of context + completion
        assert [row["chosen_ids"], row["rejected_ids"]] == expected
        assert "completion_ids" not in row and "ranks" not in row
        trainer.train()
    assert expected_text[0][-1] == tiny_tokenizer.eos_token_id  # plain text gets EOS, as in TRL


@pytest.mark.slow
def test_plain_reward_config_is_accepted(tmp_path, tiny_tokenizer, in_domain):
    args = RewardConfig(output_dir=str(tmp_path), learning_rate=1.5e-3, max_steps=1, use_cpu=True, report_to="none",
                        per_device_train_batch_size=2, gradient_checkpointing=False, bf16=False)
    trainer = RankedRewardTrainer(model=build_tiny_reward_model(tiny_tokenizer), args=args,
                                  train_dataset=in_domain.select(range(4)), processing_class=tiny_tokenizer)
    assert isinstance(trainer.args, RankedRewardConfig)
    assert trainer.args.learning_rate == 1.5e-3 and trainer.args.truncation == "none"
    trainer.train()


def test_invalid_rows_raise_with_row_and_field_or_are_skipped(tmp_path, tiny_tokenizer, in_domain, caplog):
    rows = [dict(r) for r in in_domain.select(range(4))]
    rows[2]["completions"] = rows[2]["completions"][:1]  # fewer than two completions
    dataset = Dataset.from_list(rows)
    with pytest.raises(DataValidationError, match=r"row 2.*completions.*at least 2 completions") as err:
        make_trainer(tmp_path, tiny_tokenizer, train=dataset)
    assert err.value.row == 2 and err.value.field == "completions"
    with caplog.at_level(logging.WARNING):
        trainer = make_trainer(tmp_path, tiny_tokenizer, train=dataset, on_invalid="skip")
    assert len(trainer.train_dataset) == 3
    assert "skipped 1 invalid record" in caplog.text


def test_bad_option_values_are_rejected(tmp_path):
    with pytest.raises(ValueError, match="truncation"):
        make_args(tmp_path, truncation="right")
    with pytest.raises(ValueError, match="on_invalid"):
        make_args(tmp_path, on_invalid="ignore")


def long_record(words: int, completion_words: int = 3):
    return {
        "context": [{"role": "system", "content": "x " * words}, {"role": "user", "content": "What is 1 + 1?"}],
        "completions": [
            {"rank": 0, "completion": [{"role": "assistant", "content": "The answer is 2. " * completion_words}]},
            {"rank": 1, "completion": [{"role": "assistant", "content": "3"}]},
        ],
    }


@pytest.mark.parametrize("tokenizer_name", ["tiny_tokenizer", "bos_tokenizer"])
def test_left_truncation_cuts_context_only_and_keeps_bos(request, tokenizer_name):
    tok = request.getfixturevalue(tokenizer_name)
    record = long_record(200)
    full = [encode_conversation(tok, record["context"], c["completion"]) for c in record["completions"]]
    max_length = 64
    assert max(len(s) for s in full) > max_length
    example, status = tokenize_rank_record(record, tok, max_length, "left")
    assert status == "truncated"
    seqs = example["completion_ids"]
    assert max(len(s) for s in seqs) == max_length
    cut = len(full[0]) - len(seqs[0])
    assert all(len(f) - len(s) == cut for f, s in zip(full, seqs))  # same cut for every completion
    for f, s in zip(full, seqs):
        keep = 1 if tok.bos_token_id is not None else 0
        assert s[:keep] == f[:keep]
        assert s[keep:] == f[keep + cut:]  # the tail, completion included, is untouched
    if tok.bos_token_id is not None:
        assert seqs[0][0] == tok.bos_token_id and seqs[0].count(tok.bos_token_id) == 1
    # Both sequences still share the (truncated) context.
    assert seqs[0][: example["context_length"]] == seqs[1][: example["context_length"]]

    assert tokenize_rank_record(record, tok, max_length, "none") == (None, "dropped")
    # A completion that alone exceeds max_length is never cut: the record is dropped.
    assert tokenize_rank_record(long_record(0, completion_words=40), tok, max_length, "left") == (None, "dropped")


@pytest.mark.parametrize("mode, kept", [("none", 2), ("left", 3)])
def test_truncation_modes_in_trainer_count_records(tmp_path, tiny_tokenizer, in_domain, mode, kept):
    rows = [dict(r) for r in in_domain.select(range(2))]
    dataset = Dataset.from_list([*rows, long_record(200)])
    trainer = make_trainer(tmp_path, tiny_tokenizer, train=dataset, truncation=mode, max_length=64)
    assert len(trainer.train_dataset) == kept
    counts = trainer._data_counts["train"]
    assert counts[{"none": "dropped", "left": "truncated"}[mode]] == 1
    assert all(len(ids) <= 64 for row in trainer.train_dataset for ids in row["completion_ids"])


def test_margin_column_reaches_the_loss(tmp_path, tiny_tokenizer, in_domain):
    rows = [{**dict(r), "margin": 0.5} for r in in_domain.select(range(4))]
    trainer = make_trainer(tmp_path, tiny_tokenizer, train=Dataset.from_list(rows))
    batch = trainer.data_collator([trainer.train_dataset[i] for i in range(4)])
    assert batch["margin"].tolist() == [0.5] * 4
    collator = DataCollatorForRankedPreference(pad_token_id=tiny_tokenizer.pad_token_id)
    assert "margin" not in collator([{"completion_ids": [[1, 2], [3]], "ranks": [0, 1]}])


# ---------------------------------------------------------------------------------------------------- PEFT, saving


@pytest.mark.slow
def test_lora_run_saves_a_merged_plain_checkpoint(tmp_path, tiny_tokenizer, train_small, in_domain):
    from peft import LoraConfig

    model = build_tiny_reward_model(tiny_tokenizer, seed=0).train()
    initial = model.model.layers[0].self_attn.q_proj.weight.detach().clone()
    trainer = RankedRewardTrainer(
        model=model,
        args=make_args(tmp_path, max_steps=15, learning_rate=1e-2),
        train_dataset=train_small,
        processing_class=tiny_tokenizer,
        peft_config=LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], task_type="SEQ_CLS"),
    )
    assert hasattr(trainer.model, "peft_config")
    trainable = sum(p.numel() for p in trainer.model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in trainer.model.parameters())
    assert trainable < total / 4
    trainer.train()
    merged_scores = reference_scores(trainer.model, tiny_tokenizer, in_domain[0])
    out = tmp_path / "merged"
    save_reward_model(trainer, str(out))
    assert not (out / "adapter_config.json").exists()
    assert (out / "model.safetensors").exists()
    reloaded = AutoModelForSequenceClassification.from_pretrained(out)
    assert not torch.equal(reloaded.model.layers[0].self_attn.q_proj.weight, initial)  # the LoRA update is merged
    assert reference_scores(reloaded, tiny_tokenizer, in_domain[0]) == pytest.approx(merged_scores, abs=1e-4)


@pytest.mark.slow
def test_reward_stats_saved_and_reload_reproduces_accuracy(tmp_path, tiny_tokenizer, train_small, in_domain, harder):
    sets = {"in_domain": in_domain.select(range(30)), "harder": harder.select(range(25))}
    trainer = make_trainer(tmp_path, tiny_tokenizer, train=train_small, eval_dataset=sets, max_steps=30,
                           eval_strategy="steps", eval_steps=30)
    trainer.train()
    metrics = trainer.evaluate()
    out = tmp_path / "rm"
    save_reward_model(trainer, str(out))
    reloaded = AutoModelForSequenceClassification.from_pretrained(out)
    tokenizer = AutoTokenizer.from_pretrained(out)
    saved = json.loads((out / "config.json").read_text())
    assert {"reward_mean", "reward_std", "reward_stats"} <= saved.keys()
    assert set(saved["reward_stats"]) == {"in_domain", "harder"}
    all_scores = []
    for name, dataset in sets.items():
        ref = reference_metrics(reloaded, tokenizer, dataset)
        assert_matches_reference(metrics, f"eval_{name}", ref)
        assert saved["reward_stats"][name]["mean"] == pytest.approx(ref["mean"], abs=1e-4)
        assert saved["reward_stats"][name]["std"] == pytest.approx(ref["std"], abs=1e-4)
        all_scores += [s for r in dataset for s in reference_scores(reloaded, tokenizer, r)]
    all_scores = torch.tensor(all_scores, dtype=torch.float64)
    assert saved["reward_mean"] == pytest.approx(all_scores.mean().item(), abs=1e-4)
    assert saved["reward_std"] == pytest.approx(all_scores.std(unbiased=False).item(), abs=1e-4)


@pytest.mark.slow
def test_resume_from_checkpoint_reaches_the_same_metrics(tmp_path, tiny_tokenizer, train_small, in_domain):
    sets = {"in_domain": in_domain.select(range(30))}
    common = dict(max_steps=20, save_strategy="steps", save_steps=10, logging_steps=5)
    full = make_trainer(tmp_path / "full", tiny_tokenizer, train=train_small, eval_dataset=sets, **common)
    full.train()
    expected = full.evaluate()
    # "Stop" after the first checkpoint: a fresh trainer (fresh random model) resumes from checkpoint-10.
    checkpoint = tmp_path / "full" / "out" / "checkpoint-10"
    assert (checkpoint / "model.safetensors").exists() and (checkpoint / "optimizer.pt").exists()
    resumed = make_trainer(tmp_path / "resumed", tiny_tokenizer, train=train_small, eval_dataset=sets, seed=7,
                           **common)
    resumed.train(resume_from_checkpoint=str(checkpoint))
    got = resumed.evaluate()
    assert resumed.state.global_step == 20
    for key in ("eval_in_domain_loss", "eval_in_domain_accuracy", "eval_in_domain_margin"):
        assert got[key] == pytest.approx(expected[key], abs=1e-4), key
    losses = lambda t: [h["loss"] for h in t.state.log_history if "loss" in h and h["step"] > 10]  # noqa: E731
    assert losses(resumed) == pytest.approx(losses(full), abs=1e-4)


@pytest.mark.slow
def test_final_evaluation_reuses_the_evaluation_at_the_current_step(tmp_path, tiny_tokenizer, train_small, in_domain):
    """With eval_strategy "no", `train()` evaluates once at the end (for the reward statistics); the recipes' final
    metrics come from that evaluation, not a second pass over every validation set."""
    sets = {"in_domain": in_domain.select(range(12)), "other": in_domain.select(range(12, 20))}
    trainer = make_trainer(tmp_path, tiny_tokenizer, train=train_small, eval_dataset=sets, max_steps=2,
                           eval_strategy="no")
    passes = []
    original = trainer.evaluation_loop
    trainer.evaluation_loop = lambda *a, **k: passes.append(k.get("metric_key_prefix")) or original(*a, **k)
    trainer.train()
    assert passes == ["eval_in_domain", "eval_other"]  # the end-of-training evaluation, one pass per set
    final = trainer.final_evaluation()
    assert passes == ["eval_in_domain", "eval_other"]  # reused
    again = trainer.evaluate()  # the same numbers as evaluating again...
    timing = ("runtime", "per_second", "validation_time")
    assert {k: v for k, v in final.items() if not k.endswith(timing)} == {
        k: v for k, v in again.items() if not k.endswith(timing)
    }
    assert "eval_other_accuracy" in final
    assert len(passes) == 4
    trainer.state.global_step += 1  # ...and a stale evaluation (another step) is not reused
    trainer.final_evaluation()
    assert len(passes) == 6


@pytest.mark.slow
def test_final_evaluation_reuses_the_end_of_training_evaluation_and_logs_it(tmp_path, tiny_tokenizer, in_domain):
    """train() evaluates quietly for the reward statistics (TRL's log layout ends with the train summary); the
    recipes' final_evaluation reuses that evaluation and puts it in the log history, once."""
    trainer = make_trainer(tmp_path, tiny_tokenizer, train=in_domain.select(range(16)),
                           eval_dataset={"in_domain": in_domain.select(range(12))}, max_steps=2, eval_strategy="no")
    trainer.train()
    assert "train_runtime" in trainer.state.log_history[-1]
    assert not any("eval_in_domain_accuracy" in h for h in trainer.state.log_history)
    metrics = trainer.final_evaluation()
    again = trainer.final_evaluation()
    assert metrics == again and "eval_in_domain_accuracy" in metrics
    rows = [h for h in trainer.state.log_history if "eval_in_domain_accuracy" in h]
    assert len(rows) == 1 and rows[0]["eval_in_domain_accuracy"] == metrics["eval_in_domain_accuracy"]
