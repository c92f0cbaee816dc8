"""FSDP2 for reward models: sharding a scoring-only RM with `fully_shard`, and FSDP on CPU process groups.

Three pieces, all used by the recipes and usable from any TRL script:

- `prepare_process()` / `exit_process()`: what a launched process sets up before its process group exists, and how
  it ends once its work is done, so that it exits 0 (see "clean exit" below).

- `enable_fsdp_on_cpu()`: accelerate (checked up to 1.15) turns an FSDP config into FSDP only for accelerator
  process groups (`AcceleratorState.__init__` lists MULTI_GPU, MULTI_XPU, MULTI_NPU, ... but never MULTI_CPU), so
  `accelerate launch --config_file accelerate_configs/fsdp2_cpu.yaml` silently trains as plain DDP on CPU. torch's
  FSDP2 itself works on CPU with gloo. This extends accelerate's check to MULTI_CPU, and only that.
- `shard_if_requested` / `shard_reward_model` / `full_weights`: the RM of `RewardModelEnvironment` under FSDP2 is
  sharded with `fully_shard` (each transformer block, then the root), like the policy, and unsharded for one scoring
  call at a time; under ZeRO-3 `zero.Init` partitioned it and DeepSpeed gathers it. TRL's GRPOTrainer only moves a reward *callable*'s model to the device: without this every rank would hold
  a full replica.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import sys
import warnings
from typing import NoReturn

import torch

logger = logging.getLogger(__name__)


# ---------------------------------------------------------------------------------------------------- clean exit
# A gloo process group runs worker threads. A worker that drops the last reference to a finished collective's work
# item frees its tensors, and a tensor created in Python has a Python owner: freeing it takes the GIL. Tearing the
# group down (`~ProcessGroupGloo`) joins those workers, so:
# - torn down during interpreter finalization (where a script's process group normally goes, kept alive by DDP's
#   reducer and by default arguments that `torch.distributed.nn` and DeepSpeed bind at import time), a worker that
#   asks for the GIL is unwound with `pthread_exit` through C++ code: "terminate called without an active exception",
#   SIGABRT, `accelerate launch` exit 1, after all the work is done, now and then;
# - torn down while the interpreter runs, from the thread that holds the GIL (freeing the last model that holds it),
#   the join waits for a worker that waits for the GIL: a deadlock (seen with a freed DDP reducer).
# Neither can happen if the group is never torn down: `exit_process` ends a launched process without interpreter
# finalization, once its work and its exit handlers are done.

# DeepSpeed calls these deprecated torch.distributed functions under ZeRO-3 (ten warnings per short run); TRL 1.16's
# generation path reads a property transformers 5 deprecates. Neither is anything a user can act on.
_UNACTIONABLE_WARNINGS = (
    r"`torch\.distributed\.(all_gather_into_tensor|reduce_scatter_tensor)` is deprecated",
    r"`is_gradient_checkpointing` is deprecated",
)


def prepare_process() -> None:
    """Set up a recipe process before its arguments (and so its process group) exist.

    Tells DeepSpeed it runs on the CPU when there is no accelerator (`DS_ACCELERATOR=cpu`, unless set: DeepSpeed
    would warn in every process that it could not find a GPU), spares a DeepSpeed launch on the CPU the build of an op
    it never calls (`skip_deepspeed_cpu_shm_build`) and silences the warnings in `_UNACTIONABLE_WARNINGS`. Call it
    first in a launched script of your own to get the same.
    """
    if not _has_accelerator():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
        skip_deepspeed_cpu_shm_build()
    for message in _UNACTIONABLE_WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=FutureWarning)


def skip_deepspeed_cpu_shm_build() -> bool:
    """In a DeepSpeed launch on the CPU, mark DeepSpeed's shared-memory comm op (`deepspeed_shm_comm`) unavailable
    unless it was prebuilt; return True when it was marked.

    DeepSpeed's CPU backend JIT-compiles that op when its process group starts (a C++ compiler and ninja needed, about
    a minute on 2 cores, once per environment: the build is keyed on the sources' paths). It serves only
    `inference_all_reduce` (DeepSpeed inference and tensor parallelism); ZeRO's gradients and partitions go through
    torch.distributed either way, and `inference_all_reduce` falls back to torch.distributed's all_reduce without it.
    Marked through `deepspeed.ops.__compatible_ops__`, the table DeepSpeed itself consults before building. Nothing
    happens outside a DeepSpeed launch (`ACCELERATE_USE_DEEPSPEED`), with an accelerator, or without DeepSpeed.
    """
    if os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() != "true" or _has_accelerator():
        return False
    try:
        import deepspeed.ops
        from deepspeed.accelerator import get_accelerator
        from deepspeed.git_version_info import installed_ops
    except ImportError:
        return False
    builder = get_accelerator().create_op_builder("ShareMemCommBuilder")
    if builder is None or installed_ops.get(builder.NAME, False):
        return False
    deepspeed.ops.__compatible_ops__[builder.NAME] = False
    return True


def launched() -> bool:
    """True in a worker of a multi-process launch (`accelerate launch`, torchrun: `WORLD_SIZE` > 1)."""
    value = os.environ.get("WORLD_SIZE", "1").strip()
    return value.isdigit() and int(value) > 1


def world_size() -> int:
    """The processes of the initialized default process group (1 without one)."""
    dist = torch.distributed
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def rank() -> int:
    """This process's rank in the initialized default process group (0 without one)."""
    dist = torch.distributed
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def exit_process(code: int = 0, thread_timeout: float = 60.0) -> NoReturn:
    """End this process with `code` as the interpreter would, minus its finalization (see "clean exit" above).

    In the order of a normal exit: waits for the other non-daemon threads (at most `thread_timeout` seconds each,
    warning about any still running), runs the `atexit` handlers (loggers, experiment trackers, TRL's event loop),
    flushes stdout and stderr, then `os._exit(code)`: the process group is never torn down, and its threads end with
    the process. For the end of a launched script, after everything that needs the other processes
    (`trainer.end()` included). The recipes call it when `launched()`.
    """
    import atexit
    import threading

    for thread in threading.enumerate():
        if thread is threading.current_thread() or thread.daemon or not thread.is_alive():
            continue
        thread.join(thread_timeout)
        if thread.is_alive():
            logger.warning("thread %r still running after %g s at exit; ending the process anyway", thread.name,
                           thread_timeout)
    try:
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError, AttributeError):  # closed or replaced streams: nothing left to flush
                pass
        os._exit(code)


