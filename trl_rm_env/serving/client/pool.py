"""What every client of model servers shares: a pool of URLs used round-robin, a concurrency limit, timeouts,
retries with exponential backoff, the API key, and one error that names the URL (`RemoteScoringError`).

The reward-model client (`RemoteScorer`) and the judge's OpenAI-compatible client
(`trl_rm_env.serving.client.judge_engine.RemoteJudgeEngine`) post their requests through a `ServerPool`.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import aiohttp

from .remote_options import RemoteOptions

RETRY_STATUSES = frozenset({502, 503, 504})
"""Statuses retried (on the next server): a gateway error or a busy server."""

T = TypeVar("T")


class RemoteScoringError(RuntimeError):
    """Scoring on a remote server failed. `url` is the server, `status` the HTTP status (None: no answer)."""

    def __init__(self, message: str, url: str, status: int | None = None):
        super().__init__(message)
        self.url, self.status = url, status


def one_line(text: str, limit: int = 200) -> str:
    """The start of a server's text on one line (whitespace runs as one space), `...` where it was cut."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[:limit] + "..."


async def json_body(response: aiohttp.ClientResponse, what: str, url: str) -> Any:
    """The JSON of a server's answer.

    Raises:
        RemoteScoringError: a body that is not JSON (an HTML page from a proxy, a truncated answer), in one line naming
            the server, the status and the start of the body. Not retried: a server that answers so is misconfigured.
    """
    text = (await response.read()).decode("utf-8", errors="replace")  # JSON is UTF-8 (RFC 8259)
    try:
        return json.loads(text)
    except ValueError:
        shown = repr(one_line(text)) if text.strip() else "an empty body"
        raise RemoteScoringError(
            f"{what} {url} answered HTTP {response.status} with a body that is not JSON: {shown}", url, response.status
        ) from None


async def error_message(response: aiohttp.ClientResponse) -> tuple[str, str | None]:
    """The server's error message and error type (vLLM's `{"error": {"message", "type"}}`), or the start of its text
    on one line."""
    text = await response.text()
    try:
        body = await response.json(content_type=None)
        if isinstance(body, dict):
            error = body.get("error", body)
            if isinstance(error, dict) and "message" in error:
                return str(error["message"]), error.get("type")
            if "message" in body:
                return str(body["message"]), None
            if isinstance(error, str):  # vLLM's 401: {"error": "Unauthorized"}
                return error, None
    except ValueError:
        pass
    return one_line(text, 500), None


class ServerPool:
    """Requests to one kind of server, spread over `urls` round-robin (a retry goes to the next URL).

    Args:
        urls: Full endpoint URLs.
        options: The `RemoteOptions` (`timeout`, `retries`, `backoff`, `max_backoff`, `max_concurrency`).
        api_key: Sent as `Authorization: Bearer <key>` (None: no header).
        what: What the servers are, for error messages (`"reward model server"`).
    """

    def __init__(self, urls: Sequence[str], options: RemoteOptions, api_key: str | None, what: str):
        self.urls, self.options, self.api_key, self.what = list(urls), options, api_key, what
        self._next = 0  # round-robin position, kept across calls

    async def post_all(
        self,
        bodies: Sequence[Mapping[str, Any]],
        read: Callable[[Any, str], T],
        *,
        error_values: Mapping[str, T] | None = None,
        urls: Sequence[str] | None = None,
        on_error: Callable[[RemoteScoringError], T] | None = None,
    ) -> list[T]:
        """POST every body concurrently (at most `max_concurrency` in flight) and `read(json, url)` each answer, in
        input order. `error_values`: an error type a server answers (vLLM's `error.type`) read as that value instead
        of an error. `urls`: other endpoints of the same servers, in the same order (default: `self.urls`).
        `on_error`: a request that failed (refused, or still failing after the retries) answers `on_error(error)`
        and the others go on (None: the error is raised).

        Raises:
            RemoteScoringError: without `on_error`, a request refused (a 4xx other than retried ones, 500), or still
                failing after `retries` retries; the first error stops the other requests.
        """
        urls = list(urls or self.urls)
        start, self._next = self._next, (self._next + len(bodies)) % len(urls)
        options = self.options
        semaphore = asyncio.Semaphore(options.max_concurrency)
        connector = aiohttp.TCPConnector(limit=options.max_concurrency)
        timeout = aiohttp.ClientTimeout(total=options.timeout)
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else None
        async with aiohttp.ClientSession(connector=connector, timeout=timeout, headers=headers) as session:

            async def one(i: int, body: Mapping[str, Any]) -> T:
                async with semaphore:
                    try:
                        return await self._post(session, urls, body, start + i, read, error_values or {})
                    except RemoteScoringError as error:
                        if on_error is None:
                            raise
                        return on_error(error)

            tasks = [asyncio.ensure_future(one(i, b)) for i, b in enumerate(bodies)]
            try:
                return list(await asyncio.gather(*tasks))
            except BaseException:
                for task in tasks:  # on the first error, stop the rest and wait for them to end
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
                raise

    async def _post(
        self,
        session: aiohttp.ClientSession,
        urls: list[str],
        body: Mapping[str, Any],
        slot: int,
        read: Callable[[Any, str], T],
        error_values: Mapping[str, T],
    ) -> T:
        options = self.options
        failures: list[str] = []
        for attempt in range(options.retries + 1):
            url = urls[(slot + attempt) % len(urls)]
            try:
                async with session.post(url, json=body) as response:
                    if response.status == 200:
                        return read(await json_body(response, self.what, url), url)
                    message, err_type = await error_message(response)
                    if err_type in error_values:  # an answer about this item, not a failure: the caller decides
                        return error_values[err_type]
                    if response.status not in RETRY_STATUSES:
                        raise RemoteScoringError(
                            f"{self.what} {url} refused the request: HTTP {response.status}: {message}",
                            url,
                            response.status,
                        )
                    failures.append(f"{url}: HTTP {response.status}: {message}")
            except (TimeoutError, aiohttp.ClientConnectionError, aiohttp.ClientPayloadError) as err:
                reason = "timed out" if isinstance(err, TimeoutError) else f"{type(err).__name__}: {err}"
                failures.append(f"{url}: {reason}")
            if attempt < options.retries:
                await asyncio.sleep(min(options.backoff * 2**attempt, options.max_backoff))
        last_url = urls[(slot + options.retries) % len(urls)]
        counts = Counter(failures)  # the same failure repeated is said once, with its count
        summary = "; ".join(f"{failure}" + (f" ({n} times)" if n > 1 else "") for failure, n in counts.items())
        raise RemoteScoringError(
            f"{self.what} unreachable or busy after {options.retries + 1} tries: {summary}. "
            "Is `trl-rm-env serve` (or vLLM) running there?",
            last_url,
        )
