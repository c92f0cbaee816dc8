"""GRPO rewards from a generative judge: ours (`JudgeEnvironment`) against raw vLLM and against what TRL's docs
suggest (an async reward function posting one chat request per completion to vLLM's server, parsing the number).

    python benchmarks/bench_judge.py                       # hh-rlhf 4 prompts x 8 answers, judge at 0.6B width, 8 layers
    python benchmarks/bench_judge.py --layers 2 --repeats 1 --methods "ours: pointwise,vLLM offline"
    python benchmarks/bench_judge.py --layers 28 --precision bf16 --methods "ours: pointwise"   # transformers (no vLLM)

The judge is a random-init Qwen3 causal LM at Qwen3-0.6B's width (hidden 1024, 16 heads x 128, 8 KV heads, MLP 3072;
`--layers`, default 8), fp32 (`--precision bf16`: loaded in bfloat16 by every method), with the tiny offline
tokenizer, saved once and loaded by every method. The batches are those of `bench_score.py --data hh` (`--hh-path`):
B contexts of Anthropic hh-rlhf's harmless-base test (multi-turn, 200-850 tokens)
with G answers each; every timed call judges a batch it has not seen (vLLM's prefix cache keeps whole prompts across
calls). Each method runs in a fresh child process, after one warm-up call on a batch of its own.

Methods:
- `ours: pointwise`: `JudgeEnvironment(path)` with its defaults (`engine="auto"`: vLLM here, `scoring="logprobs"`):
  one forward per completion, the expected rating over the verdict tokens.
- `vLLM offline`: `LLM.generate(max_tokens=1, logprobs=20)` alone on the same rendered prompts (token ids encoded
  before the clock starts), the same engine arguments: the engine's floor for this work.
- `ours: pairwise all+swap`: `mode="pairwise"`: N(N-1) judgements per group of N (both orders of every pair).
- `ours: pointwise served`: `JudgeEnvironment(remote_url=...)` on vLLM's OpenAI server (`/v1/completions`, token ids,
  the verdict tokens' logprobs by id).
- `TRL docs: chat per completion`: an async reward function posting one `/v1/chat/completions` request per
  completion (the same template, asking for a number) to the same server, `max_tokens=8`, parsing the first number
  (0 when none: what a naive parser does; the random judge writes none, so its rewards say nothing, its time does).

GenRM methods (NeMo Gym's `genrm_compare`: each group's circular pairs, the GenRM writing up to `--genrm-tokens`
tokens, greedy, the verdict read by `parse_genrm_verdict`, no retries, so every method does the same work):
- `ours: genrm`: `JudgeEnvironment(path, mode="genrm")` in this process (vLLM here);
- `vLLM offline: genrm`: `LLM.generate` alone on the same rendered prompts, the same parsing: the engine's floor;
- `ours: genrm served`: `JudgeEnvironment(remote_url=..., remote_input="messages", mode="genrm")` on vLLM's OpenAI
  server (`/v1/chat/completions`, the server's chat template rendering the roles);
- `hand-written genrm: gathered`: the best reward function a user writes by hand, as TRL suggests: async, every
  comparison of the batch posted at once (`asyncio.gather`) to the same server, the same messages and parsing;
- `hand-written genrm: sequential`: the same, one request after another.

Columns: judgements/s and completions/s, tokens per judgement (prompt tokens sent, mean), time per call, speed against
`vLLM offline`, peak memory (RSS of the process and everything it started, the server's for served rows; CUDA: max
allocated of the process). A method that fails prints its error in its row.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import re
import subprocess
import sys
import tempfile
import time

from bench_score import (  # benchmarks/ is on sys.path
    HH_PATH,
    MODELS,
    free_port,
    hh_batch,
    peak_memory_mb,
    wait_until_healthy,
)
from floor import run_in_child, short_error

METHODS = [
    "vLLM offline",
    "ours: pointwise",
    "ours: pairwise all+swap",
    "ours: pointwise served",
    "TRL docs: chat per completion",
    "vLLM offline: genrm",
    "ours: genrm",
    "ours: genrm served",
    "hand-written genrm: gathered",
    "hand-written genrm: sequential",
]
GENRM_METHODS = ("vLLM offline: genrm", "ours: genrm")
NUMBER = re.compile(r"\d+(?:\.\d+)?")


def save_judge(layers: int) -> str:
    from trl_rm_env.tiny_models import build_tiny_policy, build_tiny_tokenizer

    tokenizer = build_tiny_tokenizer()
    tokenizer.model_max_length = 10**6
    kwargs = dict(MODELS["wide"], num_hidden_layers=layers, max_position_embeddings=8192, attn_implementation="sdpa")
    path = tempfile.mkdtemp(prefix="bench-judge-")
    build_tiny_policy(tokenizer, seed=0, **kwargs).save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)
    return path


def start_vllm_server(path: str, max_length: int, precision: str = "fp32") -> tuple[subprocess.Popen, str]:
    """vLLM's OpenAI server for the judge, as `trl-rm-env serve --engine vllm --model JUDGE` starts it."""
    port = free_port()
    command = [sys.executable, "-m", "trl_rm_env.recipes.cli", "serve", "--model", path, "--engine", "vllm",
               "--served-model-name", "judge", "--port", str(port), "--max-length", str(max_length),
               "--precision", precision]  # fmt: skip
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    return proc, wait_until_healthy(proc, f"http://127.0.0.1:{port}", "the judge server")


