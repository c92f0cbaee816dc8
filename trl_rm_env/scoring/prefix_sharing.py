"""Prefix sharing: the context shared by several completions goes through the model once.

Wang & Hegde (2024), "Accelerating Direct Preference Optimization with Prefix Sharing", for DPO; here for reward
models with N ranked completions (training) and GRPO groups of G completions (scoring). Two layouts:

**Shared context (KV cache), the default.** The contexts of a batch run once with `use_cache` (right-padded, in
passes of similar lengths); every completion then runs as its own row against its context's cached keys and values
(handed to each row by index, a view for a single context), with position ids continuing after the context and a
2-D mask over context + completion; the score is read at each completion's last real token. Cost `P² + N·C·(P + C)`
per record, no mask over a whole row, any attention kernel. `collate_shared_context`, `shared_context_scores`,
`DataCollatorForSharedContext`, `kv_sharing_unsupported` (when it cannot run).

**Block-mask rows, the fallback** (activation checkpointing or FSDP in training, with `prefix_sharing=True`). A
record whose completions tokenize to `P + S_1`, ..., `P + S_N` becomes the row `P S_1 S_2 ... S_N` with

- a block mask: tokens of `S_i` attend causally to `P` and to `S_i` only, never to another completion;
- position ids that restart at `len(P)` for every `S_i`, so each completion sees exactly the positions it would
  see alone;
- the score of completion i read at the last token of `S_i`.

Its attention costs `(P + N·C)²` over a dense mask (eager and SDPA only). With `pack_max_tokens`, several records
share one row (each record its own block).

Mathematically every score equals the score of `P + S_i` run alone; numerically they agree to float rounding (the
tests check 1e-4 in fp32). Scores are taken from the output of the model's `score` head through a forward hook, so
the forward still runs through the (DDP / DeepSpeed / FSDP / PEFT) wrapper, once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from transformers.cache_utils import Cache, DynamicCache, DynamicLayer
from transformers.data.data_collator import DataCollatorMixin

from .templating import common_prefix_length

SUPPORTED_ATTENTION = ("eager", "sdpa")


def shared_prefix_length(sequences: Sequence[Sequence[int]]) -> int:
    """Longest prefix shared by every sequence, capped so each sequence keeps at least one token of its own."""
    first = sequences[0]
    n = min(len(s) for s in sequences) - 1
    for seq in sequences[1:]:
        n = min(n, common_prefix_length(first, seq))
    return max(n, 0)


def record_row(
    completion_ids: Sequence[Sequence[int]], prefix_length: int | None = None
) -> tuple[list[int], list[int], list[int], list[int]]:
    """One record as `(tokens, positions, segments, score_offsets)`: segment 0 is the shared prefix, k the k-th
    completion (1-based); `score_offsets[k-1]` is the row offset of completion k's last token. `prefix_length`
    defaults to `shared_prefix_length(completion_ids)`."""
    p = shared_prefix_length(completion_ids) if prefix_length is None else prefix_length
    prefix = list(completion_ids[0][:p])
    tokens, positions, segments, offsets = prefix[:], list(range(p)), [0] * p, []
    for k, seq in enumerate(completion_ids, start=1):
        suffix = list(seq[p:])
        tokens += suffix
        positions += range(p, p + len(suffix))
        segments += [k] * len(suffix)
        offsets.append(len(tokens) - 1)
    return tokens, positions, segments, offsets


def plan_rows(lengths: Sequence[int], max_tokens: int | None) -> list[list[int]]:
    """Group records into rows. Without `max_tokens`, one record per row; with it, first-fit (longest first) packing
    of records into rows of at most `max(max_tokens, longest record)` tokens. Returns record indices per row."""
    if not max_tokens:
        return [[i] for i in range(len(lengths))]
    capacity = max(max_tokens, max(lengths))
    rows: list[list[int]] = []
    used: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        for r, total in enumerate(used):
            if total + lengths[i] <= capacity:
                rows[r].append(i)
                used[r] += lengths[i]
                break
        else:
            rows.append([i])
            used.append(lengths[i])
    return rows


def shared_prefix_mask(record_ids: torch.Tensor, segment_ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The attention mask `(R, 1, L, L)` for rows built by `DataCollatorForSharedPrefix`: additive in `dtype`, or
    boolean (True = attend) when `dtype` is `torch.bool`.

    Query q may attend to key k when both belong to the same record, k is not after q, and k is in the shared
    prefix or in q's own completion. Padding (record id -1) attends only to itself, so no softmax row is empty.
    """
    length = record_ids.shape[1]
    same_record = record_ids[:, :, None] == record_ids[:, None, :]
    causal = torch.ones(length, length, dtype=torch.bool, device=record_ids.device).tril()
    visible = (segment_ids[:, None, :] == 0) | (segment_ids[:, :, None] == segment_ids[:, None, :])
    allowed = same_record & causal & visible & (record_ids[:, None, :] >= 0)
    allowed |= torch.eye(length, dtype=torch.bool, device=record_ids.device)
    if dtype == torch.bool:  # SDPA takes a boolean mask (True = attend) as-is: no float copy
        return allowed[:, None]
    mask = torch.zeros(allowed.shape, dtype=dtype, device=record_ids.device)
    mask.masked_fill_(~allowed, torch.finfo(dtype).min)
    return mask[:, None]


