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

Data path: the body is read under `body_timeout` (408 past it) and parsed; the items are counted (over
`max_items_per_request`: 413), their lengths checked (a string longer than `max_length x` the longest token of the
vocabulary, in characters, cannot fit the model and is refused with 400 without tokenizing it), then tokenized on an
encoding thread, so the event loop keeps answering. The request is queued (full queue: 503 with `Retry-After`), and
a single background worker takes the queued requests, as many as fit in the token budget, and scores them in one
`RewardScorer.score_ids` call on a scoring thread. Scores are exact: batching never changes a score.

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
import json
import logging
import math
import os
import signal
import time
import uuid
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

try:
    from aiohttp import web
except ImportError as err:  # pragma: no cover - exercised only without aiohttp
    raise ImportError("The scoring server needs aiohttp: pip install aiohttp") from err

from trl_rm_env.data.schema import KNOWN_ROLES
from trl_rm_env.scoring.scorer import RewardScorer, split_conversation
from trl_rm_env.scoring.templating import encode_text
from trl_rm_env.serving.connections import (
    OPEN_GUARDS,
    AcceptErrorFilter,
    ConnectionGuards,
    GuardedSite,
    default_max_connections,
)

logger = logging.getLogger(__name__)

DEFAULT_MAX_REQUEST_BYTES = 8 * 1024 * 1024
DEFAULT_MAX_ITEMS_PER_REQUEST = 4096
DEFAULT_HEADER_TIMEOUT = 10.0
DEFAULT_BODY_TIMEOUT = 30.0
# The server reads its key from the first of these that is set (after --api-key); so does RemoteScorer.
API_KEY_ENV_VARS = ("TRL_RM_ENV_API_KEY", "VLLM_API_KEY")


class RequestError(Exception):
    """A request the server refuses: HTTP `status`, a message for the client and an error type name."""

    def __init__(
        self,
        status: int,
        message: str,
        err_type: str = "BadRequestError",
        headers: dict | None = None,
        param: str | None = None,
    ):
        super().__init__(message)
        self.status, self.message, self.err_type, self.headers, self.param = status, message, err_type, headers, param


def error_response(
    status: int, message: str, err_type: str, headers: dict | None = None, param: str | None = None
) -> web.Response:
    """vLLM's (OpenAI's) error body: `{"error": {"message", "type", "param", "code"}}`."""
    body = {"error": {"message": message, "type": err_type, "param": param, "code": status}}
    return web.json_response(body, status=status, headers=headers)


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


def _sigmoid(x: float) -> float:
    """Sigmoid without `math.exp` overflow for large |x|."""
    if x >= 0:
        return 1.0 / (1.0 + math.exp(-x))
    z = math.exp(x)
    return z / (1.0 + z)


@dataclass
class _Job:
    """One request's token ids, waiting for its scores (a list of floats, NaN/inf kept)."""

    ids: list[list[int]]
    future: asyncio.Future
    tokens: int = field(init=False)

    def __post_init__(self) -> None:
        self.tokens = sum(len(x) for x in self.ids)


def _check_text(text: str, where: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        raise RequestError(
            400,
            f"{where} holds a lone surrogate ({text[err.start : err.end]!r} at character {err.start}), which is not "
            "valid Unicode; send UTF-8 text",
            param=where,
        ) from None


def _message_content(content: Any, where: str) -> str:
    """A message content: a string, or OpenAI's list of parts (`{"type": "text", "text": ...}`), joined."""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(
        isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text", ""), str) for p in content
    ):
        return "".join(p.get("text", "") for p in content)
    raise RequestError(400, f"{where}.content must be a string or a list of text parts", param=where)


def _parse_messages(messages: Any) -> list[dict[str, str]]:
    if not isinstance(messages, list) or not messages:
        raise RequestError(400, "'messages' must be a non-empty list of {'role', 'content'} objects", param="messages")
    parsed = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str) or "content" not in message:
            raise RequestError(
                400, f"messages[{i}] must be an object with a string 'role' and a 'content'", param=f"messages[{i}]"
            )
        content = _message_content(message["content"], f"messages[{i}]")
        _check_text(message["role"], f"messages[{i}].role")
        if message["role"] not in KNOWN_ROLES:  # as the data loader and the environment refuse them
            raise RequestError(
                400,
                f"messages[{i}].role is {message['role'][:40]!r}, not a known role ({', '.join(KNOWN_ROLES)})",
                param=f"messages[{i}].role",
            )
        _check_text(content, f"messages[{i}].content")
        parsed.append({"role": message["role"], "content": content})
    return parsed


