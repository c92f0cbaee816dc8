"""GRPO reward scoring speed: TRL's model-reward path vs `RewardModelEnvironment` (defaults, plain, shared).

    python benchmarks/bench_score.py                          # B=4 prompts x G=8, prompts 64/256/1024, completions 64/256
    python benchmarks/bench_score.py --long                   # one group of G=8 behind 4k and 16k prompts, wide model
    python benchmarks/bench_score.py --prompts 8 --budget 16384 --repeats 5 --cases 1024x64

"TRL" is the exact code of `GRPOTrainer._calculate_rewards` for a reward *model* (trl 1.16): render every
prompt+completion with the chat template, tokenize all B*G texts in one right-padded batch, one forward. Ours runs the
same model on the same texts through `RewardModelEnvironment`: `defaults` (nothing set but the token budget:
`prefix_sharing="auto"`), `plain` (`prefix_sharing=False`: token-budget micro-batches, each prompt repeated) and
`shared` (`prefix_sharing=True`: each group's prompt encoded once, the completions against its KV cache). Each
configuration runs in a fresh child process so its peak memory (CUDA: max allocated; CPU: peak RSS) is its own.

Models (offline Qwen3, random init, fp32, SDPA): `small` = 4 layers, hidden 256, 4 heads x 64 (2 KV heads), MLP 512;
`wide` = Qwen3-0.6B's width (hidden 1024, 16 heads x 128, 8 KV heads, MLP 3072) with `--layers` layers (default 1,
so a 16k-token case runs in minutes on 2 CPU cores; every method's cost scales with the layer count alike).

The FLOP floor of a case is the work on its unique tokens: each prompt once, each completion once, each completion's
attention over its prompt and itself (causal). `floor %` = (floor FLOPs / this machine's fp32 matmul rate, the best
of the rates measured at the start and right after the method's own runs) / measured time: how close a method gets
to doing only the necessary work at matmul speed (on a shared machine the rate moves with the load).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import random
import resource
import statistics
import subprocess
import sys
import time

from floor import group_floor, matmul_gflops  # benchmarks/floor.py (the script's folder is on sys.path)

WORDS = "the a model reward answer question because people often think about why how when where it is not".split()
MODELS = {
    "small": dict(num_hidden_layers=4, hidden_size=256, intermediate_size=512, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=64),
    "wide": dict(hidden_size=1024, intermediate_size=3072, num_attention_heads=16, num_key_value_heads=8, head_dim=128),
}
METHODS = ["TRL GRPO model reward", "ours: defaults", "ours: plain", "ours: shared"]


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


def peak_memory_mb() -> float:
    import torch

    if torch.cuda.is_available():
        return torch.cuda.max_memory_allocated() / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_one(method: str, case: dict, opts: dict, queue) -> None:
    import torch
    from trl.data_utils import apply_chat_template

    from trl_rm_env import RewardModelEnvironment
    from trl_rm_env.testing import build_tiny_reward_model, build_tiny_tokenizer

    torch.set_num_threads(opts["threads"])
    device = "cuda" if torch.cuda.is_available() else "cpu"
    tokenizer = build_tiny_tokenizer()
    tokenizer.model_max_length = 10**6
    model = build_tiny_reward_model(
        tokenizer, seed=0, attn_implementation="sdpa", max_position_embeddings=65536, **opts["model_kwargs"]
    ).to(device)
    prompts, completions = make_batch(tokenizer, case["prompts"], opts["generations"], case["prompt"], case["completion"])
    budget = max(opts["budget"], case["prompt"] + case["completion"] + 256)  # a whole sequence fits one pass

    if method == "TRL GRPO model reward":
        def score():
            texts = [apply_chat_template({"messages": p + c}, tokenizer)["text"] for p, c in zip(prompts, completions)]
            inputs = tokenizer(text=texts, return_tensors="pt", padding=True, padding_side="right",
                               add_special_tokens=False).to(device)
            with torch.inference_mode():
                return model(**inputs).logits[:, 0].float().cpu(), inputs["input_ids"].numel()
    else:
        mode = {"ours: defaults": "auto", "ours: plain": False, "ours: shared": True}[method]
        kwargs = {} if mode == "auto" else {"prefix_sharing": mode}
        env = RewardModelEnvironment(model, tokenizer, device=device, max_tokens_per_batch=budget, **kwargs)

        def score():
            rewards = torch.tensor(env(prompts, completions))
            return rewards, sum(r * n for r, n in env.scorer.last_batch_shapes)

    if case["warmup"] and case["prompt"] > 2048:  # long case: warm up (threads, allocator, kernels) on a short batch
        full = (prompts, completions)
        prompts, completions = make_batch(tokenizer, case["prompts"], opts["generations"], 256, 64, seed=1)
        score()
        prompts, completions = full
    else:
        for _ in range(case["warmup"]):
            score()
    times = []
    for _ in range(case["repeats"]):
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        scores, positions = score()
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    queue.put({"scores": scores.tolist(), "seconds": statistics.median(times), "positions": positions,
               "peak_mb": peak_memory_mb(), "gflops": matmul_gflops(opts["threads"])})


def run_table(cases: list[dict], opts: dict, methods: list[str]) -> list[list[str]]:
    from trl_rm_env.testing import build_tiny_tokenizer, tiny_qwen3_config

    tokenizer = build_tiny_tokenizer()
    tokenizer.model_max_length = 10**6
    config = tiny_qwen3_config(tokenizer, **opts["model_kwargs"]).to_dict()
    rate = opts["gflops"] * 1e9
    ctx = mp.get_context("spawn")
    rows = []
    for case in cases:
        results = {}
        for method in methods:
            if method == METHODS[0] and case["prompt"] > opts["trl_max_prompt"]:
                continue
            queue = ctx.Queue()
            proc = ctx.Process(target=run_one, args=(method, case, opts, queue))
            proc.start()
            results[method] = queue.get()
            proc.join()
            time.sleep(opts["settle"])  # let the previous child's memory go back before the next one starts
            print(f"  done: {case['prompt']}x{case['completion']} {method} ({results[method]['seconds']:.2f} s)",
                  file=sys.stderr)
        prompts, completions = make_batch(tokenizer, case["prompts"], opts["generations"], case["prompt"],
                                          case["completion"])
        unique, flops = floor_flops(tokenizer, prompts, completions, config)
        base_name = METHODS[0] if METHODS[0] in results else "ours: plain"
        base = results[base_name]
        n = case["prompts"] * opts["generations"]
        for method in methods:
            if method not in results:
                continue
            r = results[method]
            diff = max(abs(a - b) for a, b in zip(r["scores"], base["scores"]))
            rows.append([
                f"{case['prompt']}/{case['completion']}", method, f"{n / r['seconds']:.2f}",
                f"{base['seconds'] / r['seconds']:.2f}x", f"{results['ours: plain']['seconds'] / r['seconds']:.2f}x",
                str(r["positions"]), str(unique), f"{flops / 1e9:.0f}",
                f"{100 * flops / (max(rate, r['gflops'] * 1e9)) / r['seconds']:.0f}%",
                f"{r['peak_mb']:.0f}", "-" if method == base_name else f"{diff:.1e}",
            ])
    return rows


def print_table(rows: list[list[str]], base: str) -> None:
    header = ["prompt/compl", "method", "compl/s", f"vs {base}", "vs plain", "token positions", "unique tokens",
              "floor GFLOP", "floor %", "peak MB", f"max \\|score - {base}\\|"]  # pipes escaped for Markdown
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
    parser.add_argument("--budget", type=int, default=8192,
                        help="our max_tokens_per_batch (raised to fit one whole sequence of a case)")
    parser.add_argument("--repeats", type=int, default=None, help="timed calls, median (default 3; --long: 1)")
    parser.add_argument("--warmup", type=int, default=1,
                        help="untimed calls first (prompts over 2048 tokens: one call on a 256-token batch instead)")
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
    parser.add_argument("--methods", default=",".join(METHODS), help="comma-separated subset of the methods")
    parser.add_argument("--settle", type=float, default=5.0,
                        help="seconds between child processes (the run after TRL's large one was measured slower)")
    args = parser.parse_args()
    long = args.long
    model = args.model or ("wide" if long else "small")
    opts = {
        "generations": args.generations, "budget": args.budget, "threads": args.threads,
        "model_kwargs": model_kwargs(model, args.layers),
        "trl_max_prompt": args.trl_max_prompt or (4096 if long else 10**9), "settle": args.settle,
    }
    spec = args.cases or ("4096x200,16384x200" if long else "64x64,256x64,256x256,1024x64,1024x256")
    cases = []
    for item in spec.split(","):
        prompt_len, completion_len = (int(x) for x in item.split("x"))
        cases.append({"prompt": prompt_len, "completion": completion_len,
                      "prompts": args.prompts or (1 if long else 4),
                      "repeats": args.repeats or (1 if long else 3),
                      "warmup": args.warmup})
    methods = [m.strip() for m in args.methods.split(",") if m.strip() in METHODS]  # in the order given
    if "ours: plain" not in methods:
        methods.append("ours: plain")  # the "vs plain" column
    opts["gflops"] = matmul_gflops(args.threads)
    rows = run_table(cases, opts, methods)
    import torch

    device = "cuda" if torch.cuda.is_available() else f"cpu x{args.threads} threads"
    load = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    layers = opts["model_kwargs"]["num_hidden_layers"]
    print(f"\nModel: {model} ({layers} layers, hidden {opts['model_kwargs']['hidden_size']}); B={cases[0]['prompts']} "
          f"prompt(s) x G={args.generations}; our token budget {args.budget} (or one whole sequence); median of "
          f"{cases[0]['repeats']} after {cases[0]['warmup']} warm-up; device {device}; matmul {opts['gflops']:.0f} "
          f"GFLOP/s; peak MB is the process's peak (CPU: RSS, model included)\n"
          f"Date: {time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC; load: {load}\n")
    print_table(rows, "TRL" if METHODS[0] in methods and all(c["prompt"] <= opts["trl_max_prompt"] for c in cases)
                else "plain")


if __name__ == "__main__":
    main()
