#!/usr/bin/env bash
# One GPU run on a lent machine without network, in under 9 minutes: the GPU tests (tests/gpu), then training
# (bench_train.py) and GRPO reward scoring (bench_score.py) at Qwen3-0.6B's shape (28 layers, random init, bf16) on
# hh-rlhf harmless-base test data, every method run in interleaved rounds (medians and ranges), at 64 pairs a step and
# 16 x 8 and 64 x 16 completions; the profile of the packed calls (profile_packed.py); then, as time allows, a 4k-token
# context set and Qwen3-4B's width (6 layers). Run from the repository root with the wheels of
# .whl/ and the data of .gpudata/ carried (both ignored by git, never committed):
#
#     bash benchmarks/gpu.sh
#
# Making them (here, with network; `/.whl/` and `/.gpudata/` in .git/info/exclude):
#
#     for w in trl==1.16.0 transformers==5.24.0 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19 accelerate==1.15.0 \
#              peft==0.21.2 liger-kernel==0.8.5; do python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
#              --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
#              --platform manylinux2014_x86_64 -d .whl "$w"; done
#     mkdir -p .gpudata && cp ../shared/data/hh-rlhf/harmless-base-test.jsonl.gz .gpudata/
#
# (an image whose pyarrow is older than 24 also needs datasets 4.8.5 and requests' wheels in .whl/fallback/). Then
# call the device with `carry: [".whl", ".gpudata"]` and a timeout of about 560 s.
#
# The wheels (trl, transformers, datasets and what they need beyond the machine's own packages) go into $GPU_SH_SITE
# (default /tmp/site), this checkout's package comes from PYTHONPATH. Each benchmark's table goes to $OUT/<name>.md,
# its log to $OUT/<name>.log, all tables together to $OUT/tables.md (printed at the end); $OUT defaults to
# /tmp/gpu-bench. A method that fails shows its error in its row; a benchmark that fails or runs out of time leaves
# its log (its `done:` lines carry each finished method's numbers).
#
# Environment: PYTHON (default python3); GPU_SH_SMOKE=1: tiny settings (a CPU check of the script, minutes on one
# thread); GPU_SH_THREADS (torch's CPU threads; default all cores); GPU_SH_NO_INSTALL=1: use the installed packages;
# GPU_SH_PIP_ARGS: more pip arguments for the wheels (e.g. "--python-version 3.12" to check them on another Python);
# GPU_SH_STEPS: timed training steps per round (default 1, of 64 pairs); GPU_SH_REPEATS: timed scoring calls per
# round (default 2); GPU_SH_ROUNDS: interleaved rounds (default 3); GPU_SH_TOTAL_S: the script's time budget (default
# 520 s); GPU_SH_TESTS=0 / GPU_SH_PROFILE=0: skip the GPU tests / the profile; GPU_SH_TESTS_S: the tests' limit
# (default 200 s); GPU_SH_TRAIN_METHODS, GPU_SH_SCORE_METHODS, GPU_SH_SCORE_BIG_METHODS: the rows of training, of
# 16 x 8 and of 64 x 16 scoring (comma-separated, as the scripts' --methods);
# GPU_SH_BENCHES: the benchmarks to run (comma-separated names of the tables, default all; always in the script's
# order); GPU_SH_LIMITS: their limits in seconds (seven numbers: train, score, score_64x16, profile and TRL's 64 x 16,
# train_long, train_4b, score_4b).
# The judge's benchmark (bench_judge.py) is no longer part of this run.
set -uo pipefail
export PYTHONUNBUFFERED=1
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1

PY=${PYTHON:-python3}
SMOKE=${GPU_SH_SMOKE:-0}
OUTDIR=${OUT:-/tmp/gpu-bench}
SITE=${GPU_SH_SITE:-/tmp/site}
THREADS=${GPU_SH_THREADS:-$(nproc)}
HH=.gpudata/harmless-base-test.jsonl.gz
TOTAL=${GPU_SH_TOTAL_S:-520}  # the whole script's budget (s): every benchmark's timeout is cut to what is left
mkdir -p "$OUTDIR"
: > "$OUTDIR/tables.md"

elapsed() { echo $((SECONDS)); }
say() { echo "[gpu.sh $(elapsed) s] $*"; }

