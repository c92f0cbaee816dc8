"""Reward models over HTTP: a scoring server speaking vLLM's `/pooling` and `/classify` and OpenRLHF's `/get_reward`,
and an async client for all three.

    trl-rm-env serve --model PATH --port 8000          # the server (server/)
    from trl_rm_env.serving import RemoteScorer         # the client (client/), also works against vLLM

- `dialects.py`: the dialects (endpoints, request and response shapes, API key), shared by server and client;
- `server/`: `requests.py` (reading a request and encoding its items), `batcher.py` (the queue and the batching
  worker, no HTTP), `connections.py` (connection guards), `app.py` (the aiohttp application and its launch),
  `vllm_server.py` (vLLM's own server), `limits.py` (`ServerLimits`);
- `client/`: `scorer.py` (`RemoteScorer`, the remote backend of the `Scorer` protocol,
  `trl_rm_env.scoring.interfaces`), `pool.py` (URLs round-robin, retries, concurrency), `remote_options.py`
  (`RemoteOptions`);
- `plan.py`: what `trl-rm-env serve` runs for a model, vLLM's server or ours (`ServePlan`).

Both use aiohttp; importing this package does not load it, the names load on first use.
"""

from __future__ import annotations

from ..lazy import lazy_exports

_MODULES = {
    ".client.scorer": ("RemoteScorer",),
    ".client.pool": ("RemoteScoringError",),
    ".server.app": ("ScoringServer", "run_server"),
}
"""Public names, imported on first use (aiohttp loads with them)."""


__getattr__, __dir__, __all__ = lazy_exports(__name__, _MODULES)
