"""`RankedRewardTrainer` as a drop-in for TRL 1.16's `RewardTrainer` (issue 12).

Step-1 equality: for every TRL dataset type, TRL's `RewardTrainer` and ours, given the same tiny weights, the same
`RewardConfig` and seed, process the data into the same `chosen_ids`/`rejected_ids` and give the same first-step loss
(fp32, 1e-6). Then one regression test per cause of the issue (implicit prompts, TRL's processed columns, legacy
columns, tool calling, `compute_metrics`, the log layout of named sets), the partial-margin crash, and a TRL reward
script (TRL's `trl/scripts/reward.py` shape) run with only its import changed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from datasets import Dataset
from transformers import AutoModelForSequenceClassification
from trl import RewardConfig, RewardTrainer
from trl.trainer.reward_trainer import DataCollatorForPreference

from trl_rm_env import RankedRewardConfig, RankedRewardTrainer
from trl_rm_env.data.converters import binary_to_rank
from trl_rm_env.tiny_models import build_tiny_reward_model
from trl_rm_env.trainer.collator import DataCollatorForRankedPreference
from trl_rm_env.trainer.examples import tokenize_rank_record

pytestmark = pytest.mark.slow  # end to end: trainers, servers or spawned processes (`-m "not slow"` skips them)

QUESTIONS = ["What is the capital of France?", "How many legs does a spider have?", "Name a primary colour.",
             "What is 2 + 2?", "Which planet is red?", "What do bees make?", "How many days in a week?",
             "What is frozen water called?"]
GOOD = ["Paris is the capital.", "A spider has eight legs.", "Red is a primary colour.", "It is four.",
        "Mars is the red planet.", "Bees make honey.", "A week has seven days.", "It is called ice."]
BAD = ["It is Lyon, I think", "Six legs", "Maybe green", "Five", "Venus", "Bees make milk and bread", "Ten", "Snow"]


def user(text):
    return {"role": "user", "content": text}


def assistant(text):
    return {"role": "assistant", "content": text}


def standard_preference():
    return Dataset.from_list([{"prompt": q + " ", "chosen": g, "rejected": b} for q, g, b in zip(QUESTIONS, GOOD, BAD)])


def standard_implicit():
    return Dataset.from_list([{"chosen": f"{q} {g}", "rejected": f"{q} {b}"} for q, g, b in zip(QUESTIONS, GOOD, BAD)])


def conversational_preference():
    return Dataset.from_list(
        [{"prompt": [user(q)], "chosen": [assistant(g)], "rejected": [assistant(b)]} for q, g, b in zip(QUESTIONS, GOOD, BAD)]
    )


def conversational_implicit():
    return Dataset.from_list(
        [{"chosen": [user(q), assistant(g)], "rejected": [user(q), assistant(b)]} for q, g, b in zip(QUESTIONS, GOOD, BAD)]
    )


def conversational_multi_turn():
    """Chosen responses that go on for several turns (a user turn inside the response)."""
    rows = []
    for q, g, b in zip(QUESTIONS, GOOD, BAD):
        chosen = [assistant(g), user("Sure?"), assistant("Yes, sure.")]
        rows.append({"prompt": [user(q)], "chosen": chosen, "rejected": [assistant(b)]})
    return Dataset.from_list(rows)


def with_margin(dataset):
    return dataset.map(lambda row, i: {"margin": 0.25 * (i % 3)}, with_indices=True)


def pretokenized(tokenizer, chosen="chosen_ids", rejected="rejected_ids"):
    eos = tokenizer.eos_token
    return standard_implicit().map(
        lambda row: {chosen: tokenizer(row["chosen"] + eos)["input_ids"], rejected: tokenizer(row["rejected"] + eos)["input_ids"]},
        remove_columns=["chosen", "rejected"],
    )


# A Qwen-like template that renders `tools`, assistant `tool_calls`, `tool` messages and a `shout` template kwarg.
TOOL_TEMPLATE = (
    "{%- if tools %}{{ '<|im_start|>system\\nTools: ' + (tools | tojson) + '<|im_end|>\\n' }}{%- endif %}"
    "{%- for message in messages %}"
    "{{ '<|im_start|>' + (message.role.upper() if shout else message.role) + '\\n' }}"
    "{%- if message.content %}{{ message.content }}{%- endif %}"
    "{%- if message.tool_calls %}{%- for call in message.tool_calls %}"
    "{{ '<tool_call>' + call.function.name + ' ' + (call.function.arguments | tojson) + '</tool_call>' }}"
    "{%- endfor %}{%- endif %}{{ '<|im_end|>\\n' }}"
    "{%- endfor %}"
)
TOOLS = [{"type": "function", "function": {"name": "capital", "description": "Capital of a country",
                                           "parameters": {"type": "object", "properties": {"country": {"type": "string"}}}}}]


def toolcall_preference(tools_as_json: bool):
    rows = []
    for i, (q, g, b) in enumerate(zip(QUESTIONS, GOOD, BAD)):
        call = {"type": "function", "function": {"name": "capital", "arguments": {"country": f"c{i}"}}}
        chosen = [{"role": "assistant", "tool_calls": [call]}, {"role": "tool", "name": "capital", "content": g},
                  assistant(g)]
        rows.append({"prompt": [user(q)], "chosen": chosen, "rejected": [assistant(b)],
                     "tools": json.dumps(TOOLS) if tools_as_json else TOOLS,
                     "chat_template_kwargs": {"shout": bool(i % 2)}})
    return Dataset.from_list(rows)


def arg_values(tmp_path, **overrides) -> dict:
    values = dict(output_dir=str(tmp_path / "out"), max_steps=1, per_device_train_batch_size=4, per_device_eval_batch_size=4,
                  learning_rate=1e-3, use_cpu=True, bf16=False, gradient_checkpointing=False, report_to="none",
                  save_strategy="no", logging_steps=1, seed=0, disable_tqdm=True, max_length=256)
    values.update(overrides)
    return values


def trl_args(tmp_path, **overrides) -> RewardConfig:
    return RewardConfig(**arg_values(tmp_path, **overrides))


def pair_of_trainers(tmp_path, tokenizer, dataset, peft_config=None, collator=None, **overrides):
    """TRL's trainer and ours on the same weights, data, `RewardConfig` and seed."""
    trainers = []
    for cls in (RewardTrainer, RankedRewardTrainer):
        model = build_tiny_reward_model(tokenizer, seed=3).train()
        kwargs = {"peft_config": peft_config} if peft_config is not None else {}
        if collator is not None:
            kwargs["data_collator"] = collator
        trainers.append(cls(model=model, args=trl_args(tmp_path / cls.__name__, **overrides), train_dataset=dataset,
                            processing_class=tokenizer, **kwargs))
    return trainers


