"""The documentation stays true to the code.

- The 3-line GRPO drop-in snippet of `docs/environment.md` runs: it builds a real `GRPOTrainer` with the environment
  as reward function (a tiny local RM in place of the Hub id) and scores a prompt/completion.
- Every relative link in `docs/*.md` and `README.md` points to an existing file (and an existing heading anchor).
- Every option the package adds (config fields, recipe arguments, environment parameters) is documented.
- Every per-set evaluation metric the trainer emits is documented as `eval_<name>_<metric>`.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import re
from pathlib import Path

import pytest

from trl_rm_env.compat import CHECKPOINTING_FIELD

REPO_ROOT = Path(__file__).resolve().parent.parent
DOCS_DIR = REPO_ROOT / "docs"
DOC_FILES = sorted(DOCS_DIR.glob("*.md"))
LINKED_FILES = [*DOC_FILES, REPO_ROOT / "README.md"]

FENCED_BLOCK = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)
INLINE_CODE = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
DROP_IN = re.compile(r"^<!-- drop-in -->\n```python\n(.*?)^```", re.S | re.M)
RM_ID_IN_SNIPPET = re.compile(r"RewardModelEnvironment\(\s*([\"'])([^\"']+)\1")


def _read(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def _docs_text() -> str:
    return "\n".join(_read(path) for path in DOC_FILES)


def test_docs_exist():
    names = {path.name for path in DOC_FILES}
    expected = {"index.md", "quickstart.md", "data_format.md", "reward_training.md", "environment.md"}
    assert expected <= names, f"missing doc pages: {sorted(expected - names)}"


# --- the drop-in snippet -----------------------------------------------------------------------------------------


def drop_in_snippet() -> str:
    """The ```python block right after the `<!-- drop-in -->` marker of docs/environment.md."""
    text = _read(DOCS_DIR / "environment.md")
    blocks = DROP_IN.findall(text)
    assert len(blocks) == 1, f"expected one ```python block right after '<!-- drop-in -->', found {len(blocks)}"
    return blocks[0]


def test_drop_in_snippet_names_a_hub_model():
    snippet = drop_in_snippet()
    match = RM_ID_IN_SNIPPET.search(snippet)
    assert match, "the drop-in snippet must build RewardModelEnvironment from a quoted Hub id"
    assert "/" in match.group(2) and not Path(match.group(2)).exists(), match.group(2)
    assert re.search(r"GRPOTrainer\(.*reward_funcs=\[reward", snippet, re.S), "the env must be passed as reward_funcs"


@pytest.mark.slow
def test_drop_in_snippet_runs(tmp_path, monkeypatch):
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from trl_rm_env import RewardModelEnvironment
    from trl_rm_env.tiny_models import make_tiny

    paths = make_tiny(tmp_path / "tiny")
    snippet = drop_in_snippet()
    quote, hub_id = RM_ID_IN_SNIPPET.search(snippet).groups()
    code = snippet.replace(f"{quote}{hub_id}{quote}", repr(str(paths["reward_model"])))
    monkeypatch.chdir(tmp_path)

    # What the "existing TRL GRPO script" already has: a policy, GRPO arguments and a prompt dataset.
    questions = ["What is 1 + 2?", "Compute 3 + 4.", "Please add 2 and 5.", "How much is 4 plus 4?"]
    namespace = {
        "model": str(paths["policy"]),
        "training_args": GRPOConfig(
            output_dir=str(tmp_path / "grpo"),
            per_device_train_batch_size=4,
            num_generations=2,
            max_completion_length=8,
            max_steps=1,
            learning_rate=1e-3,
            logging_steps=1,
            save_strategy="no",
            report_to="none",
            use_cpu=True,
            bf16=False,
            **{CHECKPOINTING_FIELD: False},
            seed=0,
        ),
        "dataset": Dataset.from_list([{"prompt": [{"role": "user", "content": q}]} for q in questions]),
    }
    exec(compile(code, "docs/environment.md (drop-in)", "exec"), namespace)

    reward, trainer, rewards = namespace["reward"], namespace["trainer"], namespace["rewards"]
    assert isinstance(reward, RewardModelEnvironment)
    assert isinstance(trainer, GRPOTrainer)
    assert reward in trainer.reward_funcs
    assert isinstance(rewards, list) and len(rewards) == 1
    assert all(isinstance(r, float) and math.isfinite(r) for r in rewards), rewards

    # One real GRPO step: TRL calls the environment and logs its reward and its metrics.
    trainer.train()
    logged = {key for entry in trainer.state.log_history for key in entry}
    assert f"rewards/{reward.__name__}/mean" in logged, sorted(logged)
    assert "reward_model_env/mean_reward" in logged, sorted(logged)


