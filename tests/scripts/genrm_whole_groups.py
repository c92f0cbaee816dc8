"""Launched by tests/test_genrm_judge.py with accelerate_configs/ddp_cpu.yaml and 2 processes.

    accelerate launch --config_file accelerate_configs/ddp_cpu.yaml tests/scripts/genrm_whole_groups.py \
        URL BATCH_JSON OUT_JSON [BATCH_JSON OUT_JSON ...]

Each process takes its contiguous share of BATCH_JSON (`{"prompts": [...], "completions": [...], "options": {...},
"columns": {...}}`), as TRL splits a global batch between processes (a GRPO group may span both), and calls one
GenRM judge (`JudgeEnvironment(remote_url=URL, mode="genrm", **options)`) on it, twice (a judge's exchanges repeat
call after call). Rank 0 writes every process's rewards, or the error its calls raised, in rank order, to OUT_JSON.
Several batches run one after another in the same launch, each with its own judge.
"""

from __future__ import annotations

import asyncio
import json
import sys

import torch.distributed as dist
from accelerate import PartialState

from trl_rm_env import JudgeEnvironment
from trl_rm_env.distributed import exit_process


def main(url: str, batch_path: str, out_path: str) -> None:
    PartialState()  # the process group, as the trainers start it
    batch = json.loads(open(batch_path, encoding="utf-8").read())
    n, world, rank = len(batch["prompts"]), dist.get_world_size(), dist.get_rank()
    size = -(-n // world)
    share = slice(rank * size, (rank + 1) * size)
    env = JudgeEnvironment(remote_url=url, remote_input="messages", mode="genrm", **batch["options"])
    columns = {name: values[share] for name, values in batch.get("columns", {}).items()}
    try:
        rewards = [asyncio.run(env(batch["prompts"][share], batch["completions"][share], **columns)) for _ in range(2)]
    except Exception as err:  # every process raises (none is left waiting): recorded, for the test to read
        rewards = {"error": f"{type(err).__name__}: {err}"}
    gathered = [None] * world
    dist.all_gather_object(gathered, rewards)
    if rank == 0:
        with open(out_path, "w", encoding="utf-8") as f:
            json.dump(gathered, f)


if __name__ == "__main__":
    for batch, out in zip(sys.argv[2::2], sys.argv[3::2]):
        main(sys.argv[1], batch, out)
    exit_process(0)
