"""GRPO reward scoring speed: TRL's model-reward path, ours on transformers and on vLLM, raw vLLM, and served.

    python benchmarks/bench_score.py                          # B=4 prompts x G=8, prompts 64/256/1024, completions 64/256
    python benchmarks/bench_score.py --long                   # one group of G=8 behind 4k and 16k prompts, wide model
    python benchmarks/bench_score.py --data hh --model wide --layers 8   # 4 hh-rlhf contexts x 8 answers, 0.6B width
    python benchmarks/bench_score.py --prompts 8 --budget 16384 --repeats 5 --cases 1024x64
    python benchmarks/bench_score.py --data hh --model wide --layers 28 --precision bf16 --budget auto \
        --methods "TRL GRPO model reward,ours: hf,ours: packed"       # on a GPU

"TRL" is the exact code of `GRPOTrainer._calculate_rewards` for a reward *model* (trl 1.16): render every
prompt+completion with the chat template, tokenize all B*G texts in one right-padded batch, one forward. Ours runs the
same model (saved once, loaded by every method) on the same conversations through `RewardModelEnvironment`:
`defaults` (nothing set but the token budget: `engine="auto"`, which is vLLM where it is installed, and
`prefix_sharing="auto"`), `hf` (`engine="hf"`: transformers here, KV-cache prompt sharing where it pays), `plain`
(`engine="hf", prefix_sharing=False`: token-budget micro-batches, each prompt repeated), `shared` (`engine="hf",
prefix_sharing=True`), `packed` (`engine="hf", prefix_sharing="packed"`, opt-in through `--methods`) and `vllm`
(`engine="vllm"`). A method that fails prints its error in its row. `vLLM offline` is vLLM alone, `LLM(runner="pooling",
convert="classify").classify` on the token ids ours sends it (encoded before the clock starts), with vLLM's own
defaults; `vLLM offline (every core)` with none of the CPU's cores kept for vLLM's scheduler, as our engine sets on
a CPU of few cores (`trl_rm_env.runtime.vllm.cpu_thread_env`). Every call of every method scores a batch it has not
seen (vLLM's prefix cache would serve a repeated one from memory). `served: ...` score
through `RewardModelEnvironment(remote_url=...)` with the RM's tokenizer (token ids) on vLLM's own server started
directly (`vLLM server`), on `trl-rm-env serve --engine vllm` and on `trl-rm-env serve --engine hf` (ours). The
vLLM and served rows need vLLM (`--methods` picks rows; they are left out where it is not installed). On the CPU each
configuration runs in a fresh child process; peak memory is the peak RSS of that process and everything it started,
model included, for served rows the server's processes. On CUDA one child runs every round's methods in turn (max
allocated, reset between them; a method that hangs is killed and the rest go on in a fresh child). `--rounds R` runs
every method R times, interleaved (the order rotated each round; the fp32 reference once): the table gives the
median call's speed and the range.

Models (offline Qwen3, random init, fp32, SDPA): `small` = 4 layers, hidden 256, 4 heads x 64 (2 KV heads), MLP 512;
`wide` = Qwen3-0.6B's width (hidden 1024, 16 heads x 128, 8 KV heads, MLP 3072) with `--layers` layers (default 1,
so a 16k-token case runs in minutes on 2 CPU cores; every method's cost scales with the layer count alike).
`--precision bf16`: every method's model in torch.bfloat16 (TRL's `from_pretrained(dtype=...)`, ours
`precision="bf16"`, vLLM's `dtype`). `--data hh`: B contexts of Anthropic hh-rlhf's harmless-base test (`--hh-path`,
default `../shared/data/hh-rlhf`, multi-turn, 200-850 tokens) and G answers each, taken from the responses of the
following records. `--budget auto` (or 0): ours get no `max_tokens_per_batch` (their defaults size the passes).

The FLOP floor of a case is the work on its unique tokens: each prompt once, each completion once, each completion's
attention over its prompt and itself (causal). `floor %` = (floor FLOPs / this machine's fp32 matmul rate, the best
of the rates measured at the start and right after the method's own runs) / measured time: how close a method gets
to doing only the necessary work at matmul speed (on a shared machine the rate moves with the load). On CUDA the
column is `MFU %`, the same ratio at the device's dense matmul rate in the run's dtype (8192^3 products).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import gzip
import importlib.util
import json
import multiprocessing as mp
import os
import random
import resource
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from floor import (  # benchmarks/floor.py (on sys.path)
    datasheet_tflops,
    fresh_memory,
    group_floor,
    load_line,
    matmul_gflops,
    rate_column,
    run_rounds,
    short_error,
    spread,
)

START = time.monotonic()  # --deadline counts from here

WORDS = "the a model reward answer question because people often think about why how when where it is not".split()
MODELS = {
    "small": dict(num_hidden_layers=4, hidden_size=256, intermediate_size=512, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=64),
    "wide": dict(hidden_size=1024, intermediate_size=3072, num_attention_heads=16, num_key_value_heads=8, head_dim=128),
    "4b": dict(hidden_size=2560, intermediate_size=9728, num_attention_heads=32, num_key_value_heads=8, head_dim=128),
}
METHODS = [
    "TRL GRPO model reward", "ours: defaults", "ours: hf", "ours: plain", "ours: shared", "ours: packed", "ours: vllm",
    "vLLM offline", "vLLM offline (every core)", "served: vLLM server", "served: serve --engine vllm",
    "served: serve --engine hf", "fp32 one at a time",
]  # fmt: skip
PRECISIONS = {"fp32": "float32", "bf16": "bfloat16"}  # --precision: the dtype, by torch's (and vLLM's) name
OPT_IN = {"ours: packed", "fp32 one at a time"}  # left out of the default methods: only through --methods
NEEDS_VLLM = {
    "ours: vllm", "vLLM offline", "vLLM offline (every core)", "served: vLLM server", "served: serve --engine vllm",
}  # fmt: skip
HH_PATH = Path(__file__).resolve().parents[2] / "shared" / "data" / "hh-rlhf" / "harmless-base-test.jsonl.gz"


def model_kwargs(name: str, layers: int | None) -> dict:
    kwargs = dict(MODELS[name])
    if layers is not None or name == "wide":
        kwargs["num_hidden_layers"] = layers or 1
    return kwargs


def text_of_tokens(tokenizer, n: int, rng: random.Random) -> str:
    """Random words with about `n` tokens."""
    words: list[str] = []
    while len(tokenizer(" ".join(words))["input_ids"]) < n:
        words += [rng.choice(WORDS) for _ in range(max(1, (n - len(words)) // 2))]
    while len(tokenizer(" ".join(words))["input_ids"]) > n:
        words.pop()
    return " ".join(words)


def make_batch(tokenizer, prompts: int, generations: int, prompt_len: int, completion_len: int, seed: int = 0):
    rng = random.Random(seed)
    p_list, c_list = [], []
    for _ in range(prompts):
        prompt = [{"role": "user", "content": text_of_tokens(tokenizer, prompt_len, rng)}]
        for _ in range(generations):
            p_list.append(prompt)
            c_list.append([{"role": "assistant", "content": text_of_tokens(tokenizer, completion_len, rng)}])
    return p_list, c_list


@functools.cache
def hh_records(path: str) -> list[dict]:
    """The first 2,000 records of the hh-rlhf file `path`, read once per process."""
    from trl_rm_env.data.loaders import load_rank_records

    with gzip.open(path, "rt") as f:
        rows = [json.loads(line) for line in f][:2000]
    return load_rank_records(rows, data_format="hh", on_invalid="skip", name="hh-rlhf", log=False)[0]


def hh_batch(tokenizer, prompts: int, generations: int, index: int = 0, path: Path | str = HH_PATH):
    """Batch `index`: `prompts` hh-rlhf contexts of 200-850 tokens (the `index`-th such run of them, so batches never
    share a context), each with `generations` answers: the final responses of the records that follow it; read from
    `path` (hh-rlhf's harmless-base test, .jsonl.gz)."""
    path = Path(path)
    if not path.exists():
        raise SystemExit(f"--data hh needs {path}")
    records = hh_records(str(path.resolve()))
    answers = [c["completion"] for r in records for c in r["completions"]]
    p_list, c_list, used, skip = [], [], 0, index * prompts
    for i, record in enumerate(records):
        if len(p_list) == prompts * generations:
            break
        length = len(tokenizer.apply_chat_template(record["context"], tokenize=True, return_dict=False))
        if 200 <= length <= 850 and skip:
            skip -= 1
        elif 200 <= length <= 850:
            for k in range(generations):
                p_list.append(record["context"])
                c_list.append(answers[(2 * i + 2 + used + k) % len(answers)])
            used += generations
    if len(p_list) < prompts * generations:
        raise SystemExit(f"--data hh: fewer than {prompts} contexts of 200-850 tokens in {path}")
    return p_list, c_list


def batch_for(tokenizer, case: dict, opts: dict, index: int = 0):
    """Batch `index` of a case. Every call of a method gets a batch it has not seen (warm-up ones included): vLLM's
    prefix cache keeps whole sequences across calls, and a repeated batch would be read from it, a case GRPO, whose
    completions are new at every step, never meets (measured: 3-4x faster than a fresh batch)."""
    if opts["data"] == "hh":
        return hh_batch(tokenizer, case["prompts"], opts["generations"], index, opts["hh_path"])
    return make_batch(tokenizer, case["prompts"], opts["generations"], case["prompt"], case["completion"], seed=index)


def budget_for(tokenizer, case: dict, opts: dict, prompts, completions) -> int:
    """Our token budget for a case: `--budget` (8192 when `auto`), raised so that one whole sequence fits one pass."""
    from trl_rm_env.tokenization import encode_conversation

    if opts["data"] == "hh":
        longest = max(len(encode_conversation(tokenizer, p, c)) for p, c in zip(prompts, completions))
    else:
        longest = case["prompt"] + case["completion"]
    return max(opts["budget"] or 8192, longest + 256)


def floor_flops(tokenizer, prompts, completions, config: dict) -> tuple[int, float]:
    """(unique tokens, forward FLOPs on them) of a batch: each group's shared token prefix once, each completion's own
    tokens once, causal attention of each completion over its prefix and itself."""
    from trl_rm_env.sharing import shared_prefix_length
    from trl_rm_env.tokenization import encode_conversation

    groups: dict[int, list[list[int]]] = {}
    for p, c in zip(prompts, completions):
        groups.setdefault(id(p), []).append(encode_conversation(tokenizer, p, c))
    return group_floor(
        ((seqs, shared_prefix_length(seqs) if len(seqs) > 1 else 0) for seqs in groups.values()), config
    )


def peak_memory_mb(pids: list[int] | None = None) -> float:
    """CUDA: max allocated of this process. CPU: the peak RSS (VmHWM) of `pids` (default: this process) and every
    process they started, still running, summed."""
    import torch

    if torch.cuda.is_available() and pids is None:
        return torch.cuda.max_memory_allocated() / 2**20
    from trl_rm_env.evaluation.memory import resident_peak_mb

    return resident_peak_mb(pids) or resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_server(method: str, model_dir: str, budget: int, precision: str = "fp32") -> tuple[subprocess.Popen, str]:
    """One of the served configurations, started and ready: (process, URL). vLLM's server gets the KV cache ours
    gives it (`trl-rm-env serve --engine vllm` on CPU): one step plus one sequence."""
    from transformers import AutoConfig

    from trl_rm_env.runtime.vllm import kv_cache_bytes

    port = free_port()
    if method == "served: vLLM server":
        dtype = PRECISIONS[precision]
        kv = kv_cache_bytes(AutoConfig.from_pretrained(model_dir), dtype, 2 * budget)
        command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model_dir,
                   "--runner", "pooling", "--convert", "classify", "--served-model-name", "rm", "--port", str(port),
                   "--dtype", dtype, "--enable-prefix-caching", "--max-model-len", str(budget),
                   "--max-num-batched-tokens", str(budget), "--kv-cache-memory-bytes", str(kv)]  # fmt: skip
    else:
        engine = method.rsplit(" ", 1)[1]
        command = [sys.executable, "-m", "trl_rm_env.recipes.cli", "serve", "--model", model_dir, "--engine", engine,
                   "--served-model-name", "rm", "--port", str(port), "--max-length", str(budget),
                   "--max-tokens-per-batch", str(budget), "--precision", precision]  # fmt: skip
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    return proc, wait_until_healthy(proc, f"http://127.0.0.1:{port}", method)