@dataclass
class DataCollatorForSharedPrefix(DataCollatorMixin):
    """Collate rank records into prefix-shared (and optionally packed) rows.

    The batch holds `input_ids`, `position_ids`, `record_ids`, `segment_ids` (all `(R, L)`, right-padded),
    `score_index` `(C, 2)` (row, column of each completion's last token, completions in record order), `ranks` and
    `record_index` `(C,)` as in `DataCollatorForRankedPreference`, and `margin` `(B,)` when present. The trainer
    builds the 4-D mask from `record_ids` and `segment_ids`.

    Args:
        pad_token_id: Token id used for padding.
        pack_max_tokens: If set, pack several records into a row of up to this many tokens.
        pad_to_multiple_of: If set, pad the row length to a multiple of this value.
    """

    pad_token_id: int
    pack_max_tokens: int | None = None
    pad_to_multiple_of: int | None = None
    return_tensors: str = "pt"

    def torch_call(self, examples: list[dict[str, Any]]) -> dict[str, Any]:
        built = [record_row(example["completion_ids"]) for example in examples]
        rows = plan_rows([len(b[0]) for b in built], self.pack_max_tokens)
        row_len = max(sum(len(built[i][0]) for i in row) for row in rows)
        if self.pad_to_multiple_of:
            row_len = -(-row_len // self.pad_to_multiple_of) * self.pad_to_multiple_of
        shape = (len(rows), row_len)
        input_ids = torch.full(shape, self.pad_token_id, dtype=torch.long)
        position_ids = torch.zeros(shape, dtype=torch.long)
        record_ids = torch.full(shape, -1, dtype=torch.long)
        segment_ids = torch.full(shape, -1, dtype=torch.long)
        where: dict[int, tuple[int, int]] = {}  # record -> (row, start column)
        for r, row in enumerate(rows):
            start = 0
            for i in row:
                tokens, positions, segments, _ = built[i]
                end = start + len(tokens)
                input_ids[r, start:end] = torch.tensor(tokens)
                position_ids[r, start:end] = torch.tensor(positions)
                segment_ids[r, start:end] = torch.tensor(segments)
                record_ids[r, start:end] = i
                where[i] = (r, start)
                start = end
        score_index = [
            (where[i][0], where[i][1] + offset) for i in range(len(examples)) for offset in built[i][3]
        ]
        output = {
            "input_ids": input_ids,
            "position_ids": position_ids,
            "record_ids": record_ids,
            "segment_ids": segment_ids,
            "score_index": torch.tensor(score_index, dtype=torch.long),
            "ranks": torch.tensor([r for example in examples for r in example["ranks"]], dtype=torch.long),
            "record_index": torch.tensor(
                [i for i, example in enumerate(examples) for _ in example["completion_ids"]], dtype=torch.long
            ),
        }
        if "margin" in examples[0]:
            output["margin"] = torch.tensor([example["margin"] for example in examples], dtype=torch.float)
        return output


def find_score_head(model: torch.nn.Module) -> torch.nn.Module | None:
    """The `score` head of a `*ForSequenceClassification` model, through DDP/DeepSpeed/FSDP/PEFT wrappers.

    The first module named `score` in traversal order (a PEFT `modules_to_save` wrapper comes before its copies).
    """
    for name, module in model.named_modules():
        if name.rsplit(".", 1)[-1] == "score":
            return module
    return None


def shared_prefix_scores(
    model: torch.nn.Module, inputs: dict[str, torch.Tensor], dtype: torch.dtype, label_index: int = 0
) -> tuple:
    """Run the model once on prefix-shared rows and return `(scores (C,), outputs)`.

    The forward goes through `model` (so distributed wrappers see it); the per-position logits of the score head are
    captured with a forward hook and read at `score_index`.
    """
    head = find_score_head(model)
    if head is None:
        raise ValueError("Prefix sharing needs a model with a `score` head (a `*ForSequenceClassification`).")
    captured: list[torch.Tensor] = []
    handle = head.register_forward_hook(lambda module, args, output: captured.append(output))
    try:
        config = getattr(getattr(model, "module", model), "config", None)  # through DDP / DeepSpeed wrappers
        attention = getattr(config, "_attn_implementation", None)
        mask_dtype = torch.bool if attention == "sdpa" else dtype
        mask = shared_prefix_mask(inputs["record_ids"], inputs["segment_ids"], mask_dtype)
        outputs = model(
            input_ids=inputs["input_ids"],
            attention_mask=mask,
            position_ids=inputs["position_ids"],
            use_cache=False,
        )
    finally:
        handle.remove()
    logits = captured[-1]  # (R, L, num_labels)
    index = inputs["score_index"]
    return logits[index[:, 0], index[:, 1], label_index], outputs


# ------------------------------------------------------------------------------------------ shared context (KV cache)
#
# The block-mask row above pays attention over the whole row, `(P + N·C)²`, and materializes an `(L, L)` mask. The
# shared-context path below reuses the context's keys and values instead: the contexts of a batch of records (or
# GRPO groups) go through the model once, right-padded, with `use_cache`; then every completion runs as its own row
# against its record's cached context (`past_key_values` / `cache`), with position ids continuing after the context
# and a 2-D mask over context + completion. No mask over the whole row exists, any attention kernel works, and the
# cost is `P² + N·C·(P + C)` per record. Both passes run inside ONE call of the (possibly wrapped) model: the forward
# of the model's decoder body is swapped for the duration of the call, so DDP, DeepSpeed, FSDP2 and PEFT see a single
# forward, and backward goes through both passes.

KV_ATTENTION = ("eager", "sdpa", "flash_attention_2", "flash_attention_3")


def _classifier(model: torch.nn.Module) -> torch.nn.Module | None:
    """The `*ForSequenceClassification` inside `model` (through DDP/DeepSpeed/FSDP/PEFT wrappers)."""
    from transformers import PreTrainedModel

    for module in model.modules():
        if isinstance(module, PreTrainedModel) and find_score_head(module) is not None:
            return module
    return None


def _cache_argument(body: torch.nn.Module) -> str | None:
    import inspect

    params = inspect.signature(body.forward).parameters
    for name in ("cache", "past_key_values"):  # transformers >= 5.2x renames `past_key_values` to `cache`
        if name in params:
            return name
    return None


def kv_sharing_unsupported(model: torch.nn.Module, training: bool = False) -> str | None:
    """Why the shared-context (KV cache) path cannot run `model`, or None when it can.

    Needs a `*ForSequenceClassification` with a `score` head whose decoder body takes a cache, full attention in
    every layer (a sliding window would count the padded context slots), an attention kernel in `KV_ATTENTION`, and,
    when training, no activation checkpointing (checkpointed layers drop the cache).
    """
    hf = _classifier(model)
    if hf is None:
        return "it needs a *ForSequenceClassification model with a `score` head"
    config = hf.config
    attention = getattr(config, "_attn_implementation", None)
    if attention not in KV_ATTENTION:
        return f"attn_implementation {attention!r} is not one of {KV_ATTENTION}"
    body = getattr(hf, getattr(hf, "base_model_prefix", ""), None)
    if body is None or body is hf or _cache_argument(body) is None:
        return f"{type(hf).__name__}'s decoder takes no KV cache"
    layer_types = getattr(config, "layer_types", None)
    if layer_types is not None:
        if any(t != "full_attention" for t in layer_types):
            return f"its layers are not all full attention ({sorted(set(layer_types))})"
    elif getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True):
        return "it uses sliding-window attention"
    checkpointing = getattr(hf, "is_activation_checkpointing", None)
    if checkpointing is None:  # transformers before the rename
        checkpointing = getattr(hf, "is_gradient_checkpointing", False)
    if training and checkpointing:
        return "activation checkpointing drops the KV cache"
    if training and any(type(m).__name__.startswith(("FSDP", "FullyShardedDataParallel")) for m in model.modules()):
        return "FSDP reshards each layer between the context and completion passes, before backward"
    return None


