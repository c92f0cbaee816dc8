"""A judge mode is one class: a toy mode registered here (and nowhere else) runs through `JudgeEnvironment`,
`trl-rm-env eval --judge` and the GRPO recipe, with rewards equal to one forward of the plain model per judgement."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from helpers import judge_conversations, judge_prompt_text

from trl_rm_env import JudgeEnvironment
from trl_rm_env.judges.builtin_modes import MODES, register_mode
from trl_rm_env.judges.mode_base import JudgeMode
from trl_rm_env.tiny_models import build_tiny_policy

ROOT = Path(__file__).resolve().parents[1]
TEMPLATE = "Request: {prompt}\nAnswer: {completion}\nIs the answer acceptable? {answer_format}"


class Acceptable(JudgeMode):
    """A yes/no judge: the reward is the probability of `Y` against `N` (or 1/0 from `[[Y]]`/`[[N]]`)."""

    name = "toy_acceptable"
    template = TEMPLATE
    fields = frozenset({"prompt", "completion", "answer_format"})
    completion_fields = frozenset({"completion"})
    answer_formats = {"logprobs": "Reply Y or N.", "generate": "End with [[Y]] or [[N]]."}
    compares = False
    shows = 1

    def labels(self, options):
        return ["Y", "N"]

    def fill(self, texts, options):
        (text,) = texts
        return {"completion": text}

    def judgements(self, members, options, what):
        for i in members:
            yield (i,)

    def from_probabilities(self, shown, probabilities):
        return probabilities[0]

    def from_text(self, shown, text, options):
        return 1.0 if "[[Y]]" in text else 0.0 if "[[N]]" in text else None

    def shares(self, shown, verdict):
        return [(shown[0], verdict)]


@pytest.fixture
def toy_mode():
    register_mode(Acceptable)
    yield MODES[Acceptable.name]
    del MODES[Acceptable.name]


@torch.no_grad()
def p_yes(model, tok, prompt: str, completion: str) -> float:
    """The reference: the built-in template rendered here, one forward of the plain model, p(Y) / (p(Y) + p(N))."""
    text = TEMPLATE.format(prompt=prompt, completion=completion, answer_format="Reply Y or N.")
    rendered = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False)
    logits = model(input_ids=tok(rendered, return_tensors="pt")["input_ids"]).logits[0, -1].double()
    p = torch.softmax(logits, -1)[[tok.convert_tokens_to_ids("Y"), tok.convert_tokens_to_ids("N")]]
    return float(p[0] / p.sum())


def test_a_registered_mode_judges_grpo_samples_equal_to_the_plain_model(toy_mode, tiny_tokenizer):
    model = build_tiny_policy(tiny_tokenizer, seed=3)
    judge = JudgeEnvironment(model, tiny_tokenizer, mode="toy_acceptable", batch_size=2)
    prompts, completions = judge_conversations()
    logged = {}
    rewards = judge(prompts, completions, log_metric=logged.__setitem__)
    want = [p_yes(model, tiny_tokenizer, judge_prompt_text(p), c[0]["content"]) for p, c in zip(prompts, completions)]
    assert rewards == pytest.approx(want, abs=1e-4)
    assert logged["judge_env/num_judgements"] == len(prompts)
    assert judge.labels == ["Y", "N"] and "toy_acceptable" in repr(judge)
    with pytest.raises(ValueError, match="must contain {completion}"):
        JudgeEnvironment(model, tiny_tokenizer, mode="toy_acceptable", template="{prompt} {answer_format}")


def test_an_unknown_mode_is_refused_naming_the_registered_ones(toy_mode, tiny_tokenizer):
    with pytest.raises(ValueError, match=r"mode must be one of \['pointwise', 'pairwise', 'listwise', 'genrm', 'toy_acceptable'\]"):
        JudgeEnvironment(build_tiny_policy(tiny_tokenizer), tiny_tokenizer, mode="toy")


def test_eval_judges_pairs_with_a_registered_mode(toy_mode, tiny_dir, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl_rm_env.recipes.cli import main as cli_main

    records = [
        {"context": [{"role": "user", "content": f"What is {k} + {k}?"}],
         "completions": [{"rank": 0, "completion": [{"role": "assistant", "content": str(2 * k)}]},
                         {"rank": 1, "completion": [{"role": "assistant", "content": str(2 * k + 1)}]}]}
        for k in range(4)
    ]  # fmt: skip
    data = tmp_path / "pairs.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in records))
    out = tmp_path / "results.json"
    argv = ["eval", "--judge", str(tiny_dir / "policy"), "--judge-mode", "toy_acceptable", "--data", str(data),
            "--output", str(out)]  # fmt: skip
    assert cli_main(argv) == 0
    results = json.loads(out.read_text())["judge"]
    model = AutoModelForCausalLM.from_pretrained(tiny_dir / "policy", dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(tiny_dir / "policy")
    correct = 0
    for record in records:
        question = record["context"][0]["content"]
        better, worse = (p_yes(model, tok, question, c["completion"][0]["content"]) for c in record["completions"])
        correct += better > worse
    metrics = results["sets"][data.stem]
    assert results["mode"] == "toy_acceptable" and metrics["pairs"] == 4
    assert metrics["correct"] == correct  # each pair a group of two, each completion judged alone
    assert results["cost"]["judgements"] == 8


@pytest.mark.slow
def test_grpo_recipe_rewards_with_a_registered_mode(toy_mode, tiny_dir, tmp_path, monkeypatch):
    from trl_rm_env.recipes import grpo_rm

    from trl_rm_env.errors import run_recipe

    monkeypatch.chdir(tmp_path)
    out = tmp_path / "grpo"
    config = tmp_path / "grpo_toy.yaml"
    config.write_text(
        f"model_name_or_path: {tiny_dir / 'policy'}\ndtype: float32\nreward_model: null\n"
        f"reward_judge: {tiny_dir / 'policy'}\nreward_judge_mode: toy_acceptable\nprompt_data: sample:train\n"
        f"output_dir: {out}\nmax_steps: 1\nper_device_train_batch_size: 4\nnum_generations: 2\n"
        "max_completion_length: 8\nbeta: 0.0\nuse_cpu: true\nbf16: false\nactivation_checkpointing: false\n"
        "logging_steps: 1\nsave_strategy: 'no'\nreport_to: none\n"
    )
    argv = ["--config", str(config)]
    run_recipe(grpo_rm.make_parser, grpo_rm.main, argv)
    history = json.loads((out / "trainer_state.json").read_text())["log_history"]
    step = next(h for h in history if "rewards/judge/mean" in h)
    assert 0.0 <= step["rewards/judge/mean"] <= 1.0
    assert step["judge_env/num_judgements"] == 4  # one judgement per completion, none per pair