_PATCHED = "_trl_rm_env_fsdp_on_cpu"


def fsdp_requested() -> bool:
    """True when the process was started by `accelerate launch` with an FSDP config (`ACCELERATE_USE_FSDP`)."""
    return os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true"


def fsdp_version() -> int:
    """The FSDP version the accelerate config asks for (`FSDP_VERSION`, accelerate's default 1)."""
    return int(os.environ.get("FSDP_VERSION", "1"))


def _has_accelerator() -> bool:
    accelerator = getattr(torch, "accelerator", None)
    if accelerator is not None and hasattr(accelerator, "is_available"):
        return bool(accelerator.is_available())
    return torch.cuda.is_available()


def enable_fsdp_on_cpu() -> bool:
    """Let an FSDP accelerate config shard on a CPU-only (gloo) process group instead of falling back to DDP.

    Call it before the first `Accelerator` is built (the recipes do it first thing). It does nothing, and returns
    False, unless the process was launched with an FSDP config (`ACCELERATE_USE_FSDP=true`) on a machine without
    any accelerator; otherwise it wraps `accelerate.state.AcceleratorState.__init__` so that a MULTI_CPU state
    given an FSDP plugin becomes FSDP, exactly as accelerate does for MULTI_GPU. Everything else in accelerate's
    FSDP path (`fully_shard`, FULL_STATE_DICT saving) is unchanged and runs on CPU tensors. Idempotent.
    """
    if not fsdp_requested() or _has_accelerator():
        return False
    from accelerate.state import AcceleratorState, PartialState
    from accelerate.utils import DistributedType

    original = AcceleratorState.__init__
    if getattr(original, _PATCHED, False):
        return True

    @functools.wraps(original)
    def __init__(self, *args, fsdp_plugin=None, **kwargs):
        original(self, *args, fsdp_plugin=fsdp_plugin, **kwargs)
        if fsdp_plugin is not None and self.distributed_type == DistributedType.MULTI_CPU:
            self.distributed_type = DistributedType.FSDP
            if self._mixed_precision != "no":
                fsdp_plugin.set_mixed_precision(self._mixed_precision)
            self.fsdp_plugin = fsdp_plugin
            PartialState._shared_state["distributed_type"] = DistributedType.FSDP

    setattr(__init__, _PATCHED, True)
    AcceleratorState.__init__ = __init__
    logger.info("FSDP enabled on CPU process groups (accelerate falls back to DDP there otherwise).")
    return True


