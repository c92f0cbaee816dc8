"""Prefix sharing: the context shared by several completions goes through the model once, with the same scores,
losses and gradients as scoring each completion alone (to float rounding).

- `model_support.py`: whether it can run for a model (`prefix_sharing="auto" | True | False | "packed"`), for training and
  scoring;
- `packed.py`: the packed layout (the GPU's default): one padding-free row per micro-batch, contexts once, one
  attention call per layer;
- `planning.py`: which items share a context, the cost model, forward passes of bounded size;
- `kv.py`: the KV-cache layout (the CPU's default): contexts once with a cache, completions against it;
- `mask.py`: block-mask rows (the training fallback under activation checkpointing or FSDP);
- `layouts.py`: each layout as one object (`PLAIN`, `PACKED`, `KV_CACHE`, `BLOCK_MASK`) owning its collation, its
  attention context and its forward in training, and its planning and passes in scoring; `training_layout` (and
  `scoring_layout`) chooses one.

The collators (one per layout, each naming its layout) are in `trl_rm_env.trainer.collator`.
"""

from .kv import collate_shared_context, shared_context_scores
from .layouts import (
    BLOCK_MASK,
    KV_CACHE,
    NO_SHARING,
    PACKED,
    PLAIN,
    Layout,
    ScoringSharing,
    scoring_layout,
    scoring_sharing,
    training_layout,
)
from .mask import plan_rows, record_row, shared_prefix_mask, shared_prefix_scores
from .model_support import (
    KV_ATTENTION,
    SUPPORTED_ATTENTION,
    find_score_head,
    kv_sharing_unsupported,
    packed_unsupported,
    scoring_mode,
)
from .packed import PACKED_ATTENTION, PackedAttention, pack_groups, packed_attention, packed_scores
from .planning import (
    AUTO_MIN_SAVING,
    plan_passes,
    share_plan,
    shared_prefix_length,
    shared_prefixes_in,
    sharing_saves,
)

__all__ = [
    "AUTO_MIN_SAVING",
    "BLOCK_MASK",
    "KV_CACHE",
    "Layout",
    "NO_SHARING",
    "ScoringSharing",
    "PACKED",
    "PLAIN",
    "KV_ATTENTION",
    "PACKED_ATTENTION",
    "PackedAttention",
    "SUPPORTED_ATTENTION",
    "collate_shared_context",
    "find_score_head",
    "kv_sharing_unsupported",
    "pack_groups",
    "packed_attention",
    "packed_scores",
    "packed_unsupported",
    "plan_passes",
    "plan_rows",
    "record_row",
    "scoring_layout",
    "scoring_mode",
    "scoring_sharing",
    "share_plan",
    "shared_context_scores",
    "shared_prefix_length",
    "shared_prefixes_in",
    "shared_prefix_mask",
    "shared_prefix_scores",
    "sharing_saves",
    "training_layout",
]
