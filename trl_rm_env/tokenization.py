"""Turn a conversation into the exact token ids a reward model expects.

One function for training and for scoring, so a trained RM sees the same ids in GRPO as it saw in training. The
rule is the one of the Skywork-Reward-V2 model card:

    text = tokenizer.apply_chat_template(messages, tokenize=False)
    if tokenizer.bos_token and text.startswith(tokenizer.bos_token):   # the template wrote BOS ...
        text = text[len(tokenizer.bos_token):]                          # ... and the tokenizer adds it again
    ids = tokenizer(text)["input_ids"]                                  # add_special_tokens=True

Plain-text examples (TRL's "standard" format, strings instead of message lists) are encoded as TRL does:
`prompt + completion`, with the EOS token appended when missing.

Special-token text in message content is text. A message whose content spells one of the tokenizer's special
tokens (`"ok<|im_end|>\\n<|im_start|>assistant\\n..."`) must not become those control tokens, or a policy could
forge turns in front of the reward model. Only the chat template's own special tokens are encoded as tokens:

- Special tokens are the tokenizer's added tokens marked special (`added_tokens_decoder[i].special`, which covers
  `all_special_tokens`): exactly the tokens that `split_special_tokens=True` encodes as text. Added tokens that
  are *not* special (Qwen3's `<think>`, `<tool_call>`) stay tokens, as the model card's rendering has them: models
  write them in their answers and they do not delimit turns.
- Conversations: every string in a message except its `role` (content, reasoning, tool-call arguments, names).
  The template's keyword arguments (`tools`, ...) come from the dataset and are rendered as the template writes
  them. Plain text: the completion (the policy's output) is text, except a trailing EOS string (with the
  whitespace after it), which stays the EOS token (TRL appends it when missing; pre-rendered data ends a turn with
  it); the prompt comes from the dataset and may be pre-rendered with its own control tokens, so it is encoded as
  the tokenizer reads it, as today.
- Content without special-token text keeps exactly the model card's ids (one regex search per string decides;
  the model card's path is taken unchanged). Only content with such text takes the segment path below.

Segment path: the strings are marked (each special-token string wrapped in two private-use characters that occur
nowhere in the input), the conversation is rendered once with the marks and checked to be the model card's text
once the marks are removed, and the text is cut at the template's own special tokens. Each stretch between two
of them is encoded as one text (`split_special_tokens=True`, so marked strings and their neighbours merge as plain
text would), the template's tokens keep their ids, and the tokenizer's own prefix/suffix (BOS) is added as
`tokenizer(text)` adds it. This is what the tokenizer gives for the same text when only the template's tokens are
special; for text without special-token strings it is the model card's ids (tested).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from transformers import PreTrainedTokenizerBase

logger = logging.getLogger(__name__)

Message = dict[str, Any]
Conversation = list[Message]


def render_conversation(tokenizer: PreTrainedTokenizerBase, messages: Sequence[Message], **template_kwargs) -> str:
    """Render `messages` with the tokenizer's chat template, dropping a leading BOS the tokenizer will add again.

    This is the model card's text. Special-token strings in the messages are in it as they are: to get token ids
    use `encode_messages` (or `encode_conversation`), which encodes those strings as text.
    """
    _check_template(tokenizer)
    text = tokenizer.apply_chat_template(list(messages), tokenize=False, **template_kwargs)
    return _strip_bos(tokenizer, text)


def _check_template(tokenizer: PreTrainedTokenizerBase) -> None:
    if tokenizer.chat_template is None:
        raise ValueError(
            f"The tokenizer of {tokenizer.name_or_path!r} has no chat template, so conversations cannot be rendered. "
            "Set `tokenizer.chat_template` (or TRL's `chat_template_path`), or use plain-text data."
        )


def _strip_bos(tokenizer: PreTrainedTokenizerBase, text: str) -> str:
    bos = tokenizer.bos_token
    if bos and text.startswith(bos) and _tokenizer_adds_bos(tokenizer):
        text = text[len(bos) :]
    return text


def _remember(tokenizer: PreTrainedTokenizerBase, attribute: str, value: Any) -> None:
    """Cache `value` on the tokenizer object (skipped for exotic tokenizer classes that refuse new attributes)."""
    try:
        setattr(tokenizer, attribute, value)
    except AttributeError:  # pragma: no cover - tokenizer classes with __slots__
        pass


def _tokenizer_adds_bos(tokenizer: PreTrainedTokenizerBase) -> bool:
    # Cached per tokenizer object: does `tokenizer("x")` start with BOS?
    cached = getattr(tokenizer, "_trl_rm_env_adds_bos", None)
    if cached is None:
        ids = tokenizer("x")["input_ids"]
        cached = bool(ids) and ids[0] == tokenizer.bos_token_id
        _remember(tokenizer, "_trl_rm_env_adds_bos", cached)
    return cached


def encode_text(tokenizer: PreTrainedTokenizerBase, text: str) -> list[int]:
    """Token ids of already-rendered text, special tokens added as the tokenizer's own post-processor says.

    Special-token strings in `text` become special tokens: this is for text that a chat template rendered (or a
    client rendered, as vLLM's `/pooling` `input` is). Message content goes through `encode_messages`.
    """
    return list(tokenizer(text)["input_ids"])


# ---------------------------------------------------------------------------------------------------- special tokens
@dataclass(frozen=True)
class _Specials:
    """The special tokens of one tokenizer, as `split_special_tokens` sees them (cached on the tokenizer)."""

    size: int  # len(tokenizer) when built: adding tokens rebuilds it
    pattern: re.Pattern | None  # any special-token string, longest first (None: the tokenizer has none)
    ids: dict[str, int]
    lstrip: frozenset[str]  # tokens that swallow the whitespace before them (AddedToken.lstrip)
    rstrip: frozenset[str]  # ... and after them
    prefix: tuple[int, ...]  # ids `tokenizer(text)` adds before the text's (BOS) ...
    suffix: tuple[int, ...]  # ... and after them (EOS of some post-processors)
    offset_sensitive: bool  # True: a stretch after a special token encodes unlike the same text at the start


def special_token_strings(tokenizer: PreTrainedTokenizerBase) -> tuple[str, ...]:
    """The strings that are encoded as text when they occur in message content (longest first)."""
    specials = _specials(tokenizer)
    return tuple(sorted(specials.ids, key=len, reverse=True))


def _specials(tokenizer: PreTrainedTokenizerBase) -> _Specials:
    size = len(tokenizer)
    cached = getattr(tokenizer, "_trl_rm_env_specials", None)
    if cached is not None and cached.size == size:
        return cached
    added = {i: t for i, t in tokenizer.added_tokens_decoder.items() if getattr(t, "special", False) and str(t)}
    ids = {str(t): i for i, t in added.items()}
    strings = sorted(ids, key=len, reverse=True)
    pattern = re.compile("|".join(map(re.escape, strings))) if strings else None
    with_special = list(tokenizer("x")["input_ids"])
    without = list(tokenizer("x", add_special_tokens=False)["input_ids"])
    prefix, suffix = (), ()
    for k in range(len(with_special) - len(without) + 1):
        if with_special[k : k + len(without)] == without:
            prefix, suffix = tuple(with_special[:k]), tuple(with_special[k + len(without) :])
            break
    offset_sensitive = False
    if strings:
        probe = "Hello world"
        token = min(strings, key=len)
        in_place = list(tokenizer(token + probe, add_special_tokens=False)["input_ids"])
        offset_sensitive = in_place != [ids[token], *_encode_plain(tokenizer, probe)]
    result = _Specials(
        size=size,
        pattern=pattern,
        ids=ids,
        lstrip=frozenset(str(t) for t in added.values() if getattr(t, "lstrip", False)),
        rstrip=frozenset(str(t) for t in added.values() if getattr(t, "rstrip", False)),
        prefix=prefix,
        suffix=suffix,
        offset_sensitive=offset_sensitive,
    )
    _remember(tokenizer, "_trl_rm_env_specials", result)
    return result


def _encode_plain(tokenizer: PreTrainedTokenizerBase, text: str) -> list[int]:
    """`text` as plain text: special-token strings are not matched, no BOS/EOS added."""
    if not text:
        return []
    return list(tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"])


def has_special_text(tokenizer: PreTrainedTokenizerBase, value: Any) -> bool:
    """Whether `value` (a string, a message, or a list/dict of them; `role` values are skipped) spells a special
    token of `tokenizer`. This is the cheap check that decides between the model card's path and the segment path."""
    pattern = _specials(tokenizer).pattern
    return pattern is not None and _search(value, pattern)


def _search(value: Any, pattern: re.Pattern) -> bool:
    if isinstance(value, str):
        return pattern.search(value) is not None
    if isinstance(value, Mapping):
        return any(_search(v, pattern) for k, v in value.items() if k != "role")
    if isinstance(value, (list, tuple)):
        return any(_search(v, pattern) for v in value)
    return False


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, Mapping):
        return [s for k, v in value.items() for s in ([k] if isinstance(k, str) else []) + _strings(v)]
    if isinstance(value, (list, tuple)):
        return [s for v in value for s in _strings(v)]
    return []


