"""A judge behind OpenAI-compatible servers (`trl-rm-env serve --engine vllm --model JUDGE`, `vllm serve`, SGLang,
TGI, a hosted API): `RemoteJudgeEngine`, beside the reward model's `RemoteScorer` in the one package that talks to
servers, through the pool every client of ours uses (`pool.py`: URLs round-robin, retries with backoff, a concurrency
limit, timeouts, the API key).

Two ways to send a judgement (`remote_input`):

- `tokens` (with the judge's tokenizer; `auto` picks it when the tokenizer loads): `POST /v1/completions` with the
  prompts as token ids (`PROMPTS_PER_REQUEST` per request), rendered here exactly as the local engines get them.
  `logprobs` asks for vLLM's `logprob_token_ids` (the full-vocabulary log-probability of each verdict token: exact);
- `messages`: `POST /v1/chat/completions` with the judge's one user message; the server renders it. `logprobs` reads
  the verdict tokens among the `top_logprobs` (20, OpenAI's most): a verdict outside them counts as probability 0,
  so prefer `tokens` where the server takes token ids.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit

from ..dialects import api_key_from_env
from .pool import RemoteScoringError, ServerPool
from .remote_options import RemoteOptions
from .tokenizer import client_tokenizer

logger = logging.getLogger(__name__)

TOP_LOGPROBS = 20
"""`top_logprobs` asked for in `messages` mode (OpenAI's maximum)."""
PROMPTS_PER_REQUEST = 64
"""Token-id prompts sent in one `/v1/completions` request at most (a request per server at least): fewer requests,
less of the servers' per-request work, and the engine gets a call's judgements together."""


def openai_base(url: str) -> str:
    """`http://host:port[/v1][/...]` -> `http://host:port/v1`."""
    url = url.rstrip("/")
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"judge server URL must start with http:// or https://, got {url!r}")
    for tail in ("/chat/completions", "/completions"):
        if url.endswith(tail):
            url = url[: -len(tail)]
    parts = urlsplit(url)
    return url if parts.path.endswith("/v1") else url + "/v1"


