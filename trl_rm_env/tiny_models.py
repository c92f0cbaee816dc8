"""Tiny offline models and tokenizers, for tests and the quickstart.

Nothing here touches the network. A byte-level BPE tokenizer is trained (in well under a second) on the text
bundled in `trl_rm_env/data/sample/`, given a ChatML chat template like Qwen's, and shared by a randomly
initialised `Qwen3ForSequenceClassification` (the reward model, `num_labels=1`) and a `Qwen3ForCausalLM` (the
policy). Both are ordinary `save_pretrained` folders: `from_pretrained` is all a user needs to load them.

    trl-rm-env make-tiny OUTDIR      # writes OUTDIR/reward_model and OUTDIR/policy

Variants used by the tests:
- `bos_in_template=True`: the template starts with the BOS token *and* the tokenizer adds BOS when encoding, the
  double-BOS situation of Llama-based reward models (Skywork-Reward-V2-Llama) that the scorer must handle.
- `vocab_size=...` different from the default: a tokenizer whose ids differ from the reward model's, to test a
  policy/RM tokenizer mismatch.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import (
    PreTrainedTokenizerFast,
    Qwen3Config,
    Qwen3ForCausalLM,
    Qwen3ForSequenceClassification,
)

SAMPLE_DIR = Path(__file__).parent / "data" / "sample"

PAD_TOKEN = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
BOS_TOKEN = "<|bos|>"
THINK_START = "<think>"
THINK_END = "</think>"
SPECIAL_TOKENS = [PAD_TOKEN, IM_START, IM_END, BOS_TOKEN, THINK_START, THINK_END]

# ChatML, as Qwen uses it. `add_generation_prompt` opens an assistant turn.
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
# The same template with the BOS token written by the template itself (as Llama 3 templates do).
CHATML_BOS_TEMPLATE = "{{ bos_token }}" + CHATML_TEMPLATE

TOKENIZER_CORPUS_FILES = ("corpus.txt", "harder.jsonl", "in_domain.jsonl", "train.jsonl")  # sorted: the same vocabulary on any machine
DEFAULT_VOCAB_SIZE = 1024  # the bundled text saturates below this: about 700 tokens in practice


def tokenizer_corpus() -> list[str]:
    """Lines of the bundled text the tiny tokenizer is trained on (deterministic, shipped with the package)."""
    lines: list[str] = []
    # A fixed list: adding a sample file must not silently change every tiny tokenizer (and every test's ids).
    for name in TOKENIZER_CORPUS_FILES:
        path = SAMPLE_DIR / name
        if path.exists():
            lines.extend(path.read_text(encoding="utf-8").splitlines())
    if not lines:
        raise FileNotFoundError(f"No bundled text found in {SAMPLE_DIR}; the package data is missing.")
    return lines


def build_tiny_tokenizer(
    vocab_size: int = DEFAULT_VOCAB_SIZE, bos_in_template: bool = False, reserved_tokens: int = 0
) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE tokenizer on the bundled text and wrap it for transformers.

    Args:
        vocab_size: Target vocabulary size, special tokens included. Two sizes give two different vocabularies.
        bos_in_template: If True, the chat template writes `bos_token` and the tokenizer also prepends BOS when
            encoding with `add_special_tokens=True` (the double-BOS case).
        reserved_tokens: Number of unused special tokens placed before all others. Any value > 0 shifts every id,
            giving a tokenizer whose ids differ from the default one (a policy/RM vocabulary mismatch).

    Returns:
        A `PreTrainedTokenizerFast` with `pad_token`, `eos_token` (`<|im_end|>`) and a ChatML chat template.
    """
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=[f"<|reserved_{i}|>" for i in range(reserved_tokens)] + SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(tokenizer_corpus(), trainer=trainer)
    if bos_in_template:
        bos_id = bpe.token_to_id(BOS_TOKEN)
        bpe.post_processor = processors.TemplateProcessing(
            single=f"{BOS_TOKEN} $A", pair=f"{BOS_TOKEN} $A $B", special_tokens=[(BOS_TOKEN, bos_id)]
        )
    else:
        bpe.post_processor = processors.ByteLevel(trim_offsets=False)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        eos_token=IM_END,
        pad_token=PAD_TOKEN,
        bos_token=BOS_TOKEN if bos_in_template else None,
        additional_special_tokens=[IM_START, BOS_TOKEN] if not bos_in_template else [IM_START],
        chat_template=CHATML_BOS_TEMPLATE if bos_in_template else CHATML_TEMPLATE,
        model_max_length=4096,
        padding_side="right",
    )
    return tokenizer


