"""Where one packed scoring call, and one packed training micro-batch, spend their time: the CPU side (encode, plan,
pack), the key gather, the attention kernel and the rest of the GPU's kernels.

    python benchmarks/profile_packed.py --layers 28 --precision bf16        # on a GPU (hh-rlhf, 16 prompts x 8)
    python benchmarks/profile_packed.py --layers 1 --prompts 4              # a CPU check of the script
    python benchmarks/profile_packed.py --train-pairs 8,64                  # also a training micro-batch of 8 and 64

Scores hh-rlhf batches (`bench_score.py --data hh`) with `RewardModelEnvironment(..., prefix_sharing="packed")` at
Qwen3-0.6B's width, then prints the seconds of a whole call, of `encode` alone and of the packed forward alone (the
same batch, packed before the clock starts), and the profiler's table of one call sorted by device time.
"""

from __future__ import annotations

import argparse
import time

import torch
from bench_score import HH_PATH, MODELS, hh_batch  # benchmarks/ is on sys.path when run as a script


def timed(fn, device: str, repeats: int = 5) -> float:
    """The best of `repeats` runs of `fn()`, in seconds (synchronized on CUDA)."""
    best = float("inf")
    for _ in range(repeats):
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if device == "cuda":
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=28)
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--generations", type=int, default=8)
    parser.add_argument("--precision", choices=["fp32", "bf16"], default="bf16")
    parser.add_argument("--hh-path", default=str(HH_PATH))
    parser.add_argument("--rows", type=int, default=15, help="rows of the profiler's table")
    parser.add_argument("--train-pairs", default="", help="comma-separated micro-batch sizes (hh-rlhf pairs) whose "
                        "packed training forward + backward is timed and profiled too")
    args = parser.parse_args()

    from trl_rm_env import RewardModelEnvironment
    from trl_rm_env.sharing import pack_groups, packed_scores, share_plan
    from trl_rm_env.tiny_models import build_tiny_reward_model, build_tiny_tokenizer

    device = "cuda" if torch.cuda.is_available() else "cpu"
    tokenizer = build_tiny_tokenizer()
    tokenizer.model_max_length = 10**6
    model = build_tiny_reward_model(
        tokenizer, seed=0, attn_implementation="sdpa", max_position_embeddings=65536,
        num_hidden_layers=args.layers, **MODELS["wide"],
    ).to(device, torch.bfloat16 if args.precision == "bf16" else torch.float32)
    env = RewardModelEnvironment(model, tokenizer=tokenizer, prefix_sharing="packed")
    batches = [hh_batch(tokenizer, args.prompts, args.generations, index, args.hh_path) for index in range(8)]
    for batch in batches[:2]:
        env(*batch)
    calls = iter(batches[2:])
    whole = timed(lambda: env(*next(calls)), device)
    scorer = env.scorer
    encode = timed(lambda: scorer.encode(*batches[2]), device)
    encoded = scorer.encode(*batches[2])
    groups, plain = share_plan(encoded.ids, encoded.context_lengths, True, scorer.engine.cost_ratio)
    packed = pack_groups([[encoded.ids[i] for i in items] for _, items in groups] + [[encoded.ids[i]] for i in plain],
                         [p for p, _ in groups] + [0] * len(plain), tokenizer.pad_token_id)
    packed = {k: (v.to(device) if torch.is_tensor(v) else v) for k, v in packed.items()}

    def forward():
        with torch.inference_mode():
            packed_scores(model, packed)

    forward_s = timed(forward, device)
    tokens = packed["num_tokens"]
    print(f"device {torch.cuda.get_device_name() if device == 'cuda' else 'cpu'}; {args.layers} layers, "
          f"{args.precision}; {args.prompts} x {args.generations}; {tokens} packed tokens")
    print(f"whole call {whole * 1e3:.1f} ms | encode {encode * 1e3:.1f} ms | packed forward {forward_s * 1e3:.1f} ms "
          f"({tokens / forward_s:.0f} tokens/s)")
    print_profile(lambda: env(*next(calls)), device, args.rows)
    for pairs in [int(x) for x in args.train_pairs.split(",") if x.strip()]:
        profile_training(model, tokenizer, pairs, args, device)


def print_profile(fn, device: str, rows: int) -> None:
    """The profiler's table of one run of `fn()` (CPU and, on CUDA, kernels, sorted by device time)."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as profile:
        fn()
        if device == "cuda":
            torch.cuda.synchronize()
    sort = "device_time_total" if device == "cuda" else "cpu_time_total"
    print(profile.key_averages().table(sort_by=sort, row_limit=rows, max_name_column_width=60))


def profile_training(model, tokenizer, pairs: int, args, device: str) -> None:
    """Time and profile a packed training micro-batch of `pairs` hh-rlhf pairs: collate, forward, backward."""
    import gzip
    import json

    from trl_rm_env.data.loaders import load_rank_records
    from trl_rm_env.sharing import packed_scores
    from trl_rm_env.sharing.layouts import PACKED
    from trl_rm_env.trainer.collator import DataCollatorForRankedPreference
    from trl_rm_env.trainer.examples import tokenize_rank_record
    from trl_rm_env.trainer.loss import ranked_bradley_terry_loss

    with gzip.open(args.hh_path, "rt") as f:
        rows = [json.loads(line) for line, _ in zip(f, range(4 * pairs + 64))]
    records, _ = load_rank_records(rows, data_format="hh", on_invalid="skip", name="hh-rlhf")
    examples = [e for e in (tokenize_rank_record(r, tokenizer, 4096, "none")[0] for r in records) if e][:pairs]
    collator = DataCollatorForRankedPreference(tokenizer.pad_token_id, layout=PACKED)
    collate = timed(lambda: collator(examples), "cpu")
    batch = collator(examples)
    batch = {k: (v.to(device) if torch.is_tensor(v) else v) for k, v in batch.items()}
    model.train().requires_grad_(True)  # the reward environment froze it for scoring

    def step():
        scores, _ = packed_scores(model, batch)
        ranked_bradley_terry_loss(scores, batch["ranks"], batch["record_index"]).loss.backward()
        model.zero_grad(set_to_none=True)

    step_s = timed(step, device, repeats=3)
    tokens = batch["num_tokens"]
    print(f"\ntraining micro-batch of {pairs} pairs: {tokens} packed tokens; collate {collate * 1e3:.1f} ms | "
          f"forward + backward {step_s * 1e3:.1f} ms ({tokens / step_s:.0f} tokens/s)")
    print_profile(step, device, args.rows)
    model.eval()


if __name__ == "__main__":
    main()
