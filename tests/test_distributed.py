"""Real 2-process `accelerate launch` runs of the recipes on CPU, one per accelerate_configs/*_cpu.yaml.

Each test starts `python -m accelerate.commands.launch --config_file accelerate_configs/<x>_cpu.yaml recipes/...`
in a subprocess (2 CPU processes, gloo) and checks what a user gets:

- train_rm under DDP, ZeRO-2, ZeRO-3 and FSDP2 (FSDP on CPU thanks to `enable_fsdp_on_cpu`) saves a plain Hugging
  Face checkpoint: `AutoModelForSequenceClassification.from_pretrained` loads every weight at full size, trained
  (not the initial weights), with `reward_mean`/`reward_std` in its config; under ZeRO-3 and FSDP2 each process
  held about half of the trained model;
- the saved per-set metrics (`eval_<name>_accuracy`, `_num_pairs`, `_loss`, reward moments) equal the same numbers
  computed by scoring each validation completion one at a time with the reloaded model. The validation sets are
  sized so that 2 processes x `per_device_eval_batch_size` divides neither (the last batches are padded with
  repeated records): a record counted twice or lost shows up as a wrong `num_pairs` or accuracy;
- every training step's loss equals a 1-process run's with the same global batch (ranked and regression RMs; the
  references run in the test's own process); under the packed layout FSDP2 cuts each micro-batch into bounded
  forwards and ZeRO-3 packs windows of 2 micro-batches a step, its losses those of one process with transformers'
  own accumulation (each launch checks training, its layout's forwards, saving, evaluation, resumption and the fresh
  folder);
- a run resumed from its step-5 checkpoint (ZeRO-3, FSDP2) ends as the uninterrupted run does;
- under ZeRO-3 and FSDP2 the environment's RM is sharded (half the parameters per process) and scores exactly;
- grpo_rm under DDP, ZeRO-2, ZeRO-3 and FSDP2 trains with the reward model as its reward function. The RM that
  `RewardModelEnvironment` loads is sharded (ZeRO-3: by `zero.Init`; FSDP2: by `fully_shard`); its first-step
  rewards must equal the DDP run's;
- under DDP, ZeRO-3 and FSDP2 both recipes start from an empty folder, as on a fresh checkout (`FRESH`): each builds
  the tiny offline models itself (the same weights `make_tiny` gives, so every comparison above holds), prints
  nothing a user cannot act on, and every process ends cleanly (tests/test_clean_exit.py says why that matters).

Runs are short (10 training steps, 3 GRPO steps, small data); timings on 2 CPU cores are in docs/distributed.md.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers import (
    ROOT,
    SAMPLE,
    assert_clean_exits,
    assert_quiet,
    free_port,
    launch,
    launch_env,
    needs_deepspeed,
    probe_env,
    recipe_in_process,
)

pytestmark = [pytest.mark.distributed, pytest.mark.slow]

MAX_STEPS = 10
PER_DEVICE_EVAL_BATCH = 8  # 2 processes x 8 = 16 records per eval step
EVAL_SIZES = {"in_domain": 37, "harder": 23}  # 37 = 2*16 + 5 and 23 = 16 + 7: uneven, padded last batches
MAX_LENGTH, TRUNCATION = 256, "left"  # as in recipes/configs/rm_tiny.yaml
FRESH = ("ddp_cpu.yaml", "zero3_cpu.yaml", "fsdp2_cpu.yaml")  # their first runs start in an empty folder
RM_TINY, GRPO_TINY = (str(ROOT / "recipes" / "configs" / name) for name in ("rm_tiny.yaml", "grpo_rm_tiny.yaml"))


def held_share(output: str) -> float:
    """The share of the trained model's parameters held by process 0, from the recipe's log line."""
    lines = [line for line in output.splitlines() if line.startswith("Model parameters held by this process: ")]
    assert lines, "the recipe printed no 'Model parameters held' line"
    return float(lines[0].split(": ")[1].split("%")[0]) / 100


def distributed_line(output: str) -> str:
    """The recipe's `Distributed: <type> x<processes> on <device>` line."""
    lines = [line for line in output.splitlines() if line.startswith("Distributed: ")]
    assert lines, "the recipe printed no 'Distributed:' line"
    return lines[0]


