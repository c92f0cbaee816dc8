"""`RankedRewardConfig` (TRL's `RewardConfig` plus the fields of ranked, N-way reward-model training) and
`RegressionRewardConfig` (one output per attribute)."""

from __future__ import annotations

from dataclasses import dataclass, field

from trl import RewardConfig

from ..data.rows import ON_INVALID_MODES
from ..data.schema import MAX_COMPLETIONS_PER_RECORD
from ..options import (
    TRUNCATION,
    PrefixSharing,
    check_choices,
    normalize_prefix_sharing,
    normalize_switch,
    option,
    prefix_sharing_option,
    refuse_renamed,
    switch_option,
)
from ..sharing.model_support import forces_sharing

TRUNCATION_MODES = TRUNCATION  # training's and scoring's one vocabulary (`trl_rm_env.options.TRUNCATION`)


@dataclass
class RankedRewardConfig(RewardConfig):
    r"""
    Configuration for [`RankedRewardTrainer`]. Everything of TRL's [`RewardConfig`] (and `TrainingArguments`) holds;
    these fields are added:

    Parameters:
        truncation (`str`, *optional*, defaults to `"none"`):
            What to do with a record whose longest completion sequence (context + completion) is over `max_length`
            tokens. `"none"` cuts nothing and removes the record (TRL's behaviour). `"left"` cuts tokens from the left of the
            *context*, the same number for every completion of the record so they keep sharing it; the completion
            is never cut, and a record whose completion alone is too long is dropped. Counts are logged per split.
        on_invalid (`str`, *optional*, defaults to `"raise"`):
            What to do with a record that does not follow the rank schema: `"raise"` an error naming the dataset,
            row and field, or `"skip"` it (the count and reasons are logged once per split).
        max_completions (`int` or `None`, *optional*, defaults to `1024`):
            Most completions in one rank-schema record. A record with more is invalid (raised or skipped as
            `on_invalid` says): its N(N-1)/2 pairs would fill memory. Split such a record into several with the same
            context, or raise the limit (`None` or 0: none).
        save_reward_stats (`bool`, *optional*, defaults to `True`):
            When training ends, evaluate every validation set and write the mean and standard deviation of the
            rewards into the model config (`reward_mean`, `reward_std` over all validation completions, and
            `reward_stats` per set), as OpenRLHF does, so a reward function can normalise rewards from the
            checkpoint alone. Needs an `eval_dataset`.

        prefix_sharing (`bool` or `str`, *optional*, defaults to `"auto"`):
            Run each record's context through the model once: the contexts of a batch in one forward with a KV
            cache, then every completion against its record's cached context (position ids continuing after it),
            the score read at each completion's last token; backward goes through both. Equal to the plain path
            within float rounding (scores, loss, gradients), with no mask over a whole row, for eager, SDPA and
            FlashAttention-2. `"auto"` (default): on where the model supports it, else the plain path, logged once.
            `True`: on; where the KV path cannot run (activation checkpointing, FSDP, sliding-window layers) a
            block-mask row (context once, completions under a block mask; eager/SDPA) is used instead, else the
            plain path with a warning. `False`: never. On the command line: `--prefix_sharing auto|true|false`.
        pack_max_tokens (`int` or `None`, *optional*, defaults to `None`):
            The most tokens one forward of a shared layout takes (each context counted once). Packed and KV layouts:
            a micro-batch with more runs as several forwards (consecutive records under the budget; a record over it
            alone) in the same step, gradients accumulated: the loss and gradients are the micro-batch's (the KV
            layout counts the records' tokens, not the padding of its passes). Unset
            under the packed layout on CUDA, it is sized from the GPU's free memory. Block-mask rows
            (`prefix_sharing=True` under activation checkpointing or FSDP on the CPU): several records packed into
            one row of up to this many tokens. Refused with `prefix_sharing=False`.
        window_packing (`bool` or `str`, *optional*, defaults to `"auto"`):
            Under gradient accumulation, lay out the micro-batches of one accumulation window together and run them
            as few forwards as `pack_max_tokens` allows (one where they fit), each pair keeping the weight it has in
            its own micro-batch: the loss, gradients, optimizer steps, learning rate schedule and logged metrics are
            those of the accumulated step (`trl_rm_env.trainer.windows`). Small forwards are launch-bound on a GPU;
            one large forward is not. `"auto"` (default): on where the packed layout trains and
            `gradient_accumulation_steps > 1`, logged once. `True`: on under the packed or KV layout, refused where
            it cannot apply (one micro-batch a step, a plain layout, a data_collator given, `ensemble_heads > 1`).
            `False`: one forward per micro-batch, as TRL.
        fused_kernels (`bool` or `str`, *optional*, defaults to `"auto"`):
            Liger Kernel's fused RMSNorm, SwiGLU and RoPE Triton kernels on the model (`trl_rm_env.fused_kernels`;
            `pip install 'trl-rm-env[gpu]'`), its loss kernels off (Liger's fused linear cross entropy would replace
            a classifier's forward). `"auto"` (default): on where training runs on CUDA, the package is installed
            and Liger supports the model type, logged once. `True`: on, refused in one line where it cannot apply.
            `False`: off. TRL's `use_liger_kernel: true` is read as `True`.
        ensemble_heads (`int`, *optional*, defaults to `1`):
            K score heads on one backbone, each with its own Bradley-Terry loss over the same pairs weighted by its
            own bootstrap resample of the records (Poisson(1) weights, by seed), the backbone getting the mean of
            their gradients: an ensemble for one forward (`trl_rm_env.trainer.ensemble`). The checkpoint is a
            `*ForSequenceClassification` with `num_labels=K` and `ensemble_heads=K` in its config; the logged
            metrics are the heads' mean, plus each head's evaluation accuracy.
        ensemble_seed (`int` or `None`, *optional*, defaults to `None`):
            The seed of the bootstrap resamples (None: `seed`).

    > [!NOTE]
    > Defaults that differ from TRL's `RewardConfig`: activation (gradient) checkpointing is off unless
    > `activation_checkpointing: true` is set (TRL turns it on, and its `gradient_checkpointing=True` default trips
    > transformers 5's deprecation warning on every run), `bf16` is on only on CUDA devices that support it (TRL
    > turns it on whenever fp16 is off, which makes CPU runs slow and inexact), and `ddp_find_unused_parameters` is
    > False unless set (a reward model uses every parameter in every forward: transformers' default, True without
    > activation checkpointing, only adds a graph traversal per step and a warning on every DDP process).
    """

    truncation: str = option(
        "none",
        choices=TRUNCATION,
        help="Over-length records (longer than `max_length`): 'none' cuts nothing and drops them (TRL's behaviour), "
        "'left' cuts the context from the left (never the completion).",
    )
    on_invalid: str = option(
        "raise",
        choices=ON_INVALID_MODES,
        help="Records that break the rank schema: 'raise' an error naming dataset, row and field, or 'skip' them "
        "(count and reasons logged once).",
    )
    max_completions: int | None = option(
        MAX_COMPLETIONS_PER_RECORD,
        help="Most completions in one rank-schema record; a record with more is invalid (its pairs grow with the "
        "square). None or 0: no limit.",
    )
    save_reward_stats: bool = option(
        True,
        help="Write the mean/std of validation rewards into the saved model config (`reward_mean`, `reward_std`, "
        "`reward_stats`) when training ends.",
    )
    # Declared as every options class declares it (text for TRL's parser, which would read `bool | str` as a bool);
    # __post_init__ maps "true"/"false" to bools, as scoring's `prefix_sharing` holds them.
    prefix_sharing: PrefixSharing = prefix_sharing_option(
        help="Encode each record's context once (exact: scores, loss and gradients equal the plain path). 'auto': on "
        "a GPU, each micro-batch in one packed padding-free forward; on the CPU, completions against the context's "
        "KV cache; 'true': always (warns when it cannot); 'packed': the GPU's packed layout on any device; 'false': "
        "never.",
    )
    pack_max_tokens: int | None = option(
        None,
        help="The most tokens one training forward takes (contexts once): a micro-batch with more runs as several "
        "forwards in the same step, gradients accumulated (block-mask rows: the row length). Unset on a GPU: sized "
        "from its free memory.",
    )
    window_packing: str | None = switch_option(
        help="Under gradient accumulation, run the window's micro-batches as few forwards as pack_max_tokens allows "
        "(one where they fit), with the accumulated step's loss, gradients and metrics. 'auto': on where the packed "
        "layout trains; 'true': on (packed or KV layout), refused where it cannot apply; 'false': a forward per "
        "micro-batch.",
    )
    fused_kernels: str | None = switch_option(
        help="Liger Kernel's fused RMSNorm, SwiGLU and RoPE kernels on the model (pip install 'trl-rm-env[gpu]'). "
        "'auto': on where training runs on CUDA and Liger supports the model; 'true': on, refused where it cannot "
        "apply; 'false': off.",
    )
    ensemble_heads: int = option(
        1,
        help="Train K score heads on one backbone, each on its own bootstrap resample of the records (an ensemble for "
        "the cost of one forward; `trl_rm_env.trainer.ensemble`). The checkpoint has num_labels=K and "
        "`ensemble_heads=K` in its config.",
    )
    ensemble_seed: int | None = option(
        None, help="The seed of the heads' bootstrap resamples (None: `seed`)."
    )
    gradient_checkpointing: bool | None = field(
        default=None,
        metadata={"help": "Deprecated alias of `activation_checkpointing` (transformers 5); off unless set."},
    )
    bf16: bool | None = field(
        default=None,
        metadata={
            "help": "Use bf16 mixed precision. Defaults to True on CUDA devices with bf16 support, False otherwise."
        },
    )

    def __post_init__(self):
        refuse_renamed(self)
        self.prefix_sharing = normalize_prefix_sharing(self.prefix_sharing)  # "true" (a flag) or True: one value
        self.window_packing = normalize_switch("window_packing", self.window_packing)
        self.fused_kernels = normalize_switch("fused_kernels", self.fused_kernels)
        check_choices(self, skip=("prefix_sharing", "window_packing", "fused_kernels"))
        if self.use_liger_kernel and self.fused_kernels is False:
            raise ValueError("use_liger_kernel=True asks for Liger Kernel's kernels and fused_kernels=False for none; "
                             "set one of them.")
        if self.max_completions is not None and self.max_completions < 0:
            raise ValueError(f"max_completions must be >= 0 (0: no limit), got {self.max_completions}.")
        self.max_completions = self.max_completions or None
        if self.ensemble_heads < 1:
            raise ValueError(f"ensemble_heads must be >= 1 (1: one score head), got {self.ensemble_heads}.")
        if self.pack_max_tokens is not None and (self.prefix_sharing is False or self.pack_max_tokens < 1):
            raise ValueError(
                f"pack_max_tokens={self.pack_max_tokens} bounds the forwards of prefix sharing's layouts and must be "
                f">= 1; prefix_sharing={self.prefix_sharing!r} runs none (unset pack_max_tokens, or share prefixes)."
            )
        if self.ddp_find_unused_parameters is None:
            self.ddp_find_unused_parameters = False
        if self.bf16 is None:
            import torch

            self.bf16 = (
                not self.fp16 and not self.use_cpu and torch.cuda.is_available() and torch.cuda.is_bf16_supported()
            )
        super().__post_init__()


