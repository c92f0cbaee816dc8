"""Checkpoints that appear complete or not at all, and resuming from the newest complete one.

`AtomicCheckpointMixin` (in front of `RankedRewardTrainer`, `RegressionRewardTrainer` and the GRPO recipe's
trainer) writes each checkpoint into a hidden staging folder and renames it when transformers has written
everything; `resolve_resume_checkpoint` turns `--resume_from_checkpoint true|latest|PATH` into a checkpoint it has
checked complete and readable, or one line saying why not.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import zipfile

from ..waiting import wait_for_everyone

logger = logging.getLogger(__name__)

_CHECKPOINT_RE = re.compile(r"^checkpoint-(\d+)$")
_STAGING_PREFIX = ".incomplete-"
_WEIGHT_FILES = (
    "model.safetensors",
    "pytorch_model.bin",
    "adapter_model.safetensors",
    "adapter_model.bin",
    "model.safetensors.index.json",
    "pytorch_model.bin.index.json",
)
_RESUME_LATEST = ("true", "latest", "last", "1", "yes")
_RESUME_NONE = ("", "false", "none", "no", "0")


class CheckpointError(ValueError):
    """A checkpoint to resume from is missing or incomplete."""


def checkpoint_problem(path: str) -> str | None:
    """Why the `checkpoint-N` folder at `path` cannot be resumed from, or None when it is complete.

    Complete means what transformers writes last is there and readable: `trainer_state.json` (written after the
    weights, optimizer, scheduler and RNG states), and the model weights (plain, sharded with every shard present,
    PEFT adapters, or a DeepSpeed/FSDP state folder).
    """
    if not os.path.isdir(path):
        return "no such folder"
    state_file = os.path.join(path, "trainer_state.json")
    try:
        with open(state_file, encoding="utf-8") as f:
            json.load(f)
    except FileNotFoundError:
        return "no trainer_state.json (the save was interrupted)"
    except (OSError, ValueError) as err:
        return f"unreadable trainer_state.json ({type(err).__name__})"
    names = set(os.listdir(path))
    for index in ("model.safetensors.index.json", "pytorch_model.bin.index.json"):
        if index in names:
            try:
                with open(os.path.join(path, index), encoding="utf-8") as f:
                    shards = set(json.load(f)["weight_map"].values())
            except (OSError, ValueError, KeyError):
                return f"unreadable {index}"
            missing = sorted(shards - names)
            if missing:
                return f"weight shard {missing[0]} is missing"
    sharded_state = any(n.startswith(("global_step", "pytorch_model_fsdp")) for n in names)
    if not sharded_state and not names.intersection(_WEIGHT_FILES):
        return "no model weights (the save was interrupted)"
    for root, _, files in sorted(os.walk(path)):
        for name in sorted(files):
            problem = _file_problem(os.path.join(root, name))
            if problem:
                return f"{os.path.relpath(os.path.join(root, name), path)} {problem}"
    return None


_ZIP_MAGIC = b"PK\x03\x04"
_TORCH_SUFFIXES = (".pt", ".pth", ".bin")


def _file_problem(path: str) -> str | None:
    """Why a checkpoint file cannot be read back, from its structure alone (no tensor is loaded), or None.

    A `.safetensors` file must hold its JSON header and every byte the header's offsets point to; a torch file
    (`.pt`, `.pth`, `.bin`: `torch.save`'s zip format) must end with its zip directory. A copy or save cut short
    fails both.
    """
    try:
        size = os.path.getsize(path)
        if path.endswith(".safetensors"):
            with open(path, "rb") as f:
                head = f.read(8)
                if len(head) < 8:
                    return f"is truncated ({size} bytes, not even a safetensors header)"
                length = int.from_bytes(head, "little")
                if length > size - 8:
                    return f"is truncated ({size} bytes; its header alone needs {8 + length})"
                header = json.loads(f.read(length))
            end = max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"), default=0)
            if 8 + length + end > size:
                return f"is truncated ({size} bytes of {8 + length + end})"
        elif path.endswith(_TORCH_SUFFIXES):
            with open(path, "rb") as f:
                magic = f.read(4)
            if magic == _ZIP_MAGIC:
                with zipfile.ZipFile(path):  # reads the directory at the end of the file
                    pass
    except zipfile.BadZipFile:
        return f"is truncated or corrupt ({size} bytes; no zip directory at its end)"
    except (OSError, ValueError, KeyError, TypeError, IndexError) as err:
        return f"cannot be read ({type(err).__name__}: {err})"
    return None


def _list_checkpoints(output_dir: str) -> list[tuple[int, str]]:
    if not os.path.isdir(output_dir):
        return []
    found = []
    for name in os.listdir(output_dir):
        match = _CHECKPOINT_RE.match(name)
        if match and os.path.isdir(os.path.join(output_dir, name)):
            found.append((int(match.group(1)), os.path.join(output_dir, name)))
    return sorted(found)


def last_complete_checkpoint(output_dir: str) -> tuple[str | None, list[tuple[str, str]]]:
    """The newest complete `checkpoint-N` in `output_dir` (None if none) and the newer incomplete ones skipped,
    as `(path, reason)`."""
    skipped = []
    for _, path in reversed(_list_checkpoints(output_dir)):
        problem = checkpoint_problem(path)
        if problem is None:
            return path, skipped
        skipped.append((path, problem))
    return None, skipped


def resolve_resume_checkpoint(resume_from_checkpoint: str | bool | None, output_dir: str) -> str | None:
    """The checkpoint folder `--resume_from_checkpoint` means, checked complete; None to start fresh.

    `true`/`latest` picks the newest complete `checkpoint-N` in `output_dir`, logs which, and warns about each newer
    incomplete one it skips (an interrupted save). An explicit path must be a complete checkpoint.

    Raises:
        CheckpointError: an explicit path that is missing or incomplete, or `true`/`latest` with no complete
            checkpoint in `output_dir`. One line naming the folder and why.
    """
    if resume_from_checkpoint is None or resume_from_checkpoint is False:
        return None
    value = resume_from_checkpoint if isinstance(resume_from_checkpoint, bool) else str(resume_from_checkpoint)
    if isinstance(value, str) and value.strip().lower() in _RESUME_NONE:
        return None
    if value is True or value.strip().lower() in _RESUME_LATEST:
        path, skipped = last_complete_checkpoint(output_dir)
        for bad, reason in skipped:
            logger.warning("Skipping incomplete checkpoint %s: %s.", bad, reason)
        if path is None:
            detail = f" ({len(skipped)} incomplete skipped)" if skipped else ""
            raise CheckpointError(
                f"resume_from_checkpoint={resume_from_checkpoint}: no complete checkpoint-N folder in {output_dir}"
                f"{detail}; start without --resume_from_checkpoint or give a checkpoint path"
            )
        logger.warning("Resuming from %s (the newest complete checkpoint in %s).", path, output_dir)
        _warn_without_rng_state(path)
        return path
    problem = checkpoint_problem(value)
    if problem is not None:
        newest, _ = last_complete_checkpoint(os.path.dirname(os.path.normpath(value)) or ".")
        tip = f"; the newest complete one there is {newest}" if newest else ""
        raise CheckpointError(f"cannot resume from {value}: {problem}{tip}")
    _warn_without_rng_state(value)
    return value


def _warn_without_rng_state(path: str) -> None:
    """transformers resumes without the RNG states (`rng_state.pth`, or `rng_state_<rank>.pth` per process) with
    only an info-level note: the run goes on, but its sampling, dropout and data order differ from an uninterrupted
    run's. Say so where a user sees it."""
    if not any(name.startswith("rng_state") and name.endswith(".pth") for name in os.listdir(path)):
        logger.warning(
            "%s has no RNG state (rng_state*.pth): the resumed run continues, but its random draws (data order, "
            "dropout, sampling) will not be those of an uninterrupted run.",
            path,
        )


class AtomicCheckpointMixin:
    """Trainer mixin: checkpoints appear complete or not at all, and resuming picks a complete one.

    A save goes to a hidden sibling folder `output_dir/.incomplete-checkpoint-N/checkpoint-N` and is renamed to
    `output_dir/checkpoint-N` when transformers has written everything (weights, optimizer, scheduler, RNG states,
    `trainer_state.json`); rotation (`save_total_limit`) and the best-model bookkeeping then run on the real folders.
    A save interrupted by an exception removes its staging folder; a killed one leaves only the hidden staging
    folder, which `checkpoint-*` globs, `get_last_checkpoint` and resuming ignore and the next save of that step
    replaces. `train(resume_from_checkpoint=...)` accepts `True`, `"true"`, `"latest"` or a path
    ([`resolve_resume_checkpoint`]).
    """

    def train(self, resume_from_checkpoint: str | bool | None = None, *args, **kwargs):
        resume = resolve_resume_checkpoint(resume_from_checkpoint, self.args.output_dir)
        return super().train(resume, *args, **kwargs)

    def _save_checkpoint(self, model, trial) -> None:
        from transformers.trainer_utils import rotate_checkpoints

        run_dir = self._get_output_dir(trial=trial)
        name = f"checkpoint-{self.state.global_step}"
        final = os.path.join(run_dir, name)
        staging_root = os.path.join(run_dir, _STAGING_PREFIX + name)
        staging = os.path.join(staging_root, name)
        main = self.args.should_save
        if main and os.path.exists(staging_root):
            shutil.rmtree(staging_root)  # left by a killed save of this step
        wait_for_everyone(self.accelerator, f"start writing {name} (the main process clears its staging folder)")
        # transformers' `_save_checkpoint` writes into `_get_output_dir()/checkpoint-N`: point it at the staging
        # folder for this call only (an instance attribute shadows the method).
        self._get_output_dir = lambda trial=None: staging_root
        limit, self.args.save_total_limit = self.args.save_total_limit, None  # rotate after the rename, below
        try:
            super()._save_checkpoint(model, trial)
        except BaseException:
            if main:
                shutil.rmtree(staging_root, ignore_errors=True)
            raise
        finally:
            del self._get_output_dir
            self.args.save_total_limit = limit
        wait_for_everyone(self.accelerator, f"finish writing {name}")  # every process has written its shards
        best = self.state.best_model_checkpoint
        if best is not None and os.path.normpath(best).startswith(os.path.normpath(staging_root)):
            self.state.best_model_checkpoint = final
        if main:
            if os.path.exists(final):
                shutil.rmtree(final)  # an older (or incomplete) save of the same step
            if self.state.best_model_checkpoint != best:  # the staged trainer_state.json names the staging path
                self.state.save_to_json(os.path.join(staging, "trainer_state.json"))
            os.replace(staging, final)
            shutil.rmtree(staging_root, ignore_errors=True)
            rotate_checkpoints(
                output_dir=run_dir,
                save_total_limit=limit,
                best_model_checkpoint=self.state.best_model_checkpoint,
                use_mtime=True,
            )
        wait_for_everyone(self.accelerator, f"see {name} renamed into place")


def with_atomic_checkpoints(trainer_class: type) -> type:
    """`trainer_class` with [`AtomicCheckpointMixin`] in front (e.g. TRL's `GRPOTrainer` in the GRPO recipe)."""
    if issubclass(trainer_class, AtomicCheckpointMixin):
        return trainer_class
    return type(trainer_class.__name__, (AtomicCheckpointMixin, trainer_class), {"__module__": __name__})