# ---------------------------------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def tiny(tiny_dir) -> Path:
    """The session's `make_tiny` output (`<dir>/reward_model`, `<dir>/policy`), read by every run here."""
    return tiny_dir


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> dict[str, Path]:
    """Small rank-schema files: 320 training records (10 steps of 2 x 16) and two oddly sized validation sets."""
    out = tmp_path_factory.mktemp("dist-data")
    sizes = {"train": 2 * 16 * MAX_STEPS, **EVAL_SIZES}
    paths = {}
    for name, size in sizes.items():
        lines = (SAMPLE / f"{name}.jsonl").read_text(encoding="utf-8").splitlines()[:size]
        assert len(lines) == size
        paths[name] = out / f"{name}.jsonl"
        paths[name].write_text("\n".join(lines) + "\n", encoding="utf-8")
    return paths


def run_recipe(
    config: str, script: str, output_dir: Path, model: tuple[str, ...], *args: str, fresh: Path | None = None,
    processes: int | None = None,
) -> str:
    """`launch` the recipe `script` (writing to `output_dir`); from the empty folder `fresh/work` when given (the tiny
    model is then the config's own `tiny-models/...`, built there), else with `model`. A 2-process run's processes
    are probed (`tests/scripts/exit_probe`): each ran its exit handlers, none reached finalization with a gloo thread
    alive (tests/test_clean_exit.py says why), so every such run here checks the clean exit."""
    probe = fresh / "probe" if fresh else output_dir.with_name(output_dir.name + "-probe")
    cwd = ROOT
    if fresh is not None:
        cwd = fresh / "work"
        cwd.mkdir()
    env = probe_env(probe) if processes in (None, 2) else None  # the configs' own count is 2
    output = launch(config, script, *(() if fresh else model), "--output_dir", str(output_dir), *args, cwd=cwd,
                    env=env, processes=processes)  # fmt: skip
    if env is not None:
        assert_clean_exits(probe)
    return output


def rm_options(data: dict[str, Path], batch: int, *extra: str) -> tuple[str, ...]:
    """The train_rm arguments every run here shares (the model and output folder aside)."""
    return (
        "--config", RM_TINY,
        "--train_data", str(data["train"]),
        "--eval_data", *(f"{name}={data[name]}" for name in EVAL_SIZES),
        "--max_steps", str(MAX_STEPS),
        "--eval_strategy", "no",  # the recipe still evaluates every set after training
        "--per_device_eval_batch_size", str(PER_DEVICE_EVAL_BATCH),
        "--per_device_train_batch_size", str(batch),
        "--logging_steps", "1",
        "--disable_tqdm", "true",
        *extra,
    )  # fmt: skip


def train_rm(
    config: str,
    tiny: Path,
    data: dict[str, Path],
    output_dir: Path,
    *extra: str,
    batch: int = 16,
    fresh: Path | None = None,
) -> str:
    return run_recipe(config, "recipes/train_rm.py", output_dir, ("--model_name_or_path", str(tiny / "reward_model")),
                      *rm_options(data, batch, *extra), fresh=fresh)  # fmt: skip


class Runs:
    """Launched runs shared by the tests of a config: `runs(config)` is the run's result, launched on first use;
    `runs.fresh[config]` the folder a `FRESH` config's run started in (`work/`, and `probe/` for its exits)."""

    def __init__(self, tmp_path_factory, prefix: str, start) -> None:
        self.tmp_path_factory, self.prefix, self.start = tmp_path_factory, prefix, start
        self.results: dict[str, Any] = {}
        self.fresh: dict[str, Path] = {}

    def __call__(self, config: str):
        if config not in self.results:
            name = f"{self.prefix}-{config.removesuffix('.yaml')}"
            if config in FRESH:
                self.fresh[config] = self.tmp_path_factory.mktemp(f"fresh-{name}")
            self.results[config] = self.start(config, self.tmp_path_factory.mktemp(name), self.fresh.get(config))
        return self.results[config]


WINDOW = ("--per_device_train_batch_size", "8", "--gradient_accumulation_steps", "2")
"""Each process: 2 micro-batches of 8 records a step, the 2 x 2 x 8 = 32 records of the other runs' steps."""

