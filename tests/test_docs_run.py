"""The documentation runs: every fenced block of README.md and docs/*.md, offline, as `tests/doc_runner.py` says.

The pages run in two lanes at once (`doc_runner.LANES`), each lane's pages in order in one workspace (the
quickstart's outputs exist for the pages after it, as for a reader who followed it). A block that does not run says
why in the page (`<!-- doc-test: ... -->`); the census of kinds is printed at the end of the session. The page runs
are marked `docs`; the blocks marked `vllm` run in the vLLM suite (`test_vllm_blocks_run`).
"""

from __future__ import annotations

import importlib.util
import os

import doc_runner
import pytest
from doc_runner import PAGES, REPO_ROOT, Block, blocks_of, census, iter_problems, run_page, run_pages


def test_every_block_runs_or_says_why():
    problems = list(iter_problems())
    assert not problems, "\n".join(problems)
    kinds = census()
    assert len(kinds.get("run", [])) >= 40, {k: len(v) for k, v in kinds.items()}
    assert kinds.get("vllm") and kinds.get("ci")


def test_the_census_counts_every_block():
    kinds = census()
    total = sum(len(blocks_of(page)) for page in PAGES)
    assert sum(len(v) for v in kinds.values()) == total > 90


def test_an_unmarked_output_block_and_a_mark_without_reason_are_refused(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("```text\nsome output\n```\n\n<!-- doc-test: illustrative -->\n```bash\nls\n```\n"
                    "<!-- doc-test: illustrative: a sketch -->\n```\nx\n```\n"
                    "<!-- doc-test: vllm -->\n\n```bash\nls\n```\n")  # fmt: skip
    problems = list(iter_problems([page]))
    assert len(problems) == 3, problems
    assert "cannot run" in problems[0] and "needs a reason" in problems[1]
    assert "not right above a fence" in problems[2]


def test_commands_are_split_as_the_shell_reads_them():
    text = "a --x 1 \\\n  --y 2   # comment\n# a comment line\n\nb -d '{\n \"k\": 1}'  # c\nc \"#not a comment\""
    assert doc_runner.commands_of(text) == ["a --x 1 --y 2", "b -d '{\n \"k\": 1}'", 'c "#not a comment"']


def test_install_steps_are_checked_against_pyproject_and_ci():
    assert doc_runner.install_problems('pip install -e ".[dev,peft]"') == []
    assert doc_runner.install_problems("pip install torch==2.13.0") == []
    assert doc_runner.install_problems('pip install -e ".[dev,nope]"') == [
        "pip install -e \".[dev,nope]\": no extra 'nope' in pyproject.toml"
    ]
    assert "is not the pin .ci/run installs" in doc_runner.install_problems("pip install torch==2.12.0")[0]


@pytest.fixture(scope="module")
def worlds(tmp_path_factory, request):
    """One workspace per lane (`doc_runner.LANES`), the second a copy of the first. Where no page runs (the vLLM
    suite, `-m vllm`), one workspace with the quickstart's reward model, which its blocks serve."""
    root = tmp_path_factory.mktemp("docs")
    if not any(getattr(item, "originalname", None) == "test_page_runs" for item in request.session.items):
        world = doc_runner.build_workspace(root / "lane1", commands=doc_runner.WORKSPACE_COMMANDS[:1])
        yield [world, world]
        world.close()
        return
    first = doc_runner.build_workspace(root / "lane0")
    worlds = [first, doc_runner.copy_workspace(first, first.root.parent / "lane1")]
    yield worlds
    for world in worlds:
        world.close()


@pytest.fixture(scope="module")
def page_outcomes(worlds, request) -> dict:
    """The selected pages, run in their lanes at once (two pages at a time)."""
    selected = [item.callspec.params["page"] for item in request.session.items
                if getattr(item, "originalname", None) == "test_page_runs"]  # fmt: skip
    return run_pages(worlds, selected)


def _failures(outcomes) -> str:
    return "\n\n".join(f"{o.block.where} ({o.block.kind} {o.block.lang}):\n{o.detail}" for o in outcomes if not o.ok)


@pytest.mark.docs
@pytest.mark.slow
@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(REPO_ROOT)) for p in PAGES])
def test_page_runs(page_outcomes, page):
    outcomes = page_outcomes[page]
    assert all(o.ok for o in outcomes), _failures(outcomes)


@pytest.mark.docs
@pytest.mark.slow
def test_a_renamed_option_in_a_page_fails_it(worlds, tmp_path):
    """Planted breaks: a renamed flag in a command that runs, in a command that is only parsed, a renamed keyword in
    a Python block and in a YAML block, each taken from a real page; the unchanged blocks pass."""
    def block(page: str, contains: str) -> Block:
        return next(b for b in blocks_of(REPO_ROOT / page) if contains in b.text)

    cases = [
        (block("docs/data_format.md", "trl-rm-env validate"), "--format binary", "--fromat binary"),
        (block("docs/distributed.md", "zero3_cpu.yaml"), "--config_file", "--config-file-name"),
        (block("docs/data_format.md", "load_rank_dataset"), "on_invalid=", "on_invalid_rows="),
        (block("docs/reward_training.md", "lora_task_type"), "lora_alpha:", "lora_alfa:"),
    ]
    page = tmp_path / "planted.md"
    text = ""
    for original, old, new in cases:
        assert old in original.text, (original.where, old)
        mark = f"<!-- doc-test: {original.mark}: {original.reason} -->\n" if original.mark else ""
        text += f"{mark}```{original.lang}\n{original.text.replace(old, new)}\n```\n\n"
    page.write_text(text)
    outcomes = run_page(worlds[0], page)
    assert len(outcomes) == len(cases)
    assert not any(o.ok for o in outcomes), [(o.block.line, o.detail[-300:]) for o in outcomes if o.ok]
    assert "--fromat" in outcomes[0].detail and "--config-file-name" in outcomes[1].detail
    assert "on_invalid_rows" in outcomes[2].detail and "lora_alfa" in outcomes[3].detail


@pytest.mark.vllm
@pytest.mark.slow
def test_vllm_blocks_run(worlds):
    """The blocks marked `vllm` (`trl-rm-env serve --engine vllm`), in the vLLM suite."""
    if importlib.util.find_spec("vllm") is None:
        if os.environ.get("TRL_RM_ENV_REQUIRE_VLLM") == "1":
            raise RuntimeError("TRL_RM_ENV_REQUIRE_VLLM=1 but vLLM is not installed (see the README's test command)")
        pytest.skip("vLLM is not installed: the vLLM suite runs these blocks")
    pages = [p for p in PAGES if any(b.kind == "vllm" for b in blocks_of(p))]
    assert pages
    outcomes = [o for page in pages for o in run_page(worlds[1], page, vllm=True)]
    assert outcomes and all(o.ok for o in outcomes), _failures(outcomes)
