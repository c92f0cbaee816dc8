"""Regression reward models: masked MSE, exact per-set per-attribute metrics, HelpSteer2 rows, bad rows, the recipe."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import pytest
import torch
import yaml
from helpers import training_args
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from trl_rm_env.data.converters import helpsteer2_to_regression
from trl_rm_env.data.regression import RegressionDataArguments, load_regression_dataset, load_regression_records
from trl_rm_env.data.schema import DataValidationError
from trl_rm_env.heads import regression_reward_weights
from trl_rm_env.metrics import regression_statistics, summarize_regression_statistics
from trl_rm_env.tiny_models import build_tiny_reward_model
from trl_rm_env.tokenization import encode_conversation
from trl_rm_env.trainer.config import RegressionRewardConfig
from trl_rm_env.trainer.loss import masked_mse_loss
from trl_rm_env.trainer.regression import RegressionRewardTrainer

ROOT = Path(__file__).resolve().parent.parent
NAN = float("nan")


def record(question: str, answer: str, **attributes) -> dict:
    return {
        "context": [{"role": "user", "content": question}],
        "completion": [{"role": "assistant", "content": answer}],
        "attributes": attributes,
    }


def make_args(tmp_path, **overrides) -> RegressionRewardConfig:
    values = dict(
        max_steps=4,
        per_device_train_batch_size=8,
        per_device_eval_batch_size=3,
        learning_rate=3e-3,
        logging_steps=2,
        dataloader_num_workers=0,
        max_length=256,
    )
    return training_args(RegressionRewardConfig, tmp_path, **{**values, **overrides})


# --- loss and statistics on literal tensors ------------------------------------------------------------------------


def test_masked_mse_on_literal_tensors():
    predictions = torch.tensor([[1.0, 2.0], [3.0, 4.0]], requires_grad=True)
    targets = torch.tensor([[0.0, NAN], [3.0, 6.0]])  # attribute 1 of example 0 is missing
    loss = masked_mse_loss(predictions, targets)
    # present: (1-0)^2 + (3-3)^2 + (4-6)^2 = 5 over 3 values
    assert loss.item() == pytest.approx(5 / 3)
    loss.backward()
    # d/dp (p - y)^2 / 3 = 2 (p - y) / 3; the masked value gets no gradient
    torch.testing.assert_close(predictions.grad, torch.tensor([[2 / 3, 0.0], [0.0, -4 / 3]]))


def test_statistics_give_exact_rmse_mae_pearson():
    predictions = torch.tensor([[1.0, 2.0], [3.0, 4.0], [2.0, 0.0]])
    targets = torch.tensor([[0.0, NAN], [3.0, 6.0], [4.0, 1.0]])
    stats = regression_statistics(predictions, targets)
    assert stats.shape == (3, 2, 8) and stats[0, 1].abs().sum() == 0  # the missing value adds nothing
    summary = summarize_regression_statistics(stats, ["a", "b"])
    # a: errors 1, 0, -2 -> rmse sqrt(5/3), mae 1; Pearson r of x = (1, 3, 2) and y = (0, 3, 4)
    assert summary["a_rmse"] == pytest.approx(math.sqrt(5 / 3))
    assert summary["a_mae"] == pytest.approx(1.0)
    assert summary["a_pearson"] == pytest.approx(torch.corrcoef(torch.tensor([[1.0, 3, 2], [0, 3, 4]]))[0, 1].item())
    # b: errors -2, -1 -> rmse sqrt(5/2); x = 4, 0 and y = 6, 1 move together -> r = 1
    assert summary["b_rmse"] == pytest.approx(math.sqrt(5 / 2))
    assert summary["b_pearson"] == pytest.approx(1.0)
    assert summary["loss"] == pytest.approx((1 + 0 + 4 + 4 + 1) / 5)


# --- exact per-set metrics ------------------------------------------------------------------------------------------

SET_A = [
    record("What is 1 + 2?", "The answer is 3.", helpfulness=4, verbosity=1),
    record("What is 2 + 2?", "5", helpfulness=1, verbosity=0),
    record("Compute 3 + 4.", "3 + 4 = 7. The answer is 7.", helpfulness=4),  # verbosity missing
    record("Please add 1 and 1.", "I am not sure, sorry.", helpfulness=0, verbosity=1),
    record("How much is 2 plus 3?", "Adding 2 and 3 gives 5. The answer is 5.", helpfulness=4, verbosity=2),
    record("What is 4 + 4?", "The answer is 9.", verbosity=1),  # helpfulness missing
    record("What is 5 + 1?", "6", helpfulness=3, verbosity=0),
]
SET_B = [
    record("What is 2 + 1?", "Math is hard. Ask someone else.", helpfulness=0, verbosity=1),
    record("Compute 1 + 4.", "The answer is 5.", helpfulness=4, verbosity=1),
    record("What is 3 + 3?", "3 + 3 = 6. The answer is 6.", helpfulness=4, verbosity=2),
    record("Please add 2 and 2.", "The answer is 3.", helpfulness=1, verbosity=1),
    record("How much is 1 plus 1?", "2", helpfulness=3, verbosity=0),
]


@torch.no_grad()
def reference_metrics(model, tokenizer, records, attributes) -> dict[str, float]:
    """Score each example alone (batch of one) with the plain model; metrics in plain Python."""
    model.eval()
    pairs = {name: [] for name in attributes}
    for r in records:
        ids = torch.tensor([encode_conversation(tokenizer, r["context"], r["completion"])])
        scores = model(input_ids=ids).logits[0].tolist()
        for k, name in enumerate(attributes):
            if r["attributes"].get(name) is not None:
                pairs[name].append((scores[k], float(r["attributes"][name])))
    out, all_err2 = {}, []
    for name, xy in pairs.items():
        n = len(xy)
        err2 = [(x - y) ** 2 for x, y in xy]
        all_err2 += err2
        mx, my = sum(x for x, _ in xy) / n, sum(y for _, y in xy) / n
        cov = sum((x - mx) * (y - my) for x, y in xy)
        sx, sy = math.sqrt(sum((x - mx) ** 2 for x, _ in xy)), math.sqrt(sum((y - my) ** 2 for _, y in xy))
        out[f"{name}_rmse"] = math.sqrt(sum(err2) / n)
        out[f"{name}_mae"] = sum(abs(x - y) for x, y in xy) / n
        out[f"{name}_pearson"] = cov / (sx * sy)
    out["loss"] = sum(all_err2) / len(all_err2)
    return out


@pytest.mark.slow
def test_metrics_per_set_and_attribute_equal_one_at_a_time_reference(tmp_path, tiny_dir):
    attributes = ["helpfulness", "verbosity"]
    sets = {"a": load_regression_dataset(SET_A), "b": load_regression_dataset(SET_B)}
    # A base language model given as a path: loaded with one output per attribute (TRL would force num_labels=1).
    trainer = RegressionRewardTrainer(
        model=str(tiny_dir / "policy"), args=make_args(tmp_path), train_dataset=sets["a"], eval_dataset=sets
    )
    assert trainer.attributes == attributes  # inferred from the training data, in order of appearance
    assert trainer.model.config.num_labels == 2 and trainer.model.config.id2label == {0: "helpfulness", 1: "verbosity"}
    metrics = trainer.evaluate()  # eval batches of 3: uneven last batches in both sets

    per_attribute = {k for k in metrics if k.endswith(("_rmse", "_mae", "_pearson"))}
    assert per_attribute == {f"eval_{s}_{a}_{m}" for s in "ab" for a in attributes for m in ("rmse", "mae", "pearson")}
    assert {"eval_a_loss", "eval_b_loss", "eval_total_validation_time"} <= set(metrics)
    for name, records in (("a", SET_A), ("b", SET_B)):
        reference = reference_metrics(trainer.model, trainer.processing_class, records, attributes)
        for key, value in reference.items():
            assert metrics[f"eval_{name}_{key}"] == pytest.approx(value, rel=1e-4, abs=1e-5), (name, key)
    assert metrics["eval_a_helpfulness_rmse"] != metrics["eval_b_helpfulness_rmse"]


def test_the_recipe_table_prints_the_gain_in_percent_as_the_docs_show():
    from trl_rm_env.trainer.saving import format_regression_table

    metrics = {"eval_in_domain_helpfulness_rmse": 0.5, "eval_in_domain_helpfulness_mae": 0.25,
               "eval_in_domain_helpfulness_pearson": 0.9}  # fmt: skip
    table = format_regression_table(metrics, ["in_domain"], ["helpfulness"], baseline={"in_domain_helpfulness": 2.0})
    header, _, row = table.splitlines()
    assert header.split() == ["set", "attribute", "rmse", "mae", "pearson", "mean_rmse", "gain"]
    assert row.split() == ["in_domain", "helpfulness", "0.5000", "0.2500", "0.9000", "2.0000", "75%"]


def test_metric_name_collisions_are_refused():
    fake = RegressionRewardTrainer.__new__(RegressionRewardTrainer)  # only the name check, no model
    fake.attributes = ["b_c", "c"]
    with pytest.raises(ValueError, match=r"eval_a_b_c_rmse"):
        fake._check_metric_names(["a", "a_b"])  # eval_a_b_c_rmse: set a + attribute b_c, and set a_b + attribute c
    fake._check_metric_names(["in_domain", "harder"])


@pytest.mark.slow
def test_lora_run_saves_a_merged_checkpoint_with_attribute_names(tmp_path, tiny_tokenizer):
    from peft import LoraConfig

    from trl_rm_env.trainer.saving import save_reward_model

    model = build_tiny_reward_model(tiny_tokenizer, num_labels=2).train()
    peft_config = LoraConfig(task_type="SEQ_CLS", r=4, target_modules=["q_proj", "v_proj"], modules_to_save=["score"])
    trainer = RegressionRewardTrainer(
        model=model,
        args=make_args(tmp_path, max_steps=2, attribute_weights=[1.0, -0.5]),
        train_dataset=load_regression_dataset(SET_A),
        processing_class=tiny_tokenizer,
        peft_config=peft_config,
    )
    trainer.train()
    save_reward_model(trainer, str(tmp_path / "merged"))
    reloaded = AutoModelForSequenceClassification.from_pretrained(tmp_path / "merged")
    assert reloaded.config.id2label == {0: "helpfulness", 1: "verbosity"}
    assert reloaded.config.attribute_weights == {"helpfulness": 1.0, "verbosity": -0.5}
    assert not any("lora" in name for name, _ in reloaded.named_parameters())


# --- HelpSteer2 -----------------------------------------------------------------------------------------------------

HS2_ROWS = [
    {
        "prompt": "c#",
        "response": "C# is a programming language.",
        "helpfulness": 3,
        "correctness": 4,
        "coherence": 4,
        "complexity": 2,
        "verbosity": 1,
    },
    {
        "prompt": "Hi\n<extra_id_1>Assistant\nHello! How can I help?\n<extra_id_1>User\nTell me a joke.",
        "response": "Why did the chicken cross the road?",
        "helpfulness": 2,
        "correctness": 2,
        "coherence": 4,
        "complexity": 1,
        "verbosity": 1,
    },
]


def test_helpsteer2_rows_become_regression_records(tmp_path):
    single = helpsteer2_to_regression(HS2_ROWS[0], "hs2", 0)
    assert single["context"] == [{"role": "user", "content": "c#"}]
    assert single["completion"] == [{"role": "assistant", "content": "C# is a programming language."}]
    assert single["attributes"] == {
        "helpfulness": 3,
        "correctness": 4,
        "coherence": 4,
        "complexity": 2,
        "verbosity": 1,
    }
    multi = helpsteer2_to_regression(HS2_ROWS[1], "hs2", 1)
    assert multi["context"] == [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello! How can I help?"},
        {"role": "user", "content": "Tell me a joke."},
    ]
    subset = helpsteer2_to_regression(HS2_ROWS[0], "hs2", 0, attributes=["helpfulness", "verbosity"])
    assert subset["attributes"] == {"helpfulness": 3, "verbosity": 1}

    path = tmp_path / "hs2.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in HS2_ROWS))
    dataset = load_regression_dataset(str(path), data_format="helpsteer2")
    assert len(dataset) == 2 and list(dataset.features["attributes"]) == list(single["attributes"])
    bad = {k: v for k, v in HS2_ROWS[0].items() if k != "response"}
    path.write_text(json.dumps(HS2_ROWS[0]) + "\n" + json.dumps(bad) + "\n")
    with pytest.raises(DataValidationError, match=r"hs2\.jsonl, line 2, field 'response'"):
        load_regression_dataset(str(path), data_format="helpsteer2")


# --- bad rows -------------------------------------------------------------------------------------------------------

GOOD = record("What is 1 + 2?", "3", helpfulness=4, verbosity=0)
BAD_ROWS = {
    "string value": (
        {**GOOD, "attributes": {"helpfulness": "3"}},
        "attributes.helpfulness",
        "must be a number, got str",
    ),
    "bool value": ({**GOOD, "attributes": {"helpfulness": True}}, "attributes.helpfulness", "got bool"),
    "nan": ('{"context": "q", "completion": "a", "attributes": {"verbosity": NaN}}', "attributes.verbosity", "finite"),
    "inf": (
        '{"context": "q", "completion": "a", "attributes": {"verbosity": Infinity}}',
        "attributes.verbosity",
        "finite",
    ),
    "unknown attribute": ({**GOOD, "attributes": {"style": 2}}, "attributes.style", "unknown attribute 'style'"),
    "no attribute": ({**GOOD, "attributes": {"helpfulness": None}}, "attributes", "no attribute value"),
    "attributes not an object": ({**GOOD, "attributes": [3, 4]}, "attributes", "must be an object"),
    "missing attributes": ({"context": GOOD["context"], "completion": GOOD["completion"]}, "attributes", "missing"),
    "empty completion": ({**GOOD, "completion": [{"role": "assistant", "content": "  "}]}, "completion", "empty"),
    "empty plain completion": ({**GOOD, "context": "q", "completion": ""}, "completion", "empty completion"),
    "message without content": (
        {**GOOD, "completion": [{"role": "assistant"}]},
        "completion[0].content",
        "no 'content'",
    ),
}


@pytest.mark.parametrize("case", list(BAD_ROWS), ids=list(BAD_ROWS))
def test_bad_rows_name_file_line_and_field(tmp_path, case):
    row, field_name, reason = BAD_ROWS[case]
    path = tmp_path / "data.jsonl"
    path.write_text(json.dumps(GOOD) + "\n" + (row if isinstance(row, str) else json.dumps(row)) + "\n")
    with pytest.raises(DataValidationError, match=reason) as err:
        load_regression_records(str(path), attributes=["helpfulness", "verbosity"])
    assert (err.value.source, err.value.row, err.value.field) == (str(path), 2, field_name)
    assert f"data.jsonl, line 2, field '{field_name}'" in str(err.value)


def test_bad_rows_are_skipped_and_counted(tmp_path, caplog):
    bad = [row if isinstance(row, str) else json.dumps(row) for row, _, _ in BAD_ROWS.values()]
    path = tmp_path / "mixed.jsonl"
    path.write_text("\n".join([json.dumps(GOOD), *bad, json.dumps(GOOD), "{not json"]) + "\n")
    records, report = load_regression_records(str(path), attributes=["helpfulness", "verbosity"], on_invalid="skip")
    assert (report.kept, report.skipped) == (2, len(BAD_ROWS) + 1)
    assert sum(report.reasons.values()) == report.skipped
    assert "skipped 12 invalid row(s) of 14" in caplog.text
    # Missing attributes are kept as None in the dataset (masked out of the loss), not dropped.
    partial = load_regression_dataset([GOOD, record("q", "a", helpfulness=2)])
    assert partial["attributes"] == [{"helpfulness": 4.0, "verbosity": 0.0}, {"helpfulness": 2.0, "verbosity": None}]


def test_config_rejects_inconsistent_options(tmp_path, tiny_tokenizer):
    with pytest.raises(ValueError, match="one weight per attribute"):
        make_args(tmp_path, attributes=["a", "b"], attribute_weights=[1.0])
    with pytest.raises(ValueError, match="distinct"):
        make_args(tmp_path, attributes=["a", "a"])
    with pytest.raises(ValueError, match="center_rewards_coefficient"):
        make_args(tmp_path, center_rewards_coefficient=0.01)
    model = build_tiny_reward_model(tiny_tokenizer, num_labels=1)
    assert regression_reward_weights(model.config) is None  # a Bradley-Terry model: column 0 is the reward
    with pytest.raises(ValueError, match="applies to regression reward models"):
        regression_reward_weights(model.config, [1.0])
    with pytest.raises(ValueError, match="num_labels=1 but there are 2 attributes"):
        RegressionRewardTrainer(model=model, args=make_args(tmp_path), train_dataset=load_regression_dataset(SET_B))


# --- the recipe -----------------------------------------------------------------------------------------------------


def load_recipe():
    spec = importlib.util.spec_from_file_location(
        "recipe_train_regression_rm", ROOT / "recipes" / "train_regression_rm.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("config", ["rm_regression_tiny.yaml", "rm_regression.yaml"])
def test_recipe_configs_parse(config, monkeypatch):
    import transformers.training_args as training_args

    monkeypatch.setattr(training_args, "is_torch_bf16_gpu_available", lambda: True)  # rm_regression.yaml: bf16 GPUs
    path = ROOT / "recipes" / "configs" / config
    data_args, args, model_args = load_recipe().make_parser().parse_args_and_config(["--config", str(path)])
    raw = yaml.safe_load(path.read_text())
    assert args.attributes == raw["attributes"] and args.attribute_weights == raw["attribute_weights"]
    assert data_args.data_format == raw["data_format"] and data_args.eval_data == raw["eval_data"]


@pytest.mark.slow
def test_recipe_trains_saves_and_reloads_with_attribute_names(tmp_path, monkeypatch):
    # The shipped tiny config on slices of the bundled data (the full run is in docs/regression.md).
    monkeypatch.chdir(tmp_path)
    sample = ROOT / "trl_rm_env" / "data" / "sample"
    for split, n in (("train", 256), ("in_domain", 48)):
        lines = (sample / f"regression_{split}.jsonl").read_text().splitlines()[:n]
        (tmp_path / f"{split}.jsonl").write_text("\n".join(lines) + "\n")
    config = ROOT / "recipes" / "configs" / "rm_regression_tiny.yaml"
    flags = {
        "model_name_or_path": tmp_path / "tiny" / "model",  # built by `build_tiny_model: true`
        "output_dir": tmp_path / "rm",
        "train_data": tmp_path / "train.jsonl",
        "max_steps": 6,
        "eval_steps": 3,
        "logging_steps": 3,
        "disable_tqdm": "true",
    }
    argv = ["--config", str(config), *(item for k, v in flags.items() for item in (f"--{k}", str(v)))]
    recipe = load_recipe()
    data_args, args, model_args = recipe.make_parser().parse_args_and_config(argv)
    data_args.eval_data = [f"in_domain={tmp_path / 'in_domain.jsonl'}"]
    metrics = recipe.main(data_args, args, model_args)

    attributes = ["helpfulness", "correctness", "verbosity"]
    assert json.loads((tmp_path / "rm" / "eval_results.json").read_text()) == pytest.approx(metrics, nan_ok=True)
    history = json.loads((tmp_path / "rm" / "trainer_state.json").read_text())["log_history"]
    assert any("helpfulness_rmse" in h and "loss" in h for h in history)  # train metrics
    assert any("eval_in_domain_verbosity_pearson" in h for h in history)

    model = AutoModelForSequenceClassification.from_pretrained(tmp_path / "rm")
    assert [model.config.id2label[i] for i in range(3)] == attributes
    assert model.config.label2id == {name: i for i, name in enumerate(attributes)}
    assert model.config.reward_model_type == "regression" and model.config.problem_type == "regression"
    assert model.config.attribute_weights == {"helpfulness": 1.0, "correctness": 0.5, "verbosity": -0.1}
    assert set(model.config.attribute_stats) == set(attributes)
    # What a reward function reads: the checkpoint's default weights, or weights by name or in order.
    assert regression_reward_weights(model.config) == (attributes, [1.0, 0.5, -0.1])
    assert regression_reward_weights(model.config, {"correctness": 2.0}) == (attributes, [0.0, 2.0, 0.0])
    with pytest.raises(ValueError, match="does not predict"):
        regression_reward_weights(model.config, {"style": 1.0})
    with pytest.raises(ValueError, match="3 attributes"):
        regression_reward_weights(model.config, [1.0, 2.0])
    # The reloaded checkpoint reproduces the logged metrics.
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "rm")
    records = list(load_regression_dataset(str(tmp_path / "in_domain.jsonl")))
    reference = reference_metrics(model, tokenizer, records, attributes)
    for key in ("helpfulness_rmse", "verbosity_pearson", "loss"):
        assert metrics[f"eval_in_domain_{key}"] == pytest.approx(reference[key], rel=1e-4, abs=1e-5)


def test_data_arguments_hold_eval_sets_to_the_training_attributes(tmp_path):
    path = tmp_path / "eval.jsonl"
    path.write_text(json.dumps(record("q", "a", helpfulness=1, style=2)) + "\n")
    train, _ = RegressionDataArguments(train_data="sample:train").load()
    assert list(train.features["attributes"]) == ["helpfulness", "correctness", "verbosity"]
    with pytest.raises(DataValidationError, match="unknown attribute 'style'"):
        RegressionDataArguments(train_data="sample:in_domain", eval_data=[f"x={path}"]).load()
    with pytest.raises(FileNotFoundError, match="available: harder, in_domain, train"):
        load_regression_records("sample:nope")


# --- scoring: the environment's weighted reward and the eval command ----------------------------------------------

RM_ATTRIBUTES = ["helpfulness", "verbosity"]
RM_WEIGHTS = {"helpfulness": 1.0, "verbosity": -0.5}


@pytest.fixture(scope="module")
def regression_rm_dir(tmp_path_factory, tiny_tokenizer) -> Path:
    """A saved two-attribute regression RM with the config keys RegressionRewardTrainer writes (random weights)."""
    out = tmp_path_factory.mktemp("regression-rm")
    model = build_tiny_reward_model(tiny_tokenizer, seed=3, num_labels=len(RM_ATTRIBUTES))
    model.config.id2label = dict(enumerate(RM_ATTRIBUTES))
    model.config.label2id = {name: i for i, name in enumerate(RM_ATTRIBUTES)}
    model.config.reward_model_type = "regression"
    model.config.problem_type = "regression"
    model.config.attribute_weights = RM_WEIGHTS
    model.save_pretrained(out)
    tiny_tokenizer.save_pretrained(out)
    return out


@torch.no_grad()
def one_at_a_time_outputs(model, tokenizer, records) -> torch.Tensor:
    """`(N, K)` outputs of the plain model, one example per forward pass."""
    rows = []
    for r in records:
        ids = torch.tensor([encode_conversation(tokenizer, r["context"], r["completion"])])
        rows.append(model(input_ids=ids).logits[0].float())
    return torch.stack(rows)


@pytest.mark.parametrize(
    "weights, expected",
    [(None, [1.0, -0.5]), ({"verbosity": 2.0}, [0.0, 2.0]), ([0.25, 0.75], [0.25, 0.75])],
    ids=["checkpoint", "dict", "list"],
)
def test_environment_weighted_reward_equals_weighted_one_at_a_time_outputs(regression_rm_dir, weights, expected):
    from trl_rm_env import RewardModelEnvironment

    records = SET_A + SET_B
    env = RewardModelEnvironment(regression_rm_dir, device="cpu", batch_size=5, attribute_weights=weights)
    assert env.attributes == RM_ATTRIBUTES and env.attribute_weights == expected
    logged = {}
    rewards = env(
        [r["context"] for r in records],
        [r["completion"] for r in records],
        log_metric=lambda name, value: logged.__setitem__(name, value),
    )
    outputs = one_at_a_time_outputs(env.model, env.tokenizer, records)  # (12, 2)
    reference = outputs @ torch.tensor(expected)
    assert outputs[:, 0].std() > 1e-3 and outputs[:, 1].std() > 1e-3  # both attributes vary: the weights matter
    torch.testing.assert_close(torch.tensor(rewards), reference, atol=1e-4, rtol=0)
    for k, attribute in enumerate(RM_ATTRIBUTES):
        assert logged[f"reward_model_env/{attribute}_mean"] == pytest.approx(outputs[:, k].mean().item(), abs=1e-5)
    assert logged["reward_model_env/mean_reward"] == pytest.approx(reference.mean().item(), abs=1e-5)


def test_environment_refuses_unknown_attribute_weights(regression_rm_dir, tiny_rm, tiny_tokenizer):
    from trl_rm_env import RewardModelEnvironment

    with pytest.raises(ValueError, match="does not predict"):
        RewardModelEnvironment(regression_rm_dir, device="cpu", attribute_weights={"style": 1.0})
    with pytest.raises(ValueError, match="applies to regression reward models"):
        RewardModelEnvironment(tiny_rm, tiny_tokenizer, device="cpu", attribute_weights=[1.0])


def test_attribute_weights_from_the_command_line():
    from trl_rm_env.recipes.grpo_args import RewardModelArguments

    from trl_rm_env.heads import parse_attribute_weights

    assert parse_attribute_weights(["helpfulness=1", " verbosity = -0.25"]) == {"helpfulness": 1.0, "verbosity": -0.25}
    for bad in (["helpfulness"], ["=1"], ["helpfulness=high"]):
        with pytest.raises(ValueError, match="--w entry .* must be name=<number>"):
            parse_attribute_weights(bad, "--w")
    with pytest.raises(ValueError, match="names 'verbosity' twice"):
        parse_attribute_weights(["verbosity=1", "verbosity=2"])
    args = RewardModelArguments(reward_model="rm", reward_attribute_weights=["verbosity=2"])
    assert args.environment_kwargs()["options"].attribute_weights == {"verbosity": 2.0}
    assert RewardModelArguments(reward_model="rm").environment_kwargs()["options"].attribute_weights is None
    remote = RewardModelArguments(reward_remote_url=["http://127.0.0.1:1"], reward_attribute_weights=["verbosity=2"])
    with pytest.raises(ValueError, match="^reward_attribute_weights: applied by a reward model loaded here.*serve --help"):
        remote.reward_sources()


@pytest.mark.slow
def test_served_regression_rm_scores_the_weighted_sum(regression_rm_dir):
    """`trl-rm-env serve --attribute-weights` of a regression RM answers the same rewards as the local environment
    with those weights (not output column 0)."""
    import asyncio

    from helpers import ServerProcess

    from trl_rm_env import RewardModelEnvironment

    server = ServerProcess(str(regression_rm_dir), "--attribute-weights", "verbosity=2", "helpfulness=0.5")
    try:
        url = server.wait()
        records = SET_A + SET_B
        prompts, completions = [r["context"] for r in records], [r["completion"] for r in records]
        remote = RewardModelEnvironment(remote_url=url)
        got = asyncio.run(remote(prompts, completions))
    finally:
        server.stop()
    weights = {"verbosity": 2.0, "helpfulness": 0.5}
    local = RewardModelEnvironment(regression_rm_dir, device="cpu", attribute_weights=weights)
    assert got == pytest.approx(local(prompts, completions), abs=1e-4)
    outputs = one_at_a_time_outputs(local.model, local.tokenizer, records)
    assert got == pytest.approx((outputs @ torch.tensor([0.5, 2.0])).tolist(), abs=1e-4)
    assert any("score = 0.5 * helpfulness + 2 * verbosity" in line for line in server.lines), server.lines[-5:]


@pytest.mark.slow
def test_eval_command_reports_per_attribute_metrics_of_a_regression_rm(regression_rm_dir, tmp_path, capsys):
    from trl_rm_env.recipes.cli import main

    set_b = [*SET_B, record("What is 9 + 1?", "10", helpfulness=3, style=2)]  # `style`: not predicted, ignored
    for name, records in (("a", SET_A), ("b", set_b)):
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    output = tmp_path / "results.json"
    argv = ["eval", "--model", str(regression_rm_dir), "--data", str(tmp_path / "a.jsonl"), f"{tmp_path / 'b.jsonl'}:b"]
    assert main([*argv, "--batch-size", "3", "--no-progress", "--output", str(output)]) == 0
    table = capsys.readouterr().out
    assert "helpfulness" in table and "verbosity" in table and "ignored: style" in table
    results = json.loads(output.read_text())
    assert results["type"] == "regression" and results["attributes"] == RM_ATTRIBUTES
    assert results["ignored_attributes"] == ["style"]

    model = AutoModelForSequenceClassification.from_pretrained(regression_rm_dir)
    tokenizer = AutoTokenizer.from_pretrained(regression_rm_dir)
    for name, records in (("a", SET_A), ("b", set_b)):
        metrics = results["sets"][name]
        assert metrics["records"] == len(records) and metrics["skipped"] == 0 and metrics["unscored"] == 0
        reference = reference_metrics(model, tokenizer, records, RM_ATTRIBUTES)
        for key, value in reference.items():
            assert metrics[key] == pytest.approx(value, rel=1e-4, abs=1e-5), (name, key)
    assert results["sets"]["a"]["verbosity_count"] == 6 and results["sets"]["b"]["helpfulness_count"] == 6

    # Token budget instead of a batch size: the same numbers.
    assert main([*argv, "--max-tokens", "200", "--no-progress", "--output", str(tmp_path / "budget.json")]) == 0
    budget = json.loads((tmp_path / "budget.json").read_text())
    assert budget["sets"]["b"]["helpfulness_rmse"] == pytest.approx(results["sets"]["b"]["helpfulness_rmse"], abs=1e-5)
    # Preference formats do not apply to a regression RM, nor regression formats to a Bradley-Terry RM.
    with pytest.raises(SystemExit, match="regression reward model; --format"):
        main([*argv, "--format", "binary"])


def test_eval_command_refuses_regression_format_for_a_bradley_terry_rm(tiny_dir, tmp_path):
    from trl_rm_env.recipes.cli import main

    (tmp_path / "a.jsonl").write_text(json.dumps(SET_A[0]) + "\n")
    with pytest.raises(SystemExit, match="for regression reward models"):
        main(["eval", "--model", str(tiny_dir / "reward_model"), "--data", str(tmp_path / "a.jsonl"), "--format", "helpsteer2"])
