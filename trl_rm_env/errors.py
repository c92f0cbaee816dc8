"""Expected errors end a command in one line; `--debug` or `TRL_RM_ENV_DEBUG=1` shows the traceback.

An expected error is one the user fixes in their input (a missing file or folder, bad data, a bad option, an
incomplete checkpoint): its message already names the source and the fix, so a traceback only buries it. Anything
else (a bug) keeps its traceback.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

__all__ = ["DEBUG_ENV", "debug_enabled", "expected_errors", "is_main_process", "report_expected_error", "run_recipe"]

DEBUG_ENV = "TRL_RM_ENV_DEBUG"


def debug_enabled() -> bool:
    """True when `TRL_RM_ENV_DEBUG` is set to a true value (`1`, `true`, `yes`)."""
    return os.environ.get(DEBUG_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def expected_errors() -> tuple[type[BaseException], ...]:
    """The exception types reported in one line: bad input, not bugs."""
    errors: list[type[BaseException]] = [
        FileNotFoundError, NotADirectoryError, IsADirectoryError, ValueError,
        ConnectionError,  # a Hub id without the network (datasets raises the builtin one)
    ]
    if "trl_rm_env.data.schema" in sys.modules:  # DataValidationError is a ValueError; listed for clarity
        errors.append(sys.modules["trl_rm_env.data.schema"].DataValidationError)
    return tuple(errors)


def is_main_process() -> bool:
    """True unless this is a non-zero rank of a distributed launch (`RANK`/`LOCAL_RANK` set by torchrun and
    accelerate): one-line errors and summaries are printed by one process, not once per process."""
    for name in ("RANK", "LOCAL_RANK"):
        value = os.environ.get(name, "0")
        if value.strip().lstrip("-").isdigit() and int(value) != 0:
            return False
    return True


def report_expected_error(err: BaseException, prog: str | None = None) -> None:
    """Print `error: <message>` on one line to stderr (on the main process only)."""
    if not is_main_process():
        return
    message = " ".join(str(err).split()) or type(err).__name__
    if isinstance(err, FileNotFoundError) and err.filename and str(err.filename) not in message:
        message = f"{message}: {err.filename}"
    if isinstance(err, ConnectionError) and "Hub" in message:
        message += " (a Hub id needs the network or a copy in the Hugging Face cache; a local file needs neither)"
    print(f"{prog + ': ' if prog else ''}error: {message}", file=sys.stderr, flush=True)


def _check_config_argument(argv: list[str]) -> str | None:
    """The message for a `--config FILE` that does not exist (checked before any heavy import), else None."""
    for i, arg in enumerate(argv):
        value = None
        if arg == "--config" and i + 1 < len(argv):
            value = argv[i + 1]
        elif arg.startswith("--config="):
            value = arg.split("=", 1)[1]
        if value is not None and not os.path.isfile(value):
            return f"config file not found: {value}"
    return None


def run_recipe(make_parser: Callable[[], Any], main: Callable[..., Any], argv: list[str] | None = None) -> None:
    """Parse a recipe's arguments with its `TrlParser` and run `main`, ending expected errors in one line.

    Exits 2 for a missing `--config` file (checked before the recipe's heavy imports) and 1 for any other expected
    error; `TRL_RM_ENV_DEBUG=1` re-raises with the traceback. (`--debug` is `TrainingArguments.debug` in a recipe.)
    In a worker of a multi-process launch the process then ends with `trl_rm_env.distributed.exit_process` (exit
    handlers run, no interpreter finalization), so that its process group is never torn down (see there).
    """
    argv = sys.argv[1:] if argv is None else argv
    prog = os.path.basename(sys.argv[0]) or None
    problem = _check_config_argument(argv)
    if problem and not debug_enabled():
        if is_main_process():
            print(f"{prog}: error: {problem}", file=sys.stderr, flush=True)
        sys.exit(2)
    from .distributed import exit_process, launched, prepare_process

    prepare_process()  # before the arguments, and with them the process group, exist
    try:
        parsed = make_parser().parse_args_and_config(args=argv)
        main(*parsed)
    except expected_errors() as err:
        if debug_enabled():
            raise
        report_expected_error(err, prog)
        if launched():
            exit_process(1)
        sys.exit(1)
    if launched():  # a worker of `accelerate launch`: never tear its gloo process group down (see exit_process)
        exit_process(0)
