"""Each option is declared once and spelled on every surface from that declaration; every flag does what it says or
refuses, naming itself.

- The options classes (`ScoringOptions`, `RewardOptions`, `RemoteOptions`, `ServerLimits`): every field declared with
  `option()`, no name in two classes the environment routes by name.
- The command line (`eval`, `serve`), the GRPO recipe (YAML and flags) and NeMo RL's block: every spelling maps to
  exactly one option; a non-default value given through each spelling reaches that option; each parser's default
  is the option's (`serve`'s declared defaults aside); docs/options.md is the generated reference, current.
- Refusals: a typo'd keyword, an option of the engine that does not run, a server's option without a server.
"""

from __future__ import annotations

import dataclasses
import re
import warnings
from pathlib import Path

import pytest
import yaml
from trl_rm_env.recipes.cli import build_parser
from trl_rm_env.recipes.cli import main as cli_main
from trl_rm_env.recipes.grpo_args import RECIPE_OPTION_CLASSES, RewardModelArguments, RewardModelRecipeArguments
from trl_rm_env.recipes.reference import command_flags, options_reference
from trl_rm_env.recipes.serve import SERVE_DEFAULTS
from trl_rm_env.recipes.spellings import options_from_flags, options_from_recipe, text_choices, text_type

from trl_rm_env.judges.builtin_modes import mode_of
from trl_rm_env.judges.judge_options import JudgeOptions
from trl_rm_env.options import SPELLING, default_of, flag_of, option_fields, recipe_key, spelling
from trl_rm_env.rewards.base import RewardOptions
from trl_rm_env.rewards.judge import OWN_ARGUMENTS as JUDGE_ARGUMENTS
from trl_rm_env.rewards.nemo import NEMO_OPTIONS, environment_arguments
from trl_rm_env.rewards.reward_model import OPTION_CLASSES, OWN_ARGUMENTS, RewardModelEnvironment
from trl_rm_env.rewards.shaping import LengthShaping
from trl_rm_env.runtime.model_options import ScoringOptions
from trl_rm_env.runtime.plan import choose_engine
from trl_rm_env.serving.client.remote_options import RemoteOptions
from trl_rm_env.serving.server.limits import ServerLimits

ROOT = Path(__file__).resolve().parent.parent
ROUTED = (*OPTION_CLASSES, JudgeOptions)  # JudgeEnvironment routes its keyword arguments over all four
ALL_CLASSES = (*ROUTED, ServerLimits)


def sample(cls: type, f: dataclasses.Field) -> tuple[list[str], object, object]:
    """A value other than the default for option `f`: `(command-line words, YAML value, the option's value)`."""
    text = text_type(cls, f)
    default = default_of(f)
    choices = text_choices(f)
    if text is bool:
        return [], True, True
    if text is dict:
        return ['{"a": 1}'], {"a": 1}, {"a": 1}
    if text is list:  # name=value entries (attribute_weights), or a plain list (judge_url)
        parsed = {"a": 1.0, "b": -0.5} if f.name == "attribute_weights" else ["a=1", "b=-0.5"]
        return ["a=1", "b=-0.5"], ["a=1", "b=-0.5"], parsed
    if choices:
        value = next(c for c in choices if c != (str(default).lower() if isinstance(default, bool) else default))
        parsed = {"true": True, "false": False}.get(value, value) if f.name == "prefix_sharing" or set(choices) == {"auto", "true", "false"} else value
        return [value], value, parsed
    if text is int:
        value = (default or 0) + 3
        return [str(value)], value, value
    if text is float:
        return ["0.25"], 0.25, 0.25
    return ["cpu" if f.name == "device" else "x"], "cpu" if f.name == "device" else "x", "cpu" if f.name == "device" else "x"


def subparser(name: str):
    parser = build_parser()
    return next(a for a in parser._subparsers._group_actions).choices[name]