def _markers(*values: Any) -> tuple[str, str]:
    """Two private-use characters that occur in none of `values` (so content cannot fake a mark)."""
    strings = [s for v in values for s in _strings(v)]
    for code in range(0xF0000, 0xFFFFD, 2):
        start, end = chr(code), chr(code + 1)
        if not any(start in s or end in s for s in strings):
            return start, end
    raise ValueError("The conversation uses every private-use character; it cannot be marked.")  # pragma: no cover


def _mark(value: Any, pattern: re.Pattern, start: str, end: str) -> Any:
    if isinstance(value, str):
        return pattern.sub(lambda m: start + m.group(0) + end, value)
    if isinstance(value, Mapping):
        return {k: v if k == "role" else _mark(v, pattern, start, end) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_mark(v, pattern, start, end) for v in value]
    return value


def _encode_marked(tokenizer: PreTrainedTokenizerBase, text: str, start: str, end: str) -> list[int]:
    """Ids of `text`, where special-token strings wrapped in `start` and `end` are text and bare ones are the
    template's own tokens. A lone mark (left where a template split content at a special-token string, which removes
    the string) is dropped; it does not make a neighbouring template token text."""
    specials = _specials(tokenizer)
    assert specials.pattern is not None
    alternatives = specials.pattern.pattern
    found = re.compile(f"{re.escape(start)}({alternatives}){re.escape(end)}|({alternatives})")
    ids: list[int] = list(specials.prefix)
    pieces: list[str] = []  # text of the current stretch
    at_start = True  # the stretch starts at the start of the text (not after a template token)
    pos = 0

    def flush(rstrip_before: bool) -> None:
        nonlocal at_start
        stretch = "".join(pieces).replace(start, "").replace(end, "")
        pieces.clear()
        if rstrip_before:
            stretch = stretch.rstrip()
        ids.extend(_encode_stretch(tokenizer, stretch, at_start, specials.offset_sensitive))
        at_start = False

    strip_next = False
    for m in found.finditer(text):
        between = text[pos : m.start()]
        if strip_next:  # the previous template token swallows the whitespace after it
            between, strip_next = between.lstrip(), False
        pieces.append(between)
        pos = m.end()
        if m.group(1) is not None:  # marked: content's text
            pieces.append(m.group(1))
            continue
        token = m.group(2)
        flush(token in specials.lstrip)
        ids.append(specials.ids[token])
        strip_next = token in specials.rstrip
    tail = text[pos:]
    pieces.append(tail.lstrip() if strip_next else tail)
    flush(False)
    ids.extend(specials.suffix)
    return ids


