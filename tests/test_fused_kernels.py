"""`fused_kernels` (`trl_rm_env.fused_kernels`): Liger Kernel's fused RMSNorm, SwiGLU and RoPE on a model we train or
score with, where they can run, and refused in one line where asked for and they cannot.

The refusals and `"auto"`'s choices run anywhere (no Liger needed: its absence is one of the cases). What Liger does
to a model is checked with the real package where it is installed (`pip install 'trl-rm-env[gpu]'`), in a fresh
Python process (Liger patches the model type's module for the whole process, which the other tests must not see):
our call swaps in its RMSNorm and SwiGLU modules and its RoPE function and keeps the classifier's own `forward` and
score head, while transformers' `use_liger_kernel` path (Liger's defaults) replaces that `forward` with a causal LM's
loss forward, the case our option exists to avoid. The kernels themselves are CUDA's: tests/gpu runs them.

Fast but for the Liger checks (slow: one Python process importing Liger and Triton, about 14 s).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import logging
import subprocess
import sys

import pytest
import torch
from helpers import ranked_trainer

from trl_rm_env import RankedRewardConfig, load_rank_dataset
from trl_rm_env import fused_kernels as fused
from trl_rm_env.fused_kernels import use_fused_kernels, why_not_fused
from trl_rm_env.runtime.loading import load_engine, load_tokenizer
from trl_rm_env.runtime.model_options import ScoringOptions
from trl_rm_env.runtime.plan import plan_model

HAS_LIGER = importlib.util.find_spec("liger_kernel") is not None
needs_liger = pytest.mark.skipif(not HAS_LIGER, reason="liger-kernel is not installed (pip install 'trl-rm-env[gpu]')")


def refusal(why: str) -> str:
    return (f"fused_kernels=True runs Liger Kernel's fused RMSNorm, SwiGLU and RoPE, but {why}; set fused_kernels to "
            "'auto' or False.")  # fmt: skip


ON_CPU = "the model runs on cpu (Liger's kernels are Triton kernels for CUDA)"


def test_on_the_cpu_auto_is_off_true_is_refused_and_false_asks_nothing(tiny_rm, caplog):
    assert why_not_fused(tiny_rm, "cpu") == ON_CPU
    with pytest.raises(ValueError) as error:
        use_fused_kernels(True, tiny_rm, torch.device("cpu"), "training")
    assert str(error.value) == refusal(ON_CPU)
    with caplog.at_level(logging.INFO, logger="trl_rm_env.fused_kernels"):
        assert use_fused_kernels("auto", tiny_rm, "cpu", "scoring") is False
    assert caplog.messages == [f"fused_kernels='auto' (scoring): off, {ON_CPU}."]
    assert use_fused_kernels(False, None, "cpu", "training") is False  # nothing read


def test_without_the_package_it_says_how_to_install_it(tiny_rm, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "liger_kernel" else real(name, *a))
    why = "liger-kernel is not installed (pip install 'trl-rm-env[gpu]' (the liger-kernel package))"
    assert why_not_fused(tiny_rm, "cuda") == why  # the device is only named: nothing runs
    with pytest.raises(ValueError) as error:
        use_fused_kernels(True, tiny_rm, "cuda:0", "training")
    assert str(error.value) == refusal(why)
    assert fused.supported_model_types() == frozenset()


@needs_liger
def test_a_model_type_liger_has_no_kernels_for_is_named():
    from transformers import GPT2Config, GPT2ForSequenceClassification

    model = GPT2ForSequenceClassification(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=64))
    assert "gpt2" not in fused.supported_model_types() and "qwen3" in fused.supported_model_types()
    assert why_not_fused(model, "cuda") == "Liger Kernel has no kernels for model type 'gpt2'"
    with pytest.raises(ValueError) as error:  # the model reaches the check
        use_fused_kernels(True, model, "cuda", "training")
    assert str(error.value) == refusal("Liger Kernel has no kernels for model type 'gpt2'")
    assert why_not_fused(object(), "cuda") == "Liger Kernel has no kernels for model type None"  # no config at all


def test_liger_s_loss_kernels_are_refused(tiny_rm):
    with pytest.raises(ValueError, match=r"^liger_kernel_config asks for cross_entropy, fused_linear_cross_entropy: "
                                         r"Liger's loss kernels replace a causal LM's loss \(fused_linear_cross_entropy "
                                         r"replaces the model's forward\), and a reward model has none; leave them out\.$"):
        use_fused_kernels("auto", tiny_rm, "cpu", "training", {"fused_linear_cross_entropy": True,
                                                               "cross_entropy": True, "rms_norm": True})  # fmt: skip


class RecordingLiger:
    """Liger's entry point as `use_fused_kernels` calls it, where its kernels could run (CUDA, the package, a model
    type it knows: `why_not_fused` says None): records the model and the kernels asked for."""

    def __init__(self, monkeypatch):
        import types

        self.calls = []
        module = types.ModuleType("liger_kernel.transformers")
        module._apply_liger_kernel_to_instance = lambda model, **kernels: self.calls.append((model, kernels))
        monkeypatch.setitem(sys.modules, "liger_kernel", types.ModuleType("liger_kernel"))
        monkeypatch.setitem(sys.modules, "liger_kernel.transformers", module)
        monkeypatch.setattr(fused, "why_not_fused", lambda model, device: None)


def test_where_they_can_run_auto_and_true_apply_the_three_kernels_and_false_applies_none(tiny_rm, monkeypatch, caplog):
    liger = RecordingLiger(monkeypatch)
    with caplog.at_level(logging.INFO, logger="trl_rm_env.fused_kernels"):
        use_fused_kernels(True, tiny_rm, "cuda", "training")
    assert caplog.messages == ["fused_kernels=True (training): Liger Kernel's RMSNorm, SwiGLU and RoPE on this qwen3 "
                               "model (its loss kernels off)."]  # fmt: skip
    liger.calls.clear()
    three = {"cross_entropy": False, "fused_linear_cross_entropy": False, "rms_norm": True, "swiglu": True,
             "rope": True}  # fmt: skip
    assert use_fused_kernels(False, tiny_rm, "cuda", "training") is False and liger.calls == []  # switched off
    assert use_fused_kernels(False, tiny_rm, "cuda", "training", {"rope": True}) is False and liger.calls == []
    assert use_fused_kernels("auto", tiny_rm, "cuda", "scoring") is True
    assert use_fused_kernels(True, tiny_rm, "cuda", "training") is True
    assert liger.calls == [(tiny_rm, three), (tiny_rm, three)]
    liger.calls.clear()
    # transformers' liger_kernel_config turns Liger's kernels on or off by name; a loss kernel is refused
    assert use_fused_kernels(True, tiny_rm, "cuda", "training", {"rope": False, "swiglu": False}) is True
    assert liger.calls == [(tiny_rm, {**three, "rope": False, "swiglu": False})]
    with pytest.raises(ValueError, match=r"^liger_kernel_config asks for cross_entropy: "):
        use_fused_kernels(True, tiny_rm, "cuda", "training", {"cross_entropy": True})

    class Peft:  # a PEFT wrapper: the kernels go on its base model
        def get_base_model(self):
            return tiny_rm

    liger.calls.clear()
    assert use_fused_kernels("auto", Peft(), "cuda", "training") is True and liger.calls == [(tiny_rm, three)]


def test_the_trainer_passes_its_switch_and_liger_config_through(tmp_path, monkeypatch):
    """`fused_kernels` of the trainer's config, TRL's `use_liger_kernel` read as True, and `liger_kernel_config`, as
    the trainer hands them to `use_fused_kernels` (where the kernels could run)."""
    from trl_rm_env.tiny_models import build_tiny_tokenizer
    from trl_rm_env.trainer import trainer as trainer_module

    asked = []
    monkeypatch.setattr(trainer_module, "use_fused_kernels",
                        lambda value, model, device, what, config=None: asked.append((value, what, config)) or False)  # fmt: skip
    data = load_rank_dataset("sample:harder").select(range(4))
    tokenizer = build_tiny_tokenizer()
    for settings in (dict(), dict(fused_kernels=False), dict(fused_kernels=True), dict(use_liger_kernel=True),
                     dict(fused_kernels="auto", liger_kernel_config={"rope": False})):  # fmt: skip
        ranked_trainer(tmp_path / str(len(asked)), tokenizer, data, **settings)
    assert asked == [("auto", "training", None), (False, "training", None), (True, "training", None),
                     (True, "training", None), ("auto", "training", {"rope": False})]  # fmt: skip


def test_scoring_and_judging_pass_their_switch_through(tiny_dir, monkeypatch):
    from trl_rm_env.runtime import loading
    from trl_rm_env.runtime.model_options import ModelOptions

    asked = []
    monkeypatch.setattr(loading, "use_fused_kernels", lambda value, model, device, what: asked.append((value, what)))
    for value in (False, "auto"):
        loading.load_weights(plan_model(str(tiny_dir / "reward_model"), ScoringOptions(engine="hf", fused_kernels=value)))
    loading.load_weights(plan_model(str(tiny_dir / "policy"), ModelOptions(engine="hf", fused_kernels=False), kind="judge"))
    assert asked == [(False, "scoring"), ("auto", "scoring"), (False, "judging")]


# ---------------------------------------------------------------------------------------------------- training
def test_training_on_the_cpu_refuses_true_and_reads_trl_s_use_liger_kernel_as_true(tmp_path):
    data = load_rank_dataset("sample:harder").select(range(4))
    from trl_rm_env.tiny_models import build_tiny_tokenizer

    tokenizer = build_tiny_tokenizer()
    assert ranked_trainer(tmp_path / "auto", tokenizer, data)._fused_kernels is False  # the default: off on the CPU
    for settings in (dict(fused_kernels=True), dict(use_liger_kernel=True)):
        with pytest.raises(ValueError) as error:
            ranked_trainer(tmp_path / "true", tokenizer, data, **settings)
        assert str(error.value) == refusal(ON_CPU)
    with pytest.raises(ValueError, match=r"^use_liger_kernel=True asks for Liger Kernel's kernels and "
                                         r"fused_kernels=False for none; set one of them\.$"):
        RankedRewardConfig(str(tmp_path), use_liger_kernel=True, fused_kernels="false")
    with pytest.raises(ValueError, match="^fused_kernels must be True, False or 'auto', got 'fast'.$"):
        RankedRewardConfig(str(tmp_path), fused_kernels="fast")


# ---------------------------------------------------------------------------------------------------- scoring
def test_scoring_on_the_cpu_refuses_true_and_vllm_refuses_it(tiny_dir):
    path = str(tiny_dir / "reward_model")
    plan = plan_model(path, ScoringOptions(engine="hf", fused_kernels=True))
    tokenizer = load_tokenizer(plan)
    with pytest.raises(ValueError) as error:
        load_engine(plan, tokenizer)
    assert str(error.value) == refusal("the model runs on cpu (Liger's kernels are Triton kernels for CUDA)")
    assert load_engine(plan_model(path, ScoringOptions(engine="hf")), tokenizer).model is not None  # auto: off
    as_vllm = dataclasses.replace(plan, engine="vllm")  # what `engine="vllm"` plans (vLLM need not be installed)
    with pytest.raises(ValueError, match=r"^fused_kernels=True applies Liger Kernel's kernels to a model transformers "
                                         r"runs, but the engine is vLLM \(which runs its own fused kernels\); set "
                                         r"engine='hf', or fused_kernels to 'auto' or False\.$"):
        load_engine(as_vllm, tokenizer)


# ---------------------------------------------------------------------------------------------------- with Liger
LIGER_PROBE = r"""
import json, torch
from trl_rm_env.tiny_models import build_tiny_tokenizer, build_tiny_reward_model
from trl_rm_env.fused_kernels import use_fused_kernels
from transformers.integrations.liger import apply_liger_kernel
import transformers.models.qwen3.modeling_qwen3 as qwen3
tokenizer = build_tiny_tokenizer()