@dataclass
class RegressionRewardConfig(RankedRewardConfig):
    r"""
    Configuration for [`RegressionRewardTrainer`]. Everything of [`RankedRewardConfig`] (`truncation`, `on_invalid`,
    ...) and TRL's `RewardConfig` holds, except `center_rewards_coefficient` and `ensemble_heads` (Bradley-Terry
    terms) and `prefix_sharing` (a regression record has a single completion), which must stay unset. These fields are added:

    Parameters:
        attributes (`list[str]` or `None`, *optional*, defaults to `None`):
            The attributes the model predicts, in output order (`num_labels = len(attributes)`). None takes them from
            the model when it is already a regression RM (its `id2label`), else from the training data (every name
            with a value, in order of first appearance). Data with any other attribute is an error.
        attribute_weights (`list[float]` or `None`, *optional*, defaults to `None`):
            Default weights of the reward, `reward = sum_a w_a * prediction_a`, one per attribute in the order of
            `attributes`. Stored in the saved model config as `attribute_weights` (`{name: weight}`), for a reward
            function to use when it is given no weights of its own. Training does not use them.
    """

    attributes: list[str] | None = field(
        default=None,
        metadata={"help": "Attributes to predict, in output order; default: those of the model or the training data."},
    )
    attribute_weights: list[float] | None = field(
        default=None,
        metadata={
            "help": "Default reward weights, one per attribute; saved in the model config (not used in training)."
        },
    )

    def __post_init__(self):
        if self.attributes is not None:
            if not self.attributes or len(set(self.attributes)) != len(self.attributes):
                raise ValueError(f"attributes must be a non-empty list of distinct names, got {self.attributes}.")
            if self.attribute_weights is not None and len(self.attribute_weights) != len(self.attributes):
                raise ValueError(
                    f"attribute_weights has {len(self.attribute_weights)} values for {len(self.attributes)} "
                    f"attributes {self.attributes}; give one weight per attribute, in the same order."
                )
        if self.center_rewards_coefficient is not None:
            raise ValueError(
                f"center_rewards_coefficient={self.center_rewards_coefficient} is a Bradley-Terry term with no "
                "meaning for a regression reward model; leave it unset."
            )
        if self.ensemble_heads != 1 or self.ensemble_seed is not None:
            raise ValueError(
                f"ensemble_heads={self.ensemble_heads} trains bootstrapped Bradley-Terry heads; a regression reward model "
                "has one output per attribute: leave ensemble_heads and ensemble_seed unset."
            )
        if forces_sharing(getattr(self, "prefix_sharing", None)):
            raise ValueError(
                "prefix_sharing shares a context between the completions of a ranked record; a regression record has "
                "one completion, so there is nothing to share: leave it off."
            )
        super().__post_init__()
        self.prefix_sharing = False  # "auto" (the default) has nothing to share here
        if self.window_packing is True:
            raise ValueError("window_packing lays out the ranked records of an accumulation window in the packed "
                             "layout; a regression reward model trains on the plain one: leave it unset.")
        self.window_packing = False