# --- links -------------------------------------------------------------------------------------------------------


def github_anchor(heading: str) -> str:
    """GitHub's anchor of a Markdown heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors_of(path: Path) -> set[str]:
    text = FENCED_BLOCK.sub("", _read(path))
    anchors: set[str] = set()
    for heading in re.findall(r"^#{1,6}\s+(.+?)\s*#*\s*$", text, re.M):
        anchor, n = github_anchor(heading), 1
        unique = anchor
        while unique in anchors:
            unique, n = f"{anchor}-{n}", n + 1
        anchors.add(unique)
    return anchors


def relative_links(path: Path) -> list[str]:
    text = INLINE_CODE.sub("", FENCED_BLOCK.sub("", _read(path)))
    return [t for t in LINK.findall(text) if not re.match(r"^[a-z][a-z0-9+.-]*:", t, re.I)]


def test_relative_links_resolve():
    broken = []
    for path in LINKED_FILES:
        for target in relative_links(path):
            file_part, _, anchor = target.partition("#")
            resolved = (path.parent / file_part).resolve() if file_part else path
            where = f"{path.relative_to(REPO_ROOT)} -> {target}"
            if not resolved.exists():
                broken.append(f"{where}: no such file")
            elif anchor and resolved.suffix == ".md" and anchor not in anchors_of(resolved):
                broken.append(f"{where}: no heading with anchor #{anchor}")
    assert not broken, "broken links:\n" + "\n".join(broken)


def test_link_checker_finds_broken_links(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# Title\n\n[ok](#title) [bad](missing.md) [web](https://example.com)\n```\n[code](x.md)\n```\n")
    assert relative_links(page) == ["#title", "missing.md"]
    assert anchors_of(page) == {"title"}
    assert github_anchor("3-line drop-in for an existing TRL GRPO script") == "3-line-drop-in-for-an-existing-trl-grpo-script"
    assert github_anchor("Truncation: `max_length` and `truncation`") == "truncation-max_length-and-truncation"


# --- option and metric coverage ----------------------------------------------------------------------------------


def undocumented(names: list[str], text: str) -> list[str]:
    """The names that never appear as inline code (`name`) in `text`."""
    return [name for name in names if f"`{name}`" not in text]


def test_undocumented_reports_missing_names():
    assert undocumented(["truncation", "not_a_field"], "Set `truncation` to left.") == ["not_a_field"]


def test_config_fields_are_documented():
    from trl import RewardConfig

    from trl_rm_env import RankedRewardConfig

    trl_fields = {f.name for f in dataclasses.fields(RewardConfig)}
    new_fields = [f.name for f in dataclasses.fields(RankedRewardConfig) if f.name not in trl_fields]
    assert new_fields, "RankedRewardConfig adds no field: update this test"
    missing = undocumented(new_fields, _docs_text())
    assert not missing, f"RankedRewardConfig fields missing from docs/*.md: {missing}"


def test_data_arguments_are_documented():
    from trl_rm_env.data.arguments import RankedDataArguments

    missing = undocumented([f.name for f in dataclasses.fields(RankedDataArguments)], _docs_text())
    assert not missing, f"RankedDataArguments fields missing from docs/*.md: {missing}"


def test_grpo_arguments_are_documented():
    from trl_rm_env.recipes.grpo_args import RewardModelArguments

    missing = undocumented([f.name for f in dataclasses.fields(RewardModelArguments)], _docs_text())
    assert not missing, f"RewardModelArguments fields missing from docs/*.md: {missing}"


def test_environment_parameters_are_documented():
    """Every argument of the environment is documented: its own parameters and every option it takes by name
    (`**options_by_name`: the fields of `ScoringOptions`, `RewardOptions` and `RemoteOptions`)."""
    from trl_rm_env import RewardModelEnvironment
    from trl_rm_env.rewards.reward_model import OPTION_CLASSES

    signature = inspect.signature(RewardModelEnvironment.__init__).parameters.values()
    own = [p.name for p in signature if p.name != "self" and p.kind is not inspect.Parameter.VAR_KEYWORD]
    options = [f.name for cls in OPTION_CLASSES for f in dataclasses.fields(cls)]
    assert len(options) > 20 and "batch_size" in options and "timeout" in options
    missing = undocumented(own + options, _docs_text())
    assert not missing, f"RewardModelEnvironment arguments missing from docs/*.md: {missing}"


def test_per_set_metrics_are_documented():
    from trl_rm_env.trainer.trainer import SET_METRICS

    text = _read(DOCS_DIR / "reward_training.md")
    keys = [f"eval_<name>_{metric}" for metric in SET_METRICS] + ["eval_<name>_runtime", "eval_total_validation_time"]
    missing = [key for key in keys if key not in text]
    assert not missing, f"per-set metrics missing from docs/reward_training.md: {missing}"


def test_training_metrics_are_documented():
    import trl_rm_env.trainer.trainer as trainer_module

    emitted = sorted(set(re.findall(r"_metrics\[\"train\"\]\[\"(\w+)\"\]", inspect.getsource(trainer_module))))
    assert emitted, "no training metric found in trainer.py: update this test"
    missing = undocumented(emitted, _read(DOCS_DIR / "reward_training.md"))
    assert not missing, f"training metrics missing from docs/reward_training.md: {missing}"


def test_environment_metrics_are_documented():
    import trl_rm_env.rewards.base as environment_module

    emitted = sorted(set(re.findall(r"\{prefix\}/(\w+)", inspect.getsource(environment_module))))
    assert emitted, "no reward_model_env/* metric found in environment.py: update this test"
    text = _read(DOCS_DIR / "environment.md")
    missing = [f"reward_model_env/{name}" for name in emitted if f"reward_model_env/{name}" not in text]
    assert not missing, f"environment metrics missing from docs/environment.md: {missing}"


def test_index_links_every_page():
    linked = {target.partition("#")[0] for target in relative_links(DOCS_DIR / "index.md")}
    missing = [path.name for path in DOC_FILES if path.name != "index.md" and path.name not in linked]
    assert not missing, f"docs pages not linked from docs/index.md: {missing}"


# --- install --------------------------------------------------------------------------------------------------------


def test_every_extra_is_in_the_install_table():
    """docs/index.md's extras table lists every extra of pyproject.toml (`serve` is an empty alias kept for old docs)."""
    import tomllib

    extras = tomllib.loads(_read(REPO_ROOT / "pyproject.toml"))["project"]["optional-dependencies"]
    table = {line.split("|")[1].strip().strip("`") for line in _read(DOCS_DIR / "index.md").splitlines()
             if line.startswith("| `")}
    missing = sorted(name for name, requirements in extras.items() if requirements and name not in table)
    assert not missing, f"extras missing from docs/index.md's table: {missing}"


