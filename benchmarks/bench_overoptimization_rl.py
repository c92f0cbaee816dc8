"""The RL tier of the over-optimization benchmark: GRPO of the real policy against a proxy reward model, with the
gold reward and the KL logged every step (Gao et al. 2022, sec. 3.3; Coste et al. 2023, PPO with ensembles).

    python benchmarks/bench_overoptimization.py --work overopt ...      # first: the samples and the proxies
    python benchmarks/bench_overoptimization_rl.py --work overopt --steps 6 --out overopt-rl.json --plot overopt-rl.png
                                                                        # the short CPU run (minutes a defence)

What runs, per defence and seed (nothing is tuned to the data):

- policy: SmolLM2-135M-Instruct (`trl-rm-env make-real`), full fine-tuning by TRL's `GRPOTrainer`, `--beta` > 0 so
  TRL computes (and logs) the KL to the reference policy, sampled at temperature 1;
- prompts: "What is a + b? Answer with the number." for pairs (a, b) that neither the proxies' training pairs nor
  the best-of-n tier's held-out prompts use;
- rewards: the proxy at weight 1 (`RewardModelEnvironment`: `single`, a proxy of one head; `min` and
  `mean_minus_std`, `bench_overoptimization.py`'s K-head proxy read by that aggregation; `par`, the one-head proxy
  bounded against a reference answer, "The answer is {a + b}.", PAR's `reference_column`), and the gold (the last
  number of the answer is a + b, `trl-rm-env best-of-n --gold number`'s check) at weight 0: logged by TRL, never
  optimized;
- logged every step (TRL's log history): both rewards' means, `kl`, the completion length, and our live
  diagnostics (`ensemble_std`, `length_corr`, `flat_groups`).

On a GPU, the full run is the same command with more steps and seeds (docs/reward_hacking.md gives it).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

from bench_overoptimization import QUESTION, arithmetic_prompts

DEFENCES = {  # name: (proxy label, RewardModelEnvironment options)
    "single": ("single", {}),
    "min": ("heads{K}", {"ensemble": "min"}),
    "mean_minus_std": ("heads{K}", {"ensemble": "mean_minus_std"}),
    "par": ("single", {"reference_column": "reference"}),
}
SERIES = {  # label: log-history key
    "proxy": "rewards/proxy/mean",
    "gold": "rewards/gold/mean",
    "kl": "kl",
    "length": "completions/mean_length",
    "ensemble_std": "reward_model_env/ensemble_std",
    "length_corr": "reward_model_env/length_corr",
    "flat_groups": "reward_model_env/flat_groups",
}


def gold(prompts, completions, answer, **kwargs) -> list[float]:
    """The gold reward (weight 0): `trl-rm-env best-of-n --gold number`'s check of each completion."""
    from trl_rm_env.evaluation.best_of_n_command import number_gold

    texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
    return [number_gold({"answer": a}, t) for a, t in zip(answer, texts)]


def run_one(defence: str, seed: int, args, out: Path) -> dict:
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from trl_rm_env import RewardModelEnvironment
    from trl_rm_env.real_models import make_real

    torch.set_num_threads(args.threads)
    policy = str(make_real(args.real)["policy"])
    label, options = DEFENCES[defence]
    proxy = Path(args.work) / f"{label.format(K=args.heads)}-seed{args.proxy_seed}"
    if not proxy.exists():
        raise SystemExit(f"{proxy} not found: run bench_overoptimization.py with --work {args.work} first")
    taken = {tuple(ab) for ab in json.loads((Path(args.work) / "used_pairs.json").read_text())}
    rows = arithmetic_prompts(args.steps * args.prompts, seed=3, exclude=taken)
    data = Dataset.from_list([{"prompt": r["context"], "answer": r["answer"], "reference": [
        {"role": "assistant", "content": f"The answer is {r['answer']}."}]} for r in rows])  # fmt: skip
    reward = RewardModelEnvironment(str(proxy), name="proxy", **options)
    config = GRPOConfig(output_dir=str(out), max_steps=args.steps, per_device_train_batch_size=args.prompts * args.generations,
                        num_generations=args.generations, max_completion_length=args.max_completion,
                        temperature=1.0, learning_rate=args.lr, lr_scheduler_type="constant", beta=args.beta,
                        reward_weights=[1.0, 0.0], logging_steps=1, save_strategy="no", report_to="none",
                        seed=seed, use_cpu=not torch.cuda.is_available(), bf16=False, disable_tqdm=True)  # fmt: skip
    trainer = GRPOTrainer(model=AutoModelForCausalLM.from_pretrained(policy, dtype=torch.float32),
                          reward_funcs=[reward, gold], args=config, train_dataset=data,
                          processing_class=AutoTokenizer.from_pretrained(policy))  # fmt: skip
    start = time.perf_counter()
    trainer.train()
    history = [h for h in trainer.state.log_history if "rewards/gold/mean" in h]
    series = {name: [h.get(key, math.nan) for h in history] for name, key in SERIES.items()}
    return {"defence": defence, "seed": seed, "seconds": time.perf_counter() - start, "steps": args.steps,
            "series": series}  # fmt: skip