def _encode_stretch(
    tokenizer: PreTrainedTokenizerBase, text: str, at_start: bool, offset_sensitive: bool
) -> list[int]:
    """A stretch of text between two template tokens, as the tokenizer encodes it in place."""
    if not text or at_start or not offset_sensitive:
        return _encode_plain(tokenizer, text)
    # SentencePiece-style tokenizers mark the start of the input (prepend scheme "first"): encode after a newline
    # so the stretch reads as it does in the middle of the text, then drop the newline's ids.
    newline = _encode_plain(tokenizer, "\n")
    ids = _encode_plain(tokenizer, "\n" + text)
    if ids[: len(newline)] == newline:
        return ids[len(newline) :]
    return _encode_plain(tokenizer, text)  # pragma: no cover - the newline merged with the stretch


def encode_messages(tokenizer: PreTrainedTokenizerBase, messages: Sequence[Message], **template_kwargs) -> list[int]:
    """Token ids of `messages` rendered with the chat template (the model card's rule), content encoded as text.

    Without special-token strings in the messages this is exactly `encode_text(render_conversation(...))`.
    """
    messages = list(messages)
    if not has_special_text(tokenizer, messages):
        return encode_text(tokenizer, render_conversation(tokenizer, messages, **template_kwargs))
    _check_template(tokenizer)
    specials = _specials(tokenizer)
    start, end = _markers(messages, template_kwargs, tokenizer.chat_template)
    marked = _mark(messages, specials.pattern, start, end)
    text = tokenizer.apply_chat_template(marked, tokenize=False, **template_kwargs)
    plain = tokenizer.apply_chat_template(messages, tokenize=False, **template_kwargs)
    if text.replace(start, "").replace(end, "") != plain:
        raise ValueError(
            "The chat template renders message text that contains special-token strings differently once those "
            f"strings are marked (it changes the text around {specials.pattern.pattern[:60]!r}...), so their text "
            "cannot be told apart from the template's own tokens. Remove special-token strings from the messages."
        )
    bos = tokenizer.bos_token
    if bos and text.startswith(bos) and _tokenizer_adds_bos(tokenizer):
        text = text[len(bos) :]
    return _encode_marked(tokenizer, text, start, end)


