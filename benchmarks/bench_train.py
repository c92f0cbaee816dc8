"""Reward-model training speed: TRL's `RewardTrainer` vs `RankedRewardTrainer` (defaults, plain, shared).

    python benchmarks/bench_train.py                      # hh-rlhf harmless-base test from ../shared/data if present
    python benchmarks/bench_train.py --steps 30 --batch-size 8 --max-length 1024 --data generated
    python benchmarks/bench_train.py --long --context 4096    # long shared contexts, Qwen3-0.6B width, 1 layer

Every run trains the same offline Qwen3 (random init from one seed) on the same records in the same order (sequential
sampling, so the timed records are known) with the same hyperparameters, each in a fresh child process (so peak memory
is its own). `ours: defaults` sets nothing (`prefix_sharing="auto"`: each record's context once, its completions
against the context's KV cache), `plain` sets `prefix_sharing=False`, `shared` `prefix_sharing=True`. The table shows
pairs/s over the timed steps (after one warm-up step), tokens through the model (padded positions and real tokens)
against the unique tokens of the data, the FLOP floor of the timed steps (forward + backward, 3x the forward FLOPs of
the unique tokens: context once, each completion once, each completion's causal attention over its context and itself)
and `floor %` (floor FLOPs at this machine's measured matmul rate, the best of the rates measured at the start and
right after the run's own steps / measured time), peak memory (CUDA: max allocated; CPU: peak RSS of the process), and
the largest per-step loss difference from TRL. Data: Anthropic hh-rlhf harmless-base test (real multi-turn
conversations, long shared context) when `../shared/data/hh-rlhf/` exists, else generated conversations with a similar
length profile; `--long`: generated records with a `--context`-token context and two answers of about 200 tokens.
Models: `small` (4 layers, hidden 256) or `wide` (hidden 1024, 16 heads x 128, 8 KV heads, MLP 3072; `--layers`,
default 1).
"""

from __future__ import annotations

import argparse
import gzip
import json
import multiprocessing as mp
import os
import random
import resource
import sys
import time
from pathlib import Path

from floor import group_floor, matmul_gflops  # benchmarks/floor.py (the script's folder is on sys.path)

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
    from trl_rm_env.testing import build_tiny_tokenizer

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
}
METHODS = ["TRL RewardTrainer", "ours: defaults", "ours: plain", "ours: shared"]


def load_records(kind: str, limit: int) -> tuple[list[dict], str]:
    from trl_rm_env.data.loaders import load_rank_records

    if kind in ("auto", "hh") and HH_PATH.exists():
        with gzip.open(HH_PATH, "rt") as f:
            rows = [json.loads(line) for line in f][:limit]
        records, _ = load_rank_records(rows, data_format="hh", on_invalid="skip", name="hh-rlhf harmless-base test")
        return records, f"hh-rlhf harmless-base test ({len(records)} records)"
    if kind == "hh":
        raise SystemExit(f"{HH_PATH} not found")
    return generated_records(limit), f"generated hh-like conversations ({limit} records)"


