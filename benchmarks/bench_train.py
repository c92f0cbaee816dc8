"""Reward-model training speed: TRL's `RewardTrainer` vs `RankedRewardTrainer` (defaults, plain, shared).

    python benchmarks/bench_train.py                      # hh-rlhf harmless-base test from ../shared/data if present
    python benchmarks/bench_train.py --steps 30 --batch-size 8 --max-length 1024 --data generated
    python benchmarks/bench_train.py --long --context 4096    # long shared contexts, Qwen3-0.6B width, 1 layer
    python benchmarks/bench_train.py --model wide --layers 28 --precision bf16 --methods "TRL RewardTrainer,ours: packed"
    python benchmarks/bench_train.py --ensemble-heads 8 --rounds 3   # K bootstrapped heads vs one: step time, memory

Every run trains the same offline Qwen3 (random init from one seed) on the same records in the same order (sequential
sampling, so the timed records are known) with the same hyperparameters, each in a fresh child process on the CPU (so
its peak RSS is its own); on CUDA one child runs every round's methods in turn, the model built once, peak memory
reset between them. `--rounds R` runs every method R times, interleaved (the order rotated each round): the table
gives the median pairs/s and the range. `--grad-accum K`: K micro-batches of `--batch-size` pairs per step; `TRL RewardTrainer:
checkpointing` is TRL with its default gradient checkpointing; `ours: one micro-batch` is our defaults with the step's
pairs in one micro-batch. `ours: defaults` sets nothing (`prefix_sharing="auto"`: each record's context once, its completions
against the context's KV cache), `plain` sets `prefix_sharing=False`, `shared` `prefix_sharing=True`, `packed`
(opt-in through `--methods`) `prefix_sharing="packed"`, `ensemble` (with `--ensemble-heads K`) our defaults with
`ensemble_heads=K` (the same backbone, K seeded score heads), `no fused kernels` / `no window packing` our defaults
with `fused_kernels=False` / `window_packing=False` (each piece's share; both are on by default only on CUDA under the
packed layout). `TRL RewardTrainer: Liger` is TRL with `use_liger_kernel=True` and Liger's loss kernels off (its
default `fused_linear_cross_entropy` replaces a classifier's forward): TRL with the kernels our defaults use on CUDA.
A method that fails prints its error in its row. The table shows
pairs/s over the timed steps (after one warm-up step), tokens through the model (padded positions and real tokens)
against the unique tokens of the data, the FLOP floor of the timed steps (forward + backward, 3x the forward FLOPs of
the unique tokens: context once, each completion once, each completion's causal attention over its context and itself)
and `floor %` (floor FLOPs at this machine's measured matmul rate, the best of the rates measured at the start and
right after the run's own steps / measured time), peak memory (CUDA: max allocated; CPU: peak RSS of the process), and
the largest per-step loss difference from TRL. On CUDA the `floor %` column is `MFU %`: the same ratio at the
device's dense matmul rate in the run's dtype (8192^3 products, `floor.cuda_matmul_gflops`). `--precision bf16`:
every method's model in torch.bfloat16 and `bf16=True` in its training arguments. Data: Anthropic hh-rlhf harmless-base test (real multi-turn
conversations, long shared context) when `--hh-path` (default `../shared/data/hh-rlhf/...`) exists, else generated conversations with a similar
length profile; `--long`: generated records with a `--context`-token context and two answers of about 200 tokens.
Models: `small` (4 layers, hidden 256), `wide` (Qwen3-0.6B's width: hidden 1024, 16 heads x 128, 8 KV heads, MLP 3072)
or `4b` (Qwen3-4B's: hidden 2560, 32 heads x 128, 8 KV heads, MLP 9728); `--layers` (wide default 1). On CUDA in bf16 a
second MFU column uses the device's datasheet peak (`floor.datasheet_tflops`).
"""

from __future__ import annotations

import argparse
import gzip
import json
import multiprocessing as mp
import os
import random
import resource
import statistics
import sys
import time
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

HH_PATH = Path(__file__).resolve().parents[2] / "shared" / "data" / "hh-rlhf" / "harmless-base-test.jsonl.gz"
WORDS = "the a model reward answer question because people often think about why how when where it is not".split()