def encode_conversation(
    tokenizer: PreTrainedTokenizerBase,
    context: str | Sequence[Message],
    completion: str | Sequence[Message],
    append_eos: bool = True,
    **template_kwargs,
) -> list[int]:
    """Token ids of `context` followed by `completion`, exactly as the reward model should read them.

    Special-token strings in message content (and in a plain-text completion) are encoded as text; see the
    module docstring.

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
    if not isinstance(context, str):
        return encode_messages(tokenizer, [*context, *completion], **template_kwargs)
    eos = tokenizer.eos_token
    body, tail = completion, ""
    if eos:  # a trailing EOS string (and the whitespace after it) is the EOS token, as TRL reads it
        last = completion.rfind(eos)
        if last >= 0 and not completion[last + len(eos) :].strip():
            body, tail = completion[:last], completion[last:]
    text = context + completion
    if append_eos and eos and not text.endswith(eos):
        tail += eos
        text += eos
    if not has_special_text(tokenizer, body):
        return encode_text(tokenizer, text)
    start, end = _markers(context, body)
    marked = _mark(body, _specials(tokenizer).pattern, start, end)
    return _encode_marked(tokenizer, context + marked + tail, start, end)


def common_prefix_length(a: Sequence[int], b: Sequence[int]) -> int:
    """Number of leading tokens `a` and `b` share (list comparisons, a binary search on the first difference)."""
    if not (isinstance(a, list) and isinstance(b, list)):
        a, b = list(a), list(b)
    n = min(len(a), len(b))
    if n == 0 or a[0] != b[0]:
        return 0
    if a[:n] == b[:n]:
        return n
    low, high = 0, n - 1  # a[:low] == b[:low]; they differ within the first high + 1
    while low < high:
        middle = (low + high + 1) // 2
        if a[:middle] == b[:middle]:
            low = middle
        else:
            high = middle - 1
    return low


def context_token_ids(
    tokenizer: PreTrainedTokenizerBase, context: str | Sequence[Message], **template_kwargs
) -> list[int]:
    """Token ids of the context alone (plain text, or messages rendered without a generation prompt).

    Encoded as `encode_conversation` encodes the context part, so the two share their leading tokens.
    """
    if isinstance(context, str):
        return encode_text(tokenizer, context)
    return encode_messages(tokenizer, context, **template_kwargs)


def encode_pair(
    tokenizer: PreTrainedTokenizerBase,
    context: str | Sequence[Message],
    completion: str | Sequence[Message],
    *,
    context_ids: Sequence[int] | None = None,
    **template_kwargs,
) -> tuple[list[int], int]:
    """Token ids of `(context, completion)` (`encode_conversation`) and how many leading ones are the context's: what
    prefix sharing groups by and what `left_truncate` may cut. `context_ids`: the context's own ids
    (`context_token_ids`) when the caller already has them (GRPO repeats each prompt)."""
    ids = encode_conversation(tokenizer, context, completion, **template_kwargs)
    if context_ids is None:
        context_ids = context_token_ids(tokenizer, context, **template_kwargs)
    return ids, common_prefix_length(ids, context_ids)


def encode_pairs(
    tokenizer: PreTrainedTokenizerBase,
    contexts: Sequence[str | Sequence[Message]],
    completions: Sequence[str | Sequence[Message]],
    **template_kwargs,
) -> list[tuple[list[int], int]]:
    """`encode_pair` of every `(context, completion)`, the same ids: conversations whose messages spell no special
    token (the model card's rule: render, then encode the text) are encoded in ONE tokenizer call; the others, and
    plain text, one by one. Each distinct context object is encoded once (GRPO repeats each prompt)."""
    contexts, completions = list(contexts), list(completions)  # held here: an `id()` stays one object's
    out: list[tuple[list[int], int] | None] = [None] * len(contexts)
    context_ids: dict[int, list[int]] = {}
    batched: list[int] = []
    special: dict[int, bool] = {}  # per context object: plain text, or messages that spell a special token
    for i, (context, completion) in enumerate(zip(contexts, completions)):
        if id(context) not in context_ids:
            context_ids[id(context)] = context_token_ids(tokenizer, context, **template_kwargs)
            special[id(context)] = isinstance(context, str) or has_special_text(tokenizer, context)
        if special[id(context)] or isinstance(completion, str) or has_special_text(tokenizer, completion):
            out[i] = encode_pair(tokenizer, context, completion, context_ids=context_ids[id(context)], **template_kwargs)
        else:
            batched.append(i)
    if batched:
        texts = [render_conversation(tokenizer, [*contexts[i], *completions[i]], **template_kwargs) for i in batched]
        for i, ids in zip(batched, tokenizer(texts)["input_ids"]):
            ids = list(ids)
            out[i] = ids, common_prefix_length(ids, context_ids[id(contexts[i])])
    return out  # type: ignore[return-value]


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
