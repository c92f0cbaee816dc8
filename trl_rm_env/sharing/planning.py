"""Planning shared scoring: which items share a context, whether it pays (the cost model), and how rows are cut
into forward passes (padded micro-batches, the KV passes, packed rows: `plan_packed_rows`).

Cost of a forward over `n` query tokens against `k` keys, in attention-pair units: `n * ratio + n * k`, with
`ratio` the FLOPs per token of a layer's projections and MLP over its FLOPs per (query, key) pair of attention
(`linear_to_attention_cost`, from the model config). Plain: each item `(P + c)` tokens against themselves; shared:
the context once, then each completion's `c` tokens against `P + c` keys. `"auto"` shares a group when that saves at
least `AUTO_MIN_SAVING` of its plain cost.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from ..tokenization import common_prefix_length

AUTO_MIN_SAVING = 0.1
"""`"auto"` shares a group when the cost model saves at least this fraction of its plain cost."""

MAX_FOUND_GROUP = 64
"""Most sequences in one group that `shared_prefixes_in` forms (a larger set sharing a prefix becomes several groups,
each encoding the prefix once): it bounds the search to `MAX_FOUND_GROUP` steps per sequence."""


def shared_prefix_length(sequences: Sequence[Sequence[int]]) -> int:
    """Longest prefix shared by every sequence, capped so each sequence keeps at least one token of its own."""
    first = sequences[0]
    n = min(len(s) for s in sequences) - 1
    for seq in sequences[1:]:
        n = min(n, common_prefix_length(first, seq))
    return max(n, 0)


def record_tokens(sequences: Sequence[Sequence[int]]) -> int:
    """The tokens a shared layout runs for one record: its shared context once, then each sequence's own tokens."""
    p = shared_prefix_length(sequences)
    return p + sum(len(s) - p for s in sequences)


def contiguous_runs(sizes: Sequence[int], budget: int) -> list[tuple[int, int]]:
    """`[start, end)` runs of consecutive items whose sizes add up to at most `budget` each (an item over it alone
    gets a run of its own), greedily, in order."""
    runs: list[tuple[int, int]] = []
    start, total = 0, 0
    for i, size in enumerate(sizes):
        if i > start and total + size > budget:
            runs.append((start, i))
            start, total = i, 0
        total += size
    if sizes:
        runs.append((start, len(sizes)))
    return runs


def pooled_index(sequence: Sequence[int], pad_token_id: int | None) -> int:
    """Where transformers' `*ForSequenceClassification` reads a sequence's score: its last token that is not the
    padding id (so a trailing EOS that is also the padding id is skipped), the first token when every one is."""
    for j in range(len(sequence) - 1, -1, -1):
        if sequence[j] != pad_token_id:
            return j
    return 0


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


def greedy_batches(
    order: Sequence[int], fits: Callable[[list[int], int], bool], max_rows: int | None
) -> list[list[int]]:
    """Cut `order` into batches: a batch takes the next index while it has fewer than `max_rows` and
    `fits(batch, index)`; an index that does not fit starts a new batch (alone, it always gets one)."""
    batches: list[list[int]] = []
    current: list[int] = []
    for i in order:
        full = max_rows is not None and len(current) + 1 > max_rows
        if current and (full or not fits(current, i)):
            batches.append(current)
            current = []
        current.append(i)
    if current:
        batches.append(current)
    return batches


def padded_batches(lengths: Sequence[int], max_rows: int | None, max_tokens: int | None) -> list[list[int]]:
    """Item indices in padded micro-batches, longest first: at most `max_rows` rows and `max_tokens` tokens, padding
    included, per batch (an item longer than the budget gets a batch of its own). The one token-budget batching of
    every padded forward: reward models and judges (`HFEngine`)."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])

    def fits(current: list[int], i: int) -> bool:  # longest first: the batch's longest is its first
        return max_tokens is None or (len(current) + 1) * lengths[current[0]] <= max_tokens

    return greedy_batches(order, fits, max_rows)


def linear_to_attention_cost(config: Any) -> float:
    """FLOPs per token in a decoder layer's projections over FLOPs per (query, key) pair of its attention.

    From the config of a standard decoder (`hidden_size`, `intermediate_size`, heads, `head_dim`; gated MLP);
    infinity (always share) when the config does not say.
    """
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


def sharing_saves(prefix: int, completions: Sequence[int], ratio: float) -> float:
    """The fraction of a group's plain scoring FLOPs that scoring against its shared context saves (module
    docstring), for a context of `prefix` tokens, completions of `completions` tokens and the model's `ratio`."""
    if math.isinf(ratio) or not completions:
        return 1.0 if len(completions) > 1 else 0.0
    plain = sum((prefix + c) * ratio + (prefix + c) ** 2 for c in completions)
    shared = prefix * ratio + prefix**2 + sum(c * ratio + c * (prefix + c) for c in completions)
    return 1.0 - shared / plain


