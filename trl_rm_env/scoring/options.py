"""`ScoringOptions`: how conversations become scores, declared once.

`RewardScorer`, `RewardModelEnvironment`, `load_reward_scorer` and `RewardModelEnvironment.from_config` take these
options by name (`batch_size=...`) and pass them on whole; the command line (`--batch-size`, `--max-tokens`,
`--max-length`) and the GRPO recipe (`reward_batch_size`, ...) map their own spellings onto them in one place each.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..sharing import normalize_prefix_sharing

TRUNCATION_MODES = ("left", "fallback")
ENGINES = ("auto", "vllm", "hf")
DEFAULT_BATCH_SIZE = 32  # sequences per forward pass when neither a row count nor a token budget is set


@dataclass
class ScoringOptions:
    """How a reward model scores `(context, completion)` pairs.

    Args:
        batch_size: At most this many sequences per forward pass (default 32 when `max_tokens_per_batch` is unset).
        max_tokens_per_batch: At most this many tokens per forward pass, padding included (`rows * longest`).
            Items are sorted longest first, so batches of similar length pack tightly.
        max_length: Longest sequence the model gets. Defaults to the model's `max_position_embeddings` (and never
            more than `max_tokens_per_batch`: one sequence always fits in a batch).
        truncation: For a sequence over `max_length`: `"left"` cuts the context from the left (a leading BOS is kept;
            the completion is never cut), `"fallback"` gives it `overlength_reward` instead of a score.
        overlength_reward: The reward for sequences that cannot be scored within `max_length` (with `"left"`, the ones
            whose completion alone is too long). None raises an error instead.
        nonfinite_reward: The reward used when the model returns NaN/inf. None raises an error naming the items.
        strip_reasoning: Remove `<think>...</think>` from completions before scoring.
        label_index: Which output column is the reward (0 for Bradley-Terry models).
        show_progress: Show a progress bar over batches (`None`: only for more than 8 batches).
        template_kwargs: Extra keyword arguments for the chat template (e.g. `enable_thinking`), as NeMo RL's
            `tokenizer.chat_template_kwargs`.
        prefix_sharing: Score the completions that share a context (a GRPO group) against one encoding of it (KV
            cache; see `trl_rm_env.sharing`). `"auto"` (default): where the model supports it, for the groups where a
            cost model says it pays; `True`: every group of two or more items that shares a token; `False`: never.
        output_weights: A regression RM's reward is `outputs @ output_weights` (every output, not column
            `label_index`); see `trl_rm_env.heads.regression_reward_weights`.
        engine: What runs the model: `"vllm"` (vLLM's pooling runner fed with our token ids,
            `trl_rm_env.scoring.vllm`), `"hf"` (transformers in this process, the exact reference and the engine of
            training) or `"auto"` (default: vLLM where it is installed and can serve the case, else transformers;
            see `trl_rm_env.scoring.loading.choose_engine`). Only a model given by path or Hub id can run on vLLM.
        vllm_gpu_memory_utilization: With vLLM, the share of the device's memory it may take for weights and KV
            cache (on the CPU backend, of the RAM), as TRL's colocated vLLM. None (default): a KV cache of what
            scoring needs and no more (`trl_rm_env.scoring.vllm.kv_cache_bytes`), the rest left to training.
        vllm_tensor_parallel_size: With vLLM, the number of GPUs the reward model is split over.

    Raises:
        ValueError: an unknown truncation mode or engine, `batch_size < 1`, a bad `prefix_sharing` value or vLLM
            memory share.
    """

    batch_size: int | None = None
    max_tokens_per_batch: int | None = None
    max_length: int | None = None
    truncation: str = "left"
    overlength_reward: float | None = None
    nonfinite_reward: float | None = None
    strip_reasoning: bool = False
    label_index: int = 0
    show_progress: bool | None = None
    template_kwargs: dict[str, Any] = field(default_factory=dict)
    prefix_sharing: bool | str = "auto"
    output_weights: Sequence[float] | None = None
    engine: str = "auto"
    vllm_gpu_memory_utilization: float | None = None
    vllm_tensor_parallel_size: int = 1

    def __post_init__(self) -> None:
        if self.truncation not in TRUNCATION_MODES:
            raise ValueError(f"truncation must be 'left' or 'fallback', got {self.truncation!r}")
        if self.engine not in ENGINES:
            raise ValueError(f"engine must be one of {ENGINES}, got {self.engine!r}")
        if self.vllm_gpu_memory_utilization is not None and not 0 < self.vllm_gpu_memory_utilization <= 1:
            raise ValueError(f"vllm_gpu_memory_utilization must be in (0, 1], got {self.vllm_gpu_memory_utilization}")
        if self.batch_size is not None and self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")
        self.prefix_sharing = normalize_prefix_sharing(self.prefix_sharing)
        self.template_kwargs = dict(self.template_kwargs or {})

    def rows_per_pass(self) -> int | None:
        """Sequences per forward pass: `batch_size`, else 32 when no token budget is set (None: the budget alone)."""
        if self.batch_size is not None:
            return self.batch_size
        return None if self.max_tokens_per_batch else DEFAULT_BATCH_SIZE

    def longest_sequence(self, config: Any) -> int | None:
        """The longest sequence the model gets: `max_length`, else the config's `max_position_embeddings`, and
        never more than `max_tokens_per_batch` (one sequence always fits in a batch)."""
        longest = self.max_length or getattr(config, "max_position_embeddings", None)
        if self.max_tokens_per_batch is not None and longest is not None and self.max_tokens_per_batch < longest:
            return self.max_tokens_per_batch
        return longest

    @classmethod
    def names(cls) -> tuple[str, ...]:
        """Every option's name."""
        return tuple(f.name for f in dataclasses.fields(cls))

    @classmethod
    def build(cls, options: ScoringOptions | None = None, **values: Any) -> ScoringOptions:
        """`options` (default: the defaults) with `values` replacing some of them.

        Raises:
            TypeError: a name that is not an option, listing the options.
        """
        unknown = sorted(set(values) - set(cls.names()))
        if unknown:
            raise TypeError(f"unknown scoring option(s) {unknown}; the options are {list(cls.names())}")
        return dataclasses.replace(options, **values) if options is not None else cls(**values)

    def overrides(self) -> dict[str, Any]:
        """The options that differ from the defaults, by name (for a log line or a child process)."""
        default = ScoringOptions()
        return {name: value for name in self.names() if (value := getattr(self, name)) != getattr(default, name)}


def split_options(values: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """`(scoring options, everything else)` of keyword arguments."""
    names = set(ScoringOptions.names())
    return {k: v for k, v in values.items() if k in names}, {k: v for k, v in values.items() if k not in names}
