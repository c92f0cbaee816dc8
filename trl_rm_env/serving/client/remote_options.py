"""The client's options, each declared once: how it reaches reward-model servers (`RemoteOptions`), and which
scoring options only a model loaded in this process applies (`local_only`)."""

from __future__ import annotations

from dataclasses import dataclass

from ...options import changed, check_choices, document, option, option_fields, spelling
from ...runtime.model_options import ModelOptions
from ..dialects import APIS

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


def local_only(scoring: ModelOptions) -> list[str]:
    """The model options given (not at their defaults) that only a model loaded here applies (`Spelling.remote`)."""
    remote = {f.name for f in option_fields(type(scoring)) if spelling(f).remote}
    return sorted(set(changed(scoring)) - remote)
