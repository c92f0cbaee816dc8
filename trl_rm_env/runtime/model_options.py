"""How a model we run for rewards loads and runs, each option declared once: `ModelOptions` for any model (a reward
model or a judge), `ScoringOptions` for a reward model (those plus its head's, truncation's and NaN scores').

`RewardScorer`, `RewardModelEnvironment`, `load_reward_scorer`, `trl-rm-env eval` and `serve`, the GRPO recipe and
NeMo RL's block take `ScoringOptions`; `JudgeEnvironment` and its engines take `ModelOptions`; each surface's
spelling (`--max-tokens-per-batch`, `reward_max_tokens_per_batch`, NeMo's `dynamic_batching.logprob_mb_tokens`) is
generated from or mapped onto the field below (`trl_rm_env.options`). The options are immutable: they are resolved once per call path, with the model's
config, its kind and the engine, into a `trl_rm_env.runtime.plan.ModelPlan`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..heads import parse_attribute_weights
from ..options import (
    ENGINES,
    TRUNCATION,
    build,
    changed,
    check_choices,
    document,
    normalize_prefix_sharing,
    normalize_switch,
    option,
    option_fields,
    prefix_sharing_option,
    refuse_renamed,
    spelling,
    switch_option,
)
from ..options import names as option_names
from .engines.registry import check_engine

PRECISIONS = {
    "auto": "auto",
    "fp32": "float32",
    "bf16": "bfloat16",
    "fp16": "float16",
    "float32": "float32",
    "bfloat16": "bfloat16",
    "float16": "float16",
}
"""Precision names (ours, and torch's and NeMo RL's spellings) and the dtype each means, by torch's name (vLLM's
`dtype` takes the same names). `auto`: the checkpoint's dtype on an accelerator, fp32 on the CPU (`load_dtype`)."""
REWARD_MODEL_TYPES = ("bradley_terry", "regression")
DEFAULT_BATCH_SIZE = 32  # sequences per forward pass when neither a row count nor a token budget is set


def json_object(value: Any) -> dict[str, Any]:
    """A dict from a dict or from JSON text (a command line's `'{"enable_thinking": false}'`); None: `{}`.

    Raises:
        ValueError: text that is not a JSON object.
    """
    if value is None:
        return {}
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as err:
            raise ValueError(f"expected a JSON object such as '{{\"enable_thinking\": false}}', got {value!r}") from err
    if not isinstance(value, Mapping):
        raise ValueError(f"expected a JSON object (a mapping), got {value!r}")
    return dict(value)


def attribute_weights(value: Any) -> Mapping[str, float] | list[float] | None:
    """Attribute weights from `name=weight` entries (a command line, a YAML list of strings), a mapping by name, or a
    list of numbers in output order."""
    if value is None or isinstance(value, Mapping):
        return None if value is None else {str(k): float(v) for k, v in value.items()}
    entries = [value] if isinstance(value, str) else list(value)
    if entries and all(isinstance(e, str) for e in entries):
        return parse_attribute_weights(entries, "attribute_weights")
    return [float(e) for e in entries]