def generated_records(n: int, seed: int = 0) -> list[dict]:
    """Multi-turn conversations shaped like hh-rlhf: 1-4 turn pairs of context, two short final answers."""
    rng = random.Random(seed)

    def text(lo, hi):
        return " ".join(rng.choice(WORDS) for _ in range(rng.randint(lo, hi)))

    records = []
    for _ in range(n):
        context = []
        for _ in range(rng.randint(1, 4)):
            context += [{"role": "user", "content": text(5, 40)}, {"role": "assistant", "content": text(10, 60)}]
        context.append({"role": "user", "content": text(5, 30)})
        completions = [{"rank": r, "completion": [{"role": "assistant", "content": text(5, 50)}]} for r in (0, 1)]
        records.append({"context": context, "completions": completions})
    return records


def long_records(n: int, context_tokens: int, answer_tokens: int = 200, seed: int = 0) -> list[dict]:
    """Records with one long user turn (about `context_tokens` tokens) and two answers of about `answer_tokens`."""
    from trl_rm_env.tiny_models import build_tiny_tokenizer

    tokenizer = build_tiny_tokenizer()
    rng = random.Random(seed)

    def text(tokens):
        words = [rng.choice(WORDS) for _ in range(tokens)]
        while (n := len(tokenizer(" ".join(words))["input_ids"])) > tokens:  # words are several tokens: trim
            words = words[: len(words) - max(1, (n - tokens) // 4)]  # by about the excess, never far below it
        return " ".join(words)

    return [
        {"context": [{"role": "user", "content": text(context_tokens)}],
         "completions": [{"rank": r, "completion": [{"role": "assistant", "content": text(answer_tokens)}]}
                         for r in (0, 1)]}
        for _ in range(n)
    ]


MODELS = {
    "small": dict(num_hidden_layers=4, hidden_size=256, intermediate_size=512, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=64),
    "wide": dict(hidden_size=1024, intermediate_size=3072, num_attention_heads=16, num_key_value_heads=8, head_dim=128),
    "4b": dict(hidden_size=2560, intermediate_size=9728, num_attention_heads=32, num_key_value_heads=8, head_dim=128),
}
METHODS = ["TRL RewardTrainer", "TRL RewardTrainer: checkpointing", "TRL RewardTrainer: Liger", "ours: defaults",
           "ours: plain", "ours: shared", "ours: packed", "ours: one micro-batch", "ours: ensemble",
           "ours: no fused kernels", "ours: no window packing"]
DEFAULT_METHODS = ["TRL RewardTrainer", "ours: defaults", "ours: plain", "ours: shared"]  # the others: --methods


def load_records(kind: str, limit: int, hh_path: Path = HH_PATH) -> tuple[list[dict], str]:
    from trl_rm_env.data.loaders import load_rank_records

    if kind in ("auto", "hh") and hh_path.exists():
        with gzip.open(hh_path, "rt") as f:
            rows = [json.loads(line) for line in f][:limit]
        records, _ = load_rank_records(rows, data_format="hh", on_invalid="skip", name="hh-rlhf harmless-base test")
        return records, f"hh-rlhf harmless-base test ({len(records)} records)"
    if kind == "hh":
        raise SystemExit(f"{hh_path} not found")
    return generated_records(limit), f"generated hh-like conversations ({limit} records)"


def peak_memory_mb() -> float:
    import torch

    if torch.cuda.is_available():
        return torch.cuda.max_memory_allocated() / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def run_many(names: list[str], records: list[dict], opts: dict, queue) -> None:
    """Train each configuration of `names` in turn in this process (the model built once, copied for each; CUDA: peak
    memory reset between them); put each one's measurements on `queue` as it finishes (`{"name", "error"}` for one
    that fails)."""
    os.dup2(2, 1)  # the child's prints (e.g. DeepSpeed's accelerator warning) to stderr: the table alone on stdout
    base = None
    for name in names:
        fresh_memory()
        try:
            base = base if base is not None else build_model(opts)
            queue.put(train_one(name, records, opts, base))
        except BaseException as err:  # the row shows the error; the other methods still run
            import traceback

            traceback.print_exc()
            queue.put({"name": name, "error": f"{type(err).__name__}: {err}"})


def build_model(opts: dict):
    """The benchmark's reward model (random init from seed 0, on the CPU, in the run's dtype)."""
    import torch

    from trl_rm_env.tiny_models import build_tiny_reward_model, build_tiny_tokenizer

    tokenizer = build_tiny_tokenizer()
    model = build_tiny_reward_model(
        tokenizer, seed=0, attn_implementation="sdpa", max_position_embeddings=65536, **opts["model_kwargs"]
    )
    return model.to(torch.bfloat16) if opts["precision"] == "bf16" else model


def train_one(name: str, records: list[dict], opts: dict, base) -> dict:
    import copy

    import torch
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import RewardConfig, RewardTrainer

    from trl_rm_env import RankedRewardConfig, RankedRewardTrainer
    from trl_rm_env.tiny_models import build_tiny_tokenizer

    torch.set_num_threads(opts["threads"])
    tokenizer = build_tiny_tokenizer()
    tokenizer.model_max_length = 10**6
    model = copy.deepcopy(base).train()
    heads = opts.get("ensemble_heads") or 1
    if name == "ours: ensemble":  # the same backbone, K score heads (seeded), as `ensemble_heads=K` loads a path
        torch.manual_seed(0)
        model.config.id2label = {k: f"head_{k}" for k in range(heads)}
        model.config.label2id = {f"head_{k}": k for k in range(heads)}
        model.num_labels = heads
        model.score = torch.nn.Linear(model.config.hidden_size, heads, bias=False).to(model.score.weight.dtype)
    bf16 = opts["precision"] == "bf16"
    accumulation = opts["grad_accum"]
    batch_size = opts["batch_size"]
    if name.endswith("one micro-batch"):  # defaults, the step's pairs in one micro-batch
        batch_size, accumulation = batch_size * accumulation, 1
    common = dict(
        output_dir=os.path.join(opts["tmp"], name), max_steps=opts["steps"] + 1,
        per_device_train_batch_size=batch_size, gradient_accumulation_steps=accumulation, learning_rate=1e-4,
        lr_scheduler_type="constant",
        logging_steps=1, save_strategy="no", report_to="none", seed=0, use_cpu=not torch.cuda.is_available(),
        bf16=bf16, max_length=opts["max_length"], disable_tqdm=True, dataloader_num_workers=0,
        gradient_checkpointing=name.endswith("checkpointing"),  # TRL's default is on; ours off
        train_sampling_strategy="sequential",  # dataset order: the timed records known
    )

    class Timer(TrainerCallback):
        def __init__(self):
            self.marks = []

        def on_step_end(self, args, state, control, **kwargs):
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            self.marks.append(time.perf_counter())

    timer = Timer()
    counts: list[tuple[int, int]] = []  # (padded positions, real tokens) of every collated batch, in order

    def count(batch):
        """Tokens through the model per batch, from the collated batch: padded positions and real tokens."""
        if "chunks" in batch:  # several forwards of one micro-batch (pack_max_tokens)
            before = len(counts)
            for chunk in batch["chunks"]:
                count(chunk)
            parts = counts[before:]
            del counts[before:]
            counts.append((sum(c[0] for c in parts), sum(c[1] for c in parts)))
            return batch
        if "packed" in batch:  # one padding-free row of every sequence of the micro-batch
            padded = batch["input_ids"].numel()
            real = int(batch["packed_tokens"]) if "packed_tokens" in batch else padded
        elif "prefix_ids" in batch:  # contexts once, completions against their cache (in passes of similar length)
            passes = batch.get("prefix_chunks", []) + batch.get("completion_chunks", [])
            padded = (sum(len(rows) * length for rows, length in passes) if passes
                      else batch["prefix_ids"].numel() + batch["completion_ids"].numel())
            real = int(batch["prefix_mask"].sum() + batch["completion_mask"].sum())
        elif "record_ids" in batch:  # block-mask rows
            padded, real = batch["input_ids"].numel(), int((batch["record_ids"] >= 0).sum())
        else:
            padded, real = batch["input_ids"].numel(), int(batch["attention_mask"].sum())
        counts.append((padded, real))
        return batch

    if name.startswith("TRL RewardTrainer"):
        rows = [
            {"prompt": r["context"], "chosen": r["completions"][0]["completion"],
             "rejected": r["completions"][1]["completion"]}
            for r in records
        ]
        liger = {}
        if name.endswith("Liger"):  # Liger's RMSNorm, SwiGLU and RoPE; its default fused linear cross entropy would
            # replace the classifier's forward with a causal LM's (trl_rm_env.fused_kernels), so it is off here
            liger = {"use_liger_kernel": True,
                     "liger_kernel_config": {"fused_linear_cross_entropy": False, "cross_entropy": False}}
        trainer = RewardTrainer(model=model, args=RewardConfig(**common, **liger),
                                train_dataset=Dataset.from_list(rows), processing_class=tokenizer, callbacks=[timer])
    else:
        extra = {"defaults": {}, "plain": {"prefix_sharing": False}, "shared": {"prefix_sharing": True},
                 "packed": {"prefix_sharing": "packed"}, "ensemble": {"ensemble_heads": heads},
                 "no fused kernels": {"fused_kernels": False}, "no window packing": {"window_packing": False}}
        kind = name.split(": ")[1].replace("one micro-batch", "defaults")
        trainer = RankedRewardTrainer(model=model, args=RankedRewardConfig(**common, **extra[kind]),
                                      train_dataset=Dataset.from_list(records), processing_class=tokenizer,
                                      callbacks=[timer])
    collate = trainer.data_collator
    trainer.data_collator = lambda features: count(collate(features))
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    for callback in (PrinterCallback, ProgressCallback):  # keep the table the only thing on stdout
        trainer.remove_callback(callback)
    n_records = len(trainer.train_dataset)
    trainer.train()
    steps = opts["steps"]
    seconds = timer.marks[-1] - timer.marks[0]
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    # not the warm-up step's micro-batches, nor the one the data loader fetches ahead (with `window_packing` the
    # collator runs once per step, on the window's records)
    per_step = 1 if getattr(trainer, "_window_packing", False) else accumulation
    timed = counts[per_step : (steps + 1) * per_step]
    result = {
        "name": name, "pairs_per_s": steps * batch_size * accumulation / seconds, "seconds": seconds,
        "padded": sum(c[0] for c in timed), "real": sum(c[1] for c in timed), "peak_mb": peak_memory_mb(), "losses": losses,
        "records": n_records, "budget": getattr(trainer, "_forward_budget", None),
        "fused": getattr(trainer, "_fused_kernels", False), "window": getattr(trainer, "_window_packing", False),
    }
    del trainer, model
    result["gflops"] = matmul_gflops(opts["threads"], opts["precision"])  # the rate after the run
    return result


def timed_floor(records: list[dict], max_length: int, steps: int, batch_size: int, model_kwargs: dict) -> tuple[int, float]:
    # batch_size: the pairs of one optimizer step (per-device batch x gradient accumulation)
    """(unique tokens, forward + backward GFLOP (3x forward)) of the timed records, the `steps * batch_size` records
    after the warm-up batch in dataset order (every run samples sequentially): context once, each completion once,
    causal attention of each completion over its context and itself."""
    from trl_rm_env.sharing import shared_prefix_length
    from trl_rm_env.tiny_models import build_tiny_tokenizer
    from trl_rm_env.trainer.examples import tokenize_rank_record

    tokenizer = build_tiny_tokenizer()
    groups, kept = [], 0
    for record in records:
        example, _ = tokenize_rank_record(record, tokenizer, max_length, "none")
        if example is None:
            continue
        kept += 1
        if batch_size < kept <= batch_size * (steps + 1):  # after the warm-up batch
            seqs = example["completion_ids"]
            groups.append((seqs, shared_prefix_length(seqs)))
    tokens, flops = group_floor(groups, model_kwargs)
    return tokens, 3 * flops / 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", choices=["auto", "hh", "generated", "long"], default=None,
                        help="default: auto (hh-rlhf if present); --long: long")
    parser.add_argument("--records", type=int, default=400)
    parser.add_argument("--steps", type=int, default=None, help="timed steps (default 20; --long: 2)")
    parser.add_argument("--batch-size", type=int, default=None, help="pairs per micro-batch (default 8; --long: 2)")
    parser.add_argument("--grad-accum", type=int, default=1,
                        help="micro-batches per optimizer step (pairs per step: --batch-size x this)")
    parser.add_argument("--rounds", type=int, default=1,
                        help="runs of every method, interleaved (the order rotated each round); the table shows the "
                        "median and the range. On CUDA one child process runs every round's methods in turn")
    parser.add_argument("--max-length", type=int, default=None, help="default 1024 (--long: context + 1024)")
    parser.add_argument("--threads", type=int, default=max(1, (os.cpu_count() or 2)))
    parser.add_argument("--long", action="store_true", help="long contexts (--context tokens), wide model")
    parser.add_argument("--context", type=int, default=4096, help="context tokens of --data long")
    parser.add_argument("--model", choices=sorted(MODELS), default=None, help="default: small (--long: wide)")
    parser.add_argument("--layers", type=int, default=None, help="layers of the model (wide default: 1)")
    parser.add_argument("--methods", default=",".join(DEFAULT_METHODS),
                        help="comma-separated subset of: " + ", ".join(METHODS) + " (default: all but packed)")
    parser.add_argument("--precision", choices=["fp32", "bf16"], default="fp32",
                        help="every method's model dtype (bf16: also bf16=True in the training arguments)")
    parser.add_argument("--hh-path", type=Path, default=HH_PATH, help="hh-rlhf harmless-base test .jsonl.gz")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds a method may take before it fails")
    parser.add_argument("--ensemble-heads", type=int, default=None,
                        help="K score heads for `ours: ensemble` (`ensemble_heads=K`), added to the methods; the "
                        "line under the table compares it with `ours: defaults` (step time, peak memory)")
    parser.add_argument("--deadline", type=float, default=None,
                        help="seconds from the start for the whole benchmark: then the method running is stopped, "
                        "none starts, and the table shows what finished (the others as errors)")
    args = parser.parse_args()

    import tempfile

    long = args.long
    data = args.data or ("long" if long else "auto")
    steps = args.steps or (2 if long else 20)
    batch_size = args.batch_size or (2 if long else 8)
    max_length = args.max_length or ((args.context + 1024) if data == "long" else 1024)
    model = args.model or ("wide" if long else "small")
    model_kwargs = dict(MODELS[model])
    if args.layers is not None or model == "wide":
        model_kwargs["num_hidden_layers"] = args.layers or 1
    if data == "long":
        n = batch_size * args.grad_accum * (steps + 1)  # the warm-up step's records, then the timed steps'
        records, description = long_records(n, args.context), f"generated, {args.context}-token contexts ({n} records)"
    else:
        records, description = load_records(data, args.records, args.hh_path)
    opts = {"steps": steps, "batch_size": batch_size, "max_length": max_length, "threads": args.threads,
            "tmp": tempfile.mkdtemp(), "model_kwargs": model_kwargs, "precision": args.precision,
            "grad_accum": args.grad_accum, "ensemble_heads": args.ensemble_heads}
    wanted = [m.strip() for m in args.methods.split(",") if m.strip()]
    if args.ensemble_heads:
        wanted += [m for m in ("ours: defaults", "ours: ensemble") if m not in wanted]
    elif "ours: ensemble" in wanted:
        raise SystemExit("ours: ensemble needs --ensemble-heads K")
    if unknown := [m for m in wanted if m not in METHODS]:
        raise SystemExit(f"unknown method(s) {unknown}; choose from {METHODS}")
    names = [m for m in METHODS if m in wanted]
    gflops = matmul_gflops(args.threads, args.precision)
    ctx = mp.get_context("spawn")
    import torch

    cuda = torch.cuda.is_available()

    def log(name, r):
        print(f"  done: {name} " + (f"(error: {r['error']})" if "error" in r else
              f"({r['seconds']:.1f} s timed, {r['pairs_per_s']:.2f} pairs/s, peak {r['peak_mb']:.0f} MB)"),
              file=sys.stderr)

    runs = run_rounds(ctx, run_many, names, args.rounds, (records, opts), args.timeout, cuda, log,
                      START + args.deadline if args.deadline else None)
    pairs = batch_size * args.grad_accum
    unique, floor = timed_floor(records, max_length, steps, pairs, model_kwargs)
    load = load_line()
    print(f"\nData: {description}; {steps} timed steps of {pairs} pairs ({batch_size} x {args.grad_accum} "
          f"accumulated; `ours: one micro-batch`: defaults, {pairs} x 1) after 1 warm-up step; max_length {max_length}; {args.rounds} "
          f"round(s), methods interleaved (order rotated each round): median (min-max)")
    device = f"cuda ({torch.cuda.get_device_name()})" if cuda else f"cpu x{args.threads} threads"
    peak = datasheet_tflops(torch.cuda.get_device_name()) if cuda and args.precision == "bf16" else None
    print(f"Model: {model}, {model_kwargs['num_hidden_layers']} layers, hidden {model_kwargs['hidden_size']} (random "
          f"init, {args.precision}, SDPA); device: {device}; matmul {gflops:.0f} GFLOP/s "
          f"({args.precision if cuda else 'fp32'})" + (f"; datasheet bf16 peak {peak:.0f} TFLOP/s" if peak else ""))
    print(f"Unique tokens in the timed batches (context once + completions): {unique}; FLOP floor of the "
          f"timed steps (forward + backward): {floor:.0f} GFLOP")
    print(f"Date: {time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC; load: {load}\n")
    print_train_table(runs, floor, gflops, peak)
    if args.ensemble_heads:
        one = [r for r in runs.get("ours: defaults", []) if "error" not in r]
        many = [r for r in runs.get("ours: ensemble", []) if "error" not in r]
        if one and many:
            step = statistics.median(r["seconds"] for r in many) / statistics.median(r["seconds"] for r in one)
            memory = max(r["peak_mb"] for r in many) / max(r["peak_mb"] for r in one)
            print(f"\nours: ensemble ({args.ensemble_heads} heads) vs ours: defaults (1 head): step time {step:.3f}x "
                  f"(medians), peak memory {memory:.3f}x")


def print_train_table(runs: dict[str, list[dict]], floor: float, gflops: float, peak: float | None) -> None:
    """One row per method: median pairs/s (range), the median's ratio to TRL's median, tokens, MFU at the median
    (at the measured matmul rate and, on CUDA in bf16, at the datasheet's peak), the largest peak memory, and the
    largest per-step loss difference from TRL's first run (every run trains the same records from the same init)."""
    ok = {name: [r for r in rs if "error" not in r] for name, rs in runs.items()}
    base_name = next((n for n in runs if n.startswith("TRL") and ok[n]), next((n for n in runs if ok[n]), None))
    short = "TRL" if base_name and base_name.startswith("TRL") else (base_name or "-")
    base_median = spread([r["pairs_per_s"] for r in ok[base_name]])[0] if base_name else None
    base_losses = ok[base_name][0]["losses"] if base_name else []
    header = ["run", "pairs/s: median (min-max)", f"vs {short}", "padded tokens", "real tokens",
              rate_column() + " (measured rate)"] + (["MFU % (datasheet)"] if peak else []) + [
              "peak MB", f"max \\|loss - {short}\\|"]
    rows = []
    for name, results in runs.items():
        good = ok[name]
        if not good:
            error = next((r["error"] for r in results if "error" in r), "no run")
            rows.append([name, "error: " + short_error(error)] + ["-"] * (len(header) - 2))
            continue
        median, text = spread([r["pairs_per_s"] for r in good])
        if len(good) < len(results):
            text += f", {len(results) - len(good)} failed"
        seconds = statistics.median(r["seconds"] for r in good)
        rate = max([gflops] + [r["gflops"] for r in good])
        diff = max((abs(a - b) for r in good for a, b in zip(r["losses"], base_losses)), default=float("nan"))
        pieces = [piece for piece, key in (("fused kernels", "fused"), ("window packing", "window")) if good[0].get(key)]
        label = f"{name} ({', '.join(pieces)})" if pieces else name
        row = [label, text, f"{median / base_median:.2f}x" if base_median else "-", str(good[0]["padded"]),
               str(good[0]["real"]), f"{100 * floor / rate / seconds:.0f}%"]
        if peak:
            row.append(f"{100 * floor / (peak * 1e3) / seconds:.0f}%")
        row += [f"{max(r['peak_mb'] for r in good):.0f}", "-" if name == base_name else f"{diff:.2e}"]
        rows.append(row)
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
    print("| " + " | ".join(h.ljust(w) for h, w in zip(header, widths)) + " |")
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for row in rows:
        print("| " + " | ".join(c.ljust(w) for c, w in zip(row, widths)) + " |")


if __name__ == "__main__":
    main()
