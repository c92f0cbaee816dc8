"""Our scoring server and vLLM's: the aiohttp application and its launch (`app.py`), reading a request
(`requests.py`), the queue and batching worker (`batcher.py`), connection guards (`connections.py`), vLLM's own
server started and stopped (`vllm_server.py`), and the limits it puts on its clients (`limits.py`). The names load
on first use, so the command line reads the options without loading aiohttp or the model code."""

from __future__ import annotations

from ...lazy import lazy_exports

_MODULES = {".app": ("ScoringServer", "run_server"), ".vllm_server": ("run_vllm_server",)}
__getattr__, __dir__, __all__ = lazy_exports(__name__, _MODULES)