PACKED = ("--prefix_sharing", "packed", "--pack_max_tokens", "400")
"""The packed layout (the GPU's default, forced here on the CPU), each process's forwards cut at 400 tokens
(`pack_max_tokens`): the processes run different numbers of forwards, which they even out (ZeRO-3 and FSDP2 gather
weights per forward)."""
PACKED_WINDOWS = (*PACKED, *WINDOW, "--log_level", "info")
"""The packed layout with `window_packing` (on by default under it) over 2 micro-batches a step, each process's window
cut into forwards of at most 400 tokens; `info` logs the window line the tests read."""
WINDOW_LINE = ("window_packing='auto': the 2 micro-batches of each optimizer step run as few forwards as "
               "pack_max_tokens=400 allows.")  # fmt: skip


def rm_args(config: str) -> tuple[str, ...]:
    """The arguments of `config`'s train_rm runs (its first run and the run resumed from its checkpoint alike): ZeRO-3
    packs windows of 2 micro-batches (`trainer/windows.py`; the forwards before a window's last only accumulate, which
    under DeepSpeed means no optimizer step: `BoundedForwardsMixin._accumulating`'s own path), FSDP2 cuts each
    micro-batch of 16 into bounded forwards (`trainer/bounded_forwards.py`, under `no_sync`). Each mixin has one sharded
    2-process run, and resumes in it."""
    return {"zero3_cpu.yaml": PACKED_WINDOWS, "fsdp2_cpu.yaml": PACKED}.get(config, ())


@pytest.fixture(scope="module")
def rm_runs(tiny, data, tmp_path_factory) -> Runs:
    """`rm_runs(config) -> (output, output_dir)`: one 2-process train_rm run per config. Each saves resume
    checkpoints at steps 5 and 10 (`checkpoint-5`, `checkpoint-10`), with `rm_args(config)`: one launch checks
    training, saving, evaluation, the layout's forwards, resumption and a fresh folder."""

    def start(config: str, output_dir: Path, fresh: Path | None) -> tuple[str, Path]:
        output = train_rm(config, tiny, data, output_dir, "--save_strategy", "steps", "--save_steps", "5",
                          *rm_args(config), fresh=fresh)  # fmt: skip
        return output, output_dir

    return Runs(tmp_path_factory, "rm", start)


@pytest.fixture(scope="module")
def single_process_losses(tiny, data, tmp_path_factory) -> list[float]:
    """Per-step training losses of one process with the 2-process runs' global batch (1 x 32 = 2 x 16)."""
    output_dir = tmp_path_factory.mktemp("rm-one-process")
    recipe_in_process("train_rm", "--model_name_or_path", str(tiny / "reward_model"), "--output_dir",
                      str(output_dir), *rm_options(data, 32))  # fmt: skip
    return step_losses(output_dir)


# ---------------------------------------------------------------------------------------------------- checks
def step_losses(output_dir: Path) -> list[float]:
    """The training loss logged at each step (logging_steps=1), from trainer_state.json."""
    history = json.loads((output_dir / "trainer_state.json").read_text())["log_history"]
    losses = [(h["step"], h["loss"]) for h in history if "loss" in h]
    assert [step for step, _ in losses] == list(range(1, MAX_STEPS + 1))
    return [loss for _, loss in losses]


def check_same_losses_as_one_process(output_dir: Path, reference: list[float]) -> None:
    """Step k's loss equals one process's with the same global batch: same records per step, gradients averaged
    so that each step is the mean over every pair of the global batch (processes hold different pair counts)."""
    losses = step_losses(output_dir)
    assert losses == pytest.approx(reference, rel=1e-4, abs=1e-5), list(zip(losses, reference))
    assert len(set(losses)) > 1  # the model trained: the loss moved


def score_one_at_a_time(model, tokenizer, path: Path) -> dict[str, float]:
    """The per-set metrics recomputed from scratch: every completion scored alone (no padding, no batching)."""
    from trl_rm_env.data.loaders import load_rank_records
    from trl_rm_env.trainer.examples import tokenize_rank_record

    records, _ = load_rank_records(str(path))
    scores, pairs = [], []
    with torch.no_grad():
        for record in records:
            example, status = tokenize_rank_record(record, tokenizer, MAX_LENGTH, TRUNCATION)
            assert example is not None, status
            s = [model(input_ids=torch.tensor([ids])).logits[0, 0].double().item() for ids in example["completion_ids"]]
            ranks = example["ranks"]
            pairs += [(s[i], s[j]) for i in range(len(s)) for j in range(len(s)) if ranks[i] < ranks[j]]
            scores += s
    n = len(scores)
    mean = sum(scores) / n
    return {
        "num_pairs": len(pairs),
        "num_correct": sum(b > w for b, w in pairs),
        "num_near_ties": sum(abs(b - w) < 1e-5 for b, w in pairs),  # could flip between batched and single scoring
        "loss": sum(math.log1p(math.exp(-(b - w))) for b, w in pairs) / len(pairs),
        "rewards_chosen_mean": sum(b for b, _ in pairs) / len(pairs),
        "num_completions": n,
        "reward_mean": mean,
        "reward_std": math.sqrt(max(sum(x * x for x in scores) / n - mean**2, 0.0)),
    }


