"""The real model on a real vLLM (the CPU build in CI's vLLM environment): SmolLM2-135M-Instruct (`trl-rm-env
make-real`) as a reward model scored by vLLM's pooling runner and as a judge on vLLM's generate runner, each equal to
one forward of the plain transformers model (fp32, 1e-4). The transformers engine and every layout on the same
weights are tests/test_real_model.py.

Skipped without vLLM or the real model (`TRL_RM_ENV_REQUIRE_VLLM=1` / `TRL_RM_ENV_REQUIRE_REAL=1` fail instead).
"""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch

if importlib.util.find_spec("vllm") is None:
    if os.environ.get("TRL_RM_ENV_REQUIRE_VLLM") == "1":
        raise RuntimeError("TRL_RM_ENV_REQUIRE_VLLM=1 but vLLM is not installed (see the README's test command)")
    pytest.skip("vLLM is not installed", allow_module_level=True)

from test_real_model import EASY, MISSING, grpo_call, plain_scores  # noqa: E402

if MISSING and os.environ.get("TRL_RM_ENV_REQUIRE_REAL") != "1":
    pytest.skip(f"the real model is not installed ({MISSING})", allow_module_level=True)

pytestmark = [pytest.mark.vllm, pytest.mark.real]


def test_vllm_scores_the_real_reward_model_as_one_forward_of_the_plain_model(real_dir):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from trl_rm_env.scoring.scorer import load_reward_scorer

    path = real_dir / "reward_model"
    model = AutoModelForSequenceClassification.from_pretrained(path).eval()
    reference = plain_scores(model, AutoTokenizer.from_pretrained(path), *grpo_call())
    scorer = load_reward_scorer(path, engine="vllm", vllm_enforce_eager=True)
    try:
        torch.testing.assert_close(scorer.score(*grpo_call()), reference, atol=1e-4, rtol=0)
    finally:
        scorer.engine.close()


def test_the_real_judge_on_vllm_equals_the_judge_on_transformers(real_dir):
    """Pointwise `logprobs` ratings of the first 6 easy pairs (tests/test_real_model.py holds the transformers judge
    to the plain model): vLLM's full-vocabulary log-probabilities give the same ratings."""
    from trl_rm_env import JudgeEnvironment

    judged = EASY[:6]  # as tests/test_real_model.py's judge test
    prompts = [[{"role": "user", "content": q}] for q, _, _ in judged for _ in range(2)]
    completions = [[{"role": "assistant", "content": a}] for _, right, wrong in judged for a in (right, wrong)]
    hf = JudgeEnvironment(str(real_dir / "policy"), engine="hf")
    on_vllm = JudgeEnvironment(str(real_dir / "policy"), engine="vllm", vllm_enforce_eager=True)
    try:
        want = torch.tensor(hf(prompts=prompts, completions=completions))
        got = torch.tensor(on_vllm(prompts=prompts, completions=completions))
    finally:
        on_vllm.engine.close()
    torch.testing.assert_close(got, want, atol=1e-4, rtol=0)
