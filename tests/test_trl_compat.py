"""TRL drop-in compatibility: every case of TRL's own reward-trainer tests, run against TRL's classes and ours.

Each test below is parametrized over two implementations:

- ``trl``:  ``trl.RewardTrainer`` / ``trl.RewardConfig`` / ``trl.trainer.reward_trainer.DataCollatorForPreference``
- ``ours``: ``trl_rm_env.RankedRewardTrainer`` / ``trl_rm_env.RankedRewardConfig`` /
  ``trl_rm_env.DataCollatorForRankedPreference``

and must pass for both: a TRL user who swaps the import keeps every behaviour TRL's own suite checks.

The cases were learned from ``tests/test_reward_trainer.py`` of huggingface/trl at commit
``f2cd57710ae345ea6428ae95363267fcf38a3dc8`` (2026-07-24, "Async grpo OpenEnv harness rollout (#6420)"); the test
code here is our own. Everything runs offline: instead of the ``trl-internal-testing/*`` Hub models we build tiny
random models of the same architectures (hidden 16, one layer) with the tiny BPE/ChatML tokenizer of
``trl_rm_env.tiny_models``, and instead of the ``trl-internal-testing/zen`` and ``toolcall`` datasets small local
datasets of our own text in the same formats. Training runs are cut to 2-3 steps.

Mapping (TRL test -> test here; both parametrized over ``trl``/``ours``):

==========================================================  ===========================================================
TRL ``tests/test_reward_trainer.py``                        here
==========================================================  ===========================================================
TestDataCollatorForPreference.test_basic_padding            test_collator_pads_right
TestDataCollatorForPreference.test_pad_to_multiple_of       test_collator_pad_to_multiple_of
TestDataCollatorForPreference.test_single_example           test_collator_single_pair
TestDataCollatorForPreference.test_different_pad_token_id   test_collator_custom_pad_id
TestDataCollatorForPreference.test_collate_with_margin      test_collator_margin
test_raises_error_when_model_num_labels_not_one             test_rejects_model_with_two_labels
test_train[Qwen2, Qwen3Moe, Llama]                          test_train_architectures[qwen2, qwen3_moe, llama]
test_evaluate_with_eval_dataset[6 types]                    test_evaluate_accepts_raw_eval_dataset[6 types]
test_trust_remote_code                                      test_trust_remote_code (local folder with custom code)
test_train_dataset_types[4 configs]                         test_train_dataset_types[4 configs]
test_train_model                                            test_train_model_instance
test_train_from_sequence_classification_model               test_train_from_sequence_classification_folder
test_train_model_dtype                                      test_train_fp16_model_init_kwargs
test_train_dense_with_peft_config                           test_peft_config[dense]
test_train_moe_with_peft_config                             test_peft_config[moe]
test_train_peft_model                                       test_train_peft_model_instance
test_train_with_peft_config_and_gradient_checkpointing      test_peft_config[dense_gradient_checkpointing]
test_train_with_peft_config_and_gradient_checkpointing_     test_peft_config[seqcls_reentrant_true,
  reentrant[True, False]                                      seqcls_reentrant_false]
test_train_with_pretokenized_data[ids, legacy]              test_pretokenized[chosen_ids, legacy_input_ids]
test_train_with_iterable_dataset                            test_train_streaming_dataset
test_train_with_chat_template_kwargs                        test_chat_template_kwargs_per_row
test_train_with_set_chat_template_from_model                test_chat_template_cloned_from_tokenizer_folder
test_train_with_set_chat_template_from_path                 test_chat_template_from_jinja_file
test_train_toolcall_data                                    test_tool_calling_data[tools_json_string]
test_train_toolcall_data_as_json                            test_tool_calling_data[tools_list_of_dicts]
test_train_with_eval                                        test_train_with_eval_dataset
test_train_with_multiple_eval_dataset                       test_train_with_named_eval_datasets
test_train_dataset_required                                 test_train_dataset_is_required
test_init_with_eval_dataset[7 types]                        test_init_prepares_eval_dataset[7 types]
test_train_with_compute_metrics                             test_compute_metrics_is_called
test_train_with_gradient_checkpointing                      test_gradient_checkpointing[default]
test_train_with_gradient_checkpointing_reentrant[T, F]      test_gradient_checkpointing[reentrant_true,
                                                              reentrant_false]
test_tag_added                                              test_model_tags[plain]
test_tag_added_peft                                         test_model_tags[peft]
test_train_with_margin                                      test_train_with_margin
test_train_with_center_rewards_coefficient                  test_train_with_center_rewards_coefficient
==========================================================  ===========================================================

55 TRL cases (5 collator + 50 trainer, counting parametrizations) -> 55 cases here, x2 implementations. Beyond
TRL's suite: ``test_logged_keys_include_trls`` (every key TRL logs, ours logs too; runs both classes itself).

Offline stand-ins: ``trust_remote_code`` loads a local folder whose ``config.json`` has an ``auto_map`` to modeling
code in the folder (the Hub case needs the network; the transformers code path is the same). The "chat template from
model" case clones the template from a local tokenizer folder instead of ``Qwen/Qwen3-4B``. TRL's tag cases build
the trainer without ``args``; TRL's default config turns bf16 on, which CPUs without bf16 reject, so both classes get
the same explicit CPU config there. All runs use ``bf16=False, use_cpu=True`` for both classes (TRL's default
``bf16=True`` is what the tag note describes; our default differs on purpose, see docs/coming_from_trl.md).
"""

