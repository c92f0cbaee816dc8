"""Check a model argument before anything loads it: a typo'd local folder fails at once, in one line.

transformers treats every path that does not exist as a Hub id: a typo (`outputs/rm-tinyy`) costs Hub retries, a
long traceback and never says "folder not found"; offline it says the model is not in the cache. This module decides,
from the string alone, whether it was meant as a local folder, and if that folder is missing raises
[`ModelSourceError`] naming it, with the closest existing names beside it. Real Hub ids pass through unchanged.

Stdlib only (plus `huggingface_hub` when offline), so the CLI and the recipes can call it before heavy imports.
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path

from .waiting import default_wait_timeout, wait_for_path

__all__ = ["ModelSourceError", "check_model_source", "ensure_tiny_model", "TINY_MODEL_NAMES"]

_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?$")
_MODEL_FILES = ("config.json", "adapter_config.json")

TINY_MODEL_NAMES = ("reward_model", "policy", "regression_model")
"""Folder names `build_tiny_model` builds (`trl-rm-env make-tiny`'s layout, and the regression recipe's model)."""


class ModelSourceError(FileNotFoundError):
    """A model argument names a local folder that does not exist (or is not a model folder)."""


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def _in_hub_cache(repo_id: str) -> bool:
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:  # pragma: no cover - transformers depends on it
        return False
    return isinstance(try_to_load_from_cache(repo_id, "config.json"), str)


def _looks_local(name: str) -> bool:
    """True when `name` can only mean a local path (see `check_model_source`)."""
    if name.startswith(("./", "../", "/", "~", ".\\", "..\\")) or name in (".", "..") or os.path.isabs(name):
        return True
    parts = Path(name).parts
    if len(parts) > 2 or not _HUB_ID.match(name.replace(os.sep, "/")):
        return True
    return len(parts) > 1 and os.path.isdir(parts[0])  # `outputs/` exists: `outputs/rm-tinyy` is a typo, not a Hub id


def _suggestions(path: Path, shown: str) -> list[str]:
    parent = path.parent
    try:
        names = [p.name for p in parent.iterdir() if p.is_dir()] if parent.is_dir() else []
    except OSError:
        return []
    prefix = shown[: len(shown) - len(path.name)] if shown.endswith(path.name) else f"{parent}{os.sep}"
    return [prefix + n for n in difflib.get_close_matches(path.name, names, n=3, cutoff=0.6)]


def check_model_source(name_or_path: str | os.PathLike, what: str = "reward model", hint: str | None = None) -> str:
    """Return `name_or_path` unchanged if it is an existing local model folder or a plausible Hub id; else raise.

    The argument is taken as a local path (and must exist) when it starts with `./`, `../`, `/` or `~`, when it has
    more than two components, when its first component is an existing local folder (`outputs/` exists, so
    `outputs/rm-tinyy` is a typo, not a Hub id), when it is not a valid Hub id, or when `HF_HUB_OFFLINE=1` is set and
    the Hub cache does not hold it. An existing folder must hold a `config.json` (or a PEFT `adapter_config.json`).

    Args:
        name_or_path: A local folder or a Hub id (`Skywork/Skywork-Reward-V2-Qwen3-0.6B`).
        what: What the model is, for the message (`"reward model"`, `"policy"`, `"model"`).
        hint: An extra sentence for the message (e.g. how to create the folder).

    Raises:
        ModelSourceError: e.g. `reward model folder not found: outputs/rm-tinyy (did you mean outputs/rm-tiny?)`.
    """
    if not isinstance(name_or_path, (str, os.PathLike)):
        return name_or_path  # a loaded model: nothing to check
    name = os.fspath(name_or_path)
    path = Path(name).expanduser()
    if path.is_dir():
        if not any((path / f).is_file() for f in _MODEL_FILES):
            raise ModelSourceError(
                f"{what} folder {name} has no config.json: not a save_pretrained model folder"
                + (f" ({hint})" if hint else "")
            )
        return name
    if path.exists():
        return name  # a single file (e.g. GGUF): let the loader decide
    offline = _offline()
    if not _looks_local(name) and not offline:
        return name
    if not _looks_local(name) and offline and _in_hub_cache(name):
        return name
    raise _missing(name, what, hint, offline_note=offline and not _looks_local(name))


def _missing(name: str, what: str, hint: str | None, offline_note: bool = False) -> ModelSourceError:
    """`<what> folder not found: <name> (did you mean ...?; <hint>)`."""
    path = Path(name).expanduser()
    message = f"{what} folder not found: {name}"
    close = _suggestions(path, name)
    notes = []
    if close:
        notes.append(f"did you mean {' or '.join(close)}?")
    if offline_note:
        notes.append("HF_HUB_OFFLINE=1 is set and the Hub cache does not hold it either")
    if hint:
        notes.append(hint)
    if notes:
        message += f" ({'; '.join(notes)})"
    return ModelSourceError(message)


def _local_rank() -> int:
    """This process's rank on its machine (`LOCAL_RANK`, set by torchrun / `accelerate launch`); 0 when alone."""
    value = os.environ.get("LOCAL_RANK", "0").strip()
    return int(value) if value.lstrip("-").isdigit() else 0