# ----------------------------------------------------------------------------------------------- the declarations
def test_every_option_is_declared_once_with_help_and_a_default():
    seen: dict[str, str] = {}
    for cls in ALL_CLASSES:
        assert dataclasses.is_dataclass(cls) and cls.__dataclass_params__.frozen, cls
        for f in option_fields(cls):
            assert f.metadata.get("help"), f"{cls.__name__}.{f.name} is not declared with option()"
            assert f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
            if cls in ROUTED:  # the environments route these by name: a name may be in one class only
                assert f.name not in seen, f"{f.name} is declared in {seen[f.name]} and {cls.__name__}"
                assert f.name not in OWN_ARGUMENTS and f.name not in JUDGE_ARGUMENTS
                seen[f.name] = cls.__name__
            assert f"{f.name}:" in cls.__doc__, f"{cls.__name__}'s docstring lacks {f.name} (document() generates it)"


def test_the_trainer_configs_own_fields_are_options_read_by_trls_parser():
    from trl import TrlParser

    from trl_rm_env.trainer.config import RankedRewardConfig

    own = ("truncation", "on_invalid", "max_completions", "save_reward_stats", "prefix_sharing", "pack_max_tokens")
    fields = {f.name: f for f in dataclasses.fields(RankedRewardConfig)}
    for name in own:
        assert fields[name].metadata.get("help") and SPELLING not in fields[name].metadata, name
    (config,) = TrlParser([RankedRewardConfig]).parse_args_and_config(
        ["--output_dir", "/tmp/x", "--truncation", "left", "--prefix_sharing", "false", "--on_invalid", "skip"]
    )
    assert (config.truncation, config.prefix_sharing, config.on_invalid) == ("left", False, "skip")
    assert RankedRewardConfig(output_dir="/tmp/x").prefix_sharing == "auto"  # scoring's default, the same word
    with pytest.raises(ValueError, match=r"^on_invalid must be one of \['raise', 'skip'\], got 'nope'$"):
        RankedRewardConfig(output_dir="/tmp/x", on_invalid="nope")


def test_truncation_is_one_vocabulary_and_the_old_words_name_the_new_one():
    from trl_rm_env.trainer.config import RankedRewardConfig

    assert RankedRewardConfig(output_dir="/tmp/x").truncation == "none" and ScoringOptions().truncation == "left"
    for old in ("drop", "fallback"):
        message = rf"^truncation='{old}' is now truncation='none' \(training and scoring share one vocabulary"
        with pytest.raises(ValueError, match=message):
            RankedRewardConfig(output_dir="/tmp/x", truncation=old)
        with pytest.raises(ValueError, match=message):
            ScoringOptions(truncation=old)


def test_choices_are_checked_for_every_options_class():
    for cls, name in ((ScoringOptions, "engine"), (RewardOptions, "normalization"), (RemoteOptions, "remote_api")):
        with pytest.raises(ValueError, match=rf"^{name} must be one of \[.*\], got 'nope'$"):
            cls(**{name: "nope"})
    with pytest.raises(ValueError, match="max_queue must be >= 1, got 0"):
        ServerLimits(max_queue=0)


# ----------------------------------------------------------------------------------------------- the command line
@pytest.mark.parametrize("command", ["eval", "serve"])
def test_every_flag_maps_to_exactly_one_option_and_defaults_to_it(command):
    sub = subparser(command)
    by_flag: dict[str, str] = {}
    for action in sub._actions:
        for flag in action.option_strings:
            assert flag not in by_flag, f"{flag} is taken twice"
            by_flag[flag] = action.dest
    classes = (ScoringOptions, ServerLimits) if command == "serve" else (ScoringOptions,)
    for cls in classes:
        for f in option_fields(cls):
            flag = flag_of(f)
            if flag is None or (command == "eval" and f.name in ("attribute_weights", "reward_model_type")):
                assert flag not in by_flag
                continue
            assert by_flag[flag] == f.name, (flag, by_flag[flag])
            for alias in spelling(f).aliases:
                assert by_flag[alias] == f.name
    # The defaults: what the parser gives with no flag is the option's default (serve's declared ones aside).
    argv = [command, "--model", "m"] + (["--data", "d.jsonl"] if command == "eval" else [])
    args = build_parser().parse_args(argv)
    options = options_from_flags(args, ScoringOptions)
    expected = ScoringOptions(**(SERVE_DEFAULTS if command == "serve" else {}))
    assert options == expected
    if command == "serve":
        assert options_from_flags(args, ServerLimits) == ServerLimits()


