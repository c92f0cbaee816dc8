"""Test probe (tests/test_clean_exit.py): how each process of a launched recipe ends.

Python imports `sitecustomize` at start-up when it is on the path, so a test that puts this folder on `PYTHONPATH`
probes every process `accelerate launch` starts. With `TRL_RM_ENV_EXIT_PROBE_DIR` set, each process writes there:

- `<rank>.atexit.json` when its `atexit` handlers run (this one is registered first, so it runs last): they ran, so
  loggers and trackers were flushed;
- `<rank>.finalized.json` if the interpreter then goes into finalization (module teardown, where a module global's
  `__del__` runs), with the names of the native threads still alive. A gloo worker thread alive there is what
  aborts a process now and then ("terminate called without an active exception"): see trl_rm_env/distributed.py.
"""

import atexit
import json
import os


# Defaults hold what the functions use: during finalization the module's globals and `builtins` may be gone.
def _threads(_open=open, _listdir=os.listdir, _getpid=os.getpid, _sorted=sorted, _error=OSError) -> list[str]:
    names = []
    tasks = f"/proc/{_getpid()}/task"
    for task in _listdir(tasks):
        try:
            with _open(f"{tasks}/{task}/comm") as f:
                names.append(f.read().strip())
        except _error:  # the thread ended meanwhile
            pass
    return _sorted(names)


def _write(kind: str, _open=open, _dumps=json.dumps, _environ=os.environ, _join=os.path.join, _threads=_threads):
    out = _environ.get("TRL_RM_ENV_EXIT_PROBE_DIR")
    if out:
        text = _dumps(_threads())  # before the file exists: a failure leaves no empty file behind
        with _open(_join(out, f"{_environ.get('RANK', 'launcher')}.{kind}.json"), "w") as f:
            f.write(text)


class _Finalization:
    def __del__(self, _write=_write):
        _write("finalized")


_SENTINEL = _Finalization()  # dropped, and its __del__ run, only when the interpreter tears this module down
atexit.register(_write, "atexit")