@pytest.fixture()
def chat_tokenizer(tiny_tokenizer):
    """A copy of the tiny tokenizer with the tool-calling template (the session fixture stays untouched)."""
    import copy

    tokenizer = copy.deepcopy(tiny_tokenizer)
    tokenizer.chat_template = TOOL_TEMPLATE
    return tokenizer


# ---------------------------------------------------------------------------------------------------- step-1 equality


CASES = {
    "standard_preference": lambda tok: (standard_preference(), {}),
    "standard_implicit_prompt_preference": lambda tok: (standard_implicit(), {}),
    "conversational_preference": lambda tok: (conversational_preference(), {}),
    "conversational_implicit_prompt_preference": lambda tok: (conversational_implicit(), {}),
    "conversational_multi_turn": lambda tok: (conversational_multi_turn(), {}),
    "pretokenized": lambda tok: (pretokenized(tok), {}),
    "margin": lambda tok: (with_margin(standard_implicit()), {}),
    "center_rewards_coefficient": lambda tok: (conversational_preference(), {"center_rewards_coefficient": 0.01}),
    "dataset_num_proc": lambda tok: (standard_preference(), {"dataset_num_proc": 2}),
    "max_length_filter": lambda tok: (standard_implicit(), {"max_length": 36}),  # drops 3 of 8
}