@pytest.mark.parametrize("command", ["eval", "serve"])
def test_a_value_given_by_each_flag_reaches_its_option(command):
    argv = [command, "--model", "m"] + (["--data", "d.jsonl"] if command == "eval" else [])
    expected: dict[type, dict[str, object]] = {}
    for cls in (ScoringOptions, ServerLimits) if command == "serve" else (ScoringOptions,):
        for f in option_fields(cls):
            if flag_of(f) is None or (command == "eval" and f.name in ("attribute_weights", "reward_model_type")):
                continue
            words, _, value = sample(cls, f)
            argv += [flag_of(f), *words]
            expected.setdefault(cls, {})[f.name] = value
    args = build_parser().parse_args(argv)
    for cls, values in expected.items():
        got = options_from_flags(args, cls)
        assert {name: getattr(got, name) for name in values} == values


def test_the_old_token_budget_flag_still_works_and_warns():
    with pytest.warns(FutureWarning, match="--max-tokens is an old spelling of --max-tokens-per-batch"):
        args = build_parser().parse_args(["eval", "--model", "m", "--data", "d.jsonl", "--max-tokens", "99"])
    assert options_from_flags(args, ScoringOptions).max_tokens_per_batch == 99
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        args = build_parser().parse_args(["serve", "--model", "m", "--max-tokens-per-batch", "99"])
    assert options_from_flags(args, ScoringOptions).max_tokens_per_batch == 99


# ----------------------------------------------------------------------------------------------- the GRPO recipe
def test_every_recipe_key_maps_to_exactly_one_option_with_its_default():
    own = {f.name for f in dataclasses.fields(RewardModelRecipeArguments)}
    generated = [f for f in dataclasses.fields(RewardModelArguments) if f.name not in own]
    keys = {recipe_key(f): (cls, f) for cls in RECIPE_OPTION_CLASSES for f in option_fields(cls) if recipe_key(f)}
    assert len(keys) == sum(1 for cls in RECIPE_OPTION_CLASSES for f in option_fields(cls) if recipe_key(f))
    assert {f.name for f in generated} == set(keys) and not own & set(keys)
    for f in generated:
        cls, option = keys[f.name]
        want = default_of(option)
        got = f.default
        if isinstance(want, bool) and option.metadata.get("choices"):
            want = str(want).lower()  # a choice given as text in YAML and flags
        assert got == want or (got is None and want in ({}, None)), (f.name, got, want)
        assert f.metadata.get("choices") == text_choices(option)


def test_a_value_given_by_each_recipe_key_reaches_its_option(tmp_path):
    from trl import TrlParser

    genrm = mode_of("genrm")  # its own options in a second config (another mode refuses them), and so the stop-properly
    # penalty (the overlong buffer's keys in the first)
    for mode in ("other", "genrm"):
        flags_argv, yaml_values, expected = [], {}, {}
        for cls in RECIPE_OPTION_CLASSES:
            for f in option_fields(cls):
                key = recipe_key(f)
                own = f.name in genrm.own_options or f.name in ("mode", "scoring")
                if key is None or (cls is JudgeOptions and own != (mode == "genrm") and f.name not in ("mode", "scoring")):
                    continue
                if cls is LengthShaping and (f.name in ("stop_properly_penalty_coef", "eos_token_id")) != (mode == "genrm"):
                    continue  # the two kinds of length shaping, one per config
                words, value, parsed = sample(cls, f)
                if f.name == "eos_token_id":
                    words, value, parsed = ["2", "3"], [2, 3], [2, 3]
                if f.name == "ensemble":  # the aggregation that ensemble_penalty weighs
                    words, value, parsed = ["mean_minus_std"], "mean_minus_std", "mean_minus_std"
                if default_of(f) is True:  # a key takes a value: the one that is not the default
                    words, value, parsed = ["false"], False, False
                if f.name == "scoring" and mode == "genrm":
                    continue  # a GenRM reads its verdict from text: its own scoring, not a value given
                if f.name == "scoring" or (mode == "genrm" and f.name == "mode"):
                    value = "genrm" if f.name == "mode" else "generate"  # not the mode's own scoring
                    words, parsed = [value], value
                yaml_values[key] = value
                flags_argv += [f"--{key}", *(words or ["true"])]
                expected.setdefault(cls, {})[f.name] = parsed
        config = tmp_path / f"rm_{mode}.yaml"
        config.write_text(yaml.safe_dump(yaml_values))
        for argv in (["--config", str(config)], flags_argv):
            (args,) = TrlParser([RewardModelArguments]).parse_args_and_config(argv)
            for cls, values in expected.items():
                assert options_from_recipe(args, cls) == values, argv[:2]


