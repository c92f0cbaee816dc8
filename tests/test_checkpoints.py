"""Checkpoints are atomic; resuming picks the newest complete one; an incomplete explicit path fails in one line."""

from __future__ import annotations

import json
import logging
import os
import re

import pytest
import torch
from safetensors.torch import save_file

from trl_rm_env import RankedRewardConfig, RankedRewardTrainer, load_rank_dataset
from trl_rm_env.compat import CHECKPOINTING_FIELD
from trl_rm_env.tiny_models import build_tiny_reward_model
from trl_rm_env.trainer.checkpoints import CheckpointError, checkpoint_problem, resolve_resume_checkpoint

pytestmark = pytest.mark.slow  # end to end: trainers, servers or spawned processes (`-m "not slow"` skips them)


@pytest.fixture(scope="module")
def small():
    return load_rank_dataset("sample:in_domain").select(range(32))


def make_trainer(tmp_path, tokenizer, train, **overrides) -> RankedRewardTrainer:
    values = dict(
        output_dir=str(tmp_path / "out"), max_steps=4, per_device_train_batch_size=8, learning_rate=1e-3,
        use_cpu=True, report_to="none", save_strategy="steps", save_steps=2, logging_steps=2, seed=0,
        dataloader_num_workers=0, max_length=128, disable_tqdm=True,
    )
    values.update(overrides)
    return RankedRewardTrainer(model=build_tiny_reward_model(tokenizer, seed=0), args=RankedRewardConfig(**values),
                               train_dataset=train, processing_class=tokenizer)


def fake_checkpoint(root, step, files=("model.safetensors", "trainer_state.json", "rng_state.pth")):
    """A checkpoint folder holding `files`, each readable of its kind: JSON, a tiny safetensors file, a torch file."""
    path = root / f"checkpoint-{step}"
    path.mkdir(parents=True)
    for name in files:
        if name.endswith(".json"):
            (path / name).write_text(json.dumps({"global_step": step}))
        elif name.endswith(".safetensors"):
            save_file({"w": torch.zeros(4)}, str(path / name))
        elif name.endswith((".pt", ".pth", ".bin")):
            torch.save({"step": step}, path / name)
        else:
            (path / name).write_text("x")
    return path


def test_saves_are_complete_renamed_folders_and_rotation_still_works(tmp_path, tiny_tokenizer, small):
    trainer = make_trainer(tmp_path, tiny_tokenizer, small, max_steps=6, save_total_limit=2)
    trainer.train()
    out = tmp_path / "out"
    assert sorted(p.name for p in out.iterdir() if p.name.startswith(("checkpoint-", ".incomplete"))) == [
        "checkpoint-4", "checkpoint-6"]
    for step in (4, 6):
        assert checkpoint_problem(str(out / f"checkpoint-{step}")) is None
        state = json.loads((out / f"checkpoint-{step}" / "trainer_state.json").read_text())
        assert state["global_step"] == step


def test_best_model_checkpoint_names_the_final_folder(tmp_path, tiny_tokenizer, small):
    args = RankedRewardConfig(
        output_dir=str(tmp_path / "out"), max_steps=4, per_device_train_batch_size=8, learning_rate=1e-3,
        use_cpu=True, report_to="none", save_strategy="steps", save_steps=2, eval_strategy="steps", eval_steps=2,
        metric_for_best_model="eval_loss", load_best_model_at_end=True, seed=0, max_length=128, disable_tqdm=True)
    trainer = RankedRewardTrainer(
        model=build_tiny_reward_model(tiny_tokenizer, seed=0), args=args, train_dataset=small,
        eval_dataset=small.select(range(8)), processing_class=tiny_tokenizer)
    trainer.train()
    best = trainer.state.best_model_checkpoint
    assert best is not None and os.path.basename(best).startswith("checkpoint-") and ".incomplete" not in best
    assert os.path.isdir(best)
    saved = json.loads((tmp_path / "out" / "checkpoint-4" / "trainer_state.json").read_text())
    assert ".incomplete" not in (saved["best_model_checkpoint"] or "")