def collate_shared_context(
    groups: Sequence[Sequence[Sequence[int]]], prefix_lengths: Sequence[int], pad_token_id: int
) -> dict[str, torch.Tensor]:
    """Tensors of the shared-context path for `groups` of token sequences, group g sharing its first
    `prefix_lengths[g]` tokens; every sequence keeps at least one token after the prefix. A group with no shared
    token (prefix length 0) gets an empty context: its completions run whole, attending to themselves only.

    Returns `prefix_ids`, `prefix_mask` `(B, P)` (right-padded contexts), `completion_ids`, `completion_mask`,
    `completion_positions` `(M, C)` (right-padded completion tokens, positions continuing after their context),
    `group_index` `(M,)` (the context of each completion) and `last_index` `(M,)` (column of its last token),
    completions in group order.
    """
    if any(p < 0 for p in prefix_lengths):
        raise ValueError("collate_shared_context needs prefix lengths >= 0.")
    suffixes = [list(seq[p:]) for group, p in zip(groups, prefix_lengths) for seq in group]
    if any(not s for s in suffixes):
        raise ValueError("every sequence needs at least one token after its group's shared prefix.")
    num_groups, prefix_len = len(groups), max(1, *prefix_lengths)  # an empty context still has one (masked) slot
    prefix_ids = torch.full((num_groups, prefix_len), pad_token_id, dtype=torch.long)
    prefix_mask = torch.zeros((num_groups, prefix_len), dtype=torch.long)
    for g, (group, p) in enumerate(zip(groups, prefix_lengths)):
        prefix_ids[g, :p] = torch.as_tensor(list(group[0][:p]))
        prefix_mask[g, :p] = 1
    completion_len = max(len(s) for s in suffixes)
    shape = (len(suffixes), completion_len)
    completion_ids = torch.full(shape, pad_token_id, dtype=torch.long)
    completion_mask = torch.zeros(shape, dtype=torch.long)
    group_index = torch.tensor([g for g, group in enumerate(groups) for _ in group], dtype=torch.long)
    for m, suffix in enumerate(suffixes):
        completion_ids[m, : len(suffix)] = torch.as_tensor(suffix)
        completion_mask[m, : len(suffix)] = 1
    offsets = torch.as_tensor(list(prefix_lengths), dtype=torch.long)[group_index]
    return {
        "prefix_ids": prefix_ids,
        "prefix_mask": prefix_mask,
        "completion_ids": completion_ids,
        "completion_mask": completion_mask,
        "completion_positions": offsets[:, None] + torch.arange(completion_len)[None, :],
        "group_index": group_index,
        "last_index": completion_mask.sum(1) - 1,
    }


