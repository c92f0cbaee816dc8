"""An HTTP scoring server for a reward model: vLLM's `POST /pooling` and `POST /classify`, OpenRLHF's `/get_reward`.

    trl-rm-env serve --model outputs/rm-tiny --port 8000 [--api-key KEY] [--max-tokens-per-batch 16384]

    curl -s localhost:8000/pooling -H 'Content-Type: application/json' -d '{"messages": [
        {"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "4"}]}'
    # {"id": "pool-...", "object": "list", "created": 1700000000, "model": "rm-tiny",
    #  "data": [{"index": 0, "object": "pooling", "data": [1.734]}], "usage": {"prompt_tokens": 21, ...}}

Endpoints (docs/evaluate_and_serve.md has a curl for each):

- `POST /pooling` (vLLM): `{"model"?, "messages": [...]}` (one conversation, rendered with the RM's chat template
  exactly as `RewardScorer` renders it) or `{"model"?, "input": str | [str] | [int] | [[int]]}` (rendered text or
  token ids, tokenized as vLLM does). `data[i].data` is `[raw logit]`; `"use_activation": true` gives the sigmoid.
- `POST /classify` and `/v1/classify` (vLLM's classification API, what verl calls): the same inputs;
  `data[i] = {"index", "label", "probs", "num_classes"}`. `use_activation` defaults to vLLM's default, on: a
  one-label model returns `sigmoid(logit)` (identity for `problem_type == "regression"`). Send
  `"use_activation": false` for the raw reward.
- `POST /get_reward` (OpenRLHF's `--remote_rm_url`): `{"query": [text, ...]}` -> `{"rewards": [...], "scores": [...],
  "extra_logs": {}}`, both lists the raw scores.
- `GET /v1/models` (vLLM's model card list), `GET /health` (never needs the API key).

Data path: the body is read and its items encoded by `requests.py` (size, time, UTF-8, JSON, lengths before
tokenizing, tokenizing on an encoding thread); the request is queued (full queue: 503 with `Retry-After`) and scored
by the batching worker of `batcher.py`, as many queued requests as fit in the token budget in one
`RewardScorer.score_ids` call, which finds the sequences that begin alike (a GRPO group's prompt) in the token ids
and encodes each such prefix once (prefix sharing). Scores are exact: batching and sharing never change a score. The
dialects are in `trl_rm_env.serving.dialects`.

Failures stay with their request: if a batched call fails, each request in it is scored again alone; a request with
a non-finite score (NaN/inf) gets HTTP 500 with error type `NonFiniteScoreError` naming its items, and the requests
scored with it get their scores. Every error is JSON, in vLLM's (OpenAI's) shape
`{"error": {"message", "type", "param", "code"}}`, with the right status; error texts never carry the model's path.

Connections: a client must send a complete request head within `header_timeout` seconds of connecting (or of its
previous response on a kept-alive connection), else it is closed; the body must arrive within `body_timeout`. At
`max_connections` open connections (default: the file-descriptor limit minus a reserve; the soft limit is raised to
the hard one at start-up) the oldest idle connection is closed for each new one, so slow clients cannot lock others
out; `accept()` failures (out of file descriptors) are logged once a minute, not once a second with a traceback.

Authentication: with an API key (`--api-key`, else the `TRL_RM_ENV_API_KEY` or `VLLM_API_KEY` environment
variable) every request but `GET /health` needs `Authorization: Bearer <key>` (or `X-API-Key: <key>`), else 401.

Why aiohttp: one small dependency gives both the asyncio server and the async client (`client.py`); FastAPI would
need uvicorn and a separate HTTP client.
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import logging
import math
import signal
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

try:
    from aiohttp import web
except ImportError as err:  # pragma: no cover - exercised only without aiohttp
    raise ImportError("The scoring server needs aiohttp: pip install aiohttp") from err

from ...options import build
from ...scoring.scorer import RewardScorer
from ..dialects import api_key_from_env, sigmoid
from .batcher import QueueFullError, ScoreBatcher
from .connections import OPEN_GUARDS, AcceptErrorFilter, ConnectionGuards, GuardedSite, default_max_connections
from .limits import SERVER_TOKEN_BUDGET, ServerLimits
from .requests import RequestDecoder, RequestError, error_response

logger = logging.getLogger(__name__)

__all__ = ["ScoringServer", "run_server"]


class ScoringServer:
    """A reward model behind vLLM's `POST /pooling` and `POST /classify`, OpenRLHF's `POST /get_reward`,
    `GET /v1/models` and `GET /health`.

    Args:
        scorer: The `RewardScorer` doing the work; its options' `max_tokens_per_batch` / `batch_size` bound each forward pass.
        model_name: The name in responses; a request naming another model gets 404 (as vLLM answers). Use the
            folder name (`default_served_name`), not a path: responses must not reveal the server's file system.
        limits, **values: The `ServerLimits` (`max_queue`: one more request gets HTTP 503 with `Retry-After: 1`;
            `max_request_bytes`, `max_items_per_request`: 413; `body_timeout`: 408), an instance and/or by name.
            `header_timeout` and `max_connections` are the connection guards' (`run_server`, which runs the app
            with them); an app run otherwise has its runner's.
        max_batch_tokens: Tokens the worker gathers from the queue for one scoring call (default: the scorer's
            `max_tokens_per_batch`, else `SERVER_TOKEN_BUDGET`). A single larger request is still scored, in several
            forward passes.
        api_key: When set, every request but `GET /health` needs `Authorization: Bearer <api_key>` (vLLM's
            convention) or `X-API-Key: <api_key>` (OpenRLHF's server also takes it), else 401.
        aliases: Other `model` values accepted in requests (never shown in responses): `trl-rm-env serve` accepts
            its `--model` argument, since verl sends the reward model's path as `model`.
    """

    def __init__(
        self,
        scorer: RewardScorer,
        model_name: str,
        *,
        limits: ServerLimits | None = None,
        max_batch_tokens: int | None = None,
        api_key: str | None = None,
        aliases: Sequence[str] = (),
        **values: Any,
    ):
        limits = build(ServerLimits, limits, **values)
        self.scorer = scorer
        self.model_name = model_name
        self.limits = limits
        self.api_key = api_key or None
        self.decoder = RequestDecoder(scorer, {model_name, *aliases}, limits)
        budget = max_batch_tokens or scorer.options.max_tokens_per_batch or SERVER_TOKEN_BUDGET
        self.batcher = ScoreBatcher(scorer, limits.max_queue, budget)
        self.stats = self.batcher.stats  # requests, scored, batches, rejected_full; and nonfinite (answered 500)
        self.stats["nonfinite"] = 0
        config = scorer.config
        self.num_labels = getattr(config, "num_labels", 1)
        # vLLM's classify activation: identity for regression heads, else sigmoid (one score per sequence here).
        self.activation = "identity" if getattr(config, "problem_type", None) == "regression" else "sigmoid"
        id2label = getattr(config, "id2label", None) or {}
        self.label = (
            str(id2label.get(0, "LABEL_0"))
            if self.num_labels == 1 and getattr(getattr(scorer, "head", None), "weights", None) is None
            else "score"
        )
        # Paths that must not appear in error texts: the model's and tokenizer's as loaded, and resolved.
        hidden = {getattr(config, "_name_or_path", ""), getattr(scorer.tokenizer, "name_or_path", "")}
        hidden |= {str(Path(p).resolve()) for p in hidden if p and Path(p).exists()}
        self._hidden_paths = sorted((p for p in hidden if p and p != model_name), key=len, reverse=True)

    # ------------------------------------------------------------------ app
    def make_app(self) -> web.Application:
        """The aiohttp application (routes, size limit, JSON errors, auth, worker started and stopped with it)."""
        app = web.Application(client_max_size=self.limits.max_request_bytes, middlewares=[self._json_errors, self._auth])
        app.router.add_post("/pooling", self.pooling)
        app.router.add_post("/classify", self.classify)
        app.router.add_post("/v1/classify", self.classify)
        app.router.add_post("/get_reward", self.get_reward)
        app.router.add_get("/health", self.health)
        app.router.add_get("/v1/models", self.models)
        app.on_startup.append(self._start)
        app.on_cleanup.append(self._stop)
        return app

    async def _start(self, app: web.Application) -> None:
        self.batcher.start()

    async def _stop(self, app: web.Application) -> None:
        await self.batcher.stop()
        self.decoder.executor.shutdown(wait=False, cancel_futures=True)

    # The decoder's and the batcher's threads and the encoding entry point, under the names they had here.
    _encoder = property(lambda self: self.decoder.executor)
    _executor = property(lambda self: self.batcher.executor)

    def _encode_messages(self, messages: list[dict[str, str]]) -> list[int]:
        return self.decoder.encode_messages(messages)

    def _scrub(self, message: str) -> str:
        for path in self._hidden_paths:
            message = message.replace(path, self.model_name)
        return message

    @web.middleware
    async def _json_errors(self, request: web.Request, handler: Any) -> web.StreamResponse:
        guard = request.transport is not None and OPEN_GUARDS.get(request.transport)
        if guard:
            guard.busy += 1
        try:
            return await handler(request)
        except RequestError as err:
            return error_response(err.status, self._scrub(err.message), err.err_type, err.headers, err.param)
        except web.HTTPException as exc:  # aiohttp's own: 404 route, 405 method, 413 body size
            if exc.status < 400:
                raise
            message = exc.text if exc.text and not exc.text.startswith(f"{exc.status}:") else exc.reason
            return error_response(exc.status, message, exc.__class__.__name__.removeprefix("HTTP"))
        except (asyncio.CancelledError, ConnectionResetError):
            raise  # the client went away: nobody to answer
        except Exception as err:  # noqa: BLE001 - a bug or an unforeseen input: JSON, logged, never plain text
            logger.exception("unexpected error on %s %s", request.method, request.path)
            return error_response(
                500,
                f"internal server error ({type(err).__name__}); the server log has the details",
                "InternalServerError",
            )
        finally:
            if guard:
                guard.busy -= 1
                guard.rearm()

    @web.middleware
    async def _auth(self, request: web.Request, handler: Any) -> web.StreamResponse:
        if self.api_key is None or request.path == "/health":
            return await handler(request)
        scheme, _, token = request.headers.get("Authorization", "").partition(" ")
        token = token.strip() if scheme.lower() == "bearer" else request.headers.get("X-API-Key", "")
        given, expected = (x.encode("utf-8", "surrogateescape") for x in (token, self.api_key))
        if not token or not hmac.compare_digest(given, expected):
            raise RequestError(
                401,
                "missing or wrong API key: send the header 'Authorization: Bearer <key>' with the key the server was "
                "started with (--api-key, TRL_RM_ENV_API_KEY or VLLM_API_KEY)",
                "AuthenticationError",
                {"WWW-Authenticate": "Bearer"},
            )
        return await handler(request)

    # ------------------------------------------------------------------ routes
    async def health(self, request: web.Request) -> web.Response:
        """`GET /health`: 200 while the worker runs, with the queue length. Never needs the API key (as vLLM's)."""
        alive = self.batcher.alive
        body = {
            "status": "ok" if alive else "error",
            "model": self.model_name,
            "queued": self.batcher.queued(),
            "max_queue": self.limits.max_queue,
            **self.stats,
        }
        return web.json_response(body, status=200 if alive else 503)

    async def models(self, request: web.Request) -> web.Response:
        """`GET /v1/models`, vLLM's model list (`root` is the served name too: no paths)."""
        card = {
            "id": self.model_name,
            "object": "model",
            "created": int(time.time()),
            "owned_by": "trl-rm-env",
            "root": self.model_name,
            "parent": None,
            "max_model_len": self.scorer.max_length,
        }
        return web.json_response({"object": "list", "data": [card]})

    async def pooling(self, request: web.Request) -> web.Response:
        """`POST /pooling` (vLLM): a conversation (`messages`) or texts/token ids (`input`); raw logits by default."""
        body = await self.decoder.read_json(request)
        if body.get("task") not in (None, "classify"):
            raise RequestError(
                400, f"task {body['task']!r} is not served; this server scores sequences ('classify')", param="task"
            )
        use_activation = self.decoder.use_activation(body, default=False)
        field_name, ids = await self.decoder.encode_request(body)
        scores = await self._scores(ids, field_name)
        if use_activation:
            scores = [self._activate(s) for s in scores]
        data = [{"index": i, "object": "pooling", "data": [s]} for i, s in enumerate(scores)]
        return self._list_response("pool", data, ids)

    async def classify(self, request: web.Request) -> web.Response:
        """`POST /classify` (vLLM's classification API): `probs` is `[sigmoid(logit)]` unless `use_activation` is
        false (then the raw logit), as vLLM does for a one-label classifier."""
        body = await self.decoder.read_json(request)
        use_activation = self.decoder.use_activation(body, default=True)
        field_name, ids = await self.decoder.encode_request(body)
        scores = await self._scores(ids, field_name)
        if use_activation:
            scores = [self._activate(s) for s in scores]
        data = [{"index": i, "label": self.label, "probs": [s], "num_classes": 1} for i, s in enumerate(scores)]
        return self._list_response("classify", data, ids)

    async def get_reward(self, request: web.Request) -> web.Response:
        """`POST /get_reward` (OpenRLHF): `{"query": [text, ...]}` -> `{"rewards": [...], "scores": [...]}` (raw).
        OpenRLHF's other fields (`prompts`, `labels`) are accepted and ignored."""
        body = await self.decoder.read_json(request, check_model=False)
        queries = body.get("query")
        if isinstance(queries, str):
            queries = [queries]
        if not isinstance(queries, list) or not queries or not all(isinstance(q, str) for q in queries):
            raise RequestError(400, "'query' must be a non-empty list of strings (rendered texts)", param="query")
        ids = await self.decoder.encode_inputs(queries, "query")
        scores = await self._scores(ids, "query")
        return web.json_response({"rewards": scores, "scores": scores, "extra_logs": {}})

    def _activate(self, score: float) -> float:
        return score if self.activation == "identity" else sigmoid(score)

    def _list_response(self, prefix: str, data: list[dict], ids: list[list[int]]) -> web.Response:
        tokens = sum(len(x) for x in ids)
        return web.json_response(
            {
                "id": f"{prefix}-{uuid.uuid4().hex}",
                "object": "list",
                "created": int(time.time()),
                "model": self.model_name,
                "data": data,
                "usage": {
                    "prompt_tokens": tokens,
                    "total_tokens": tokens,
                    "completion_tokens": 0,
                    "prompt_tokens_details": None,
                },
            }
        )

    async def _scores(self, ids: list[list[int]], where: str) -> list[float]:
        """Queue `ids`, wait for their scores; 503 when the queue is full, 500 when scoring failed or a score is
        not finite (type `NonFiniteScoreError`, naming the items)."""
        try:
            scores = await self.batcher.submit(ids)
        except QueueFullError:
            raise RequestError(
                503,
                f"server busy: {self.limits.max_queue} requests are already waiting (--max-queue); retry later",
                "ServiceUnavailableError",
                {"Retry-After": "1"},
            ) from None
        except Exception as err:  # the model failed on this request (out of memory, ...): say so, as JSON
            raise RequestError(500, f"scoring failed: {type(err).__name__}: {err}", "InternalServerError") from err
        bad = [i for i, s in enumerate(scores) if not math.isfinite(s)]
        if bad:
            self.stats["nonfinite"] += 1
            items = where if where == "messages" else ", ".join(f"{where}[{i}]" for i in bad[:10])
            raise RequestError(
                500,
                f"the reward model returned a non-finite score (NaN/inf) for {items}"
                f"{' ...' if len(bad) > 10 else ''}; check the model's dtype (fp16 overflows are common)",
                "NonFiniteScoreError",
                param=where if where == "messages" else f"{where}[{bad[0]}]",
            )
        return scores


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def run_server(
    scorer: RewardScorer,
    model_name: str,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    api_key: str | None = None,
    aliases: Sequence[str] = (),
    limits: ServerLimits | None = None,
    **values: Any,
) -> None:
    """Serve `scorer` until interrupted (SIGINT/SIGTERM). Prints one line with the URL once it listens.

    Args:
        scorer: The reward model, wrapped in a `RewardScorer`.
        model_name: Name reported in responses and accepted in requests (a name, not a path).
        host: Interface to bind; anything but loopback is reachable by others (set an API key).
        port: TCP port (0: any free port; the printed line has the real one).
        api_key: Bearer key required on every route but `/health` (None: `api_key_from_env()`; "" or unset: none).
        aliases: Other `model` values accepted in requests (the `--model` argument).
        limits, **values: The `ServerLimits`, an instance and/or by name (`max_queue`, `header_timeout`,
            `max_connections`, ...).
    """
    limits = build(ServerLimits, limits, **values)
    api_key = api_key if api_key is not None else api_key_from_env()
    if not _is_loopback(host) and not api_key:
        logger.warning(
            "binding to %s without an API key (--api-key): anyone who can reach this port can use the server", host
        )
    server = ScoringServer(scorer, model_name, limits=limits, api_key=api_key, aliases=aliases)
    guards = ConnectionGuards(server.limits.header_timeout, server.limits.max_connections or default_max_connections())
    asyncio.run(_serve(server.make_app(), host, port, model_name, guards, bool(api_key)))


async def _serve(
    app: web.Application, host: str, port: int, model_name: str, guards: ConnectionGuards, auth: bool
) -> None:
    """Run `app` until SIGINT/SIGTERM; announce the URL once the socket listens."""
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(AcceptErrorFilter(guards))
    # lingering_time: after an early answer (413, 408), read what is left of the body for at most 2 s, then close.
    runner = web.AppRunner(app, access_log=None, keepalive_timeout=guards.header_timeout, lingering_time=2.0)
    await runner.setup()
    try:
        site = GuardedSite(runner, host, port, guards)
        await site.start()
        print(
            f"trl-rm-env serve: {model_name} on http://{host}:{site.bound_port} (POST /pooling /classify /get_reward, "
            f"GET /v1/models /health; API key {'required' if auth else 'off'})",
            flush=True,
        )
        stop = asyncio.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
    finally:
        await runner.cleanup()
