"""The GenRM recipe (`recipes/train_genrm.py`, `trl_rm_env/trainer/genrm_training.py`): every option reaches what it
configures, seen by its effect on what TRL's trainers are given (the comparisons, the rewards' values on verdicts
written by hand, the warm start's settings, the chat template), and the steps run in the documented order (the
evaluation before training and after the warm start, the warm start skipped on resume, GRPO from the warm-started
weights, the held-out evaluation last).

Fast: TRL's `GRPOTrainer` and `SFTTrainer` are replaced by recorders (the real runs are tests/test_genrm_recipe.py,
slow), and the evaluation by a recorder or a scripted engine (tests/test_genrm_eval_by_hand.py holds its numbers)."""

from __future__ import annotations

import json
import re
from types import SimpleNamespace

import pytest
import trl_rm_env.recipes.shared_steps as shared_steps

from trl_rm_env.trainer import genrm_training

V = '{{"score_1": {}, "score_2": {}, "ranking": {}}}'.format


def answer(text):
    return [{"role": "assistant", "content": text}]


def record(question, *completions, **extra):
    return {"context": [{"role": "user", "content": question}],
            "completions": [{"rank": rank, "completion": answer(text)} for text, rank in completions], **extra}  # fmt: skip


TRAIN = [
    record("What is 1 + 1?", ("2", 0), ("3", 1), ("11", 1), principle="Be exact."),  # pairs (0,1), (0,2); tie (1,2)
    record("What is 2 + 2?", ("4", 0), ("5", 1), ("22", 2)),  # pairs (0,1), (0,2), (1,2)
    record("What is 3 + 3?", ("6", 0), ("7", 1)),  # pair (0,1)
]
HELD_OUT = [record("What is 4 + 4?", ("8", 0), ("9", 1))]


@pytest.fixture
def data(tmp_path):
    train, held = tmp_path / "train.jsonl", tmp_path / "held.jsonl"
    train.write_text("".join(json.dumps(r) + "\n" for r in TRAIN))
    held.write_text("".join(json.dumps(r) + "\n" for r in HELD_OUT))
    return train, held


def parse(tmp_path, tiny_dir, *flags):
    from trl_rm_env.recipes.train_genrm import make_parser

    return make_parser().parse_args_and_config([
        "--model_name_or_path", str(tiny_dir / "policy"), "--output_dir", str(tmp_path / "out"), "--use_cpu", "true",
        "--report_to", "none", "--per_device_train_batch_size", "4", "--num_generations", "4",
        "--max_completion_length", "24", "--learning_rate", "0.01", "--seed", "0", *flags,
    ])  # fmt: skip


class Recorder:
    """What the recipe hands to TRL and to its own steps, in order."""

    def __init__(self):
        self.events = []

    def install(self, monkeypatch, resume=None):
        import trl

        events = self.events

        class Accelerator:
            is_main_process = True

            def print(self, *args):
                pass

            def wait_for_everyone(self):
                pass

        class FakeGRPO:
            def __init__(self, model, reward_funcs, args, train_dataset, processing_class, peft_config):
                self.accelerator, self.args = Accelerator(), args
                events.append(("grpo", SimpleNamespace(model=model, reward_funcs=reward_funcs, args=args,
                                                        rows=train_dataset.to_list(), tokenizer=processing_class,
                                                        peft_config=peft_config)))  # fmt: skip

            def save_model(self, path):
                events.append(("save", path))

            def save_state(self):
                pass

            def end(self):
                events.append(("end",))

        monkeypatch.setattr(trl, "GRPOTrainer", FakeGRPO)
        monkeypatch.setattr(shared_steps, "train", lambda trainer, resume: events.append(("train", resume)))
        real_start = shared_steps.start
        monkeypatch.setattr(shared_steps, "start", lambda args: real_start(args) if resume is None else resume)

        def warm_start(model_path, tokenizer, comparisons, genrm_args, training_args, model_args):
            events.append(("warm_start", model_path, len(comparisons)))
            return "warm-started"

        def evaluate(model, tokenizer, eval_sets, training_args, when):
            events.append(("evaluate", when, model, sorted(eval_sets)))
            return {"when": when}

        def after(output_dir, eval_sets, training_args):
            events.append(("evaluate", "final", output_dir, sorted(eval_sets)))
            return {"when": "final"}

        monkeypatch.setattr(genrm_training, "warm_start", warm_start)
        monkeypatch.setattr(genrm_training, "evaluate_genrm", evaluate)
        monkeypatch.setattr(genrm_training, "evaluate_after_training", after)
        return self

    def grpo(self):
        (found,) = [e[1] for e in self.events if e[0] == "grpo"]
        return found


