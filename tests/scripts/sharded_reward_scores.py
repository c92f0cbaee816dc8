"""Launched by tests/test_distributed.py with a ZeRO-3 or FSDP2 accelerate config and 2 processes.

    accelerate launch --config_file accelerate_configs/zero3_cpu.yaml tests/scripts/sharded_reward_scores.py \
        MODEL_DIR ITEMS_JSON OUT_JSON

Builds `RewardModelEnvironment(MODEL_DIR)` the way recipes/grpo_rm.py does (after the training arguments, so that
under ZeRO-3 `from_pretrained` runs under `zero.Init`; under FSDP2 the environment applies `fully_shard`), records
how many parameter elements each rank holds, and scores a different, unevenly sized share of ITEMS_JSON
(`[[prompt, completion], ...]`) on each rank: items i with `i % world_size == rank`. Rank 0 writes every rank's
numbers to OUT_JSON.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile

import torch.distributed as dist
from accelerate import PartialState
from transformers import TrainingArguments

from trl_rm_env import RewardModelEnvironment
from trl_rm_env.distributed import exit_process, held_parameters, prepare_process


def main(model_dir: str, items_path: str, out_path: str) -> None:
    prepare_process()  # as the recipes start: before the process group exists
    # As in the recipes: the training arguments switch on the accelerate config's ZeRO-3. transformers holds that
    # config through a weak reference, so the arguments must stay alive while the RM is created.
    args = TrainingArguments(output_dir=tempfile.mkdtemp(), use_cpu=True, report_to="none")  # noqa: F841
    state = PartialState()
    # FSDP2 scores with the packed layout (the GPU's default): one padding-free forward per micro-batch.
    packed = {"prefix_sharing": "packed"} if os.environ.get("ACCELERATE_USE_FSDP") == "true" else {}
    env = RewardModelEnvironment(model_dir, device=state.device, batch_size=3, **packed)
    local, total = held_parameters(env.model)
    record = {"rank": state.process_index, "sharding": env.sharding, "total": total, "local": local}
    items = json.loads(open(items_path, encoding="utf-8").read())
    mine = [i for i in range(len(items)) if i % state.num_processes == state.process_index]
    record["indices"] = mine
    record["rewards"] = env([items[i][0] for i in mine], [items[i][1] for i in mine])
    # Outside the scoring call the weights are sharded again: no full copy stays on the rank.
    record["local_after_call"] = held_parameters(env.model)[0]  # FSDP2: full tensors while unsharded
    record["zero3_gathered_after_call"] = sum(p.numel() for p in env.model.parameters() if hasattr(p, "ds_tensor"))
    gathered = [None] * state.num_processes
    dist.all_gather_object(gathered, record)
    if state.is_main_process:
        with open(out_path, "w", encoding="utf-8") as f:
            json.dump(gathered, f)
    # As the recipes end: a gloo process group torn down at interpreter finalization can abort the process
    # ("terminate called without an active exception"); exit_process never tears it down (trl_rm_env/distributed.py).
    exit_process(0)


if __name__ == "__main__":
    main(*sys.argv[1:4])