@pytest.mark.parametrize("case", list(CASES))
def test_step_one_loss_and_ids_equal_trl(tmp_path, tiny_tokenizer, case):
    dataset, overrides = CASES[case](tiny_tokenizer)
    trl_trainer, ours = pair_of_trainers(tmp_path, tiny_tokenizer, dataset, **overrides)
    assert ours.train_dataset["chosen_ids"] == trl_trainer.train_dataset["chosen_ids"]
    assert ours.train_dataset["rejected_ids"] == trl_trainer.train_dataset["rejected_ids"]
    assert set(trl_trainer.train_dataset.column_names) <= set(ours.train_dataset.column_names)
    losses = []
    for trainer in (trl_trainer, ours):
        trainer.train()
        losses.append(trainer.state.log_history[-1]["train_loss"])
    assert len(trl_trainer.train_dataset) > 0
    assert losses[1] == pytest.approx(losses[0], abs=1e-6)


@pytest.mark.parametrize("make_dataset", [standard_implicit, standard_preference, conversational_preference,
                                          conversational_implicit])
def test_ids_equal_trl_with_a_bos_template_and_tokenizer(tmp_path, bos_tokenizer, make_dataset):
    # The template writes BOS and the tokenizer adds one too: TRL's ids have one BOS, and so do ours.
    trl_trainer, ours = pair_of_trainers(tmp_path, bos_tokenizer, make_dataset())
    assert ours.train_dataset["chosen_ids"] == trl_trainer.train_dataset["chosen_ids"]
    assert ours.train_dataset["rejected_ids"] == trl_trainer.train_dataset["rejected_ids"]
    assert ours.train_dataset[0]["chosen_ids"][:2].count(bos_tokenizer.bos_token_id) == 1


@pytest.mark.parametrize("tools_as_json", [True, False])
def test_step_one_equal_trl_with_tools_and_chat_template_kwargs(tmp_path, chat_tokenizer, tools_as_json):
    trl_trainer, ours = pair_of_trainers(tmp_path, chat_tokenizer, toolcall_preference(tools_as_json), max_length=1024)
    assert ours.train_dataset["chosen_ids"] == trl_trainer.train_dataset["chosen_ids"]
    assert ours.train_dataset["rejected_ids"] == trl_trainer.train_dataset["rejected_ids"]
    text = chat_tokenizer.decode(ours.train_dataset[1]["chosen_ids"])
    assert "Tools: " in text and "<tool_call>capital" in text and "TOOL\n" in text  # tools, calls, shout=True
    losses = []
    for trainer in (trl_trainer, ours):
        trainer.train()
        losses.append(trainer.state.log_history[-1]["train_loss"])
    assert losses[1] == pytest.approx(losses[0], abs=1e-6)


def test_step_one_equal_trl_with_peft(tmp_path, tiny_tokenizer):
    from peft import LoraConfig

    def lora():
        return LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], modules_to_save=["score"])

    losses, after = [], []
    for cls in (RewardTrainer, RankedRewardTrainer):
        trainer = cls(model=build_tiny_reward_model(tiny_tokenizer, seed=3).train(), args=trl_args(tmp_path / cls.__name__, max_steps=2),
                      train_dataset=conversational_implicit(), processing_class=tiny_tokenizer, peft_config=lora())
        trainer.train()
        losses.append(trainer.state.log_history[-1]["train_loss"])
        after.append({n: p.detach().clone() for n, p in trainer.model.named_parameters() if "lora_B" in n})
    assert losses[1] == pytest.approx(losses[0], abs=1e-6)
    assert after[0].keys() == after[1].keys() and after[0]
    for name in after[0]:  # the same LoRA update after two steps
        torch.testing.assert_close(after[1][name], after[0][name], atol=1e-6, rtol=0)


def test_trl_collator_passed_explicitly_trains_as_in_trl(tmp_path, tiny_tokenizer):
    collator = DataCollatorForPreference(pad_token_id=tiny_tokenizer.pad_token_id)
    trl_trainer, ours = pair_of_trainers(tmp_path, tiny_tokenizer, with_margin(standard_preference()), collator=collator)
    assert ours.data_collator is collator
    losses = []
    for trainer in (trl_trainer, ours):
        trainer.train()
        losses.append(trainer.state.log_history[-1]["train_loss"])
    assert losses[1] == pytest.approx(losses[0], abs=1e-6)


