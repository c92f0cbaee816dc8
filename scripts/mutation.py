"""Mutation testing of the rewards, the judges, the ensemble heads, the bounded forwards and the loss (mutmut).

mutmut plants one small bug at a time (a flipped comparison, an off-by-one, a changed constant, a dropped argument)
in the modules of `[tool.mutmut] only_mutate` in pyproject.toml and runs the fast tests (`-m "not slow"`) that call the
mutated function against each: a mutant the tests let through is a missing test, or an equivalent change. Not part of
CI; its report is docs/reliability.md's "Mutation testing".

    pip install -e ".[dev,mutation]"
    python scripts/mutation.py run --minutes 300     # a fresh run on 2 cores, stopped after 300 minutes
    python scripts/mutation.py run --minutes 60 --resume   # check what the last run left (mutmut keeps each result)
    python scripts/mutation.py run --resume 'trl_rm_env.evaluation.*'   # these mutants again (after new tests)
    python scripts/mutation.py report                # counts by module, and every mutant the tests let through
    python scripts/mutation.py check NAME tests/test_genrm.py   # one mutant against chosen tests (after a run)

mutmut maps each test to the functions it calls when it first sees the test: after changing an existing test (not only
adding one), delete `mutants/mutmut-stats.json` so that the next `run --resume` maps every test again.

`report` reads `scripts/mutation_survivors.tsv` (`name<TAB>kind<TAB>why`, kinds `equivalent` and `harmless`) for the
reason of each mutant that was let through; one without a reason is listed as `missing test`.
"""

from __future__ import annotations

import argparse
import collections
import csv
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
REASONS = ROOT / "scripts" / "mutation_survivors.tsv"
KILLED = {1: "killed", 3: "killed", -24: "timeout", 24: "timeout", 152: "timeout", 255: "timeout", 36: "timeout",
          -11: "crashed", -9: "crashed"}  # fmt: skip
LET_THROUGH = {0: "survived", 33: "no test", 5: "no test"}


def run(minutes: float, max_children: int, resume: bool, names: list[str] | None = None) -> int:
    """A mutmut run under a wall-clock budget (its results so far are kept when the budget ends it); `names`: only
    the mutants matching these patterns (`trl_rm_env.evaluation.*`), checked again even where a result is kept."""
    if not resume:
        shutil.rmtree(ROOT / "mutants", ignore_errors=True)
    process = subprocess.Popen([sys.executable, "-m", "mutmut", "run", "--max-children", str(max_children),
                                *(names or [])], cwd=ROOT, start_new_session=True)  # fmt: skip
    deadline = time.monotonic() + minutes * 60
    while process.poll() is None and time.monotonic() < deadline:
        time.sleep(5)
    if process.poll() is None:
        # mutmut saves each result as it comes. A first SIGINT is not always enough (seen on 2 cores: it ran on
        # 2 minutes past it), a second one stops it; then SIGKILL.
        for sig, wait in ((signal.SIGINT, 30), (signal.SIGINT, 90), (signal.SIGKILL, 30)):
            os.killpg(process.pid, sig)
            try:
                process.wait(wait)
                break
            except subprocess.TimeoutExpired:
                continue
        print(f"mutation: stopped after the budget of {minutes:g} minutes; `report` counts what was checked")
    return 0 if process.returncode in (0, None, -signal.SIGINT, 130) else process.returncode


def results() -> dict[str, tuple[str, int | None]]:
    """Every mutant's `(module file, exit code)` (None: not checked), from mutmut's `.meta` files."""
    out = {}
    for meta in sorted((ROOT / "mutants").rglob("*.py.meta")):
        source = str(meta.relative_to(ROOT / "mutants"))[: -len(".meta")]
        for name, code in json.loads(meta.read_text())["exit_code_by_key"].items():
            out[name] = (source, code)
    return out


def reasons() -> dict[str, tuple[str, str]]:
    if not REASONS.exists():
        return {}
    with REASONS.open(encoding="utf-8") as f:
        rows = [r for r in csv.reader(f, delimiter="\t") if r and not r[0].startswith("#")]
    return {name: (kind, why) for name, kind, why in rows}


def diff_line(name: str, source: str) -> str:
    """The mutated line, `-old` / `+new` on one line."""
    from mutmut.mutation.diff_apply import get_diff_for_mutant

    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        diff = get_diff_for_mutant(name, path=source)
    finally:
        os.chdir(cwd)
    old = [line[1:].strip() for line in diff.splitlines() if line.startswith("-") and not line.startswith("---")]
    new = [line[1:].strip() for line in diff.splitlines() if line.startswith("+") and not line.startswith("+++")]
    return f"`{' / '.join(old)}` -> `{' / '.join(new)}`".replace("|", "\\|")  # a table cell


