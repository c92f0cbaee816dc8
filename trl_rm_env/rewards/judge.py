"""`JudgeEnvironment`: a generative judge (a causal LM) as a GRPO reward function, pointwise, pairwise over a GRPO
group, or listwise, read from log-probabilities or parsed from generated text."""

from __future__ import annotations

import inspect
import logging
import os
from collections.abc import Callable, Generator, Mapping, Sequence
from typing import Any

import torch
from transformers import PreTrainedModel

from ..data.messages import strip_completion_reasoning
from ..distributed import full_weights
from ..judges import templates as T
from ..judges.engines import judge_engine
from ..judges.judge_options import JudgeOptions
from ..judges.judging import (
    Judgement,
    JudgeVerdicts,
    aggregate,
    build_judgements,
    failure_message,
    from_logprobs,
    group_samples,
    template_columns,
)
from ..judges.modes import EvalPair, JudgeMode, PairVerdicts, mode_of
from ..judges.remote import RemoteJudgeEngine, remote_judge_tokenizer
from ..judges.verdicts import label_token_ids
from ..options import build, changed, names, route, spelled
from ..runtime.loading import load_tokenizer
from ..runtime.model_options import ScoringOptions
from ..runtime.plan import plan_model
from ..serving.client.remote_options import RemoteOptions, local_only
from ..tokenization import encode_messages
from .base import Ids, RewardFunction, RewardOptions, Samples
from .pickling import PicklesByArguments, accelerator_type
from .placement import loaded_here

logger = logging.getLogger(__name__)