def test_prefix_sharing_on_trl_pairs_equals_trl(tmp_path, tiny_tokenizer):
    trl_trainer, ours = pair_of_trainers(tmp_path, tiny_tokenizer, conversational_preference())
    shared = RankedRewardTrainer(
        model=build_tiny_reward_model(tiny_tokenizer, seed=3).train(),
        args=RankedRewardConfig(**arg_values(tmp_path / "shared", prefix_sharing=True)),
        train_dataset=conversational_preference(), processing_class=tiny_tokenizer,
    )
    batch = shared.data_collator([shared.train_dataset[i] for i in range(4)])
    assert "score_index" in batch and "ranks" not in batch  # shared-context batch, read in TRL's pair layout
    losses = []
    for trainer in (trl_trainer, shared):
        trainer.train()
        losses.append(trainer.state.log_history[-1]["train_loss"])
    assert losses[1] == pytest.approx(losses[0], abs=1e-5)


# ---------------------------------------------------------------------------------------------------- the six causes


def test_cause1_implicit_prompt_text_is_accepted_with_trl_ids(tmp_path, tiny_tokenizer):
    # Old code: DataValidationError "the row has no 'prompt' column, so chosen must be a full conversation".
    dataset = Dataset.from_list([{"chosen": "The sky is blue.", "rejected": "The sky is green"},
                                 {"chosen": "Yes", "rejected": "No, never"}])  # nothing shared: context ""
    trainer = RankedRewardTrainer(model=build_tiny_reward_model(tiny_tokenizer), args=trl_args(tmp_path),
                                  train_dataset=dataset, processing_class=tiny_tokenizer)
    eos = tiny_tokenizer.eos_token
    for i, row in enumerate(dataset):
        assert trainer.train_dataset[i]["chosen_ids"] == tiny_tokenizer(row["chosen"] + eos)["input_ids"]
        assert trainer.train_dataset[i]["rejected_ids"] == tiny_tokenizer(row["rejected"] + eos)["input_ids"]
    assert binary_to_rank(dataset[0], "d", 0)["context"] == "The sky is "
    assert binary_to_rank(dataset[1], "d", 1)["context"] == ""
    # A response that is a prefix of the other keeps a non-empty completion of its own.
    assert binary_to_rank({"chosen": "abc", "rejected": "abc def"}, "d", 2)["completions"][0]["completion"] == "c"


def test_cause1_conversations_with_no_shared_message_have_an_empty_context(tiny_tokenizer):
    row = {"chosen": [{"role": "system", "content": "Be kind."}, user("Hi"), assistant("Hello!")],
           "rejected": [user("Hi"), assistant("Go away.")]}
    record = binary_to_rank(row, "d", 0)
    assert record["context"] == []
    example, status = tokenize_rank_record(record, tiny_tokenizer)
    assert status == "ok" and example["context_length"] == 0
    assert example["completion_ids"][0] == tiny_tokenizer.apply_chat_template(row["chosen"], tokenize=True,
                                                                               return_dict=True)["input_ids"]
    # A conversation that is a prefix of the other keeps its last message as its completion.
    shared = [user("2+2?"), assistant("4")]
    record = binary_to_rank({"chosen": shared, "rejected": [*shared, user("ok")]}, "d", 0)
    assert record["context"] == shared[:1] and record["completions"][0]["completion"] == shared[1:]
    assert tokenize_rank_record({"context": "", "completions": [{"rank": 0, "completion": "a"},
                                                                {"rank": 1, "completion": "b"}]},
                                tiny_tokenizer)[0]["context_length"] == 0


def test_cause2_processed_datasets_have_trl_columns(tmp_path, tiny_tokenizer):
    from trl_rm_env import load_rank_dataset

    n_way = load_rank_dataset("sample:in_domain")
    trainer = RankedRewardTrainer(
        model=build_tiny_reward_model(tiny_tokenizer), args=trl_args(tmp_path), train_dataset=conversational_preference(),
        eval_dataset={"pairs": standard_implicit(), "ranked": n_way}, processing_class=tiny_tokenizer,
    )
    assert {"chosen_ids", "rejected_ids", "prompt", "chosen", "rejected"} <= set(trainer.train_dataset.column_names)
    assert "chosen_ids" in next(iter(trainer.eval_dataset["pairs"]))
    assert {"completion_ids", "ranks", "context_length"} <= set(trainer.eval_dataset["ranked"].column_names)
    # Our collator lays TRL pairs out exactly as TRL's collator does (so callbacks and user collators agree).
    examples = [trainer.train_dataset[i] for i in range(3)]
    ours = DataCollatorForRankedPreference(pad_token_id=tiny_tokenizer.pad_token_id)(examples)
    theirs = DataCollatorForPreference(pad_token_id=tiny_tokenizer.pad_token_id)(examples)
    assert ours.keys() == theirs.keys()
    for key in theirs:
        assert torch.equal(ours[key], theirs[key])
    metrics = trainer.evaluate()
    assert metrics["eval_pairs_num_pairs"] == 8 and metrics["eval_ranked_num_pairs"] > 0
    assert metrics["eval_pairs_min_reward"] <= metrics["eval_pairs_mean_reward"] <= metrics["eval_pairs_max_reward"]