def plan_passes(
    lengths: Sequence[int], max_rows: int | None = None, max_tokens: int | None = None,
    extra: Sequence[int] | None = None, slack: float = 0.25,
) -> list[tuple[list[int], int]]:
    """Split rows into passes `(rows, length)`: longest first; a pass grows while its padding stays within `slack`
    of its real tokens, it has at most `max_rows` rows, and `rows x (length + extra)` (`extra[i]`: keys row i also
    needs, e.g. its context's length; the pass counts its largest) stays within `max_tokens` (a row alone always
    gets a pass)."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    passes: list[tuple[list[int], int]] = []
    rows: list[int] = []
    real, keys = 0, 0
    for i in order:
        if rows:
            n = len(rows) + 1
            longest = lengths[rows[0]]
            grown_keys = max(keys, extra[i] if extra else 0)
            too_padded = n * longest > (1 + slack) * (real + lengths[i])
            too_many = max_rows is not None and n > max_rows
            too_big = max_tokens is not None and n * (longest + grown_keys) > max_tokens
            if too_padded or too_many or too_big:
                passes.append((rows, longest))
                rows, real, keys = [], 0, 0
        rows.append(i)
        real += lengths[i]
        keys = max(keys, extra[i] if extra else 0)
    if rows:
        passes.append((rows, lengths[rows[0]]))
    return passes


class _SharedContextLayer(DynamicLayer):
    """One layer's cache for the completion pass: the contexts' keys/values, handed to each completion row by
    `group_index` (a view when there is one context), concatenated with the row's own keys/values. Nothing is
    stored: the completions' keys are needed only by the call that makes them."""

    is_croppable = False

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, group_index: torch.Tensor):
        super().__init__()
        self.keys, self.values, self.group_index = keys, values, group_index
        self.is_initialized = True
        self.device = keys.device

    def _rows(self, states: torch.Tensor, rows: int) -> torch.Tensor:
        if states.shape[0] == 1:
            return states.expand(rows, *states.shape[1:])
        return states.index_select(0, self.group_index)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        rows = key_states.shape[0]
        keys = torch.cat([self._rows(self.keys, rows), key_states], dim=-2)
        values = torch.cat([self._rows(self.values, rows), value_states], dim=-2)
        return keys, values