def test_a_bad_value_is_refused_by_the_spelling_it_was_given_in():
    args = build_parser().parse_args(["serve", "--model", "m", "--batch-size", "0"])
    with pytest.raises(ValueError, match=r"^--batch-size: batch_size must be >= 1, got 0$"):
        options_from_flags(args, ScoringOptions)
    args = build_parser().parse_args(["serve", "--model", "m", "--body-timeout", "0"])
    with pytest.raises(ValueError, match=r"^--body-timeout: body_timeout must be > 0"):
        options_from_flags(args, ServerLimits)
    with pytest.raises(ValueError, match=r"^reward_vllm_gpu_memory_utilization: vllm_gpu_memory_utilization must be"):
        RewardModelArguments(reward_vllm_gpu_memory_utilization=1.5).environment_kwargs()
    with pytest.raises(ValueError, match=r"^reward_template_kwargs: expected a JSON object"):
        RewardModelArguments(reward_template_kwargs="{not json").environment_kwargs()


def test_judge_keys_reach_the_judge_and_are_refused_without_one():
    args = RewardModelArguments(
        reward_judge="judge-model", reward_judge_mode="pairwise", reward_judge_options='{"precision": "bf16"}'
    )
    assert args.judge_kwargs() == {"mode": "pairwise", "precision": "bf16", "tokenizer": None}
    with pytest.raises(ValueError, match=r"^reward_judge_tokenizer, reward_judge_mode: options of a judge; give "
                       r"reward_judge \(or reward_judge_url\)$"):
        RewardModelArguments(reward_judge_mode="pairwise", reward_judge_tokenizer="t").judge_kwargs()
    served = RewardModelArguments(reward_judge_url=["http://x"]).judge_kwargs()  # the server's own model
    assert served == {"tokenizer": None, "remote_url": ["http://x"]}
    with pytest.raises(ValueError, match=r"^reward_judge_mode: mode must be one of"):
        RewardModelArguments(reward_judge="j", reward_judge_mode="ranking").judge_kwargs()
    with pytest.raises(ValueError, match=r"^reward_judge_options: expected a JSON object"):
        RewardModelArguments(reward_judge="j", reward_judge_options="{bad").judge_kwargs()
    assert RewardModelArguments().judge_kwargs() is None


def test_the_judge_engine_has_its_own_key_and_flag():
    args = RewardModelArguments(reward_judge="j", reward_judge_engine="hf")
    assert args.judge_kwargs() == {"engine": "hf", "tokenizer": None}
    cli = build_parser().parse_args(["eval", "--judge", "j", "--judge-engine", "vllm", "--data", "d"])
    assert cli.judge_engine == "vllm"
    for kwargs, message in (
        (dict(reward_judge="j", reward_judge_engine="tpu"), r"^reward_judge_engine: judge_engine must be one of"),
        (dict(reward_judge="j", reward_judge_engine="hf", reward_judge_options='{"engine": "vllm"}'),
         r"^reward_judge_options: the judge's engine is reward_judge_engine$"),
        (dict(reward_judge_url=["http://x"], reward_judge_engine="hf"),
         r"^reward_judge_engine: applies to a judge loaded here; at reward_judge_url the servers run it$"),
        (dict(reward_judge_engine="hf"), r"^reward_judge_engine: options of a judge; give reward_judge"),
    ):  # fmt: skip
        with pytest.raises(ValueError, match=message):
            RewardModelArguments(**kwargs).judge_kwargs()