def test_single_eval_set_logs_every_key_trl_logs(tmp_path, tiny_tokenizer):
    keys = []
    for cls in (RewardTrainer, RankedRewardTrainer):
        trainer = cls(model=build_tiny_reward_model(tiny_tokenizer, seed=3),
                      args=trl_args(tmp_path / cls.__name__, per_device_eval_batch_size=8),
                      train_dataset=standard_implicit(), eval_dataset=standard_implicit(), processing_class=tiny_tokenizer)
        metrics = trainer.evaluate()
        keys.append(set(metrics))
        if cls is RewardTrainer:
            trl_metrics = metrics
    assert keys[0] <= keys[1]
    # On one process with one batch per set TRL's batch means are the set's values: ours are the same numbers.
    for key in ("eval_loss", "eval_accuracy", "eval_min_reward", "eval_mean_reward", "eval_max_reward"):
        assert metrics[key] == pytest.approx(trl_metrics[key], abs=1e-6), key


def test_cause3_legacy_columns_warn_and_are_renamed(tmp_path, tiny_tokenizer):
    dataset = pretokenized(tiny_tokenizer, "chosen_input_ids", "rejected_input_ids")
    with pytest.warns(FutureWarning, match=r"will not be supported in v1"):
        trainer = RankedRewardTrainer(model=build_tiny_reward_model(tiny_tokenizer), args=trl_args(tmp_path),
                                      train_dataset=dataset, processing_class=tiny_tokenizer)
    columns = trainer.train_dataset.column_names
    assert "chosen_ids" in columns and "rejected_ids" in columns and "chosen_input_ids" not in columns
    assert trainer.train_dataset["chosen_ids"] == dataset["chosen_input_ids"]
    trainer.train()


def test_cause4_tool_calls_and_template_kwargs_render_as_trl(chat_tokenizer, tmp_path):
    # Old code: "message has no 'content'" for the tool-calling assistant message; tools/kwargs silently dropped.
    dataset = toolcall_preference(tools_as_json=True)
    trainer = RankedRewardTrainer(model=build_tiny_reward_model(chat_tokenizer), args=trl_args(tmp_path, max_length=1024),
                                  train_dataset=dataset, processing_class=chat_tokenizer)
    assert len(trainer.train_dataset) == len(dataset)
    for i in range(2):
        row = dataset[i]
        expected = chat_tokenizer.apply_chat_template(
            row["prompt"] + row["chosen"], tools=json.loads(row["tools"]), tokenize=True, return_dict=True,
            **row["chat_template_kwargs"])["input_ids"]
        assert trainer.train_dataset[i]["chosen_ids"] == expected
    with pytest.raises(ValueError, match=r"row 0, field 'tools': tools is a string but not valid JSON"):
        RankedRewardTrainer(model=build_tiny_reward_model(chat_tokenizer), args=trl_args(tmp_path),
                            train_dataset=dataset.map(lambda r: {"tools": "{not json"}), processing_class=chat_tokenizer)