def shared_context_scores(
    model: torch.nn.Module, inputs: dict[str, Any], label_index: int | None = 0, **forward_kwargs: Any
) -> tuple[torch.Tensor, Any]:
    """Scores `(M,)` of the completions in `inputs` (from `collate_shared_context`) and the model's outputs;
    `label_index=None` returns every output column `(M, num_labels)`. Optional `inputs["prefix_chunks"]` and
    `inputs["completion_chunks"]`, lists of `(rows, length)` covering every row once (see `plan_passes`), run those
    rows (trimmed to `length` columns) as separate passes: contexts of similar lengths together (little padding),
    and completion rows in passes of bounded size, all against the one context cache.

    One call of `model` (wrapped or not): its decoder body runs the contexts once with a cache, then the
    completions against it; the score head's per-position logits (captured by a forward hook, as in
    `shared_prefix_scores`) are read at each completion's last token. With grad enabled, backward goes through both
    passes (the contexts' keys and values are part of the graph).
    """
    hf = _classifier(model)
    reason = kv_sharing_unsupported(model)
    if reason is not None:
        raise ValueError(f"The shared-context path cannot run this model: {reason}.")
    body = getattr(hf, hf.base_model_prefix)
    cache_name = _cache_argument(body)
    head = find_score_head(model)
    original = body.forward
    shadowed = "forward" in vars(body)

    def two_passes(*args: Any, **kwargs: Any):
        prefix_ids, prefix_mask = inputs["prefix_ids"], inputs["prefix_mask"]
        num_groups, width = prefix_ids.shape
        device = prefix_ids.device
        prefix_chunks = inputs.get("prefix_chunks") or [(list(range(num_groups)), width)]
        stores = []
        # An empty context (prefix length 0) runs its one padding slot, so no row of the context pass is masked out
        # entirely; the completions never see that slot (`prefix_mask` is 0 there).
        context_pass_mask = prefix_mask.clone()
        context_pass_mask[:, 0] = 1
        for rows, length in prefix_chunks:  # contexts of similar length together: little padding
            length = max(int(length), 1)
            index = torch.as_tensor(rows, device=device)
            store = DynamicCache(config=hf.config)
            original(
                input_ids=prefix_ids[index, :length], attention_mask=context_pass_mask[index, :length],
                position_ids=torch.arange(length, device=device)[None].expand(len(rows), length),
                use_cache=True, **{cache_name: store},
            )
            stores.append((index, length, store))
        # Every layer's context keys/values as (groups, heads, width, dim), zero-padded (the mask hides the padding).
        layers = []
        for layer in range(len(stores[0][2].layers)):
            states = []
            for which in ("keys", "values"):
                parts = [getattr(store.layers[layer], which) for _, _, store in stores]
                if len(stores) == 1 and stores[0][1] == width and list(prefix_chunks[0][0]) == list(range(num_groups)):
                    states.append(parts[0])  # one pass over every context in order: as is
                    continue
                full = parts[0].new_zeros(num_groups, parts[0].shape[1], width, parts[0].shape[3])
                for (index, length, _), part in zip(stores, parts):
                    padded = torch.nn.functional.pad(part, (0, 0, 0, width - length)) if length < width else part
                    full = full.index_copy(0, index, padded)
                states.append(full)
            layers.append(states)
        group_index = inputs["group_index"]
        completion_ids = inputs["completion_ids"]
        num_rows, completion_width = completion_ids.shape
        chunks = inputs.get("completion_chunks") or [(list(range(num_rows)), completion_width)]
        prefix_lengths = prefix_mask.sum(1)
        hidden, last = None, None
        for rows, length in chunks:  # completion rows in passes of bounded size, all against the context cache
            index = torch.as_tensor(rows, device=device)
            groups = group_index[index]
            context = max(1, int(prefix_lengths[groups].max()))  # the keys this pass needs: its contexts' longest
            cache = Cache(layers=[_SharedContextLayer(k[..., :context, :], v[..., :context, :], groups)
                                  for k, v in layers])
            mask = torch.cat([prefix_mask[groups, :context], inputs["completion_mask"][index, :length]], 1)
            last = original(
                input_ids=completion_ids[index, :length], attention_mask=mask,
                position_ids=inputs["completion_positions"][index, :length], use_cache=True, **{cache_name: cache},
            )
            states = last.last_hidden_state
            if len(chunks) == 1 and length == completion_width and list(rows) == list(range(num_rows)):
                return last  # one pass over every row in order: as is
            if length < completion_width:
                states = torch.nn.functional.pad(states, (0, 0, 0, completion_width - length))
            if hidden is None:
                hidden = states.new_zeros(num_rows, completion_width, states.shape[-1])
            hidden = hidden.index_copy(0, index, states)
        last.last_hidden_state = hidden
        return last

    captured: list[torch.Tensor] = []
    handle = head.register_forward_hook(lambda module, args, output: captured.append(output))
    body.forward = two_passes
    try:
        outputs = model(
            input_ids=inputs["completion_ids"], attention_mask=inputs["completion_mask"], use_cache=False,
            **forward_kwargs,
        )
    finally:
        handle.remove()
        if shadowed:
            body.forward = original
        else:
            del body.forward
    logits = captured[-1]  # (M, C, num_labels)
    if "score_index" in inputs:  # (row, column) per score, in the caller's order
        index = inputs["score_index"].to(logits.device)
        at_last = logits[index[:, 0], index[:, 1]]
    else:
        rows = torch.arange(logits.shape[0], device=logits.device)
        at_last = logits[rows, inputs["last_index"].to(logits.device)]
    return (at_last if label_index is None else at_last[:, label_index]), outputs