def run(args):
    from trl_rm_env.recipes.train_genrm import main

    return main(*args)


# ------------------------------------------------------------------------------------------------------ the steps
def test_the_steps_run_in_order_and_grpo_starts_from_the_warm_started_weights(tmp_path, tiny_dir, data, monkeypatch):
    train, held = data
    recorded = Recorder().install(monkeypatch)
    args = parse(tmp_path, tiny_dir, "--train_data", str(train), "--eval_data", f"held={held}",
                 "--warm_start_steps", "3", "--eval_at_start", "true")  # fmt: skip
    results = run(args)
    policy, out = str(tiny_dir / "policy"), str(tmp_path / "out")
    assert [e[0] for e in recorded.events] == ["evaluate", "warm_start", "evaluate", "grpo", "train", "save", "end",
                                               "evaluate"]  # fmt: skip
    assert recorded.events[0] == ("evaluate", "start", policy, ["held"])
    assert recorded.events[1] == ("warm_start", policy, 14)  # 7 pairs (one a tie) in both orders
    assert recorded.events[2] == ("evaluate", "warm_start", "warm-started", ["held"])
    assert recorded.grpo().model == "warm-started"
    assert recorded.events[4:] == [("train", None), ("save", out), ("end",), ("evaluate", "final", out, ["held"])]
    assert results == {"start": {"when": "start"}, "warm_start": {"when": "warm_start"}, "final": {"when": "final"}}


def test_resumed_runs_skip_the_warm_start_and_no_eval_data_means_no_evaluation(tmp_path, tiny_dir, data, monkeypatch):
    train, held = data
    recorded = Recorder().install(monkeypatch, resume="out/checkpoint-2")
    run(parse(tmp_path, tiny_dir, "--train_data", str(train), "--eval_data", f"held={held}", "--warm_start_steps", "3",
              "--eval_at_start", "true"))  # fmt: skip
    assert [e[0] for e in recorded.events] == ["evaluate", "grpo", "train", "save", "end", "evaluate"]
    assert recorded.grpo().model == str(tiny_dir / "policy")  # the checkpoint holds the weights GRPO goes on from
    assert ("train", "out/checkpoint-2") in recorded.events
    recorded = Recorder().install(monkeypatch)
    assert run(parse(tmp_path, tiny_dir, "--train_data", str(train), "--eval_at_start", "true")) == {}
    assert [e[0] for e in recorded.events] == ["grpo", "train", "save", "end"]  # nothing to evaluate, no warm start


# ------------------------------------------------------------------------------------------------ the comparisons
def rows_summary(rows):
    return [(r["pair"], r["order"], r["preference"]) for r in rows]