from __future__ import annotations

import json
import math
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from datasets import Dataset, DatasetDict, IterableDataset, IterableDatasetDict, load_dataset
from helpers import training_args
from transformers import (
    AutoModelForSequenceClassification,
    AutoTokenizer,
    GPTNeoXConfig,
    GPTNeoXForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen2ForSequenceClassification,
    Qwen3MoeConfig,
    Qwen3MoeForCausalLM,
)

pytestmark = pytest.mark.slow  # end to end: trainers, servers or spawned processes (`-m "not slow"` skips them)

# ---------------------------------------------------------------------------------------------------- implementations


@dataclass(frozen=True)
class Impl:
    """One implementation under test: a trainer class, its config class and its default collator class."""

    name: str
    trainer_cls: type
    config_cls: type
    collator_cls: type


def _trl_impl() -> Impl:
    from trl import RewardConfig, RewardTrainer
    from trl.trainer.reward_trainer import DataCollatorForPreference

    return Impl("trl", RewardTrainer, RewardConfig, DataCollatorForPreference)


def _our_impl() -> Impl:
    from trl_rm_env import DataCollatorForRankedPreference, RankedRewardConfig, RankedRewardTrainer

    return Impl("ours", RankedRewardTrainer, RankedRewardConfig, DataCollatorForRankedPreference)


# Cases that still fail for our classes, keyed by test node name (without the `[...]` id); each entry is the reason.
# Applied as `xfail(strict=True)` to the `ours` parametrization only, so a fix makes the run fail until removed here.
OURS_XFAIL: dict[str, str] = {}


@pytest.fixture(params=["trl", "ours"])
def impl(request) -> Impl:
    if request.param == "ours":
        reason = OURS_XFAIL.get(request.node.name) or OURS_XFAIL.get(request.node.originalname)
        if reason:
            request.applymarker(pytest.mark.xfail(strict=True, reason=reason))
        return _our_impl()
    return _trl_impl()


# ---------------------------------------------------------------------------------------------------- data

# (prompt, better continuation, worse continuation): our own text, in the spirit of TRL's "zen" test set.
TRAIN_TRIPLES = [
    ("The capital of France is", " Paris.", " Rome."),
    ("Two plus two equals", " four.", " five."),
    ("The largest planet in our solar system is", " Jupiter.", " Mars."),
    ("A week has", " seven days.", " nine days."),
    ("Bees make", " honey.", " milk."),
    ("Ice is the solid form of", " water.", " sand."),
    ("The sun rises in the", " east.", " north."),
    ("Spiders have", " eight legs.", " six legs."),
]
TEST_TRIPLES = [
    ("A triangle has", " three sides.", " four sides."),
    ("Plants take in", " carbon dioxide.", " helium."),
    ("Water freezes at", " zero degrees Celsius.", " ten degrees Celsius."),
    ("A year usually has", " twelve months.", " ten months."),
]
DATASET_CONFIGS = [
    "standard_preference",
    "conversational_preference",
    "standard_implicit_prompt_preference",
    "conversational_implicit_prompt_preference",
]


def _row(config: str, prompt: str, good: str, bad: str) -> dict[str, Any]:
    question = [{"role": "user", "content": f"Finish the sentence: {prompt} ..."}]
    if config == "standard_preference":
        return {"prompt": prompt, "chosen": good, "rejected": bad}
    if config == "standard_implicit_prompt_preference":
        return {"chosen": prompt + good, "rejected": prompt + bad}
    if config == "conversational_preference":
        return {
            "prompt": question,
            "chosen": [{"role": "assistant", "content": good.strip()}],
            "rejected": [{"role": "assistant", "content": bad.strip()}],
        }
    if config == "conversational_implicit_prompt_preference":
        return {
            "chosen": question + [{"role": "assistant", "content": good.strip()}],
            "rejected": question + [{"role": "assistant", "content": bad.strip()}],
        }
    raise ValueError(config)


def preference_data(config: str = "standard_implicit_prompt_preference", split: str = "train") -> Dataset:
    triples = TRAIN_TRIPLES if split == "train" else TEST_TRIPLES
    return Dataset.from_list([_row(config, *t) for t in triples])


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory) -> Path:
    """JSON-lines files of every config and split, for `load_dataset("json", ..., streaming=True)`."""
    root = tmp_path_factory.mktemp("trl-compat-data")
    for config in DATASET_CONFIGS:
        for split in ("train", "test"):
            triples = TRAIN_TRIPLES if split == "train" else TEST_TRIPLES
            path = root / f"{config}-{split}.jsonl"
            path.write_text("".join(json.dumps(_row(config, *t)) + "\n" for t in triples), encoding="utf-8")
    return root