@dataclass
class DataCollatorForSharedContext(DataCollatorForSharedPrefix):
    """Collate rank records for the shared-context (KV cache) path of `RankedRewardTrainer`.

    Each record's completions share its longest common token prefix (the rendered context), encoded once; the batch
    holds the tensors of `collate_shared_context`, `score_index` `(C, 2)` (completion row, column of its last token;
    completions in record order), `ranks`, `record_index` (and `margin`) as in `DataCollatorForRankedPreference`.
    Records never attend to each other, so there is nothing to pack: `pack_max_tokens` is ignored; the contexts of
    a batch are one padded forward, the completions another.

    Args:
        pad_token_id: Token id used for padding.
        pad_to_multiple_of: If set, pad both lengths to a multiple of this value (one pass each).
        split_passes: Run contexts (and completions) of similar lengths in separate passes (`plan_passes`: little
            padding). Off under DeepSpeed ZeRO-3, where every rank must run the same number of layer calls.
    """

    split_passes: bool = True

    def torch_call(self, examples: list[dict[str, Any]]) -> dict[str, Any]:
        groups, prefixes = [], []
        for example in examples:
            group = example["completion_ids"]
            p = shared_prefix_length(group)
            if p >= 1:
                groups.append(group)
                prefixes.append(p)
                continue
            # Completions that share no token: one group each, all but the last token as context (a single-token
            # completion gets an empty context). Exact either way.
            for seq in group:
                groups.append([seq])
                prefixes.append(len(seq) - 1)
        output = collate_shared_context(groups, prefixes, self.pad_token_id)
        if self.pad_to_multiple_of:
            output = _pad_to_multiple(output, self.pad_to_multiple_of, self.pad_token_id)
        elif self.split_passes:  # contexts (and completions) of similar lengths in one pass each: little padding
            output["prefix_chunks"] = plan_passes(prefixes)
            output["completion_chunks"] = plan_passes(output["completion_mask"].sum(1).tolist())
        rows = torch.arange(output["completion_ids"].shape[0])
        output["score_index"] = torch.stack([rows, output.pop("last_index")], dim=1)
        output["ranks"] = torch.tensor([r for example in examples for r in example["ranks"]], dtype=torch.long)
        output["record_index"] = torch.tensor(
            [i for i, example in enumerate(examples) for _ in example["completion_ids"]], dtype=torch.long
        )
        if "margin" in examples[0]:
            output["margin"] = torch.tensor([example["margin"] for example in examples], dtype=torch.float)
        return output