def shared_prefixes_in(sequences: Sequence[Sequence[int]], ratio: float, always: bool = False) -> list[int]:
    """Context lengths for token ids that came without them (a server's token-id requests): for each sequence, how
    many leading tokens it shares with the other members of its group, 0 for a sequence in no group.

    Sequences are sorted by their tokens, so those sharing a prefix are neighbours; the groups are the runs of
    neighbours whose shared prefix (the smallest neighbour overlap in the run, each keeping one token of its own)
    saves the most by the cost model (module docstring), found by dynamic programming over the sorted order (runs of
    at most `MAX_FOUND_GROUP`).
    A run is a candidate when it saves at least `AUTO_MIN_SAVING` of its plain cost (any saving with `always`).
    `share_plan` given these lengths scores each group against its prefix; every score stays exact whatever the
    grouping.
    """
    n = len(sequences)
    order = sorted(range(n), key=lambda i: tuple(sequences[i]))
    overlap = [common_prefix_length(sequences[a], sequences[b]) for a, b in zip(order, order[1:])]
    lengths = [len(sequences[i]) for i in order]
    linear = 1.0 if math.isinf(ratio) else ratio
    quadratic = 0.0 if math.isinf(ratio) else 1.0
    # best[k]: the largest saving over the first k sorted sequences; cut[k]: where the last run of those starts.
    best = [0.0] * (n + 1)
    cut = list(range(n + 1))
    for end in range(1, n + 1):
        best[end], cut[end] = best[end - 1], end - 1  # sequence end-1 alone
        prefix = lengths[end - 1] - 1
        total = square = 0
        for start in range(end - 1, max(end - MAX_FOUND_GROUP, 0) - 1, -1):  # the run order[start:end]
            total += lengths[start]
            square += lengths[start] ** 2
            prefix = min(prefix, lengths[start] - 1)
            if start < end - 1:
                prefix = min(prefix, overlap[start])
            if prefix < 1:
                break
            members = end - start
            if members < 2:
                continue
            # plain: sum(L*r + L^2); shared: p*r + p^2 + sum((L-p)*r + (L-p)*L)  (module docstring's cost)
            plain = total * linear + square * quadratic
            saving = (members - 1) * prefix * linear + (prefix * total - prefix**2) * quadratic
            if (always or saving >= AUTO_MIN_SAVING * plain) and best[start] + saving > best[end]:
                best[end], cut[end] = best[start] + saving, start
    context_lengths = [0] * n
    end = n
    while end > 0:
        start = cut[end]
        if end - start > 1:
            prefix = min(min(lengths[start:end]) - 1, min(overlap[start : end - 1]))
            for k in range(start, end):
                context_lengths[order[k]] = prefix
        end = start
    return context_lengths


def share_plan(
    sequences: Sequence[Sequence[int]], context_lengths: Sequence[int], always: bool, ratio: float
) -> tuple[list[tuple[int, list[int]]], list[int]]:
    """Which items to score against a shared context: `(groups, plain)`, each group `(prefix length, items)`.

    Items are grouped by their first `context_length` tokens (exact token equality); a group's prefix is the longest
    one all its items share (each keeps at least one token of its own). With `always` every group of two or more
    items with a prefix of at least one token is shared; otherwise only those where the cost model
    (`AUTO_MIN_SAVING`) says it pays.
    """
    keyed: dict[tuple[int, ...], list[int]] = {}
    for i, (seq, n) in enumerate(zip(sequences, context_lengths)):
        keyed.setdefault(tuple(seq[:n]), []).append(i)
    groups, plain = [], []
    for members in keyed.values():
        prefix = shared_prefix_length([sequences[i] for i in members]) if len(members) > 1 else 0
        own = [len(sequences[i]) - prefix for i in members]
        if prefix >= 1 and (always or sharing_saves(prefix, own, ratio) >= AUTO_MIN_SAVING):
            groups.append((prefix, sorted(members, key=lambda i: -len(sequences[i]))))
        else:
            plain += members
    return groups, sorted(plain)


def plan_packed_rows(
    units: Sequence[tuple[int, Sequence[int]]], lengths: Sequence[int], budget: int, max_sequences: int | None
) -> list[list[tuple[int, list[int]]]]:
    """Packed rows of `units` (`(context length, items)`: a group, or one item with context 0): each row at most
    `budget` tokens (a context counted once) and `max_sequences` items. A unit that does not fit a row is split,
    each part with its context again; a single item always gets a row. First fit, largest unit first."""
    parts: list[tuple[int, list[int]]] = []
    for p, items in units:
        part: list[int] = []
        for i in sorted(items, key=lambda i: -lengths[i]):
            full = max_sequences is not None and len(part) + 1 > max_sequences
            if part and (full or p + sum(lengths[j] - p for j in part) + lengths[i] - p > budget):
                parts.append((p, part))
                part = []
            part.append(i)
        parts.append((p, part))
    size = [p + sum(lengths[i] - p for i in items) for p, items in parts]
    rows: list[list[tuple[int, list[int]]]] = []
    used: list[tuple[int, int]] = []  # (tokens, items) of each row
    for k in sorted(range(len(parts)), key=lambda k: -size[k]):
        count = len(parts[k][1])
        for r, (tokens, items) in enumerate(used):
            if tokens + size[k] <= budget and (max_sequences is None or items + count <= max_sequences):
                rows[r].append(parts[k])
                used[r] = (tokens + size[k], items + count)
                break
        else:
            rows.append([parts[k]])
            used.append((size[k], count))
    return rows