def test_deepspeed_launch_commands_come_with_the_install_hint():
    """A page or config that shows a DeepSpeed launch says how to install DeepSpeed: the quickstart install leaves it
    out, and accelerate then stops with "DeepSpeed is not installed"."""
    pages = [*LINKED_FILES, *(REPO_ROOT / "recipes" / "configs").glob("*.yaml"),
             *(REPO_ROOT / "accelerate_configs").glob("zero*.yaml")]
    offenders = [
        str(path.relative_to(REPO_ROOT)) for path in pages
        if re.search(r"accelerate launch [^\n]*accelerate_configs/zero[23]", _read(path))
        and not re.search(r"pip install[^\n]*deepspeed", _read(path))
    ]
    assert not offenders, f"DeepSpeed launch commands without `pip install ... deepspeed`: {offenders}"


def test_judge_parameters_are_documented():
    """Every argument of `JudgeEnvironment` and every `JudgeOptions` option appears in the docs."""
    from trl_rm_env import JudgeEnvironment
    from trl_rm_env.judges.judge_options import JudgeOptions

    signature = inspect.signature(JudgeEnvironment.__init__).parameters.values()
    own = [p.name for p in signature if p.name != "self" and p.kind is not inspect.Parameter.VAR_KEYWORD]
    options = [f.name for f in dataclasses.fields(JudgeOptions)]
    assert "scoring_options" in own and "mode" in options
    missing = undocumented(own + options, _read(DOCS_DIR / "judges.md"))
    assert not missing, f"JudgeEnvironment arguments missing from docs/judges.md: {missing}"
