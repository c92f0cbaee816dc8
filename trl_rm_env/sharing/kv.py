"""Shared context by KV cache: the default layout of prefix sharing, in training and in scoring.

The contexts of a batch (records, or GRPO groups) go through the model once, right-padded, with `use_cache`; then
every completion runs as its own row against its context's cached keys and values (handed to each row by index, a
view for a single context), with position ids continuing after the context and a 2-D mask over context +
completion; the score is read at each completion's last real token. No mask over a whole row exists, any attention
kernel works (eager, SDPA, FlashAttention-2), and the cost is `P² + N·C·(P + C)` per record. Both passes run inside
ONE call of the (possibly wrapped) model: the forward of the model's decoder body is swapped for the duration of the
call, so DDP, DeepSpeed, FSDP2 and PEFT see a single forward, and backward goes through both passes.

Wang & Hegde (2024), "Accelerating Direct Preference Optimization with Prefix Sharing", for DPO; here for reward
models with N ranked completions (training) and GRPO groups of G completions (scoring). Every score equals the score
of the context and the completion run alone, to float rounding (the tests check 1e-4 in fp32).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from transformers.cache_utils import Cache, DynamicCache, DynamicLayer

from .model_support import cache_argument, classifier, find_score_head, kv_sharing_unsupported
from .planning import pooled_index


def collate_shared_context(
    groups: Sequence[Sequence[Sequence[int]]], prefix_lengths: Sequence[int], pad_token_id: int
) -> dict[str, torch.Tensor]:
    """Tensors of the shared-context path for `groups` of token sequences, group g sharing its first
    `prefix_lengths[g]` tokens; every sequence keeps at least one token after the prefix. A group with no shared
    token (prefix length 0) gets an empty context: its completions run whole, attending to themselves only.

    Returns `prefix_ids`, `prefix_mask` `(B, P)` (right-padded contexts), `completion_ids`, `completion_mask`,
    `completion_positions` `(M, C)` (right-padded completion tokens, positions continuing after their context),
    `group_index` `(M,)` (the context of each completion) and `last_index` `(M,)` (the column its score is read at:
    its last token that is not the padding id, as the model pools), completions in group order.
    """
    if any(p < 0 for p in prefix_lengths):
        raise ValueError("collate_shared_context needs prefix lengths >= 0.")
    suffixes = [list(seq[p:]) for group, p in zip(groups, prefix_lengths) for seq in group]
    if any(not s for s in suffixes):
        raise ValueError("every sequence needs at least one token after its group's shared prefix.")
    # A score is read where the model pools it (its last token that is not the padding id): that token must be a
    # completion's own, so a context is cut before it (a shorter shared prefix is as exact).
    prefix_lengths = [min(p, *(pooled_index(seq, pad_token_id) for seq in group))
                      for group, p in zip(groups, prefix_lengths)]
    suffixes = [list(seq[p:]) for group, p in zip(groups, prefix_lengths) for seq in group]
    last_index = torch.tensor([pooled_index(seq, pad_token_id) - p for group, p in zip(groups, prefix_lengths)
                               for seq in group], dtype=torch.long)
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
        "last_index": last_index,
    }


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
    hf = classifier(model)
    reason = kv_sharing_unsupported(model)
    if reason is not None:
        raise ValueError(f"The shared-context path cannot run this model: {reason}.")
    body = getattr(hf, hf.base_model_prefix)
    cache_name = cache_argument(body)
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


def pad_to_multiple(batch: dict[str, torch.Tensor], multiple: int, pad_token_id: int) -> dict[str, torch.Tensor]:
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