def streamed(data_dir: Path, split: str, config: str = "standard_implicit_prompt_preference") -> IterableDataset:
    files = str(data_dir / f"{config}-{split}.jsonl")
    return load_dataset("json", data_files={split: files}, split=split, streaming=True)


# Tool calling, in the shape of TRL's "toolcall" preference set (our own tools and text).
def _tool(name: str, description: str, **params: str) -> dict[str, Any]:
    properties = {p: {"type": "string", "description": d} for p, d in params.items()}
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {"type": "object", "properties": properties, "required": list(params)},
        },
    }


def _call(name: str, **arguments: Any) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "arguments": arguments}}


def toolcall_rows() -> list[dict[str, Any]]:
    convert = _tool("convert_units", "Convert a quantity.", value="The number.", unit="The target unit.")
    lookup = _tool("lookup_word", "Look a word up.", word="The word.")
    rows = []
    for value, unit, wrong in [("3", "km", "mile"), ("10", "kg", "pound"), ("2", "hour", "day"), ("5", "m", "inch")]:
        rows.append(
            {
                "prompt": [{"role": "user", "content": f"How many meters or grams is {value} {unit}?"}],
                "chosen": [
                    {"role": "assistant", "tool_calls": [_call("convert_units", value=value, unit=unit)]},
                    {"role": "tool", "name": "convert_units", "content": f"{value}000"},
                    {"role": "assistant", "content": f"That is {value}000 in base units."},
                ],
                "rejected": [
                    {"role": "assistant", "tool_calls": [_call("convert_units", value=value, unit=wrong)]},
                    {"role": "tool", "name": "convert_units", "content": "1"},
                    {"role": "assistant", "content": "It is about one."},
                ],
                "tools": json.dumps([convert]),
            }
        )
    for word in ["river", "candle"]:
        rows.append(
            {
                "prompt": [{"role": "user", "content": f"What does {word} mean?"}],
                "chosen": [
                    {"role": "assistant", "tool_calls": [_call("lookup_word", word=word)]},
                    {"role": "tool", "name": "lookup_word", "content": f"{word}: a common noun."},
                    {"role": "assistant", "content": f"A {word} is a common thing."},
                ],
                "rejected": [{"role": "assistant", "content": "No idea."}],
                "tools": json.dumps([lookup]),
            }
        )
    return rows


# A small ChatML-like template of our own that renders `tools` and assistant `tool_calls`.
TOOL_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\nTools:{% for tool in tools %}\n{{ tool | tojson }}{% endfor %}<|im_end|>\n"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'assistant' and message.tool_calls %}<|im_start|>assistant"
    "{%- if message.content %}\n{{ message.content }}{% endif %}"
    "{%- for call in message.tool_calls %}\n<call>{{ call.function | tojson }}</call>{% endfor %}<|im_end|>\n"
    "{%- elif message.role == 'tool' %}<|im_start|>tool\n{{ message.content }}<|im_end|>\n"
    "{%- else %}<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n{% endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

# ChatML whose role names are written in capitals when the row's `chat_template_kwargs` says `loud_roles`.
LOUD_TEMPLATE = (
    "{%- if messages[0].role != 'system' %}<|im_start|>{{ 'SYSTEM' if loud_roles else 'system' }}\n"
    "Answer briefly.<|im_end|>\n{% endif %}"
    "{%- for message in messages %}<|im_start|>{{ message.role | upper if loud_roles else message.role }}\n"
    "{{ message.content }}<|im_end|>\n{% endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>{{ 'ASSISTANT' if loud_roles else 'assistant' }}\n{% endif %}"
)