def test_recipe_options_for_the_wrong_place_are_refused_by_their_keys():
    from trl_rm_env.rewards.reward_sources import RewardSources

    with pytest.raises(ValueError, match="^reward_remote_timeout apply with reward_remote_url"):
        RewardModelArguments(reward_remote_timeout=5.0).reward_sources()
    remote = RewardModelArguments(reward_remote_url=["http://127.0.0.1:1"], reward_batch_size=4, reward_precision="bf16")
    with pytest.raises(ValueError, match="^reward_batch_size, reward_precision: applied by a reward model loaded here"):
        remote.reward_sources()
    with pytest.raises(ValueError, match="^reward_remote_timeout apply with reward_remote_url"):  # a library user too
        RewardSources(reward_model="rm", reward_options={"timeout": 5.0})


# ----------------------------------------------------------------------------------------------- NeMo RL
def test_every_nemo_key_maps_onto_one_option_and_reaches_it(tmp_path):
    assert set(NEMO_OPTIONS.values()) <= set(ScoringOptions.names())
    block = {
        "model_name": str(tmp_path), "precision": "bfloat16", "batch_size": 5, "max_model_len": 77,
        "dynamic_batching": {"enabled": True, "logprob_mb_tokens": 999, "train_mb_tokens": 111},
        "tokenizer": {"name": "tok", "chat_template_kwargs": {"enable_thinking": False}},
        "reward_model_cfg": {"enabled": True, "reward_model_type": "regression"},
    }  # fmt: skip
    model, tokenizer, kwargs, _ = environment_arguments(block, RewardModelEnvironment.argument_names())
    assert (model, tokenizer) == (str(tmp_path), "tok")
    assert kwargs == {"precision": "bfloat16", "batch_size": 5, "max_length": 77, "max_tokens_per_batch": 999,
                      "template_kwargs": {"enable_thinking": False}, "reward_model_type": "regression"}  # fmt: skip
    assert ScoringOptions(**kwargs).reward_model_type == "regression"  # honored: it selects the head
    off = dict(block, dynamic_batching={"enabled": False, "logprob_mb_tokens": 999})
    assert "max_tokens_per_batch" not in environment_arguments(off, RewardModelEnvironment.argument_names())[2]


# ----------------------------------------------------------------------------------------------- the reference page
def test_the_options_page_is_the_generated_reference():
    page = (ROOT / "docs" / "options.md").read_text(encoding="utf-8")
    block = re.search(r"<!-- options:begin -->\n(.*?)<!-- options:end -->", page, re.S)
    assert block, "docs/options.md lost its options:begin/end markers"
    assert block.group(1) == options_reference(), "docs/options.md is out of date: python scripts/make_options_doc.py"
    flags = command_flags(build_parser())
    for cls in ALL_CLASSES:  # every option and each of its spellings is on the page
        for f in option_fields(cls):
            row = next(line for line in page.splitlines() if line.startswith(f"| `{f.name}` |"))
            for flag in flags.get(f.name, {}).values():
                assert f"`{flag}`" in row or flag != flag_of(f)  # a command's own flag of that name is not this one
            assert recipe_key(f) is None or cls is ServerLimits or f"`{recipe_key(f)}`" in row


# ----------------------------------------------------------------------------------------------- refusals
def test_an_option_of_the_engine_that_does_not_run_is_refused_naming_it():
    with pytest.raises(ValueError, match=r"^vllm_tensor_parallel_size \(--tensor-parallel-size, "
                                         r"reward_vllm_tensor_parallel_size\) applies to engine='vllm', but this reward "
                                         r"model scores on transformers \(asked for\)"):  # fmt: skip
        choose_engine(ScoringOptions(engine="hf", vllm_tensor_parallel_size=2))
    with pytest.raises(ValueError, match=r"^model_init_kwargs .* applies to engine='hf', but this reward model scores "
                                         r"on vLLM \(asked for\): drop it, or set engine='hf'"):  # fmt: skip
        choose_engine(ScoringOptions(engine="vllm", model_init_kwargs={"attn_implementation": "eager"}))
    assert choose_engine(ScoringOptions(model_init_kwargs={"revision": "main"})) == (
        "hf", "model_init_kwargs are transformers loading arguments"
    )
    with pytest.raises(ValueError, match="engine='vllm' cannot serve this reward model: a sharded model"):
        choose_engine(ScoringOptions(engine="vllm"), hf_only="a sharded model")