def test_cause5_compute_metrics_gets_trl_predictions(tmp_path, tiny_tokenizer):
    seen = {}

    def compute_metrics(prediction):
        seen.setdefault("calls", []).append(prediction)
        return {"my_metric": 0.123}

    results = []
    for cls in (RewardTrainer, RankedRewardTrainer):
        trainer = cls(model=build_tiny_reward_model(tiny_tokenizer, seed=3).train(),
                      args=trl_args(tmp_path / cls.__name__, max_steps=3, eval_strategy="steps", eval_steps=3, per_device_eval_batch_size=3),
                      train_dataset=standard_preference(), eval_dataset=standard_implicit(), processing_class=tiny_tokenizer,
                      compute_metrics=compute_metrics)
        trainer.train()
        assert trainer.state.log_history[-2]["eval_my_metric"] == 0.123
        results.append(seen.pop("calls")[-1])
    trl_pred, ours_pred = results
    assert ours_pred.label_ids == trl_pred.label_ids == ()
    assert ours_pred.predictions.shape == trl_pred.predictions.shape
    # Same rows in the same order; after three steps the (default, exact) prefix-shared path differs by rounding only.
    np.testing.assert_allclose(ours_pred.predictions, trl_pred.predictions, atol=1e-5, rtol=0)


def test_cause5_compute_metrics_on_ranked_records(tmp_path, tiny_tokenizer):
    records = [{"context": "Q: colour? A:", "completions": [{"rank": 0, "completion": " red"}, {"rank": 1, "completion": " blue"},
                                                          {"rank": 1, "completion": " grey"}]},
               {"context": "Q: number? A:", "completions": [{"rank": 1, "completion": " two"}, {"rank": 0, "completion": " one"}]}]
    seen = []
    trainer = RankedRewardTrainer(model=build_tiny_reward_model(tiny_tokenizer), args=trl_args(tmp_path),
                                  train_dataset=Dataset.from_list(records), processing_class=tiny_tokenizer,
                                  compute_metrics=lambda p: seen.append(p) or {"n": float(len(p.predictions))})
    metrics = trainer.evaluate(Dataset.from_list(records))
    assert metrics["eval_n"] == 2.0
    labels = seen[0].label_ids
    assert labels.tolist() == [[0, 1, 1], [1, 0, -100]]
    assert seen[0].predictions.shape == (2, 3) and seen[0].predictions[1, 2] == -100


def test_cause6_total_validation_time_is_in_the_last_sets_row(tmp_path, tiny_tokenizer):
    layouts = []
    for cls in (RewardTrainer, RankedRewardTrainer):
        trainer = cls(model=build_tiny_reward_model(tiny_tokenizer, seed=3).train(),
                      args=trl_args(tmp_path / cls.__name__, max_steps=3, eval_strategy="steps", eval_steps=2),
                      train_dataset=standard_implicit(), eval_dataset={"data1": standard_implicit(), "data2": standard_implicit()},
                      processing_class=tiny_tokenizer)
        trainer.train()
        history = trainer.state.log_history
        layouts.append([sorted({k.split("_")[1] for k in row if k.startswith("eval_data")}) or sorted(row)[:1]
                        for row in history if not any(k == "loss" for k in row)])
        if cls is RankedRewardTrainer:
            assert history[-3]["eval_data1_loss"] is not None and history[-2]["eval_data2_loss"] is not None
            assert "eval_total_validation_time" in history[-2] and "eval_data2_accuracy" in history[-2]
            assert not any(set(row) <= {"eval_total_validation_time", "epoch", "step"} for row in history)
            assert "train_loss" in history[-1]  # the reward-statistics evaluation after training is not logged
    assert layouts[1] == layouts[0]


def test_partial_margin_is_zero_where_missing(tmp_path, tiny_tokenizer):
    # Old code: TypeError in the collator (torch.tensor of floats and None).
    from trl_rm_env import load_rank_dataset

    path = tmp_path / "partial.jsonl"
    with open(path, "w") as f:
        for i in range(4):
            record = {"context": "Q: 1+1? A:", "completions": [{"rank": 0, "completion": " 2"}, {"rank": 1, "completion": " 3"}]}
            f.write(json.dumps({**record, **({"margin": 0.5} if i % 2 else {})}) + "\n")
    trainer = RankedRewardTrainer(model=build_tiny_reward_model(tiny_tokenizer), args=trl_args(tmp_path),
                                  train_dataset=load_rank_dataset(str(path)), processing_class=tiny_tokenizer)
    batch = trainer.data_collator([trainer.train_dataset[i] for i in range(4)])
    assert batch["margin"].tolist() == [0.0, 0.5, 0.0, 0.5]
    trainer.train()
    collator = DataCollatorForRankedPreference(pad_token_id=0)
    pairs = [{"chosen_ids": [1, 2], "rejected_ids": [3], "margin": None}, {"chosen_ids": [4], "rejected_ids": [5], "margin": 1.0}]
    assert collator(pairs)["margin"].tolist() == [0.0, 1.0]
    trl_pairs = standard_implicit().add_column("margin", [None if i % 2 else 0.5 for i in range(8)])
    trainer = RankedRewardTrainer(model=build_tiny_reward_model(tiny_tokenizer), args=trl_args(tmp_path),
                                  train_dataset=trl_pairs, processing_class=tiny_tokenizer)
    assert trainer.train_dataset["margin"] == [0.5, 0.0] * 4


