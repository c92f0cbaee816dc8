"""`JudgeOptions` and `JudgeSource` (trl_rm_env/judges/judge_options.py): every judge option's spellings, every
refused value with its whole one-line message, and how `build` resolves a new mode's scoring.

Expected values are literals: the spellings are docs/options.md's table and docs/judges.md's rule (`--judge-<option>`
on the command line, `reward_judge_<option>` in the recipes), the messages are the product's text, and the
modes' scorings are those of docs/judges.md (pointwise, pairwise and listwise read `logprobs` by default or
`generate`; genrm only `generate`).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import re

import pytest

from trl_rm_env.judges import judge_options
from trl_rm_env.judges.builtin_modes import mode_of
from trl_rm_env.judges.judge_options import JudgeOptions, JudgeSource
from trl_rm_env.options import flag_of, recipe_key

FIELDS = ["mode", "scoring", "pairs", "swap", "max_score", "template", "single_reward", "max_new_tokens", "temperature",
          "top_p", "parse_retries", "unparsed_reward", "comparison_strategy", "judges_per_comparison", "aggregator",
          "principle", "principle_column", "default_score", "default_ranking", "failed_judgement", "verdict_ranges"]  # fmt: skip


def fresh_judge_options():
    """The module's source executed anew, as a fresh process imports it: the spellings are made once, when the
    class is declared, so this checks the declaration itself rather than the copy this process imported first."""
    spec = importlib.util.spec_from_file_location(judge_options.__name__, judge_options.__file__)
    module = importlib.util.module_from_spec(spec)  # not put in sys.modules: the loaded module stays the package's
    spec.loader.exec_module(module)
    return module


def test_every_judge_option_is_spelled_judge_dash_name_and_reward_judge_name():
    for cls in (JudgeOptions, fresh_judge_options().JudgeOptions):
        spellings = {f.name: (flag_of(f), recipe_key(f)) for f in dataclasses.fields(cls)}
        assert list(spellings) == FIELDS
        assert spellings["mode"] == ("--judge-mode", "reward_judge_mode")
        assert spellings["max_new_tokens"] == ("--judge-max-new-tokens", "reward_judge_max_new_tokens")
        assert spellings["judges_per_comparison"] == (
            "--judge-judges-per-comparison",
            "reward_judge_judges_per_comparison",
        )
        assert spellings["top_p"] == ("--judge-top-p", "reward_judge_top_p")
        for name, (flag, recipe) in spellings.items():
            assert flag == "--judge-" + "-".join(name.split("_")) and recipe == f"reward_judge_{name}"


def message(text: str) -> str:
    return "^" + re.escape(text) + "$"


def test_mode_of_an_unknown_name_lists_the_registered_modes():
    """`mode_of`, the registry's lookup (for a name that did not come through `JudgeOptions`), names every mode."""
    assert mode_of("pairwise").name == "pairwise"
    with pytest.raises(ValueError, match=message(
        "mode must be one of ['pointwise', 'pairwise', 'listwise', 'genrm'], got 'ranking'"
    )):  # fmt: skip
        mode_of("ranking")


@pytest.mark.parametrize(
    "values, error",
    [
        ({"mode": "ranking"}, "mode must be one of ['pointwise', 'pairwise', 'listwise', 'genrm'], got 'ranking'"),
        ({"mode": "genrm", "scoring": "logprobs"}, "a genrm judge reads its verdict by generate, not logprobs"),
        ({"mode": "genrm", "template": "{prompt}"}, "a genrm judge sends its own messages: it takes no template"),
        (
            {"aggregator": "individual_scores", "comparison_strategy": "all_pairs", "principle": "Be kind."},
            "aggregator, comparison_strategy, principle: options of another mode than 'pointwise'",
        ),
        ({"mode": "genrm", "swap": False, "max_score": 5}, "max_score, swap: options of another mode than 'genrm'"),
        ({"mode": "genrm", "judges_per_comparison": 0}, "judges_per_comparison must be >= 1, got 0"),
        ({"top_p": 0.0}, "top_p must be in (0, 1], got 0.0"),
        ({"top_p": 1.5}, "top_p must be in (0, 1], got 1.5"),
        ({"max_score": 1}, "max_score must be >= 2, got 1"),
        ({"parse_retries": -1}, "parse_retries must be >= 0, got -1"),
        ({"max_new_tokens": 0}, "max_new_tokens must be >= 1, got 0"),
        ({"temperature": -0.5}, "temperature must be >= 0, got -0.5"),
    ],
)
def test_a_refused_judge_option_is_one_line_naming_it(values, error):
    with pytest.raises(ValueError, match=message(error)):
        JudgeOptions(**values)