def seen(model, applied):
    layer = model.model.layers[0]
    return {
        "applied": applied,
        "forward": model.forward.__func__.__module__,
        "classifier_forward": model.forward.__func__ is type(model).forward,
        "score_head": type(model.score).__name__,
        "norm_forward": model.model.norm.forward.__func__.__qualname__,
        "mlp_forward": layer.mlp.forward.__func__.__qualname__,
        "q_norm_forward": layer.self_attn.q_norm.forward.__func__.__qualname__,
        "rope": qwen3.apply_rotary_pos_emb.__module__,
        "new_model_mlp": type(build_tiny_reward_model(tokenizer, seed=0).model.layers[0].mlp).__name__,
    }


ours = build_tiny_reward_model(tokenizer, seed=0)
theirs = build_tiny_reward_model(tokenizer, seed=0)  # built before any patch, as ours
report = {"ours": seen(ours, use_fused_kernels(True, ours, "cuda", "training"))}
apply_liger_kernel(theirs, None)  # transformers' use_liger_kernel path: Liger's defaults
report["transformers"] = seen(theirs, True)
print(json.dumps(report))
"""


@pytest.fixture(scope="module")
def liger_probe() -> dict:
    """What Liger did to a tiny Qwen3 reward model through our call and through transformers' (one fresh process)."""
    done = subprocess.run([sys.executable, "-c", LIGER_PROBE], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow  # one Python process importing Liger and Triton: about 14 s
@needs_liger
def test_ours_swaps_in_liger_s_norms_swiglu_and_rope_and_keeps_the_classifier(liger_probe):
    probe = liger_probe["ours"]
    assert probe["applied"] is True
    assert probe["classifier_forward"] is True and probe["score_head"] == "Linear"  # the reward model's own forward
    assert probe["norm_forward"] == probe["q_norm_forward"] == "LigerRMSNorm.forward"  # every RMSNorm, q/k norms too
    assert probe["mlp_forward"] == "LigerSwiGLUMLP.forward"
    assert probe["rope"] == "liger_kernel.transformers.rope"
    assert probe["new_model_mlp"] == "LigerSwiGLUMLP"  # process-wide, as under TRL (the module docstring says so)


@pytest.mark.slow
@needs_liger
def test_transformers_use_liger_kernel_replaces_a_classifiers_forward(liger_probe):
    """Why TRL's `use_liger_kernel` is not passed on: with Liger's defaults the reward model's `forward` becomes the
    causal LM's loss forward (which reads an `lm_head` a classifier does not have)."""
    probe = liger_probe["transformers"]
    assert probe["classifier_forward"] is False and probe["forward"] == "liger_kernel.transformers.model.qwen3"
    assert probe["mlp_forward"] == "LigerSwiGLUMLP.forward"  # the same kernels otherwise