# ---------------------------------------------------------------------------------------------------- RM sharding
def is_zero3_partitioned(model: torch.nn.Module) -> bool:
    """True when DeepSpeed ZeRO-3 sharded the weights: `from_pretrained` runs under `zero.Init` whenever a ZeRO-3
    Accelerate config is active (after `TrainingArguments` is built), leaving each rank only its shard."""
    return any(hasattr(p, "ds_id") for p in model.parameters())


SHARDED_WORDS = {"reward": ("reward model", "RewardModelEnvironment"), "judge": ("judge", "JudgeEnvironment")}
"""How `shard_if_requested`'s messages name each kind of model, and the reward function that loads it."""


def shard_if_requested(
    model: torch.nn.Module, fsdp_shard: bool | None, log: logging.Logger = logger, kind: str = "reward"
) -> str:
    """Shard a reward model or a judge (`kind`) with FSDP2 when asked (or, for None, when the Accelerate config is
    FSDP v2 with several processes); return how the weights are held: `zero3`, `fsdp2` or `none`. `log`: the
    caller's logger (the reward function's: its users filter on it)."""
    what, owner = SHARDED_WORDS[kind]
    if is_zero3_partitioned(model):
        if fsdp_shard:
            raise ValueError(f"fsdp_shard=True, but DeepSpeed ZeRO-3 already partitioned the {what}.")
        return "zero3"
    dist = torch.distributed
    world_size = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
    zero3_requested = (
        os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() == "true"
        and os.environ.get("ACCELERATE_DEEPSPEED_ZERO_STAGE") == "3"
    )
    if zero3_requested and world_size > 1 and not fsdp_shard:
        log.warning(
            f"The Accelerate config is DeepSpeed ZeRO-3 but the {what} is not partitioned: it was loaded before "
            "the training arguments (GRPOConfig) existed, so every process holds a full copy. Create the GRPOConfig "
            f"first, then {owner} (as recipes/grpo_rm.py does), to partition it."
        )
    if fsdp_requested() and world_size > 1:
        # With `fsdp_cpu_ram_efficient_loading`, transformers loads the weights on local rank 0 only and leaves the
        # other ranks zeros (some versions) or placeholders, expecting FSDP to broadcast them; nobody does that for a
        # model loaded outside the trainer, so the model is synchronised here, whatever happens next.
        broadcast_from_rank0(model)
    if fsdp_shard is None:
        fsdp_shard = fsdp_requested() and fsdp_version() == 2 and world_size > 1
        if fsdp_requested() and fsdp_version() != 2 and world_size > 1:
            log.info(f"FSDP version 1 config: the {what} is replicated on every rank (FSDP2 shards it).")
    if not fsdp_shard:
        return "none"
    if world_size == 1:
        raise ValueError("fsdp_shard=True needs an initialized process group with more than one process.")
    shard_reward_model(model)
    return "fsdp2"


def broadcast_from_rank0(model: torch.nn.Module) -> None:
    """Every parameter and buffer of `model` set to rank 0's values (a collective)."""
    with torch.no_grad():
        for tensor in [*model.parameters(), *model.buffers()]:
            torch.distributed.broadcast(tensor.data, src=0)


def _fsdp_modules(model: torch.nn.Module) -> list[torch.nn.Module]:
    from torch.distributed.fsdp import FSDPModule

    return [m for m in model.modules() if isinstance(m, FSDPModule)]


def is_fsdp2_sharded(model: torch.nn.Module) -> bool:
    """True when `fully_shard` was applied to the model (its parameters are DTensor shards)."""
    return bool(_fsdp_modules(model))


def shard_reward_model(model: torch.nn.Module, mesh=None) -> torch.nn.Module:
    """Shard a scoring-only model across the default process group with FSDP2 `fully_shard`, in place.

    Every block named in the model's `_no_split_modules` (its decoder layers) gets its own shard group, then the
    root takes the rest (embeddings, final norm, score head), as accelerate's `TRANSFORMER_BASED_WRAP` does for the
    policy. Parameters keep their dtype (no mixed-precision policy: the RM runs in the precision it was loaded in).
    After this each rank holds 1/world_size of every parameter; `FullWeights(model)` unshards them for scoring.
    """
    from torch.distributed.fsdp import fully_shard

    if is_fsdp2_sharded(model):
        return model
    names = set(getattr(model, "_no_split_modules", None) or [])
    blocks = [m for m in model.modules() if type(m).__name__ in names]
    if not blocks:
        logger.warning(
            "%s names no transformer blocks (_no_split_modules): sharding it as one unit.", type(model).__name__
        )
    for block in blocks:
        fully_shard(block, mesh=mesh, reshard_after_forward=False)
    fully_shard(model, mesh=mesh, reshard_after_forward=False)
    return model