def run_one(method: str, opts: dict, queue) -> None:
    """Judge with one configuration; put its measurements on `queue` (or `{"error"}` if it fails)."""
    try:
        judge_one(method, opts, queue)
    except BaseException as err:  # the row shows the error; the other methods still run
        import traceback

        traceback.print_exc()
        queue.put({"error": f"{type(err).__name__}: {err}"})


def judge_one(method: str, opts: dict, queue) -> None:
    import torch
    from transformers import AutoTokenizer

    from trl_rm_env import JudgeEnvironment

    torch.set_num_threads(opts["threads"])
    path, max_length = opts["path"], opts["max_length"]
    tokenizer = AutoTokenizer.from_pretrained(path)
    # Batch 0 warms up; batches 1.. are timed, one each: never a batch seen before.
    batches = [hh_batch(tokenizer, opts["prompts"], opts["generations"], index, opts["hh_path"])
               for index in range(1 + opts["repeats"])]  # fmt: skip
    server, measured, tokens = None, None, []
    if "genrm" in method:
        judge, server, measured = genrm_method(method, opts, tokens)
    elif method in ("vLLM offline", "ours: pointwise", "ours: pairwise all+swap"):
        env = JudgeEnvironment(path, max_length=max_length, precision=opts["precision"])  # defaults: vLLM here, logprobs
        if method == "ours: pairwise all+swap":
            env = env.replace(mode="pairwise")
    if "genrm" in method:
        pass
    elif method == "vLLM offline":
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        rendered = {}
        for prompts, completions in batches:  # rendered by the environment, before the clock starts
            env.engine.label_logprobs = lambda p, *a: [[0.0] * len(env.labels)] * len(p)  # render only
            judgements = env.call(prompts, completions).judgements
            rendered[id(prompts)] = [TokensPrompt(prompt_token_ids=j.prompt) for j in judgements]
        llm = env.engine.llm

        def judge(prompts, completions):
            requests = rendered[id(prompts)]
            tokens.append(sum(len(r["prompt_token_ids"]) for r in requests) / len(requests))
            llm.generate(requests, SamplingParams(max_tokens=1, temperature=0.0, logprobs=20), use_tqdm=False)
            return len(requests)
    elif method in ("ours: pointwise", "ours: pairwise all+swap"):

        def judge(prompts, completions):
            judgements = env.call(prompts, completions).judgements
            tokens.append(sum(len(j.prompt) for j in judgements) / len(judgements))
            return len(judgements)
    else:
        server, url = start_vllm_server(path, max_length, opts["precision"])
        measured = [server.pid]
        if method == "ours: pointwise served":
            env = JudgeEnvironment("judge", tokenizer=path, remote_url=url, max_concurrency=256)

            def judge(prompts, completions):
                judgements = asyncio.run(env.call(prompts, completions)).judgements
                tokens.append(sum(len(j.prompt) for j in judgements) / len(judgements))
                return len(judgements)
        else:
            import aiohttp

            from trl_rm_env.judges.templates import POINTWISE, completion_text, prompt_text

            async def reward(prompts, completions, **kwargs):  # what TRL's docs suggest, as a user writes it
                async def one(session, prompt, completion):
                    text = POINTWISE.format(prompt=prompt_text(prompt), completion=completion_text(completion),
                                            max_score=9, answer_format="Reply with the rating alone.")  # fmt: skip
                    body = {"model": "judge", "messages": [{"role": "user", "content": text}], "max_tokens": 8,
                            "temperature": 0.0}  # fmt: skip
                    async with session.post(url + "/v1/chat/completions", json=body) as response:
                        answer = (await response.json())["choices"][0]["message"]["content"] or ""
                    found = NUMBER.search(answer)
                    return float(found.group()) if found else 0.0

                async with aiohttp.ClientSession() as session:
                    return await asyncio.gather(*(one(session, p, c) for p, c in zip(prompts, completions)))

            def judge(prompts, completions):
                asyncio.run(reward(prompts, completions))
                return len(prompts)
    judge(*batches[0])
    tokens.clear()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    if hasattr(judge, "rendering"):
        judge.rendering = 0.0
    start, count = time.perf_counter(), 0
    for prompts, completions in batches[1:]:
        count += judge(prompts, completions)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    seconds = (time.perf_counter() - start) / opts["repeats"]
    if hasattr(judge, "rendering"):  # the rendering is not the floor's work: its generate and parse alone
        seconds = judge.rendering / opts["repeats"]
    peak = peak_memory_mb(measured)
    if server is not None:
        os.killpg(server.pid, 15)
        server.wait(60)
    queue.put({"seconds": seconds, "judgements": count / opts["repeats"], "tokens": sum(tokens) / max(len(tokens), 1),
               "peak_mb": peak})  # fmt: skip


