"""`RewardScorer`: exact, memory-bounded scoring of (context, completion) pairs with a sequence-classification RM.

Data path: `(context, completion)` -> token ids with the RM's own chat template (`templating.py`) -> over-length
handling -> micro-batches, longest first, capped by `batch_size` rows or `max_tokens_per_batch` padded tokens ->
`model(input_ids, attention_mask).logits[:, 0]` -> fp32 scores in input order.

Exactness: right padding with an attention mask leaves every real token's computation unchanged in a causal model,
and the classifier reads the last non-pad token, so each score equals scoring that example alone (fp32: < 1e-4,
proved by the parity tests).
"""

from __future__ import annotations

import contextlib
import logging
import math
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from .templating import (
    Message,
    common_prefix_length,
    context_token_ids,
    encode_conversation,
    left_truncate,
)

_THINK_BLOCK = re.compile(r"<think>.*?</think>\s*", re.DOTALL)
_OPEN_THINK = re.compile(r"<think>.*\Z", re.DOTALL)


logger = logging.getLogger(__name__)

def strip_reasoning_text(text: str) -> str:
    """Drop `<think>...</think>` blocks; an unclosed `<think>` drops the rest of the text (no answer came)."""
    return _OPEN_THINK.sub("", _THINK_BLOCK.sub("", text))


def _strip_completion(completion: str | Sequence[Message]) -> str | list[Message]:
    if isinstance(completion, str):
        return strip_reasoning_text(completion)
    return [
        {**m, "content": strip_reasoning_text(m["content"])} if m.get("role") == "assistant" else dict(m)
        for m in completion
    ]


@dataclass
class EncodedBatch:
    """What was scored: token ids per item, how many context tokens each has, and which items were handled."""

    ids: list[list[int] | None]
    context_lengths: list[int]
    truncated: list[int] = field(default_factory=list)  # indices left-truncated
    overlength: list[int] = field(default_factory=list)  # indices given the over-length fallback


AUTO_MIN_SAVING = 0.1  # "auto" shares a group when the cost model saves at least this fraction of its plain cost


def normalize_prefix_sharing(value: bool | str | None) -> bool | str:
    """`True`, `False` or `"auto"` from a bool, None (auto) or the strings auto/true/false (any case)."""
    if value is None or isinstance(value, bool):
        return "auto" if value is None else value
    text = str(value).strip().lower()
    if text in ("auto", "true", "false"):
        return {"auto": "auto", "true": True, "false": False}[text]
    raise ValueError(f"prefix_sharing must be True, False or 'auto', got {value!r}.")