def test_the_data_options_shape_the_comparisons_grpo_trains_on(tmp_path, tiny_dir, data, monkeypatch):
    train, _ = data
    recorded = Recorder().install(monkeypatch)
    run(parse(tmp_path, tiny_dir, "--train_data", str(train)))
    rows = recorded.grpo().rows
    # Every pair of different ranks, and the tie, each in both orders (preference 1: response 1, 2: response 2, 0: tie)
    assert rows_summary(rows) == [
        ("0:0:1", 0, 1), ("0:0:1", 1, 2), ("0:0:2", 0, 1), ("0:0:2", 1, 2), ("0:1:2", 0, 0), ("0:1:2", 1, 0),
        ("1:0:1", 0, 1), ("1:0:1", 1, 2), ("1:0:2", 0, 1), ("1:0:2", 1, 2), ("1:1:2", 0, 1), ("1:1:2", 1, 2),
        ("2:0:1", 0, 1), ("2:0:1", 1, 2),
    ]  # fmt: skip
    assert [m["role"] for m in rows[0]["prompt"]] == ["user", "response_1", "response_2"]  # no principle by default
    assert [m["content"] for m in rows[1]["prompt"][1:]] == ["3", "2"]  # the second order swaps the answers

    recorded = Recorder().install(monkeypatch)
    run(parse(tmp_path, tiny_dir, "--train_data", str(train), "--include_ties", "false", "--principle", "Be kind.",
              "--principle_column", "principle"))  # fmt: skip
    rows = recorded.grpo().rows
    assert len(rows) == 12 and all(r["preference"] != 0 for r in rows)
    principles = [[m["content"] for m in r["prompt"] if m["role"] == "principle"] for r in rows]
    assert principles == [["Be exact."]] * 4 + [["Be kind."]] * 8  # the record's own, else the option's

    # pairs_per_record with the run's seed: as many pairs of each record, a different sample for another seed
    samples = {}
    for seed in ("0", "1", "2", "3"):
        recorded = Recorder().install(monkeypatch)
        run(parse(tmp_path, tiny_dir, "--train_data", str(train), "--pairs_per_record", "1", "--seed", seed))
        rows = recorded.grpo().rows
        assert [r["pair"].split(":")[0] for r in rows] == ["0", "0", "1", "1", "2", "2"]
        samples[seed] = tuple(r["pair"] for r in rows[::2])
    assert len(set(samples.values())) > 1
    recorded = Recorder().install(monkeypatch)
    run(parse(tmp_path, tiny_dir, "--train_data", str(train), "--pairs_per_record", "1", "--seed", "2"))
    assert tuple(r["pair"] for r in recorded.grpo().rows[::2]) == samples["2"]  # the same seed, the same sample
    bad = tmp_path / "principles.jsonl"
    bad.write_text(json.dumps({**TRAIN[2], "principle": 3}) + "\n")
    Recorder().install(monkeypatch)
    with pytest.raises(ValueError, match=rf"^{re.escape(str(bad))}: record 0: 'principle' must be a string"):
        run(parse(tmp_path, tiny_dir, "--train_data", str(bad), "--principle_column", "principle"))


def test_on_invalid_skips_or_names_the_bad_record(tmp_path, tiny_dir, monkeypatch):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(TRAIN[2]) + "\n" + json.dumps(record("All tied", ("a", 0), ("b", 0))) + "\n")
    recorded = Recorder().install(monkeypatch)
    run(parse(tmp_path, tiny_dir, "--train_data", str(bad)))  # skip, the default: the good record alone
    assert rows_summary(recorded.grpo().rows) == [("0:0:1", 0, 1), ("0:0:1", 1, 2)]
    Recorder().install(monkeypatch)
    with pytest.raises(ValueError, match=r"bad\.jsonl.*line 2"):
        run(parse(tmp_path, tiny_dir, "--train_data", str(bad), "--on_invalid", "raise"))


# ---------------------------------------------------------------------------------------------------- the rewards
def rewards_on(grpo, texts, preferences):
    """Each reward function's values on `texts`, and TRL's weighted sum of them (`reward_weights`)."""
    values = [f(prompts=[None] * len(texts), completions=texts, preference=preferences) for f in grpo.reward_funcs]
    weights = grpo.args.reward_weights
    assert len(weights) == len(values)
    return values, [sum(w * v[k] for w, v in zip(weights, values)) for k in range(len(texts))]


