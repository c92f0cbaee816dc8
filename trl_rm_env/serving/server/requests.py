"""Reading a scoring request: the body (size, time, UTF-8, JSON, model name), and its items as token ids.

Lengths are checked before tokenizing (a string longer than `max_length x` the longest token of the vocabulary, in
characters, cannot fit the model and is refused with 400 without being tokenized); tokenizing runs on an encoding
thread, so the event loop keeps answering. Messages are rendered with the RM's chat template exactly as
`RewardScorer` renders them, and checked by the rules every entry point shares (`trl_rm_env.data.messages`).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from aiohttp import web

from ...data.messages import KNOWN_ROLES, lone_surrogate, message_problem
from ...scoring.scorer import RewardScorer, split_conversation
from ...tokenization import encode_text
from .limits import ServerLimits


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


def _check_text(text: str, where: str) -> None:
    found = lone_surrogate(text)
    if found is not None:
        raise RequestError(
            400,
            f"{where} holds a lone surrogate ({found[0]!r} at character {found[1]}), which is not valid Unicode; send "
            "UTF-8 text",
            param=where,
        )


def _message_content(content: Any, where: str) -> str:
    """A message content: a string, or OpenAI's list of parts (`{"type": "text", "text": ...}`), joined."""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(
        isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text", ""), str) for p in content
    ):
        return "".join(p.get("text", "") for p in content)
    raise RequestError(400, f"{where}.content must be a string or a list of text parts", param=where)


def parse_messages(messages: Any) -> list[dict[str, str]]:
    """A request's `messages`, checked by the rules of `trl_rm_env.data.messages` (roles from `KNOWN_ROLES`, as the
    data loader and the environment have them), with OpenAI's lists of text parts joined into one string.

    Raises:
        RequestError: 400 naming `messages[i]` or its field.
    """
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
        _check_text(content, f"messages[{i}].content")
        problem = message_problem({"role": message["role"], "content": content})
        if problem is not None:  # the rule set left after the checks above: the role is not a known one
            raise RequestError(
                400,
                f"messages[{i}].role is {message['role'][:40]!r}, not a known role ({', '.join(KNOWN_ROLES)})",
                param=f"messages[{i}].role",
            )
        parsed.append({"role": message["role"], "content": content})
    return parsed


def longest_token_chars(tokenizer: Any) -> int:
    """Characters of the longest vocabulary entry: no token covers more text than this (special tokens included)."""
    try:
        vocab = tokenizer.get_vocab()
    except Exception:  # noqa: BLE001 - a tokenizer without a readable vocabulary: no bound
        return 0
    return max((len(token) for token in vocab), default=0)


class RequestDecoder:
    """Reads and encodes the requests of one server (see the module docstring).

    Args:
        scorer: The server's `RewardScorer` (its tokenizer, chat template and `max_length`).
        accepted_names: The `model` values a request may name (others: 404).
        limits: The server's `ServerLimits` (`max_request_bytes`: 413, `max_items_per_request`: 413,
            `body_timeout`: 408).
    """

    def __init__(self, scorer: RewardScorer, accepted_names: Sequence[str], limits: ServerLimits | None = None):
        limits = limits or ServerLimits()
        self.scorer = scorer
        self.accepted_names = set(accepted_names)
        self.max_request_bytes = limits.max_request_bytes
        self.max_items_per_request = limits.max_items_per_request
        self.body_timeout = limits.body_timeout
        # A string longer than this cannot fit in max_length tokens: refused before tokenizing.
        longest = longest_token_chars(scorer.tokenizer)
        self.max_chars = scorer.max_length * longest if scorer.max_length and longest else None
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rm-encode")  # tokenizers: one thread

    async def read_json(self, request: web.Request, check_model: bool = True) -> dict[str, Any]:
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
    def use_activation(body: dict[str, Any], default: bool) -> bool:
        """`use_activation`, or its name before vLLM 0.11.2, `activation` (what older verl sends)."""
        name = "use_activation" if body.get("use_activation") is not None else "activation"
        value = body.get(name)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise RequestError(400, f"'{name}' must be true, false or null", param=name)
        return value

    async def encode_request(self, body: dict[str, Any]) -> tuple[str, list[list[int]]]:
        """`("messages" | "input", token ids)` of a `/pooling` or `/classify` body, or a 400/413 `RequestError`."""
        if ("messages" in body) == ("input" in body):
            raise RequestError(
                400, "give either 'messages' (one conversation) or 'input' (a string, list of strings or token ids)"
            )
        if "messages" in body:
            messages = parse_messages(body["messages"])
            chars = sum(len(m["content"]) for m in messages)
            if self.max_chars is not None and chars > self.max_chars:
                raise RequestError(400, self.too_long("messages", chars), param="messages")
            return "messages", [await self.run_encoder(self.encode_messages, messages)]
        items = body["input"]
        if isinstance(items, str) or (isinstance(items, list) and items and type(items[0]) is int):
            items = [items]  # one text, or one token-id sequence (checked on the encoding thread, not here)
        if not isinstance(items, list) or not items:
            raise RequestError(
                400, "'input' must be a string, a non-empty list of strings, or token ids", param="input"
            )
        return "input", await self.encode_inputs(items, "input")

    async def encode_inputs(self, items: list[Any], where: str) -> list[list[int]]:
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
                raise RequestError(400, self.too_long(f"{where}[{i}]", len(item)), param=f"{where}[{i}]")
        return await self.run_encoder(self.encode_items, items, where)

    def too_long(self, where: str, chars: int) -> str:
        return (
            f"{where} is {chars} characters: more than the model's max length of {self.scorer.max_length} tokens can "
            f"hold (no token of this tokenizer is longer than {self.max_chars // self.scorer.max_length} characters); "
            "shorten it"
        )

    async def run_encoder(self, fn: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self.executor, fn, *args)

    def encode_messages(self, messages: list[dict[str, str]]) -> list[int]:
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

    def encode_items(self, items: list[Any], where: str) -> list[list[int]]:
        """Token ids of `input` / `query` items, or a 400 `RequestError` naming the first bad one."""
        max_length = self.scorer.max_length
        vocab = self.scorer.config.vocab_size
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