def tiny_qwen3_config(tokenizer: PreTrainedTokenizerFast, **overrides) -> Qwen3Config:
    """A small Qwen3 config matched to `tokenizer` (about 1M parameters by default)."""
    kwargs = dict(
        vocab_size=len(tokenizer),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.bos_token_id,
    )
    kwargs.update(overrides)
    return Qwen3Config(**kwargs)


def build_tiny_reward_model(
    tokenizer: PreTrainedTokenizerFast, seed: int = 0, num_labels: int = 1, **config_overrides
) -> Qwen3ForSequenceClassification:
    """A randomly initialised `Qwen3ForSequenceClassification` (fp32, eval mode), deterministic from `seed`."""
    config = tiny_qwen3_config(tokenizer, num_labels=num_labels, **config_overrides)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen3ForSequenceClassification(config)
    return model.eval()


def build_tiny_policy(tokenizer: PreTrainedTokenizerFast, seed: int = 1, **config_overrides) -> Qwen3ForCausalLM:
    """A randomly initialised `Qwen3ForCausalLM` sharing the tokenizer, deterministic from `seed`."""
    config = tiny_qwen3_config(tokenizer, **config_overrides)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen3ForCausalLM(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model.eval()


def make_tiny(outdir: str | os.PathLike, seed: int = 0, bos_in_template: bool = False) -> dict[str, Path]:
    """Write `outdir/reward_model` and `outdir/policy`, each a `save_pretrained` folder with the tokenizer.

    Returns:
        `{"reward_model": path, "policy": path}`.
    """
    outdir = Path(outdir)
    tokenizer = build_tiny_tokenizer(bos_in_template=bos_in_template)
    paths = {"reward_model": outdir / "reward_model", "policy": outdir / "policy"}
    build_tiny_reward_model(tokenizer, seed=seed).save_pretrained(paths["reward_model"], safe_serialization=True)
    build_tiny_policy(tokenizer, seed=seed + 1).save_pretrained(paths["policy"], safe_serialization=True)
    for path in paths.values():
        tokenizer.save_pretrained(path)
    return paths


def build_tiny_regression_model(path: str | os.PathLike, num_labels: int) -> dict[str, Path]:
    """Save a tiny random Qwen3 sequence classifier with `num_labels` outputs and its tokenizer at `path`."""
    tokenizer = build_tiny_tokenizer()
    build_tiny_reward_model(tokenizer, num_labels=num_labels).save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)
    return {"regression_model": Path(path)}


# ------------------------------------------------------------------------------------------------ recipe builds
def build_in_place(kind: str, path: str | os.PathLike, num_labels: int | None = None) -> dict[str, Path]:
    """Build the tiny model(s) a recipe's `build_tiny_model: true` asks for, so that each folder appears complete or
    not at all: they are written into a hidden staging folder beside `path` and renamed into place.

    `kind` `reward_model` or `policy` builds both `make_tiny` folders in `path`'s parent (each only if missing);
    `regression_model` builds a `num_labels`-output classifier at `path`. A folder that appeared meanwhile (another
    machine sharing the file system built it) is kept. Returns `{name: path}` of the folders this call moved into
    place. The recipes run this in a child process (`python -m trl_rm_env.tiny_models`), away from any DeepSpeed or FSDP
    state of the launching process (see `trl_rm_env.model_source.ensure_tiny_model`).
    """
    target = Path(path)
    parent = target.parent
    parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".incomplete-{target.name}-", dir=parent))
    try:
        if kind == "regression_model":
            if num_labels is None or num_labels < 1:
                raise ValueError(f"a tiny regression model needs num_labels >= 1, got {num_labels}")
            built = build_tiny_regression_model(staging / target.name, num_labels)
        elif kind in ("reward_model", "policy"):
            built = make_tiny(staging)
        else:
            raise ValueError(f"unknown tiny model kind {kind!r}; one of reward_model, policy, regression_model")
        placed = {}
        for name, folder in built.items():
            final = parent / Path(folder).name
            try:
                os.rename(folder, final)  # atomic; fails if `final` exists (built meanwhile by someone else)
            except OSError:
                if not final.exists():
                    raise
                continue
            placed[name] = final
        return placed
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m trl_rm_env.tiny_models", description=build_in_place.__doc__)
    parser.add_argument("kind", choices=["reward_model", "policy", "regression_model"])
    parser.add_argument("path")
    parser.add_argument("--num-labels", type=int, default=None)
    args = parser.parse_args(argv)
    for name, where in build_in_place(args.kind, args.path, args.num_labels).items():
        print(f"  {name}: {where}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(_main())