def test_reward_options_set_the_rewards_and_their_weights(tmp_path, tiny_dir, data, monkeypatch):
    train, _ = data
    texts = [V(4, 3, 2), V(3, 3, 5) + " " + " ".join(["word"] * 12), "no verdict"]
    preferences = [1, 0, 2]
    recorded = Recorder().install(monkeypatch)
    run(parse(tmp_path, tiny_dir, "--train_data", str(train)))
    values, total = rewards_on(recorded.grpo(), texts, preferences)
    # Defaults: margin_credit 0.25, weights 1.0 and 0.25, no length reward.
    # text 0, response 1 preferred: side 1, margin (4 - 3) / 4: 0.75 + 0.25 * 0.25 = 0.8125; well formed.
    # text 1, a tie, ranking 5: side clip(1.5 - 1.5) = 0, margin 1 - 0: 0.25; well formed. text 2: nothing.
    assert values == [[0.8125, 0.25, 0.0], [1.0, 1.0, 0.0]]
    assert total == [0.8125 + 0.25, 0.25 + 0.25, 0.0]
    recorded = Recorder().install(monkeypatch)
    run(parse(tmp_path, tiny_dir, "--train_data", str(train), "--margin_credit", "0.5", "--agreement_weight", "2.0",
              "--format_weight", "0.5", "--reasoning_target_words", "4", "--reasoning_length_weight", "0.3"))  # fmt: skip
    values, total = rewards_on(recorded.grpo(), texts, preferences)
    # margin_credit 0.5: text 0: 0.5 + 0.5 * 0.25 = 0.625; text 1: 0.5 * 0 + 0.5 * 1 = 0.5.
    # The length reward: text 0 has no words outside its verdict: 0; text 1, 12 words: -min(1, (12 - 4) / 4) = -1;
    # text 2, 2 words: 0.
    assert values == [[0.625, 0.5, 0.0], [1.0, 1.0, 0.0], [0.0, -1.0, 0.0]]
    assert total == [2 * 0.625 + 0.5, 2 * 0.5 + 0.5 - 0.3, 0.0]


# ------------------------------------------------------------------------------------------------ the template
def test_genrm_template_reaches_the_tokenizer_grpo_and_the_saved_model_get(tmp_path, tiny_dir, data, monkeypatch):
    train, _ = data
    recorded = Recorder().install(monkeypatch)
    run(parse(tmp_path, tiny_dir, "--train_data", str(train)))
    own = recorded.grpo().tokenizer.chat_template
    assert "[Response 1]" not in own  # auto: the tiny model's template renders the roles, kept
    recorded = Recorder().install(monkeypatch)
    run(parse(tmp_path, tiny_dir, "--train_data", str(train), "--genrm_template", "builtin", "--principle", "P"))
    tokenizer = recorded.grpo().tokenizer
    assert tokenizer.chat_template.endswith(own) and tokenizer.chat_template != own
    text = tokenizer.apply_chat_template(recorded.grpo().rows[0]["prompt"], tokenize=False, add_generation_prompt=True)
    assert "[Principle]\nP" in text and "[Response 1]\n2" in text and "[Response 2]\n3" in text