def wait_until_healthy(proc: subprocess.Popen, url: str, what: str, timeout: float = 900) -> str:
    """`url` once `GET /health` answers 200; a server that ends or is not ready within `timeout` s stops the run."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{what}: the server ended with status {proc.returncode}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as response:
                if response.status == 200:
                    return url
        except OSError:
            pass
        time.sleep(0.5)
    raise SystemExit(f"{what}: the server was not ready in {timeout:.0f} s (waited for GET {url}/health)")


def run_many(methods: list[str], case: dict, opts: dict, queue) -> None:
    """Score each configuration of `methods` in turn in this process (CUDA: peak memory reset between them); put the
    measurements of each on `queue` as it finishes (`{"error"}` for one that fails)."""
    for method in methods:
        fresh_memory()
        results: list[dict] = []
        try:
            score_one(method, case, opts, results)
            queue.put(results[0])
        except BaseException as err:  # the row shows the error; the other methods still run
            import traceback

            traceback.print_exc()
            queue.put({"error": f"{type(err).__name__}: {err}"})


def score_one(method: str, case: dict, opts: dict, results: list) -> None:
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer
    from trl.data_utils import apply_chat_template

    from trl_rm_env import RewardModelEnvironment
    from trl_rm_env.tokenization import encode_conversation

    torch.set_num_threads(opts["threads"])
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model_dir = opts["model_dir"]
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    # Warm-up batches first, then the timed ones; the same sequence of batches for every method.
    batches = [batch_for(tokenizer, case, opts, index) for index in range(case["warmup"] + case["repeats"])]
    if method == "fp32 one at a time":  # a reference, not a contender: its timed batches alone, no warm-up
        case = {**case, "warmup": 0}
        batches = batches[-case["repeats"]:]
    if case["warmup"] and case["prompt"] > 2048 and opts["data"] != "hh":  # long case: warm up on short batches
        batches[: case["warmup"]] = [
            make_batch(tokenizer, case["prompts"], opts["generations"], 256, 64, seed=1000 + index)
            for index in range(case["warmup"])
        ]
    budget = max(budget_for(tokenizer, case, opts, *batch) for batch in batches)
    server, measured = None, None  # a served configuration's process (peak memory: its tree)

    if method == "fp32 one at a time":  # the exactness reference: fp32 weights, each sequence alone, no padding
        model = AutoModelForSequenceClassification.from_pretrained(
            model_dir, attn_implementation="sdpa", dtype=torch.float32
        ).to(device)

        def score(prompts, completions):
            with torch.inference_mode():
                out = [model(input_ids=torch.tensor([encode_conversation(tokenizer, p, c)], device=device)).logits[0, 0]
                       for p, c in zip(prompts, completions)]
            return torch.stack(out).float().cpu(), None
    elif method == "TRL GRPO model reward":
        model = AutoModelForSequenceClassification.from_pretrained(
            model_dir, attn_implementation="sdpa", dtype=getattr(torch, PRECISIONS[opts["precision"]])
        ).to(device)

        def score(prompts, completions):
            texts = [apply_chat_template({"messages": p + c}, tokenizer)["text"] for p, c in zip(prompts, completions)]
            inputs = tokenizer(text=texts, return_tensors="pt", padding=True, padding_side="right",
                               add_special_tokens=False).to(device)
            with torch.inference_mode():
                return model(**inputs).logits[:, 0].float().cpu(), inputs["input_ids"].numel()
    elif method.startswith("vLLM offline"):
        from vllm import LLM, PoolingParams
        from vllm.inputs import TokensPrompt

        from trl_rm_env.runtime.vllm import kv_cache_bytes

        config = AutoModelForSequenceClassification.from_pretrained(model_dir).config
        if "every core" in method:  # what our engine sets on a CPU of few cores (`cpu_thread_env`)
            os.environ["VLLM_CPU_NUM_OF_RESERVED_CPU"] = "0"
        dtype = PRECISIONS[opts["precision"]]
        llm = LLM(model=model_dir, runner="pooling", convert="classify", dtype=dtype, enable_prefix_caching=True,
                  max_model_len=budget, max_num_batched_tokens=budget,
                  kv_cache_memory_bytes=kv_cache_bytes(config, dtype, 2 * budget), seed=0)  # fmt: skip
        encoded = {  # encoded before the clock starts
            id(batch[0]): [TokensPrompt(prompt_token_ids=encode_conversation(tokenizer, p, c)) for p, c in zip(*batch)]
            for batch in batches
        }

        def score(prompts, completions):
            ids = encoded[id(prompts)]
            out = llm.classify(ids, pooling_params=PoolingParams(use_activation=False), use_tqdm=False)
            return torch.tensor([o.outputs.probs[0] for o in out]), None
    elif method.startswith("served: "):
        server, url = start_server(method, model_dir, budget, opts["precision"])
        measured = [server.pid]
        env = RewardModelEnvironment("rm", remote_url=url, tokenizer=model_dir, max_concurrency=256)

        def score(prompts, completions):
            return torch.tensor(asyncio.run(env(prompts, completions))), None
    else:
        kwargs = {"engine": "hf", "max_tokens_per_batch": int(method.rsplit(" ", 1)[1])} if method.startswith(
            "ours: budget ") else {
            "ours: defaults": {},
            "ours: hf": {"engine": "hf"},
            "ours: plain": {"engine": "hf", "prefix_sharing": False},
            "ours: shared": {"engine": "hf", "prefix_sharing": True},
            "ours: packed": {"engine": "hf", "prefix_sharing": "packed"},
            "ours: vllm": {"engine": "vllm"},
        }[method]
        if opts["budget"] and "max_tokens_per_batch" not in kwargs:  # `--budget auto`: our defaults size the passes
            kwargs["max_tokens_per_batch"] = budget
        env = RewardModelEnvironment(model_dir, device=device, precision=opts["precision"], **kwargs)
        ran: list[int] = []  # transformers: the padded positions of each forward pass (every pass embeds its ids)
        if isinstance(getattr(env.scorer.engine, "model", None), torch.nn.Module):
            env.scorer.engine.model.get_input_embeddings().register_forward_hook(
                lambda module, args, out: ran.append(out.shape[0] * out.shape[1]))

        def score(prompts, completions):
            ran.clear()
            rewards = torch.tensor(env(prompts, completions))
            return rewards, sum(ran) if ran else None  # vLLM: none

    try:
        for batch in batches[: case["warmup"]]:
            score(*batch)
        times, scores, positions = [], [], 0
        for prompts, completions in batches[case["warmup"] :]:
            if device == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            batch_scores, batch_positions = score(prompts, completions)
            if device == "cuda":
                torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
            scores += batch_scores.tolist()
            if batch_positions is None:  # vLLM and servers: the tokens sent (their prefix caching computes fewer)
                batch_positions = sum(len(encode_conversation(tokenizer, p, c)) for p, c in zip(prompts, completions))
            positions += batch_positions
        results.append({"scores": scores, "seconds": sum(times) / len(times), "positions": positions // len(times),
                        "peak_mb": peak_memory_mb(measured),
                        "gflops": matmul_gflops(opts["threads"], opts["precision"])})
    finally:
        if server is not None:
            os.killpg(server.pid, signal.SIGTERM)
            server.wait(60)
        if method.startswith("vLLM offline"):  # a spawned child joins its children at exit: stop vLLM's first
            llm.llm_engine.engine_core.shutdown()


def save_model(opts: dict) -> str:
    """The benchmark's reward model (random init from seed 0) and tokenizer, saved once for every method."""
    from trl_rm_env.tiny_models import build_tiny_reward_model, build_tiny_tokenizer

    tokenizer = build_tiny_tokenizer()
    tokenizer.model_max_length = 10**6
    model = build_tiny_reward_model(
        tokenizer, seed=0, attn_implementation="sdpa", max_position_embeddings=65536, **opts["model_kwargs"]
    )
    path = tempfile.mkdtemp(prefix="bench-score-rm-")
    model.save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)
    return path


