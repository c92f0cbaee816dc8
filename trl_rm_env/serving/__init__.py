"""Reward models over HTTP: a scoring server speaking vLLM's `/pooling` and `/classify` and OpenRLHF's `/get_reward`,
and an async client for all three.

    trl-rm-env serve --model PATH --port 8000          # the server (server.py)
    from trl_rm_env.serving import RemoteScorer         # the client (client.py), also works against vLLM

Both use aiohttp; importing this package does not load it, the names load on first use.
"""

from __future__ import annotations

from typing import Any

__all__ = ["RemoteScorer", "RemoteScoringError", "ScoringServer", "run_server"]

_WHERE = {
    "RemoteScorer": "client",
    "RemoteScoringError": "client",
    "ScoringServer": "server",
    "run_server": "server",
}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        from importlib import import_module

        return getattr(import_module(f"{__name__}.{_WHERE[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