def plot(results: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for r in results:
        s = r["series"]
        d = [math.sqrt(max(k, 0.0)) if not math.isnan(k) else math.nan for k in s["kl"]]
        (line,) = left.plot(d, s["gold"], marker="o", markersize=3, label=f"{r['defence']}, seed {r['seed']}")
        right.plot(d, s["proxy"], marker="o", markersize=3, color=line.get_color())
    left.set_ylabel("gold reward (mean of the step's samples)")
    right.set_ylabel("proxy reward (mean, the defence's own scale)")
    for ax in (left, right):
        ax.set_xlabel("d = sqrt(KL) (TRL's kl, per token)")
    left.legend(fontsize=7)
    fig.suptitle("GRPO against a proxy: SmolLM2-135M-Instruct, a + b (CPU)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def table(results: list[dict], window: int) -> str:
    lines = ["| defence | seed | steps | min | gold first -> last | proxy first -> last | kl last | length first -> last |",
             "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    def head_tail(series: list[float]) -> str:
        values = [v for v in series if not math.isnan(v)]
        if not values:
            return "-"
        first, last = values[:window], values[-window:]
        return f"{sum(first) / len(first):.3f} -> {sum(last) / len(last):.3f}"

    for r in results:
        s = r["series"]
        kl = [v for v in s["kl"] if not math.isnan(v)]
        lines.append(f"| {r['defence']} | {r['seed']} | {r['steps']} | {r['seconds'] / 60:.1f} | {head_tail(s['gold'])} | "
                     f"{head_tail(s['proxy'])} | {kl[-1] if kl else math.nan:.4f} | {head_tail(s['length'])} |")  # fmt: skip
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--real", default="real-models", help="trl-rm-env make-real's folder")
    parser.add_argument("--work", default="overopt", help="bench_overoptimization.py's --work (its proxies)")
    parser.add_argument("--defences", nargs="+", default=list(DEFENCES), choices=list(DEFENCES))
    parser.add_argument("--heads", type=int, default=5, help="K of the multi-head proxy (its heads{K} folder)")
    parser.add_argument("--proxy-seed", type=int, default=0, help="Which seed's proxies")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0], help="GRPO seeds")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--prompts", type=int, default=2, help="Prompts a step")
    parser.add_argument("--generations", type=int, default=8, help="Samples a prompt (the GRPO group)")
    parser.add_argument("--max-completion", type=int, default=24)
    parser.add_argument("--lr", type=float, default=2e-6)
    parser.add_argument("--beta", type=float, default=0.04, help="GRPO's KL coefficient (> 0: TRL logs the KL)")
    parser.add_argument("--window", type=int, default=2, help="Steps averaged at each end of the table")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default="overoptimization-rl.json")
    parser.add_argument("--plot", default=None)
    args = parser.parse_args()
    if args.beta <= 0:
        raise SystemExit("--beta must be > 0: the KL is what the curves are drawn against")
    done = json.loads(Path(args.out).read_text()) if Path(args.out).exists() else []
    for seed in args.seeds:
        for defence in args.defences:
            if any(r["defence"] == defence and r["seed"] == seed and r["steps"] == args.steps for r in done):
                continue
            print(f"GRPO against {defence}, seed {seed}: {args.steps} steps ...", file=sys.stderr)
            result = run_one(defence, seed, args, Path(args.work) / f"grpo-{defence}-seed{seed}")
            done = [r for r in done if not (r["defence"] == defence and r["seed"] == seed)] + [result]
            Path(args.out).write_text(json.dumps(done, indent=1))
    print(f"\nGRPO, {args.prompts} prompts x {args.generations} samples a step, lr {args.lr}, beta {args.beta}, "
          f"CPU ({args.threads} threads): '{QUESTION}'\n")  # fmt: skip
    print(table(done, args.window))
    if args.plot:
        plot(done, args.plot)


if __name__ == "__main__":
    main()