# ---------------------------------------------------------------------------------------------------- configs, models


def test_model_id_with_model_init_kwargs_and_iterable_data(tmp_path, tiny_dir):
    args = trl_args(tmp_path, model_init_kwargs={"dtype": torch.float16}, max_steps=2)
    trainer = RankedRewardTrainer(model=str(tiny_dir / "reward_model"), args=args,
                                  train_dataset=standard_implicit().to_iterable_dataset())
    assert next(trainer.model.parameters()).dtype == torch.float16
    assert "chosen_ids" in next(iter(trainer.train_dataset))
    trainer.train()
    assert trainer.state.global_step == 2


def test_chat_template_path_jinja_file(tmp_path, tiny_dir):
    template = tmp_path / "template.jinja"
    template.write_text(TOOL_TEMPLATE)
    trainer = RankedRewardTrainer(model=str(tiny_dir / "reward_model"), args=trl_args(tmp_path, chat_template_path=str(template)),
                                  train_dataset=conversational_preference())
    assert trainer.processing_class.chat_template == TOOL_TEMPLATE
    assert "<|im_start|>user\n" in trainer.processing_class.decode(trainer.train_dataset[0]["chosen_ids"])


def test_trl_reward_script_runs_with_only_the_import_changed(tmp_path, tiny_dir, repo_root):
    data = tmp_path / "data"
    data.mkdir()
    for split, dataset in (("train", standard_implicit()), ("test", standard_implicit().select(range(4)))):
        with open(data / f"{split}.jsonl", "w") as f:
            for row in dataset:
                f.write(json.dumps(row) + "\n")
    out = tmp_path / "rm"
    cmd = [sys.executable, str(repo_root / "tests" / "scripts" / "trl_reward_script.py"),
           "--model_name_or_path", str(tiny_dir / "reward_model"), "--dataset_name", str(data),
           "--output_dir", str(out), "--max_steps", "2", "--per_device_train_batch_size", "4",
           "--eval_strategy", "steps", "--eval_steps", "2", "--use_cpu", "true", "--bf16", "false",
           "--gradient_checkpointing", "false", "--report_to", "none", "--dtype", "float32", "--disable_tqdm", "true"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    result = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    model = AutoModelForSequenceClassification.from_pretrained(out)
    assert model.config.num_labels == 1
    assert isinstance(model.config.reward_mean, float)  # our trainer ran: it writes the reward statistics
    assert (out / "tokenizer_config.json").exists()


def test_iterable_eval_sets_give_the_map_style_metrics(tmp_path, tiny_tokenizer):
    # Accelerate's batch dispatching (its default for iterable datasets) sliced our batches along dim 0 as if it
    # counted examples: an IndexError (or wrong pairs) on the last, uneven batch.
    trainer = RankedRewardTrainer(model=build_tiny_reward_model(tiny_tokenizer), args=trl_args(tmp_path, per_device_eval_batch_size=3),
                                  train_dataset=standard_implicit(), processing_class=tiny_tokenizer)
    expected = trainer.evaluate(standard_implicit())
    for eval_dataset, prefix in ((standard_implicit().to_iterable_dataset(), "eval"),
                                 ({"it": standard_implicit().to_iterable_dataset()}, "eval_it")):
        metrics = trainer.evaluate(eval_dataset)
        assert metrics[f"{prefix}_num_pairs"] == 8
        for key in ("loss", "accuracy", "mean_reward", "min_reward", "max_reward"):
            assert metrics[f"{prefix}_{key}"] == pytest.approx(expected[f"eval_{key}"], abs=1e-6), key