# ------------------------------------------------------------------------------------------------ the warm start
def test_warm_start_trains_on_the_target_verdicts_with_its_own_steps_and_rate(tmp_path, tiny_dir, data, monkeypatch):
    import trl

    train, _ = data
    seen, printed = {}, []

    class FakeSFT:
        def __init__(self, model, args, train_dataset, processing_class, peft_config):
            seen.update(model=model, args=args, rows=train_dataset.to_list(), tokenizer=processing_class,
                        peft_config=peft_config)  # fmt: skip
            self.accelerator = SimpleNamespace(wait_for_everyone=lambda: None, print=printed.append)

        def train(self):
            seen["trained"] = True

        def save_model(self, path):
            seen["saved"] = path

    monkeypatch.setattr(trl, "SFTTrainer", FakeSFT)
    genrm_args, training_args, model_args = parse(
        tmp_path, tiny_dir, "--train_data", str(train), "--warm_start_steps", "7", "--warm_start_learning_rate", "0.002",
        "--gradient_accumulation_steps", "2", "--eval_strategy", "steps", "--eval_steps", "5",
        "--model_init_kwargs", '{"dtype": "float32"}',
    )  # fmt: skip
    comparisons, _, _ = genrm_training.load_comparisons(genrm_args, training_args.seed)
    tokenizer, _ = genrm_training.genrm_tokenizer(str(tiny_dir / "policy"), genrm_args)
    path = genrm_training.warm_start(str(tiny_dir / "policy"), tokenizer, comparisons, genrm_args, training_args,
                                     model_args)  # fmt: skip
    assert path == str(tmp_path / "out" / "warm_start") == seen["saved"] and seen["trained"]
    assert printed == [f"Warm start: 7 supervised step(s), saved to {path}"]
    args = seen["args"]
    assert (args.max_steps, args.learning_rate, args.output_dir) == (7, 0.002, path)
    assert (args.per_device_train_batch_size, args.gradient_accumulation_steps, args.seed) == (4, 2, 0)
    assert args.save_strategy == "no" and seen["model"] == str(tiny_dir / "policy") and seen["tokenizer"] is tokenizer
    # no evaluation of its own (the GRPO run's eval_strategy is GRPO's), no truncation of a long comparison (SFT's
    # max_length default is 1024), and the run's model_init_kwargs for loading the model
    assert args.eval_strategy == "no" and args.max_length is None and args.model_init_kwargs == {"dtype": "float32"}
    # The targets: response 1 better -> (4, 2, 2); response 2 -> (2, 4, 5); a tie -> (3, 3, 3.5)
    targets = {1: {"score_1": 4, "score_2": 2, "ranking": 2}, 2: {"score_1": 2, "score_2": 4, "ranking": 5},
               0: {"score_1": 3, "score_2": 3, "ranking": 3.5}}  # fmt: skip
    assert len(seen["rows"]) == len(comparisons) == 14
    for row, comparison in zip(seen["rows"], comparisons):
        assert row["prompt"] == comparison["prompt"]
        (message,) = row["completion"]
        assert message["role"] == "assistant" and json.loads(message["content"]) == targets[comparison["preference"]]
    assert seen["peft_config"] is None
    # Without its own rate: the GRPO run's; TRL's --use_peft: LoRA here too
    genrm_args.warm_start_learning_rate = None
    peft_args = parse(tmp_path, tiny_dir, "--use_peft", "true", "--lora_r", "2")[2]
    genrm_training.warm_start(str(tiny_dir / "policy"), tokenizer, comparisons, genrm_args, training_args, peft_args)
    assert seen["args"].learning_rate == 0.01 and seen["peft_config"].r == 2


# ----------------------------------------------------------------------------------------------- the evaluation
def test_evaluate_genrm_judges_greedily_within_the_completion_length_and_keeps_each_stage(tmp_path, tiny_dir,
                                                                                           monkeypatch, capsys):  # fmt: skip
    from trl_rm_env.rewards import judge as judge_module

    calls = []

    class Judge(judge_module.JudgeEnvironment):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)

            def generate(prompts, max_new_tokens, temperature, seeds, top_p=1.0, keep_failures=False):
                calls.append((len(prompts), max_new_tokens, temperature))
                return [V(5, 1, 1)] * len(prompts)  # always "response 1 is much better"

            self.engine.generate = generate
            self.engine.close = lambda: closed.append(self.engine)

    monkeypatch.setattr(judge_module, "JudgeEnvironment", Judge)
    closed = []
    args = SimpleNamespace(max_completion_length=24, output_dir=str(tmp_path / "out"))
    sets = {"held": HELD_OUT}
    first = genrm_training.evaluate_genrm(str(tiny_dir / "policy"), None, sets, args, "start")
    assert len(closed) == 1 and closed[0] is not None  # the judge's engine, closed once judged
    printed = capsys.readouterr().out
    assert "GenRM on the held-out sets (start):" in printed and "judge (genrm, start)" in printed
    # One pair in both orders: right when shown first (+4), wrong when second (-4): a tie, inconsistent.
    assert first["sets"]["held"]["verdict_ties"] == 1 and first["sets"]["held"]["position_consistency"] == 0.0
    assert calls == [(2, 24, 0.0)]  # both orders, greedy, at most max_completion_length new tokens
    saved = tmp_path / "out" / "genrm_eval.json"
    genrm_training.evaluate_genrm(str(tiny_dir / "policy"), None, sets, args, "warm_start")
    assert set(json.loads(saved.read_text())) == {"start", "warm_start"}
    genrm_training.evaluate_genrm(str(tiny_dir / "policy"), None, sets, args, "final")
    assert set(json.loads(saved.read_text())) == {"start", "warm_start", "final"}
    assert json.loads(saved.read_text())["start"]["sets"]["held"]["pairs"] == 1
    genrm_training.evaluate_genrm(str(tiny_dir / "policy"), None, sets, args, "start")  # a new run starts afresh
    assert set(json.loads(saved.read_text())) == {"start"}