def _longest_token_chars(tokenizer: Any) -> int:
    """Characters of the longest vocabulary entry: no token covers more text than this (special tokens included)."""
    try:
        vocab = tokenizer.get_vocab()
    except Exception:  # noqa: BLE001 - a tokenizer without a readable vocabulary: no bound
        return 0
    return max((len(token) for token in vocab), default=0)


class ScoringServer:
    """A reward model behind vLLM's `POST /pooling` and `POST /classify`, OpenRLHF's `POST /get_reward`,
    `GET /v1/models` and `GET /health`.

    Args:
        scorer: The `RewardScorer` doing the work; its `max_tokens_per_batch` / `batch_size` bound each forward pass.
        model_name: The name in responses; a request naming another model gets 404 (as vLLM answers). Use the
            folder name (`default_served_name`), not a path: responses must not reveal the server's file system.
        max_queue: Requests that may wait for the worker; one more gets HTTP 503 with `Retry-After: 1`.
        max_request_bytes: Largest request body; a larger one gets HTTP 413.
        max_batch_tokens: Tokens the worker gathers from the queue for one scoring call (default: the scorer's
            `max_tokens_per_batch`, else 16384). A single larger request is still scored, in several forward passes.
        max_items_per_request: Most sequences in one request (`input` / `query` list items); more get HTTP 413.
        api_key: When set, every request but `GET /health` needs `Authorization: Bearer <api_key>` (vLLM's
            convention) or `X-API-Key: <api_key>` (OpenRLHF's server also takes it), else 401.
        body_timeout: Seconds a client has to send the request body once its head arrived; slower gets HTTP 408.
        aliases: Other `model` values accepted in requests (never shown in responses): `trl-rm-env serve` accepts
            its `--model` argument, since verl sends the reward model's path as `model`.
    """

    def __init__(
        self,
        scorer: RewardScorer,
        model_name: str,
        *,
        max_queue: int = 1024,
        max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
        max_batch_tokens: int | None = None,
        max_items_per_request: int = DEFAULT_MAX_ITEMS_PER_REQUEST,
        api_key: str | None = None,
        body_timeout: float = DEFAULT_BODY_TIMEOUT,
        aliases: Sequence[str] = (),
    ):
        for name, value in [
            ("max_queue", max_queue),
            ("max_request_bytes", max_request_bytes),
            ("max_items_per_request", max_items_per_request),
        ]:
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        if body_timeout <= 0:
            raise ValueError(f"body_timeout must be > 0, got {body_timeout}")
        self.scorer = scorer
        self.model_name = model_name
        self.accepted_names = {model_name, *aliases}
        self.max_queue = max_queue
        self.max_request_bytes = max_request_bytes
        self.max_batch_tokens = max_batch_tokens or scorer.max_tokens_per_batch or 16384
        self.max_items_per_request = max_items_per_request
        self.api_key = api_key or None
        self.body_timeout = body_timeout
        config = scorer.model.config
        self.num_labels = getattr(config, "num_labels", 1)
        # vLLM's classify activation: identity for regression heads, else sigmoid (one score per sequence here).
        self.activation = "identity" if getattr(config, "problem_type", None) == "regression" else "sigmoid"
        id2label = getattr(config, "id2label", None) or {}
        self.label = (
            str(id2label.get(0, "LABEL_0"))
            if self.num_labels == 1 and getattr(scorer, "output_weights", None) is None
            else "score"
        )
        # A string longer than this cannot fit in max_length tokens: refused before tokenizing.
        longest = _longest_token_chars(scorer.tokenizer)
        self.max_chars = scorer.max_length * longest if scorer.max_length and longest else None
        # Paths that must not appear in error texts: the model's and tokenizer's as loaded, and resolved.
        hidden = {getattr(config, "_name_or_path", ""), getattr(scorer.tokenizer, "name_or_path", "")}
        hidden |= {str(Path(p).resolve()) for p in hidden if p and Path(p).exists()}
        self._hidden_paths = sorted((p for p in hidden if p and p != model_name), key=len, reverse=True)
        # requests: accepted into the queue; scored: sequences; batches: scoring calls; rejected_full: 503s;
        # nonfinite: requests answered NonFiniteScoreError.
        self.stats = {"requests": 0, "scored": 0, "batches": 0, "rejected_full": 0, "nonfinite": 0}
        self._queue: asyncio.Queue[_Job] | None = None
        self._worker_task: asyncio.Task | None = None
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rm-score")
        self._encoder = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rm-encode")  # tokenizers: one thread

    # ------------------------------------------------------------------ app
    def make_app(self) -> web.Application:
        """The aiohttp application (routes, size limit, JSON errors, auth, worker started and stopped with it)."""
        app = web.Application(client_max_size=self.max_request_bytes, middlewares=[self._json_errors, self._auth])
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
        self._queue = asyncio.Queue(maxsize=self.max_queue)
        self._worker_task = asyncio.create_task(self._worker(), name="rm-score-worker")

    async def _stop(self, app: web.Application) -> None:
        if self._worker_task is not None:
            self._worker_task.cancel()
            try:
                await self._worker_task
            except asyncio.CancelledError:
                pass
        self._executor.shutdown(wait=False, cancel_futures=True)
        self._encoder.shutdown(wait=False, cancel_futures=True)

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
        alive = self._worker_task is not None and not self._worker_task.done()
        body = {
            "status": "ok" if alive else "error",
            "model": self.model_name,
            "queued": self._queue.qsize() if self._queue is not None else 0,
            "max_queue": self.max_queue,
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
        body = await self._read_json(request)
        if body.get("task") not in (None, "classify"):
            raise RequestError(
                400, f"task {body['task']!r} is not served; this server scores sequences ('classify')", param="task"
            )
        use_activation = self._use_activation(body, default=False)
        field_name, ids = await self._encode_request(body)
        scores = await self._scores(ids, field_name)
        if use_activation:
            scores = [self._activate(s) for s in scores]
        data = [{"index": i, "object": "pooling", "data": [s]} for i, s in enumerate(scores)]
        return self._list_response("pool", data, ids)

    async def classify(self, request: web.Request) -> web.Response:
        """`POST /classify` (vLLM's classification API): `probs` is `[sigmoid(logit)]` unless `use_activation` is
        false (then the raw logit), as vLLM does for a one-label classifier."""
        body = await self._read_json(request)
        use_activation = self._use_activation(body, default=True)
        field_name, ids = await self._encode_request(body)
        scores = await self._scores(ids, field_name)
        if use_activation:
            scores = [self._activate(s) for s in scores]
        data = [{"index": i, "label": self.label, "probs": [s], "num_classes": 1} for i, s in enumerate(scores)]
        return self._list_response("classify", data, ids)

    async def get_reward(self, request: web.Request) -> web.Response:
        """`POST /get_reward` (OpenRLHF): `{"query": [text, ...]}` -> `{"rewards": [...], "scores": [...]}` (raw).
        OpenRLHF's other fields (`prompts`, `labels`) are accepted and ignored."""
        body = await self._read_json(request, check_model=False)
        queries = body.get("query")
        if isinstance(queries, str):
            queries = [queries]
        if not isinstance(queries, list) or not queries or not all(isinstance(q, str) for q in queries):
            raise RequestError(400, "'query' must be a non-empty list of strings (rendered texts)", param="query")
        ids = await self._encode_inputs(queries, "query")
        scores = await self._scores(ids, "query")
        return web.json_response({"rewards": scores, "scores": scores, "extra_logs": {}})

    # ------------------------------------------------------------------ request reading
    async def _read_json(self, request: web.Request, check_model: bool = True) -> dict[str, Any]:
        """The body as a JSON object: size (413), time (408), UTF-8 and JSON (400) checked, `model` checked (404)."""
        if request.content_length is not None and request.content_length > self.max_request_bytes:
            raise RequestError(
                413,
                f"request body is {request.content_length} bytes, over the limit of {self.max_request_bytes} "
                "(--max-request-bytes); send fewer or shorter inputs per request",
                "RequestEntityTooLarge",
            )
        try:
            raw = await asyncio.wait_for(request.read(), self.body_timeout)
        except TimeoutError:  # answered, then the connection is closed (after at most 2 s of lingering)
            raise RequestError(
                408,
                f"the request body did not arrive within {self.body_timeout:g} s (--body-timeout)",
                "RequestTimeout",
            ) from None
        try:
            text = raw.decode("utf-8-sig")
        except UnicodeDecodeError as err:
            raise RequestError(
                400,
                f"request body is not UTF-8 (byte 0x{raw[err.start]:02x} at offset {err.start}); send JSON in UTF-8",
            ) from None
        try:
            body = json.loads(text)
        except json.JSONDecodeError as err:
            raise RequestError(400, f"request body is not valid JSON: {err}") from None
        except RecursionError:
            raise RequestError(400, "request body is nested too deeply to parse; send a flat JSON object") from None
        except ValueError as err:  # e.g. an integer of more than 4300 digits
            raise RequestError(
                400, f"request body has a value that cannot be read: {str(err).split(';')[0]}"
            ) from None
        if not isinstance(body, dict):
            raise RequestError(400, f"request body must be a JSON object, got {type(body).__name__}")
        model = body.get("model")
        if check_model and model is not None and model not in self.accepted_names:
            raise RequestError(404, f"The model `{str(model)[:200]}` does not exist.", "NotFoundError", param="model")
        return body

    @staticmethod
    def _use_activation(body: dict[str, Any], default: bool) -> bool:
        """`use_activation`, or its name before vLLM 0.11.2, `activation` (what older verl sends)."""
        name = "use_activation" if body.get("use_activation") is not None else "activation"
        value = body.get(name)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise RequestError(400, f"'{name}' must be true, false or null", param=name)
        return value

    def _activate(self, score: float) -> float:
        return score if self.activation == "identity" else _sigmoid(score)

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

    # ------------------------------------------------------------------ encoding (on the encoding thread)
    async def _encode_request(self, body: dict[str, Any]) -> tuple[str, list[list[int]]]:
        """`("messages" | "input", token ids)` of a `/pooling` or `/classify` body, or a 400/413 `RequestError`."""
        if ("messages" in body) == ("input" in body):
            raise RequestError(
                400, "give either 'messages' (one conversation) or 'input' (a string, list of strings or token ids)"
            )
        if "messages" in body:
            messages = _parse_messages(body["messages"])
            chars = sum(len(m["content"]) for m in messages)
            if self.max_chars is not None and chars > self.max_chars:
                raise RequestError(400, self._too_long("messages", chars), param="messages")
            return "messages", [await self._run_encoder(self._encode_messages, messages)]
        items = body["input"]
        if isinstance(items, str) or (isinstance(items, list) and items and type(items[0]) is int):
            items = [items]  # one text, or one token-id sequence (checked on the encoding thread, not here)
        if not isinstance(items, list) or not items:
            raise RequestError(
                400, "'input' must be a string, a non-empty list of strings, or token ids", param="input"
            )
        return "input", await self._encode_inputs(items, "input")

    async def _encode_inputs(self, items: list[Any], where: str) -> list[list[int]]:
        if len(items) > self.max_items_per_request:
            raise RequestError(
                413,
                f"'{where}' has {len(items)} items, over the limit of {self.max_items_per_request} per request "
                "(--max-items-per-request); split it into several requests",
                "RequestEntityTooLarge",
                param=where,
            )
        for i, item in enumerate(items):  # cheap: no tokenizing, so an over-long text costs nothing
            if isinstance(item, str) and self.max_chars is not None and len(item) > self.max_chars:
                raise RequestError(400, self._too_long(f"{where}[{i}]", len(item)), param=f"{where}[{i}]")
        return await self._run_encoder(self._encode_items, items, where)

    def _too_long(self, where: str, chars: int) -> str:
        return (
            f"{where} is {chars} characters: more than the model's max length of {self.scorer.max_length} tokens can "
            f"hold (no token of this tokenizer is longer than {self.max_chars // self.scorer.max_length} characters); "
            "shorten it"
        )

    async def _run_encoder(self, fn: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._encoder, fn, *args)

    def _encode_messages(self, messages: list[dict[str, str]]) -> list[int]:
        try:
            context, completion = split_conversation(messages)
            encoded = self.scorer.encode([context], [completion])
        except (ValueError, TypeError) as err:
            raise RequestError(400, f"messages: {err}", param="messages") from err
        except Exception as err:  # noqa: BLE001 - the chat template failed on this input (jinja errors)
            raise RequestError(
                400,
                f"messages: the chat template could not render them: {type(err).__name__}: {err}",
                param="messages",
            ) from err
        if encoded.ids[0] is None:
            raise RequestError(
                400,
                f"messages: the conversation is over the model's max length {self.scorer.max_length}",
                param="messages",
            )
        return encoded.ids[0]

    def _encode_items(self, items: list[Any], where: str) -> list[list[int]]:
        """Token ids of `input` / `query` items, or a 400 `RequestError` naming the first bad one."""
        max_length = self.scorer.max_length
        vocab = self.scorer.model.config.vocab_size
        ids = []
        for i, item in enumerate(items):
            if isinstance(item, str):
                _check_text(item, f"{where}[{i}]")
                seq = encode_text(self.scorer.tokenizer, item)
            elif isinstance(item, list) and item and all(type(t) is int and 0 <= t < vocab for t in item):
                seq = list(item)
            else:
                raise RequestError(
                    400,
                    f"{where}[{i}] must be a string or a non-empty list of token ids in [0, {vocab})",
                    param=f"{where}[{i}]",
                )
            if max_length is not None and len(seq) > max_length:
                raise RequestError(
                    400,
                    f"{where}[{i}] is {len(seq)} tokens, over the model's max length {max_length}",
                    param=f"{where}[{i}]",
                )
            ids.append(seq)
        return ids

    # ------------------------------------------------------------------ queue and batching worker
    async def _scores(self, ids: list[list[int]], where: str) -> list[float]:
        """Queue `ids`, wait for their scores; 503 when the queue is full, 500 when scoring failed or a score is
        not finite (type `NonFiniteScoreError`, naming the items)."""
        job = _Job(ids, asyncio.get_running_loop().create_future())
        try:
            self._queue.put_nowait(job)
        except asyncio.QueueFull:
            self.stats["rejected_full"] += 1
            raise RequestError(
                503,
                f"server busy: {self.max_queue} requests are already waiting (--max-queue); retry later",
                "ServiceUnavailableError",
                {"Retry-After": "1"},
            ) from None
        self.stats["requests"] += 1
        try:
            scores = await job.future
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

    async def _worker(self) -> None:
        """Take queued requests up to the token budget, score them in one call, hand each its scores.

        If the batched call fails, each request is scored again on its own, so one bad request cannot fail the
        others."""
        loop = asyncio.get_running_loop()
        carry: _Job | None = None
        while True:
            job = carry if carry is not None else await self._queue.get()
            carry = None
            jobs, tokens = [job], job.tokens
            while not self._queue.empty():
                nxt = self._queue.get_nowait()
                if tokens + nxt.tokens > self.max_batch_tokens:
                    carry = nxt  # first in line for the next call
                    break
                jobs.append(nxt)
                tokens += nxt.tokens
            jobs = [j for j in jobs if not j.future.done()]  # a client that went away
            if not jobs:
                continue
            sequences = [seq for j in jobs for seq in j.ids]
            try:
                scores = await loop.run_in_executor(self._executor, self._score, sequences)
            except Exception as err:  # noqa: BLE001
                if len(jobs) == 1:
                    logger.warning("scoring failed: %s: %s", type(err).__name__, err)
                    jobs[0].future.done() or jobs[0].future.set_exception(err)
                    continue
                logger.warning("a batch of %d requests failed (%s); scoring each alone", len(jobs), type(err).__name__)
                for j in jobs:
                    try:
                        result = await loop.run_in_executor(self._executor, self._score, j.ids)
                    except Exception as alone:  # noqa: BLE001 - this request's own failure
                        logger.warning("scoring failed: %s: %s", type(alone).__name__, alone)
                        j.future.done() or j.future.set_exception(alone)
                    else:
                        self.stats["batches"] += 1
                        self.stats["scored"] += len(j.ids)
                        j.future.done() or j.future.set_result(result)
                continue
            self.stats["batches"] += 1
            self.stats["scored"] += len(sequences)
            offset = 0
            for j in jobs:
                if not j.future.done():
                    j.future.set_result(scores[offset : offset + len(j.ids)])
                offset += len(j.ids)

    def _score(self, sequences: Sequence[Sequence[int]]) -> list[float]:
        return self.scorer.score_ids(sequences, progress=False).tolist()


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
    max_queue: int = 1024,
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
    max_items_per_request: int = DEFAULT_MAX_ITEMS_PER_REQUEST,
    api_key: str | None = None,
    header_timeout: float = DEFAULT_HEADER_TIMEOUT,
    body_timeout: float = DEFAULT_BODY_TIMEOUT,
    max_connections: int | None = None,
    aliases: Sequence[str] = (),
) -> None:
    """Serve `scorer` until interrupted (SIGINT/SIGTERM). Prints one line with the URL once it listens.

    Args:
        scorer: The reward model, wrapped in a `RewardScorer`.
        model_name: Name reported in responses and accepted in requests (a name, not a path).
        host: Interface to bind; anything but loopback is reachable by others (set an API key).
        port: TCP port (0: any free port; the printed line has the real one).
        max_queue: Requests that may wait; more get 503.
        max_request_bytes: Largest request body; larger get 413.
        max_items_per_request: Most sequences per request; more get 413.
        api_key: Bearer key required on every route but `/health` (None: `api_key_from_env()`; "" or unset: none).
        header_timeout: Seconds a connection may take to deliver a request head (also the keep-alive idle time).
        body_timeout: Seconds a request body may take to arrive; slower gets 408.
        max_connections: Open connections at most (None: `default_max_connections()`); past it the oldest idle
            one is closed.
        aliases: Other `model` values accepted in requests (the `--model` argument).
    """
    if header_timeout <= 0:
        raise ValueError(f"header_timeout must be > 0, got {header_timeout}")
    api_key = api_key if api_key is not None else api_key_from_env()
    if not _is_loopback(host) and not api_key:
        logger.warning(
            "binding to %s without an API key (--api-key): anyone who can reach this port can use the server", host
        )
    server = ScoringServer(
        scorer,
        model_name,
        max_queue=max_queue,
        max_request_bytes=max_request_bytes,
        max_items_per_request=max_items_per_request,
        api_key=api_key,
        body_timeout=body_timeout,
        aliases=aliases,
    )
    limit = default_max_connections()
    guards = ConnectionGuards(header_timeout, max_connections or limit)
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