def test_the_bounds_themselves_are_accepted_and_scoring_resolves_to_the_modes_own():
    edge = JudgeOptions(top_p=1.0, max_score=2, parse_retries=0, max_new_tokens=1, temperature=0.0)
    assert (edge.top_p, edge.max_score, edge.parse_retries, edge.max_new_tokens) == (1.0, 2, 0, 1)
    assert JudgeOptions(mode="genrm", judges_per_comparison=1, top_p=1e-9).judges_per_comparison == 1
    assert JudgeOptions().scoring == "logprobs" and JudgeOptions(mode="genrm").scoring == "generate"
    assert JudgeOptions(mode="listwise", scoring="generate").scoring == "generate"
    assert JudgeOptions(mode="genrm").resolved_defaults() == {"scoring": "generate"}
    assert JudgeOptions(scoring="generate").resolved_defaults() == {"scoring": "logprobs"}


def test_build_gives_a_new_mode_its_own_scoring_unless_the_base_chose_one_it_reads():
    # No base: the defaults, then the mode's own scoring.
    assert JudgeOptions.build(mode="genrm").scoring == "generate"
    # The base's scoring was its mode's default: the new mode's own replaces it.
    assert JudgeOptions.build(JudgeOptions(), mode="genrm").scoring == "generate"
    assert JudgeOptions.build(JudgeOptions(mode="genrm"), mode="pointwise").scoring == "logprobs"
    # The base chose a scoring the new mode reads: kept.
    assert JudgeOptions.build(JudgeOptions(scoring="generate"), mode="pairwise").scoring == "generate"
    # Scoring given with the mode: as given; no mode given: nothing resolved again.
    assert JudgeOptions.build(JudgeOptions(mode="genrm"), mode="pointwise", scoring="generate").scoring == "generate"
    assert JudgeOptions.build(JudgeOptions(scoring="generate"), swap=False).scoring == "generate"
    base = JudgeOptions(scoring="generate", max_score=5)
    assert JudgeOptions.build(base) is base
    with pytest.raises(
        TypeError, match=message(f"unknown JudgeOptions option(s) ['bogus', 'precision']; the options are {FIELDS}")
    ):
        JudgeOptions.build(base, precision="bf16", bogus=1)


def test_judge_source_refuses_the_model_or_servers_in_judge_options_and_routes_the_rest():
    spelled = {"judge": "--judge", "judge_url": "--judge-url", "judge_options": "--judge-options"}.get
    for key in ("model", "remote_url"):
        source = JudgeSource(judge="j", judge_options={key: "x", "precision": "bf16"})
        with pytest.raises(
            ValueError, match=message("--judge-options: the judge is --judge and its servers --judge-url")
        ):
            source.arguments({}, spelled)
    source = JudgeSource(judge="j", judge_tokenizer="tok", judge_options='{"precision": "bf16", "mode": "listwise"}')
    # Given options win over judge_options, which win over a command's defaults.
    assert source.arguments({"mode": "pairwise"}, spelled, batch_size=4, precision="fp32") == {
        "model": "j", "batch_size": 4, "precision": "bf16", "mode": "pairwise", "tokenizer": "tok"
    }  # fmt: skip
    served = JudgeSource(judge_url=["http://a", "http://b"]).arguments({}, spelled)
    assert served == {"model": None, "remote_url": ["http://a", "http://b"]}
    assert JudgeSource().arguments({}, spelled) is None and JudgeSource(judge_options="{}").judge_options is None
