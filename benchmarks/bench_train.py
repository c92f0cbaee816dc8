"""Reward-model training speed: TRL's `RewardTrainer` vs `RankedRewardTrainer` (plain, prefix-shared, packed).

    python benchmarks/bench_train.py                      # hh-rlhf harmless-base test from ../shared/data if present
    python benchmarks/bench_train.py --steps 30 --batch-size 8 --max-length 1024 --data generated

Every run trains the same offline Qwen3 (4 layers, hidden 256, random init from one seed) on the same records in
the same order with the same hyperparameters, each in a fresh child process (so peak memory is its own). The table
shows pairs/s over the timed steps (after one warm-up step), tokens through the model (padded positions and real
tokens) against the unique tokens of the data, peak memory (CUDA: max allocated; CPU: peak RSS of the process), and
the largest per-step loss difference from TRL. Data: Anthropic hh-rlhf harmless-base test (real multi-turn
conversations, long shared context) when `../shared/data/hh-rlhf/` exists, else generated conversations with a
similar length profile.
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
    import torch
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import RewardConfig, RewardTrainer

    from trl_rm_env import RankedRewardConfig, RankedRewardTrainer
    from trl_rm_env.testing import build_tiny_reward_model, build_tiny_tokenizer

    torch.set_num_threads(opts["threads"])
    tokenizer = build_tiny_tokenizer()
    model = build_tiny_reward_model(
        tokenizer, seed=0, num_hidden_layers=4, hidden_size=256, intermediate_size=512, num_attention_heads=4,
        num_key_value_heads=2, head_dim=64,
    ).train()
    common = dict(
        output_dir=os.path.join(opts["tmp"], name), max_steps=opts["steps"] + 1,
        per_device_train_batch_size=opts["batch_size"], learning_rate=1e-4, lr_scheduler_type="constant",
        logging_steps=1, save_strategy="no", report_to="none", seed=0, use_cpu=not torch.cuda.is_available(),
        bf16=False, max_length=opts["max_length"], disable_tqdm=True, dataloader_num_workers=0,
        gradient_checkpointing=False,
    )

    class Timer(TrainerCallback):
        def __init__(self):
            self.marks = []

        def on_step_end(self, args, state, control, **kwargs):
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            self.marks.append(time.perf_counter())

    timer = Timer()
    counts = {"padded": 0, "real": 0, "steps": 0}

    def count(module, args, kwargs):
        """Tokens through the model per forward: padded positions, and real (non-padding) tokens."""
        ids, mask = kwargs["input_ids"], kwargs.get("attention_mask")
        if counts["steps"] >= 1:  # the warm-up step is not timed, so not counted either
            counts["padded"] += ids.numel()
            plain_mask = mask is not None and mask.dim() == 2
            counts["real"] += int(mask.sum()) if plain_mask else int((ids != tokenizer.pad_token_id).sum())
        counts["steps"] += 1

    if name == "TRL RewardTrainer":
        rows = [
            {"prompt": r["context"], "chosen": r["completions"][0]["completion"],
             "rejected": r["completions"][1]["completion"]}
            for r in records
        ]
        trainer = RewardTrainer(model=model, args=RewardConfig(**common), train_dataset=Dataset.from_list(rows),
                                processing_class=tokenizer, callbacks=[timer])
    else:
        extra = {"plain": {}, "prefix-shared": {"prefix_sharing": True},
                 "prefix-shared + packed": {"prefix_sharing": True, "pack_max_tokens": opts["pack"]}}[name.split(": ")[1]]
        trainer = RankedRewardTrainer(model=model, args=RankedRewardConfig(**common, **extra),
                                      train_dataset=Dataset.from_list(records), processing_class=tokenizer,
                                      callbacks=[timer])
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    for callback in (PrinterCallback, ProgressCallback):  # keep the table the only thing on stdout
        trainer.remove_callback(callback)
    hook = trainer.model.register_forward_pre_hook(count, with_kwargs=True)
    n_records = len(trainer.train_dataset)
    trainer.train()
    hook.remove()
    steps = opts["steps"]
    seconds = timer.marks[-1] - timer.marks[0]
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    queue.put({
        "name": name, "pairs_per_s": steps * opts["batch_size"] / seconds, "seconds": seconds,
        "padded": counts["padded"], "real": counts["real"], "peak_mb": peak_memory_mb(), "losses": losses,
        "records": n_records,
    })


def unique_tokens(records: list[dict], max_length: int, steps: int, batch_size: int) -> int:
    """Tokens of the context once plus each completion's own tokens, over the timed records (an estimate: the
    first `steps * batch_size` records after the warm-up batch in dataset order; the trainers shuffle)."""
    from trl_rm_env.scoring.prefix_sharing import record_row
    from trl_rm_env.testing import build_tiny_tokenizer
    from trl_rm_env.trainer.collator import tokenize_rank_record

    tokenizer = build_tiny_tokenizer()
    total, kept = 0, 0
    for record in records:
        example, _ = tokenize_rank_record(record, tokenizer, max_length, "drop")
        if example is None:
            continue
        kept += 1
        if batch_size <= kept <= batch_size * (steps + 1):
            total += len(record_row(example["completion_ids"])[0])
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", choices=["auto", "hh", "generated"], default="auto")
    parser.add_argument("--records", type=int, default=400)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--max-length", type=int, default=1024)
    parser.add_argument("--pack", type=int, default=2048, help="pack_max_tokens of the packed run")
    parser.add_argument("--threads", type=int, default=max(1, (os.cpu_count() or 2)))
    args = parser.parse_args()

    import tempfile

    records, description = load_records(args.data, args.records)
    opts = {"steps": args.steps, "batch_size": args.batch_size, "max_length": args.max_length, "pack": args.pack,
            "threads": args.threads, "tmp": tempfile.mkdtemp()}
    names = ["TRL RewardTrainer", "ours: plain", "ours: prefix-shared", "ours: prefix-shared + packed"]
    ctx = mp.get_context("spawn")
    results = []
    for name in names:
        queue = ctx.Queue()
        proc = ctx.Process(target=run_one, args=(name, records, opts, queue))
        proc.start()
        results.append(queue.get())
        proc.join()
        print(f"  done: {name} ({results[-1]['seconds']:.1f} s timed)", file=sys.stderr)

    unique = unique_tokens(records, args.max_length, args.steps, args.batch_size)
    base = results[0]
    print(f"\nData: {description}; {args.steps} timed steps of {args.batch_size} pairs; max_length {args.max_length}")
    print(f"Model: Qwen3, 4 layers, hidden 256 (random init, fp32); device: "
          f"{'cuda' if __import__('torch').cuda.is_available() else f'cpu x{args.threads} threads'}")
    print(f"Unique tokens in the timed batches (context once + completions), approx.: {unique}\n")
    header = ["run", "pairs/s", "speed-up", "padded tokens", "real tokens", "peak MB", "max |loss - TRL|"]
    rows = []
    for r in results:
        diff = max((abs(a - b) for a, b in zip(r["losses"], base["losses"])), default=float("nan"))
        rows.append([r["name"], f"{r['pairs_per_s']:.2f}", f"{r['pairs_per_s'] / base['pairs_per_s']:.2f}x",
                     str(r["padded"]), str(r["real"]), f"{r['peak_mb']:.0f}", "-" if r is base else f"{diff:.2e}"])
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
    print("| " + " | ".join(h.ljust(w) for h, w in zip(header, widths)) + " |")
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for row in rows:
        print("| " + " | ".join(c.ljust(w) for c, w in zip(row, widths)) + " |")


if __name__ == "__main__":
    main()