def check_saved_reward_model(output_dir: Path, tiny: Path, data: dict[str, Path]) -> None:
    """Plain-transformers reload: full-size trained weights, reward stats, and exact per-set metrics."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    model, info = AutoModelForSequenceClassification.from_pretrained(
        output_dir, dtype=torch.float32, output_loading_info=True
    )
    model.eval()
    assert not any(info.values()), f"loading reported problems: {info}"
    initial = AutoModelForSequenceClassification.from_pretrained(tiny / "reward_model", dtype=torch.float32)
    saved, start = model.state_dict(), initial.state_dict()
    assert saved.keys() == start.keys()
    for name, tensor in saved.items():  # full size everywhere: no empty ZeRO-3 / FSDP shards
        assert tensor.shape == start[name].shape and tensor.numel() > 0, name
        assert torch.isfinite(tensor).all(), name
    assert not torch.equal(saved["score.weight"], start["score.weight"]), "the saved weights are the initial ones"
    assert sum(p.numel() for p in model.parameters()) == sum(p.numel() for p in initial.parameters())

    config = json.loads((output_dir / "config.json").read_text())
    for key in ("reward_mean", "reward_std", "reward_stats"):
        assert key in config, f"{key} missing from config.json"
    assert set(config["reward_stats"]) == set(EVAL_SIZES)

    metrics = json.loads((output_dir / "eval_results.json").read_text())
    tokenizer = AutoTokenizer.from_pretrained(output_dir)
    all_scores_n, all_sum, all_sq = 0, 0.0, 0.0
    for name in EVAL_SIZES:
        assert f"eval_{name}_accuracy" in metrics, sorted(metrics)
        ref = score_one_at_a_time(model, tokenizer, data[name])
        # Exact counts: nothing counted twice from the padded last batches, nothing lost.
        assert metrics[f"eval_{name}_num_pairs"] == ref["num_pairs"], name
        correct = round(metrics[f"eval_{name}_accuracy"] * ref["num_pairs"])
        assert abs(correct - ref["num_correct"]) <= ref["num_near_ties"], (name, correct, ref)
        assert metrics[f"eval_{name}_accuracy"] == pytest.approx(correct / ref["num_pairs"], abs=1e-12)
        assert metrics[f"eval_{name}_loss"] == pytest.approx(ref["loss"], abs=1e-4), name
        assert metrics[f"eval_{name}_rewards_chosen_mean"] == pytest.approx(ref["rewards_chosen_mean"], abs=1e-4)
        stats = config["reward_stats"][name]
        assert stats["count"] == ref["num_completions"], name
        assert stats["mean"] == pytest.approx(ref["reward_mean"], abs=1e-4), name
        assert stats["std"] == pytest.approx(ref["reward_std"], abs=1e-4), name
        all_scores_n += ref["num_completions"]
        all_sum += ref["reward_mean"] * ref["num_completions"]
        all_sq += (ref["reward_std"] ** 2 + ref["reward_mean"] ** 2) * ref["num_completions"]
    mean = all_sum / all_scores_n
    assert config["reward_mean"] == pytest.approx(mean, abs=1e-4)
    assert config["reward_std"] == pytest.approx(math.sqrt(all_sq / all_scores_n - mean**2), abs=1e-4)


# ---------------------------------------------------------------------------------------------------- train_rm
def test_train_rm_ddp_cpu(rm_runs, tiny, data, single_process_losses):
    output, output_dir = rm_runs("ddp_cpu.yaml")
    assert distributed_line(output).startswith("Distributed: MULTI_CPU x2")
    assert held_share(output) == 1.0  # DDP: a full replica on every process
    # The recipe prints one row per validation set, and saves the metrics and the log history.
    rows = [line.split()[0] for line in output.splitlines() if line.startswith(("set ", "in_domain ", "harder "))]
    assert rows == ["set", "in_domain", "harder"], rows
    state = json.loads((output_dir / "trainer_state.json").read_text())
    assert state["global_step"] == MAX_STEPS
    logged = {key for entry in state["log_history"] for key in entry}
    assert {"eval_in_domain_accuracy", "eval_harder_accuracy", "loss", "accuracy"} <= logged
    check_saved_reward_model(output_dir, tiny, data)
    check_same_losses_as_one_process(output_dir, single_process_losses)


@needs_deepspeed
def test_train_rm_zero2_cpu(rm_runs, tiny, data, single_process_losses):
    """ZeRO-2 shards optimizer states and gradients only: whole weights on every process."""
    output, output_dir = rm_runs("zero2_cpu.yaml")
    assert distributed_line(output).startswith("Distributed: DEEPSPEED x2")
    assert "deepspeed_shm_comm" not in output, "DeepSpeed built its CPU comm op (prepare_process should skip it)"
    assert held_share(output) == 1.0
    assert not list(output_dir.glob("global_step*")), "a DeepSpeed checkpoint instead of a HF one"
    check_saved_reward_model(output_dir, tiny, data)
    check_same_losses_as_one_process(output_dir, single_process_losses)


SHM_PROBE = """
import os
import deepspeed.ops
from deepspeed.comm.torch import build_shm_op
from trl_rm_env.distributed import prepare_process

