"""Launched recipes finish with exit 0 on any machine of our kind: nothing hangs, nothing aborts at exit.

- From a fresh checkout (no `tiny-models/`, run from an empty folder as the README's commands would be): both
  recipes build the tiny offline models and finish under DDP, DeepSpeed ZeRO-3 and FSDP2 (2 CPU processes), quiet
  and with clean exits. Those runs are tests/test_distributed.py's own (`test_a_fresh_folder_builds_...`): under
  ZeRO-3 building a model on one process while the others wait used to hang forever (`zero.Init` is a collective);
  the build now runs in a child process, and the other processes wait for the folder, bounded.
- What a run prints is what a user can act on (`helpers.assert_quiet`).
- Every 2-process recipe run of tests/test_distributed.py (train_rm, grpo_rm and train_regression_rm under DDP,
  ZeRO-2, ZeRO-3 and FSDP2, resumed runs too: about fifteen launches) exits 0, every process ran its exit handlers,
  and none reached interpreter finalization with a gloo thread alive (`tests/scripts/exit_probe`,
  `helpers.assert_clean_exits`). Tearing a gloo process group down joins its worker threads, which may need the GIL
  to free a finished work item's tensors: during finalization such a thread aborted the process now and then
  (SIGABRT, "terminate called without an active exception") after the policy was saved; freed earlier, from the
  thread holding the GIL, it deadlocks. The recipes' processes end with `trl_rm_env.distributed.exit_process`
  instead, so the group is never torn down. The probe catches a regression on any one run; the abort came now and
  then, which the many probed launches cover.
- Every wait between processes we add is bounded and names what it waited for (`trl_rm_env.waiting`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
from helpers import ROOT, free_port

from trl_rm_env.model_source import ensure_tiny_model
from trl_rm_env.waiting import WaitTimeoutError, wait_for_everyone, wait_for_path

pytestmark = pytest.mark.slow  # end to end: trainers, servers or spawned processes (`-m "not slow"` skips them)


# ------------------------------------------------------------------------------------------- bounded waits
def test_waiting_for_a_folder_that_never_appears_names_it(tmp_path):
    with pytest.raises(WaitTimeoutError, match=rf"^waited 0.3 s for the builder \({tmp_path}/x did not appear\); "
                       r"check its log\. Set TRL_RM_ENV_WAIT_TIMEOUT to wait longer\.$"):
        wait_for_path(tmp_path / "x", "the builder", "check its log", timeout=0.3, poll=0.05)


def test_other_local_processes_wait_for_the_tiny_models_bounded(tmp_path, monkeypatch):
    """Local process 1 never builds: it waits for local process 0's folder, and says so when it does not come."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("LOCAL_RANK", "1")
    built = []
    with pytest.raises(WaitTimeoutError, match=r"^waited 0.2 s for local process 0 to build the tiny offline models at "
                       r"tiny-models/reward_model \(tiny-models/reward_model did not appear\); check process 0's output"):
        ensure_tiny_model("tiny-models/reward_model", "reward_model", lambda: built.append(1), timeout=0.2)
    assert built == []
    monkeypatch.setenv("TRL_RM_ENV_WAIT_TIMEOUT", "soon")
    with pytest.raises(ValueError, match=r"^TRL_RM_ENV_WAIT_TIMEOUT='soon' must be a positive number of seconds$"):
        ensure_tiny_model("tiny-models/reward_model", "reward_model")


def test_build_in_a_child_process_is_atomic(tmp_path, monkeypatch, capsys):
    """Local process 0 builds in a fresh interpreter and the folders appear whole (renamed into place)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    ensure_tiny_model("tiny-models/regression_model", "regression_model", num_labels=3)
    out = capsys.readouterr().out
    assert out.startswith("tiny-models/regression_model not found: building the tiny offline models")
    assert "  regression_model: tiny-models/regression_model" in out
    config = json.loads((tmp_path / "tiny-models" / "regression_model" / "config.json").read_text())
    assert len(config["id2label"]) == 3
    assert sorted(p.name for p in (tmp_path / "tiny-models").iterdir()) == ["regression_model"]


BARRIER_SCRIPT = textwrap.dedent(
    """
    import datetime, os, sys, time
    import torch.distributed as dist
    from trl_rm_env.waiting import WaitTimeoutError, wait_for_everyone

    class Accelerator:  # the two members wait_for_everyone uses, on a real gloo group
        num_processes = 2
        def wait_for_everyone(self):
            dist.barrier()

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=2))
    if dist.get_rank() == 1:
        time.sleep(6)  # never reaches the barrier in time
        sys.exit(0)
    try:
        wait_for_everyone(Accelerator(), "finish writing checkpoint-10")
    except WaitTimeoutError as err:
        print("WAIT:", err)
    """
)


def test_a_barrier_that_times_out_says_which_one(tmp_path):
    script = tmp_path / "barrier.py"
    script.write_text(BARRIER_SCRIPT)
    port = str(free_port())
    procs = [
        subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         env={**os.environ, "RANK": str(rank), "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
                              "MASTER_PORT": port, "PYTHONPATH": str(ROOT)})
        for rank in (0, 1)
    ]  # fmt: skip
    outputs = [p.communicate(timeout=120)[0] for p in procs]
    line = next((line for line in outputs[0].splitlines() if line.startswith("WAIT:")), None)
    assert line == (
        "WAIT: timed out waiting for all 2 processes to finish writing checkpoint-10: at least one never got there. "
        "Look at the other processes' output above for an error or a process stuck elsewhere; the wait is the process "
        "group's timeout (`ddp_timeout`, default 1800 s)."
    ), outputs[0][-2000:]


def test_a_failing_barrier_that_is_not_a_timeout_is_not_renamed():
    class Broken:
        num_processes = 2

        def wait_for_everyone(self):
            raise RuntimeError("Connection reset by peer")

    with pytest.raises(RuntimeError, match="^Connection reset by peer$"):
        wait_for_everyone(Broken(), "finish writing checkpoint-10")
