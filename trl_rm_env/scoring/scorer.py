"""`RewardScorer`: exact, memory-bounded scoring of (context, completion) pairs with a sequence-classification RM;
and the scorer of a planned reward model (`load_scorer`, `load_reward_scorer`: `trl_rm_env.runtime.plan_model`, then
the engine `trl_rm_env.runtime.loading.load_engine` builds). The GRPO environment, `trl-rm-env eval` and
`trl-rm-env serve` (which hands a vLLM plan to vLLM's own server instead) all go through them.

Data path: `(context, completion)` -> token ids with the RM's own chat template (`trl_rm_env.tokenization`) ->
over-length handling (left truncation or a fallback reward) -> the engine's outputs, `(N, num_labels)` fp32 in input
order (`engine`: `HFEngine`, the model run by transformers in this process, or `VLLMEngine`) -> the reward (column
`label_index`, or a regression RM's weighted sum: `head`) -> NaN/inf handling. Options: `ScoringOptions`.

Exactness: every engine returns, for each sequence, what running that sequence alone gives (fp32: < 1e-4, proved by
the parity tests); batching, padding and prefix sharing never change a score.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from ..data.messages import strip_completion_reasoning
from ..heads import RewardHead, check_label_index, reward_head
from ..runtime.engines.transformers_engine import HFEngine
from ..runtime.loading import load_planned
from ..runtime.model_options import ScoringOptions
from ..runtime.plan import ModelPlan, plan_model
from ..tokenization import Message, encode_pairs, left_truncate
from .interfaces import NonfiniteScores, ScoredPairs
from .overlap import overlapped_outputs

logger = logging.getLogger(__name__)

@dataclass
class EncodedBatch:
    """What was scored: token ids per item, how many context tokens each has, and which items were handled."""

    ids: list[list[int] | None]
    context_lengths: list[int]
    truncated: list[int] = field(default_factory=list)  # indices left-truncated
    overlength: list[int] = field(default_factory=list)  # indices given the over-length fallback


class RewardScorer:
    """Score conversations with a sequence-classification reward model, exactly and in bounded memory.

    Implements the `Scorer` protocol (`trl_rm_env.scoring.interfaces`) that the GRPO environment, `trl-rm-env eval` and
    the server use.

    Args:
        model: A `*ForSequenceClassification` model (`num_labels >= 1`; column `label_index` is the reward), or
            None when `engine` is an engine that holds the model itself (`VLLMEngine`).
        tokenizer: The reward model's tokenizer; its chat template renders every conversation.
        options: A `ScoringOptions` (None: the defaults); any option can also be given by name
            (`RewardScorer(model, tokenizer, batch_size=16, prefix_sharing=False)`), replacing the one in `options`.
        engine: What runs the forward passes: an engine object (`trl_rm_env.scoring.interfaces.Engine`), or a name,
            the `engine` option. With a loaded `model`, `"auto"` and `"hf"` run it with `HFEngine`; vLLM loads a
            model from its path: use `load_reward_scorer(path, engine="vllm")`.
        config: The model's config when `model` is None (default: the engine's `config`).
        head: How the outputs become one reward (`trl_rm_env.heads.RewardHead`); None: resolved from the config and
            the `attribute_weights` and `reward_model_type` options (`trl_rm_env.heads.reward_head`).

    Raises:
        TypeError: an unknown option name, or neither a model nor an engine object.
        ValueError: a bad option value, `engine="vllm"` with a loaded model, or attribute weights that do not fit
            the model's head.
    """

    is_async = False

    def __init__(
        self,
        model: PreTrainedModel | None,
        tokenizer: PreTrainedTokenizerBase,
        options: ScoringOptions | None = None,
        *,
        engine: Any = None,
        config: Any = None,
        head: RewardHead | None = None,
        **values: Any,
    ):
        if isinstance(engine, str):
            values["engine"], engine = engine, None
        self.options = o = ScoringOptions.build(options, **values)
        if engine is None and model is None:
            raise TypeError("RewardScorer needs a loaded model or an engine object that holds one")
        if engine is None and o.engine == "vllm":
            raise ValueError(
                "engine='vllm' loads the reward model from its path or Hub id, not from a loaded model: use "
                "load_reward_scorer(path, engine='vllm') or RewardModelEnvironment(path, engine='vllm')"
            )
        self.model = model
        # What the server and `eval` read of the model (names, vocabulary, heads).
        self.config = config if config is not None else (model.config if model is not None else engine.config)
        self.tokenizer = tokenizer
        self.max_length = o.longest_sequence(self.config)  # resolved from the options and the model's config
        if head is None:
            head = reward_head(self.config, o.attribute_weights, o.reward_model_type, label_index=o.label_index)
        self.head = head  # a regression head's weights, an ensemble's mean of heads, or one output column
        weights = head.output_weights(self.config.num_labels)
        self.output_weights = None if weights is None else torch.tensor(weights, dtype=torch.float32)
        check_label_index(self.config, o.label_index)  # (`plan_model` refuses it before loading, for a path)
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
        if model is not None and getattr(model.config, "pad_token_id", None) is None:
            model.config.pad_token_id = tokenizer.pad_token_id
        self.engine = engine or HFEngine(model, tokenizer, o)

    # ------------------------------------------------------------------ options and what the engine reports
    @property
    def nonfinite_reward(self) -> float | None:
        """The `Scorer` protocol's reward for a NaN/inf score (`options.nonfinite_reward`)."""
        return self.options.nonfinite_reward

    # What an engine may report (`Engine`'s optional members), for logs and tests: the prefix sharing that runs.
    prefix_sharing = property(lambda self: getattr(self.engine, "prefix_sharing", False))
    device = property(lambda self: getattr(self.engine, "device", torch.device("cpu")))

    # ------------------------------------------------------------------ encoding
    def encode(
        self, contexts: Sequence[str | Sequence[Message]], completions: Sequence[str | Sequence[Message]], *,
        first: int = 0,
    ) -> EncodedBatch:
        """Token ids for each `(context, completion)`, with over-length handling applied; `first`: the number of the
        first item in the call, for error messages (an overlapped call encodes it in waves)."""
        if len(contexts) != len(completions):
            raise ValueError(f"Got {len(contexts)} contexts but {len(completions)} completions; they must match.")
        ids: list[list[int] | None] = []
        context_lengths: list[int] = []
        out = EncodedBatch(ids, context_lengths)
        if self.options.strip_reasoning:
            completions = [strip_completion_reasoning(completion) for completion in completions]
        pairs = encode_pairs(self.tokenizer, contexts, completions, **self.options.template_kwargs)
        for i, (seq, context_length) in enumerate(pairs):
            if self.max_length is not None and len(seq) > self.max_length:
                cut = left_truncate(seq, context_length, self.max_length, self.tokenizer.bos_token_id)
                if self.options.truncation == "left" and cut is not None:
                    context_length -= len(seq) - len(cut)
                    seq = cut
                    out.truncated.append(i)
                elif self.options.overlength_reward is not None:
                    seq = None
                    out.overlength.append(i)
                else:
                    raise ValueError(
                        f"Item {first + i} is {len(seq)} tokens, over max_length={self.max_length}"
                        + (" even after cutting its whole context" if self.options.truncation == "left" else "")
                        + ". Set `overlength_reward` to give such items a fixed reward, or raise max_length."
                    )
            ids.append(seq)
            context_lengths.append(context_length)
        return out

    # ------------------------------------------------------------------ scoring
    def score_ids(self, sequences: Sequence[Sequence[int]], progress: bool | None = None) -> torch.Tensor:
        """Rewards (fp32, CPU, input order) of already-encoded sequences; `progress` overrides `show_progress`.

        Where the engine shares prefixes (`prefix_sharing`), it finds the sequences that begin with the same tokens
        (a GRPO group's prompt) in the ids themselves (`trl_rm_env.sharing.shared_prefixes_in`) and scores them
        against one encoding of that prefix, as `score_ids_shared` does with given context lengths; scores stay those
        of each sequence run alone."""
        return self._reward_of(self.engine.outputs(sequences, None, progress))

    def score_ids_shared(
        self, sequences: Sequence[Sequence[int]], context_lengths: Sequence[int], progress: bool | None = None
    ) -> torch.Tensor:
        """Like `score_ids`, with the items that share a context scored against one encoding of it (where
        `prefix_sharing` and its cost model say so; the rest plainly)."""
        return self._reward_of(self.engine.outputs(sequences, context_lengths, progress))

    def _reward_of(self, outputs: torch.Tensor) -> torch.Tensor:
        if self.output_weights is not None:
            return outputs @ self.output_weights
        if self.head.attributes:
            raise ValueError(
                f"This regression reward model predicts {list(self.head.attributes)}: one reward per sample needs "
                "attribute_weights, a mapping by name (unnamed ones weigh 0) or a list in this order (`outputs()` "
                "gives every attribute without them)."
            )
        return outputs[:, self.options.label_index or 0].clone()

    def _outputs(
        self, contexts: Sequence[Any], completions: Sequence[Any], progress: bool | None
    ) -> tuple[torch.Tensor, list[int], list[int]]:
        """`(outputs, scored, overlength)`: the `(N, num_labels)` outputs (NaN rows for the items not scored), the
        items scored, and the items over `max_length` given the over-length fallback. Encoded in waves, each while
        the model runs the previous one, where `overlap_encoding` says so (`trl_rm_env.scoring.overlap`)."""
        bounds = self._overlap_bounds()
        if bounds is not None and len(contexts) > 1:
            return overlapped_outputs(self, contexts, completions, bounds, progress)
        encoded = self.encode(contexts, completions)
        present = [i for i, ids in enumerate(encoded.ids) if ids is not None]
        outputs = torch.full((len(encoded.ids), self.config.num_labels), float("nan"), dtype=torch.float32)
        if present:
            ids = [encoded.ids[i] for i in present]
            context_lengths = [encoded.context_lengths[i] for i in present]  # the engine shares them where it can
            outputs[torch.tensor(present)] = self.engine.outputs(ids, context_lengths, progress)
        return outputs, present, encoded.overlength

    def _overlap_bounds(self) -> tuple[int | None, int | None] | None:
        """The waves' bounds of an overlapped call (`HFEngine.wave_bounds`), or None: `overlap_encoding` off, or
        `"auto"` off the GPU.

        Raises:
            ValueError: `overlap_encoding=True` with an engine that does not run passes here (vLLM).
        """
        asked = self.options.overlap_encoding
        if asked is False:
            return None
        if not isinstance(self.engine, HFEngine):
            if asked is True:
                name = getattr(self.engine, "name", type(self.engine).__name__)
                raise ValueError(f"overlap_encoding=True encodes a call in waves of the forward passes transformers "
                                 f"runs here, but the engine is {name!r} (which batches the call itself); set "
                                 "overlap_encoding to 'auto' or False.")
            return None
        if asked == "auto" and self.engine.device.type != "cuda":
            return None
        return self.engine.wave_bounds()

    def outputs(
        self,
        contexts: Sequence[str | Sequence[Message]],
        completions: Sequence[str | Sequence[Message]],
        progress: bool | None = None,
    ) -> torch.Tensor:
        """The model's outputs, `(N, num_labels)` fp32 in input order, of `(context, completion)` pairs: every
        attribute of a regression head, whatever its weights (NaN rows: over `max_length` with the fallback)."""
        return self._outputs(contexts, completions, progress)[0]

    def attribute_outputs(
        self,
        contexts: Sequence[str | Sequence[Message]],
        completions: Sequence[str | Sequence[Message]],
        progress: bool | None = None,
    ) -> torch.Tensor:
        """Every output of the model (`(N, num_labels)` fp32, input order; a regression head's attributes, whatever
        their weights) with the fallbacks applied as `score` applies them: a pair over `max_length` under
        `truncation="none"` gets `overlength_reward` in every column, and a NaN/inf output gets `nonfinite_reward`
        (`score_pairs(..., every_output=True)` also says which items).

        Raises:
            NonfiniteScores: a NaN/inf output and `nonfinite_reward` None, naming the items.
        """
        return self.score_pairs(contexts, completions, progress, every_output=True).scores

    def _with_fallbacks(
        self, values: torch.Tensor, present: list[int], overlength: list[int]
    ) -> tuple[torch.Tensor, list[int]]:
        """`(values, nonfinite)`: `values` (a score per item, or every output per item) with the fallbacks applied,
        `overlength_reward` for the items over `max_length` and `nonfinite_reward` for each NaN/inf value of a scored
        item, and those items (which the environment warns about and counts).

        Raises:
            NonfiniteScores: a NaN/inf value and `nonfinite_reward` None, naming the items.
        """
        if overlength:
            values[torch.tensor(overlength)] = float(self.options.overlength_reward)
        bad = [i for i in present if not bool(torch.isfinite(values[i]).all())]
        if bad:
            if self.options.nonfinite_reward is None:
                raise NonfiniteScores.naming("The reward model", bad)
            rows = torch.tensor(bad)
            cells = values[rows]
            cells[~torch.isfinite(cells)] = float(self.options.nonfinite_reward)  # the bad values only
            values[rows] = cells
        return values, bad

    def score(
        self,
        contexts: Sequence[str | Sequence[Message]],
        completions: Sequence[str | Sequence[Message]],
        progress: bool | None = None,
    ) -> torch.Tensor:
        """Scores (fp32, input order) of `(context, completion)` pairs, with fallbacks applied (`score_pairs` also
        returns the raw outputs and which items were NaN/inf)."""
        return self.score_pairs(contexts, completions, progress).scores

    def score_pairs(
        self, contexts: Sequence[Any], completions: Sequence[Any], progress: bool | None = None, *,
        every_output: bool = False,
    ) -> ScoredPairs:
        """The `Scorer` protocol's call: the scores of `(context, completion)` pairs with fallbacks applied (every
        output of each, `(N, num_labels)`, with `every_output`), the raw outputs, and the items scored NaN/inf.

        Raises:
            NonfiniteScores: a NaN/inf score and `nonfinite_reward` None, naming the items.
        """
        outputs, present, overlength = self._outputs(contexts, completions, progress)
        if every_output:
            values = outputs.clone()
        else:
            values = torch.full((len(outputs),), float("nan"), dtype=torch.float32)
            if present:
                values[torch.tensor(present)] = self._reward_of(outputs[torch.tensor(present)])
        values, bad = self._with_fallbacks(values, present, overlength)
        return ScoredPairs(values, outputs if present else None, bad)