def report(markdown: Path | None) -> int:
    found = results()
    if not found:
        print("mutation: no results; run `python scripts/mutation.py run` first", file=sys.stderr)
        return 1
    why = reasons()
    counts: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    through = []
    for name, (source, code) in found.items():
        status = KILLED.get(code) or LET_THROUGH.get(code) or ("not checked" if code is None else f"exit {code}")
        counts[source][status] += 1
        if code in LET_THROUGH:
            kind = why.get(name, ("missing test", ""))[0]
            counts[source][kind] += 1
            through.append((source, name, LET_THROUGH[code], kind))
    lines = ["| module | mutants | killed | timeout | let through | equivalent | harmless | missing test | not checked |",
             "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    total = collections.Counter()
    for source in sorted(counts):
        c = counts[source]
        total.update(c)
        lines.append(_row(source, c))
    lines.append(_row("**all**", total))
    killed = total["killed"] + total["timeout"] + total["crashed"]
    checked = killed + total["survived"] + total["no test"]
    meaningful = checked - total["equivalent"]  # an equivalent mutant is the same program: no test can kill it
    score = killed / meaningful if meaningful else 0.0
    lines += ["", f"Killed by the fast tests: {killed} of {checked} mutants checked; {total['equivalent']} of those "
              f"let through are equivalent, so {100 * score:.1f}% of the {meaningful} non-equivalent mutants were "
              f"killed. Not checked (the run's budget ended first): {total['not checked']}."]  # fmt: skip
    lines += ["", "| mutant | status | kind | mutated line | why |", "|---|---|---|---|---|"]
    for source, name, status, kind in sorted(through):
        short = name.split(".", 2)[-1] if name.startswith("trl_rm_env.") else name
        reason = why.get(name, ("", ""))[1].replace("|", "\\|")
        lines.append(f"| `{short}` | {status} | {kind} | {diff_line(name, source)} | {reason} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if markdown is not None:
        title = ("# Mutation report\n\nWritten by `python scripts/mutation.py report --markdown` on "
                 f"{time.strftime('%Y-%m-%d')}, from the last run's results (`mutants/`); how it runs and what the "
                 "numbers mean: [reliability.md](reliability.md#mutation-testing).\n\n")  # fmt: skip
        markdown.write_text(title + text, encoding="utf-8")
    return 0


def _row(source: str, c: collections.Counter) -> str:
    total = sum(v for k, v in c.items() if k in {"killed", "timeout", "survived", "no test", "crashed", "not checked"})
    return (f"| {source} | {total} | {c['killed']} | {c['timeout']} | {c['survived'] + c['no test']} | "
            f"{c['equivalent']} | {c['harmless']} | {c['missing test']} | {c['not checked']} |")  # fmt: skip


def check(name: str, pytest_args: list[str]) -> int:
    """Run the working tree's tests against one mutant of the last run (`mutants/`)."""
    mutants = ROOT / "mutants"
    if not mutants.exists():
        print("mutation: no mutants/ folder; run `python scripts/mutation.py run` first", file=sys.stderr)
        return 1
    # The working tree's tests (a path given from the root is made absolute), importing the mutated package: pytest
    # puts tests/ first on sys.path and the working directory (mutants/) next, ahead of the installed package.
    args = [str(ROOT / a) if a.startswith("tests") else a for a in pytest_args] or [str(ROOT / "tests")]
    env = dict(os.environ, MUTANT_UNDER_TEST=name)
    return subprocess.call([sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *args],
                           cwd=mutants, env=env)  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    r = commands.add_parser("run", help="a mutmut run under a time budget")
    r.add_argument("--minutes", type=float, default=300.0)
    r.add_argument("--max-children", type=int, default=2)
    r.add_argument("--resume", action="store_true", help="keep the last run's results and check the rest")
    r.add_argument("names", nargs="*", help="only these mutants (patterns: 'trl_rm_env.evaluation.*'), checked again")
    p = commands.add_parser("report", help="counts by module and every mutant let through")
    p.add_argument("--markdown", type=Path, default=None)
    c = commands.add_parser("check", help="one mutant against chosen tests")
    c.add_argument("name")
    c.add_argument("pytest_args", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    if args.command == "run":
        return run(args.minutes, args.max_children, args.resume, args.names)
    if args.command == "report":
        return report(args.markdown)
    return check(args.name, args.pytest_args)


if __name__ == "__main__":
    sys.exit(main())
