"""Run the documentation: every fenced block of README.md and docs/*.md, as a reader would, offline.

A block is run unless the line right above its opening fence marks it, always with a reason:

    <!-- doc-test: illustrative: REASON -->   not run (a formula, a GPU-cluster script, a sketch)
    <!-- doc-test: output: REASON -->         what the block above printed; JSON is compared with it (the same keys
                                               and values, floats within 1e-4, but a reply's id and time)
    <!-- doc-test: parsed: REASON -->         commands checked, not run: every file they name exists and every
                                               flag (and every key of the YAML they pass) is one the program accepts
    <!-- doc-test: vllm -->                    run by the vLLM suite (its environment has vLLM)
    <!-- doc-test: ci -->                      the test command: `.ci/run` must run it verbatim

What "run" means per language: `bash` (each command, continuation lines joined, `a && b` step by step, in a fresh
shell; exit 0 and no traceback; a `serve` command is started, waited for, and stopped at the end of the page),
`console` (each `$ command` runs; every line shown after it is printed, a traceback only where one is shown),
`python` (the page's blocks in one namespace, in order, as a reader pastes them), `yaml` (every key is an option of
a recipe), `json` (parses; a record in the rank or regression schema validates).

The pages run in two lanes (`LANES`), each in its own workspace folder, where the reader's world is rebuilt small
(`SUBSTITUTIONS` and `build_workspace` declare all of it): the Hub ids the pages name are local folders of the same
name (the tiny offline models, small data sets in the Hub sets' own schema: `transformers` and `datasets` load a
local folder before the Hub), the pages' data files exist as small fixtures, install steps are checked and skipped
(the suite runs inside that install), training runs a few steps, ports are free ones, remote hosts are a served
tiny model, a command run before in the lane runs once.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
PAGES = [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md"))]
MARK = re.compile(r"^<!-- doc-test: (illustrative|output|parsed|vllm|ci)(?:: (.+?))? -->$")
FENCE = re.compile(r"^```(\S*)\s*$")
NEEDS_REASON = ("illustrative", "output", "parsed")
RUNNABLE = ("bash", "console", "python", "yaml", "json")
API_KEY = "s3cret"  # the key the serving page's curl commands send


@dataclass
class Block:
    """One fenced block of a page."""

    page: Path
    line: int  # of the opening fence, 1-based
    lang: str
    text: str
    mark: str | None = None
    reason: str | None = None

    @property
    def where(self) -> str:
        page = self.page.relative_to(REPO_ROOT) if self.page.is_relative_to(REPO_ROOT) else self.page
        return f"{page}:{self.line}"

    @property
    def kind(self) -> str:
        """What the runner does with it: run, parsed, output, illustrative, vllm or ci."""
        return self.mark or "run"


def blocks_of(page: Path) -> list[Block]:
    """The fenced blocks of `page`, each with the doc-test mark of the line above its fence."""
    lines = page.read_text(encoding="utf-8").splitlines()
    blocks, i = [], 0
    while i < len(lines):
        fence = FENCE.match(lines[i])
        if fence:
            end = next((j for j in range(i + 1, len(lines)) if lines[j].startswith("```")), None)
            if end is None:
                raise AssertionError(f"{page.name}:{i + 1}: a fence that never closes")
            mark = MARK.match(lines[i - 1]) if i else None
            blocks.append(Block(page, i + 1, fence.group(1), "\n".join(lines[i + 1 : end]),
                                mark.group(1) if mark else None, mark.group(2) if mark else None))  # fmt: skip
            i = end
        i += 1
    return blocks


def problems_of(block: Block) -> list[str]:
    """Why `block` cannot be run or accounted for: an unknown language unmarked, a mark without its reason."""
    if block.mark in NEEDS_REASON and not block.reason:
        return [f"{block.where}: '{block.mark}' needs a reason (<!-- doc-test: {block.mark}: why -->)"]
    if block.mark is None and block.lang not in RUNNABLE:
        return [f"{block.where}: a ```{block.lang or '(no language)'} block the runner cannot run: mark it "
                "<!-- doc-test: output: ... --> or <!-- doc-test: illustrative: ... -->"]  # fmt: skip
    if block.mark == "parsed" and block.lang != "bash":
        return [f"{block.where}: 'parsed' is for shell commands"]
    return []


# --- commands ----------------------------------------------------------------------------------------------------


def commands_of(text: str) -> list[str]:
    """The shell commands of a bash block: continuation lines and lines inside an open quote joined (a quote keeps
    its newlines), comments and blank lines dropped."""
    commands, current = [], ""
    for line in text.splitlines():
        stripped = line.strip()
        if not current and (not stripped or stripped.startswith("#")):
            continue
        if stripped.endswith("\\"):
            current += stripped[:-1].rstrip() + " "
            continue
        current += line if current and _open_quote(current) else stripped
        if _open_quote(current):
            current += "\n"
            continue
        commands.append(_strip_comment(current))
        current = ""
    return [c for c in commands if c]


def _chain(command: str) -> list[str]:
    """The steps of an `a && b && c` command (outside quotes), run one after the other while each succeeds."""
    steps, quote, start = [], None, 0
    for i, ch in enumerate(command):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif command.startswith(" && ", i):
            steps.append(command[start:i].strip())
            start = i + 4
    return [*steps, command[start:].strip()]


def _scan(command: str) -> tuple[int, bool]:
    """Where `command`'s trailing `# comment` starts (outside quotes; its length where it has none), and whether a
    quote is still open there."""
    quote = None
    for i, ch in enumerate(command):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or command[i - 1].isspace()):
            return i, False
    return len(command), quote is not None


def _open_quote(command: str) -> bool:
    """Whether `command` ends inside a quoted string."""
    return _scan(command)[1]


def _strip_comment(command: str) -> str:
    """`command` without a trailing `# comment` (outside quotes)."""
    return command[: _scan(command)[0]].rstrip()


VARIANT = re.compile(r"^(\s+--[\w-]+(\s+[^-\s]\S*)?)+$")  # flags added to a command
INSTALL_STEP = re.compile(r"^(python3? -m venv |\. \S*activate|(\S*/)?pip3? (un)?install )")
TRAINING = re.compile(
    r"(trl-rm-env (train|train-regression|grpo|train-genrm)\b|recipes/(train_rm|train_regression_rm|grpo_rm|train_genrm)\.py)"
)
GPU_CONFIGS = ("rm.yaml", "grpo_rm.yaml", "rm_regression.yaml", "genrm.yaml")


def install_problems(step: str) -> list[str]:
    """What is wrong with an install step the runner skips: an extra `pyproject.toml` lacks, a pin `.ci/run` does
    not use."""
    import tomllib

    extras = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    ci = (REPO_ROOT / ".ci" / "run").read_text()
    problems = [f"{step}: no extra {name!r} in pyproject.toml" for group in re.findall(r"\[([\w,-]+)\]", step)
                for name in group.split(",") if name not in extras]  # fmt: skip
    problems += [f"{step}: {pin} is not the pin .ci/run installs" for pin in re.findall(r"[\w-]+==[\w.]+", step)
                 if pin not in ci]  # fmt: skip
    return problems


def substitute_command(command: str, world: Workspace) -> str:
    """`command` as it runs here (every change is one of `SUBSTITUTIONS`, listed with its reason); an install step
    is checked (`install_problems`) and dropped."""
    for step in command.split(" && "):
        if INSTALL_STEP.match(step.strip()):
            problems = install_problems(step.strip())
            assert not problems, "\n".join(problems)
    steps = [s for s in command.split(" && ") if not INSTALL_STEP.match(s.strip())]
    command = " && ".join(steps)
    for port, free in world.ports.items():
        command = re.sub(rf"(?<=[:\s]){port}\b", str(free), command)
    if re.search(r"\bserve\b.*--engine vllm\b", command) and "--enforce-eager" not in command:
        command += " --enforce-eager"  # vLLM eager on the CPU: its compiling start is tests/test_vllm.py's engine's
    if TRAINING.search(command):
        extra = []
        config = re.search(r"--config\s+(\S+)", command)
        if config and Path(config.group(1)).name in GPU_CONFIGS:
            extra += ["--use_cpu", "true"]
            if "grpo" in config.group(1) or "genrm" in config.group(1):
                extra += ["--max_completion_length", "16"]
        if "--max_steps" not in command:
            extra += ["--max_steps", "2"]
        command = " && ".join(f"{s} {' '.join(extra)}" if TRAINING.search(s) else s for s in command.split(" && "))
    return command


SUBSTITUTIONS = {
    "Hub ids": "a local folder of the same name in the workspace: models are the tiny offline ones (a trained tiny "
               "RM for the Skywork RMs, the tiny causal LM for Qwen3 policies and judges), data sets are a few rows "
               "in the Hub set's own schema and configs",  # fmt: skip
    "data files": "the page's file names exist in the workspace as small fixtures in the documented format",
    "install steps": "`python3 -m venv`, `. .venv/bin/activate`, `pip install/uninstall` are skipped (the suite runs "
                     "inside that install), their extras and pins checked against pyproject.toml and .ci/run",  # fmt: skip
    "training length": "`--max_steps 2` appended to a training command without one; a Python block's "
                       "`max_steps=N` runs 2 steps",
    "GPU configs": "rm.yaml, grpo_rm.yaml, rm_regression.yaml, genrm.yaml on the CPU: `--use_cpu true` (and "
                   "GRPO's `--max_completion_length 16`)",  # fmt: skip
    "ports": "8000 and 8001 are free ports",
    "vLLM's start": "`--enforce-eager` appended to `serve --engine vllm` (on the CPU a compiling start costs 15 to 35 s "
                    "more; the compiled engine is tested by tests/test_vllm.py's shared scorer)",
    "repeats": "a command run before in the lane runs once; one that adds flags to it has those flags checked "
               "(names, as a `parsed` block's), not another run",  # fmt: skip
    "remote hosts": "http://10.0.0.x:8000, rm-0/rm-1 are the page's served tiny RM",
    "`...` in a Python call": "the arguments of the TRL script around the snippet (`GIVEN`)",
}


# --- Python ------------------------------------------------------------------------------------------------------

GIVEN = '''
# What the script around a snippet already has (TRL's examples' names): imports, a policy, GRPO arguments, prompts.
from datasets import Dataset
from trl import GRPOConfig, GRPOTrainer
from trl_rm_env import *  # noqa: F403
training_kwargs = dict(output_dir="outputs/given-grpo", per_device_train_batch_size=4, num_generations=2,
                       max_completion_length=8, max_steps=1, report_to="none", use_cpu=True, bf16=False)
training_args = GRPOConfig(**training_kwargs)
model = "tiny-models/policy"
dataset = prompts = Dataset.from_list([{"prompt": [{"role": "user", "content": f"What is {i} + {i}?"}]}
                                       for i in range(4)])
JUDGE, RM = "tiny-models/policy", "outputs/rm-tiny"
'''

ELLIPSES = [
    (r"\bGRPOTrainer\(\.\.\.\)", "GRPOTrainer(model=model, reward_funcs=[RewardModelEnvironment(RM)], "
                                 "args=training_args, train_dataset=dataset)"),  # fmt: skip
    (r"\bGRPOConfig\(\.\.\.,", "GRPOConfig(**training_kwargs,"),
    (r"\bmodel=\.\.\.", "model=model"),
    (r"\bargs=\.\.\.", "args=training_args"),
    (r"\btrain_dataset=\.\.\.", "train_dataset=dataset"),
]


def substitute_python(code: str, world: Workspace) -> str:
    """A Python block as it runs here: `...` arguments from `GIVEN`, remote hosts the page's served model."""
    for pattern, replacement in ELLIPSES:
        code = re.sub(pattern, replacement, code)
    code = re.sub(r"\bmax_steps=\d+", "max_steps=2", code)  # training length, as for a command
    for host in ("http://10.0.0.5:8000", "http://10.0.0.6:8000", "http://rm-0:8000", "http://rm-1:8000"):
        code = code.replace(host, world.served_url or host)
    return code