def held_parameters(model: torch.nn.Module) -> tuple[int, int]:
    """(parameter elements this rank owns, elements of the whole model).

    A DeepSpeed ZeRO-3 parameter counts its partition (DeepSpeed may also keep a gathered copy cached between
    steps, see its `stage3_max_reuse_distance`), an FSDP2 parameter its local shard (while unsharded FSDP2
    registers plain full tensors instead, counted in full), any other parameter in full.
    """
    held = total = 0
    for param in model.parameters():
        if hasattr(param, "ds_tensor"):
            held += param.ds_tensor.numel()
            total += param.ds_numel
        elif hasattr(param, "to_local"):
            held += param.to_local().numel()
            total += param.numel()
        else:
            held += param.numel()
            total += param.numel()
    return held, total


def describe_sharding(model: torch.nn.Module) -> str:
    """One log line: the share of the model's parameters this process owns, e.g. for 2 FSDP2 processes
    `"Model parameters held by this process: 50.0% of 384,128"`."""
    held, total = held_parameters(model)
    return f"Model parameters held by this process: {held / max(total, 1):.1%} of {total:,}"


class FullWeights:
    """Context manager: the full weights of an FSDP2-sharded model for the duration of one scoring call.

    On entry every shard group is all-gathered (a collective: every rank enters the same number of times, as the
    GRPO reward calls do, whatever the number of forward passes each rank then runs on its own completions); on
    exit the full copies are freed and each rank keeps its shard. Forward passes inside run without communication,
    so ranks may score different amounts of data.
    """

    def __init__(self, model: torch.nn.Module):
        self.modules = _fsdp_modules(model)

    def __enter__(self) -> None:
        for module in self.modules:
            module.unshard()

    def __exit__(self, *exc) -> None:
        for module in self.modules:
            module.reshard()


def full_weights(model: torch.nn.Module, sharding: str):
    """The full weights of a sharded scoring model for one scoring call (`sharding` as `shard_if_requested` returns
    it): DeepSpeed's `GatheredParameters` (read-only) under ZeRO-3, `FullWeights` under FSDP2, nothing otherwise.
    A collective: every rank must enter it the same number of times, as GRPO's reward calls do."""
    if sharding == "zero3":
        import deepspeed

        return deepspeed.zero.GatheredParameters(list(model.parameters()), modifier_rank=None)
    if sharding == "fsdp2":
        return FullWeights(model)
    return contextlib.nullcontext()


def check_distributed_setup(accelerator) -> str:
    """Describe the distributed setup the processes got, e.g. `"Distributed: DEEPSPEED x2 on cpu:0"`, for the log.

    Refuses a launch that would silently train unsynchronised, and warns when the Accelerate config asked for a
    sharding backend that is not in use.

    Raises:
        RuntimeError: Several processes were launched (`WORLD_SIZE` > 1) but Accelerate set up no distributed
            training: this happens without GPUs when `use_cpu` is off. Each process would train its own model on
            its share of the data and report metrics of that share only.
    """
    from accelerate.utils import DistributedType

    state = accelerator.state
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size > 1 and (state.distributed_type == DistributedType.NO or state.num_processes != world_size):
        raise RuntimeError(
            f"{world_size} processes were launched but Accelerate set up {state.distributed_type.value} with "
            f"{state.num_processes} process(es) on {state.device}: no GPU was found. To train on CPU pass "
            "`--use_cpu true` (the *_tiny.yaml configs set it) and a *_cpu Accelerate config (`--accelerate_config "
            "ddp_cpu`; in a checkout accelerate_configs/ddp_cpu.yaml)."
        )
    for backend in ("FSDP", "DEEPSPEED"):
        requested = os.environ.get(f"ACCELERATE_USE_{backend}", "false").lower() == "true"
        if requested and state.distributed_type.value != backend:
            logger.warning(
                "The Accelerate config asks for %s but this run uses %s: nothing is sharded.%s",
                backend,
                state.distributed_type.value,
                " On CPU accelerate runs FSDP only after `trl_rm_env.distributed.enable_fsdp_on_cpu()` (the recipes "
                "call it first thing)."
                if backend == "FSDP" and state.device.type == "cpu"
                else "",
            )
    return f"Distributed: {state.distributed_type.value} x{state.num_processes} on {state.device}"