# A different (but ChatML-compatible) template, written to a .jinja file.
FILE_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}: {{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant: {% endif %}"
)


# ---------------------------------------------------------------------------------------------------- tiny models

REMOTE_CONFIG_PY = """from transformers import Qwen2Config


class RemoteConfig(Qwen2Config):
    model_type = "remote"
"""
REMOTE_MODELING_PY = """from torch import nn
from transformers import Qwen2ForSequenceClassification, Qwen2Model, Qwen2PreTrainedModel

from .configuration_remote import RemoteConfig


class RemoteForSequenceClassification(Qwen2ForSequenceClassification):
    config_class = RemoteConfig

    def __init__(self, config):
        # Build the backbone directly: `AutoModel` does not know this folder's config class.
        Qwen2PreTrainedModel.__init__(self, config)
        self.num_labels = config.num_labels
        self.model = Qwen2Model(config)
        self.score = nn.Linear(config.hidden_size, config.num_labels, bias=False)
        self.post_init()
"""


def _small(tokenizer, **extra) -> dict[str, Any]:
    kwargs = dict(
        vocab_size=len(tokenizer),
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=512,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    kwargs.update(extra)
    return kwargs


@pytest.fixture(scope="session")
def models(tmp_path_factory) -> dict[str, str]:
    """Saved tiny random models (model folder + tokenizer) of the architectures TRL's tests use."""
    from trl_rm_env.tiny_models import build_tiny_tokenizer

    root = tmp_path_factory.mktemp("trl-compat-models")
    tokenizer = build_tiny_tokenizer()
    no_template = build_tiny_tokenizer()
    no_template.chat_template = None
    builders = {
        "qwen2": lambda: Qwen2ForCausalLM(Qwen2Config(**_small(tokenizer))),
        "qwen2_seqcls": lambda: Qwen2ForSequenceClassification(Qwen2Config(num_labels=1, **_small(tokenizer))),
        "llama": lambda: LlamaForCausalLM(LlamaConfig(**_small(tokenizer))),
        "qwen3_moe": lambda: Qwen3MoeForCausalLM(
            Qwen3MoeConfig(
                **_small(tokenizer, head_dim=8),
                num_experts=2,
                num_experts_per_tok=2,
                moe_intermediate_size=16,
                decoder_sparse_step=1,
            )
        ),
        "gpt_neox": lambda: GPTNeoXForCausalLM(
            GPTNeoXConfig(
                vocab_size=len(tokenizer),
                hidden_size=16,
                intermediate_size=32,
                num_hidden_layers=1,
                num_attention_heads=2,
                max_position_embeddings=512,
                pad_token_id=tokenizer.pad_token_id,
                eos_token_id=tokenizer.eos_token_id,
            )
        ),
    }
    paths = {}
    for name, build in builders.items():
        torch.manual_seed(0)
        path = root / name
        build().save_pretrained(path)
        (no_template if name == "gpt_neox" else tokenizer).save_pretrained(path)
        paths[name] = str(path)

    # A folder whose config points at modeling code shipped in the folder (what `trust_remote_code` guards).
    remote = root / "remote"
    shutil.copytree(root / "qwen2_seqcls", remote)
    config = json.loads((remote / "config.json").read_text())
    config.update(
        model_type="remote",
        architectures=["RemoteForSequenceClassification"],
        auto_map={
            "AutoConfig": "configuration_remote.RemoteConfig",
            "AutoModelForSequenceClassification": "modeling_remote.RemoteForSequenceClassification",
        },
    )
    (remote / "config.json").write_text(json.dumps(config))
    (remote / "configuration_remote.py").write_text(REMOTE_CONFIG_PY)
    (remote / "modeling_remote.py").write_text(REMOTE_MODELING_PY)
    paths["remote"] = str(remote)

    template_file = root / "template.jinja"
    template_file.write_text(FILE_TEMPLATE, encoding="utf-8")
    paths["template_file"] = str(template_file)
    paths["template_source"] = paths["qwen2"]  # a tokenizer folder with a ChatML template to clone from
    return paths


# ---------------------------------------------------------------------------------------------------- helpers


def make_args(impl: Impl, tmp_path: Path, **overrides):
    values: dict[str, Any] = dict(max_steps=2, per_device_train_batch_size=2, per_device_eval_batch_size=4, bf16=False)
    return training_args(impl.config_cls, tmp_path, **{**values, **overrides})


def snapshot(trainer) -> dict[str, torch.Tensor]:
    return {name: param.detach().clone() for name, param in trainer.model.named_parameters()}


def train_and_check(trainer, skip: tuple[str, ...] = ()) -> dict[str, torch.Tensor]:
    """Train; the run ends with a finite `train_loss` and every parameter (but `skip`) has moved."""
    before = snapshot(trainer)
    trainer.train()
    assert math.isfinite(trainer.state.log_history[-1]["train_loss"])
    frozen = [
        name
        for name, old in before.items()
        if not any(s in name for s in skip) and torch.equal(old, trainer.model.get_parameter(name))
    ]
    assert not frozen, f"parameters not updated by training: {frozen}"
    return before


def train_peft_and_check(trainer, base_names: set[str]) -> None:
    """Train a PEFT model: base weights stay put, adapter weights move."""
    before = snapshot(trainer)
    trainer.train()
    assert math.isfinite(trainer.state.log_history[-1]["train_loss"])
    moved_base, frozen_adapter = [], []
    for name, old in before.items():
        new = trainer.model.get_parameter(name)
        if name in base_names:
            if not torch.equal(old, new):
                moved_base.append(name)
        elif "base_layer" not in name and torch.equal(old, new):
            frozen_adapter.append(name)
    assert not moved_base, f"base-model parameters changed: {moved_base}"
    assert not frozen_adapter, f"adapter parameters not updated: {frozen_adapter}"
    assert any("lora_" in name for name in before), "no LoRA parameter is trainable"


def check_collated(batch, examples, pad_id: int, width: int) -> None:
    """TRL's batch layout: every chosen sequence, then every rejected one, right-padded with `pad_id` to `width`,
    with the matching attention mask (and nothing else but an optional `margin`)."""
    sequences = [e["chosen_ids"] for e in examples] + [e["rejected_ids"] for e in examples]
    want_ids = [ids + [pad_id] * (width - len(ids)) for ids in sequences]
    want_mask = [[1] * len(ids) + [0] * (width - len(ids)) for ids in sequences]
    assert set(batch) - {"margin"} == {"input_ids", "attention_mask"}
    assert batch["input_ids"].tolist() == want_ids
    assert batch["attention_mask"].tolist() == want_mask


def assert_chosen_ids(dataset) -> None:
    first = next(iter(dataset))
    assert "chosen_ids" in first and "rejected_ids" in first, f"processed columns are {sorted(first)}"


# ---------------------------------------------------------------------------------------------------- collator

PAIRS = [{"chosen_ids": [11, 12, 13], "rejected_ids": [14, 15]}, {"chosen_ids": [16, 17], "rejected_ids": [18]}]


def test_collator_pads_right(impl):
    batch = impl.collator_cls(pad_token_id=0)(PAIRS)
    check_collated(batch, PAIRS, pad_id=0, width=3)


def test_collator_pad_to_multiple_of(impl):
    batch = impl.collator_cls(pad_token_id=0, pad_to_multiple_of=4)(PAIRS)
    check_collated(batch, PAIRS, pad_id=0, width=4)


def test_collator_single_pair(impl):
    batch = impl.collator_cls(pad_token_id=0)(PAIRS[:1])
    check_collated(batch, PAIRS[:1], pad_id=0, width=3)


def test_collator_custom_pad_id(impl):
    batch = impl.collator_cls(pad_token_id=777)(PAIRS)
    check_collated(batch, PAIRS, pad_id=777, width=3)


def test_collator_margin(impl):
    examples = [dict(PAIRS[0], margin=0.25), dict(PAIRS[1], margin=-1.5)]
    batch = impl.collator_cls(pad_token_id=0)(examples)
    check_collated(batch, examples, pad_id=0, width=3)
    torch.testing.assert_close(batch["margin"], torch.tensor([0.25, -1.5]))


# ---------------------------------------------------------------------------------------------------- init errors


def test_rejects_model_with_two_labels(impl, models, tmp_path):
    model = AutoModelForSequenceClassification.from_pretrained(models["qwen2"], num_labels=2, dtype="float32")
    with pytest.raises(ValueError, match=r"reward models require `num_labels=1`"):
        impl.trainer_cls(model=model, args=make_args(impl, tmp_path), train_dataset=preference_data())


def test_train_dataset_is_required(impl, models, tmp_path):
    with pytest.raises(ValueError, match=r"`train_dataset` is required"):
        impl.trainer_cls(model=models["qwen2"], args=make_args(impl, tmp_path))


def test_trust_remote_code(impl, models, tmp_path):
    with pytest.raises(ValueError, match="custom code"):
        impl.trainer_cls(model=models["remote"], args=make_args(impl, tmp_path), train_dataset=preference_data())
    args = make_args(impl, tmp_path, trust_remote_code=True)
    trainer = impl.trainer_cls(model=models["remote"], args=args, train_dataset=preference_data())
    assert type(trainer.model).__name__ == "RemoteForSequenceClassification"


# ---------------------------------------------------------------------------------------------------- training


@pytest.mark.parametrize("arch", ["qwen2", "qwen3_moe", "llama"])
def test_train_architectures(impl, models, tmp_path, arch):
    trainer = impl.trainer_cls(model=models[arch], args=make_args(impl, tmp_path), train_dataset=preference_data())
    train_and_check(trainer)


@pytest.mark.parametrize("config", DATASET_CONFIGS)
def test_train_dataset_types(impl, models, tmp_path, config):
    trainer = impl.trainer_cls(
        model=models["qwen2"], args=make_args(impl, tmp_path), train_dataset=preference_data(config)
    )
    assert_chosen_ids(trainer.train_dataset)
    train_and_check(trainer)


def test_train_model_instance(impl, models, tmp_path):
    model = AutoModelForSequenceClassification.from_pretrained(models["qwen2"], num_labels=1, dtype="float32")
    trainer = impl.trainer_cls(model=model, args=make_args(impl, tmp_path), train_dataset=preference_data())
    train_and_check(trainer)


def test_train_from_sequence_classification_folder(impl, models, tmp_path):
    trainer = impl.trainer_cls(
        model=models["qwen2_seqcls"], args=make_args(impl, tmp_path), train_dataset=preference_data()
    )
    train_and_check(trainer)


def test_train_fp16_model_init_kwargs(impl, models, tmp_path):
    args = make_args(impl, tmp_path, model_init_kwargs={"dtype": torch.float16}, learning_rate=0.1)
    trainer = impl.trainer_cls(model=models["qwen2"], args=args, train_dataset=preference_data())
    assert {p.dtype for p in trainer.model.parameters()} == {torch.float16}
    train_and_check(trainer, skip=("layernorm",))
    assert {p.dtype for p in trainer.model.parameters()} == {torch.float16}


def test_train_with_margin(impl, models, tmp_path):
    data = preference_data().map(lambda row: {"margin": float(len(row["chosen"]) % 5) / 4})
    trainer = impl.trainer_cls(model=models["qwen2"], args=make_args(impl, tmp_path), train_dataset=data)
    train_and_check(trainer)


def test_train_with_center_rewards_coefficient(impl, models, tmp_path):
    args = make_args(impl, tmp_path, center_rewards_coefficient=0.01)
    trainer = impl.trainer_cls(model=models["qwen2"], args=args, train_dataset=preference_data())
    train_and_check(trainer)


@pytest.mark.parametrize(
    "variant", ["default", "reentrant_true", "reentrant_false"], ids=["default", "reentrant_true", "reentrant_false"]
)
def test_gradient_checkpointing(impl, models, tmp_path, variant):
    extra: dict[str, Any] = {"gradient_checkpointing": True}
    model = models["qwen2"]
    if variant != "default":
        extra["gradient_checkpointing_kwargs"] = {"use_reentrant": variant == "reentrant_true"}
        model = models["qwen2_seqcls"]
    trainer = impl.trainer_cls(model=model, args=make_args(impl, tmp_path, **extra), train_dataset=preference_data())
    train_and_check(trainer)


def test_train_streaming_dataset(impl, models, tmp_path, data_dir):
    args = make_args(impl, tmp_path, max_steps=3)
    trainer = impl.trainer_cls(model=models["qwen2"], args=args, train_dataset=streamed(data_dir, "train"))
    train_and_check(trainer)


# ---------------------------------------------------------------------------------------------------- PEFT


@pytest.mark.parametrize(
    "variant", ["dense", "moe", "dense_gradient_checkpointing", "seqcls_reentrant_true", "seqcls_reentrant_false"]
)
def test_peft_config(impl, models, tmp_path, variant):
    from peft import LoraConfig

    model_key = {"moe": "qwen3_moe"}.get(variant, "qwen2_seqcls" if variant.startswith("seqcls") else "qwen2")
    base = AutoModelForSequenceClassification.from_pretrained(models[model_key], num_labels=1, dtype="float32")
    base_names = {f"base_model.model.{name}" for name, _ in base.named_parameters()}
    extra: dict[str, Any] = {}
    if variant != "dense" and variant != "moe":
        extra["gradient_checkpointing"] = True
    if variant.startswith("seqcls"):
        extra["gradient_checkpointing_kwargs"] = {"use_reentrant": variant.endswith("true")}
    peft_config = (
        LoraConfig(target_modules=["gate_proj", "up_proj", "down_proj", "score"]) if variant == "moe" else LoraConfig()
    )
    trainer = impl.trainer_cls(
        model=models[model_key],
        args=make_args(impl, tmp_path, **extra),
        train_dataset=preference_data(),
        peft_config=peft_config,
    )
    train_peft_and_check(trainer, base_names)


def test_train_peft_model_instance(impl, models, tmp_path):
    from peft import LoraConfig, get_peft_model

    model = AutoModelForSequenceClassification.from_pretrained(models["qwen2"], num_labels=1, dtype="float32")
    base_names = {f"base_model.model.{name}" for name, _ in model.named_parameters()}
    model = get_peft_model(model, LoraConfig())
    trainer = impl.trainer_cls(model=model, args=make_args(impl, tmp_path), train_dataset=preference_data())
    train_peft_and_check(trainer, base_names)


@pytest.mark.parametrize("use_peft", [False, True], ids=["plain", "peft"])
def test_model_tags(impl, models, tmp_path, use_peft):
    from peft import LoraConfig

    # TRL's case builds the trainer without `args`; TRL's default config turns bf16 on, which this CPU rejects
    # ("Your setup doesn't support bf16/gpu"), so both classes get the same explicit CPU config here.
    kwargs = {"peft_config": LoraConfig()} if use_peft else {}
    args = make_args(impl, tmp_path)
    trainer = impl.trainer_cls(model=models["qwen2"], args=args, train_dataset=preference_data(), **kwargs)
    assert {"trl", "reward-trainer"} <= set(trainer.model.model_tags)


# ---------------------------------------------------------------------------------------------------- pretokenized


@pytest.mark.parametrize(
    "columns,legacy",
    [(("chosen_ids", "rejected_ids"), False), (("chosen_input_ids", "rejected_input_ids"), True)],
    ids=["chosen_ids", "legacy_input_ids"],
)
def test_pretokenized(impl, models, tmp_path, columns, legacy):
    tokenizer = AutoTokenizer.from_pretrained(models["qwen2"])
    raw = preference_data()
    data = raw.map(
        lambda row: {columns[0]: tokenizer(row["chosen"]).input_ids, columns[1]: tokenizer(row["rejected"]).input_ids},
        remove_columns=["chosen", "rejected"],
    )
    args = make_args(impl, tmp_path)
    if legacy:
        with pytest.warns(FutureWarning, match=r"chosen_input_ids.*deprecated"):
            trainer = impl.trainer_cls(model=models["qwen2"], args=args, train_dataset=data)
    else:
        trainer = impl.trainer_cls(model=models["qwen2"], args=args, train_dataset=data)
    names = set(trainer.train_dataset.column_names)
    assert {"chosen_ids", "rejected_ids"} <= names
    assert not {"chosen_input_ids", "rejected_input_ids"} & names
    # The ids are taken as given (no template, no EOS added).
    assert trainer.train_dataset[0]["chosen_ids"] == tokenizer(raw[0]["chosen"]).input_ids
    train_and_check(trainer)


# ---------------------------------------------------------------------------------------------------- chat templates


def test_chat_template_kwargs_per_row(impl, models, tmp_path):
    tokenizer = AutoTokenizer.from_pretrained(models["qwen2"])
    tokenizer.chat_template = LOUD_TEMPLATE
    data = preference_data("conversational_implicit_prompt_preference")
    data = data.add_column("chat_template_kwargs", [{"loud_roles": i % 2 == 1} for i in range(len(data))])
    trainer = impl.trainer_cls(
        model=models["qwen2"], args=make_args(impl, tmp_path), train_dataset=data, processing_class=tokenizer
    )
    assert trainer.processing_class.chat_template == LOUD_TEMPLATE
    for i in range(4):
        role = "SYSTEM" if i % 2 else "system"
        header = tokenizer(f"<|im_start|>{role}\nAnswer briefly.<|im_end|>\n<|im_start|>{'USER' if i % 2 else 'user'}")
        header_ids = header["input_ids"]
        row = trainer.train_dataset[i]
        assert row["chosen_ids"][: len(header_ids)] == header_ids
        assert row["rejected_ids"][: len(header_ids)] == header_ids
    train_and_check(trainer)


def test_chat_template_cloned_from_tokenizer_folder(impl, models, tmp_path):
    args = make_args(impl, tmp_path, chat_template_path=models["template_source"])
    trainer = impl.trainer_cls(
        model=models["gpt_neox"], args=args, train_dataset=preference_data("conversational_preference")
    )
    source = AutoTokenizer.from_pretrained(models["template_source"])
    assert trainer.processing_class.chat_template == source.chat_template
    # A mean-free loss gives the final LayerNorm's bias no gradient (TRL skips it too).
    train_and_check(trainer, skip=("final_layer_norm.bias",))


def test_chat_template_from_jinja_file(impl, models, tmp_path):
    args = make_args(impl, tmp_path, chat_template_path=models["template_file"], save_strategy="steps")
    trainer = impl.trainer_cls(
        model=models["gpt_neox"], args=args, train_dataset=preference_data("conversational_preference")
    )
    assert trainer.processing_class.chat_template == FILE_TEMPLATE
    train_and_check(trainer, skip=("final_layer_norm.bias",))
    saved = Path(args.output_dir) / f"checkpoint-{trainer.state.global_step}" / "chat_template.jinja"
    assert saved.is_file(), f"no chat template saved at {saved}"
    assert saved.read_text(encoding="utf-8") == FILE_TEMPLATE


@pytest.mark.parametrize(
    "tools_as", ["json_string", "list_of_dicts"], ids=["tools_json_string", "tools_list_of_dicts"]
)
def test_tool_calling_data(impl, models, tmp_path, tools_as):
    tokenizer = AutoTokenizer.from_pretrained(models["qwen2"])
    tokenizer.chat_template = TOOL_TEMPLATE
    rows = toolcall_rows()
    data = Dataset.from_list(rows)
    if tools_as == "list_of_dicts":
        data = data.map(lambda row: {"tools": json.loads(row["tools"])})
    args = make_args(impl, tmp_path, max_length=512)
    trainer = impl.trainer_cls(model=models["qwen2"], args=args, train_dataset=data, processing_class=tokenizer)
    # The tools and the tool calls reach the template: the sequences carry both.
    first = tokenizer.decode(trainer.train_dataset[0]["chosen_ids"])
    assert "Tools:" in first and "convert_units" in first and "<call>" in first
    train_and_check(trainer)


# ---------------------------------------------------------------------------------------------------- evaluation

EVAL_TYPES = ["dataset", "iterable_dataset", "dataset_dict", "iterable_dataset_dict", "dict_of_dataset",
              "dict_of_iterable_dataset"]  # fmt: skip


def make_eval(kind: str, data_dir: Path):
    if kind == "none":
        return None
    split = streamed(data_dir, "test") if "iterable" in kind else preference_data(split="test")
    if kind in ("dataset", "iterable_dataset"):
        return split
    if kind == "dataset_dict":
        return DatasetDict({"data1": split, "data2": split})
    if kind == "iterable_dataset_dict":
        return IterableDatasetDict({"data1": split, "data2": split})
    return {"data1": split, "data2": split}


@pytest.mark.parametrize("kind", EVAL_TYPES)
def test_evaluate_accepts_raw_eval_dataset(impl, models, tmp_path, data_dir, kind):
    trainer = impl.trainer_cls(model=models["qwen2"], args=make_args(impl, tmp_path), train_dataset=preference_data())
    metrics = trainer.evaluate(eval_dataset=make_eval(kind, data_dir))
    keys = ["eval_loss"] if kind in ("dataset", "iterable_dataset") else ["eval_data1_loss", "eval_data2_loss"]
    for key in keys:
        assert math.isfinite(metrics[key]), f"{key} missing or not finite in {sorted(metrics)}"


@pytest.mark.parametrize("kind", [*EVAL_TYPES, "none"])
def test_init_prepares_eval_dataset(impl, models, tmp_path, data_dir, kind):
    trainer = impl.trainer_cls(
        model=models["qwen2"],
        args=make_args(impl, tmp_path),
        train_dataset=preference_data(),
        eval_dataset=make_eval(kind, data_dir),
    )
    if kind == "none":
        assert trainer.eval_dataset is None
    elif kind in ("dataset", "iterable_dataset"):
        assert_chosen_ids(trainer.eval_dataset)
    else:
        assert set(trainer.eval_dataset) == {"data1", "data2"}
        for name in ("data1", "data2"):
            assert_chosen_ids(trainer.eval_dataset[name])


def test_train_with_eval_dataset(impl, models, tmp_path):
    args = make_args(impl, tmp_path, max_steps=3, eval_strategy="steps", eval_steps=3)
    trainer = impl.trainer_cls(
        model=models["qwen2"],
        args=args,
        train_dataset=preference_data(),
        eval_dataset=preference_data(split="test"),
    )
    trainer.train()
    assert math.isfinite(trainer.state.log_history[0]["eval_loss"])


def test_train_with_named_eval_datasets(impl, models, tmp_path):
    args = make_args(impl, tmp_path, max_steps=3, eval_strategy="steps", eval_steps=3)
    test = preference_data(split="test")
    trainer = impl.trainer_cls(
        model=models["qwen2"], args=args, train_dataset=preference_data(), eval_dataset={"data1": test, "data2": test}
    )
    trainer.train()
    # TRL's log layout: one row per evaluated set, then the training summary.
    history = trainer.state.log_history
    assert math.isfinite(history[-3]["eval_data1_loss"])
    assert math.isfinite(history[-2]["eval_data2_loss"])
    assert "train_loss" in history[-1]


def test_compute_metrics_is_called(impl, models, tmp_path):
    calls = []

    def compute_metrics(eval_pred):
        calls.append(eval_pred)
        return {"my_metric": 0.123}

    args = make_args(impl, tmp_path, max_steps=3, eval_strategy="steps", eval_steps=3)
    trainer = impl.trainer_cls(
        model=models["qwen2"],
        args=args,
        train_dataset=preference_data(),
        eval_dataset=preference_data(split="test"),
        compute_metrics=compute_metrics,
    )
    trainer.train()
    assert calls, "compute_metrics was never called"
    assert trainer.state.log_history[-2]["eval_my_metric"] == 0.123


# ---------------------------------------------------------------------------------------------------- beyond TRL's suite


def test_logged_keys_include_trls(models, tmp_path):
    """Not a case of TRL's suite: every key TRL's trainer logs (train rows, each eval row, the summary) is logged by
    ours too, so code that reads TRL's `log_history` keeps working (ours may log more). With named eval sets, TRL's
    keys that carry no set name (`eval_accuracy`, ... overwritten by each set in turn) are the exception: ours names
    them per set."""
    test = preference_data(split="test")
    for eval_dataset in (test, {"data1": test, "data2": test}):
        rows = {}
        for impl in (_trl_impl(), _our_impl()):
            args = make_args(impl, tmp_path / impl.name, logging_steps=1, eval_strategy="steps", eval_steps=2)
            trainer = impl.trainer_cls(
                model=models["qwen2"], args=args, train_dataset=preference_data(), eval_dataset=eval_dataset
            )
            trainer.train()
            rows[impl.name] = trainer.state.log_history
        assert len(rows["ours"]) == len(rows["trl"]), "different number of log rows"
        for i, (trl_row, our_row) in enumerate(zip(rows["trl"], rows["ours"])):
            wanted = set(trl_row)
            if isinstance(eval_dataset, dict):
                wanted = {
                    k for k in wanted if not k.startswith("eval_") or k.startswith(("eval_data1_", "eval_data2_"))
                }
            missing = sorted(wanted - set(our_row))
            assert not missing, f"log row {i}: TRL logs {missing}, ours does not"
