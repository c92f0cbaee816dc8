"""Reward functions that pickle as their construction arguments, for TRL's AsyncGRPO.

`trl.experimental.async_grpo` pickles `reward_funcs` into a spawned child process that runs with
`CUDA_VISIBLE_DEVICES=""` and scores every GRPO group there (a group's reward functions concurrently, sync ones in
threads). A reward function that pickled its model would send
gigabytes through the pipe and then meet a process without the GPU it was built for. Ours pickle their construction
arguments instead (a few kilobytes, plus a tokenizer object if one was given) and their running statistics:

- behind servers (`remote_url`) they are rebuilt as they unpickle, which is cheap. A new HTTP session opens at each
  call, so nothing of the parent's connections is carried over, and they stay async callables;
- loaded here, they are rebuilt on the first use in the process that unpickled them, from the model's path or Hub
  id. If that process lacks the accelerator the model was built on, a warning (once) says the model runs on the CPU
  there and names the served route (`trl-rm-env serve` and `remote_url`). The CPU runs it with transformers, and the
  options that only place it on that accelerator are dropped (`device`, `engine="vllm"`, `vllm_*`, `fsdp_shard`,
  `device_map` and `attn_implementation` in `model_init_kwargs`). Loads take turns (`_LOADING`).

A reward function built from a model object (not a path) cannot be rebuilt elsewhere and refuses to pickle,
saying why.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from typing import Any

import torch

from ..options import default_of, option_fields
from ..runtime.model_options import VLLM_OWN_OPTIONS, ModelOptions

logger = logging.getLogger(__name__)

ACCELERATOR_ONLY = {"device": None, "engine": "hf"} | {
    f.name: default_of(f) for f in option_fields(ModelOptions) if f.name in VLLM_OWN_OPTIONS
}
"""Options that place a model on an accelerator, and what they become where none is found (vLLM's own, `vllm_*`:
their defaults, as transformers runs it there)."""
ACCELERATOR_LOADING = ("device_map", "attn_implementation")
"""`model_init_kwargs` keys dropped where no accelerator is found (a `cuda` device map, FlashAttention)."""
NOT_LOADING = frozenset({"_is_coroutine_marker"})
"""Attribute names looked up by `inspect` on any callable (Python 3.12+): answered without loading the model."""
_warned: set[str] = set()
_LOADING = threading.Lock()
"""One load at a time in a process: transformers' loading (its meta-device initialisation) is not thread-safe, and
AsyncGRPO uses every reward function of a group at once, each in its own thread."""


def accelerator_type(device: Any) -> str:
    """`cuda`, `cpu`, ... of a device or device name (None: `cpu`)."""
    return "cpu" if device is None else torch.device(device).type


def _available(device_type: str) -> bool:
    if device_type == "cpu":
        return True
    module = getattr(torch, device_type, None)
    return bool(module is not None and hasattr(module, "is_available") and module.is_available())


def _on_cpu(arguments: dict[str, Any]) -> dict[str, Any]:
    """The construction arguments without what places the model on an accelerator (`ACCELERATOR_ONLY`, an explicit
    `fsdp_shard`, `ACCELERATOR_LOADING` in `model_init_kwargs`)."""
    out = dict(arguments)
    for key in ("options", "scoring_options"):
        options = out.get(key)
        if options is not None and dataclasses.is_dataclass(options) and hasattr(options, "device"):
            init = getattr(options, "model_init_kwargs", None)
            init = None if init is None else {k: v for k, v in init.items() if k not in ACCELERATOR_LOADING}
            out[key] = dataclasses.replace(options, **ACCELERATOR_ONLY, model_init_kwargs=init)
    out.update(ACCELERATOR_ONLY)
    if isinstance(out.get("model_init_kwargs"), dict):
        out["model_init_kwargs"] = {k: v for k, v in out["model_init_kwargs"].items() if k not in ACCELERATOR_LOADING}
    if out.get("fsdp_shard"):
        out["fsdp_shard"] = None
    return out


class PicklesByArguments:
    """Mixin: pickle as the construction arguments (`_remember`), rebuild in the process that unpickles (see the
    module docstring). The class's `__init__` must accept the remembered arguments as keywords. `copy.copy` is a
    shallow copy sharing the model; pickling is what sends arguments."""

    _arguments: dict[str, Any]
    _built_on: str = "cpu"  # the accelerator the model was placed on (`cuda`, `cpu`, ...)

    def _remember(self, **arguments: Any) -> None:
        """Record the construction arguments (as given) for pickling."""
        self.__dict__["_arguments"] = arguments

    def __copy__(self) -> Any:
        other = object.__new__(type(self))
        other.__dict__.update(self.__dict__)
        return other

    def __getstate__(self) -> dict[str, Any]:
        if "_pending" in self.__dict__:  # unpickled and not used: pickled again as it came
            return self.__dict__["_pending"]
        model = self._arguments.get("model")
        if isinstance(model, torch.nn.Module):
            raise TypeError(
                f"{type(self).__name__} was built from a loaded model, so pickling it would copy its weights and it "
                "could not be rebuilt in another process (AsyncGRPO scores in a spawned one). Build it from the model's "
                "path or Hub id, or serve the model (`trl-rm-env serve`) and pass remote_url."
            )
        running = tuple(self.__dict__.get(k, 0) for k in ("_count", "_mean", "_m2"))
        return {"arguments": self._arguments, "built_on": self._built_on, "running": running}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__["_pending"] = state
        self.__dict__["__name__"] = self._pending_name(state["arguments"])
        if state["arguments"].get("remote_url") is not None:
            self._load()  # nothing to load but a tokenizer: rebuilt now, an async callable

    @staticmethod
    def _pending_name(arguments: dict[str, Any]) -> str:
        raise NotImplementedError

    def __getattr__(self, name: str) -> Any:
        # Only reached for attributes not set: a reward function unpickled and not used so far. The first use loads
        # it; a concurrent one waits for that load.
        state = self.__dict__
        if name.startswith("__") or name in NOT_LOADING or "_pending" not in state:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        with _LOADING:
            if "_pending" in state:
                self._load()
        return object.__getattribute__(self, name)

    def _load(self) -> None:  # under `_LOADING`, or while unpickling
        """Rebuild from the pickled arguments, for this process's devices, into a fresh object whose attributes then
        replace the pending state at once (so no other thread sees half of them). On failure the pending state stays,
        and the next use tries again."""
        state = self.__dict__["_pending"]
        arguments = dict(state["arguments"])
        built_on = state["built_on"]
        if built_on != "cpu" and not _available(built_on) and arguments.get("remote_url") is None:
            name = self.__dict__.get("__name__", type(self).__name__)
            if name not in _warned:
                _warned.add(name)
                logger.warning(
                    "%s: built on %s, but this process has none (AsyncGRPO's reward workers run with "
                    "CUDA_VISIBLE_DEVICES=''): the model runs on the CPU here, slowly. Serve it on its own GPUs "
                    "(`trl-rm-env serve --engine vllm --model ...`) and pass remote_url.",
                    name,
                    built_on,
                )
            arguments = _on_cpu(arguments)
        fresh = object.__new__(type(self))
        type(self).__init__(fresh, **arguments)
        fresh._count, fresh._mean, fresh._m2 = state["running"]
        fresh._arguments = state["arguments"]  # pickled again as given, whatever this process changed
        self.__dict__.update(fresh.__dict__)
        del self.__dict__["_pending"]