def test_genrm_tokenizer_probes_the_principle_role_when_one_is_shown_and_loads_the_revision(tmp_path, tiny_dir,
                                                                                             monkeypatch):  # fmt: skip
    """A model template that renders the responses but drops a `principle` message: kept without a principle, replaced
    by the built-in one when the run shows one (`principle` or `principle_column`)."""
    import shutil

    from transformers import AutoTokenizer

    folder = tmp_path / "model"
    shutil.copytree(tiny_dir / "policy", folder)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    tokenizer.chat_template = (
        "{% for m in messages %}{% if m['role'] != 'principle' %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] "
        "+ '<|im_end|>\\n' }}{% endif %}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
        "{% endif %}"
    )
    tokenizer.save_pretrained(folder)
    loaded = []
    real = AutoTokenizer.from_pretrained.__func__

    def recording(cls, path, *args, **kwargs):
        loaded.append((str(path), kwargs.get("revision")))
        return real(cls, path, *args, **kwargs)

    monkeypatch.setattr(AutoTokenizer, "from_pretrained", classmethod(recording))
    for flags, template in [((), "model"), (("--principle", "Be kind."), "builtin"),
                            (("--principle_column", "principle"), "builtin")]:  # fmt: skip
        genrm_args = parse(tmp_path, tiny_dir, *flags)[0]
        assert genrm_training.genrm_tokenizer(str(folder), genrm_args, revision="v2")[1] == template
    assert loaded == [(str(folder), "v2")] * 3


def test_model_flags_and_other_data_formats_reach_trl(tmp_path, tiny_dir, monkeypatch):
    """TRL's `ModelConfig` flags mean what they mean in TRL: `--use_peft` gives GRPO (and the warm start) a LoRA
    config; a TRL pairs file is read with `--data_format binary`, each pair one comparison in both orders."""
    from peft import LoraConfig

    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(json.dumps({"prompt": f"What is {k} + {k}?", "chosen": str(2 * k), "rejected": str(k)})
                             + "\n" for k in range(3)))  # fmt: skip
    recorded = Recorder().install(monkeypatch)
    run(parse(tmp_path, tiny_dir, "--train_data", str(pairs), "--data_format", "binary", "--use_peft", "true",
              "--lora_r", "4", "--lora_target_modules", "q_proj", "v_proj"))  # fmt: skip
    grpo = recorded.grpo()
    assert isinstance(grpo.peft_config, LoraConfig) and grpo.peft_config.r == 4
    assert set(grpo.peft_config.target_modules) == {"q_proj", "v_proj"}
    assert rows_summary(grpo.rows) == [(f"{k}:0:1", order, 1 + order) for k in range(3) for order in (0, 1)]
    assert grpo.rows[0]["prompt"][0] == {"role": "user", "content": "What is 0 + 0?"}
    assert [m["content"] for m in grpo.rows[2]["prompt"][1:]] == ["2", "1"]


