"""A generative judge on a real vLLM (the CPU build in CI): in-process (`engine="vllm"`) and behind vLLM's OpenAI
server (`trl-rm-env serve --engine vllm --model JUDGE`, reached with `remote_url`), its `logprobs` rewards equal to
the transformers engine's and to one forward of the plain model per judgement (fp32, 1e-4). No mock of vLLM or of
the server. Skipped without vLLM (`TRL_RM_ENV_REQUIRE_VLLM=1` fails instead)."""

from __future__ import annotations

import asyncio
import importlib.util
import os

import pytest
import torch
from helpers import ROOT, ServerProcess, judge_conversations, judge_reference

if importlib.util.find_spec("vllm") is None:
    if os.environ.get("TRL_RM_ENV_REQUIRE_VLLM") == "1":
        raise RuntimeError("TRL_RM_ENV_REQUIRE_VLLM=1 but vLLM is not installed (see the README's test command)")
    pytest.skip("vLLM is not installed", allow_module_level=True)

pytestmark = pytest.mark.vllm

MAX_LENGTH = 1024


@pytest.fixture(scope="module")
def judge_dir(tiny_dir):
    return tiny_dir / "policy"  # make-tiny's causal LM


@pytest.fixture(scope="module")
def plain(judge_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM.from_pretrained(judge_dir, dtype=torch.float32).eval(), AutoTokenizer.from_pretrained(judge_dir)


# Runs before the module's served judge and in-process engine exist: its two vLLM engines never share memory with them.
def test_eval_judge_on_vllm_beside_a_vllm_reward_model_exits_0_and_equals_transformers(tiny_dir, judge_dir, tmp_path):
    """`trl-rm-env eval --model RM --judge JUDGE`, both on vLLM, as a user runs it: a subprocess that exits 0 with no
    engine left to be killed at exit (two vLLM engines in one process once aborted there, status 134); its judge's
    verdicts equal the judge's on transformers."""
    import json
    import sys

    from helpers import run_process
    from trl_rm_env.recipes.cli import main as cli_main

    results, out = {}, {engine: tmp_path / f"{engine}.json" for engine in ("vllm", "hf")}
    # The first 40 records of the bundled in-domain set (over 100 pairs, each judged in both orders on both engines).
    lines = (ROOT / "trl_rm_env" / "data" / "sample" / "in_domain.jsonl").read_text(encoding="utf-8").splitlines()
    data = tmp_path / "in_domain.jsonl"
    data.write_text("\n".join(lines[:40]) + "\n", encoding="utf-8")
    common = ["--judge", str(judge_dir), "--judge-mode", "pairwise", "--data", f"in_domain={data}", "--no-progress",
              "--judge-options", json.dumps({"max_length": MAX_LENGTH})]  # fmt: skip
    # Both engines eager (`--enforce-eager`, `vllm_enforce_eager`): two compiling starts cost this test a minute.
    command = [sys.executable, "-m", "trl_rm_env.recipes.cli", "eval", "--model", str(tiny_dir / "reward_model"),
               "--engine", "vllm", "--enforce-eager", "--judge-engine", "vllm", "--output", str(out["vllm"]),
               *common[:-1], json.dumps({"max_length": MAX_LENGTH, "vllm_enforce_eager": True})]  # fmt: skip
    # vLLM's own log shown (an in-process engine of an earlier test may have changed the inherited settings), so that
    # an engine killed at exit ("force killing") would be seen; `--engine vllm` is never silently transformers.
    env = {**os.environ, "VLLM_CONFIGURE_LOGGING": "1", "VLLM_LOGGING_LEVEL": "INFO"}
    output = run_process(command, tmp_path, env, 900, "eval --model RM --judge JUDGE on vLLM")
    assert "EngineCore" in output, output[-3000:]
    assert "terminate called" not in output and "force killing" not in output, output[-3000:]
    assert cli_main(["eval", "--judge-engine", "hf", "--output", str(out["hf"]), *common]) == 0
    for engine, path in out.items():
        results[engine] = json.loads(path.read_text())["judge"]["sets"]["in_domain"]
    vllm, hf = results["vllm"], results["hf"]
    assert vllm["pairs"] == hf["pairs"] > 100
    # Verdicts equal within 1e-4: a pair whose two orders sit that close to 0.5 could flip; none does here.
    assert vllm["correct"] == hf["correct"] and vllm["verdict_ties"] == hf["verdict_ties"]
    assert vllm["position_consistency"] == hf["position_consistency"]


@pytest.fixture(scope="module")
def served(judge_dir):
    """`(url, server)`: the tiny judge behind `trl-rm-env serve --engine vllm` (vLLM's OpenAI server, API key "k"),
    shared by this module's tests; it must exit 0 when shut down. This module's engines run eagerly
    (`vllm_enforce_eager`: a compiling start costs 15 to 35 s more; tests/test_vllm.py's shared engine runs vLLM's
    compiled default)."""
    server = ServerProcess(str(judge_dir), "--engine", "vllm", "--max-length", str(MAX_LENGTH), "--enforce-eager",
                           env={"TRL_RM_ENV_API_KEY": "k"})  # fmt: skip
    try:
        yield server.wait(timeout=600), server
    finally:
        server.shut_down()
    assert server.proc.returncode == 0


@pytest.fixture(scope="module")
def local_judge(judge_dir):
    from trl_rm_env import JudgeEnvironment

    local = JudgeEnvironment(str(judge_dir), engine="vllm", max_length=MAX_LENGTH, vllm_enforce_eager=True)
    yield local
    local.engine.close()


def test_judge_on_vllm_in_process_and_served_equals_transformers_and_the_plain_model(judge_dir, plain, served,
                                                                                     local_judge):  # fmt: skip
    from trl_rm_env import JudgeEnvironment

    model, tokenizer = plain
    prompts, completions = judge_conversations()
    local, (url, server) = local_judge, served
    assert local.engine.name == "vllm"
    hf = JudgeEnvironment(str(judge_dir), engine="hf")
    assert "/v1/completions" in "".join(server.lines)
    remote = JudgeEnvironment("policy", tokenizer=str(judge_dir), remote_url=url, api_key="k")
    for mode in ("pointwise", "pairwise"):
        want = judge_reference(model, tokenizer, prompts, completions, mode).float()
        for env in (local, hf, remote):
            env = env.replace(mode=mode)
            got = env(prompts, completions)
            got = asyncio.run(got) if asyncio.iscoroutine(got) else got
            torch.testing.assert_close(torch.tensor(got), want, atol=1e-4, rtol=0, msg=f"{mode} on {env.engine.name}")
    # Messages to any OpenAI-compatible server (the server renders them): a verdict token missing from the top 20
    # is no verdict, counted or given unparsed_reward, never a 0.
    chat = JudgeEnvironment("policy", remote_url=url + "/v1", remote_input="messages", api_key="k", unparsed_reward=-1.0)
    logged = {}
    got = asyncio.run(chat(prompts, completions, log_metric=lambda k, v: logged.__setitem__(k, v)))
    assert all(r == -1.0 or 1.0 <= r <= 9.0 for r in got)
    assert logged["judge_env/num_unparsed"] == sum(r == -1.0 for r in got)
    # Generated verdicts go through the same engines; a random judge writes none: counted, never a silent 0.
    logged = {}
    generate = local.replace(scoring="generate", unparsed_reward=-1.0, parse_retries=1, max_new_tokens=16)
    rewards = generate(prompts, completions, log_metric=lambda k, v: logged.__setitem__(k, v))
    assert rewards == [-1.0] * 5 and logged["judge_env/num_unparsed"] == 5 and logged["judge_env/num_retried"] == 5


def test_a_genrm_on_vllm_in_process_served_and_as_the_super_recipes_reward(judge_dir, served, local_judge, tmp_path):
    """NeMo Gym's GenRM protocol on a real vLLM: in this process (one batched generate) and behind vLLM's chat
    endpoint, whose chat template renders the `response_1`/`response_2` roles (the tiny one renders any role); then
    recipes/configs/grpo_genrm.yaml end to end with that served judge as its GenRM. A random GenRM writes no JSON
    verdict, so every comparison is Gym's neutral (3, 3, 3.5), counted as failed: never a silent score."""
    import json

    from test_quickstart import launch

    from trl_rm_env import JudgeEnvironment

    prompts, completions = judge_conversations()  # groups of 3 and 2: 3 + 2 comparisons in circles
    url, _ = served
    genrm = dict(mode="genrm", max_new_tokens=8, parse_retries=0)
    in_process = local_judge.replace(**genrm)
    behind_server = JudgeEnvironment("policy", remote_url=url + "/v1", remote_input="messages", api_key="k", **genrm)
    for env in (in_process, behind_server):
        logged = {}
        got = env(prompts, completions, log_metric=logged.__setitem__)
        got = asyncio.run(got) if asyncio.iscoroutine(got) else got
        assert got == [3.0] * 5, env.engine.name
        assert logged["judge_env/num_judgements"] == logged["judge_env/num_failed"] == 5, logged
    out = tmp_path / "grpo-genrm"
    launch("grpo_rm", "grpo_genrm.yaml", "--output_dir", str(out), "--max_steps", "1", "--use_cpu", "true",
           "--model_name_or_path", str(judge_dir), "--dtype", "float32", "--bf16", "false",
           "--attn_implementation", "sdpa", "--activation_checkpointing", "false", "--reward_judge", "policy",
           "--reward_judge_url", url, "--reward_judge_max_new_tokens", "8", "--reward_judge_parse_retries", "0",
           "--prompt_data", "sample:train", "--per_device_train_batch_size", "4", "--num_generations", "4",
           "--gradient_accumulation_steps", "1", "--max_completion_length", "8", "--save_strategy", "no",
           "--log_completions", "false", env={"TRL_RM_ENV_API_KEY": "k"})  # fmt: skip
    history = json.loads((out / "trainer_state.json").read_text())["log_history"]
    step = next(h for h in history if "rewards/genrm/mean" in h)
    assert step["judge_env/num_judgements"] == step["judge_env/num_failed"] == 4
    # Every comparison neutral, so the Super stage's shaping alone moves the rewards: its length and style
    # adjustments sum to 0 within the group, and the shortest answer gets `answer_bonus` (0.5; a random completion
    # has no reasoning for `reasoning_bonus`).
    assert step["rewards/genrm/mean"] == pytest.approx(3.0 + 0.5 / 4, abs=1e-6)
