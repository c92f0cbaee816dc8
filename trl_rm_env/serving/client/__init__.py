"""The client of reward-model servers: `RemoteScorer` (`scorer.py`, the remote backend of the `Scorer` protocol),
its retrying pool of servers (`pool.py`) and its options (`remote_options.py`). The names load on first use (aiohttp
with them), so the command line reads the options without loading the client."""

from __future__ import annotations

from ...lazy import lazy_exports

_MODULES = {".scorer": ("RemoteScorer",), ".pool": ("RemoteScoringError", "ServerPool")}
__getattr__, __dir__, __all__ = lazy_exports(__name__, _MODULES)
