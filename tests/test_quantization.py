"""TRL's `--load_in_4bit` / `--load_in_8bit` (and `bnb_*`) flags do in our recipes what they do in TRL's scripts:
the quantization config reaches `from_pretrained`, a QLoRA reward model trains, and its checkpoint is a plain
full-precision `*ForSequenceClassification` (adapters merged into the base weights, no bitsandbytes needed to load
it). Where bitsandbytes cannot run, the flag fails in one line naming itself.

bitsandbytes (the `quantization` extra, installed in CI) runs 4-bit and 8-bit layers on the CPU.
"""

from __future__ import annotations

import importlib.util
import json

import pytest
import torch
from helpers import launch
from transformers import AutoModelForSequenceClassification, AutoTokenizer
from trl import ModelConfig

from trl_rm_env import load_rank_dataset
from trl_rm_env.data.schema import iter_pairs
from trl_rm_env.tokenization import encode_conversation
from trl_rm_env.trainer import model_flags

HAS_BNB = importlib.util.find_spec("bitsandbytes") is not None


def test_quantization_flags_become_trls_bitsandbytes_config_or_refuse(monkeypatch):
    assert model_flags.quantization(ModelConfig()) is None
    with pytest.raises(ValueError, match="^--bnb_4bit_quant_type, --use_bnb_nested_quant configure 4-bit quantization"):
        model_flags.quantization(ModelConfig(bnb_4bit_quant_type="fp4", use_bnb_nested_quant=True))
    with pytest.raises(ValueError, match="^--load_in_8bit loads frozen quantized weights, .*add --use_peft"):
        model_flags.quantization(ModelConfig(load_in_8bit=True))
    import transformers.utils

    monkeypatch.setattr(transformers.utils, "is_bitsandbytes_available", lambda: False)
    with pytest.raises(ValueError, match=r"^--load_in_4bit needs bitsandbytes: pip install 'trl-rm-env\[quantization\]'"):
        model_flags.quantization(ModelConfig(load_in_4bit=True, use_peft=True))
    monkeypatch.undo()
    if HAS_BNB:
        config = model_flags.quantization(
            ModelConfig(load_in_4bit=True, use_peft=True, dtype="bfloat16", bnb_4bit_quant_type="fp4")
        )
        assert config.load_in_4bit and config.bnb_4bit_quant_type == "fp4"
        assert config.bnb_4bit_compute_dtype == torch.bfloat16  # TRL's rule: the compute dtype is `--dtype`


def test_a_quantized_base_without_mixed_precision_is_refused_naming_the_flag(tmp_path):
    """TRL keeps QLoRA's trainable weights (the score head's copy too) in bf16: an fp32 run would stop at its first
    forward with a dtype mismatch, so the recipe refuses it in one line."""
    from trl_rm_env import RankedRewardConfig

    quantized = ModelConfig(load_in_4bit=True, use_peft=True)
    fp32 = RankedRewardConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False)
    with pytest.raises(ValueError, match=r"^--load_in_4bit trains QLoRA adapters .*add --bf16 true"):
        model_flags.quantization(quantized, fp32)


def test_reward_model_lora_is_sequence_classification():
    """TRL's default LoRA task (CAUSAL_LM) becomes SEQ_CLS in the reward-model recipes (PEFT's causal-LM wrapper
    fails on a classifier); another task is refused naming the flag; no PEFT stays no PEFT."""
    pytest.importorskip("peft")
    config = model_flags.peft_config(ModelConfig(use_peft=True))
    assert str(config.task_type) in ("SEQ_CLS", "TaskType.SEQ_CLS")
    with pytest.raises(ValueError, match="^--lora_task_type TOKEN_CLS: a reward model is a sequence classifier"):
        model_flags.peft_config(ModelConfig(use_peft=True, lora_task_type="TOKEN_CLS"))
    assert model_flags.peft_config(ModelConfig()) is None


def accuracy(model, tokenizer) -> float:
    correct = pairs = 0
    with torch.no_grad():
        for record in load_rank_dataset("sample:in_domain"):
            scores = [
                model(input_ids=torch.tensor([encode_conversation(tokenizer, record["context"], c["completion"])]))
                .logits[0, 0].float().item()
                for c in record["completions"]
            ]
            for i, j in iter_pairs([c["rank"] for c in record["completions"]]):
                pairs += 1
                correct += scores[i] > scores[j]
    return correct / pairs


@pytest.mark.slow
def test_qlora_reward_model_trains_and_saves_a_plain_full_precision_checkpoint(tiny_dir, tmp_path):
    base_dir = tiny_dir / "reward_model"
    args = ["--config", "recipes/configs/rm_tiny.yaml", "--model_name_or_path", str(base_dir),
            "--output_dir", str(tmp_path / "qlora"), "--max_steps", "20", "--eval_steps", "20",
            "--load_in_4bit", "true", "--use_peft", "true", "--lora_task_type", "SEQ_CLS",
            "--bf16", "true", "--dtype", "bfloat16"]  # fmt: skip
    if not HAS_BNB:
        from trl_rm_env.recipes.cli import main

        assert main(["train", *args]) == 1  # refused in one line, before any model loads
        return
    out = launch("cpu.yaml", "recipes/train_rm.py", *args)
    assert "Quantized base: 4-bit (bitsandbytes); training its LoRA adapters (QLoRA)" in out  # it reached the model
    saved = tmp_path / "qlora"
    config = json.loads((saved / "config.json").read_text())
    assert "quantization_config" not in config and config["dtype"] == "bfloat16"  # full precision, as --dtype says
    assert config["reward_mean"] is not None  # the trained model's config travels with the merged weights
    model = AutoModelForSequenceClassification.from_pretrained(saved).eval()  # plain transformers: no bitsandbytes
    tokenizer = AutoTokenizer.from_pretrained(saved)
    assert not [type(m).__name__ for m in model.modules() if "4bit" in type(m).__name__ or "8bit" in type(m).__name__]
    base = AutoModelForSequenceClassification.from_pretrained(base_dir).eval()
    delta = model.model.layers[0].self_attn.q_proj.weight.float() - base.model.layers[0].self_attn.q_proj.weight
    assert delta.abs().max() > 0  # LoRA on q_proj/v_proj, merged into the full-precision weights
    logged = json.loads((saved / "eval_results.json").read_text())["eval_in_domain_accuracy"]
    merged = accuracy(model, tokenizer)
    # The merged model keeps what the quantized one learned (only the base's 4-bit rounding is gone).
    assert abs(merged - logged) < 0.08 and merged > accuracy(base, tokenizer) + 0.1, (merged, logged)