# --- packages ------------------------------------------------------------------------------------------------------
if [[ ${GPU_SH_NO_INSTALL:-0} != 1 ]]; then
    # datasets 5.2 wants pyarrow >= 24; on an older pyarrow, .whl/fallback/: datasets 4.8.5 (pyarrow >= 21) instead
    pa_major=$("$PY" -c 'import pyarrow; print(pyarrow.__version__.split(".")[0])' 2>/dev/null || echo 0)
    wheels=()
    for w in .whl/*.whl; do
        [[ $pa_major -lt 24 && $(basename "$w") == datasets-* ]] && continue
        wheels+=("$w")
    done
    [[ $pa_major -lt 24 ]] && wheels+=(.whl/fallback/*.whl)  # with requests, which datasets 4.8 imports
    say "installing ${#wheels[@]} wheels into $SITE (pyarrow major: $pa_major)"
    # shellcheck disable=SC2086  # GPU_SH_PIP_ARGS: words
    if ! "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
        ${GPU_SH_PIP_ARGS:-} "${wheels[@]}" > "$OUTDIR/pip.log" 2>&1; then
        cat "$OUTDIR/pip.log"
        say "the wheels do not install: stopping"
        exit 1
    fi
    export PYTHONPATH=$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}
else
    export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
fi

# --- the machine and the versions ----------------------------------------------------------------------------------
nvidia-smi -L 2>/dev/null || echo "(no nvidia-smi)"
if ! "$PY" - <<'EOF' 2>&1 | tee "$OUTDIR/versions.txt"; then
import sys

import accelerate, datasets, huggingface_hub, tokenizers, torch, transformers, trl  # noqa: E401

import trl_rm_env
from trl_rm_env import RankedRewardTrainer, RewardModelEnvironment  # noqa: F401

print(f"python {sys.version.split()[0]}; torch {torch.__version__} (CUDA {torch.version.cuda}); transformers "
      f"{transformers.__version__}; trl {trl.__version__}; datasets {datasets.__version__}; accelerate "
      f"{accelerate.__version__}; huggingface_hub {huggingface_hub.__version__}; tokenizers {tokenizers.__version__}")
print(f"trl_rm_env from {trl_rm_env.__file__}; transformers from {transformers.__file__}")
print("device:", torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu (no CUDA)")
EOF
    say "the packages do not import: stopping"
    exit 1
fi

"$PY" -c "import torch; from trl_rm_env.sharing.kernels import varlen_usable, varlen_kernel, varlen_parameters as p
ok = torch.cuda.is_available() and varlen_usable(torch.device('cuda'), torch.bfloat16)
print('packed attention kernel on this device (bf16):', 'varlen' if ok else 'block mask',
      sorted(p()) if varlen_kernel() else '(no torch varlen_attn)')" 2>&1 | tee -a "$OUTDIR/versions.txt"

# bench NAME LIMIT_S ARGS...: one benchmark, its table to $OUTDIR/NAME.md, its log to $OUTDIR/NAME.log
bench() {
    local name=$1 limit=$2 rc arg cmd=""
    shift 2
    if [[ -n ${GPU_SH_BENCHES:-} && ,$GPU_SH_BENCHES, != *,$name,* ]]; then
        say "$name: not in GPU_SH_BENCHES"
        return
    fi
    for arg in "$@"; do [[ $arg == *" "* ]] && cmd+="\"$arg\" " || cmd+="$arg "; done
    local left=$((TOTAL - SECONDS))
    ((limit > left)) && limit=$left
    if ((limit < 20)); then
        say "$name: skipped, $left s left of $TOTAL"
        printf '\n## %s\n\nskipped: %s s left of the script'"'"'s %s\n' "$name" "$left" "$TOTAL" >> "$OUTDIR/tables.md"
        return
    fi
    # the benchmarks stop their methods at --deadline and still print their table (what finished) before the limit
    if [[ $1 == *bench_train.py || $1 == *bench_score.py ]]; then
        local deadline=$((limit * 9 / 10 - 5))
        set -- "$@" --deadline "$deadline"
        cmd+="--deadline $deadline "
    fi
    say "$name (at most $limit s): $cmd"
    timeout -k 10 "$limit" "$PY" "$@" > "$OUTDIR/$name.md" 2> "$OUTDIR/$name.log"
    rc=$?
    grep -E "^  done: " "$OUTDIR/$name.log"
    {
        printf '\n## %s\n\n`python %s`\n' "$name" "${cmd% }"
        cat "$OUTDIR/$name.md"
        if ((rc != 0)); then
            if ((rc == 124 || rc == 137)); then
                printf '\n%s: not done in %s s (exit %s); the methods done:\n' "$name" "$limit" "$rc"
            else
                printf '\n%s: failed (exit %s); the methods done and the log'"'"'s end:\n' "$name" "$rc"
            fi
            grep -E "^  done: " "$OUTDIR/$name.log"
            ((rc == 124 || rc == 137)) || tail -5 "$OUTDIR/$name.log"
        fi
    } >> "$OUTDIR/tables.md"
    say "$name: exit $rc"
}

# --- the GPU tests ---------------------------------------------------------------------------------------------------
# tests/gpu: the packed layout's varlen kernel against fp32 one-at-a-time scoring and the plain bf16 path (scores,
# per-pair losses, gradients), and a broken layout that must fail. Their table goes to tables.md.
if [[ ${GPU_SH_TESTS:-1} == 1 ]]; then
    say "pytest -m gpu tests/gpu"
    if [[ $SMOKE == 1 && ! $("$PY" -c 'import torch; print(torch.cuda.is_available())') == True ]]; then
        export TRL_RM_ENV_GPU_TESTS_ON_CPU=1  # the smoke run on a CPU: the reference kernel in the CUDA kernel's place
    fi
    TRL_RM_ENV_GPU_REPORT="$OUTDIR/gpu_tests.md" timeout -k 10 "${GPU_SH_TESTS_S:-200}" "$PY" -m pytest -m gpu tests/gpu \
        -q -p no:cacheprovider -rfEs > "$OUTDIR/gpu_tests.log" 2>&1
    rc=$?
    { printf '\n## gpu tests (`pytest -m gpu tests/gpu`, exit %s)\n\n```\n' "$rc"; tail -15 "$OUTDIR/gpu_tests.log"
      printf '```\n'; [[ -f $OUTDIR/gpu_tests.md ]] && cat "$OUTDIR/gpu_tests.md"; } >> "$OUTDIR/tables.md"
    say "gpu tests: exit $rc"
fi

# --- the benchmarks --------------------------------------------------------------------------------------------------
# Every method runs ROUNDS times, interleaved (the order rotated each round), each after its own warm-up; the tables
# show medians and ranges. Training: 64 pairs a step (8 x 8 accumulated, and 64 in one micro-batch for ours).
ROUNDS=${GPU_SH_ROUNDS:-3}
if [[ $SMOKE == 1 ]]; then
    TRAIN=(--model small --layers 2 --batch-size 2 --grad-accum 2 --max-length 512 --steps 1 --records 40)
    TRAIN_LONG=(--model small --layers 2 --batch-size 2 --grad-accum 1 --steps 1 --context 512)
    SCORE=(--model small --layers 2 --prompts 2 --generations 2 --repeats 1)
    SCORE_BIG=(--model small --layers 2 --prompts 3 --generations 4 --repeats 1)
    SCORE_TRL=(--model small --layers 2 --prompts 3 --generations 4 --repeats 1 --warmup 1)
    TRAIN_4B=(--model small --layers 1 --batch-size 2 --grad-accum 1 --max-length 512 --steps 1 --records 40)
    SCORE_4B=(--model small --layers 1 --prompts 2 --generations 2 --repeats 1)
    PROFILE=(--layers 1 --prompts 2 --generations 2 --train-pairs 2 --rows 8)
    LIMITS=(240 200 200 200 200 200 120)
    ROUNDS=${GPU_SH_ROUNDS:-2}
else
    TRAIN=(--model wide --layers 28 --batch-size 8 --grad-accum 8 --max-length 4096 --steps "${GPU_SH_STEPS:-1}" --records 200)
    TRAIN_LONG=(--model wide --layers 28 --batch-size 4 --grad-accum 2 --steps 1 --context 4096)
    SCORE=(--model wide --layers 28 --prompts 16 --generations 8 --repeats "${GPU_SH_REPEATS:-2}")
    SCORE_BIG=(--model wide --layers 28 --prompts 64 --generations 16 --repeats "${GPU_SH_REPEATS:-2}")
    SCORE_TRL=(--model wide --layers 28 --prompts 64 --generations 16 --repeats 1 --warmup 1)
    TRAIN_4B=(--model 4b --layers 6 --batch-size 8 --grad-accum 4 --max-length 4096 --steps 1 --records 400)
    SCORE_4B=(--model 4b --layers 6 --prompts 64 --generations 16 --repeats 2)
    PROFILE=(--layers 28 --prompts 64 --generations 16 --train-pairs 8,64 --rows 12)
    LIMITS=(210 100 70 60 45 45 40)
fi
# shellcheck disable=SC2206  # GPU_SH_LIMITS: words
[[ -n ${GPU_SH_LIMITS:-} ]] && LIMITS=(${GPU_SH_LIMITS})
TRAIN_METHODS=${GPU_SH_TRAIN_METHODS:-"TRL RewardTrainer,TRL RewardTrainer: checkpointing,TRL RewardTrainer: Liger,ours: defaults,ours: no fused kernels,ours: no window packing,ours: one micro-batch"}
SCORE_METHODS=${GPU_SH_SCORE_METHODS:-"TRL GRPO model reward,fp32 one at a time,ours: defaults,ours: plain"}
SCORE_BIG_METHODS=${GPU_SH_SCORE_BIG_METHODS:-"ours: defaults,ours: plain"}
bench train "${LIMITS[0]}" benchmarks/bench_train.py --data hh --hh-path "$HH" --precision bf16 --threads "$THREADS" \
    --rounds "$ROUNDS" --timeout $((LIMITS[0] / ROUNDS)) --methods "$TRAIN_METHODS" "${TRAIN[@]}"
bench score "${LIMITS[1]}" benchmarks/bench_score.py --data hh --hh-path "$HH" --precision bf16 --threads "$THREADS" \
    --budget auto --rounds "$ROUNDS" --timeout $((LIMITS[1] / ROUNDS)) --methods "$SCORE_METHODS" "${SCORE[@]}"
bench score_64x16 "${LIMITS[2]}" benchmarks/bench_score.py --data hh --hh-path "$HH" --precision bf16 \
    --threads "$THREADS" --budget auto --rounds "$ROUNDS" --timeout $((LIMITS[2] / ROUNDS)) \
    --methods "$SCORE_BIG_METHODS" "${SCORE_BIG[@]}"
# The packed scoring call and training micro-batches profiled: the CPU side, the forward, the kernels.
[[ ${GPU_SH_PROFILE:-1} == 1 ]] && bench profile "${LIMITS[3]}" benchmarks/profile_packed.py --hh-path "$HH" \
    --precision bf16 "${PROFILE[@]}"
# The packed layout's other kernel: FlexAttention (key/value heads shared, not repeated; compiled once, dynamic
# shapes), against the rows above run with the default (torch's varlen kernel where it runs).
export TRL_RM_ENV_PACKED_KERNEL=flex
bench score_flex "${LIMITS[1]}" benchmarks/bench_score.py --data hh --hh-path "$HH" --precision bf16 \
    --threads "$THREADS" --budget auto --rounds "$ROUNDS" --timeout $((LIMITS[1] / ROUNDS)) --methods "ours: defaults" \
    "${SCORE[@]}"
bench train_flex "${LIMITS[4]}" benchmarks/bench_train.py --data hh --hh-path "$HH" --precision bf16 \
    --threads "$THREADS" --rounds "$ROUNDS" --timeout $((LIMITS[4] / ROUNDS)) --methods "ours: defaults" "${TRAIN[@]}"
unset TRL_RM_ENV_PACKED_KERNEL
bench train_long "${LIMITS[4]}" benchmarks/bench_train.py --data long --precision bf16 --threads "$THREADS" \
    --rounds 2 --timeout $((LIMITS[4] / 2)) --methods "TRL RewardTrainer,ours: defaults" "${TRAIN_LONG[@]}"
bench train_4b "${LIMITS[5]}" benchmarks/bench_train.py --data hh --hh-path "$HH" --precision bf16 \
    --threads "$THREADS" --rounds 2 --timeout $((LIMITS[5] / 2)) --methods "TRL RewardTrainer,ours: defaults" \
    "${TRAIN_4B[@]}"
bench score_4b "${LIMITS[6]}" benchmarks/bench_score.py --data hh --hh-path "$HH" --precision bf16 \
    --threads "$THREADS" --budget auto --rounds 2 --timeout $((LIMITS[6] / 2)) --methods "ours: defaults,ours: plain" \
    "${SCORE_4B[@]}"

# TRL's GRPO path at 64 x 16 (all 1,024 completions in one padded forward; out of memory on an H200's 139 GiB): one
# round, one call, on its own and last so that a long or failed run of it costs none of the rows above.
bench score_64x16_trl "${LIMITS[3]}" benchmarks/bench_score.py --data hh --hh-path "$HH" --precision bf16 \
    --threads "$THREADS" --budget auto --rounds 1 --repeats 1 --timeout "${LIMITS[3]}" \
    --methods "TRL GRPO model reward,ours: plain" "${SCORE_TRL[@]}"

echo
echo "==================== all tables ($(elapsed) s) ===================="
cat "$OUTDIR/versions.txt"
cat "$OUTDIR/tables.md"
