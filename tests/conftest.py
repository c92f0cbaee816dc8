"""Shared fixtures: offline tiny tokenizers and models, built once per session."""

from __future__ import annotations

import inspect
import os
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent

# Tests never reach the Hub: everything they load is built here.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
if os.environ.get("PYTEST_XDIST_WORKER"):
    # The README's `pytest -n 2`: each worker has one of the 2 cores. Two torch threads per worker would spin against
    # the other worker's (OpenMP waits busily): a 40-step training test took 78 s that way, 2 s alone.
    os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = "1"


# The longest modules first, measured (`--durations=0` of both suites, 2026-12-05): under `--dist loadfile`
# pytest-xdist hands each worker a module at a time, and by default it orders the modules by their number of tests,
# which leaves the long modules of few tests (the real tier, the quickstart, the installed wheel, the GenRM recipe) to
# the end: one worker still busy with them while the other has nothing left. In this order the end is the many short
# modules, which even the workers out. A module not named keeps its place after these.
LONGEST_FIRST = (
    "test_distributed.py", "test_docs_run.py", "test_real_model.py", "test_quickstart.py", "test_install.py",
    "test_genrm_recipe.py", "test_trl_compat.py", "test_trl_dropin.py", "test_trainer.py", "test_packed.py",
    "test_sharding.py", "test_async_grpo.py", "test_bad_input_server.py", "test_quantization.py",
    # the vLLM suite's
    "test_judges_vllm.py", "test_vllm.py", "test_real_model_vllm.py", "test_vllm_serve.py",
)  # fmt: skip


def pytest_configure(config):
    if os.environ.get("PYTEST_XDIST_WORKER"):
        import torch

        torch.set_num_threads(1)  # in case torch was imported before this file set OMP_NUM_THREADS
    if hasattr(config.option, "loadscopereorder"):  # pytest-xdist's scheduler keeps the order set below
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: each module's tests stay in order


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO_ROOT


@pytest.fixture(scope="session")
def tiny_tokenizer():
    """The default tiny ChatML tokenizer (no BOS)."""
    from trl_rm_env.tiny_models import build_tiny_tokenizer

    return build_tiny_tokenizer()


@pytest.fixture(scope="session")
def bos_tokenizer():
    """A tiny tokenizer whose chat template writes BOS and which also prepends BOS when encoding (double BOS)."""
    from trl_rm_env.tiny_models import build_tiny_tokenizer

    return build_tiny_tokenizer(bos_in_template=True)


@pytest.fixture(scope="session")
def other_vocab_tokenizer():
    """A tiny tokenizer with a different vocabulary (every id shifted): a policy tokenizer unlike the RM's."""
    from trl_rm_env.tiny_models import build_tiny_tokenizer

    return build_tiny_tokenizer(vocab_size=600, reserved_tokens=7)


@pytest.fixture(scope="session")
def tiny_rm(tiny_tokenizer):
    """A random tiny `Qwen3ForSequenceClassification` (fp32, eval mode). Do not train it in place."""
    from trl_rm_env.tiny_models import build_tiny_reward_model

    return build_tiny_reward_model(tiny_tokenizer, seed=0)


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory) -> Path:
    """`make_tiny` output: `<dir>/reward_model` and `<dir>/policy`, saved folders with tokenizers."""
    from trl_rm_env.tiny_models import make_tiny

    out = tmp_path_factory.mktemp("tiny-models")
    make_tiny(out)
    return out


@pytest.fixture(scope="session")
def bos_tiny_dir(tmp_path_factory) -> Path:
    """`make_tiny` output with the BOS-emitting chat template."""
    from trl_rm_env.tiny_models import make_tiny

    out = tmp_path_factory.mktemp("tiny-models-bos")
    make_tiny(out, bos_in_template=True)
    return out


@pytest.fixture(scope="session")
def real_dir():
    """`make_real` output (`<dir>/policy`, `<dir>/reward_model`: SmolLM2-135M-Instruct, tests/test_real_model.py),
    converted once per checkout: the folder `.real-models/<key>` is reused by later sessions and by the vLLM suite's
    own environment. The key hashes the converter's source and the model file, so a changed converter or file writes
    a new folder; `make_real` writes each folder atomically, so a session stopped mid-way leaves nothing half."""
    import hashlib

    from trl_rm_env import real_models

    try:  # the modules using this skip without the real model, unless TRL_RM_ENV_REQUIRE_REAL=1
        source = real_models.gguf_path()
        import gguf  # noqa: F401
    except ImportError as err:  # RealModelUnavailable too
        pytest.fail(f"TRL_RM_ENV_REQUIRE_REAL=1 but {err}")
    key = hashlib.sha256(Path(real_models.__file__).read_bytes() + f"{source.name}:{source.stat().st_size}".encode())
    out = REPO_ROOT / ".real-models" / key.hexdigest()[:16]
    real_models.make_real(out)
    return out


@pytest.fixture
def reference_varlen(monkeypatch):
    """The packed layout's GPU branch (`varlen`) on this CPU: `kernels.varlen_usable` answers yes for every device and
    dtype, and the kernel is `kernels.reference_varlen_attn` (the CUDA kernel's contract, segment by segment), so
    every line of the branch but the CUDA kernel runs here. Yields the list of the kernel's calls (their keyword
    arguments), to check that the branch ran."""
    from trl_rm_env.sharing import kernels

    calls: list[dict] = []

    def kernel(*args, **kwargs):
        calls.append(kwargs)
        return kernels.reference_varlen_attn(*args, **kwargs)

    kernel.__signature__ = inspect.signature(kernels.reference_varlen_attn)  # the names `run_varlen` reads
    monkeypatch.setattr(kernels, "varlen_kernel", lambda: kernel)
    monkeypatch.setattr(kernels, "varlen_usable", lambda device, dtype: True)
    yield calls


def pytest_sessionfinish(session):
    """Under pytest-xdist, a worker hands the documentation's block timings to the controller, which prints them."""
    import sys

    if hasattr(session.config, "workeroutput") and "doc_runner" in sys.modules:
        session.config.workeroutput["doc_timings"] = list(sys.modules["doc_runner"].TIMINGS)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    """pytest-xdist's controller: a worker's documentation block timings (`pytest_sessionfinish`), for the summary."""
    timings = getattr(node, "workeroutput", {}).get("doc_timings")
    if timings:
        import doc_runner

        doc_runner.TIMINGS.extend((seconds, where) for seconds, where in timings)


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """The documentation's census (tests/doc_runner.py) where its tests ran: how many blocks run, are parsed,
    compared as output, illustrative (each with its reason in the page), vLLM's, CI's."""
    if any(getattr(r, "nodeid", "").startswith("tests/test_docs_run.py") for rs in terminalreporter.stats.values()
           for r in rs):  # fmt: skip
        import doc_runner

        terminalreporter.write_line(doc_runner.census_line())
        slowest = sorted(doc_runner.TIMINGS, reverse=True)[:12]
        if slowest:
            terminalreporter.write_line("docs: slowest blocks: " + ", ".join(f"{w} {s:.0f}s" for s, w in slowest))