def test_serve_and_eval_refuse_a_flag_of_the_other_engine(tiny_dir, capsys):
    from trl_rm_env.recipes.cli import main

    model = str(tiny_dir / "reward_model")
    assert main(["serve", "--model", model, "--engine", "hf", "--tensor-parallel-size", "2"]) == 1
    assert "error: vllm_tensor_parallel_size (--tensor-parallel-size" in capsys.readouterr().err
    assert main(["serve", "--model", model, "--engine", "hf", "--data-parallel-size", "2"]) == 1
    assert "error: --data-parallel-size applies to vLLM's server, but this reward model is served by ours" in (
        capsys.readouterr().err
    )
    assert main(["serve", "--model", model, "--engine", "vllm", "--truncation", "none", "--max-queue", "5"]) == 1
    assert "engine='vllm' cannot serve this reward model: --truncation, --max-queue apply in our server" in (
        capsys.readouterr().err
    )
    data = ROOT / "trl_rm_env" / "data" / "sample" / "in_domain.jsonl"
    argv = ["eval", "--model", model, "--data", str(data), "--engine", "hf", "--vllm-gpu-memory-utilization", "0.5"]
    assert main(argv) == 1
    assert "vllm_gpu_memory_utilization (--vllm-gpu-memory-utilization" in capsys.readouterr().err


def test_the_environment_refuses_what_it_would_ignore(tiny_dir):
    path = tiny_dir / "reward_model"
    with pytest.raises(TypeError, match=r"unexpected keyword argument\(s\) \['batchsize'\]; accepted: .*'batch_size'"):
        RewardModelEnvironment(path, batchsize=4)
    with pytest.raises(ValueError, match=r"^retries, timeout: options of a reward model behind servers"):
        RewardModelEnvironment(path, timeout=5.0, retries=1)
    with pytest.raises(ValueError, match="^clip must be > 0"):  # checked before anything loads
        RewardModelEnvironment("no/such/model", clip=-1.0)


def test_reward_model_type_selects_the_head(tmp_path, tiny_tokenizer):
    """NeMo RL's `reward_model_type`: `regression` reads a plain multi-output classifier's outputs as attributes
    (the weighted sum), `bradley_terry` keeps output `label_index` even of a regression checkpoint."""
    import torch

    from trl_rm_env.heads import set_regression_labels
    from trl_rm_env.scoring.scorer import RewardScorer
    from trl_rm_env.tiny_models import build_tiny_reward_model

    model = build_tiny_reward_model(tiny_tokenizer, num_labels=3).eval()
    contexts = [[{"role": "user", "content": f"Question {i}?"}] for i in range(3)]
    completions = [[{"role": "assistant", "content": f"Answer {i}."}] for i in range(3)]
    plain = RewardScorer(model, tiny_tokenizer, device="cpu")
    outputs = plain.score_pairs(contexts, completions).outputs
    weights = [1.0, 0.0, -2.0]
    regression = RewardScorer(model, tiny_tokenizer, reward_model_type="regression", attribute_weights=weights)
    torch.testing.assert_close(regression.score(contexts, completions), outputs @ torch.tensor(weights))
    with pytest.raises(ValueError, match="attribute_weights applies to regression reward models"):
        RewardScorer(model, tiny_tokenizer, attribute_weights=weights)  # the checkpoint does not say regression
    set_regression_labels(model.config, ["a", "b", "c"], [1.0, 1.0, 1.0])
    column = RewardScorer(model, tiny_tokenizer, reward_model_type="bradley_terry", label_index=2)
    torch.testing.assert_close(column.score(contexts, completions), outputs[:, 2])


