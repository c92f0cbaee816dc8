"""The prefix-sharing layouts as objects: how a batch of ranked records is laid out (`collate`), which attention it
runs under (`attention`) and how its forward gives one score per completion (`scores`).

One object per layout: `PLAIN` (every completion its own padded row), `PACKED` (one padding-free row per forward,
each context once: `packed.py`), `KV_CACHE` (contexts once with a KV cache, completions against it: `kv.py`) and
`BLOCK_MASK` (context and completions in one row under a block mask: `mask.py`). `training_layout` chooses one for
a trainer, once, from `prefix_sharing`, the model and the device (`scoring_layout`: for a scorer's mode); the trainer,
its collator and the scoring engine hold it and ask it, and nothing outside `sharing/` compares a layout's name.

Training asks a layout to `collate` ranked records and for their `scores`; inference (`HFEngine`) asks it to
`plan_scoring` token sequences into forward passes (`ScoringPass`, sized by `Sizing`) and to `score_pass` each. Every
layout gives the scores the plain model gives each completion alone (fp32: within 1e-4, tested).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

import torch

from .kv import collate_shared_context, pad_to_multiple, shared_context_scores
from .mask import plan_rows, record_row, shared_prefix_scores
from .model_support import (
    SUPPORTED_ATTENTION,
    classifier,
    find_score_head,
    kv_sharing_unsupported,
    on_accelerator,
    packed_choice,
    scoring_mode,
)
from .packed import device_token_budget, pack_groups, packed_attention, packed_scores
from .planning import greedy_batches, padded_batches, plan_packed_rows, plan_passes, share_plan, shared_prefix_length

logger = logging.getLogger(__name__)

Examples = Sequence[dict[str, Any]]
Sequences = Sequence[Sequence[int]]


@dataclass(frozen=True)
class Sizing:
    """How big an inference call's forward passes may be (from the engine's `ScoringOptions`).

    Attributes:
        rows: Sequences per padded pass (None: the token budget alone).
        tokens: Tokens per pass, padding included (None: no budget; the packed layout sizes its rows from the
            device, `device_token_budget`).
        row_sequences: Sequences per packed row (None: no limit).
        always_share: Whether every group of two or more sharing a context is scored against it (`prefix_sharing`
            forced on), rather than where the cost model says it pays.
        cost_ratio: The cost model's linear-to-attention ratio (`linear_to_attention_cost`).
    """

    rows: int | None
    tokens: int | None
    row_sequences: int | None
    always_share: bool
    cost_ratio: float


@dataclass(frozen=True)
class ScoringPass:
    """One forward pass of an inference call: the layout that runs it, the items (indices into the call's
    sequences) in the order its outputs come, and the layout's own plan of it (a KV pass's groups, a packed row's
    units; None for a padded pass)."""

    layout: Layout
    items: list[int]
    plan: Any = None

    def run(self, model: torch.nn.Module, sequences: Sequences, pad_token_id: int, sizing: Sizing) -> torch.Tensor:
        """`(len(items), num_labels)` outputs of this pass (on the model's device)."""
        return self.layout.score_pass(model, self, sequences, pad_token_id, sizing)


class Layout:
    """The plain layout, and the base of the others: every completion its own right-padded row (`input_ids`,
    `attention_mask` `(C, L)`), one forward over them.

    Attributes:
        name: The layout's name in logs (`plain`, `packed`, `kv`, `mask`).
        shares_contexts: Whether each record's context goes through the model once.
        cuts_chunks: Whether `pack_max_tokens` cuts a batch into chunks of consecutive records, a forward each
            (the packed and KV layouts; the block-mask rows read it as their row length instead).
        sized_from_memory: Whether an unset `pack_max_tokens` is sized from the GPU's free memory (packed).
        packs_windows: Whether `window_packing="auto"` lays out a gradient accumulation window's micro-batches
            together (packed: its forwards are launch-bound when small; `trl_rm_env.trainer.windows`).
    """

    name = "plain"
    shares_contexts = False
    cuts_chunks = False
    sized_from_memory = False
    packs_windows = False

    def __repr__(self) -> str:
        return f"<{self.name} layout>"

    def attention(self, model: torch.nn.Module) -> AbstractContextManager:
        """The attention a batch of this layout runs under, forward and backward (a context manager)."""
        return contextlib.nullcontext()

    def collate(self, examples: Examples, settings: Any) -> dict[str, torch.Tensor]:
        """The tokens of ranked `examples` (`completion_ids`) in this layout; `settings` is the collator
        (`pad_token_id`, `pad_to_multiple_of`, and the layout's own: `pack_max_tokens`, `split_passes`)."""
        input_ids = [torch.tensor(ids) for example in examples for ids in example["completion_ids"]]
        return right_padded(input_ids, settings.pad_token_id, settings.pad_to_multiple_of)

    def scores(
        self, model: torch.nn.Module, batch: dict[str, Any], heads: int = 1
    ) -> tuple[torch.Tensor, Any, torch.Tensor]:
        """`(scores, outputs, token_count)` of one forward's batch: one score per completion in the batch's order
        (`(C,)`; `(C, heads)` with several score heads, an ensemble's), the model's outputs and the real tokens
        through it."""
        outputs = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], use_cache=False)
        return _columns(outputs.logits, heads), outputs, batch["attention_mask"].sum()

    def plan_scoring(
        self, model: torch.nn.Module, sequences: Sequences, context_lengths: Sequence[int] | None, sizing: Sizing
    ) -> list[ScoringPass]:
        """The forward passes that score `sequences` (`context_lengths`: how many leading tokens of each are its
        context, for the layouts that share one; None: none shared). Plain: padded micro-batches, longest first,
        within `sizing.rows` rows and `sizing.tokens` padded tokens. The block-mask layout is a training layout and
        scores plainly too."""
        batches = padded_batches([len(s) for s in sequences], sizing.rows, sizing.tokens)
        return [ScoringPass(PLAIN, batch) for batch in batches]

    def pass_bounds(self, model: torch.nn.Module, sizing: Sizing) -> tuple[int | None, int | None]:
        """`(tokens, sequences)`: what one scoring pass of this layout holds at most (None: unbounded), the size of
        the waves an overlapped scoring call encodes ahead (`trl_rm_env.scoring.overlap`)."""
        return sizing.tokens, sizing.rows

    def score_pass(
        self, model: torch.nn.Module, scoring_pass: ScoringPass, sequences: Sequences, pad_token_id: int, sizing: Sizing
    ) -> torch.Tensor:
        """`(rows, num_labels)` outputs of one pass this layout planned: right padding with an attention mask leaves
        every real token's computation unchanged, and the classifier reads the last non-pad token."""
        device = next(model.parameters()).device
        batch = right_padded([torch.as_tensor(sequences[i], dtype=torch.long) for i in scoring_pass.items], pad_token_id,
                             None)  # fmt: skip
        return model(input_ids=batch["input_ids"].to(device), attention_mask=batch["attention_mask"].to(device),
                     use_cache=False).logits  # fmt: skip


