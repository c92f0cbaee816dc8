"""`JudgeEnvironment`: a generative judge (a causal LM) as a GRPO reward function, pointwise, pairwise over a GRPO
group, or listwise, read from log-probabilities or parsed from generated text."""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Generator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import PreTrainedModel

from ..distributed import full_weights
from ..judges import templates as T
from ..judges.builtin_modes import mode_of
from ..judges.judge_options import JudgeOptions
from ..judges.judgements import (
    Judgement,
    JudgeVerdicts,
    aggregate,
    ask_verdicts,
    build_judgements,
    failure_message,
    group_samples,
    template_columns,
)
from ..judges.mode_base import EvalPair, JudgeMode, PairVerdicts
from ..judges.verdicts import label_token_ids
from ..options import build, names, route
from ..runtime.engines.contract import Generate, LabelLogprobs
from ..runtime.model_options import ModelOptions
from ..serving.client.remote_options import RemoteOptions
from ..tokenization import encode_messages
from .backend import connect
from .base import Ids, RewardCall, RewardFunction, RewardOptions, Samples
from .pickling import PicklesByArguments
from .shaping import GroupShaping, LengthShaping
from .whole_groups import Gather, gather, own_group, processes, shared_values, whole_call

logger = logging.getLogger(__name__)

OWN_ARGUMENTS = ("model", "tokenizer", "remote_url", "options", "scoring_options")
OPTION_CLASSES = (JudgeOptions, ModelOptions, RewardOptions, RemoteOptions, GroupShaping, LengthShaping)
"""Where the judge's options are declared: how it judges, how the judge model loads and runs, what the reward function
does with the rewards, how servers are reached (with `remote_url`), and how a group's rewards are shaped."""


@dataclass
class JudgeCall(RewardCall):
    """One `JudgeEnvironment.call`: the rewards and the judgements this process asked for (each one's prompt token
    ids, the samples it shows, and whether it was over length)."""

    judgements: list[Judgement] = field(default_factory=list)