def test_interrupted_save_leaves_no_checkpoint_folder(tmp_path, tiny_tokenizer, small, monkeypatch):
    trainer = make_trainer(tmp_path, tiny_tokenizer, small, max_steps=2)

    def boom(*args, **kwargs):
        raise KeyboardInterrupt  # as if killed after the weights were written

    monkeypatch.setattr(trainer, "_save_rng_state", boom)
    with pytest.raises(KeyboardInterrupt):
        trainer.train()
    assert not [p.name for p in (tmp_path / "out").iterdir() if "checkpoint" in p.name]


def test_resume_true_picks_newest_complete_and_warns_about_skipped(tmp_path, caplog):
    fake_checkpoint(tmp_path, 2)
    fake_checkpoint(tmp_path, 4)
    fake_checkpoint(tmp_path, 6, files=("model.safetensors",))  # killed before trainer_state.json
    fake_checkpoint(tmp_path, 8, files=())  # killed at once: empty
    with caplog.at_level(logging.WARNING, logger="trl_rm_env.trainer.saving"):
        for value in (True, "true", "latest"):
            assert resolve_resume_checkpoint(value, str(tmp_path)) == str(tmp_path / "checkpoint-4")
    text = caplog.text
    assert f"Skipping incomplete checkpoint {tmp_path / 'checkpoint-8'}" in text
    assert f"Skipping incomplete checkpoint {tmp_path / 'checkpoint-6'}: no trainer_state.json" in text
    assert f"Resuming from {tmp_path / 'checkpoint-4'}" in text
    assert resolve_resume_checkpoint(None, str(tmp_path)) is None
    assert resolve_resume_checkpoint("false", str(tmp_path)) is None


def test_resume_explicit_incomplete_path_is_one_line_error(tmp_path):
    fake_checkpoint(tmp_path, 2)
    bad = fake_checkpoint(tmp_path, 4, files=("trainer_state.json",))
    with pytest.raises(CheckpointError, match=r"^cannot resume from .*checkpoint-4: no model weights .*the newest "
                       r"complete one there is .*checkpoint-2$"):
        resolve_resume_checkpoint(str(bad), str(tmp_path))
    with pytest.raises(CheckpointError, match="no such folder"):
        resolve_resume_checkpoint(str(tmp_path / "checkpoint-9"), str(tmp_path))
    with pytest.raises(CheckpointError, match=r"no complete checkpoint-N folder in .* \(1 incomplete skipped\)"):
        resolve_resume_checkpoint("latest", str(fake_checkpoint(tmp_path / "only", 3, files=("x",)).parent))


def test_missing_shard_is_incomplete(tmp_path):
    path = fake_checkpoint(tmp_path, 2, files=("trainer_state.json",))
    (path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"a": "model-1.safetensors",
                                                                                  "b": "model-2.safetensors"}}))
    save_file({"a": torch.zeros(2)}, str(path / "model-1.safetensors"))
    assert checkpoint_problem(str(path)) == "weight shard model-2.safetensors is missing"


@pytest.mark.parametrize("name", ["model.safetensors", "optimizer.pt", "rng_state.pth"])
def test_truncated_file_is_named_and_resume_falls_back_to_a_readable_checkpoint(tmp_path, caplog, name):
    """A weights or optimizer file cut short (a disk filled up, a copy interrupted) is caught before transformers
    loads it: an explicit path fails in one line naming the file, `latest` skips the checkpoint with a warning."""
    fake_checkpoint(tmp_path, 2, files=("model.safetensors", "trainer_state.json", "optimizer.pt", "rng_state.pth"))
    bad = fake_checkpoint(tmp_path, 4, files=("model.safetensors", "trainer_state.json", "optimizer.pt",
                                              "rng_state.pth"))
    whole = (bad / name).read_bytes()
    (bad / name).write_bytes(whole[: len(whole) // 2])
    with pytest.raises(CheckpointError, match=rf"^cannot resume from .*checkpoint-4: {re.escape(name)} is truncated "
                       r".*the newest complete one there is .*checkpoint-2$"):
        resolve_resume_checkpoint(str(bad), str(tmp_path))
    with caplog.at_level(logging.WARNING, logger="trl_rm_env.trainer.saving"):
        assert resolve_resume_checkpoint("latest", str(tmp_path)) == str(tmp_path / "checkpoint-2")
    assert f"Skipping incomplete checkpoint {bad}: {name} is truncated" in caplog.text


def test_real_truncated_weights_fail_the_trainer_in_one_line(tmp_path, tiny_tokenizer, small):
    make_trainer(tmp_path, tiny_tokenizer, small, max_steps=2, save_steps=2).train()
    weights = tmp_path / "out" / "checkpoint-2" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-1000])  # the header is whole, the last tensor is cut
    trainer = make_trainer(tmp_path, tiny_tokenizer, small, max_steps=4)
    with pytest.raises(CheckpointError, match=r"^cannot resume from .*checkpoint-2: model.safetensors is truncated "
                       r"\(\d+ bytes of \d+\)$"):
        trainer.train(resume_from_checkpoint=str(tmp_path / "out" / "checkpoint-2"))