def _columns(logits: torch.Tensor, heads: int) -> torch.Tensor:
    """The score of each row `(C,)`, or every head's `(C, heads)`."""
    return logits[:, 0] if heads == 1 else logits[:, :heads]


def right_padded(input_ids: list[torch.Tensor], pad_token_id: int, multiple: int | None) -> dict[str, torch.Tensor]:
    """`input_ids` and `attention_mask` `(N, L)`, right-padded (`L` a multiple of `multiple` when set)."""
    length = max(len(ids) for ids in input_ids)
    if multiple:
        length = -(-length // multiple) * multiple
    padded = torch.full((len(input_ids), length), pad_token_id, dtype=input_ids[0].dtype)
    mask = torch.zeros((len(input_ids), length), dtype=torch.long)
    for row, ids in enumerate(input_ids):
        padded[row, : len(ids)] = ids
        mask[row, : len(ids)] = 1
    return {"input_ids": padded, "attention_mask": mask}


class PackedLayout(Layout):
    """The whole batch in ONE padding-free row (`input_ids`, `position_ids` `(1, T)`, `packed`: the
    `PackedAttention` layout, `num_tokens`): each record's context once, then each completion's own tokens,
    positions restarting after the context; one attention call per layer (`trl_rm_env.sharing.packed`)."""

    name = "packed"
    shares_contexts = cuts_chunks = sized_from_memory = packs_windows = True

    def attention(self, model: torch.nn.Module) -> AbstractContextManager:
        return packed_attention(model)

    def collate(self, examples: Examples, settings: Any) -> dict[str, torch.Tensor]:
        groups = [example["completion_ids"] for example in examples]
        prefixes = [shared_prefix_length(group) for group in groups]
        output = pack_groups(groups, prefixes, settings.pad_token_id, settings.pad_to_multiple_of)
        last = output.pop("last_index")
        output["score_index"] = torch.stack([torch.zeros_like(last), last], dim=1)
        return output

    def scores(
        self, model: torch.nn.Module, batch: dict[str, Any], heads: int = 1
    ) -> tuple[torch.Tensor, Any, torch.Tensor]:
        token_count = torch.tensor(batch.pop("num_tokens"), device=batch["input_ids"].device)
        scores, outputs = packed_scores(model, batch, label_index=0 if heads == 1 else None)
        return _columns(scores, heads) if heads > 1 else scores, outputs, token_count

    def plan_scoring(
        self, model: torch.nn.Module, sequences: Sequences, context_lengths: Sequence[int] | None, sizing: Sizing
    ) -> list[ScoringPass]:
        """One packed row per pass: every group sharing a context (all of them: with nothing padded, sharing never
        costs more) with its context once, the other items whole; rows of `sizing.tokens` tokens (default: sized
        from the device) and at most `sizing.row_sequences` sequences."""
        if not sequences:
            return []
        if context_lengths is None:
            groups, plain = [], list(range(len(sequences)))
        else:
            groups, plain = share_plan(sequences, context_lengths, True, sizing.cost_ratio)
        units = [(p, members) for p, members in groups] + [(0, [i]) for i in plain]
        budget = sizing.tokens or device_token_budget(model)
        rows = plan_packed_rows(units, [len(s) for s in sequences], budget, sizing.row_sequences)
        return [ScoringPass(self, [i for _, items in row for i in items], row) for row in rows]

    def pass_bounds(self, model: torch.nn.Module, sizing: Sizing) -> tuple[int | None, int | None]:
        return sizing.tokens or device_token_budget(model), sizing.row_sequences

    def score_pass(
        self, model: torch.nn.Module, scoring_pass: ScoringPass, sequences: Sequences, pad_token_id: int, sizing: Sizing
    ) -> torch.Tensor:
        row = scoring_pass.plan
        batch = pack_groups([[sequences[i] for i in items] for _, items in row], [p for p, _ in row], pad_token_id)
        device = next(model.parameters()).device
        if device.type == "cuda":  # pinned, copied without blocking this thread (the row's layout included)
            batch = {k: v.pin_memory() if torch.is_tensor(v) or k == "packed" else v for k, v in batch.items()}
        batch = {k: (v.to(device, non_blocking=True) if torch.is_tensor(v) else v) for k, v in batch.items()}
        return packed_scores(model, batch, label_index=None)[0]


class KVCacheLayout(Layout):
    """Each record's context once, one padded forward for the contexts with a KV cache and one for the completions
    against it (`trl_rm_env.sharing.kv`); contexts (and completions) of similar lengths in separate passes unless
    `split_passes` is off (DeepSpeed ZeRO-3: every rank must run the same layer calls)."""

    name = "kv"
    shares_contexts = cuts_chunks = True

    def collate(self, examples: Examples, settings: Any) -> dict[str, torch.Tensor]:
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
        output = collate_shared_context(groups, prefixes, settings.pad_token_id)
        if settings.pad_to_multiple_of:
            output = pad_to_multiple(output, settings.pad_to_multiple_of, settings.pad_token_id)
        elif settings.split_passes:  # contexts (and completions) of similar lengths in one pass each: little padding
            output["prefix_chunks"] = plan_passes(prefixes)
            output["completion_chunks"] = plan_passes(output["completion_mask"].sum(1).tolist())
        rows = torch.arange(output["completion_ids"].shape[0])
        output["score_index"] = torch.stack([rows, output.pop("last_index")], dim=1)
        return output

    def scores(
        self, model: torch.nn.Module, batch: dict[str, Any], heads: int = 1
    ) -> tuple[torch.Tensor, Any, torch.Tensor]:
        scores, outputs = shared_context_scores(model, batch, label_index=0 if heads == 1 else None)
        return _columns(scores, heads) if heads > 1 else scores, outputs, batch["prefix_mask"].sum() + batch[
            "completion_mask"].sum()

    def plan_scoring(
        self, model: torch.nn.Module, sequences: Sequences, context_lengths: Sequence[int] | None, sizing: Sizing
    ) -> list[ScoringPass]:
        """The groups sharing a context where it pays (`share_plan`; all of them when `sizing.always_share`), in
        passes of whole groups against their contexts' KV cache; the other items in plain padded passes."""
        if context_lengths is None:
            return PLAIN.plan_scoring(model, sequences, None, sizing)
        groups, plain = share_plan(sequences, context_lengths, sizing.always_share, sizing.cost_ratio)
        passes = [ScoringPass(PLAIN, [plain[j] for j in p.items])
                  for p in PLAIN.plan_scoring(model, [sequences[i] for i in plain], None, sizing)]  # fmt: skip
        for batch in self._group_batches(groups, sequences, sizing):
            chosen = [groups[g] for g in batch]
            passes.append(ScoringPass(self, [i for _, members in chosen for i in members], chosen))
        return passes

    def score_pass(
        self, model: torch.nn.Module, scoring_pass: ScoringPass, sequences: Sequences, pad_token_id: int, sizing: Sizing
    ) -> torch.Tensor:
        chosen = scoring_pass.plan
        prefix_lengths = [p for p, _ in chosen]
        inputs = collate_shared_context([[sequences[i] for i in members] for _, members in chosen], prefix_lengths,
                                        pad_token_id)  # fmt: skip
        inputs["prefix_chunks"] = plan_passes(prefix_lengths, sizing.rows, sizing.tokens)
        context_of = [prefix_lengths[g] for g in inputs["group_index"].tolist()]
        inputs["completion_chunks"] = plan_passes(inputs["completion_mask"].sum(1).tolist(), sizing.rows,
                                                  sizing.tokens, context_of)  # fmt: skip
        device = next(model.parameters()).device
        inputs = {k: (v.to(device) if torch.is_tensor(v) else v) for k, v in inputs.items()}
        return shared_context_scores(model, inputs, label_index=None)[0]

    @staticmethod
    def _group_batches(groups: list[tuple[int, list[int]]], sequences: Sequences, sizing: Sizing) -> list[list[int]]:
        """Batches of groups for the context pass: longest context first, at most `sizing.rows` contexts and
        `sizing.tokens` padded context tokens, and every completion row able to fit the budget with the batch's
        longest context (`rows x (context + completion)`)."""
        order = sorted(range(len(groups)), key=lambda g: -groups[g][0])
        budget = sizing.tokens

        def fits(current: list[int], g: int) -> bool:  # longest context first: the batch's longest is its first
            prefix = groups[current[0]][0]
            longest_own = max(len(sequences[i]) - groups[g][0] for i in groups[g][1])
            return budget is None or ((len(current) + 1) * prefix <= budget and prefix + longest_own <= budget)

        return greedy_batches(order, fits, sizing.rows)


class BlockMaskLayout(Layout):
    """Each record's context and completions in one row under a block mask (`record_ids`, `segment_ids`), several
    records to a row of up to `pack_max_tokens` (`trl_rm_env.sharing.mask`): the training fallback of
    `prefix_sharing=True` where the KV layout cannot run (activation checkpointing, FSDP); eager or SDPA attention."""

    name = "mask"
    shares_contexts = True

    def collate(self, examples: Examples, settings: Any) -> dict[str, torch.Tensor]:
        built = [record_row(example["completion_ids"], pad_token_id=settings.pad_token_id) for example in examples]
        rows = plan_rows([len(b[0]) for b in built], settings.pack_max_tokens)
        row_len = max(sum(len(built[i][0]) for i in row) for row in rows)
        if settings.pad_to_multiple_of:
            row_len = -(-row_len // settings.pad_to_multiple_of) * settings.pad_to_multiple_of
        shape = (len(rows), row_len)
        input_ids = torch.full(shape, settings.pad_token_id, dtype=torch.long)
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
        score_index = [(where[i][0], where[i][1] + offset) for i in range(len(examples)) for offset in built[i][3]]
        return {
            "input_ids": input_ids,
            "position_ids": position_ids,
            "record_ids": record_ids,
            "segment_ids": segment_ids,
            "score_index": torch.tensor(score_index, dtype=torch.long),
        }

    def scores(
        self, model: torch.nn.Module, batch: dict[str, Any], heads: int = 1
    ) -> tuple[torch.Tensor, Any, torch.Tensor]:
        dtype = next(p for p in model.parameters() if p.is_floating_point()).dtype
        if dtype not in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
            dtype = torch.float32
        scores, outputs = shared_prefix_scores(model, batch, dtype, label_index=0 if heads == 1 else None)
        return _columns(scores, heads) if heads > 1 else scores, outputs, (batch["record_ids"] >= 0).sum()


PLAIN, PACKED, KV_CACHE, BLOCK_MASK = Layout(), PackedLayout(), KVCacheLayout(), BlockMaskLayout()
"""The four layouts, one object each."""


def training_layout(
    model: torch.nn.Module, mode: bool | str, *, activation_checkpointing: bool, fsdp: bool, plain_reason: str | None,
    accelerator: bool | None = None,
) -> Layout:
    """The layout a trainer runs (`trl_rm_env.sharing.layouts`): `PACKED` (each micro-batch one padding-free row:
    `"packed"`, or `"auto"`/`True` on an accelerator), `KV_CACHE` (the contexts once with a KV cache, the completions
    against it), `BLOCK_MASK` (block-mask rows: eager/SDPA, only with `mode=True` where the KV path cannot run) or
    `PLAIN`. `plain_reason`: why `"auto"` must keep TRL's batch layout (a subclass's `compute_loss` reads it), or
    None. `accelerator`: whether training runs where the packed layout is fast (`packs_fast` of the training device
    and compute dtype; None: where the model's weights are). Logged once."""
    if not mode:
        return PLAIN
    if mode == "auto" and plain_reason:
        logger.info("prefix_sharing='auto': %s; using the plain batch layout.", plain_reason)
        return PLAIN
    fast = on_accelerator(model) if accelerator is None else accelerator
    packed = packed_choice(model, mode, fast, "using the plain path")
    if packed is not None:
        return PACKED if packed else PLAIN
    reason = kv_sharing_unsupported(model, training=True)
    if reason is None and activation_checkpointing:
        reason = "activation checkpointing drops the KV cache"
    if reason is None and fsdp:
        reason = "FSDP reshards each layer between the context and completion passes, before backward"
    if reason is None:
        logger.info("prefix_sharing=%r: each record's context runs once, its completions against its KV cache.", mode)
        return KV_CACHE
    log = logger.warning if mode is True else logger.info
    attention = getattr(classifier(model).config if classifier(model) else None, "_attn_implementation", None)
    if mode is True and attention in SUPPORTED_ATTENTION and find_score_head(model) is not None:
        log("prefix_sharing=True: %s; using block-mask rows (their attention grows with the square of the row).",
            reason)
        return BLOCK_MASK
    log("prefix_sharing=%r: %s; using the plain path.", mode, reason)
    return PLAIN


def scoring_layout(mode: bool | str) -> Layout:
    """The layout a scorer's mode (`scoring_mode`) runs: `PACKED` (one padding-free row per micro-batch),
    `KV_CACHE` (groups sharing a context scored against its KV cache, where the mode and the cost model say so) or
    `PLAIN`."""
    if mode == "packed":
        return PACKED
    return KV_CACHE if mode else PLAIN


@dataclass(frozen=True)
class ScoringSharing:
    """How a scoring engine shares prefixes, resolved once for its model (`scoring_sharing`) and read on every call.

    Args:
        mode: The mode that runs: `False` (each sequence alone), `"auto"` (a group against its context's KV cache
            where the cost model says it pays), `True` (every group against it) or `"packed"`.
        layout: The layout that plans and runs the forward passes (`PLAIN`, `KV_CACHE` or `PACKED`).
        always: Whether every group of two or more sharing a context is scored against it, whatever the cost model
            says (`True`, `"packed"`).
    """

    mode: bool | str
    layout: Layout
    always: bool


NO_SHARING = ScoringSharing(False, PLAIN, False)
"""Each sequence scored alone (a judge's prompts, which are its own; `prefix_sharing=False`)."""


def scoring_sharing(model: torch.nn.Module, mode: bool | str) -> ScoringSharing:
    """A scoring engine's sharing for `model`, from the mode its plan asks for (`ModelPlan.prefix_sharing`):
    `scoring_mode` (packed on an accelerator, off where the model cannot share, logged once), its layout, and
    whether it shares whatever the cost model says."""
    resolved = scoring_mode(model, mode) if mode is not False else False
    if resolved is False:
        return NO_SHARING
    return ScoringSharing(resolved, scoring_layout(resolved), resolved is True or resolved == "packed")
