"""Turn a conversation into the exact token ids a reward model expects.

One function for training and for scoring, so a trained RM sees the same ids in GRPO as it saw in training. The
rule is the one of the Skywork-Reward-V2 model card:

    text = tokenizer.apply_chat_template(messages, tokenize=False)
    if tokenizer.bos_token and text.startswith(tokenizer.bos_token):   # the template wrote BOS ...
        text = text[len(tokenizer.bos_token):]                          # ... and the tokenizer adds it again
    ids = tokenizer(text)["input_ids"]                                  # add_special_tokens=True

Plain-text examples (TRL's "standard" format, strings instead of message lists) are encoded as TRL does:
`prompt + completion`, with the EOS token appended when missing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from transformers import PreTrainedTokenizerBase

Message = dict[str, Any]
Conversation = list[Message]


def render_conversation(tokenizer: PreTrainedTokenizerBase, messages: Sequence[Message], **template_kwargs) -> str:
    """Render `messages` with the tokenizer's chat template, dropping a leading BOS the tokenizer will add again."""
    if tokenizer.chat_template is None:
        raise ValueError(
            f"The tokenizer of {tokenizer.name_or_path!r} has no chat template, so conversations cannot be rendered. "
            "Set `tokenizer.chat_template` (or TRL's `chat_template_path`), or use plain-text data."
        )
    text = tokenizer.apply_chat_template(list(messages), tokenize=False, **template_kwargs)
    bos = tokenizer.bos_token
    if bos and text.startswith(bos) and _tokenizer_adds_bos(tokenizer):
        text = text[len(bos) :]
    return text


def _tokenizer_adds_bos(tokenizer: PreTrainedTokenizerBase) -> bool:
    # Cached per tokenizer object: does `tokenizer("x")` start with BOS?
    cached = getattr(tokenizer, "_trl_rm_env_adds_bos", None)
    if cached is None:
        ids = tokenizer("x")["input_ids"]
        cached = bool(ids) and ids[0] == tokenizer.bos_token_id
        try:
            tokenizer._trl_rm_env_adds_bos = cached
        except AttributeError:  # pragma: no cover - exotic tokenizer classes with __slots__
            pass
    return cached


def encode_text(tokenizer: PreTrainedTokenizerBase, text: str) -> list[int]:
    """Token ids of already-rendered text, special tokens added as the tokenizer's own post-processor says."""
    return list(tokenizer(text)["input_ids"])


def encode_conversation(
    tokenizer: PreTrainedTokenizerBase,
    context: str | Sequence[Message],
    completion: str | Sequence[Message],
    append_eos: bool = True,
    **template_kwargs,
) -> list[int]:
    """Token ids of `context` followed by `completion`, exactly as the reward model should read them.

    Args:
        tokenizer: The reward model's tokenizer (its chat template is used, whatever tokenizer produced the text).
        context: The prompt, as a list of messages or (plain-text mode) a string.
        completion: The response, as a list of messages or (plain-text mode) a string.
        append_eos: Plain-text mode only: append the EOS token when the text does not end with it (TRL's
            `RewardTrainer` does this for standard-format data).
        **template_kwargs: Extra keyword arguments for `apply_chat_template` (e.g. `tools`).
    """
    if isinstance(context, str) != isinstance(completion, str):
        raise TypeError(
            "context and completion must both be strings (plain text) or both be lists of messages, got "
            f"{type(context).__name__} and {type(completion).__name__}."
        )
    if isinstance(context, str):
        text = context + completion
        eos = tokenizer.eos_token
        if append_eos and eos and not text.endswith(eos):
            text += eos
        return encode_text(tokenizer, text)
    return encode_text(tokenizer, render_conversation(tokenizer, [*context, *completion], **template_kwargs))


def common_prefix_length(a: Sequence[int], b: Sequence[int]) -> int:
    """Number of leading tokens `a` and `b` share."""
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def context_token_ids(tokenizer: PreTrainedTokenizerBase, context: str | Sequence[Message], **template_kwargs) -> list[int]:
    """Token ids of the context alone (plain text, or messages rendered without a generation prompt)."""
    if isinstance(context, str):
        return encode_text(tokenizer, context)
    return encode_text(tokenizer, render_conversation(tokenizer, context, **template_kwargs))


def left_truncate(ids: list[int], context_length: int, max_length: int, bos_token_id: int | None) -> list[int] | None:
    """Cut tokens from the left of the context so `ids` fits in `max_length`; None if the completion alone is too long.

    A leading BOS token is kept. Only the first `context_length` tokens (the context) may be cut.
    """
    if len(ids) <= max_length:
        return ids
    keep = int(bos_token_id is not None and ids[:1] == [bos_token_id])
    cut = len(ids) - max_length
    if cut > context_length - keep:
        return None
    return ids[:keep] + ids[keep + cut :]