ONCE = {"fp32 one at a time"}
"""Methods run in the first round only: the exactness reference, not a contender."""


def run_table(cases: list[dict], opts: dict, methods: list[str]) -> tuple[list[list[str]], str]:
    """The table's rows, and the name of the method the speed-ups and score differences are against (`TRL`,
    `plain`, or both when the cases differ). Every method runs `opts["rounds"]` times, interleaved (`run_rounds`: on
    CUDA one child for all rounds, its methods in turn; on the CPU one child per method and round); a row shows the
    median call time's speed and the range."""
    from transformers import AutoTokenizer

    from trl_rm_env.tiny_models import tiny_qwen3_config

    opts["model_dir"] = save_model(opts)
    tokenizer = AutoTokenizer.from_pretrained(opts["model_dir"])
    config = tiny_qwen3_config(tokenizer, **opts["model_kwargs"]).to_dict()
    rate = opts["gflops"] * 1e9
    peak = opts.get("peak_tflops")
    ctx = mp.get_context("spawn")
    import torch

    cuda = torch.cuda.is_available()
    rows, bases = [], set()
    for case in cases:
        wanted = [m for m in methods if not (m == METHODS[0] and case["prompt"] > opts["trl_max_prompt"])]

        def log(method, r, case=case):
            time.sleep(0 if cuda else opts["settle"])  # CPU: let the last child's memory go back before the next
            print(f"  done: {case_name(case, opts)} {method} " + (f"(error: {r['error']})" if "error" in r else
                  f"({r['seconds']:.3f} s a call, peak {r['peak_mb']:.0f} MB)"), file=sys.stderr)

        once = [m for m in wanted if m in ONCE]
        rest = [m for m in wanted if m not in ONCE]
        results = run_rounds(ctx, run_many, once, 1, (case, opts), opts["timeout"], cuda, log,
                             opts["deadline"]) if once else {}
        results |= run_rounds(ctx, run_many, rest, opts["rounds"], (case, opts), opts["timeout"], cuda, log,
                              opts["deadline"])
        timed = [batch_for(tokenizer, case, opts, i) for i in range(case["warmup"], case["warmup"] + case["repeats"])]
        floors = [floor_flops(tokenizer, *batch, config) for batch in timed]  # per batch, averaged like the times
        unique, flops = sum(u for u, _ in floors) // len(floors), sum(f for _, f in floors) / len(floors)
        ok = {m: [r for r in rs if "error" not in r] for m, rs in results.items()}
        ok = {m: rs for m, rs in ok.items() if rs}
        median = {m: statistics.median(r["seconds"] for r in rs) for m, rs in ok.items()}
        base_name = METHODS[0] if METHODS[0] in ok else "ours: plain"
        bases.add("TRL" if base_name == METHODS[0] else "plain")
        first = {m: rs[0] for m, rs in ok.items()}
        base, reference = first.get(base_name), first.get("fp32 one at a time")
        n = case["prompts"] * opts["generations"]
        for method in wanted:
            if method not in ok:
                error = next((r["error"] for r in results.get(method, []) if "error" in r), "no run")
                rows.append([case_name(case, opts), method, "error: " + short_error(error)] + ["-"] * 10)
                continue
            r, seconds = first[method], median[method]
            _, speed = spread([n / x["seconds"] for x in ok[method]])
            if len(ok[method]) < len(results[method]):
                speed += f", {len(results[method]) - len(ok[method])} failed"
            vs = {k: f"{median[k] / seconds:.2f}x" if k in median else "-"
                  for k in (base_name, "ours: plain", "vLLM offline")}
            diff = max(abs(a - b) for a, b in zip(r["scores"], base["scores"])) if base else float("nan")
            best_rate = max([rate] + [x["gflops"] * 1e9 for x in ok[method]])
            rows.append([
                case_name(case, opts), method, speed, vs[base_name], vs["ours: plain"], vs["vLLM offline"],
                str(r["positions"]), str(unique), f"{flops / 1e9:.0f}",
                f"{100 * flops / best_rate / seconds:.0f}%",
                f"{100 * flops / (peak * 1e12) / seconds:.0f}%" if peak else "-",
                f"{max(x['peak_mb'] for x in ok[method]):.0f}", "-" if method == base_name else f"{diff:.1e}",
                f"{max(abs(a - b) for a, b in zip(r['scores'], reference['scores'])):.1e}" if reference else "-",
            ])
    return rows, " or ".join(sorted(bases, reverse=True))


