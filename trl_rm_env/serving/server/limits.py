"""The server's options, each declared once: what our scoring server accepts from its clients (`ServerLimits`,
whose flags `trl-rm-env serve` generates) and its default token budget."""

from __future__ import annotations

from dataclasses import dataclass

from ...options import document, option

SERVER_TOKEN_BUDGET = 16384
"""`serve`'s default token budget: tokens per forward pass (`--max-tokens-per-batch`) and tokens the batching worker
gathers from the queue for one scoring call. A server batches many clients' requests, so it is always bounded."""


@document
@dataclass(frozen=True)
class ServerLimits:
    """The limits a scoring server puts on its clients (the `Args` below are generated from the fields).

    Raises:
        ValueError: a limit below 1, or a timeout that is not > 0.
    """

    max_queue: int = option(1024, help="Requests waiting at most; more get HTTP 503 with `Retry-After: 1`.")
    max_request_bytes: int = option(8 * 1024 * 1024, help="Largest request body; larger get HTTP 413.")
    max_items_per_request: int = option(4096, help="Most sequences in one request; more get HTTP 413.")
    header_timeout: float = option(
        10.0,
        help="Seconds a connection may take to send a request head (also the keep-alive idle time); then closed.",
    )
    body_timeout: float = option(30.0, help="Seconds for a request body once its head arrived; slower get HTTP 408.")
    max_connections: int | None = option(
        None,
        help="Open connections at most; past it the oldest idle one is closed (None: the open-file limit - 128).",
    )

    def __post_init__(self) -> None:
        for name in ("max_queue", "max_request_bytes", "max_items_per_request", "max_connections"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        for name in ("header_timeout", "body_timeout"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