def test_resume_without_rng_state_warns(tmp_path, caplog):
    path = fake_checkpoint(tmp_path, 2, files=("model.safetensors", "trainer_state.json"))
    with caplog.at_level(logging.WARNING, logger="trl_rm_env.trainer.saving"):
        assert resolve_resume_checkpoint(str(path), str(tmp_path)) == str(path)
    assert f"{path} has no RNG state (rng_state*.pth): the resumed run continues, but its random draws" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="trl_rm_env.trainer.saving"):
        resolve_resume_checkpoint(str(fake_checkpoint(tmp_path / "b", 2)), str(tmp_path / "b"))
    assert "no RNG state" not in caplog.text


def test_trainer_resumes_from_newest_complete_checkpoint(tmp_path, tiny_tokenizer, small):
    make_trainer(tmp_path, tiny_tokenizer, small, max_steps=4).train()
    out = tmp_path / "out"
    (out / "checkpoint-6").mkdir()  # an empty folder a killed save would leave without atomic saves
    trainer = make_trainer(tmp_path, tiny_tokenizer, small, max_steps=6)
    trainer.train(resume_from_checkpoint="latest")
    assert trainer.state.global_step == 6
    assert checkpoint_problem(str(out / "checkpoint-6")) is None  # the next save of step 6 replaced it


@pytest.mark.parametrize("trainer_class", ["trl", "ours"])
def test_num_tokens_after_resume_counts_from_the_restart_as_trl_does(tmp_path, tiny_tokenizer, trainer_class):
    """TRL's `RewardTrainer` starts its `num_tokens` count at 0 in every run, a resumed one included (it is not in
    the checkpoint); ours does the same (docs/coming_from_trl.md). Every other logged number and the weights equal the
    uninterrupted run's (tests/test_trainer.py, tests/test_distributed.py)."""
    from trl import RewardConfig, RewardTrainer

    pairs = load_rank_dataset("sample:in_domain").select(range(32))
    rows = [{"prompt": r["context"], "chosen": r["completions"][0]["completion"],
             "rejected": r["completions"][1]["completion"]} for r in pairs
            if r["completions"][0]["rank"] < r["completions"][1]["rank"]]
    from datasets import Dataset

    data = Dataset.from_list(rows[:16])
    config_class, trainer_cls = (RewardConfig, RewardTrainer) if trainer_class == "trl" else (
        RankedRewardConfig, RankedRewardTrainer)

    def run(output_dir, max_steps, resume=None):
        args = config_class(
            output_dir=str(output_dir), max_steps=max_steps, per_device_train_batch_size=4, learning_rate=1e-3,
            use_cpu=True, bf16=False, report_to="none", save_strategy="steps", save_steps=2, logging_steps=1,
            seed=0, dataloader_num_workers=0, disable_tqdm=True, **{CHECKPOINTING_FIELD: False},
        )
        trainer = trainer_cls(model=build_tiny_reward_model(tiny_tokenizer, seed=0), args=args, train_dataset=data,
                              processing_class=tiny_tokenizer)
        trainer.train(resume_from_checkpoint=resume)
        return {h["step"]: h["num_tokens"] for h in trainer.state.log_history if "num_tokens" in h}

    full = run(tmp_path / "full", 4)
    resumed = run(tmp_path / "resumed", 4, resume=str(tmp_path / "full" / "checkpoint-2"))
    assert sorted(resumed) == [1, 2, 3, 4]  # steps 1-2 come from the checkpoint's trainer_state.json
    assert [resumed[step] for step in (1, 2)] == [full[step] for step in (1, 2)]
    assert [resumed[step] for step in (3, 4)] == [full[step] - full[2] for step in (3, 4)], (full, resumed)