@dataclass(frozen=True)
class ModelOptions:
    """How a model we run for rewards (a reward model or a judge) loads and runs: engine, precision, device, batch
    bounds, vLLM's sizes, its chat template's arguments; the `Args` below are generated from the fields.

    Raises:
        ValueError: a value outside an option's choices, `batch_size < 1`, a vLLM memory share outside (0, 1], or a
            bad `prefix_sharing` or `template_kwargs` value.
    """

    batch_size: int | None = option(
        None, help="At most this many sequences per forward pass (default 32 when `max_tokens_per_batch` is unset)."
    )
    max_tokens_per_batch: int | None = option(
        None,
        help="At most this many tokens per forward pass, padding included (rows x longest); items go longest first, so "
        "batches of similar length pack tightly.",
        aliases=("--max-tokens",),
    )
    max_length: int | None = option(
        None,
        help="Longest sequence the model gets (default: the model's `max_position_embeddings`, and never more than "
        "`max_tokens_per_batch`).",
        remote=True,
    )
    overlength_reward: float | None = option(
        None,
        help="The reward of a sequence that cannot be scored within `max_length` (with `left`: its completion alone "
        "is too long). None: an error.",
    )
    strip_reasoning: bool = option(
        False, help="Remove `<think>...</think>` from completions before scoring.", remote=True
    )
    show_progress: bool | None = option(
        None, help="Progress bar over batches (None: only for more than 8 batches).", flag=None, recipe=None
    )
    template_kwargs: dict[str, Any] = option(
        default_factory=dict,
        help="Extra keyword arguments of the RM's chat template, e.g. `{\"enable_thinking\": false}` (JSON on a "
        "command line), as NeMo RL's `tokenizer.chat_template_kwargs`.",
        text=dict,
        remote=True,
    )
    prefix_sharing: bool | str = prefix_sharing_option(
        help="Score the completions that share a context (a GRPO group) against one encoding of it, exactly. "
        "`auto`: on a GPU, every group in one packed padding-free forward per micro-batch; on the CPU, against a KV "
        "cache where a cost model says it pays; `true`: every group; `packed`: the GPU's packed layout on any "
        "device; `false`: never (on vLLM: its prefix caching off).",
        text=str,
    )
    fused_kernels: str | None = switch_option(
        help="Liger Kernel's fused RMSNorm, SwiGLU and RoPE kernels on a model transformers runs (pip install "
        "'trl-rm-env[gpu]'). `auto`: on CUDA where Liger supports the model type; `true`: on, refused where it "
        "cannot apply (the CPU, vLLM, the package missing); `false`: off.",
        text=str,
    )
    engine: str = option(
        "auto",
        choices=ENGINES,
        help="What runs the model: `vllm` (vLLM's pooling runner, fed with our token ids), `hf` (transformers in this "
        "process, the exact reference) or `auto` (vLLM where it is installed and can serve the case, else hf).",
    )
    vllm_gpu_memory_utilization: float | None = option(
        None,
        help="vLLM: the share of the device's memory it may take (CPU backend: of the RAM). None: a KV cache of what "
        "scoring needs, the rest left to training.",
        engine="vllm",
    )
    vllm_tensor_parallel_size: int = option(
        1, help="vLLM: the number of GPUs the model is split over.", flag="--tensor-parallel-size", engine="vllm"
    )
    vllm_enforce_eager: bool = option(
        False,
        help="vLLM: run the model eagerly, without torch.compile or CUDA graphs (vLLM's and TRL's `enforce_eager`): "
        "an engine starts sooner (no compile before its first step) and runs slower.",
        flag="--enforce-eager",
        engine="vllm",
    )
    precision: str = option(
        "auto",
        choices=tuple(PRECISIONS),
        help="Weights dtype of a model loaded here (fp32, bf16, fp16; `auto`: the checkpoint's own dtype on a GPU, as "
        "TRL and transformers load it, fp32 on the CPU); rewards are fp32 whatever it is.",
    )
    device: str | None = option(
        None,
        help="Where transformers runs the model (cpu, cuda:1, ...). None: this Accelerate process's device.",
        recipe=None,
    )
    trust_remote_code: bool = option(False, help="Allow custom model code from the Hub (off: no checkpoint code runs).")
    model_init_kwargs: dict[str, Any] | None = option(
        None,
        help="More `from_pretrained` keyword arguments (JSON on a command line); transformers loading arguments, so "
        "they keep `engine=auto` on transformers.",
        text=dict,
        engine="hf",
    )

    def __post_init__(self) -> None:
        normalize = {
            "prefix_sharing": normalize_prefix_sharing(self.prefix_sharing),
            "fused_kernels": normalize_switch("fused_kernels", self.fused_kernels),
            "template_kwargs": json_object(self.template_kwargs),
            "model_init_kwargs": None if self.model_init_kwargs is None else json_object(self.model_init_kwargs),
        }
        for name, value in normalize.items():
            object.__setattr__(self, name, value)
        refuse_renamed(self)
        # normalized above (a reward model's `overlap_encoding` by `ScoringOptions`), each bad value refused there
        check_choices(self, skip=("prefix_sharing", "fused_kernels", "overlap_encoding", "engine"))
        check_engine(self.engine)  # the built-in engines and any registered one (`runtime.engines.registry`)
        if self.vllm_gpu_memory_utilization is not None and not 0 < self.vllm_gpu_memory_utilization <= 1:
            raise ValueError(f"vllm_gpu_memory_utilization must be in (0, 1], got {self.vllm_gpu_memory_utilization}")
        for name in ("batch_size", "max_tokens_per_batch", "max_length", "vllm_tensor_parallel_size"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")

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
        return option_names(cls)

    @classmethod
    def build(cls, options: ModelOptions | None = None, **values: Any) -> Any:
        """`options` (default: the defaults) with `values` replacing some of them.

        Raises:
            TypeError: a name that is not an option, listing the options.
        """
        return build(cls, options, **values)

    def overrides(self) -> dict[str, Any]:
        """The options that differ from the defaults, by name (for a log line or a child process)."""
        return changed(self)


document(ModelOptions)


VLLM_OWN_OPTIONS = frozenset(f.name for f in option_fields(ModelOptions) if spelling(f).engine == "vllm")
"""The options only vLLM applies (declared `engine="vllm"`: `vllm_gpu_memory_utilization`, ...)."""


@dataclass(frozen=True)
class ScoringOptions(ModelOptions):
    """How a reward model loads and scores `(context, completion)` pairs: every `ModelOptions` option, and its head's
    (`label_index`, `reward_model_type`, `attribute_weights`), `truncation` of over-long contexts and the reward of a
    NaN/inf score; the `Args` below are generated from the fields.

    Raises:
        ValueError: as `ModelOptions`, or a bad `truncation`, `reward_model_type` or `attribute_weights` value.
    """

    overlap_encoding: str | None = switch_option(
        help="Encode a scoring call in waves of one forward pass each, the next wave on a worker thread while the "
        "model runs the current one (same scores). `auto`: where transformers runs the model on CUDA; `true`: also "
        "on the CPU (refused under vLLM); `false`: encode the whole call, then run it.",
        text=str,
    )
    truncation: str = option(
        "left",
        choices=TRUNCATION,
        help="A sequence over `max_length`: `left` cuts its context from the left (a leading BOS is kept, the "
        "completion never cut); `none` cuts nothing and gives it `overlength_reward`.",
    )
    nonfinite_reward: float | None = option(
        None, help="The reward when the model returns NaN/inf. None: an error naming the items.", remote=True
    )
    label_index: int | None = option(
        None,
        help="Which output column is the reward. None: column 0, or for a checkpoint trained with `ensemble_heads` "
        "the mean of its heads (0 then reads head 0 alone).",
    )
    reward_model_type: str | None = option(
        None,
        choices=REWARD_MODEL_TYPES,
        help="The head kind: `bradley_terry` (the reward is output `label_index`, 0 when unset) or `regression` (the "
        "`attribute_weights` sum of the outputs). None: what the checkpoint's config says.",
        recipe="reward_model_type",
    )
    attribute_weights: Mapping[str, float] | Sequence[float] | None = option(
        None,
        help="A regression RM's reward weights: `name=weight` entries or a mapping by name (unnamed attributes "
        "weigh 0), or a list in output order. None: the checkpoint's own `attribute_weights`.",
        text=list,
    )

    def __post_init__(self) -> None:
        object.__setattr__(self, "attribute_weights", attribute_weights(self.attribute_weights))
        object.__setattr__(self, "overlap_encoding", normalize_switch("overlap_encoding", self.overlap_encoding))
        super().__post_init__()

    @classmethod
    def of(cls, options: ModelOptions) -> ScoringOptions:
        """A reward model's options from any model's (the reward model's own at their defaults)."""
        if isinstance(options, ScoringOptions):
            return options
        return cls(**{name: getattr(options, name) for name in ModelOptions.names()})


document(ScoringOptions)
