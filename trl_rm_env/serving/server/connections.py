"""Connection guards of the scoring server: a deadline for each request head, a cap on open connections, and a
quiet log when `accept()` runs out of file descriptors.

aiohttp has a keep-alive timeout but nothing that closes a client which connects and then sends its request head
slowly (or never); at the file-descriptor limit such clients lock every other client out. Each connection is
registered here while it is open: a request head must arrive within `header_timeout` seconds of opening (or of the
previous response), and at `max_connections` the connection idle the longest is closed for each new one.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from typing import Any

from aiohttp import web

logger = logging.getLogger(__name__)

_FD_RESERVE = 128  # file descriptors kept for the model files, threads, logs


class _Guard:
    """Per-connection deadline: a request head must arrive within `timeout` of opening or of the last response."""

    def __init__(self, guards: ConnectionGuards, transport: asyncio.Transport):
        self.guards, self.transport = guards, transport
        self.busy = 0  # requests of this connection inside the app
        self.idle_since = time.monotonic()
        self.handle: asyncio.TimerHandle | None = None
        self.rearm()

    def rearm(self) -> None:
        if self.handle is not None:
            self.handle.cancel()
        self.idle_since = time.monotonic()
        self.handle = asyncio.get_running_loop().call_later(self.guards.header_timeout, self._expire)

    def _expire(self) -> None:
        self.handle = None
        if self.busy == 0 and not self.transport.is_closing():
            self.guards.closed_slow += 1
            self.transport.abort()

    def cancel(self) -> None:
        if self.handle is not None:
            self.handle.cancel()
            self.handle = None


OPEN_GUARDS: dict[asyncio.BaseTransport, _Guard] = {}  # open connections of this process's servers, by transport


class ConnectionGuards:
    """Header timeout and connection cap for every connection of one server."""

    def __init__(self, header_timeout: float, max_connections: int):
        self.header_timeout = header_timeout
        self.max_connections = max_connections
        self.closed_slow = 0
        self.evicted = 0
        self.mine: dict[asyncio.BaseTransport, _Guard] = {}  # insertion order: oldest first

    def opened(self, transport: asyncio.Transport) -> None:
        while len(self.mine) >= self.max_connections and self.evict_idle():
            pass
        guard = _Guard(self, transport)
        self.mine[transport] = OPEN_GUARDS[transport] = guard

    def closed(self, transport: asyncio.BaseTransport) -> None:
        guard = self.mine.pop(transport, None)
        OPEN_GUARDS.pop(transport, None)
        if guard is not None:
            guard.cancel()

    def evict_idle(self) -> bool:
        """Close the connection idle the longest (no request inside the app); False if every one is busy."""
        idle = [g for g in self.mine.values() if g.busy == 0 and not g.transport.is_closing()]
        if not idle:
            return False
        oldest = min(idle, key=lambda g: g.idle_since)
        self.evicted += 1
        oldest.transport.abort()
        self.closed(oldest.transport)
        return True


class GuardedProtocol(asyncio.Protocol):
    """aiohttp's request handler, with the connection registered in `ConnectionGuards` while it is open."""

    def __init__(self, inner: asyncio.Protocol, guards: ConnectionGuards):
        self.inner, self.guards = inner, guards

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        self.guards.opened(transport)
        self.inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self.guards.closed(self.transport)
        self.inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()


class GuardedSite(web.TCPSite):
    """`TCPSite` whose connections go through `GuardedProtocol`."""

    def __init__(self, runner: web.BaseRunner, host: str, port: int, guards: ConnectionGuards):
        super().__init__(runner, host, port, backlog=1024)
        self.guards = guards

    async def start(self) -> None:
        await web.BaseSite.start(self)
        server = self._runner.server
        self._server = await asyncio.get_running_loop().create_server(
            lambda: GuardedProtocol(server(), self.guards), self._host, self._port, backlog=self._backlog
        )
        self.bound_port = self._server.sockets[0].getsockname()[1]  # the real one when port=0


def _raise_fd_limit() -> int:
    """Raise the soft open-file limit to the hard one (as vLLM does); return the soft limit now in force."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 65536)
        if soft != resource.RLIM_INFINITY and soft < target:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        return soft if soft != resource.RLIM_INFINITY else 1 << 20
    except (ImportError, ValueError, OSError):  # pragma: no cover - not POSIX, or not allowed
        return 1024


def default_max_connections() -> int:
    """Open connections the server keeps at most: the open-file limit minus a reserve (at least 16)."""
    return max(16, _raise_fd_limit() - _FD_RESERVE)


class AcceptErrorFilter:
    """Loop exception handler: `accept()` out of file descriptors is logged once a minute as one line (asyncio
    retries every second with a traceback otherwise), and the oldest idle connection is closed to free one."""

    def __init__(self, guards: ConnectionGuards, every: float = 60.0):
        self.guards, self.every = guards, every
        self.count, self.last = 0, -math.inf

    def __call__(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        if context.get("message") != "socket.accept() out of system resource":
            loop.default_exception_handler(context)
            return
        self.count += 1
        self.guards.evict_idle()
        now = time.monotonic()
        if now - self.last >= self.every:
            self.last = now
            logger.warning(
                "accept() failed: %s (%d time(s) so far; open connections: %d). Raise `ulimit -n` or lower "
                "--max-connections.",
                context.get("exception"),
                self.count,
                len(self.guards.mine),
            )
