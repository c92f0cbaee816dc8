#!/usr/bin/env bash
# One GPU benchmark run on a lent machine without network: training (bench_train.py), GRPO reward scoring
# (bench_score.py) and a pointwise judge on transformers (bench_judge.py), Qwen3-0.6B's shape (28 layers, random
# init, bf16), hh-rlhf harmless-base test data, in under 8 minutes. Run from the repository root with the wheels of
# .whl/ and the data of .gpudata/ carried (both ignored by git, never committed):
#
#     bash benchmarks/gpu.sh
#
# Making them (here, with network; `/.whl/` and `/.gpudata/` in .git/info/exclude):
#
#     for w in trl==1.16.0 transformers==5.24.0 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19 accelerate==1.15.0 \
#              peft==0.21.2; do python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
#              --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
#              --platform manylinux2014_x86_64 -d .whl "$w"; done
#     mkdir -p .gpudata && cp ../shared/data/hh-rlhf/harmless-base-test.jsonl.gz .gpudata/
#
# (an image whose pyarrow is older than 24 also needs datasets 4.8.5 and requests' wheels in .whl/fallback/). Then
# call the device with `carry: [".whl", ".gpudata"]` and a timeout of about 540 s.
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
# GPU_SH_STEPS: timed training steps (default 30); GPU_SH_REPEATS: timed scoring calls (default 5); GPU_SH_TOTAL_S:
# the script's time budget (default 455 s); GPU_SH_PROFILE=0 / GPU_SH_JUDGE=0: skip the profile / the judge;
# GPU_SH_TRAIN_METHODS, GPU_SH_SCORE_METHODS: the rows (comma-separated, as the scripts' --methods).
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
TOTAL=${GPU_SH_TOTAL_S:-455}  # the whole script's budget (s): every benchmark's timeout is cut to what is left
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

# --- the benchmarks --------------------------------------------------------------------------------------------------
if [[ $SMOKE == 1 ]]; then
    TRAIN=(--model small --layers 2 --batch-size 2 --max-length 512 --steps 2 --records 40)
    SCORE=(--model small --layers 2 --prompts 2 --generations 2 --repeats 1)
    JUDGE=(--layers 1 --prompts 2 --generations 2 --repeats 1 --max-length 2048)
    LIMITS=(240 240 120)
else
    TRAIN=(--model wide --layers 28 --batch-size 8 --max-length 1024 --steps "${GPU_SH_STEPS:-30}" --records 400)
    SCORE=(--model wide --layers 28 --prompts 16 --generations 8 --repeats "${GPU_SH_REPEATS:-5}")
    JUDGE=(--layers 28 --prompts 4 --generations 8 --repeats 2)
    LIMITS=(170 230 60)
fi

# bench NAME LIMIT_S ARGS...: one benchmark, its table to $OUTDIR/NAME.md, its log to $OUTDIR/NAME.log
bench() {
    local name=$1 limit=$2 rc arg cmd=""
    shift 2
    for arg in "$@"; do [[ $arg == *" "* ]] && cmd+="\"$arg\" " || cmd+="$arg "; done
    local left=$((TOTAL - SECONDS))
    ((limit > left)) && limit=$left
    if ((limit < 20)); then
        say "$name: skipped, $left s left of $TOTAL"
        printf '\n## %s\n\nskipped: %s s left of the script'"'"'s %s\n' "$name" "$left" "$TOTAL" >> "$OUTDIR/tables.md"
        return
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

# The packed scoring call profiled first (GPU_SH_PROFILE=0 skips it): the CPU side, the forward, the kernels.
if [[ ${GPU_SH_PROFILE:-1} == 1 ]]; then
    PROFILE=(--layers 28 --prompts 16)
    [[ $SMOKE == 1 ]] && PROFILE=(--layers 1 --prompts 2)
    bench profile 60 benchmarks/profile_packed.py --hh-path "$HH" --precision bf16 "${PROFILE[@]}"
fi
TRAIN_METHODS=${GPU_SH_TRAIN_METHODS:-"TRL RewardTrainer,ours: defaults,ours: plain"}
SCORE_METHODS=${GPU_SH_SCORE_METHODS:-"TRL GRPO model reward,fp32 one at a time,ours: defaults,ours: plain,ours: budget 16384,ours: budget 65536,ours: budget 131072"}
bench train "${LIMITS[0]}" benchmarks/bench_train.py --data hh --hh-path "$HH" --precision bf16 --threads "$THREADS" \
    --timeout $((LIMITS[0] / 3)) --methods "$TRAIN_METHODS" "${TRAIN[@]}"
bench score "${LIMITS[1]}" benchmarks/bench_score.py --data hh --hh-path "$HH" --precision bf16 --threads "$THREADS" \
    --budget auto --settle 1 --timeout $((LIMITS[1] / 4)) \
    --methods "$SCORE_METHODS" "${SCORE[@]}"
[[ ${GPU_SH_JUDGE:-1} == 1 ]] && bench judge "${LIMITS[2]}" benchmarks/bench_judge.py --hh-path "$HH" --precision bf16 --threads "$THREADS" \
    --timeout $((LIMITS[2] - 10)) --methods "ours: pointwise" "${JUDGE[@]}"

echo
echo "==================== all tables ($(elapsed) s) ===================="
cat "$OUTDIR/versions.txt"
cat "$OUTDIR/tables.md"