_PAIRS_COLLATOR: list[type] = []


def shared_context_collator(
    pad_token_id: int, pad_to_multiple_of: int | None = None, split_passes: bool = True
) -> DataCollatorForSharedContext:
    """`DataCollatorForSharedContext` that also takes TRL pair examples (`chosen_ids`/`rejected_ids`), as the
    trainer's `DataCollatorForSharedPrefixPairs` does for block-mask rows (a batch of pairs comes out in TRL's pair
    layout: `score_index` every chosen, then every rejected, no `ranks`)."""
    if not _PAIRS_COLLATOR:
        from ..trainer.collator import DataCollatorForSharedPrefixPairs  # here: the trainer imports this module

        _PAIRS_COLLATOR.append(
            type("DataCollatorForSharedContextPairs", (DataCollatorForSharedPrefixPairs, DataCollatorForSharedContext), {})
        )
    collator = _PAIRS_COLLATOR[0](pad_token_id=pad_token_id, pad_to_multiple_of=pad_to_multiple_of)
    collator.split_passes = split_passes
    return collator


def _pad_to_multiple(batch: dict[str, torch.Tensor], multiple: int, pad_token_id: int) -> dict[str, torch.Tensor]:
    def grow(t: torch.Tensor, value: int) -> torch.Tensor:
        extra = -t.shape[1] % multiple
        return torch.nn.functional.pad(t, (0, extra), value=value) if extra else t

    batch["prefix_ids"] = grow(batch["prefix_ids"], pad_token_id)
    batch["prefix_mask"] = grow(batch["prefix_mask"], 0)
    positions = batch["completion_positions"]
    batch["completion_ids"] = grow(batch["completion_ids"], pad_token_id)
    batch["completion_mask"] = grow(batch["completion_mask"], 0)
    extra = batch["completion_ids"].shape[1] - positions.shape[1]
    if extra:
        tail = positions[:, -1:] + torch.arange(1, extra + 1)[None]
        batch["completion_positions"] = torch.cat([positions, tail], dim=1)
    return batch


__all__ = [
    "DataCollatorForSharedContext",
    "DataCollatorForSharedPrefix",
    "KV_ATTENTION",
    "collate_shared_context",
    "shared_context_collator",
    "kv_sharing_unsupported",
    "plan_passes",
    "shared_context_scores",
    "SUPPORTED_ATTENTION",
    "find_score_head",
    "plan_rows",
    "record_row",
    "shared_prefix_length",
    "shared_prefix_mask",
    "shared_prefix_scores",
]