class RewardScorer:
    """Score conversations with a sequence-classification reward model, exactly and in bounded memory.

    Args:
        model: A `*ForSequenceClassification` model (`num_labels >= 1`; column `label_index` is the reward).
        tokenizer: The reward model's tokenizer; its chat template renders every conversation.
        batch_size: At most this many sequences per forward pass (default 32 when `max_tokens_per_batch` is unset).
        max_tokens_per_batch: At most this many tokens per forward pass, padding included (`rows * longest`).
            Items are sorted longest first, so batches of similar length pack tightly.
        max_length: Longest sequence the model gets. Defaults to the model's `max_position_embeddings`.
        truncation: For a sequence over `max_length`: `"left"` cuts the context from the left (a leading BOS is
            kept; the completion is never cut), `"fallback"` gives it `overlength_reward` instead of a score.
        overlength_reward: The reward for sequences that cannot be scored within `max_length` (with `"left"`, the
            ones whose completion alone is too long). None raises an error instead.
        nonfinite_reward: The reward used when the model returns NaN/inf. None raises an error naming the items.
        strip_reasoning: Remove `<think>...</think>` from completions before scoring.
        label_index: Which output column is the reward (0 for Bradley-Terry models).
        show_progress: Show a progress bar over batches (`None`: only for more than 8 batches).
        template_kwargs: Extra keyword arguments for the chat template (e.g. `enable_thinking`), as NeMo RL's
            `tokenizer.chat_template_kwargs`.
        prefix_sharing: Score the completions that share a context (a GRPO group) against one encoding of it: the
            context goes through the model once with a KV cache, then every completion runs against that cache with
            position ids continuing after the context (see `trl_rm_env.scoring.prefix_sharing`). Same scores as
            scoring each alone, no mask over a whole row, any attention kernel (eager, SDPA, FlashAttention-2).
            Items are grouped by their exact shared token prefix. `"auto"` (default): on where the model supports
            it, for the groups where a cost model says it pays (at least `AUTO_MIN_SAVING` of the group's plain
            FLOPs saved: enough context tokens against the completions' and the group size); other items are
            scored plainly. `True`: every group of two or more items that shares a token. `False`: never. Where
            the model cannot (sliding-window layers, no cache, no `score` head), the plain path is used, logged
            once. `batch_size` bounds the contexts of one forward and the completions of one forward; the token
            budget bounds `rows x length` of both passes, the completions' keys (context + completion) included.
    """

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        *,
        batch_size: int | None = None,
        max_tokens_per_batch: int | None = None,
        max_length: int | None = None,
        truncation: str = "left",
        overlength_reward: float | None = None,
        nonfinite_reward: float | None = None,
        strip_reasoning: bool = False,
        label_index: int = 0,
        show_progress: bool | None = None,
        template_kwargs: dict[str, Any] | None = None,
        prefix_sharing: bool | str = "auto",
        output_weights: Sequence[float] | None = None,
    ):
        if truncation not in ("left", "fallback"):
            raise ValueError(f"truncation must be 'left' or 'fallback', got {truncation!r}")
        if batch_size is not None and batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.model = model
        self.tokenizer = tokenizer
        self.max_tokens_per_batch = max_tokens_per_batch
        self.batch_size = batch_size if batch_size is not None else (None if max_tokens_per_batch else 32)
        config_max = getattr(model.config, "max_position_embeddings", None)
        self.max_length = max_length or config_max
        if max_tokens_per_batch is not None and self.max_length is not None and max_tokens_per_batch < self.max_length:
            # A single sequence must always fit in one batch.
            self.max_length = max_tokens_per_batch
        self.truncation = truncation
        self.overlength_reward = overlength_reward
        self.nonfinite_reward = nonfinite_reward
        self.strip_reasoning = strip_reasoning
        self.label_index = label_index
        # A regression RM: the reward is `outputs @ output_weights` (every output, not column `label_index`).
        self.output_weights = None if output_weights is None else torch.tensor(output_weights, dtype=torch.float32)
        if self.output_weights is not None and self.output_weights.numel() != model.config.num_labels:
            raise ValueError(
                f"output_weights has {self.output_weights.numel()} values for {model.config.num_labels} outputs"
            )
        self.last_outputs: torch.Tensor | None = None  # (N, num_labels) of the last `score` call; NaN: not scored
        self.show_progress = show_progress
        self.template_kwargs = dict(template_kwargs or {})
        self.prefix_sharing = self._resolve_prefix_sharing(normalize_prefix_sharing(prefix_sharing))
        self.last_batch_shapes: list[tuple[int, int]] = []  # (rows, length) of each forward pass of the last call
        self.last_key_shapes: list[tuple[int, int]] = []  # (rows, keys) of each shared completion pass
        self.last_shared: list[int] = []  # items of the last call scored against a shared context
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
        if getattr(model.config, "pad_token_id", None) is None:
            model.config.pad_token_id = tokenizer.pad_token_id

    # ------------------------------------------------------------------ encoding
    def encode(
        self, contexts: Sequence[str | Sequence[Message]], completions: Sequence[str | Sequence[Message]]
    ) -> EncodedBatch:
        """Token ids for each `(context, completion)`, with over-length handling applied."""
        if len(contexts) != len(completions):
            raise ValueError(f"Got {len(contexts)} contexts but {len(completions)} completions; they must match.")
        ids: list[list[int] | None] = []
        context_lengths: list[int] = []
        out = EncodedBatch(ids, context_lengths)
        cache: dict[int, list[int]] = {}  # context ids, keyed by the context object (GRPO repeats each prompt)
        for i, (context, completion) in enumerate(zip(contexts, completions)):
            if self.strip_reasoning:
                completion = _strip_completion(completion)
            seq = encode_conversation(self.tokenizer, context, completion, **self.template_kwargs)
            key = id(context)
            if key not in cache:
                cache[key] = context_token_ids(self.tokenizer, context, **self.template_kwargs)
            context_length = common_prefix_length(seq, cache[key])
            if self.max_length is not None and len(seq) > self.max_length:
                cut = left_truncate(seq, context_length, self.max_length, self.tokenizer.bos_token_id)
                if self.truncation == "left" and cut is not None:
                    context_length -= len(seq) - len(cut)
                    seq = cut
                    out.truncated.append(i)
                elif self.overlength_reward is not None:
                    seq = None
                    out.overlength.append(i)
                else:
                    raise ValueError(
                        f"Item {i} is {len(seq)} tokens, over max_length={self.max_length}"
                        + (" even after cutting its whole context" if self.truncation == "left" else "")
                        + ". Set `overlength_reward` to give such items a fixed reward, or raise max_length."
                    )
            ids.append(seq)
            context_lengths.append(context_length)
        return out

    # ------------------------------------------------------------------ batching
    def plan_batches(self, lengths: Sequence[int]) -> list[list[int]]:
        """Group item indices into micro-batches: longest first, within `batch_size` rows and the token budget."""
        order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
        budget = self.max_tokens_per_batch

        def fits(current: list[int], i: int) -> bool:  # longest first: the batch's longest is its first
            return budget is None or (len(current) + 1) * lengths[current[0]] <= budget

        return self._greedy_batches(order, fits)

    def _greedy_batches(self, order: Sequence[int], fits: Callable[[list[int], int], bool]) -> list[list[int]]:
        """Cut `order` into batches: a batch takes the next index while it has fewer than `batch_size` and
        `fits(batch, index)`; an index that does not fit starts a new batch (alone, it always gets one)."""
        batches: list[list[int]] = []
        current: list[int] = []
        for i in order:
            full = self.batch_size is not None and len(current) + 1 > self.batch_size
            if current and (full or not fits(current, i)):
                batches.append(current)
                current = []
            current.append(i)
        if current:
            batches.append(current)
        return batches

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def _resolve_prefix_sharing(self, mode: bool | str) -> bool | str:
        """The mode the scorer runs: `False` where the model cannot share (logged once), else `mode`."""
        from .prefix_sharing import kv_sharing_unsupported

        if mode is False:
            return False
        reason = kv_sharing_unsupported(self.model)
        if reason is None:
            if mode == "auto":
                logger.info("prefix_sharing='auto': groups sharing a context are scored against its KV cache where "
                            "the cost model says it pays.")
            return mode
        log = logger.warning if mode is True else logger.info
        log("prefix_sharing=%r: %s; scoring each sequence separately.", mode, reason)
        return False

    @torch.inference_mode()
    def score_ids(self, sequences: Sequence[Sequence[int]], progress: bool | None = None) -> torch.Tensor:
        """Scores (fp32, CPU, input order) of already-encoded sequences. `progress` overrides `show_progress`."""
        self.last_batch_shapes, self.last_key_shapes = [], []
        outputs = self._plain_outputs(sequences, progress)
        self._last_id_outputs = outputs
        return self._reward_of(outputs)

    def _reward_of(self, outputs: torch.Tensor) -> torch.Tensor:
        if self.output_weights is not None:
            return outputs @ self.output_weights
        return outputs[:, self.label_index].clone()

    def _plain_outputs(self, sequences: Sequence[Sequence[int]], progress: bool | None) -> torch.Tensor:
        """`(N, num_labels)` fp32 outputs, one padded row per sequence (appends to `last_batch_shapes`)."""
        outputs = torch.empty(len(sequences), self.model.config.num_labels, dtype=torch.float32)
        if not sequences:
            return outputs
        batches = self.plan_batches([len(s) for s in sequences])
        pad_id = self.tokenizer.pad_token_id
        with torch.inference_mode(), self._in_eval_mode(batches, progress) as iterator:
            for batch in iterator:
                length = max(len(sequences[i]) for i in batch)
                input_ids = torch.full((len(batch), length), pad_id, dtype=torch.long)
                attention_mask = torch.zeros((len(batch), length), dtype=torch.long)
                for row, i in enumerate(batch):
                    input_ids[row, : len(sequences[i])] = torch.as_tensor(sequences[i])
                    attention_mask[row, : len(sequences[i])] = 1
                self.last_batch_shapes.append((len(batch), length))
                logits = self.model(
                    input_ids=input_ids.to(self.device), attention_mask=attention_mask.to(self.device), use_cache=False
                ).logits
                outputs[torch.tensor(batch)] = logits.float().cpu()
        return outputs

    def share_plan(
        self, sequences: Sequence[Sequence[int]], context_lengths: Sequence[int]
    ) -> tuple[list[tuple[int, list[int]]], list[int]]:
        """Which items to score against a shared context: `(groups, plain)`, each group `(prefix length, items)`.

        Items are grouped by their first `context_length` tokens (exact token equality); a group's prefix is the
        longest one all its items share (each keeps at least one token of its own). With `prefix_sharing=True`
        every group of two or more items with a prefix of at least one token is shared; with `"auto"` only those
        where the cost model (`AUTO_MIN_SAVING`) says it pays.
        """
        from .prefix_sharing import shared_prefix_length

        keyed: dict[tuple[int, ...], list[int]] = {}
        for i, (seq, n) in enumerate(zip(sequences, context_lengths)):
            keyed.setdefault(tuple(seq[:n]), []).append(i)
        groups, plain = [], []
        for members in keyed.values():
            prefix = shared_prefix_length([sequences[i] for i in members]) if len(members) > 1 else 0
            own = [len(sequences[i]) - prefix for i in members]
            if prefix >= 1 and (self.prefix_sharing is True or self.sharing_saves(prefix, own) >= AUTO_MIN_SAVING):
                groups.append((prefix, sorted(members, key=lambda i: -len(sequences[i]))))
            else:
                plain += members
        return groups, sorted(plain)

    def sharing_saves(self, prefix: int, completions: Sequence[int]) -> float:
        """The fraction of a group's plain scoring FLOPs that scoring against its shared context saves.

        Cost of a forward over `n` query tokens against `k` keys, in attention-pair units: `n * ratio + n * k`
        (`ratio` = `_linear_to_attention_cost`, projections and MLP per token over attention per pair). Plain: each
        item `(P + c)` tokens against themselves; shared: the context once, then each completion's `c` tokens
        against `P + c` keys.
        """
        ratio = self._linear_to_attention_cost()
        if math.isinf(ratio) or not completions:
            return 1.0 if len(completions) > 1 else 0.0
        plain = sum((prefix + c) * ratio + (prefix + c) ** 2 for c in completions)
        shared = prefix * ratio + prefix**2 + sum(c * ratio + c * (prefix + c) for c in completions)
        return 1.0 - shared / plain

    @torch.inference_mode()
    def score_ids_shared(
        self, sequences: Sequence[Sequence[int]], context_lengths: Sequence[int], progress: bool | None = None
    ) -> torch.Tensor:
        """Like `score_ids`, with the items that share a context scored against one encoding of it (`share_plan`
        decides which; the rest are scored plainly)."""
        self.last_batch_shapes, self.last_key_shapes = [], []
        outputs = self._shared_outputs(sequences, context_lengths, progress)
        self._last_id_outputs = outputs
        return self._reward_of(outputs)

    def _shared_outputs(
        self, sequences: Sequence[Sequence[int]], context_lengths: Sequence[int], progress: bool | None
    ) -> torch.Tensor:
        from .prefix_sharing import collate_shared_context, plan_passes, shared_context_scores

        groups, plain = self.share_plan(sequences, context_lengths)
        self.last_shared = sorted(i for _, members in groups for i in members)
        outputs = torch.empty(len(sequences), self.model.config.num_labels, dtype=torch.float32)
        if plain:
            outputs[torch.tensor(plain)] = self._plain_outputs([sequences[i] for i in plain], progress)
        if not groups:
            return outputs
        batches = self._plan_shared_batches(groups, sequences)
        with torch.inference_mode(), self._in_eval_mode(batches, progress) as iterator:
            for batch in iterator:
                chosen = [groups[g] for g in batch]
                inputs = collate_shared_context(
                    [[sequences[i] for i in members] for _, members in chosen],
                    [p for p, _ in chosen],
                    self.tokenizer.pad_token_id,
                )
                prefix_lengths = [p for p, _ in chosen]
                inputs["prefix_chunks"] = plan_passes(prefix_lengths, self.batch_size, self.max_tokens_per_batch)
                own = inputs["completion_mask"].sum(1).tolist()
                context_of = [prefix_lengths[g] for g in inputs["group_index"].tolist()]
                inputs["completion_chunks"] = plan_passes(own, self.batch_size, self.max_tokens_per_batch, context_of)
                for rows, length in inputs["prefix_chunks"]:
                    self.last_batch_shapes.append((len(rows), length))
                for rows, length in inputs["completion_chunks"]:
                    self.last_batch_shapes.append((len(rows), length))
                    self.last_key_shapes.append((len(rows), max(context_of[i] for i in rows) + length))
                inputs = {k: (v.to(self.device) if torch.is_tensor(v) else v) for k, v in inputs.items()}
                values, _ = shared_context_scores(self.model, inputs, label_index=None)
                items = [i for _, members in chosen for i in members]
                outputs[torch.tensor(items)] = values.float().cpu()
        return outputs

    def _plan_shared_batches(self, groups: list[tuple[int, list[int]]], sequences) -> list[list[int]]:
        """Batches of groups for the context pass: longest context first, at most `batch_size` contexts and
        `max_tokens_per_batch` padded context tokens, and every completion row able to fit the budget with the
        batch's longest context (`rows x (context + completion)`)."""
        order = sorted(range(len(groups)), key=lambda g: -groups[g][0])
        budget = self.max_tokens_per_batch

        def fits(current: list[int], g: int) -> bool:  # longest context first: the batch's longest is its first
            prefix = groups[current[0]][0]
            longest_own = max(len(sequences[i]) - groups[g][0] for i in groups[g][1])
            return budget is None or ((len(current) + 1) * prefix <= budget and prefix + longest_own <= budget)

        return self._greedy_batches(order, fits)

    @contextlib.contextmanager
    def _in_eval_mode(self, batches: list[list[int]], progress: bool | None) -> Iterator[Any]:
        """The model in eval mode (its training flag restored after), and `batches` to iterate, behind a progress
        bar when `progress` (None: `show_progress`, else only for more than 8 batches)."""
        if progress is None:
            progress = self.show_progress if self.show_progress is not None else len(batches) > 8
        iterator: Any = batches
        if progress:
            from tqdm.auto import tqdm

            iterator = tqdm(batches, desc="Scoring", unit="batch")
        was_training = self.model.training
        self.model.eval()
        try:
            yield iterator
        finally:
            self.model.train(was_training)

    def _linear_to_attention_cost(self) -> float:
        """FLOPs per token in a decoder layer's projections over FLOPs per (query, key) pair of its attention.

        From the config of a standard decoder (`hidden_size`, `intermediate_size`, heads, `head_dim`; gated MLP);
        infinity (always share) when the config does not say.
        """
        config = getattr(self.model, "config", None)
        hidden = getattr(config, "hidden_size", None)
        heads = getattr(config, "num_attention_heads", None)
        if not hidden or not heads:
            return math.inf
        head_dim = getattr(config, "head_dim", None) or hidden // heads
        kv_heads = getattr(config, "num_key_value_heads", None) or heads
        ffn = getattr(config, "intermediate_size", None) or 4 * hidden
        q, kv = heads * head_dim, kv_heads * head_dim
        linear = 2 * (hidden * q + 2 * hidden * kv + q * hidden + 3 * hidden * ffn)
        return linear / (4 * q)  # QK^T and attention-weighted V: 2 FLOPs each per pair and channel

    def score(
        self,
        contexts: Sequence[str | Sequence[Message]],
        completions: Sequence[str | Sequence[Message]],
        progress: bool | None = None,
    ) -> torch.Tensor:
        """Scores (fp32, input order) of `(context, completion)` pairs, with fallbacks applied."""
        encoded = self.encode(contexts, completions)
        self.last_outputs = None
        present = [i for i, ids in enumerate(encoded.ids) if ids is not None]
        scores = torch.full((len(encoded.ids),), float("nan"), dtype=torch.float32)
        if present:
            ids = [encoded.ids[i] for i in present]
            if self.prefix_sharing:
                context_lengths = [encoded.context_lengths[i] for i in present]
                scores[torch.tensor(present)] = self.score_ids_shared(ids, context_lengths, progress)
                self.last_shared = [present[i] for i in self.last_shared]
            else:
                scores[torch.tensor(present)] = self.score_ids(ids, progress)
                self.last_shared = []
            self.last_outputs = torch.full((len(encoded.ids), self._last_id_outputs.shape[1]), float("nan"))
            self.last_outputs[torch.tensor(present)] = self._last_id_outputs
        if encoded.overlength:
            scores[torch.tensor(encoded.overlength)] = float(self.overlength_reward)
        bad = [i for i in present if not torch.isfinite(scores[i])]
        self.last_nonfinite = bad  # items of the last call given `nonfinite_reward` (the environment warns, counts)
        if bad:
            if self.nonfinite_reward is None:
                raise FloatingPointError(
                    f"The reward model returned NaN/inf for item(s) {bad[:10]}{'...' if len(bad) > 10 else ''}. "
                    "Check the model dtype (fp16 overflows are common) or set `nonfinite_reward`."
                )
            scores[torch.tensor(bad)] = float(self.nonfinite_reward)
        return scores


def split_conversation(conversation: Sequence[Message]) -> tuple[list[Message], list[Message]]:
    """Split a full conversation into `(context, completion)`: the completion is the trailing assistant turn(s)."""
    messages = list(conversation)
    end = len(messages)
    while end > 0 and messages[end - 1].get("role") == "assistant":
        end -= 1
    if end == len(messages):
        raise ValueError("The conversation does not end with an assistant message, so there is nothing to score.")
    return messages[:end], messages[end:]


def as_pairs(conversations: Sequence[Any]) -> tuple[list[Any], list[Any]]:
    """Accept full conversations (message lists) or `(context, completion)` pairs; return two lists."""
    contexts, completions = [], []
    for item in conversations:
        if isinstance(item, tuple) and len(item) == 2:
            context, completion = item
        else:
            context, completion = split_conversation(item)
        contexts.append(context)
        completions.append(completion)
    return contexts, completions