class JudgeEnvironment(PicklesByArguments, RewardFunction):
    """A generative judge wrapped as a GRPO reward function (TRL's reward-function signature), run in this process
    (vLLM or transformers) or on OpenAI-compatible servers.

    Modes (`mode`): `pointwise` rates each completion (the reward is the rating, 1..`max_score`); `pairwise`
    compares the completions of each GRPO group (samples with equal prompts in the call) in pairs (`pairs`: `all` or
    `circular`; `swap` judges both orders) and gives each its mean preference over its comparisons (0..1);
    `listwise` shows the whole group at once and gives each completion its standing (`logprobs`: the probability
    that it is the best; `generate`: `(N - 1 - rank) / (N - 1)` of the ranking the judge writes), averaged over both
    orders with `swap`.

    Scoring (`scoring`): `logprobs` reads the verdict from the judge's next-token distribution over the verdict tokens,
    renormalized over them (pointwise: the expected rating `sum_k k p(k) / sum_k p(k)`; pairwise: `p(A) / (p(A) +
    p(B))`), one forward per judgement and nothing to parse; the mass the verdict tokens held is logged as
    `judge_env/rating_mass`. `generate` lets the judge write (`max_new_tokens`), strips `<think>`, parses the
    verdict, asks again `parse_retries` times when it cannot, then gives `unparsed_reward` (None: an error naming the
    samples); never a silent 0.

    Everything around the judgements is the reward-model environment's (`RewardFunction`): TRL's input checks, empty
    completions, normalization, clipping, `strip_reasoning` (the policy's `<think>` removed before judging) and the
    metrics, under `judge_env/*`. Templates: `trl_rm_env.judges.templates`.

    Args:
        model: A Hub id or local path of a causal LM (`*ForCausalLM`), or a loaded one. With `remote_url`: the model
            name sent to the servers (None: the server's own).
        tokenizer: The judge's tokenizer, or a path/id to load it from (default: the model's own). With `remote_url`,
            judgements go as token ids rendered with it (else `model`'s when it loads), or as messages.
        remote_url: Judge on OpenAI-compatible servers at this URL or these URLs (`trl-rm-env serve --engine vllm
            --model JUDGE`, `vllm serve`, ...) instead of loading the judge here.
        options: A `JudgeOptions` instance; `scoring_options`: a `ModelOptions` instance. Any option of either may
            also be given by name.
        **options_by_name: Every option of `JudgeOptions` (`mode`, `scoring`, `pairs`, `swap`, `max_score`,
            `template`, ...), of `ModelOptions` (how the judge model loads and runs: `engine`, `precision`,
            `max_length`, `batch_size`, `max_tokens_per_batch`, `template_kwargs`, `strip_reasoning`,
            `overlength_reward`, `vllm_*`, ...; a reward model's own options, such as `truncation` or `label_index`,
            are no judge's: a judge's prompt is never cut, an over-long one gets `overlength_reward`), of
            `RewardOptions` (`name`, default `judge`; `normalization`, `clip`, `empty_completion_reward`), of
            `GroupShaping` (group bonuses, length and style adjustments) and, with `remote_url`, of `RemoteOptions`
            (`remote_input`, `timeout`, `retries`, ...).

    Raises:
        TypeError: an unknown keyword argument (the accepted ones are listed), `scoring_options` that are not
            `ModelOptions`, or no model and no `remote_url`.
        ValueError: a bad option value, a template without the mode's fields, a verdict that is not one token of the
            judge's tokenizer (`logprobs`), or a model that is not a causal LM.
    """

    metric_prefix = "judge_env"

    def __init__(
        self,
        model: str | os.PathLike | PreTrainedModel | None = None,
        tokenizer: Any = None,
        *,
        remote_url: str | Sequence[str] | None = None,
        options: JudgeOptions | None = None,
        scoring_options: ModelOptions | None = None,
        **options_by_name: Any,
    ):
        self._remember(
            model=model,
            tokenizer=tokenizer,
            remote_url=remote_url,
            options=options,
            scoring_options=scoring_options,
            **options_by_name,
        )  # what pickling sends (AsyncGRPO): `trl_rm_env.rewards.pickling`
        given = route(options_by_name, *OPTION_CLASSES, own=OWN_ARGUMENTS)
        self.shaping_options = GroupShaping(**given[GroupShaping])
        self.length_shaping_options = LengthShaping(**given[LengthShaping])
        self.options = judge = JudgeOptions.build(options, **given[JudgeOptions])
        if scoring_options is not None and type(scoring_options) is not ModelOptions:
            raise TypeError(
                f"scoring_options must be a ModelOptions (how the judge model loads and runs), got "
                f"{type(scoring_options).__name__}: a reward model's own options are no judge's"
            )
        scoring = ModelOptions.build(scoring_options, **given[ModelOptions])
        reward = RewardOptions(**{"name": "judge", **given[RewardOptions]})
        self._check_template(judge)
        self.scoring_options = scoring
        backend = connect(
            "judge", type(self).__name__, model, tokenizer, options=scoring, remote_url=remote_url,
            remote_values=given[RemoteOptions], name=reward.name, log=logger,
            check_tokenizer=lambda tok: self._labels_of(judge, reward.name, tok),  # a verdict that is not one token
        )
        self.engine, self.tokenizer, self.tokens = backend.runs, backend.tokenizer, backend.tokens
        self.remote_url, self._built_on = backend.remote_url, backend.built_on
        self._configure(judge, reward)

    def _check_template(self, judge: JudgeOptions) -> None:
        mode = mode_of(judge.mode)
        T.check_template(judge.template if judge.template is not None else mode.template, mode)

    def _configure(self, judge: JudgeOptions, reward: RewardOptions) -> None:
        """Everything that follows from the options once the judge runs: template, verdict tokens, the pipeline."""
        scoring = self.scoring_options
        self.options = judge
        self.mode: JudgeMode = mode_of(judge.mode)
        self.template = judge.template if judge.template is not None else self.mode.template
        self.columns = self.mode.columns(judge, self.template)
        self.masks_failures = judge.failed_judgement == "masked"
        self.template_kwargs = scoring.template_kwargs
        self.overlength_reward = scoring.overlength_reward
        self.labels, self.label_ids = self._labels_of(judge, reward.name, self.tokenizer)
        if self.tokens:
            self.mode.check_tokenizer(self.tokenizer, judge, self.template_kwargs)
        self._setup(
            self.engine, reward, strip_reasoning=scoring.strip_reasoning, shaping=self.shaping_options,
            length_shaping=self.length_shaping_options,
        )
        self._warned_groups = False
        self._gather_group = None  # the processes' group for whole GRPO groups (`whole_groups.own_group`)

    def replace(self, **values: Any) -> JudgeEnvironment:
        """Another reward function on the same judge (its engine is shared, nothing loads again) with some
        `JudgeOptions` or `RewardOptions` changed: `judge.replace(mode="pairwise", name="pairwise_judge")`.

        Raises:
            TypeError: a name that is not a `JudgeOptions` or `RewardOptions` option (a `ModelOptions` or
                `GroupShaping` one needs a new judge: it says how the model loads and runs, or shapes every reward).
        """
        given = route(values, JudgeOptions, RewardOptions, what="option")
        self.engine  # noqa: B018 - an unpickled judge loads before it is shared
        other = object.__new__(type(self))  # shares the engine; pickles as a new judge with these options
        other.__dict__.update(self.__dict__)
        other._remember(**{**self._arguments, **values})
        other._configure(
            JudgeOptions.build(self.options, **given[JudgeOptions]),
            build(RewardOptions, self.reward_options, **given[RewardOptions]),
        )
        other._calls = self._calls  # one engine, one call at a time
        other._gather_group = None  # its exchanges its own: two judges must not take each other's
        return other

    @staticmethod
    def _labels_of(judge: JudgeOptions, name: str, tokenizer: Any) -> tuple[list[str], list[int] | None]:
        """The verdict labels of the mode, and their token ids where they are read by id (`logprobs` with the
        judge's tokenizer).

        Raises:
            ValueError: a verdict that is not one token of the judge's tokenizer.
        """
        labels = mode_of(judge.mode).labels(judge)
        if judge.scoring != "logprobs" or tokenizer is None:
            return labels, None
        return labels, label_token_ids(tokenizer, labels, name)

    @classmethod
    def argument_names(cls) -> set[str]:
        """Every keyword argument: the judge's own and every option's."""
        return {"remote_url"} | {name for options in OPTION_CLASSES for name in names(options)}

    # ------------------------------------------------------------------ the reward function
    @property
    def is_async(self) -> bool:
        """Servers judge: the call is a coroutine function (one unpickled and not loaded yet is local: a remote one is
        rebuilt as it unpickles)."""
        return "_pending" not in self.__dict__ and self.engine.is_async

    @staticmethod
    def _pending_name(arguments: dict[str, Any]) -> str:
        return str(arguments.get("name", "judge"))

    def _holding(self) -> contextlib.ExitStack:
        # One call at a time; entered on every rank, even one with nothing to judge: under ZeRO-3 and FSDP2 gathering
        # is a collective.
        stack = contextlib.ExitStack()
        stack.enter_context(self._calls)
        stack.enter_context(full_weights(self.engine.model, self.engine.sharding))
        return stack

    def _answer(self, request: LabelLogprobs | Generate | Gather) -> Any:
        """One engine call (`LabelLogprobs`, `Generate`: the engine contract's), or an exchange between the processes
        (`whole_groups.Gather`)."""
        if isinstance(request, Gather):
            return gather(request, self._gather_group, self.is_async)
        if isinstance(request, LabelLogprobs):
            return self.engine.label_logprobs(request.prompts, self.label_ids, self.labels)
        return self.engine.generate(
            request.prompts, self.options.max_new_tokens, request.temperature, request.seeds, self.options.top_p,
            keep_failures=self.mode.failed_verdict(self.options) is not None or self.masks_failures,
        )

    # ------------------------------------------------------------------ one call
    def _steps(
        self, prompts: Samples, completions: Samples, completion_ids: Ids, kwargs: Mapping[str, Any]
    ) -> Generator[LabelLogprobs | Generate | Gather, Any, JudgeCall]:
        """The whole reward call, yielding engine requests (`_answer`) and receiving their answers."""
        world = processes(self.mode.compares, getattr(self.engine, "sharding", "none"))
        if world > 1 and self._gather_group is None:
            self._gather_group = own_group()  # on the first call, before any request: the same point on every process
        error, empty, to_score, columns = None, [], [], {c: [] for c in self.columns}
        try:
            empty, to_score, _ = self._plan(prompts, completions, torch.float64)
            optional = self.mode.optional_columns(self.options)
            columns = template_columns(self.columns, kwargs, len(prompts), self.name, optional)
        except Exception as err:  # every process still enters the exchanges: all of them raise there
            if world == 1:
                raise
            error = err
        what = f"{self.name}: share the samples of a call (its GRPO groups are judged whole)"
        call = yield from whole_call(prompts, completions, columns, to_score, empty, world, what, error)
        values: dict[int, float] = {}
        counts, alone, verdicts, masses, judgements = {}, [], [], [], []
        try:
            texts = {i: self.mode.shown_text(call.completions[i], self.strip_reasoning) for i in call.to_score}
            groups = group_samples(call.prompts, call.to_score, call.columns)
            if world == 1 and self.mode.compares and len({len(g) for g in groups}) > 1 and not self._warned_groups:
                self._warned_groups = True  # a cascade left part of a group, or a judge sharded across processes
                logger.warning(
                    "%s: the groups of this call have %s completions: a %s judge compares the completions of one "
                    "call with equal prompts, so a GRPO group partly decided by an earlier cascade source (or split "
                    "across processes that each hold a shard of the judge) is compared in parts. Warned once.",
                    self.name,
                    sorted({len(g) for g in groups}),
                    self.options.mode,
                )
            mine = groups[call.rank :: call.world]  # each process judges its share of the whole groups
            judgements, alone = build_judgements(
                self.mode, self.options, call.prompts, texts, mine, call.columns, self._judgement_prompt, self.name
            )
            asked = yield from ask_verdicts(self.mode, self.options, judgements)
            counts, verdicts, masses = asked.counts, asked.verdicts, asked.masses
            lone = self.mode.lone_reward(self.options)
            values, missing = aggregate(self.mode, judgements, verdicts, [i for g in mine for i in g], alone, lone)
            masked = {i for k in asked.failed for i in judgements[k].samples} if self.masks_failures else set()
            missing["unparsed"] = [i for i in missing["unparsed"] if i not in masked]
            for reason, samples in missing.items():
                fallback = self.overlength_reward if reason == "overlength" else self.options.unparsed_reward
                if samples and fallback is None:
                    raise ValueError(failure_message(self, reason, samples, asked.unparsed_text))
                values.update({i: float(fallback) for i in samples})
            values.update(dict.fromkeys(masked, float("nan")))  # no reward: None to TRL
        except Exception as err:
            if world == 1:
                raise
            error = err
        what = f"{self.name}: share the rewards of the whole GRPO groups"
        values = yield from shared_values(values, world, what, error)
        everything = torch.full((len(call.prompts),), float("nan"), dtype=torch.float64)
        if call.to_score:
            judged = torch.tensor([values[i] for i in call.to_score], dtype=torch.float64)
            everything[torch.tensor(call.to_score)] = judged
        everything = self._filled(everything, call.empty, (call.prompts, call.completions), whole=call.world > 1)
        log_metric = kwargs.get("log_metric")
        own = everything[call.offset : call.offset + len(prompts)]
        out = self._finish(own, len(empty), log_metric, samples=(prompts, completions, completion_ids))
        if log_metric is not None and len(prompts):
            more = {**counts, "num_single": float(len(alone)), **self.mode.metrics(verdicts)}
            if masses:
                more["rating_mass"] = sum(masses) / len(masses)
            for key, value in more.items():
                log_metric(f"{self.metric_prefix}/{key}", value)
        return JudgeCall(out, judgements)

    def judge_items(
        self, contexts: Sequence[Any], shown: Sequence[Sequence[Any]], **columns: Any
    ) -> JudgeVerdicts | Any:
        """Verdicts on given items, for evaluation: one judgement per item, showing the completions `shown[k]` in
        that order for `contexts[k]`, as the mode fills its template (one completion for a pointwise judge, two for a
        pairwise one; `swap` is the caller's). `columns`: the template's dataset columns, one value per item.

        Returns:
            `JudgeVerdicts` (a coroutine of one when servers judge): `values` in the mode's verdict format (None
            where none was read) and the costs.
        """
        return self._drive(self._items(contexts, shown, columns))

    def _items(self, contexts, shown, columns) -> Generator[LabelLogprobs | Generate, Any, JudgeVerdicts]:
        optional = self.mode.optional_columns(self.options)
        values = template_columns(self.columns, columns, len(contexts), self.name, optional)
        wrong = [i for i, item in enumerate(shown) if self.mode.shows is not None and len(item) != self.mode.shows]
        if len(shown) != len(contexts) or wrong:
            raise ValueError(
                f"{self.name}: a {self.options.mode} judge shows {self.mode.shows} completion(s) per judgement, one "
                f"list per context; got {len(shown)} lists for {len(contexts)} contexts, wrong lengths at {wrong[:10]}"
            )
        judgements, seen = [], {}
        for i, context in enumerate(contexts):
            texts = [self.mode.shown_text(c, self.strip_reasoning) for c in shown[i]]
            row = {c: values[c][i] for c in values}
            prompt = self._judgement_prompt(context, texts, row)
            key = repr((context, texts, row))  # the same judgement asked again (a GenRM's k judges): sampled apart
            seen[key] = copy = seen.get(key, -1) + 1
            judgements.append(Judgement(tuple(range(len(shown[i]))), *prompt, copy=copy))
        asked = yield from ask_verdicts(self.mode, self.options, judgements)
        tokens = sum(len(j.prompt) for j in judgements) if self.tokens else None
        return JudgeVerdicts(asked.verdicts, asked.counts, asked.masses, tokens)

    def verdicts(
        self, contexts: Sequence[Any], completions: Sequence[Any], others: Sequence[Any] | None = None, **columns: Any
    ) -> JudgeVerdicts | Any:
        """`judge_items` with one completion per item, or `completion` shown before `other` (a pairwise judge's
        preference for the first).

        Raises:
            ValueError: a number of completions per item that the mode does not show.
        """
        shown = [(c,) for c in completions] if others is None else list(zip(completions, others))
        return self.judge_items(contexts, shown, **columns)

    def judge_pairs(self, pairs: Sequence[EvalPair]) -> PairVerdicts:
        """Preference pairs judged as the mode judges them (`JudgeMode.judge_pairs`), for `trl-rm-env eval`."""
        return self.mode.judge_pairs(self._ask, pairs, self.options)

    def judge_ties(self, pairs: Sequence[EvalPair]) -> list[bool] | None:
        """Whether the judge calls each tied pair a tie (`JudgeMode.judge_ties`; None: its mode cannot say)."""
        return self.mode.judge_ties(self._ask, pairs, self.options)

    def _ask(self, contexts: Sequence[Any], shown: Sequence[Sequence[Any]]) -> JudgeVerdicts:
        import asyncio

        found = self.judge_items(contexts, shown)
        return asyncio.run(found) if asyncio.iscoroutine(found) else found

    def _judgement_prompt(self, context: Any, texts: list[str], row: dict[str, Any]) -> tuple[Any, bool]:
        """A judgement's prompt showing `texts` for `context` (`row`: the dataset columns it reads), as token ids or
        as the message list for a chat server, and whether it is over-length: the mode's own messages, or its
        template filled and sent as one user message."""
        scoring = self.options.scoring
        chat = self.mode.messages(context, texts, self.options, row)
        if chat is None:
            values = {"prompt": T.prompt_text(context), **row, **self.mode.fill(texts, self.options)}
            values["answer_format"] = self.mode.answer_format(scoring, **values)
            chat = T.judge_chat(T.fill(self.template, values))
        if not self.tokens:
            return chat, False
        ids = encode_messages(self.tokenizer, chat, add_generation_prompt=True, **self.template_kwargs)
        longest = self.engine.max_length
        room = 1 if scoring == "logprobs" else self.options.max_new_tokens
        return ids, longest is not None and len(ids) + room > longest

    def __repr__(self) -> str:
        where = f"remote_url={self.remote_url!r}" if self.remote_url else f"engine={self.engine.name!r}"
        return f"{type(self).__name__}(name={self.name!r}, mode={self.options.mode!r}, scoring={self.options.scoring!r}, {where})"