OWN_ARGUMENTS = ("model", "tokenizer", "remote_url", "options", "scoring_options")
OPTION_CLASSES = (JudgeOptions, ScoringOptions, RewardOptions, RemoteOptions)
"""Where the judge's options are declared: how it judges, how the judge model loads and runs, what the reward function
does with the rewards, and how servers are reached (with `remote_url`)."""
NOT_FOR_JUDGES = ("label_index", "attribute_weights", "reward_model_type", "truncation", "nonfinite_reward")
"""`ScoringOptions` of a reward model's head, context truncation and NaN scores: refused for a judge (cutting a judge's
prompt would cut its instructions: an over-long judgement gets `overlength_reward` or fails; NaN logits leave the
verdict tokens no probability: that judgement has no verdict, `unparsed_reward` or an error)."""


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
        options: A `JudgeOptions` instance; `scoring_options`: a `ScoringOptions` instance. Any option of either may
            also be given by name.
        **options_by_name: Every option of `JudgeOptions` (`mode`, `scoring`, `pairs`, `swap`, `max_score`,
            `template`, ...), of `ScoringOptions` that applies to a causal LM (`engine`, `precision`, `max_length`,
            `batch_size`, `max_tokens_per_batch`, `template_kwargs`, `strip_reasoning`, `overlength_reward`,
            `vllm_*`, ...), of `RewardOptions` (`name`, default `judge`; `normalization`, `clip`,
            `empty_completion_reward`) and, with `remote_url`, of `RemoteOptions` (`remote_input`, `timeout`,
            `retries`, ...).

    Raises:
        TypeError: an unknown keyword argument (the accepted ones are listed), or no model and no `remote_url`.
        ValueError: a bad option value, a reward-model-only option, a template without the mode's fields, a verdict
            that is not one token of the judge's tokenizer (`logprobs`), or a model that is not a causal LM.
    """

    metric_prefix = "judge_env"

    def __init__(
        self,
        model: str | os.PathLike | PreTrainedModel | None = None,
        tokenizer: Any = None,
        *,
        remote_url: str | Sequence[str] | None = None,
        options: JudgeOptions | None = None,
        scoring_options: ScoringOptions | None = None,
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
        judge_values, scoring_values, reward_values, remote_values = route(
            options_by_name, *OPTION_CLASSES, own=OWN_ARGUMENTS
        )
        self.options = judge = build(JudgeOptions, options, **judge_values)
        scoring = ScoringOptions.build(scoring_options, **scoring_values)
        refused = sorted(set(changed(scoring)) & set(NOT_FOR_JUDGES))
        if refused:
            raise ValueError(
                f"{spelled(ScoringOptions, refused)}: options of a reward model's head, truncation or NaN scores, not "
                "of a judge (an over-long judgement gets overlength_reward; a judgement without a verdict, "
                "unparsed_reward)"
            )
        reward = RewardOptions(**{"name": "judge", **reward_values})
        self._check_template(judge)
        self.scoring_options = scoring
        if loaded_here(type(self).__name__, "judge", model, remote_url, remote_values, "judge"):
            plan = plan_model(model, scoring, kind="judge")
            self.tokenizer, self.tokens, self.remote_url = load_tokenizer(plan, tokenizer), True, None
            self._labels_of(judge, reward.name)  # a verdict that is not one token fails before the model loads
            self.engine = judge_engine(plan, self.tokenizer)
            self._built_on = accelerator_type(self.engine.device)
        else:
            remote = RemoteOptions(**remote_values)
            if remote.remote_api != "pooling":
                raise ValueError("remote_api is the dialect of reward-model servers; a judge speaks OpenAI's API")
            self.tokenizer = remote_judge_tokenizer(tokenizer, model, remote.remote_input, reward.name)
            self.tokens = self.tokenizer is not None and remote.remote_input != "messages"
            # Rendered here (token ids): the prompt's length is known here, so over-long judgements are ours.
            local = sorted(set(local_only(scoring)) - ({"overlength_reward"} if self.tokens else set()))
            if local:
                raise ValueError(
                    f"{spelled(ScoringOptions, local)}: applied by a judge loaded in this process, not by one behind "
                    "servers; give them to the server or drop them"
                )
            self._labels_of(judge, reward.name)
            self.engine = RemoteJudgeEngine(
                remote_url,
                model=model,
                tokens=self.tokens,
                options=remote,
                max_length=scoring.max_length if self.tokens else None,
                template_kwargs=scoring.template_kwargs,
            )
            self.remote_url = self.engine.bases
            if not self.tokens:
                logger.warning(
                    "%s: judgements go to the server as messages, which it renders with its own chat template: "
                    "special-token text in a completion is read there as control tokens (a policy could forge the "
                    "judge's turns), and verdict log-probabilities come from its top 20. Give the judge's tokenizer "
                    "to send token ids.",
                    reward.name,
                )
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
        self.columns = sorted(T.check_template(self.template, self.mode))
        self.template_kwargs = scoring.template_kwargs
        self.overlength_reward = scoring.overlength_reward
        self.labels, self.label_ids = self._labels_of(judge, reward.name)
        self.show_progress = scoring.show_progress
        self._setup(self.engine, reward, strip_reasoning=scoring.strip_reasoning)
        self.last_judgements: list[Judgement] = []  # the judgements of the last call (tests, debugging)
        self._unparsed_text = ""  # an answer no verdict could be read from, for the error
        self._warned_groups = False

    def replace(self, **values: Any) -> JudgeEnvironment:
        """Another reward function on the same judge (its engine is shared, nothing loads again) with some
        `JudgeOptions` or `RewardOptions` changed: `judge.replace(mode="pairwise", name="pairwise_judge")`.

        Raises:
            TypeError: a name that is not a `JudgeOptions` or `RewardOptions` option (a `ScoringOptions` one needs a
                new judge: it says how the model loads and runs).
        """
        judge_values, reward_values = route(values, JudgeOptions, RewardOptions, what="option")
        self.engine  # noqa: B018 - an unpickled judge loads before it is shared
        other = object.__new__(type(self))  # shares the engine; pickles as a new judge with these options
        other.__dict__.update(self.__dict__)
        other._remember(**{**self._arguments, **values})
        other._configure(
            build(JudgeOptions, self.options, **judge_values),
            build(RewardOptions, self.reward_options, **reward_values),
        )
        other._calls = self._calls  # one engine, one call at a time
        return other

    def _labels_of(self, judge: JudgeOptions, name: str) -> tuple[list[str], list[int] | None]:
        """The verdict labels of the mode, and their token ids where they are read by id (`logprobs` with the
        judge's tokenizer).

        Raises:
            ValueError: a verdict that is not one token of the judge's tokenizer.
        """
        labels = mode_of(judge.mode).labels(judge)
        if judge.scoring != "logprobs" or self.tokenizer is None:
            return labels, None
        return labels, label_token_ids(self.tokenizer, labels, name)

    @classmethod
    def argument_names(cls) -> set[str]:
        """Every keyword argument: the judge's own and every option's."""
        return {"remote_url"} | {name for options in OPTION_CLASSES for name in names(options)}

    # ------------------------------------------------------------------ the reward function
    @property
    def __signature__(self) -> inspect.Signature:
        return inspect.signature(self.__call__)

    @property
    def __call__(self) -> Callable[..., Any]:
        """TRL's reward function, `(prompts, completions, completion_ids=None, **kwargs) -> list[float]`; a coroutine
        function when servers judge (TRL awaits it)."""
        if "_pending" in self.__dict__:  # unpickled, not loaded yet: a local one (a remote one is rebuilt at once)
            return self._rewards
        return self._rewards_async if self.engine.is_async else self._rewards

    @staticmethod
    def _pending_name(arguments: dict[str, Any]) -> str:
        return str(arguments.get("name", "judge"))

    def _rewards(
        self, prompts: Samples, completions: Samples, completion_ids: Ids = None, **kwargs: Any
    ) -> list[float]:
        return self._drive(self._judge(prompts, completions, kwargs))

    async def _rewards_async(
        self, prompts: Samples, completions: Samples, completion_ids: Ids = None, **kwargs: Any
    ) -> list[float]:
        return await self._drive_async(self._judge(prompts, completions, kwargs))

    def _drive(self, steps: Generator[tuple, Any, Any]) -> Any:
        """Run a call's generator on a local engine: each request it yields answered by `_run`."""
        # Entered on every rank, even one with nothing to judge: under ZeRO-3 and FSDP2 gathering is a collective.
        with self._calls, full_weights(self.engine.model, self.engine.sharding):
            try:
                request = next(steps)
                while True:
                    request = steps.send(self._run(request))
            except StopIteration as done:
                return done.value

    async def _drive_async(self, steps: Generator[tuple, Any, Any]) -> Any:
        """Run a call's generator on a remote engine, awaiting each request."""
        try:
            request = next(steps)
            while True:
                request = steps.send(await self._run(request))
        except StopIteration as done:
            return done.value

    def _run(self, request: tuple) -> Any:
        """One engine call: `("logprobs", prompts)` or `("generate", prompts, temperature, seed)`."""
        if request[0] == "logprobs":
            return self.engine.label_logprobs(request[1], self.label_ids, self.labels)
        _, prompts, temperature, seed = request
        return self.engine.generate(prompts, self.options.max_new_tokens, temperature, seed)

    # ------------------------------------------------------------------ one call
    def _judge(
        self, prompts: Samples, completions: Samples, kwargs: Mapping[str, Any]
    ) -> Generator[tuple, Any, list[float]]:
        """The whole reward call, yielding engine requests (`_run`) and receiving their answers."""
        empty, to_score, rewards = self._plan(prompts, completions)
        columns = template_columns(self.columns, kwargs, len(prompts), self.name)
        strip = self.strip_reasoning
        texts = {
            i: T.completion_text(strip_completion_reasoning(completions[i]) if strip else completions[i])
            for i in to_score
        }
        groups = group_samples(prompts, to_score, columns)
        if self.mode.compares and len({len(g) for g in groups}) > 1 and not self._warned_groups:
            self._warned_groups = True  # TRL split a group across processes, or a cascade left part of one
            logger.warning(
                "%s: the groups of this call have %s completions: a %s judge compares the completions of one call "
                "with equal prompts, so a GRPO group split across processes (or partly decided by an earlier cascade "
                "source) is compared in parts. Warned once.",
                self.name,
                sorted({len(g) for g in groups}),
                self.options.mode,
            )
        judgements, alone = build_judgements(
            self.mode, self.options, prompts, texts, groups, columns, self._prompt, self.name
        )
        self.last_judgements = judgements
        counts: dict[str, float] = {}
        masses: list[float] = []
        verdicts = yield from self._verdicts(judgements, counts, masses)
        values, missing = aggregate(self.mode, judgements, verdicts, to_score, alone, self.options.single_reward)
        for reason, samples in missing.items():
            fallback = self.overlength_reward if reason == "overlength" else self.options.unparsed_reward
            if samples and fallback is None:
                raise ValueError(failure_message(self, reason, samples))
            values.update({i: float(fallback) for i in samples})
        if to_score:
            rewards[torch.tensor(to_score)] = torch.tensor([values[i] for i in to_score], dtype=torch.float32)
        log_metric = kwargs.get("log_metric")
        out = self._finish(rewards, empty, log_metric)
        if log_metric is not None and len(prompts):
            for key, value in counts.items():
                log_metric(f"{self.metric_prefix}/{key}", value)
            log_metric(f"{self.metric_prefix}/num_single", float(len(alone)))
            if masses:
                log_metric(f"{self.metric_prefix}/rating_mass", sum(masses) / len(masses))
        return out

    def _verdicts(
        self, judgements: list[Judgement], counts: dict[str, float], masses: list[float]
    ) -> Generator[tuple, Any, list[Any]]:
        """Each judgement's verdict (None: over-length, or no verdict), yielding engine requests; fills `counts`
        (`num_judgements`, `num_overlength`, `num_retried`, `num_unparsed`) and `masses` (`logprobs`)."""
        mode, judge = self.mode, self.options
        verdicts: list[Any] = [None] * len(judgements)
        sendable = [k for k, j in enumerate(judgements) if not j.overlength]
        counts.update(num_judgements=float(len(judgements)), num_overlength=float(len(judgements) - len(sendable)))
        counts["num_retried"] = 0.0
        if judge.scoring == "logprobs" and sendable:
            answers = yield ("logprobs", [judgements[k].prompt for k in sendable])
            for k, logprobs in zip(sendable, answers):
                verdicts[k], mass = from_logprobs(mode, judgements[k], logprobs)
                masses.append(mass)
        elif judge.scoring == "generate":
            pending, temperature, last_texts = sendable, judge.temperature, {}
            for attempt in range(judge.parse_retries + 1):
                if not pending:
                    break
                if attempt:
                    counts["num_retried"] += len(pending)
                    temperature = judge.temperature if judge.temperature > 0 else 1.0
                answers = yield ("generate", [judgements[k].prompt for k in pending], temperature, attempt)
                for k, text in zip(pending, answers):
                    verdicts[k] = mode.from_text(judgements[k].samples, text, judge)
                last_texts.update(zip(pending, answers))
                pending = [k for k in pending if verdicts[k] is None]
            self._unparsed_text = last_texts[pending[0]] if pending else ""
        counts["num_unparsed"] = float(sum(1 for k in sendable if verdicts[k] is None))
        return verdicts

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
        steps = self._items(contexts, shown, columns)
        return self._drive_async(steps) if self.engine.is_async else self._drive(steps)

    def _items(self, contexts, shown, columns) -> Generator[tuple, Any, JudgeVerdicts]:
        values = template_columns(self.columns, columns, len(contexts), self.name)
        strip = self.strip_reasoning
        wrong = [i for i, item in enumerate(shown) if self.mode.shows is not None and len(item) != self.mode.shows]
        if len(shown) != len(contexts) or wrong:
            raise ValueError(
                f"{self.name}: a {self.options.mode} judge shows {self.mode.shows} completion(s) per judgement, one "
                f"list per context; got {len(shown)} lists for {len(contexts)} contexts, wrong lengths at {wrong[:10]}"
            )

        def text(completion: Any) -> str:
            return T.completion_text(strip_completion_reasoning(completion) if strip else completion)

        judgements = []
        for i, context in enumerate(contexts):
            fields = {"prompt": T.prompt_text(context), **{c: values[c][i] for c in values}}
            fields.update(self.mode.fill([text(c) for c in shown[i]], self.options))
            judgements.append(Judgement(tuple(range(len(shown[i]))), *self._prompt(fields)))
        counts: dict[str, float] = {}
        masses: list[float] = []
        found = yield from self._verdicts(judgements, counts, masses)
        tokens = sum(len(j.prompt) for j in judgements) if self.tokens else None
        return JudgeVerdicts(found, counts, masses, tokens)

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
        import asyncio

        def ask(contexts: Sequence[Any], shown: Sequence[Sequence[Any]]) -> JudgeVerdicts:
            found = self.judge_items(contexts, shown)
            return asyncio.run(found) if asyncio.iscoroutine(found) else found

        return self.mode.judge_pairs(ask, pairs, self.options)

    def _prompt(self, values: dict[str, Any]) -> tuple[Any, bool]:
        """A judgement's prompt (token ids, or the message list for a chat server) and whether it is over-length."""
        scoring = self.options.scoring
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
