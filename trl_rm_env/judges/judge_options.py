"""`JudgeOptions`: what a generative judge is asked and how its answer becomes a reward, each option declared once.

A judge's other options are declared where they already live: how the judge model loads and runs (`engine`,
`precision`, `max_length`, `batch_size`, `vllm_*`, `template_kwargs`, `strip_reasoning`, ...) in `ModelOptions`, what
the reward function does with the rewards in `RewardOptions`, how servers are reached in `RemoteOptions`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ..options import ENGINES, build, changed, check_choices, document, option
from ..runtime.engines.registry import check_engine
from .builtin_modes import MODES
from .genrm import AGGREGATORS, FAILED_JUDGEMENTS, PAIR_STRATEGIES, VERDICT_RANGES

SCORINGS = ("logprobs", "generate")
PAIRINGS = ("all", "circular")


def _judge(name: str) -> dict[str, str]:
    """A judge option's spellings: `--judge-<name>` and `reward_judge_<name>`."""
    return {"flag": "--judge-" + name.replace("_", "-"), "recipe": "reward_judge_" + name}


@document
@dataclass(frozen=True)
class JudgeOptions:
    """How a generative judge judges and how its verdicts become rewards (the `Args` below are generated from the
    fields).

    Raises:
        ValueError: a value outside an option's choices, `max_score < 2`, a negative `parse_retries`, or
            `max_new_tokens < 1`.
    """

    mode: str = option(
        "pointwise",
        choices=MODES,
        help="`pointwise`: one judgement per completion; `pairwise`: the completions of a GRPO group compared in "
        "pairs; `listwise`: one judgement over the whole group; or a mode registered with "
        "`trl_rm_env.judges.builtin_modes.register_mode`.",
        **_judge("mode"),
    )
    scoring: str | None = option(
        None,
        choices=SCORINGS,
        help="`logprobs`: the verdict is read from the judge's next-token probabilities over the verdict tokens (one "
        "forward, exact, nothing to parse); `generate`: the judge writes (and may reason), then the verdict is "
        "parsed from its text. None: the mode's own (`logprobs`; `generate` for `genrm`, which writes its verdict).",
        **_judge("scoring"),
    )
    pairs: str = option(
        "all",
        choices=PAIRINGS,
        help="Pairwise: which pairs of a group of N are judged: `all` (N(N-1)/2) or `circular` (i against i+1, N).",
        **_judge("pairs"),
    )
    swap: bool = option(
        True,
        help="Judge each pair (pairwise) or list (listwise) in both orders and average, cancelling position bias "
        "(twice the judgements).",
        **_judge("swap"),
    )
    max_score: int = option(
        9,
        help="Pointwise: ratings run from 1 to this (>= 2; with `logprobs` each rating must be one token of the "
        "judge's tokenizer); the reward is the rating.",
        **_judge("max_score"),
    )
    template: str | None = option(
        None,
        help="The judge's prompt, with named fields (`{prompt}`, `{completion}`; `{completion_a}`, "
        "`{completion_b}`; `{completions}`; `{max_score}`, `{answer_format}`; any dataset column TRL passes). None: "
        "the built-in template of the mode (`trl_rm_env.judges.templates`).",
        **_judge("template"),
    )
    single_reward: float = option(
        0.5,
        help="Pairwise and listwise: the reward of a completion alone in its group (nothing to compare it with).",
        **_judge("single_reward"),
    )
    max_new_tokens: int = option(
        512, help="`generate`: most tokens the judge writes per judgement.", **_judge("max_new_tokens")
    )
    temperature: float = option(
        0.0,
        help="`generate`: sampling temperature of the first try (0: greedy); retries sample at 1.0 when it is 0.",
        **_judge("temperature"),
    )
    top_p: float = option(
        1.0,
        help="`generate` with `temperature > 0`: sample from the smallest set of tokens holding this much probability "
        "(1: all of them).",
        **_judge("top_p"),
    )
    parse_retries: int = option(
        2, help="`generate`: how many times an unparseable judgement is asked again.", **_judge("parse_retries")
    )
    unparsed_reward: float | None = option(
        None,
        help="`generate`: the reward of a completion whose judgements stayed unparseable after the retries (counted "
        "in `judge_env/num_unparsed`). None: an error naming the samples.",
        **_judge("unparsed_reward"),
    )

    comparison_strategy: str = option(
        "circular",
        choices=PAIR_STRATEGIES,
        help="`genrm`: the ordered pairs of a group of N it compares: `circular` (i against i+1 mod N: N "
        "comparisons, two for N = 2) or `all_pairs` (i < j, the lower index shown first), NeMo Gym's "
        "`comparison_strategy`.",
        **_judge("comparison_strategy"),
    )
    judges_per_comparison: int = option(
        1,
        help="`genrm`: how many times each pair is judged (sampled apart); a response gets the mean of all it "
        "received. NeMo Gym's `num_judges_per_comparison`.",
        **_judge("judges_per_comparison"),
    )
    aggregator: str = option(
        "simple_tiebreaker",
        choices=AGGREGATORS,
        help="`genrm`: what a response receives from a comparison: `simple_tiebreaker` (its score; equal scores "
        "split by the ranking), `individual_scores` (its score) or `weighted_win_loss` (points from the ranking). "
        "NeMo Gym's `aggregator_method`.",
        **_judge("aggregator"),
    )
    principle: str | None = option(
        None,
        help="`genrm`: a principle message (role `principle`) sent before the two responses, for a GenRM whose chat "
        "template reads one. None: none (NeMo Gym's `use_principle: false`); with `principle_column`, the text of "
        "rows that have none.",
        **_judge("principle"),
    )
    principle_column: str | None = option(
        None,
        help="`genrm`: the dataset column holding each row's principle (NeMo Gym reads `principle`); a row whose "
        "value is None gets `principle`, or, without it, an error naming the samples.",
        **_judge("principle_column"),
    )
    default_score: float = option(
        3.0,
        help="`genrm`: the score a verdict lacks (`score_1`, `score_2`), of a failed judgement, and the reward of a "
        "response alone in its group (NeMo Gym's `default_score`).",
        **_judge("default_score"),
    )
    default_ranking: float = option(
        3.5, help="`genrm`: the ranking a verdict lacks, and a failed judgement's.", **_judge("default_ranking")
    )
    failed_judgement: str = option(
        "neutral",
        choices=FAILED_JUDGEMENTS,
        help="`genrm`: a comparison without a verdict after the retries, or whose request failed: `neutral` counts "
        "it as `(default_score, default_score, default_ranking)` (NeMo Gym's); `masked` gives its responses no "
        "reward (None, which TRL leaves out of the loss). Counted in `judge_env/num_failed` either way.",
        **_judge("failed_judgement"),
    )
    verdict_ranges: str = option(
        "protocol",
        choices=VERDICT_RANGES,
        help="`genrm`: `protocol` holds a verdict to genrm_compare's ranges (scores 1-5, ranking 1-6): one that "
        "writes a value outside them (a broken GenRM, or one a policy's answer talked into it) is no verdict, asked "
        "again, then a failed judgement (`failed_judgement`, counted in `judge_env/num_failed`); `any` takes any "
        "finite value, as NeMo Gym's parser does, for a GenRM trained with other ranges.",
        **_judge("verdict_ranges"),
    )

    @classmethod
    def build(cls, options: JudgeOptions | None = None, **values: Any) -> JudgeOptions:
        """`options` (default: the defaults) with `values` replacing some; a new `mode` without a `scoring` gets
        the new mode's own scoring (unless `options` had one of its own that the mode reads).

        Raises:
            TypeError: a name that is not an option, listing the options.
        """
        if options is not None and "mode" in values and "scoring" not in values:
            own = options.scoring != options.resolved_defaults()["scoring"]
            if not own or options.scoring not in MODES[values["mode"]].scorings:
                values["scoring"] = None
        return build(cls, options, **values)

    def resolved_defaults(self) -> dict[str, Any]:
        """The defaults that depend on the mode: `scoring` (None is the mode's own)."""
        return {"scoring": MODES[self.mode].scorings[0]}

    def __post_init__(self) -> None:
        check_choices(self)
        mode = MODES[self.mode]
        if self.scoring is None:
            object.__setattr__(self, "scoring", self.resolved_defaults()["scoring"])
        if self.scoring not in mode.scorings:
            readable = " or ".join(mode.scorings)
            raise ValueError(f"a {self.mode} judge reads its verdict by {readable}, not {self.scoring}")
        if not mode.templated and self.template is not None:
            raise ValueError(f"a {self.mode} judge sends its own messages: it takes no template")
        given = changed(self)
        others = sorted(
            {name for other in MODES.values() for name in other.own_options - mode.own_options if name in given}
            | (mode.refuses & set(given))
        )
        if others:
            raise ValueError(f"{', '.join(others)}: options of another mode than {self.mode!r}")
        if self.judges_per_comparison < 1:
            raise ValueError(f"judges_per_comparison must be >= 1, got {self.judges_per_comparison}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.max_score < 2:
            raise ValueError(f"max_score must be >= 2, got {self.max_score}")
        if self.parse_retries < 0:
            raise ValueError(f"parse_retries must be >= 0, got {self.parse_retries}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")


@document
@dataclass(frozen=True)
class JudgeSource:
    """Which judge a command or a recipe adds, and where it runs: `trl-rm-env eval`'s `--judge`, `--judge-url`,
    `--judge-tokenizer`, `--judge-engine` and `--judge-options`, and the GRPO recipe's `reward_judge`,
    `reward_judge_url`, ... (both generated from these fields). `arguments` turns them, with the `JudgeOptions`
    given, into `JudgeEnvironment`'s arguments."""

    judge: str | None = option(
        None,
        help="A generative judge (a causal LM: Hub id or local path); with `judge_url`, the model name sent to the "
        "servers (None there: the server's own).",
        metavar="MODEL",
    )
    judge_url: list[str] | None = option(
        None,
        help="Judge on OpenAI-compatible servers at these URLs (`trl-rm-env serve --engine vllm --model JUDGE`, "
        "`vllm serve`) instead of loading the judge here.",
        text=list,
        metavar="URL",
    )
    judge_tokenizer: str | None = option(
        None,
        help="The judge's tokenizer (default: the judge's own; with `judge_url`, judgements go as token ids rendered "
        "with it, else as messages).",
    )
    judge_engine: str | None = option(
        None,
        choices=ENGINES,
        help="What runs a judge loaded here: `vllm`, `hf` (transformers in this process) or `auto` (vLLM where it is "
        "installed and can run the judge, else hf). None: `auto`. Not with `judge_url` (the servers run it).",
    )
    judge_options: Mapping[str, Any] | str | None = option(
        None,
        help="More `JudgeEnvironment` options as a mapping (JSON on the command line): how the judge loads and runs "
        "(`precision`, `max_length`, `template_kwargs`, ...), its reward function (`name`, `normalization`, ...) "
        "and its servers (`timeout`, ...).",
        text=dict,
    )

    def __post_init__(self) -> None:
        from ..runtime.model_options import json_object  # here: the command line reads this class without torch

        check_choices(self, skip=("judge_engine",))
        if self.judge_engine is not None:
            check_engine(self.judge_engine, "judge_engine")  # as `ModelOptions.engine`: a registered engine too
        object.__setattr__(self, "judge_options", json_object(self.judge_options) or None)

    def arguments(
        self, options: Mapping[str, Any], spelled: Callable[[str], str], **defaults: Any
    ) -> dict[str, Any] | None:
        """`JudgeEnvironment`'s arguments (`model` and the rest by name), or None when no judge is given (neither
        `judge` nor `judge_url`). `options`: the `JudgeOptions` given (not at their defaults); `spelled(name)`: how
        the user spells a field or option, for messages; `defaults`: options a command sets unless given.

        Raises:
            ValueError: options of a judge without one, `judge_options` that names the model or its servers (or an
                engine beside `judge_engine`), or `judge_engine` with `judge_url`; each named as it was spelled
                (`judge_options` that is not a JSON object, or an unknown engine, fails when the class is built).
        """
        if self.judge is None and not self.judge_url:
            given = [spelled(n) for n in ("judge_tokenizer", "judge_engine", "judge_options") if getattr(self, n)]
            given += [spelled(n) for n in sorted(options)]
            if given:
                raise ValueError(
                    f"{', '.join(given)}: options of a judge; give {spelled('judge')} (or {spelled('judge_url')})"
                )
            return None
        more = dict(self.judge_options or {})
        if {"model", "remote_url"} & set(more):
            raise ValueError(
                f"{spelled('judge_options')}: the judge is {spelled('judge')} and its servers {spelled('judge_url')}"
            )
        if self.judge_engine is not None:
            if "engine" in more:
                raise ValueError(f"{spelled('judge_options')}: the judge's engine is {spelled('judge_engine')}")
            if self.judge_url:
                raise ValueError(
                    f"{spelled('judge_engine')}: applies to a judge loaded here; at {spelled('judge_url')} the servers "
                    "run it"
                )
            more["engine"] = self.judge_engine
        kwargs = {**defaults, **more, **options}
        if self.judge_tokenizer is not None:
            kwargs["tokenizer"] = self.judge_tokenizer
        if self.judge_url:
            kwargs["remote_url"] = list(self.judge_url)
        return {"model": self.judge, **kwargs}
