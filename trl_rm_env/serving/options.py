"""The options of serving, each declared once: how the client reaches reward-model servers (`RemoteOptions`) and
what our server accepts from its clients (`ServerLimits`, whose flags `trl-rm-env serve` generates)."""

from __future__ import annotations

from dataclasses import dataclass

from ..options import changed, check_choices, document, option, option_fields, spelling
from ..scoring.options import ScoringOptions
from .protocol import APIS

INPUT_FORMATS = ("auto", "tokens", "messages")


@document
@dataclass(frozen=True)
class RemoteOptions:
    """How the client reaches reward-model servers: their dialect, what it sends, and its connection settings (the
    `Args` below are generated from the fields).

    Raises:
        ValueError: a value outside an option's choices, or a negative or zero setting.
    """

    remote_api: str = option(
        "pooling",
        choices=tuple(APIS),
        help="The servers' dialect: `pooling` (vLLM's `/pooling`, ours), `classify` (vLLM's `/classify`) or `openrlhf` "
        "(OpenRLHF's `/get_reward`, text only: conversations are rendered here with the RM's tokenizer).",
    )
    remote_input: str = option(
        "auto",
        choices=INPUT_FORMATS,
        help="What is sent: `tokens` (token ids rendered here exactly as local scoring renders them; needs the RM's "
        "tokenizer), `messages` (the server renders them) or `auto` (tokens when the tokenizer loads).",
    )
    timeout: float = option(60.0, help="Seconds for one request, connection included.", recipe="reward_remote_timeout")
    retries: int = option(
        5, help="Retries of a request after a 502/503/504, a connection error or a timeout.", recipe="reward_remote_retries"
    )
    backoff: float = option(0.5, help="Seconds before the first retry; doubled each time.", recipe="reward_remote_backoff")
    max_backoff: float = option(8.0, help="Longest wait between two tries.", recipe="reward_remote_max_backoff")
    max_concurrency: int = option(
        64, help="Requests in flight at once, over all servers.", recipe="reward_remote_max_concurrency"
    )
    api_key: str | None = option(
        None,
        help="Sent as `Authorization: Bearer <key>`. None: `TRL_RM_ENV_API_KEY`, else `VLLM_API_KEY` (never a "
        "command-line flag or YAML key: it would show in `ps` and in logs).",
        flag=None,
        recipe=None,
    )

    def __post_init__(self) -> None:
        check_choices(self)
        if self.retries < 0 or self.backoff < 0 or self.max_backoff < 0 or self.timeout <= 0 or self.max_concurrency < 1:
            raise ValueError(
                f"need retries >= 0, backoff >= 0, max_backoff >= 0, timeout > 0, max_concurrency >= 1; got "
                f"retries={self.retries}, backoff={self.backoff}, max_backoff={self.max_backoff}, timeout={self.timeout}, "
                f"max_concurrency={self.max_concurrency}"
            )


def local_only(scoring: ScoringOptions) -> list[str]:
    """The scoring options given (not at their defaults) that only local scoring applies (`Spelling.remote`)."""
    remote = {f.name for f in option_fields(ScoringOptions) if spelling(f).remote}
    return sorted(set(changed(scoring)) - remote)


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