WORKER = r'''
import contextlib, io, json, sys, traceback
for line in sys.stdin:
    request = json.loads(line)
    if request.get("reset"):  # a new page: a fresh namespace (the modules stay imported)
        namespace = {"__name__": "__main__"}
        exec(compile(sys.argv[1], "<given>", "exec"), namespace)
        sys.__stdout__.write(json.dumps({"ok": True}) + "\n")
        sys.__stdout__.flush()
        continue
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            exec(compile(request["code"], request["where"], "exec"), namespace)
        reply = {"ok": True, "out": out.getvalue()}
    except BaseException:
        reply = {"ok": False, "out": out.getvalue(), "error": traceback.format_exc(limit=-8)}
    sys.__stdout__.write(json.dumps(reply) + "\n")
    sys.__stdout__.flush()
'''


# --- the workspace -----------------------------------------------------------------------------------------------


@dataclass
class Workspace:
    """The reader's world, small: a folder with the repository's recipes and configs, the Hub ids as local folders,
    the pages' data files; free ports; the environment the commands run in."""

    root: Path
    env: dict[str, str]
    ports: dict[int, int] = field(default_factory=dict)
    served_url: str | None = None
    ran: dict[str, str] = field(default_factory=dict)  # each command run here, as the page has it -> its output
    python: subprocess.Popen | None = None  # the interpreter of the Python blocks, one per workspace

    def interpreter(self) -> subprocess.Popen:
        """The Python blocks' interpreter (started once; each page resets its namespace)."""
        if self.python is None or self.python.poll() is not None:
            # stderr (logs, progress bars) to a file: a pipe nobody reads would block the interpreter once full
            with open(self.root / "python-blocks.log", "a") as log:
                self.python = subprocess.Popen([sys.executable, "-c", WORKER, GIVEN], cwd=self.root, env=self.env,
                                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
                                               text=True)  # fmt: skip
        return self.python

    def log_tail(self, name: str) -> str:
        """The end of a log file of this workspace."""
        path = self.root / name
        return path.read_text(errors="replace")[-4000:] if path.is_file() else ""

    def close(self) -> None:
        if self.python is not None:
            self.python.stdin.close()
            self.python.wait(timeout=60)
            self.python = None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _write_jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")