def load_scorer(
    plan: ModelPlan,
    tokenizer: str | os.PathLike | PreTrainedTokenizerBase | None = None,
    *,
    shard: bool = False,
    fsdp_shard: bool | None = None,
    check_tokenizer: Callable[[PreTrainedTokenizerBase], None] | None = None,
    log: logging.Logger = logger,
) -> RewardScorer:
    """The `RewardScorer` of `plan`, on the engine `load_engine` builds (vLLM's, or the model loaded with
    transformers; under `engine="auto"` with no vLLM option given, a vLLM that fails to start is a warning and
    transformers scores instead; `shard`, `fsdp_shard`, `log`: `load_engine`'s). `check_tokenizer`: called with the
    tokenizer before any weights load."""
    tokenizer, engine = load_planned(plan, tokenizer, shard=shard, fsdp_shard=fsdp_shard,
                                     check_tokenizer=check_tokenizer, log=log)  # fmt: skip
    config = plan.config if engine.model is None else None  # a loaded model's own config, else the plan's
    return RewardScorer(engine.model, tokenizer, plan.options, engine=engine, config=config, head=plan.head)


def load_reward_scorer(
    model: str | os.PathLike | PreTrainedModel,
    options: ScoringOptions | None = None,
    *,
    one_reward: bool = True,
    tokenizer: str | os.PathLike | PreTrainedTokenizerBase | None = None,
    hf_only: str | None = None,
    shard: bool = False,
    fsdp_shard: bool | None = None,
    check_tokenizer: Callable[[PreTrainedTokenizerBase], None] | None = None,
    log: logging.Logger = logger,
    **values: Any,
) -> RewardScorer:
    """Load a `*ForSequenceClassification` checkpoint (path or Hub id, or a loaded model) and its tokenizer into a
    `RewardScorer`, on the engine `options.engine` picks (`trl_rm_env.runtime.choose_engine`; `"auto"` by default):
    `load_scorer(plan_model(...))`, the one way a reward model is loaded for scoring (the reward function's factory,
    `trl_rm_env.rewards.backend.connect`, calls it too).

    Args:
        model: Local folder or Hub id of the reward model, or a loaded one.
        options, **values: The `ScoringOptions` (`batch_size`, `max_tokens_per_batch`, `precision`, `engine`, ...).
        one_reward: False to read a regression model's attributes without weights (`RewardScorer.outputs`).
        tokenizer: The RM's tokenizer, or a path/id to load it from (default: the model's own).
        hf_only: Why only transformers can serve this case (`choose_engine`), or None.
        shard, fsdp_shard, log: Hold the weights as the launch says (`load_engine`).
        check_tokenizer: Called with the tokenizer before any weights load (a bad option fails fast).

    Raises:
        ValueError: a bad option value.
        ImportError: `engine="vllm"` without vLLM installed.
    """
    plan = plan_model(model, options, one_reward=one_reward, hf_only=hf_only, **values)
    return load_scorer(plan, tokenizer, shard=shard, fsdp_shard=fsdp_shard, check_tokenizer=check_tokenizer, log=log)


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