def budget_arg(value: str) -> int:
    """`--budget`: a token count, or `auto` / 0 (none passed: 0)."""
    return 0 if value.strip().lower() == "auto" else int(value)


def case_name(case: dict, opts: dict) -> str:
    return "hh-rlhf" if opts["data"] == "hh" else f"{case['prompt']}/{case['completion']}"


def print_table(rows: list[list[str]], base: str) -> None:
    header = ["prompt/compl", "method", "compl/s: median (min-max)", f"vs {base}", "vs plain", "vs vLLM",
              "token positions", "unique tokens", "floor GFLOP", rate_column() + " (measured rate)",
              "MFU % (datasheet)", "peak MB", f"max \\|score - {base}\\|",
              "max \\|score - fp32 ref\\|"]  # pipes escaped for Markdown
    if all(row[10] == "-" for row in rows):  # no datasheet peak (CPU, fp32)
        header, rows = header[:10] + header[11:], [row[:10] + row[11:] for row in rows]
    if all(row[5] == "-" for row in rows):  # vLLM not run
        header, rows = header[:5] + header[6:], [row[:5] + row[6:] for row in rows]
    if base == "plain":  # TRL not run: "vs plain" would be there twice
        header, rows = header[:4] + header[5:], [row[:4] + row[5:] for row in rows]
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
    print("| " + " | ".join(h.ljust(w) for h, w in zip(header, widths)) + " |")
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for row in rows:
        print("| " + " | ".join(c.ljust(w) for c, w in zip(row, widths)) + " |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=None, help="B: prompts per batch (default 4; --long: 1)")
    parser.add_argument("--generations", type=int, default=8, help="G: completions per prompt")
    parser.add_argument("--budget", type=budget_arg, default=8192,
                        help="our max_tokens_per_batch (raised to fit one whole sequence of a case); auto or 0: "
                        "none passed, our defaults size the passes")
    parser.add_argument("--rounds", type=int, default=1,
                        help="runs of every method, interleaved (the order rotated each round; the fp32 reference "
                        "once); the table shows the median call's speed and the range")
    parser.add_argument("--repeats", type=int, default=None,
                        help="timed calls, each on a new batch of the case; the mean (default 3; --long: 1)")
    parser.add_argument("--warmup", type=int, default=1,
                        help="untimed calls first, on batches of their own (prompts over 2048 tokens: 256-token ones)")
    parser.add_argument("--threads", type=int, default=max(1, os.cpu_count() or 2))
    parser.add_argument("--long", action="store_true", help="the long-context suite: --model wide, one group")
    parser.add_argument("--model", choices=sorted(MODELS), default=None, help="default: small (--long: wide)")
    parser.add_argument("--layers", type=int, default=None, help="layers of the model (wide default: 1)")
    parser.add_argument("--cases", default=None,
                        help="prompt x completion token lengths (default 64x64,256x64,256x256,1024x64,1024x256; "
                        "--long: 4096x200,16384x200)")
    parser.add_argument("--trl-max-prompt", type=int, default=None,
                        help="skip TRL's path above this prompt length (default: never; --long: 4096, its one padded "
                        "batch of 16k-token rows takes minutes here)")
    parser.add_argument("--methods", default=None,
                        help="comma-separated subset of the methods (default: all; without vLLM, those that need none)")
    parser.add_argument("--data", choices=["synthetic", "hh"], default="synthetic",
                        help="synthetic prompts of the --cases lengths, or hh-rlhf contexts and answers (one case)")
    parser.add_argument("--settle", type=float, default=5.0,
                        help="seconds between child processes (the run after TRL's large one was measured slower)")
    parser.add_argument("--precision", choices=sorted(PRECISIONS), default="fp32", help="every method's model dtype")
    parser.add_argument("--hh-path", type=Path, default=HH_PATH, help="hh-rlhf harmless-base test .jsonl.gz (--data hh)")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds a method may take before it fails")
    parser.add_argument("--deadline", type=float, default=None,
                        help="seconds from the start for the whole benchmark: then the method running is stopped, "
                        "none starts, and the table shows what finished (the others as errors)")
    args = parser.parse_args()
    long = args.long
    model = args.model or ("wide" if long else "small")
    opts = {
        "generations": args.generations, "budget": args.budget, "threads": args.threads,
        "model_kwargs": model_kwargs(model, args.layers),
        "trl_max_prompt": args.trl_max_prompt or (4096 if long else 10**9), "settle": args.settle,
        "data": args.data, "precision": args.precision, "hh_path": str(args.hh_path), "timeout": args.timeout,
        "deadline": START + args.deadline if args.deadline else None,
        "rounds": args.rounds,
    }
    spec = args.cases or ("4096x200,16384x200" if long else "64x64,256x64,256x256,1024x64,1024x256")
    if args.data == "hh":
        spec = "0x0"  # one case: the lengths are the data's
    cases = []
    for item in spec.split(","):
        prompt_len, completion_len = (int(x) for x in item.split("x"))
        cases.append({"prompt": prompt_len, "completion": completion_len,
                      "prompts": args.prompts or (1 if long else 4),
                      "repeats": args.repeats or (1 if long else 3),
                      "warmup": args.warmup})
    if args.methods is None:
        have_vllm = importlib.util.find_spec("vllm") is not None
        methods = [m for m in METHODS if (have_vllm or m not in NEEDS_VLLM) and m not in OPT_IN]
    else:
        methods = [m.strip() for m in args.methods.split(",") if m.strip()]  # in the order given
        if unknown := [m for m in methods if m not in METHODS and not m.startswith("ours: budget ")]:
            raise SystemExit(f"unknown method(s) {unknown}; choose from {METHODS}")
    if "ours: plain" not in methods:
        methods.append("ours: plain")  # the "vs plain" column
    opts["gflops"] = matmul_gflops(args.threads, args.precision)
    import torch

    if torch.cuda.is_available() and args.precision == "bf16":
        opts["peak_tflops"] = datasheet_tflops(torch.cuda.get_device_name())
    rows, base = run_table(cases, opts, methods)

    device = f"cuda ({torch.cuda.get_device_name()})" if torch.cuda.is_available() else f"cpu x{args.threads} threads"
    budget = f"our token budget {args.budget} (or one whole sequence)" if args.budget else "our token budget: defaults"
    load = load_line()
    layers = opts["model_kwargs"]["num_hidden_layers"]
    data = "hh-rlhf contexts and answers" if args.data == "hh" else "synthetic"
    print(f"\nModel: {model} ({layers} layers, hidden {opts['model_kwargs']['hidden_size']}, {args.precision}); "
          f"data: {data}; B={cases[0]['prompts']} prompt(s) x G={args.generations}; {budget}; mean of "
          f"{cases[0]['repeats']} calls after {cases[0]['warmup']} warm-up, each on a new batch, in each of "
          f"{args.rounds} round(s) (methods interleaved, the order rotated each round); device {device}; "
          f"matmul {opts['gflops']:.0f} GFLOP/s ({args.precision if torch.cuda.is_available() else 'fp32'}); peak MB "
          f"is the process's peak (CPU: RSS, model included; CUDA: max allocated)\n"
          f"Date: {time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC; load: {load}\n")
    print_table(rows, base)


if __name__ == "__main__":
    main()