def genrm_method(method: str, opts: dict, tokens: list[float]):
    """`(judge(prompts, completions) -> judgements, server, measured pids)` for a GenRM method (see the docstring)."""
    from trl_rm_env import JudgeEnvironment
    from trl_rm_env.data.messages import reasoning_and_answer
    from trl_rm_env.judges.genrm import comparison_pairs, genrm_messages, parse_genrm_verdict

    path, max_length, new = opts["path"], opts["max_length"], opts["genrm_tokens"]
    common = {"mode": "genrm", "max_new_tokens": new, "parse_retries": 0}
    if method in GENRM_METHODS:
        env = JudgeEnvironment(path, max_length=max_length, precision=opts["precision"], **common)
        if method == "ours: genrm":

            def judge(prompts, completions):
                judgements = env.call(prompts, completions).judgements
                tokens.append(sum(len(j.prompt) for j in judgements) / len(judgements))
                return len(judgements)

            return judge, None, None
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        llm, generate = env.engine.llm, env.engine.generate

        def judge(prompts, completions):  # rendered by the environment, then timed: generate and parse alone
            env.engine.generate = lambda p, *a, **k: [""] * len(p)
            judgements = env.call(prompts, completions).judgements
            env.engine.generate = generate
            requests = [TokensPrompt(prompt_token_ids=j.prompt) for j in judgements]
            start = time.perf_counter()
            outputs = llm.generate(requests, SamplingParams(max_tokens=new, temperature=0.0), use_tqdm=False)
            [parse_genrm_verdict(o.outputs[0].text) for o in outputs]
            tokens.append(sum(len(r["prompt_token_ids"]) for r in requests) / len(requests))
            judge.rendering += time.perf_counter() - start  # noqa: B023 - the timed part only, summed
            return len(requests)

        judge.rendering = 0.0
        return judge, None, None
    server, url = start_vllm_server(path, max_length, opts["precision"])
    if method == "ours: genrm served":
        env = JudgeEnvironment("judge", remote_url=url, remote_input="messages", max_concurrency=256, **common)

        def judge(prompts, completions):
            return len(asyncio.run(env.call(prompts, completions)).judgements)

        return judge, server, [server.pid]
    import aiohttp

    sequential = method.endswith("sequential")

    async def reward(prompts, completions, **kwargs):  # as a user writes it: circular pairs of each group, tie-breaker
        groups: dict[str, list[int]] = {}
        for i, prompt in enumerate(prompts):
            groups.setdefault(repr(prompt), []).append(i)
        answers = [reasoning_and_answer(c)[1] for c in completions]
        jobs = [(g[a], g[b]) for g in groups.values() if len(g) > 1 for a, b in comparison_pairs("circular", len(g))]

        async def one(session, i, j):
            body = {"model": "judge", "messages": genrm_messages(prompts[i], answers[i], answers[j]),
                    "max_tokens": new, "temperature": 0.0}  # fmt: skip
            async with session.post(url + "/v1/chat/completions", json=body) as response:
                text = (await response.json())["choices"][0]["message"]["content"] or ""
            return parse_genrm_verdict(text)

        connector = aiohttp.TCPConnector(limit=256)
        async with aiohttp.ClientSession(connector=connector) as session:
            if sequential:
                verdicts = [await one(session, i, j) for i, j in jobs]
            else:
                verdicts = await asyncio.gather(*(one(session, i, j) for i, j in jobs))
        received: dict[int, list[float]] = {}
        for (i, j), (s1, s2, r) in zip(jobs, verdicts):
            if s1 == s2:
                s1, s2 = s1 + 3.5 - r, s2 - 3.5 + r
            received.setdefault(i, []).append(s1)
            received.setdefault(j, []).append(s2)
        return [sum(v) / len(v) if (v := received.get(i)) else 3.0 for i in range(len(prompts))], len(jobs)

    def judge(prompts, completions):
        return asyncio.run(reward(prompts, completions))[1]

    return judge, server, [server.pid]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=4, help="B: prompts per batch")
    parser.add_argument("--generations", type=int, default=8, help="G: completions per prompt")
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=2, help="timed calls, each on a new batch")
    parser.add_argument("--max-length", type=int, default=4096)
    parser.add_argument("--genrm-tokens", type=int, default=64, help="GenRM methods: most tokens the GenRM writes")
    parser.add_argument("--methods", default=None, help="comma-separated subset of: " + ", ".join(METHODS))
    parser.add_argument("--precision", choices=["fp32", "bf16"], default="fp32", help="the judge's dtype")
    parser.add_argument("--hh-path", default=str(HH_PATH), help="hh-rlhf harmless-base test .jsonl.gz")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds a method may take before it fails")
    parser.add_argument("--threads", type=int, default=max(1, os.cpu_count() or 2), help="torch's CPU threads")
    args = parser.parse_args()
    methods = [m.strip() for m in args.methods.split(",") if m.strip()] if args.methods else METHODS
    if unknown := [m for m in methods if m not in METHODS]:
        raise SystemExit(f"unknown method(s) {unknown}; choose from {METHODS}")
    opts = {"prompts": args.prompts, "generations": args.generations, "repeats": args.repeats,
            "max_length": args.max_length, "path": save_judge(args.layers), "precision": args.precision,
            "hh_path": args.hh_path, "threads": args.threads, "genrm_tokens": args.genrm_tokens}  # fmt: skip
    ctx = mp.get_context("spawn")
    results = {}
    for method in methods:
        results[method] = r = run_in_child(ctx, run_one, (method, opts), args.timeout)[0]
        print(f"  done: {method} " + (f"(error: {r['error']})" if "error" in r else f"({r['seconds']:.2f} s a call)"),
              file=sys.stderr)
        time.sleep(3)
    n = args.prompts * args.generations
    def floor_of(method: str) -> dict | None:
        found = results.get("vLLM offline: genrm" if "genrm" in method else "vLLM offline")
        return None if found is None or "error" in found else found

    header = ["method", "judgements/call", "judgements/s", "completions/s", "tokens/judgement", "s/call",
              "vs vLLM offline (compl/s)", "vs hand-written gathered", "peak MB"]  # fmt: skip
    gathered = results.get("hand-written genrm: gathered")
    gathered = None if gathered is None or "error" in gathered else gathered
    rows = []
    for method, r in results.items():
        if "error" in r:
            rows.append([method, "error: " + short_error(r["error"])] + ["-"] * (len(header) - 2))
            continue
        base = floor_of(method)
        versus = gathered if "genrm" in method and "offline" not in method else None
        rows.append([method, f"{r['judgements']:.0f}", f"{r['judgements'] / r['seconds']:.2f}", f"{n / r['seconds']:.2f}",
                     f"{r['tokens']:.0f}" if r["tokens"] else "-", f"{r['seconds']:.2f}",
                     f"{base['seconds'] / r['seconds']:.2f}x" if base else "-",
                     f"{versus['seconds'] / r['seconds']:.2f}x" if versus else "-", f"{r['peak_mb']:.0f}"])  # fmt: skip
    import torch

    device = f"cuda ({torch.cuda.get_device_name()})" if torch.cuda.is_available() else "cpu"
    print(f"\nhh-rlhf, {args.prompts} prompts x {args.generations} answers, judge: Qwen3 0.6B width, {args.layers} "
          f"layers, {args.precision}; device {device}; {args.repeats} timed calls after 1 warm-up\n")
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
    print("| " + " | ".join(h.ljust(w) for h, w in zip(header, widths)) + " |")
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for row in rows:
        print("| " + " | ".join(c.ljust(w) for c, w in zip(row, widths)) + " |")


if __name__ == "__main__":
    main()
