"""Does GRPO with our reward model move a real policy? SmolLM2-135M-Instruct trained by `recipes/grpo_rm.py` against
a reward model trained from the same backbone (`bench_real_rm.py --keep`), with our live diagnostics and a held-out
judge scoring the same samples at weight 0, plotted per step.

    python benchmarks/bench_real_rm.py --keep real-rm          # once: the trained reward model (ours, first seed)
    python benchmarks/bench_real_grpo.py --reward-model real-rm --out real-grpo-bench.json --plot real_grpo.png

What runs (nothing is tuned to the data; a 135M policy is small, and the curves say what it does):

- policy: the instruct model of `trl-rm-env make-real` (`policy/`), fp32 on the CPU, full fine-tuning;
- rewards: the reward model (weight 1) and the instruct model itself as a pointwise log-probability judge (the recipe's
  `reward_judge`, weight 0: logged, never optimized: a second opinion the policy is not trained on);
- prompts: the contexts of hh-rlhf harmless-base records held out from the reward model's training (the last
  `--held-out` of `bench_real_rm.py`'s shuffled split, contexts within `--max-prompt-tokens`), so the reward model
  has not seen them;
- GRPO: TRL's `GRPOTrainer` through the recipe, `--steps` steps of `--prompts` prompts x `--generations` samples at
  temperature 1, up to `--max-completion` new tokens, learning rate `--lr` constant, `beta` 0 (TRL's default);
- logged per step (TRL's log history): both rewards' means, the reward model's `length_corr` (reward against
  completion length) and `flat_groups` (groups whose rewards are all equal: no learning signal), the completion
  length; the table gives the first and last `--window` steps' means.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

from bench_real_rm import DATA, hh_records

SERIES = {  # label: log-history key
    "reward model": "rewards/real_rm/mean",
    "held-out judge (weight 0)": "rewards/judge/mean",
    "length_corr": "reward_model_env/length_corr",
    "flat_groups": "reward_model_env/flat_groups",
    "completion length": "completions/mean_length",
}


def prompts(tokenizer, held_out: int, max_tokens: int, count: int) -> list[dict]:
    rows = []
    for record in hh_records()[-held_out:]:
        ids = tokenizer.apply_chat_template(record["context"], add_generation_prompt=True, tokenize=True,
                                            return_dict=True)["input_ids"]  # fmt: skip
        if len(ids) <= max_tokens:
            rows.append({"prompt": record["context"]})
    return rows[:count]


def run(args) -> dict:
    import torch
    from transformers import AutoTokenizer
    from trl_rm_env.recipes import grpo_rm

    from trl_rm_env.errors import run_recipe
    from trl_rm_env.real_models import make_real

    torch.set_num_threads(args.threads)
    policy = str(make_real(args.real)["policy"])
    tokenizer = AutoTokenizer.from_pretrained(policy)
    rows = prompts(tokenizer, args.held_out, args.max_prompt_tokens, args.steps * args.prompts)
    if len(rows) < args.steps * args.prompts:
        raise SystemExit(f"only {len(rows)} held-out prompts fit --max-prompt-tokens {args.max_prompt_tokens}")
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    data = out / "prompts.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    config = Path(grpo_rm.__file__).parent / "configs" / "grpo_rm_tiny.yaml"
    argv = ["--config", str(config), "--model_name_or_path", policy, "--build_tiny_model", "false",
            "--reward_model", args.reward_model, "--reward_name", "real_rm", "--prompt_data", str(data),
            "--reward_judge", policy, "--reward_judge_mode", "pointwise", "--reward_weights", "1.0", "0.0",
            "--max_steps", str(args.steps), "--per_device_train_batch_size", str(args.prompts * args.generations),
            "--num_generations", str(args.generations), "--max_completion_length", str(args.max_completion),
            "--learning_rate", str(args.lr), "--seed", str(args.seed), "--output_dir", str(out / "policy"),
            "--logging_steps", "1", "--disable_tqdm", "true"]  # fmt: skip
    start = time.perf_counter()
    run_recipe(grpo_rm.make_parser, grpo_rm.main, argv)
    seconds = time.perf_counter() - start
    history = json.loads((out / "policy" / "trainer_state.json").read_text())["log_history"]
    steps = [h for h in history if "step" in h and any(key in h for key in SERIES.values())]
    return {"seconds": seconds, "argv": argv, "steps": steps}


def summary(result: dict, window: int) -> str:
    steps = result["steps"]
    lines = [f"| series | first {window} steps | last {window} steps | change |", "|---|---|---|---|"]
    for label, key in SERIES.items():
        values = [h[key] for h in steps if key in h and h[key] is not None]
        if len(values) < 2 * window:
            lines.append(f"| {label} | n/a | n/a | |")
            continue
        first, last = statistics.mean(values[:window]), statistics.mean(values[-window:])
        lines.append(f"| {label} | {first:.3f} | {last:.3f} | {last - first:+.3f} |")
    return "\n".join(lines)


def plot(result: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = result["steps"]
    fig, axes = plt.subplots(1, 3, figsize=(11, 3.2))
    for ax, labels in zip(axes, (("reward model", "held-out judge (weight 0)"), ("length_corr", "flat_groups"),
                                 ("completion length",))):  # fmt: skip
        for label in labels:
            key = SERIES[label]
            points = [(h["step"], h[key]) for h in steps if h.get(key) is not None]
            if points:
                ax.plot(*zip(*points), label=label)
        ax.set_xlabel("GRPO step")
        ax.legend(fontsize=7)
    fig.suptitle("GRPO of SmolLM2-135M-Instruct against a reward model on its backbone (CPU)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--real", default="real-models", help="trl-rm-env make-real's folder (written if missing)")
    parser.add_argument("--reward-model", required=True, help="the trained reward model (bench_real_rm.py --keep)")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--prompts", type=int, default=2, help="prompts a step")
    parser.add_argument("--generations", type=int, default=8, help="samples per prompt (the GRPO group)")
    parser.add_argument("--max-completion", type=int, default=48)
    parser.add_argument("--max-prompt-tokens", type=int, default=96)
    parser.add_argument("--held-out", type=int, default=400, help="as bench_real_rm.py's --held-out")
    parser.add_argument("--lr", type=float, default=2e-5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--window", type=int, default=5, help="steps averaged at each end for the table")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--output-dir", default="outputs/real-grpo-bench")
    parser.add_argument("--out", default="real-grpo-bench.json")
    parser.add_argument("--plot", default=None)
    args = parser.parse_args()
    if not (DATA / "hh-rlhf").exists():
        raise SystemExit(f"{DATA} not found: this benchmark reads the shared real data")
    result = run(args)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(f"\nGRPO of SmolLM2-135M-Instruct, {args.steps} steps x {args.prompts} prompts x {args.generations} samples, "
          f"<= {args.max_completion} new tokens, lr {args.lr}, seed {args.seed}; fp32 CPU ({os.cpu_count()} cores, "
          f"{args.threads} threads); {result['seconds'] / 60:.1f} min\n", file=sys.stderr)  # fmt: skip
    print(summary(result, args.window))
    if args.plot:
        plot(result, args.plot)


if __name__ == "__main__":
    main()
