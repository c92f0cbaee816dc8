"""FSDP2 sharding of the environment's reward model (trl_rm_env.distributed), in-process and with 2 gloo processes.

The 2-process test runs `RewardModelEnvironment(fsdp_shard=True)` in spawned workers: each holds half of the RM,
and the ranks score different numbers of completions per call (one of them none at all: the unshard collective
must still line up, with no collective in the forward passes). Rewards must equal the plain model's one-at-a-time
scores within 1e-4. The accelerate-launched runs of the recipes under fsdp2_cpu.yaml are in test_distributed.py.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time

import pytest
import torch
import torch.multiprocessing as mp
from helpers import reference_ids, score_one

pytestmark = pytest.mark.slow  # end to end: trainers, servers or spawned processes (`-m "not slow"` skips them)

ITEMS = [
    ("Name a primary colour.", "Red."),
    ("Name a primary colour.", "Blue is one, and so is yellow."),
    ([{"role": "user", "content": "What is 2 + 2?"}], [{"role": "assistant", "content": "4"}]),
    ([{"role": "user", "content": "What is 2 + 2?"}], [{"role": "assistant", "content": "It is five."}]),
    ("Say hello.", "Hello!"),
    ("Say hello.", "Good morning to you, and hello."),
    ("Say hello.", ""),
]
TIMEOUT = 300  # seconds for both workers (about 10 s on 2 CPU cores)
# Per call, the item indices each rank scores: uneven shares, and a rank with nothing to score.
CALLS = [{0: [0, 1, 2, 3, 4], 1: []}, {0: [], 1: [5, 6, 0]}, {0: [6], 1: [1, 2, 3, 4, 5]}]


def _worker(rank: int, world_size: int, port: int, model_dir: str, out_dir: str, prefix_sharing: bool) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world_size))
    os.environ.update(LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world_size))
    torch.set_num_threads(1)
    import torch.distributed as dist

    from trl_rm_env import RewardModelEnvironment
    from trl_rm_env.distributed import exit_process, held_parameters

    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        # A ZeRO-3 launch whose RM was loaded before the training arguments: replicated, and the user is told.
        warnings = []
        handler = logging.Handler()
        handler.emit = lambda record: warnings.append(record.getMessage())
        logging.getLogger("trl_rm_env.rewards").addHandler(handler)
        os.environ.update(ACCELERATE_USE_DEEPSPEED="true", ACCELERATE_DEEPSPEED_ZERO_STAGE="3")
        replicated = RewardModelEnvironment(model_dir, device="cpu").sharding
        del os.environ["ACCELERATE_USE_DEEPSPEED"], os.environ["ACCELERATE_DEEPSPEED_ZERO_STAGE"]
        logging.getLogger("trl_rm_env.rewards").removeHandler(handler)

        env = RewardModelEnvironment(model_dir, device="cpu", batch_size=2, fsdp_shard=True, prefix_sharing=prefix_sharing)
        local, total = held_parameters(env.model)
        record = {"sharding": env.sharding, "local": local, "total": total, "rewards": []}
        record["zero3_unpartitioned"] = [replicated, any("not partitioned" in m for m in warnings)]
        for call in CALLS:
            mine = call[rank]
            record["rewards"].append(env([ITEMS[i][0] for i in mine], [ITEMS[i][1] for i in mine]))
            record.setdefault("local_after_calls", []).append(held_parameters(env.model)[0])
        with open(os.path.join(out_dir, f"rank{rank}.json"), "w", encoding="utf-8") as f:
            json.dump(record, f)
    except BaseException:
        dist.destroy_process_group()
        raise
    # As the recipes end: a gloo process group torn down at interpreter finalization can abort the process
    # ("terminate called without an active exception"); exit_process never tears it down (trl_rm_env/distributed.py).
    exit_process(0)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.distributed
@pytest.mark.parametrize("prefix_sharing", [False, True])
def test_fsdp2_environment_is_sharded_and_scores_exactly(tiny_dir, tmp_path, prefix_sharing):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    model_dir = str(tiny_dir / "reward_model")
    workers = mp.start_processes(
        _worker,
        args=(2, _free_port(), model_dir, str(tmp_path), prefix_sharing),
        nprocs=2,
        join=False,
        start_method="spawn",
    )
    deadline = time.monotonic() + TIMEOUT
    while not workers.join(timeout=5):  # raises if a worker failed
        if time.monotonic() > deadline:  # e.g. mismatched collectives: the ranks wait for each other forever
            for process in workers.processes:
                process.kill()
            pytest.fail(f"the workers did not finish within {TIMEOUT}s")
    model = AutoModelForSequenceClassification.from_pretrained(model_dir, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    reference = [score_one(model, reference_ids(tokenizer, p, c)) for p, c in ITEMS]
    total = sum(p.numel() for p in model.parameters())
    for rank in (0, 1):
        record = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert record["sharding"] == "fsdp2" and record["total"] == total
        assert record["zero3_unpartitioned"] == ["none", True]  # replicated under ZeRO-3, with a warning
        assert record["local"] <= total / 2 + 1024, record["local"]  # each rank holds half of every parameter
        assert record["local_after_calls"] == [record["local"]] * len(CALLS)  # resharded after every call
        for call, rewards in zip(CALLS, record["rewards"]):
            assert rewards == pytest.approx([reference[i] for i in call[rank]], abs=1e-4)


def test_fsdp_shard_needs_several_processes(tiny_dir):
    from trl_rm_env import RewardModelEnvironment

    with pytest.raises(ValueError, match="more than one process"):
        RewardModelEnvironment(str(tiny_dir / "reward_model"), device="cpu", fsdp_shard=True)
    env = RewardModelEnvironment(str(tiny_dir / "reward_model"), device="cpu")  # default: no FSDP config, no shards
    assert env.sharding == "none"


def test_enable_fsdp_on_cpu_only_when_requested(monkeypatch):
    from accelerate.state import AcceleratorState

    from trl_rm_env import distributed

    original = AcceleratorState.__init__
    monkeypatch.setattr(AcceleratorState, "__init__", original)  # undone after the test, whatever happens here
    monkeypatch.delenv("ACCELERATE_USE_FSDP", raising=False)
    assert distributed.enable_fsdp_on_cpu() is False
    assert AcceleratorState.__init__ is original

    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    monkeypatch.setattr(distributed, "_has_accelerator", lambda: True)  # a GPU machine: accelerate handles FSDP
    assert distributed.enable_fsdp_on_cpu() is False
    assert AcceleratorState.__init__ is original

    monkeypatch.setattr(distributed, "_has_accelerator", lambda: False)
    assert distributed.enable_fsdp_on_cpu() is True
    patched = AcceleratorState.__init__
    assert patched is not original and patched.__wrapped__ is original
    assert distributed.enable_fsdp_on_cpu() is True and AcceleratorState.__init__ is patched  # wrapped once