def peak_memory_mb() -> float:
    import torch

    if torch.cuda.is_available():
        return torch.cuda.max_memory_allocated() / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def run_one(name: str, records: list[dict], opts: dict, queue) -> None:
    """Train one configuration; put its measurements on `queue`."""
    os.dup2(2, 1)  # the child's prints (e.g. DeepSpeed's accelerator warning) to stderr: the table alone on stdout
    import torch
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import RewardConfig, RewardTrainer

    from trl_rm_env import RankedRewardConfig, RankedRewardTrainer
    from trl_rm_env.testing import build_tiny_reward_model, build_tiny_tokenizer

    torch.set_num_threads(opts["threads"])
    tokenizer = build_tiny_tokenizer()
    tokenizer.model_max_length = 10**6
    model = build_tiny_reward_model(
        tokenizer, seed=0, attn_implementation="sdpa", max_position_embeddings=65536, **opts["model_kwargs"]
    ).train()
    common = dict(
        output_dir=os.path.join(opts["tmp"], name), max_steps=opts["steps"] + 1,
        per_device_train_batch_size=opts["batch_size"], learning_rate=1e-4, lr_scheduler_type="constant",
        logging_steps=1, save_strategy="no", report_to="none", seed=0, use_cpu=not torch.cuda.is_available(),
        bf16=False, max_length=opts["max_length"], disable_tqdm=True, dataloader_num_workers=0,
        gradient_checkpointing=False, train_sampling_strategy="sequential",  # dataset order: the timed records known
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
        if "prefix_ids" in batch:  # contexts once, completions against their cache (in passes of similar length)
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

    if name == "TRL RewardTrainer":
        rows = [
            {"prompt": r["context"], "chosen": r["completions"][0]["completion"],
             "rejected": r["completions"][1]["completion"]}
            for r in records
        ]
        trainer = RewardTrainer(model=model, args=RewardConfig(**common), train_dataset=Dataset.from_list(rows),
                                processing_class=tokenizer, callbacks=[timer])
    else:
        extra = {"defaults": {}, "plain": {"prefix_sharing": False}, "shared": {"prefix_sharing": True}}
        trainer = RankedRewardTrainer(model=model, args=RankedRewardConfig(**common, **extra[name.split(": ")[1]]),
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
    timed = counts[1 : steps + 1]  # not the warm-up batch, nor the one the data loader fetches ahead
    queue.put({
        "name": name, "pairs_per_s": steps * opts["batch_size"] / seconds, "seconds": seconds,
        "padded": sum(c[0] for c in timed), "real": sum(c[1] for c in timed), "peak_mb": peak_memory_mb(), "losses": losses,
        "records": n_records, "gflops": matmul_gflops(opts["threads"]),  # the rate right after the run, too
    })


def timed_floor(records: list[dict], max_length: int, steps: int, batch_size: int, model_kwargs: dict) -> tuple[int, float]:
    """(unique tokens, forward + backward GFLOP (3x forward)) of the timed records, the `steps * batch_size` records
    after the warm-up batch in dataset order (every run samples sequentially): context once, each completion once,
    causal attention of each completion over its context and itself."""
    from trl_rm_env.sharing import shared_prefix_length
    from trl_rm_env.testing import build_tiny_tokenizer
    from trl_rm_env.trainer.examples import tokenize_rank_record

    tokenizer = build_tiny_tokenizer()
    groups, kept = [], 0
    for record in records:
        example, _ = tokenize_rank_record(record, tokenizer, max_length, "drop")
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
    parser.add_argument("--batch-size", type=int, default=None, help="pairs per step (default 8; --long: 2)")
    parser.add_argument("--max-length", type=int, default=None, help="default 1024 (--long: context + 1024)")
    parser.add_argument("--threads", type=int, default=max(1, (os.cpu_count() or 2)))
    parser.add_argument("--long", action="store_true", help="long contexts (--context tokens), wide model")
    parser.add_argument("--context", type=int, default=4096, help="context tokens of --data long")
    parser.add_argument("--model", choices=sorted(MODELS), default=None, help="default: small (--long: wide)")
    parser.add_argument("--layers", type=int, default=None, help="layers of the model (wide default: 1)")
    parser.add_argument("--methods", default=",".join(METHODS), help="comma-separated subset of the methods")
    args = parser.parse_args()

    import subprocess
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
        n = batch_size * (steps + 1)
        records, description = long_records(n, args.context), f"generated, {args.context}-token contexts ({n} records)"
    else:
        records, description = load_records(data, args.records)
    opts = {"steps": steps, "batch_size": batch_size, "max_length": max_length, "threads": args.threads,
            "tmp": tempfile.mkdtemp(), "model_kwargs": model_kwargs}
    names = [m for m in METHODS if m in args.methods.split(",")]
    gflops = matmul_gflops(args.threads)
    ctx = mp.get_context("spawn")
    results = []
    for name in names:
        queue = ctx.Queue()
        proc = ctx.Process(target=run_one, args=(name, records, opts, queue))
        proc.start()
        results.append(queue.get())
        proc.join()
        print(f"  done: {name} ({results[-1]['seconds']:.1f} s timed)", file=sys.stderr)

    unique, floor = timed_floor(records, max_length, steps, batch_size, model_kwargs)
    base = results[0]
    load = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    print(f"\nData: {description}; {steps} timed steps of {batch_size} pairs; max_length {max_length}")
    print(f"Model: {model}, {model_kwargs['num_hidden_layers']} layers, hidden {model_kwargs['hidden_size']} (random "
          f"init, fp32, SDPA); device: {'cuda' if __import__('torch').cuda.is_available() else f'cpu x{args.threads} threads'}"
          f"; matmul {gflops:.0f} GFLOP/s")
    print(f"Unique tokens in the timed batches (context once + completions): {unique}; FLOP floor of the "
          f"timed steps (forward + backward): {floor:.0f} GFLOP")
    print(f"Date: {time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC; load: {load}\n")
    short = "TRL" if base["name"].startswith("TRL") else base["name"]
    header = ["run", "pairs/s", f"vs {short}", "padded tokens", "real tokens", "floor %", "peak MB",
              f"max \\|loss - {short}\\|"]  # pipes escaped for Markdown
    rows = []
    for r in results:
        diff = max((abs(a - b) for a, b in zip(r["losses"], base["losses"])), default=float("nan"))
        rows.append([r["name"], f"{r['pairs_per_s']:.2f}", f"{r['pairs_per_s'] / base['pairs_per_s']:.2f}x",
                     str(r["padded"]), str(r["real"]), f"{100 * floor / max(gflops, r['gflops']) / r['seconds']:.0f}%",
                     f"{r['peak_mb']:.0f}", "-" if r is base else f"{diff:.2e}"])
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
    print("| " + " | ".join(h.ljust(w) for h, w in zip(header, widths)) + " |")
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for row in rows:
        print("| " + " | ".join(c.ljust(w) for c, w in zip(row, widths)) + " |")


if __name__ == "__main__":
    main()