def test_a_regression_head_without_weights_gives_its_outputs_not_one_reward(tmp_path, tiny_tokenizer):
    """`eval` reads a regression model's attributes one by one; one reward per sample (the environment, `serve`)
    needs weights, and asking for it without them is an error, never column 0."""
    import torch

    from trl_rm_env.evaluation import evaluate_regression_model
    from trl_rm_env.heads import set_regression_labels
    from trl_rm_env.runtime.plan import plan_model
    from trl_rm_env.scoring.scorer import load_reward_scorer
    from trl_rm_env.tiny_models import build_tiny_reward_model

    model = build_tiny_reward_model(tiny_tokenizer, num_labels=2)
    set_regression_labels(model.config, ["helpfulness", "verbosity"])  # no attribute_weights saved
    model.save_pretrained(tmp_path / "rm")
    tiny_tokenizer.save_pretrained(tmp_path / "rm")
    with pytest.raises(ValueError, match=r"predicts \['helpfulness', 'verbosity'\]: give attribute_weights"):
        plan_model(tmp_path / "rm")
    scorer = load_reward_scorer(tmp_path / "rm", one_reward=False, device="cpu")
    assert scorer.head.attributes == ("helpfulness", "verbosity") and scorer.head.weights is None
    contexts, completions = [[{"role": "user", "content": "Hi"}]], [[{"role": "assistant", "content": "Hello."}]]
    assert scorer.outputs(contexts, completions).shape == (1, 2)
    with pytest.raises(ValueError, match="one reward per sample needs attribute_weights"):
        scorer.score(contexts, completions)
    records = [{"context": contexts[0], "completion": completions[0], "attributes": {"helpfulness": 3.0}}]
    results = evaluate_regression_model(str(tmp_path / "rm"), {"set": records}, progress=False)
    assert results["attributes"] == ["helpfulness", "verbosity"] and results["sets"]["set"]["helpfulness_count"] == 1
    assert torch.isfinite(torch.tensor(results["sets"]["set"]["helpfulness_mae"]))


def test_loading_options_are_refused_for_a_model_already_loaded(tiny_rm, tiny_tokenizer):
    from trl_rm_env.runtime.plan import plan_model

    with pytest.raises(ValueError, match=r"^precision \(--precision, reward_precision\), trust_remote_code .*: applied "
                                         r"when a model is loaded from its path"):  # fmt: skip
        plan_model(tiny_rm, precision="bf16", trust_remote_code=True)
    assert plan_model(tiny_rm).why == "the model is already loaded in this process"
    assert (plan_model(tiny_rm).kind, plan_model(tiny_rm, kind=None).kind) == ("reward", "reward")
    with pytest.raises(ValueError, match=r"^kind must be one of \['reward', 'judge'\] or None"):
        plan_model(tiny_rm, kind="critic")
    with pytest.raises(ValueError, match=r"^the judge is a Qwen3ForSequenceClassification, not a causal language"):
        plan_model(tiny_rm, kind="judge")


def test_the_environment_has_the_signature_of_the_call_it_makes(tiny_dir):
    import inspect

    env = RewardModelEnvironment(tiny_dir / "reward_model", device="cpu")
    assert list(inspect.signature(env).parameters) == ["prompts", "completions", "completion_ids", "kwargs"]


def test_a_bad_value_names_its_own_key_and_the_launcher_refuses_unknown_yaml_keys(tmp_path, capsys):
    from trl_rm_env.recipes.cli import main

    bad = RewardModelArguments(reward_truncation="none", reward_batch_size=0)
    with pytest.raises(ValueError, match="^reward_batch_size: batch_size must be >= 1"):
        bad.environment_kwargs()
    config = tmp_path / "rm.yaml"
    config.write_text("max_steps: 1\nnum_processes: 2\n")
    assert main(["train", "--config", str(config)]) == 1
    assert "trl-rm-env train: error: unknown key(s) ['num_processes'] in the --config YAML" in capsys.readouterr().err


@pytest.fixture
def scoring_builds(monkeypatch):
    """Every `ScoringOptions` built (validated) from here on, each with the stack that built it."""
    import traceback

    built = []
    original = ScoringOptions.__post_init__

    def counted(self):
        built.append("".join(traceback.format_stack(limit=8)[:-1]))
        return original(self)

    monkeypatch.setattr(ScoringOptions, "__post_init__", counted)
    return built


