"""Reward functions that pickle as their construction arguments, for TRL's AsyncGRPO.

`trl.experimental.async_grpo` pickles `reward_funcs` into a spawned child process that runs with
`CUDA_VISIBLE_DEVICES=""` and scores every GRPO group there. A reward function that pickled its model would send
gigabytes through the pipe and then meet a process without the GPU it was built for. Ours pickle their construction
arguments instead (a few kilobytes, plus a tokenizer object if one was given) and their running statistics:

- behind servers (`remote_url`) they are rebuilt as they unpickle, which is cheap. A new HTTP session opens at each
  call, so nothing of the parent's connections is carried over, and they stay async callables;
- loaded here, they are rebuilt on the first use in the process that unpickled them, from the model's path or Hub
  id. If that process lacks the accelerator the model was built on, a warning (once) says the model runs on the CPU
  there and names the served route (`trl-rm-env serve` and `remote_url`). The CPU runs it with transformers, and the
  options that only place it on that accelerator (`device`, `engine="vllm"`, `vllm_*`) are dropped.

A reward function built from a model object (not a path) cannot be rebuilt elsewhere and refuses to pickle,
saying why.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import torch

logger = logging.getLogger(__name__)

ACCELERATOR_ONLY = {"device": None, "engine": "hf", "vllm_gpu_memory_utilization": None, "vllm_tensor_parallel_size": 1}
"""Options that place a model on an accelerator, and what they become where none is found."""
_warned: set[str] = set()
_LOADING = threading.RLock()  # AsyncGRPO calls a sync reward function from several threads at once


def accelerator_type(device: Any) -> str:
    """`cuda`, `cpu`, ... of a device or device name (None: `cpu`)."""
    return "cpu" if device is None else torch.device(device).type


def _available(device_type: str) -> bool:
    if device_type == "cpu":
        return True
    module = getattr(torch, device_type, None)
    return bool(module is not None and hasattr(module, "is_available") and module.is_available())


class PicklesByArguments:
    """Mixin: pickle as the construction arguments (`_remember`), rebuild in the process that unpickles (see the
    module docstring). The class's `__init__` must accept the remembered arguments as keywords."""

    _arguments: dict[str, Any]
    _built_on: str = "cpu"  # the accelerator the model was placed on (`cuda`, `cpu`, ...)

    def _remember(self, **arguments: Any) -> None:
        """Record the construction arguments (as given) for pickling."""
        self.__dict__["_arguments"] = arguments

    def __getstate__(self) -> dict[str, Any]:
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
            self._load()  # nothing to load but a tokenizer: rebuilt now, an async callable as before

    @staticmethod
    def _pending_name(arguments: dict[str, Any]) -> str:
        raise NotImplementedError

    def __getattr__(self, name: str) -> Any:
        # Only reached for attributes not set yet: a local reward function unpickled and not used so far (or being
        # loaded by another thread: wait for it).
        if name.startswith("__"):
            raise AttributeError(name)
        with _LOADING:
            if "_pending" in self.__dict__:
                self._load()
        try:
            return object.__getattribute__(self, name)
        except AttributeError:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}") from None

    def _load(self) -> None:
        """Rebuild from the pickled arguments (here: this process's devices)."""
        state = self.__dict__.pop("_pending")
        arguments = dict(state["arguments"])
        built_on = state["built_on"]
        if built_on != "cpu" and not _available(built_on) and not arguments.get("remote_url"):
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
            options = arguments.pop("options", None)
            if options is not None and hasattr(options, "device"):
                import dataclasses

                arguments["options"] = dataclasses.replace(options, **ACCELERATOR_ONLY)
            elif options is not None:
                arguments["options"] = options
            scoring = arguments.pop("scoring_options", None)
            if scoring is not None:
                import dataclasses

                arguments["scoring_options"] = dataclasses.replace(scoring, **ACCELERATOR_ONLY)
            arguments.update(ACCELERATOR_ONLY)
        type(self).__init__(self, **arguments)
        self._count, self._mean, self._m2 = state["running"]
