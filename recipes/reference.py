"""docs/options.md's tables, generated from the options' declarations: every option with its default, its
command-line flag, its recipe key, its NeMo RL key and where it is refused (`scripts/make_options_doc.py` writes
them; `tests/test_options.py` checks the page is current)."""

from __future__ import annotations

import argparse
from typing import Any

from trl_rm_env.options import default_of, flag_of, option_fields, recipe_key, spelling

from .cli import build_parser
from .serve import SERVE_DEFAULTS
from .spellings import text_choices


def command_flags(parser: argparse.ArgumentParser) -> dict[str, dict[str, str]]:
    """`{option name: {command: flag}}` of every flag of the `trl-rm-env` subcommands whose destination is an option
    (aliases left out)."""
    out: dict[str, dict[str, str]] = {}
    for action in parser._subparsers._group_actions:  # the subcommands
        for command, sub in action.choices.items():
            for arg in sub._actions:
                if arg.option_strings and arg.help != argparse.SUPPRESS:
                    out.setdefault(arg.dest, {})[command] = arg.option_strings[0]
    return out


def _code(value: Any) -> str:
    return f"`{value}`" if not isinstance(value, str) or value else '`""`'


def options_reference() -> str:
    """The tables of docs/options.md: every option of every options class, with its default, its command-line flag,
    its recipe key, its NeMo RL key and what it does, generated from the declarations (`scripts/make_options_doc.py`
    writes them; `tests/test_options.py` checks the page is current)."""
    from trl_rm_env.judges.judge_options import JudgeOptions, JudgeSource
    from trl_rm_env.rewards.base import RewardOptions
    from trl_rm_env.rewards.ensemble import EnsembleOptions
    from trl_rm_env.rewards.nemo import NEMO_OPTIONS, NEMO_SHAPING_KEYS
    from trl_rm_env.rewards.reference_bound import ReferenceBound
    from trl_rm_env.rewards.shaping import GroupShaping, LengthShaping
    from trl_rm_env.runtime.model_options import ScoringOptions
    from trl_rm_env.serving.client.remote_options import RemoteOptions
    from trl_rm_env.serving.server.limits import ServerLimits

    flags_by_option = command_flags(build_parser())
    nemo: dict[str, list[str]] = {}
    for key, name in NEMO_OPTIONS.items():
        nemo.setdefault(name, []).append(key)
    sections = [
        ("`ScoringOptions`", ScoringOptions, "How a reward model is loaded and scores "
         "(`trl_rm_env.runtime.model_options`): the `ModelOptions` of any model we run (the rows down to `model_init_kwargs`, which a judge takes too), then "
         "the reward model's own (`truncation`, `nonfinite_reward`, its head's)."),
        ("`RewardOptions`", RewardOptions, "What the GRPO reward function does with the scores "
         "(`trl_rm_env.rewards.base`)."),
        ("`GroupShaping`", GroupShaping, "How a GRPO group's rewards are shaped: NeMo Gym's bonuses and length and "
         "style adjustments, for a reward model or a judge (`trl_rm_env.rewards.shaping`)."),
        ("`LengthShaping`", LengthShaping, "NeMo RL's GRPO reward shaping by response length (`grpo.reward_shaping`: "
         "DAPO's overlong buffer, the stop-properly penalty), for a reward model or a judge "
         "(`trl_rm_env.rewards.shaping`)."),
        ("`ReferenceBound`", ReferenceBound, "A reward model's reward bounded against the dataset's reference answer "
         "(Preference As Reward; `trl_rm_env.rewards.reference_bound`)."),
        ("`EnsembleOptions`", EnsembleOptions, "A multi-head reward model's heads, read in one forward, aggregated "
         "into one reward (`trl_rm_env.rewards.ensemble`; separate reward models: `EnsembleReward`)."),
        ("`RemoteOptions`", RemoteOptions, "How the client reaches reward-model servers, with `remote_url` "
         "(`trl_rm_env.serving.client.remote_options`)."),
        ("`ServerLimits`", ServerLimits, "What `trl-rm-env serve` accepts from its clients "
         "(`trl_rm_env.serving.server.limits`)."),
        ("`JudgeSource`", JudgeSource, "Which judge `eval` and the GRPO recipe add, and where it runs "
         "(`trl_rm_env.judges.judge_options`)."),
        ("`JudgeOptions`", JudgeOptions, "How a generative judge judges, and how its verdicts become rewards "
         "(`trl_rm_env.judges.judge_options`; the judge also takes the `ModelOptions`, `RewardOptions` and "
         "`RemoteOptions`: docs/judges.md)."),
    ]  # fmt: skip
    lines: list[str] = []
    for title, cls, intro in sections:
        scoring = cls is ScoringOptions
        remote_column = " with `remote_url` |" if scoring else ""
        lines += [f"### {title}", "", intro, "",
                  f"| option | default | command line | recipe key | NeMo RL |{remote_column} what it does |",
                  "|---|---|---|---|---|" + ("---|" if scoring else "") + "---|"]  # fmt: skip
        for f in option_fields(cls):
            default = _code(default_of(f))
            if f.name in SERVE_DEFAULTS and cls is ScoringOptions:
                default += f" (`serve`: `{SERVE_DEFAULTS[f.name]}`)"
            commands = {c: flag for c, flag in flags_by_option.get(f.name, {}).items() if flag == flag_of(f)}
            by_flag: dict[str, list[str]] = {}
            for command, flag in commands.items():
                by_flag.setdefault(flag, []).append(command)
            cli = "; ".join(f"`{flag}` ({', '.join(sorted(cmds))})" for flag, cmds in by_flag.items()) or "-"
            key = f"`{recipe_key(f)}`" if recipe_key(f) and cls is not ServerLimits else "-"
            nemo_keys = ", ".join(f"`{k}`" for k in nemo.get(f.name, [])) if scoring else ""
            if cls is LengthShaping and f.name in NEMO_SHAPING_KEYS:
                nemo_keys = f"`grpo.reward_shaping.{f.name}`"
            help_text = f.metadata.get("help", "").replace("|", "\\|")
            choices = text_choices(f)
            if choices:
                help_text += " Choices: " + ", ".join(f"`{c}`" for c in choices) + "."
            remote = (" applies |" if spelling(f).remote else " refused |") if scoring else ""
            lines.append(f"| `{f.name}` | {default} | {cli} | {key} | {nemo_keys or '-'} |{remote} {help_text} |")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"