def _one_owner(scorer, budget):
    """The value has one owner: the scorer, its engine and the server read the one options object."""
    assert scorer.options.max_tokens_per_batch == budget and scorer.engine.options is scorer.options
    assert not hasattr(scorer, "max_tokens_per_batch") and not hasattr(scorer.engine, "max_tokens_per_batch")


@pytest.mark.slow
def test_max_tokens_per_batch_is_built_once_on_each_path_and_has_one_owner(tiny_dir, scoring_builds, monkeypatch):
    from trl_rm_env.recipes.grpo_args import RewardModelArguments

    from trl_rm_env import RewardModelEnvironment
    from trl_rm_env.scoring import scorer as scorer_module

    rm = str(tiny_dir / "reward_model")
    env = RewardModelEnvironment(rm, max_tokens_per_batch=2048)
    assert len(scoring_builds) == 1, scoring_builds  # RewardModelEnvironment(...): its options, built once
    _one_owner(env.scorer, 2048)

    scoring_builds.clear()
    args = RewardModelArguments(reward_model=rm, reward_max_tokens_per_batch=2048)
    env = RewardModelEnvironment(args.reward_model, **args.environment_kwargs())  # as recipes/grpo_rm.py builds it
    assert len(scoring_builds) == 1, scoring_builds  # the recipe's reward_max_tokens_per_batch: built once
    _one_owner(env.scorer, 2048)

    scorers = []
    original = scorer_module.RewardScorer.__init__

    def keep(self, *args, **kwargs):
        original(self, *args, **kwargs)
        scorers.append(self)

    monkeypatch.setattr(scorer_module.RewardScorer, "__init__", keep)
    scoring_builds.clear()
    argv = ["eval", "--model", rm, "--data", "sample:harder", "--max-tokens-per-batch", "2048", "--no-progress"]
    assert cli_main(argv) == 0
    assert len(scoring_builds) == 1, scoring_builds  # eval --max-tokens-per-batch: built once, from the flags
    (scorer,) = scorers
    _one_owner(scorer, 2048)


@pytest.mark.parametrize("command", ["eval", "serve"])
def test_every_flag_takes_trls_underscore_spelling_too(command):
    """`eval --batch_size 8` as `--batch-size 8` (TRL's habit; the recipes take both spellings)."""
    base = [command, "--model", "m"] + (["--data", "d.jsonl"] if command == "eval" else [])
    dashed = build_parser().parse_args([*base, "--batch-size", "8", "--max-tokens-per-batch", "4096"])
    underscored = build_parser().parse_args([*base, "--batch_size", "8", "--max_tokens_per_batch", "4096"])
    assert vars(dashed) == vars(underscored) and underscored.batch_size == 8


@pytest.mark.slow
def test_importing_the_extras_after_us_prints_no_noise():
    """bitsandbytes' missing-`kernels` notice and DeepSpeed's "Setting accelerator to CPU" (both extras are installed
    in CI; our recipes and trainers import them through transformers and accelerate) are filtered once `trl_rm_env`
    is imported; imported without it, they print (the check can fail)."""
    import importlib.util
    import subprocess
    import sys

    if importlib.util.find_spec("bitsandbytes") is None or importlib.util.find_spec("deepspeed") is None:
        pytest.skip("needs the quantization and deepspeed extras")
    code = "import bitsandbytes, deepspeed; deepspeed.get_accelerator()"
    notices = ("gemm_4bit_forward", "Setting accelerator to CPU")
    printed = {}
    for prefix in ("", "import trl_rm_env; "):
        run = subprocess.run([sys.executable, "-c", prefix + code], capture_output=True, text=True, timeout=300,
                             stdin=subprocess.DEVNULL)
        assert run.returncode == 0, run.stderr[-2000:]
        printed[prefix] = [n for n in notices if n in run.stdout + run.stderr]
    if not printed[""]:  # bitsandbytes prints its notice only on CPUs with AVX512-BF16, DeepSpeed only without a GPU
        pytest.skip("neither package prints its notice on this machine")
    assert printed["import trl_rm_env; "] == [], printed
