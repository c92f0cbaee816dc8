"""The HTTP dialects of reward-model serving, shared by the server (`server/`) and the client (`client/`).

- `"pooling"`: vLLM's `POST /pooling` with `{"messages": [...] | "input": ..., "task": "classify", "use_activation":
  false}`; the score is `data[i].data[0]`.
- `"classify"`: vLLM's `POST /classify` (and `/v1/classify`) with the same inputs; the score is `data[i].probs[0]`
  (`use_activation` defaults to on there: a sigmoid for a one-label model).
- `"openrlhf"`: OpenRLHF's `POST /get_reward` with `{"query": [text, ...]}`; the scores are `rewards`.

Authentication is vLLM's: `Authorization: Bearer <key>`, the key from `--api-key` / `api_key=` or the environment.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

APIS = {"pooling": "/pooling", "classify": "/classify", "openrlhf": "/get_reward"}
"""Each dialect's endpoint."""
ENDPOINTS = ("/v1/classify", "/pooling", "/classify", "/get_reward")
"""Every scoring endpoint a server URL may already end with."""
API_KEY_ENV_VARS = ("TRL_RM_ENV_API_KEY", "VLLM_API_KEY")
"""Where the server and the client read the API key from, in this order, when none is given."""
SCORE_FIELDS = {"pooling": "data[0].data", "classify": "data[0].probs", "openrlhf": "rewards[0]"}


def api_key_from_env() -> str | None:
    """The API key from the environment: `TRL_RM_ENV_API_KEY`, else `VLLM_API_KEY` (None: neither is set)."""
    for name in API_KEY_ENV_VARS:
        if os.environ.get(name):
            return os.environ[name]
    return None


def default_served_name(model: str) -> str:
    """The name a model is served under: a local folder's own name (never its path), else the Hub id as given."""
    path = Path(model)
    return path.resolve().name if path.exists() else model


def endpoint_url(url: str, api: str = "pooling") -> str:
    """`http://host:port` (or any endpoint URL of it) -> the URL of `api`'s endpoint."""
    url = url.rstrip("/")
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"server URL must start with http:// or https://, got {url!r}")
    for endpoint in ENDPOINTS:
        if url.endswith(endpoint):
            url = url[: -len(endpoint)]
            break
    return url + APIS[api]


def sigmoid(x: float) -> float:
    """Sigmoid without `math.exp` overflow for large |x| (vLLM's classify activation for one label)."""
    if x >= 0:
        return 1.0 / (1.0 + math.exp(-x))
    z = math.exp(x)
    return z / (1.0 + z)


class SeveralOutputsError(ValueError):
    """A server answered several outputs per sample (`count`) where one reward is read."""

    def __init__(self, count: int):
        super().__init__(f"{count} outputs per sample")
        self.count = count


def read_score(body: Any, api: str) -> float:
    """The score of a response body of dialect `api`; NaN for `null` (a server's way to say NaN).

    Raises:
        SeveralOutputsError: the sample has several outputs (vLLM's own server of a model with several: an ensemble's
            heads, a regression RM's attributes), of which none is the reward as such.
        KeyError, IndexError, TypeError, ValueError: the body has no score where the dialect puts it
            (`SCORE_FIELDS[api]`).
    """
    if api == "openrlhf":
        value = body["rewards"][0]
    else:
        value = body["data"][0]["data" if api == "pooling" else "probs"]
        if isinstance(value, list):
            if len(value) > 1:
                raise SeveralOutputsError(len(value))
            value = value[0]
    return math.nan if value is None else float(value)