os.environ.pop("ACCELERATE_USE_DEEPSPEED", None)
prepare_process()
print("outside a DeepSpeed launch:", deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"])
os.environ["ACCELERATE_USE_DEEPSPEED"] = "true"
prepare_process()
print("in a DeepSpeed launch:", deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"], build_shm_op())
"""


@needs_deepspeed
def test_a_deepspeed_launch_on_the_cpu_skips_the_comm_op_build_and_nothing_else(tmp_path):
    """DeepSpeed's CPU backend would JIT-compile its shared-memory comm op as its process group starts (a minute, a
    compiler needed; it serves only inference all-reduces). In a DeepSpeed launch without an accelerator
    `prepare_process` marks it unavailable, so `build_shm_op` (what DeepSpeed's TorchBackend calls) returns None
    without building; outside a DeepSpeed launch DeepSpeed's own table is left as it was."""
    import subprocess
    import sys

    env = launch_env(free_port(), {"TORCH_EXTENSIONS_DIR": str(tmp_path)})  # a build would land here
    result = subprocess.run([sys.executable, "-c", SHM_PROBE], capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    lines = [line for line in result.stdout.splitlines() if "DeepSpeed launch" in line]
    assert lines == ["outside a DeepSpeed launch: True", "in a DeepSpeed launch: False None"]
    assert not any(tmp_path.iterdir()), "something was built"


@needs_deepspeed
def test_train_rm_zero3_with_window_packing_cpu(rm_runs, tiny, data, accumulated_losses):
    """ZeRO-3 shards the parameters too. It trains with `window_packing` over 2 micro-batches a step
    (`PACKED_WINDOWS`: each process's window cut into forwards of at most 400 tokens, the processes running different
    numbers, evened out: ZeRO-3 gathers each layer's weights in every forward): every step's loss is the one-process
    accumulated step's (the pairs of each micro-batch weighted over both processes), and the checkpoint is a plain
    Hugging Face one that scores exactly."""
    output, output_dir = rm_runs("zero3_cpu.yaml")
    assert distributed_line(output).startswith("Distributed: DEEPSPEED x2")
    assert held_share(output) < 0.55
    assert WINDOW_LINE in output
    assert not list(output_dir.glob("global_step*")), "a DeepSpeed checkpoint instead of a HF one"
    check_saved_reward_model(output_dir, tiny, data)
    check_same_losses_as_one_process(output_dir, accumulated_losses)


def test_train_rm_fsdp2_cpu(rm_runs, tiny, data, single_process_losses):
    """accelerate alone would run fsdp2_cpu.yaml as DDP on CPU; the recipe's `enable_fsdp_on_cpu` makes it FSDP2. Each
    micro-batch of 16 runs as bounded forwards (`PACKED`: at most 400 tokens each, the processes running different
    numbers, evened out: FSDP2 gathers weights in every forward): every step's loss is one process's with the global
    batch, and the trained model is saved as a full state dict that loads in one process and scores exactly."""
    output, output_dir = rm_runs("fsdp2_cpu.yaml")
    assert distributed_line(output).startswith("Distributed: FSDP x2")
    assert held_share(output) < 0.55  # FSDP2 shards: half of every parameter (rounded up) per process
    check_saved_reward_model(output_dir, tiny, data)
    check_same_losses_as_one_process(output_dir, single_process_losses)


@pytest.fixture(scope="module")
def accumulated_losses(tiny, data, tmp_path_factory) -> list[float]:
    """Per-step losses of one process with transformers' own accumulation (`window_packing=false`: a forward per
    micro-batch) over the window runs' micro-batches: 2 of 16 records a step (process p's m-th micro-batch of 8 and
    the other's are records 16m..16m+15 of the step)."""
    output_dir = tmp_path_factory.mktemp("rm-one-process-accumulated")
    recipe_in_process("train_rm", "--model_name_or_path", str(tiny / "reward_model"), "--output_dir",
                      str(output_dir), *rm_options(data, 16, "--gradient_accumulation_steps", "2", "--window_packing",
                                                   "false"))  # fmt: skip
    return step_losses(output_dir)


@pytest.mark.parametrize("config", [pytest.param("zero3_cpu.yaml", marks=needs_deepspeed), "fsdp2_cpu.yaml"])
def test_resume_from_checkpoint_cpu(config, rm_runs, tiny, data, tmp_path):
    """A 2-process run "stopped" after checkpoint-5 and resumed with `--resume_from_checkpoint` (model, optimizer,
    scheduler, RNG and data position restored in the backend's own format; under ZeRO-3 with window packing over 2
    micro-batches a step, under FSDP2 with bounded forwards) logs the uninterrupted run's losses at steps 6-10 and
    ends with its evaluation metrics and saved weights. (DDP's checkpoint is the plain `Trainer` format of one
    process, resumed in tests/test_trainer.py and tests/test_checkpoints.py; its 2-process data position and per-rank
    RNG are what these two runs restore too.)"""
    _, full_dir = rm_runs(config)
    checkpoint = full_dir / "checkpoint-5"
    assert checkpoint.is_dir(), sorted(p.name for p in full_dir.iterdir())
    resumed_dir = tmp_path / "resumed"
    train_rm(config, tiny, data, resumed_dir, "--resume_from_checkpoint", str(checkpoint), *rm_args(config))
    full, resumed = step_losses(full_dir), step_losses(resumed_dir)  # steps 1-5 come from the checkpoint's state
    assert resumed[5:] == pytest.approx(full[5:], rel=1e-4, abs=1e-5), list(zip(resumed, full))
    full_metrics = json.loads((full_dir / "eval_results.json").read_text())
    resumed_metrics = json.loads((resumed_dir / "eval_results.json").read_text())
    for name in EVAL_SIZES:
        for metric in ("accuracy", "loss", "margin", "num_pairs"):
            key = f"eval_{name}_{metric}"
            assert resumed_metrics[key] == pytest.approx(full_metrics[key], abs=1e-4), key
    from safetensors.torch import load_file

    full_weights, resumed_weights = load_file(full_dir / "model.safetensors"), load_file(resumed_dir / "model.safetensors")
    assert full_weights.keys() == resumed_weights.keys()
    for name, tensor in full_weights.items():
        torch.testing.assert_close(resumed_weights[name], tensor, atol=1e-5, rtol=1e-4, msg=name)


# ---------------------------------------------------------------------------------------------------- grpo_rm
def grpo_rm(config: str, tiny: Path, output_dir: Path, fresh: Path | None = None) -> tuple[str, list[dict]]:
    output = run_recipe(
        config, "recipes/grpo_rm.py", output_dir, ("--model_name_or_path", str(tiny / "policy")),
        "--config", GRPO_TINY,
        "--reward_model", str(tiny / "reward_model"),
        "--max_steps", "3",
        "--per_device_train_batch_size", "8",
        "--num_generations", "4",
        "--max_completion_length", "8",
        "--disable_tqdm", "true",
        fresh=fresh,
    )  # fmt: skip
    history = json.loads((output_dir / "trainer_state.json").read_text())["log_history"]
    steps = [h for h in history if "rewards/tiny_rm/mean" in h]
    assert [h["step"] for h in steps] == [1, 2, 3]
    for h in steps:
        assert math.isfinite(h["rewards/tiny_rm/mean"]) and h["rewards/tiny_rm/std"] > 0
        assert h["reward_model_env/num_samples"] == 8  # per process: 8 completions scored each step
    from transformers import AutoModelForCausalLM

    policy, info = AutoModelForCausalLM.from_pretrained(output_dir, output_loading_info=True)
    initial = AutoModelForCausalLM.from_pretrained(tiny / "policy")
    assert not any(info.values()), info
    assert {k: v.shape for k, v in policy.state_dict().items()} == {k: v.shape for k, v in initial.state_dict().items()}
    return output, steps


@pytest.fixture(scope="module")
def grpo_runs(tiny, tmp_path_factory) -> Runs:
    """`grpo_runs(config) -> (output, logged steps)`: one 2-process grpo_rm run per config (3 steps)."""
    return Runs(tmp_path_factory, "grpo", lambda config, output_dir, fresh: grpo_rm(config, tiny, output_dir, fresh))


def test_grpo_rm_ddp_cpu(grpo_runs):
    output, _ = grpo_runs("ddp_cpu.yaml")
    assert distributed_line(output).startswith("Distributed: MULTI_CPU x2")


@pytest.mark.parametrize(
    "config, backend",
    [
        pytest.param("zero2_cpu.yaml", "DEEPSPEED", marks=needs_deepspeed),
        pytest.param("zero3_cpu.yaml", "DEEPSPEED", marks=needs_deepspeed),
        ("fsdp2_cpu.yaml", "FSDP"),
    ],
)
def test_grpo_rm_sharded_cpu(config, backend, grpo_runs):
    """ZeRO-2 keeps whole weights (the RM is a plain replica); under ZeRO-3 the RM is loaded after the training
    arguments, so `from_pretrained` partitions it (`zero.Init`), and under FSDP2 the environment applies
    `fully_shard`. TRL prepares only reward *models*, so the environment gathers the RM's weights itself to score."""
    output, steps = grpo_runs(config)
    assert distributed_line(output).startswith(f"Distributed: {backend} x2")
    if config == "zero2_cpu.yaml":
        assert held_share(output) == 1.0
    else:
        assert held_share(output) < 0.55  # the policy is sharded too
    # Same seed, same initial policy, same prompts: the first generation batch and its rewards are the DDP run's.
    _, ddp_steps = grpo_runs("ddp_cpu.yaml")
    assert steps[0]["rewards/tiny_rm/mean"] == pytest.approx(ddp_steps[0]["rewards/tiny_rm/mean"], abs=1e-4)
    assert steps[0]["rewards/tiny_rm/std"] == pytest.approx(ddp_steps[0]["rewards/tiny_rm/std"], abs=1e-4)


@pytest.mark.parametrize(
    "config, sharding",
    [pytest.param("zero3_cpu.yaml", "zero3", marks=needs_deepspeed), ("fsdp2_cpu.yaml", "fsdp2")],
)
def test_reward_model_is_sharded_and_scores_exactly(config, sharding, tiny, tmp_path):
    """Under ZeRO-3 and FSDP2 each rank holds about half of the RM's parameters, before and after scoring, and the
    rewards every rank gets for its own completions (uneven shares) equal the plain model's scores one at a time."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from trl_rm_env.tokenization import encode_conversation

    records = [json.loads(line) for line in (SAMPLE / "in_domain.jsonl").read_text().splitlines()[:4]]
    items = [(r["context"], c["completion"]) for r in records for c in r["completions"]][:11]  # 6 and 5 per rank
    (tmp_path / "items.json").write_text(json.dumps(items))
    launch(
        config, "tests/scripts/sharded_reward_scores.py",
        str(tiny / "reward_model"), str(tmp_path / "items.json"), str(tmp_path / "out.json"),
    )  # fmt: skip
    ranks = json.loads((tmp_path / "out.json").read_text())

    model = AutoModelForSequenceClassification.from_pretrained(tiny / "reward_model", dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(tiny / "reward_model")
    total = sum(p.numel() for p in model.parameters())
    with torch.no_grad():
        reference = [
            model(input_ids=torch.tensor([encode_conversation(tokenizer, p, c)])).logits[0, 0].item() for p, c in items
        ]
    assert [r["rank"] for r in ranks] == [0, 1]
    for r in ranks:
        assert r["sharding"] == sharding and r["total"] == total
        assert r["local"] <= total / 2 + 1024, r  # a half partition (shards are padded or rounded per parameter)
        assert r["local_after_call"] == r["local"], r  # nothing stays gathered after scoring
        assert r["zero3_gathered_after_call"] == 0, r  # (ZeRO-3 frees the gathered copies: numel() is 0 again)
        assert r["indices"] == list(range(r["rank"], len(items), 2))
        assert r["rewards"] == pytest.approx([reference[i] for i in r["indices"]], abs=1e-4)
    assert sum(r["local"] for r in ranks) >= total


# ---------------------------------------------------------------------------------------------------- fresh folders
@pytest.mark.parametrize("config", ["ddp_cpu.yaml", pytest.param("zero3_cpu.yaml", marks=needs_deepspeed),
                                    "fsdp2_cpu.yaml"])  # fmt: skip
def test_a_fresh_folder_builds_the_tiny_models_and_every_process_ends_cleanly(config, rm_runs, grpo_runs, tiny):
    """Both recipes, each from its own empty folder: one process builds the tiny offline models (in a child process:
    under ZeRO-3 building in the training process while the other waits hung in `zero.Init`), the others wait for
    the folder; the build is whole (no staging folder left) and is `make_tiny`'s, weight for weight."""
    from safetensors.torch import load_file

    assert config in FRESH
    for runs, missing in ((rm_runs, "reward_model"), (grpo_runs, "policy")):
        output = runs(config)[0]
        fresh = runs.fresh[config]
        built = fresh / "work" / "tiny-models"
        assert output.count(f"tiny-models/{missing} not found: building the tiny offline models") == 1, output[-3000:]
        assert sorted(p.name for p in built.iterdir()) == ["policy", "reward_model"]  # no staging folder left
        for name in ("policy", "reward_model"):
            ours, reference = load_file(built / name / "model.safetensors"), load_file(tiny / name / "model.safetensors")
            assert ours.keys() == reference.keys() and all(torch.equal(ours[k], reference[k]) for k in ours), name
        assert_quiet(output)  # and every process ended cleanly: `run_recipe` checked `fresh / "probe"`


# ---------------------------------------------------------------------------------------------------- regression
def train_regression_rm(tmp: Path, output_dir: Path, processes: int, batch: int) -> list[float]:
    sample = {}
    for split, n in (("train", 2 * 16 * MAX_STEPS), ("in_domain", 37)):
        sample[split] = tmp / f"regression_{split}.jsonl"
        if not sample[split].exists():
            lines = (SAMPLE / f"regression_{split}.jsonl").read_text(encoding="utf-8").splitlines()[:n]
            sample[split].write_text("\n".join(lines) + "\n", encoding="utf-8")
    model = ("--model_name_or_path", str(tmp / "regression_model"))  # built by the first run (build_tiny_model: true)
    options = (
        "--config", str(ROOT / "recipes" / "configs" / "rm_regression_tiny.yaml"),
        "--train_data", str(sample["train"]),
        "--eval_data", f"in_domain={sample['in_domain']}",
        "--max_steps", str(MAX_STEPS),
        "--eval_strategy", "no",
        "--per_device_train_batch_size", str(batch),
        "--logging_steps", "1",
        "--disable_tqdm", "true",
    )  # fmt: skip
    if processes == 1:
        recipe_in_process("train_regression_rm", *model, "--output_dir", str(output_dir), *options)
    else:
        run_recipe("ddp_cpu.yaml", "recipes/train_regression_rm.py", output_dir, model, *options, processes=processes)
    return step_losses(output_dir)


def test_train_regression_rm_ddp_cpu_matches_one_process(tmp_path):
    """Regression records carry different numbers of rated values: the 2-process MSE per step is the global batch's."""
    single = train_regression_rm(tmp_path, tmp_path / "one", processes=1, batch=32)
    double = train_regression_rm(tmp_path, tmp_path / "two", processes=2, batch=16)
    assert double == pytest.approx(single, rel=1e-4, abs=1e-5), list(zip(double, single))
    assert len(set(single)) > 1