class RemoteJudgeEngine:
    """Judgements on OpenAI-compatible servers (see the module docstring).

    Args:
        urls: One server or several (`http://host:port` or `.../v1`).
        model: The `model` sent with each request (None: omitted, the server's own).
        tokens: Send token ids (`/v1/completions`) rather than messages (`/v1/chat/completions`).
        options: The `RemoteOptions` (connection settings; `remote_input` decides `tokens` before this).
        max_length: The longest prompt plus answer the servers take (token ids are checked here; None: unchecked).
        template_kwargs: With messages, sent as `chat_template_kwargs` (vLLM's; e.g. `{"enable_thinking": false}`);
            with token ids they were applied here already.
    """

    name = "remote"
    is_async = True
    sharding = "none"  # the servers hold the weights

    def __init__(
        self,
        urls: str | Sequence[str],
        *,
        model: str | None,
        tokens: bool,
        options: RemoteOptions,
        max_length: int | None = None,
        template_kwargs: Mapping[str, Any] | None = None,
    ):
        urls = [urls] if isinstance(urls, str) else list(urls)
        if not urls:
            raise ValueError("a remote judge needs at least one server URL")
        self.bases = [openai_base(u) for u in urls]
        self.model, self.tokens, self.options = model, tokens, options
        endpoint = "/completions" if tokens else "/chat/completions"
        self.urls = [b + endpoint for b in self.bases]
        api_key = (options.api_key if options.api_key is not None else api_key_from_env()) or None
        self.pool = ServerPool(self.urls, options, api_key, "judge server")
        self.max_length = max_length  # tokens: checked here; None: the server refuses an over-long prompt itself
        self.template_kwargs = dict(template_kwargs or {})

    def close(self) -> None:
        """Nothing to stop: each call opens and closes its own connections (the `Engine` contract's `close`)."""

    def _chunks(self, prompts: Sequence[Any]) -> list[list[Any]]:
        """The prompts of one request each: token ids go `PROMPTS_PER_REQUEST` at a time (OpenAI's completions take a
        list of prompts), spread over every server; a chat request holds one conversation. (A request's fields, its
        seed among them, apply to all its prompts.)"""
        if not self.tokens:
            return [[p] for p in prompts]
        count = max(len(self.urls), -(-len(prompts) // PROMPTS_PER_REQUEST))
        size = -(-len(prompts) // count) if prompts else 1
        return [list(prompts[k : k + size]) for k in range(0, len(prompts), size)]

    def _body(self, prompts: list[Any], **fields: Any) -> dict[str, Any]:
        if self.tokens:
            body: dict[str, Any] = {"prompt": [list(map(int, p)) for p in prompts]}
        else:
            body = {"messages": prompts[0]}
            if self.template_kwargs:
                body["chat_template_kwargs"] = self.template_kwargs
        if self.model is not None:
            body["model"] = self.model
        return body | fields

    async def _post(
        self, prompts: Sequence[Any], fields: dict[str, Any], read_choice: Any, *, seeds: Sequence[int] | None = None,
        keep_failures: bool = False,
    ) -> list[Any]:
        """Each prompt's `read_choice(choice, url)`, in input order. `seeds`: each prompt's `seed` (prompts of one
        seed share requests); `keep_failures`: a failed request's prompts answer None, the others go on (warned),
        unless every request failed (an error naming the server: a dead or unreachable one)."""
        if seeds is None:
            groups = [(list(range(len(prompts))), fields)]
        else:
            by_seed: dict[int, list[int]] = {}
            for k, seed in enumerate(seeds):
                by_seed.setdefault(int(seed), []).append(k)
            groups = [(ks, fields | {"seed": seed}) for seed, ks in by_seed.items()]
        chunks, bodies = [], []
        for ks, group_fields in groups:
            for chunk in self._chunks(ks):
                chunks.append(chunk)
                bodies.append(self._body([prompts[k] for k in chunk], **group_fields))

        def read(body: Any, url: str) -> list[Any]:
            try:
                choices = sorted(body["choices"], key=lambda c: c.get("index", 0))
            except (KeyError, TypeError, AttributeError) as err:
                raise RemoteScoringError(
                    f"judge server {url} answered without choices: {str(body)[:300]}", url, 200
                ) from err
            return [read_choice(choice, url) for choice in choices]

        errors: list[RemoteScoringError] = []
        failed = (lambda error: errors.append(error)) if keep_failures else None  # answers None
        answers = await self.pool.post_all(bodies, read, on_error=failed)
        if errors and len(errors) == len(bodies):
            raise RemoteScoringError(
                f"every request of this call to the judge servers failed ({len(errors)}): {errors[0]}", errors[0].url,
                errors[0].status,
            ) from errors[0]
        if errors:
            logger.warning(
                "%d of %d requests to the judge servers failed (their judgements count as failed, in "
                "judge_env/num_failed); the first: %s", len(errors), len(bodies), errors[0],
            )
        out: list[Any] = [None] * len(prompts)
        for chunk, values in zip(chunks, answers):
            if values is None:  # a failed request, kept
                continue
            if len(values) != len(chunk):
                raise RemoteScoringError(
                    f"judge server {self.urls[0]} answered {len(values)} choices for {len(chunk)} prompts",
                    self.urls[0],
                    200,
                )
            for k, value in zip(chunk, values):
                out[k] = value
        return out

    async def label_logprobs(
        self, prompts: Sequence[Any], label_ids: Sequence[int] | None, labels: Sequence[str]
    ) -> list[list[float]]:
        """Each prompt's log-probabilities of the verdict tokens at the first generated position (see the module
        docstring for what `messages` mode can read)."""
        if self.tokens:
            fields = {
                "max_tokens": 1,
                "temperature": 0.0,
                "logprobs": 1,
                "logprob_token_ids": [int(t) for t in label_ids],
                "return_tokens_as_token_ids": True,
            }
            keys = [f"token_id:{int(t)}" for t in label_ids]

            def read(choice: Any, url: str) -> list[float]:
                try:
                    step = choice["logprobs"]["top_logprobs"][0]
                    return [float(step[k]) for k in keys]
                except (KeyError, IndexError, TypeError, ValueError) as err:
                    raise RemoteScoringError(
                        f"judge server {url} answered without the verdict tokens' logprobs in "
                        f"choices[i].logprobs.top_logprobs[0] (it must take vLLM's logprob_token_ids; else use "
                        f"remote_input='messages'): {str(choice)[:300]}",
                        url,
                        200,
                    ) from err

        else:
            fields = {"max_tokens": 1, "temperature": 0.0, "logprobs": True, "top_logprobs": TOP_LOGPROBS}

            def read(choice: Any, url: str) -> list[float]:
                try:
                    top = choice["logprobs"]["content"][0]["top_logprobs"]
                    found = {entry["token"]: float(entry["logprob"]) for entry in top}
                except (KeyError, IndexError, TypeError, ValueError) as err:
                    raise RemoteScoringError(
                        f"judge server {url} answered without logprobs in choices[0].logprobs.content[0].top_logprobs: "
                        f"{str(choice)[:300]}",
                        url,
                        200,
                    ) from err
                return [found.get(label, float("-inf")) for label in labels]

        return await self._post(prompts, fields, read)

    async def generate(
        self,
        prompts: Sequence[Any],
        max_new_tokens: int,
        temperature: float,
        seeds: Sequence[int],
        top_p: float = 1.0,
        keep_failures: bool = False,
    ) -> list[str | None]:
        """The judge's text for each prompt (`seeds`: each prompt's; `keep_failures`: a failed request's prompts get
        None rather than an error)."""
        fields: dict[str, Any] = {"max_tokens": max_new_tokens, "temperature": temperature}
        if top_p != 1.0:
            fields["top_p"] = top_p

        def read(choice: Any, url: str) -> str:
            try:
                text = choice["text"] if self.tokens else choice["message"]["content"]
            except (KeyError, TypeError) as err:
                raise RemoteScoringError(
                    f"judge server {url} answered without a choice's text: {str(choice)[:300]}", url, 200
                ) from err
            return text or ""

        return await self._post(prompts, fields, read, seeds=seeds, keep_failures=keep_failures)


def remote_judge_tokenizer(tokenizer: Any, model: str | None, remote_input: str, name: str) -> Any:
    """The judge's tokenizer for a remote judge (`client_tokenizer`, as for a remote reward model); None sends
    messages.

    Raises:
        ValueError: `remote_input="tokens"` without a tokenizer to render them.
    """
    tokenizer = client_tokenizer(tokenizer, model, remote_input, name, what="judge")
    if tokenizer is None and remote_input == "tokens":
        raise ValueError(f"{name}: remote_input='tokens' needs the judge's tokenizer: give tokenizer= (its path or Hub id)")
    return tokenizer