def _hub_data(root: Path, repo: str, splits: dict[str, list[dict]], config: str | None = None) -> None:
    """A local folder named like the Hub data set, its splits (and config) declared in README.md as on the Hub."""
    folder = root / repo
    sub = config or "data"
    files = []
    for split, rows in splits.items():
        _write_jsonl(folder / sub / f"{split}.jsonl", rows)
        files.append(f"  - split: {split}\n    path: {sub}/{split}.jsonl")
    name = config or "default"
    (folder / "README.md").write_text(f"---\nconfigs:\n- config_name: {name}\n  data_files:\n" + "\n".join(files)
                                      + "\n---\n", encoding="utf-8")  # fmt: skip


def _sums(n: int, offset: int = 0) -> list[tuple[str, str, str]]:
    return [(f"What is {a} + {a + offset}?", f"{a} + {a + offset} = {2 * a + offset}.", f"It is {2 * a + offset + 1}.")
            for a in range(n)]  # fmt: skip


def build_workspace(root: Path, commands: tuple[str, ...] | None = None) -> Workspace:
    """The workspace every page runs in (see the module docstring); `commands`: the `WORKSPACE_COMMANDS` run in it
    (all by default; the vLLM suite's blocks need the quickstart's reward model only)."""
    from trl_rm_env.data.loaders import load_rank_records
    from trl_rm_env.tiny_models import make_tiny

    root.mkdir(parents=True, exist_ok=True)
    for name in ("recipes", "accelerate_configs", "benchmarks", "scripts", "pyproject.toml"):
        (root / name).symlink_to(REPO_ROOT / name)
    make_tiny(root / "tiny-models")
    (root / "outputs").mkdir()
    for hub_id, target in {"Qwen/Qwen3-0.6B": "tiny-models/policy", "Qwen/Qwen3-8B": "tiny-models/policy",
                           "Skywork/Skywork-Reward-V2-Qwen3-0.6B": "outputs/rm-tiny",
                           "Skywork/Skywork-Reward-V2-Qwen3-8B": "outputs/rm-tiny",
                           "outputs/rm": "outputs/rm-tiny",
                           "outputs/rm-helpsteer2": "outputs/rm-regression-tiny"}.items():  # fmt: skip
        (root / hub_id).parent.mkdir(parents=True, exist_ok=True)
        (root / hub_id).symlink_to(root / target, target_is_directory=True)

    sums = _sums(6)
    messages = [[{"role": "user", "content": q}] for q, _, _ in sums]
    _hub_data(root, "nvidia/HelpSteer3", {split: [
        {"domain": "general", "language": "english", "context": m, "response1": good, "response2": bad,
         "overall_preference": -2} for m, (_, good, bad) in zip(messages, sums)] for split in ("train", "validation")},
        config="preference")  # fmt: skip
    _hub_data(root, "nvidia/HelpSteer2", {split: [
        {"prompt": q, "response": answer, "helpfulness": 3, "correctness": 4 if answer == good else 1,
         "coherence": 4, "complexity": 1, "verbosity": 1 + len(answer) % 3}
        for q, good, bad in sums for answer in (good, bad)] for split in ("train", "validation")})  # fmt: skip
    _hub_data(root, "trl-lib/ultrafeedback-prompt", {"train": [{"prompt": m} for m in messages]})
    _hub_data(root, "org/dataset", {"test": [{"chosen": m + [{"role": "assistant", "content": good}],
                                              "rejected": m + [{"role": "assistant", "content": bad}]}
                                             for m, (_, good, bad) in zip(messages, sums)]})  # fmt: skip
    rb2 = [{"id": str(i), "prompt": q, "chosen": [good], "rejected": [bad, bad + " Sure.", "No."], "num_correct": 1,
            "subset": subset} for i, (subset, (q, good, bad)) in
           enumerate(zip(["Factuality", "Precise IF", "Math", "Safety", "Focus", "Factuality"], sums))]  # fmt: skip
    rb2 += [{"id": "ref:0", "prompt": sums[0][0], "chosen": [sums[0][1]], "rejected": [sums[0][2]], "num_correct": 1,
             "subset": "Ties"},
            {"id": "tied:0", "prompt": sums[0][0], "chosen": [sums[0][1], "Two plus... " + sums[0][1]],
             "rejected": [sums[0][2]], "num_correct": 2, "subset": "Ties"}]  # fmt: skip
    _hub_data(root, "allenai/reward-bench-2", {"test": rb2})
    from datasets import Dataset

    Dataset.from_list(rb2).to_parquet(str(root / "rb2.parquet"))

    # The pages' own data files.
    llmbar = [{"input": q, "output_1": good, "output_2": bad, "label": 1 + i % 2} if i % 2 == 0 else
              {"input": q, "output_1": bad, "output_2": good, "label": 2} for i, (q, good, bad) in enumerate(sums)]
    for name in ("natural", "adversarial-neighbor", "adversarial-gptinst", "adversarial-gptout", "adversarial-manual"):
        (root / f"{name}.json").write_text(json.dumps(llmbar), encoding="utf-8")
        (root / "llmbar").mkdir(exist_ok=True)
        (root / "llmbar" / f"{name}.json").write_text(json.dumps(llmbar), encoding="utf-8")
    import gzip

    hh = [{"chosen": f"\n\nHuman: {q}\n\nAssistant: {good}", "rejected": f"\n\nHuman: {q}\n\nAssistant: {bad}"}
          for q, good, bad in sums]
    hh.append({"chosen": f"\n\nHuman: {sums[0][0]}\n\nAssistant:", "rejected": f"\n\nHuman: {sums[0][0]}\n\nAssistant: no"})
    with gzip.open(root / "harmless-base-test.jsonl.gz", "wt", encoding="utf-8") as f:
        f.writelines(json.dumps(r) + "\n" for r in hh)
    records, _ = load_rank_records("sample:in_domain")
    _write_jsonl(root / "data" / "train.jsonl", records[:24])
    _write_jsonl(root / "data" / "val.jsonl", records[24:32])
    _write_jsonl(root / "data" / "prefs.jsonl", records[:8] + [{"context": [], "completions": []}])
    _write_jsonl(root / "prefs.jsonl", [{"prompt": m, "chosen": [{"role": "assistant", "content": good}],
                                         "rejected": [{"role": "assistant", "content": bad}]}
                                        for m, (_, good, bad) in zip(messages, sums)])  # fmt: skip
    # "Your own" configs of the pages: the tiny ones under the reader's names.
    (root / "my_rm.yaml").symlink_to(REPO_ROOT / "recipes" / "configs" / "rm_tiny.yaml")
    (root / "my_accelerate.yaml").symlink_to(REPO_ROOT / "accelerate_configs" / "ddp_cpu.yaml")

    # One thread a command: two lanes on two cores.
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "CI": "true", "OMP_NUM_THREADS": "1",
           "TOKENIZERS_PARALLELISM": "false", "KEY": API_KEY, "HF_DATASETS_CACHE": str(root / ".datasets-cache"),
           "TRL_RM_ENV_API_KEY": API_KEY,
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}  # fmt: skip
    env.pop("PYTEST_CURRENT_TEST", None)
    world = Workspace(root, env, {8000: free_port(), 8001: free_port()})
    # The reward models the pages read before (or without) training them, by the pages' own commands (both at once):
    # they count as run in every lane (`Workspace.ran`), so the page that has them does not run them again.
    runs = {}
    for command in WORKSPACE_COMMANDS if commands is None else commands:
        assert any(command in _chain(c) for page in PAGES for b in blocks_of(page) if b.lang == "bash"
                   for c in commands_of(b.text)), f"no page has the workspace's command {command!r}"  # fmt: skip
        runs[command] = subprocess.Popen(substitute_command(command, world), shell=True, cwd=root, env=env,
                                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                         stdin=subprocess.DEVNULL)  # fmt: skip
    for command, run in runs.items():
        out, err = run.communicate(timeout=600)
        assert run.returncode == 0, f"workspace: {command} failed:\n{out[-2000:]}\n{err[-3000:]}"
        world.ran[command] = out
    return world


