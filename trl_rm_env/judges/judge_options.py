"""`JudgeOptions`: what a generative judge is asked and how its answer becomes a reward, each option declared once.

A judge's other options are declared where they already live: how the judge model loads and runs (`engine`,
`precision`, `max_length`, `batch_size`, `vllm_*`, `template_kwargs`, `strip_reasoning`, ...) in `ScoringOptions`, what
the reward function does with the rewards in `RewardOptions`, how servers are reached in `RemoteOptions`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ..options import ENGINES, check_choices, document, option
from .modes import MODES

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
        "`trl_rm_env.judges.modes.register_mode`.",
        **_judge("mode"),
    )
    scoring: str = option(
        "logprobs",
        choices=SCORINGS,
        help="`logprobs`: the verdict is read from the judge's next-token probabilities over the verdict tokens (one "
        "forward, exact, nothing to parse); `generate`: the judge writes (and may reason), then the verdict is "
        "parsed from its text.",
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
    parse_retries: int = option(
        2, help="`generate`: how many times an unparseable judgement is asked again.", **_judge("parse_retries")
    )
    unparsed_reward: float | None = option(
        None,
        help="`generate`: the reward of a completion whose judgements stayed unparseable after the retries (counted "
        "in `judge_env/num_unparsed`). None: an error naming the samples.",
        **_judge("unparsed_reward"),
    )

    def __post_init__(self) -> None:
        check_choices(self)
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

        check_choices(self)
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