# Variables a launcher sets for its workers: a child process that inherits them could join (or wait for) the
# workers' process group. The tiny-model builder must stay outside it.
_LAUNCH_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "GROUP_RANK")


def _build_in_child(path: str, kind: str, num_labels: int | None, timeout: float) -> dict[str, str]:
    """Run `python -m trl_rm_env.tiny_models KIND PATH` (the builder) in a fresh interpreter and return `{name: path}`
    of what it built.

    Why a child: under DeepSpeed ZeRO-3, transformers builds every model inside `deepspeed.zero.Init` once the
    `TrainingArguments` exist (a `*ForSequenceClassification` creates its body with `AutoModel.from_config`), and
    `zero.Init` broadcasts each parameter: a collective. Built on one process while the others wait, it can never
    finish. A fresh interpreter holds no DeepSpeed, FSDP or process-group state, whatever the accelerate config.
    """
    import subprocess
    import sys

    cmd = [sys.executable, "-m", "trl_rm_env.tiny_models", kind, path]
    if num_labels is not None:
        cmd += ["--num-labels", str(num_labels)]
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("ACCELERATE_", "FSDP_")) and k not in _LAUNCH_VARIABLES
    }
    try:
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise RuntimeError(
            f"building the tiny offline models at {path} took over {timeout:g} s and was stopped; run "
            f"`{' '.join(cmd[1:])}` by hand to see why"
        ) from None
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"building the tiny offline models at {path} failed (exit {done.returncode}): {last}")
    built = {}
    for line in done.stdout.splitlines():
        name, sep, where = line.strip().partition(": ")
        if sep:
            built[name] = where
    return built


def ensure_tiny_model(
    path: str,
    kind: str,
    build: Callable[[], Mapping[str, object] | None] | None = None,
    exact_name: bool = True,
    num_labels: int | None = None,
    timeout: float | None = None,
) -> None:
    """Build the tiny offline model at `path` when it is missing (`build_tiny_model: true`), printing what it built.

    A missing `path` is built only when its folder name is `kind` (`reward_model`, `policy`: what `make-tiny`
    writes; `regression_model`); with `exact_name=False` (a builder that writes exactly `path`) also when its parent
    folder does not exist yet. Any other missing path (`outputs/rm-tinyy` beside `outputs/rm-tiny`) is a typo,
    reported by [`check_model_source`] instead of silently training a random model.

    Under `accelerate launch`, local process 0 of each machine builds and the others wait for the folder to appear
    (a file-system poll, bounded by `TRL_RM_ENV_WAIT_TIMEOUT`, default 600 s), so no collective is involved. The
    build runs in a child process (`trl_rm_env.tiny_models.build_in_place`, folders renamed into place when complete),
    outside any DeepSpeed ZeRO-3 or FSDP context of the launch (see `_build_in_child`).

    Args:
        path: The model folder a recipe was given.
        kind: `reward_model`, `policy` (both built by `make_tiny` in `path`'s parent) or `regression_model`.
        build: Build it in this process instead (tests); returns `{name: path}` of what it built.
        exact_name: See above.
        num_labels: Outputs of a `regression_model`.
        timeout: Seconds the build (local process 0) or the wait (the others) may take; None: the default above.

    Raises:
        ModelSourceError: `path` is missing and is not a place the tiny models are built.
        RuntimeError: the build failed or took too long (local process 0).
        trl_rm_env.waiting.WaitTimeoutError: the folder did not appear in time (the other processes).
    """
    if os.path.exists(path):
        return
    fresh = not exact_name and not Path(path).parent.exists()
    if Path(path).name != kind and not fresh:
        if not _looks_local(path) and not _offline():
            return  # a Hub id: nothing to build
        raise _missing(path, "model", f"build_tiny_model builds only a missing folder named {kind}")
    limit = default_wait_timeout() if timeout is None else timeout
    if _local_rank() != 0:
        wait_for_path(
            path,
            f"local process 0 to build the tiny offline models at {path}",
            "check process 0's output above: its build failed or is still running",
            timeout=limit,
        )
        return
    print(f"{path} not found: building the tiny offline models (build_tiny_model: true)", flush=True)
    built = build() if build is not None else _build_in_child(path, kind, num_labels, limit)
    for name, where in (built or {}).items():
        print(f"  {name}: {where}", flush=True)