WORKSPACE_COMMANDS = (
    "accelerate launch --config_file accelerate_configs/cpu.yaml recipes/train_rm.py "
    "--config recipes/configs/rm_tiny.yaml",  # the README's quickstart: outputs/rm-tiny
    "accelerate launch recipes/train_regression_rm.py --config recipes/configs/rm_regression_tiny.yaml",  # regression.md
)


# --- running a page ----------------------------------------------------------------------------------------------


def run_command(argv: list[str], world: Workspace, timeout: float) -> subprocess.CompletedProcess:
    """`argv` in `world`, in its own process group, which is killed whole when it outlives `timeout` (an
    `accelerate launch` leaves its workers otherwise)."""
    proc = subprocess.Popen(argv, cwd=world.root, env=world.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, text=True, start_new_session=True)  # fmt: skip
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


@dataclass
class Outcome:
    block: Block
    ok: bool
    detail: str = ""
    out: str = ""
    seconds: float = 0.0


TIMINGS: list[tuple[float, str]] = []  # (seconds, block) of every block run in this process


class PageRun:
    """Runs one page's blocks in order in `world`: a Python interpreter and servers live until `close()`."""

    def __init__(self, world: Workspace, timeout: float = 600.0):
        self.world, self.timeout = world, timeout
        self.fresh = True  # the page's first Python block resets the interpreter's namespace
        self.servers: dict[int, subprocess.Popen] = {}
        self.last_out = ""

    # Python
    def _ask(self, request: dict) -> str:
        worker = self.world.interpreter()
        worker.stdin.write(json.dumps(request) + "\n")
        worker.stdin.flush()
        return worker.stdout.readline()

    def run_python(self, block: Block) -> Outcome:
        if self.fresh:
            self.fresh = False
            if not self._ask({"reset": True}):
                return Outcome(block, False, f"the interpreter ended:\n{self.world.log_tail('python-blocks.log')}")
        line = self._ask({"code": substitute_python(block.text, self.world), "where": block.where})
        if not line:
            return Outcome(block, False, f"the interpreter ended:\n{self.world.log_tail('python-blocks.log')}")
        reply = json.loads(line)
        return Outcome(block, reply["ok"], reply.get("error", ""), reply["out"])

    # Shell
    def run_bash(self, block: Block) -> Outcome:
        outs = []
        for original in (step for command in commands_of(block.text) for step in _chain(command)):
            if original in self.world.ran:  # the same command on an earlier page: run once
                outs.append(self.world.ran[original])
                continue
            base = next((r for r in self.world.ran if original.startswith(r + " ") and VARIANT.match(original[len(r):])),
                        None)  # fmt: skip
            if base is not None:  # a command run before, with flags added: the flags are checked
                problems = check_command(original, self.world)
                if problems:
                    return Outcome(block, False, "\n".join(problems))
                continue
            command = substitute_command(original, self.world)
            if not command.strip():
                continue
            if re.search(r"(^|\s)(trl-rm-env|vllm) serve\b", command):
                problem = self._serve(command)
                if problem:
                    return Outcome(block, False, problem)
                continue
            out = run_command(["bash", "-o", "pipefail", "-c", command], self.world, self.timeout)  # fmt: skip
            outs.append(out.stdout)
            self.world.ran[original] = out.stdout
            if out.returncode != 0 or "Traceback (most recent call last)" in out.stderr:
                return Outcome(block, False, f"$ {command}\nexit {out.returncode}\n{out.stdout[-3000:]}\n"
                                             f"{out.stderr[-5000:]}")  # fmt: skip
        return Outcome(block, True, out="".join(outs))

    def run_console(self, block: Block) -> Outcome:
        """A ```console block: each `$ command` runs; every line shown after it must be a line of its output, and a
        traceback only where one is shown."""
        sessions = re.split(r"^\$ ", block.text, flags=re.M)[1:]
        for session in sessions:
            command, *shown = session.splitlines()
            out = run_command(["bash", "-c", substitute_command(command, self.world)], self.world, self.timeout)
            printed = (out.stdout + out.stderr).splitlines()
            missing = [line for line in shown if line not in printed]
            if "Traceback (most recent call last):" in printed and "Traceback (most recent call last):" not in shown:
                missing.append("(no traceback)")
            if missing:
                return Outcome(block, False, f"$ {command}\nnot printed: {missing}\nprinted:\n" + "\n".join(printed[-30:]))
        return Outcome(block, True)

    def _serve(self, command: str, timeout: float = 240.0) -> str | None:
        port = int(re.search(r"--port\s+(\d+)", command).group(1)) if "--port" in command else 8000
        if port in self.servers:  # the reader stops the server on that port first
            self._stop(self.servers.pop(port))
        log = f"server-{port}.log"  # a file, not a pipe: a served run logs for as long as it lives
        with open(self.world.root / log, "w") as out:
            server = subprocess.Popen(["bash", "-c", command], cwd=self.world.root, env=self.world.env, stdout=out,
                                      stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        self.servers[port] = server
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if server.poll() is not None:
                return f"$ {command}\nthe server exited {server.returncode}:\n{self.world.log_tail(log)}"
            with contextlib.suppress(OSError):
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
                self.world.served_url = f"http://127.0.0.1:{port}"
                return None
            time.sleep(0.5)
        return f"$ {command}\nno answer on /health within {timeout:.0f} s"

    def run(self, block: Block) -> Outcome:
        start = time.monotonic()
        outcome = self._run(block)
        outcome.seconds = time.monotonic() - start
        TIMINGS.append((outcome.seconds, block.where))
        return outcome

    def _run(self, block: Block) -> Outcome:
        try:
            if block.lang == "python":
                outcome = self.run_python(block)
            elif block.kind == "ci":
                outcome = Outcome(block, *check_ci(block))
            elif block.lang == "console":
                outcome = self.run_console(block)
            elif block.lang == "bash" and block.kind == "parsed":
                outcome = Outcome(block, *check_commands(block, self.world))
            elif block.lang == "bash":
                outcome = self.run_bash(block)
            elif block.lang == "yaml":
                outcome = Outcome(block, *check_yaml(block))
            elif block.lang == "json" and block.kind == "output":
                outcome = Outcome(block, *compare_json(block, self.last_out))
            elif block.lang == "json":
                outcome = Outcome(block, *check_json(block))
            else:
                raise AssertionError(f"{block.where}: nothing runs a ```{block.lang} block")
        except AssertionError as err:
            outcome = Outcome(block, False, str(err))
        except subprocess.TimeoutExpired as err:
            outcome = Outcome(block, False, f"timed out after {err.timeout:.0f} s: {err.cmd}")
        self.last_out = outcome.out
        return outcome

    @staticmethod
    def _stop(server: subprocess.Popen) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait(timeout=30)

    def close(self) -> None:
        for server in self.servers.values():
            self._stop(server)
        self.servers.clear()
        self.world.served_url = None


def runnable(block: Block, vllm: bool = False) -> bool:
    """Whether `block` runs in this suite (`vllm`: the vLLM suite runs the blocks marked `vllm`); an output block
    runs (is compared) where it is JSON."""
    if vllm:
        return block.kind == "vllm"
    if block.kind == "output":
        return block.lang == "json"
    return block.kind == "ci" or block.kind in ("run", "parsed") and block.lang in RUNNABLE


# Two lanes, one per core: each command is mostly one process importing torch and transformers, so two pages at a
# time take half the time. A lane's pages share a workspace, in this order (the quickstart's outputs for the pages
# after it, a command run once per lane: the pages that repeat the README's quickstart commands, reward_training.md
# and environment.md, run in its lane); the lanes' workspaces are copies. The lanes take about as long (measured:
# `python -m pytest tests/test_docs_run.py --durations=0` and the slowest blocks printed at the end of the session).
LANES = (
    ("README.md", "docs/quickstart.md", "docs/reward_training.md", "docs/environment.md", "docs/reliability.md",
     "docs/coming_from_trl.md", "docs/index.md", "docs/performance.md"),
    ("docs/evaluate_and_serve.md", "docs/regression.md", "docs/judges.md", "docs/data_format.md",
     "docs/distributed.md", "docs/genrm_training.md"),
)  # fmt: skip


def lane_of(page: Path) -> int:
    """The lane that runs `page` (a page no lane names: the second)."""
    name = str(page.relative_to(REPO_ROOT))
    return next((i for i, lane in enumerate(LANES) if name in lane), 1)


def copy_workspace(world: Workspace, root: Path) -> Workspace:
    """Another workspace like `world` (its files copied, links kept), with its own ports."""
    import shutil

    shutil.copytree(world.root, root, symlinks=True, ignore=shutil.ignore_patterns(".datasets-cache"))
    for link in root.rglob("*"):  # links into the first workspace point into this one
        if link.is_symlink() and str(link.readlink()).startswith(str(world.root)):
            target = root / link.readlink().relative_to(world.root)
            link.unlink()
            link.symlink_to(target, target_is_directory=True)
    env = {**world.env, "HF_DATASETS_CACHE": str(root / ".datasets-cache")}
    return Workspace(root, env, {port: free_port() for port in world.ports}, ran=dict(world.ran))


def run_pages(worlds: list[Workspace], pages: list[Path]) -> dict[Path, list[Outcome]]:
    """`pages`, each lane in its own thread and workspace; the outcomes of each page."""
    from concurrent.futures import ThreadPoolExecutor

    def lane(i: int) -> dict[Path, list[Outcome]]:
        order = [p for name in LANES[i] for p in pages if str(p.relative_to(REPO_ROOT)) == name]
        order += [p for p in pages if lane_of(p) == i and p not in order]
        return {page: run_page(worlds[i], page) for page in order}

    with ThreadPoolExecutor(len(worlds)) as pool:
        results = list(pool.map(lane, range(len(worlds))))
    return {page: outcomes for result in results for page, outcomes in result.items()}


def run_page(world: Workspace, page: Path, vllm: bool = False) -> list[Outcome]:
    """Every block of `page` that runs in this suite, in page order."""
    run = PageRun(world)
    try:
        return [run.run(block) for block in blocks_of(page) if runnable(block, vllm)]
    finally:
        run.close()


# --- checks without running --------------------------------------------------------------------------------------

_HELP: dict[tuple[str, ...], set[str]] = {}


def _flags_of(program: tuple[str, ...], world: Workspace) -> set[str]:
    """The `--flags` a program takes (cached per program): its parser's, read in this process for the recipes and
    `accelerate launch` (what their `--help` prints), else what its `--help` names."""
    if program not in _HELP:
        _HELP[program] = _parser_flags(program) or _help_flags(program, world)
    return _HELP[program]


def _parser_flags(program: tuple[str, ...]) -> set[str] | None:
    import importlib

    from trl_rm_env.recipes.launch import LAUNCH_HELP, RECIPES

    if program == ("accelerate", "launch"):
        from accelerate.commands.launch import launch_command_parser

        return {s for s in launch_command_parser()._option_string_actions if s.startswith("--")}
    if program[0] == "trl-rm-env" and program[1] in RECIPES:
        recipe, extra = RECIPES[program[1]], set(re.findall(r"--[\w-]+", LAUNCH_HELP))  # its help's epilog
    elif program[-1].startswith("recipes/") and Path(program[-1]).stem in RECIPES.values():
        recipe, extra = Path(program[-1]).stem, set()
    else:
        return None
    parser = importlib.import_module(f"trl_rm_env.recipes.{recipe}").make_parser()
    return {s for s in parser._option_string_actions if s.startswith("--")} | extra


def _help_flags(program: tuple[str, ...], world: Workspace) -> set[str]:
    out = subprocess.run([*program, "--help"], cwd=world.root, env=world.env, capture_output=True, text=True,
                         timeout=300, stdin=subprocess.DEVNULL)  # fmt: skip
    assert out.returncode == 0, f"{' '.join(program)} --help: exit {out.returncode}\n{out.stderr[-3000:]}"
    return set(re.findall(r"--[A-Za-z][\w-]*", out.stdout))


def check_commands(block: Block, world: Workspace) -> tuple[bool, str]:
    """A `parsed` block: the files each command names exist, its flags are the program's, a `--config`'s keys too."""
    problems = []
    for command in commands_of(block.text):
        problems += check_command(command, world)
    return not problems, "\n".join(problems)


def check_command(command: str, world: Workspace) -> list[str]:
    """Problems of one command of a `parsed` block (see `check_commands`)."""
    problems: list[str] = []
    for part in re.split(r"\s*(?:&&|\|)\s*", command):
        words = [w for w in shlex.split(part) if not re.match(r"^[A-Z_]+=", w)]
        while words and words[0] in ("srun", "bash", "-c", "exec"):
            words = words[1:]
        if len(words) == 1 and " " in words[0]:  # bash -c '...': the command inside
            problems += check_command(words[0], world)
            continue
        if not words or words[0] in ("export", "curl", "scontrol", "head"):
            continue
        if INSTALL_STEP.match(part.strip()):
            problems += install_problems(part.strip())
            continue
        if words[:2] == ["accelerate", "launch"]:
            script = next((w for w in words if w.endswith(".py")), None)
            if script is None:
                return [*problems, f"{part}: no script"]
            launch_args = words[2 : words.index(script)]
            if "--config_file" in launch_args:
                config_file = launch_args[launch_args.index("--config_file") + 1]
                if not (world.root / config_file).is_file():
                    problems.append(f"{config_file}: no such file")
            known = _flags_of(("accelerate", "launch"), world)
            problems += [f"accelerate launch: unknown flag {f}" for f in launch_args if f.startswith("--") and f not in known]
            program, args = (sys.executable, script), words[words.index(script) + 1 :]
        elif words[0] == "trl-rm-env":
            program, args = tuple(words[:2]), words[2:]
        elif words[0] in ("python", "python3"):
            program, args = (sys.executable, words[1]), words[2:]
        else:
            return [*problems, f"{part}: the runner cannot check '{words[0]}' (mark the block illustrative)"]
        if program[-1].endswith(".py") and not (world.root / program[-1]).is_file():
            return [*problems, f"{program[-1]}: no such file"]
        known = _flags_of(program, world) | {"--config"}  # TrlParser's, in every recipe
        if program[0] == "trl-rm-env" and program[1] in ("train", "train-regression", "grpo"):
            known |= _flags_of(("accelerate", "launch"), world)  # its help: any flag of `accelerate launch`
        problems += [f"{part}: unknown flag {f}" for f in args if f.startswith("--") and f not in known]
        if "--config" in args:
            config = args[args.index("--config") + 1]
            path = next((p for p in (world.root / config, REPO_ROOT / "recipes" / "configs" / config) if p.is_file()),
                        None)  # fmt: skip
            if path is None:
                problems.append(f"{part}: --config {config}: no such file or shipped config")
            else:
                problems += [f"{config}: key {k!r} is not an option of {' '.join(program[-2:])}"
                             for k in _yaml_keys(path.read_text()) if f"--{k}" not in known]  # fmt: skip
    return problems


def _yaml_keys(text: str) -> list[str]:
    import yaml

    return list(yaml.safe_load(text) or {})


def recipe_options() -> set[str]:
    """Every option a recipe takes (train, train-regression, grpo, train-genrm), by its field name."""
    import importlib

    options: set[str] = set()
    for name in ("train_rm", "train_regression_rm", "grpo_rm", "train_genrm"):
        parser = importlib.import_module(f"trl_rm_env.recipes.{name}").make_parser()
        options |= {s[2:] for s in parser._option_string_actions if s.startswith("--")}
    return options


def check_ci(block: Block) -> tuple[bool, str]:
    """A `ci` block: `.ci/run` runs each of its commands (the install steps included) verbatim."""
    ci = (REPO_ROOT / ".ci" / "run").read_text()
    missing = [c for c in commands_of(block.text) if c not in ci]
    return not missing, f"{block.where}: .ci/run does not run {missing}" if missing else ""


def check_yaml(block: Block) -> tuple[bool, str]:
    """Every key of a ```yaml block is an option of some recipe (train, train-regression or grpo)."""
    options = recipe_options()
    unknown = [k for k in _yaml_keys(block.text) if k not in options]
    return not unknown, f"{block.where}: not an option of any recipe: {unknown}" if unknown else ""


def check_json(block: Block) -> tuple[bool, str]:
    """A ```json block parses; a record in the rank or regression schema validates."""
    try:
        value = json.loads(block.text)
    except json.JSONDecodeError as err:
        return False, f"{block.where}: not JSON: {err}"
    from trl_rm_env.data.loaders import load_rank_records
    from trl_rm_env.data.regression import load_regression_records

    if isinstance(value, dict) and "completions" in value:
        load_rank_records([value], on_invalid="raise", log=False)
    elif isinstance(value, dict) and "attributes" in value:
        load_regression_records([value], on_invalid="raise", log=False)
    return True, ""


def _shape(value):
    if isinstance(value, dict):
        return {k: _shape(v) for k, v in value.items()}
    if isinstance(value, list) and value:
        return [_shape(value[0])]
    return type(value).__name__ if value is not None else None


VOLATILE = ("id", "created")  # a reply's own id and time


def compare_json(block: Block, printed: str) -> tuple[bool, str]:
    """An `output` JSON block against what the block above printed: the same keys and values (floats within 1e-4),
    but the reply's id and time."""
    shown = json.loads(block.text)
    try:
        actual = json.loads(printed.strip().splitlines()[-1])
    except (json.JSONDecodeError, IndexError):
        return False, f"{block.where}: the block above printed no JSON line: {printed[-500:]!r}"
    differences = list(_differences(shown, actual, ""))
    return not differences, f"{block.where}: the page shows another reply than the command's:\n" + "\n".join(
        differences
    )


def _differences(shown, actual, path: str) -> Iterator[str]:
    if isinstance(shown, dict) and isinstance(actual, dict):
        for key in shown.keys() | actual.keys():
            if key not in actual or key not in shown:
                yield f"{path}.{key}: only {'shown' if key in shown else 'in the reply'}"
            elif key not in VOLATILE:
                yield from _differences(shown[key], actual[key], f"{path}.{key}")
    elif isinstance(shown, list) and isinstance(actual, list) and len(shown) == len(actual):
        for i, (a, b) in enumerate(zip(shown, actual)):
            yield from _differences(a, b, f"{path}[{i}]")
    elif isinstance(shown, float) and isinstance(actual, float | int):
        if abs(shown - actual) > 1e-4:
            yield f"{path}: shown {shown}, the reply {actual}"
    elif shown != actual:
        yield f"{path}: shown {shown!r}, the reply {actual!r}"


def census(pages: list[Path] = PAGES) -> dict[str, list[Block]]:
    """Every block of the pages by kind."""
    by_kind: dict[str, list[Block]] = {}
    for page in pages:
        for block in blocks_of(page):
            by_kind.setdefault(block.kind, []).append(block)
    return by_kind


def census_line(pages: list[Path] = PAGES) -> str:
    """One line: how many blocks the pages have, of each kind, and the reasons of those that do not run."""
    kinds = census(pages)
    counts = ", ".join(f"{kind} {len(kinds[kind])}" for kind in ("run", "parsed", "output", "illustrative", "vllm", "ci")
                       if kind in kinds)  # fmt: skip
    return f"docs: {sum(len(v) for v in kinds.values())} blocks in {len(pages)} pages: {counts}"


def iter_problems(pages: list[Path] = PAGES) -> Iterator[str]:
    """Every block's problems (`problems_of`), and every mark that is not right above a fence (it would mark
    nothing)."""
    for page in pages:
        for block in blocks_of(page):
            yield from problems_of(block)
        lines = page.read_text(encoding="utf-8").splitlines()
        for i, line in enumerate(lines):
            if line.startswith("<!-- doc-test") and (i + 1 == len(lines) or not FENCE.match(lines[i + 1])):
                yield f"{page.name}:{i + 1}: a doc-test mark that is not right above a fence: {line}"