def test_the_data_line_says_what_the_records_became():
    from trl_rm_env.judges.genrm_data import genrm_comparisons

    _, counts = genrm_comparisons(TRAIN)
    assert genrm_training.describe(counts, "builtin") == (
        "GenRM data: 3 record(s) -> 6 ordered pair(s) and 1 tie(s), each in both orders: 14 comparisons; chat "
        "template: builtin")
    _, counts = genrm_comparisons(TRAIN, ties=False, pairs_per_record=1)  # 2, 3 and 1 pairs: 1 of each kept
    assert genrm_training.describe(counts, "model") == (
        "GenRM data: 3 record(s) -> 3 ordered pair(s) and 0 tie(s), each in both orders: 6 comparisons (3 pair(s) "
        "left out by pairs_per_record); chat template: model")


def test_evaluate_genrm_uses_the_tokenizer_it_is_given_and_does_not_retry(tmp_path, tiny_dir, monkeypatch):
    """The recipe evaluates the base model with the tokenizer it readied (the built-in template, in memory only), and
    a verdict it cannot write is a failed one (no retry)."""
    from transformers import AutoTokenizer

    from trl_rm_env.judges.genrm_template import prepare_genrm_tokenizer
    from trl_rm_env.rewards import judge as judge_module

    seen = []

    class Judge(judge_module.JudgeEnvironment):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)

            def generate(prompts, max_new_tokens, temperature, seeds, top_p=1.0, keep_failures=False):
                seen.extend(self.tokenizer.decode(p) for p in prompts)
                return ["no verdict here"] * len(prompts)

            self.engine.generate = generate

    monkeypatch.setattr(judge_module, "JudgeEnvironment", Judge)
    tokenizer = AutoTokenizer.from_pretrained(tiny_dir / "policy")
    prepare_genrm_tokenizer(tokenizer, "builtin")
    args = SimpleNamespace(max_completion_length=8, output_dir=str(tmp_path / "out"))
    results = genrm_training.evaluate_genrm(str(tiny_dir / "policy"), tokenizer, {"held": HELD_OUT}, args, "start")
    assert len(seen) == 2 and all("[Response 1]" in text for text in seen)  # both orders, once each, built-in
    assert results["sets"]["held"]["no_verdict"] == 1 and results["cost"]["unparsed"] == 2


def test_the_bounds_of_the_recipes_numbers_are_inclusive(tmp_path, tiny_dir):
    for flags in (("--margin_credit", "0"), ("--margin_credit", "1"), ("--reasoning_target_words", "1"),
                  ("--pairs_per_record", "1"), ("--warm_start_steps", "0")):  # fmt: skip
        parse(tmp_path, tiny_dir, *flags)  # accepted
    with pytest.raises(ValueError, match=r"^reasoning_target_words must be >= 1 \(null: no length reward\), got 0$"):
        parse(tmp_path, tiny_dir, "--reasoning_target_words", "0")
    with pytest.raises(ValueError, match=r"^margin_credit must be in \[0, 1\], got -0\.1$"):
        parse(tmp_path, tiny_dir, "--margin_credit", "-0.1")


def test_the_final_evaluation_loads_the_saved_genrm_whole_in_one_process(tmp_path, monkeypatch):
    """After training (its process group ended), the saved GenRM is judged as one process loads it: a ZeRO-3 setting
    of the run no longer partitions the weights the judge loads."""
    from transformers.integrations.deepspeed import HfDeepSpeedConfig, is_deepspeed_zero3_enabled

    calls = []

    def evaluate(model, tokenizer, eval_sets, training_args, when):
        calls.append((model, tokenizer, eval_sets, training_args, when, is_deepspeed_zero3_enabled()))
        return {"when": when}

    monkeypatch.setattr(genrm_training, "evaluate_genrm", evaluate)
    config = HfDeepSpeedConfig({"zero_optimization": {"stage": 3}, "train_micro_batch_size_per_gpu": 1})  # noqa: F841
    assert is_deepspeed_zero3_enabled()
    args, sets = SimpleNamespace(output_dir=str(tmp_path)), {"held": HELD_OUT}
    assert genrm_training.evaluate_after_training(str(tmp_path / "saved"), sets, args) == {"when": "final"}
    assert calls == [(str(tmp_path / "saved"), None, sets, args, "final", False)]
