"""A judge behind OpenAI-compatible servers (`trl-rm-env serve --engine vllm --model JUDGE`, `vllm serve`, SGLang,
TGI, a hosted API): `RemoteJudgeEngine`, through the pool every client of ours uses (`trl_rm_env.serving.pool`: URLs
round-robin, retries with backoff, a concurrency limit, timeouts, the API key).

Two ways to send a judgement (`remote_input`):

- `tokens` (with the judge's tokenizer; `auto` picks it when the tokenizer loads): `POST /v1/completions` with the
  prompt as token ids, rendered here exactly as the local engines get them. `logprobs` asks for vLLM's
  `logprob_token_ids` (the full-vocabulary log-probability of each verdict token: exact);
- `messages`: `POST /v1/chat/completions` with the judge's one user message; the server renders it. `logprobs` reads
  the verdict tokens among the `top_logprobs` (20, OpenAI's most): a verdict outside them counts as probability 0,
  so prefer `tokens` where the server takes token ids.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit

from ..serving.options import RemoteOptions
from ..serving.pool import RemoteScoringError, ServerPool
from ..serving.protocol import api_key_from_env

TOP_LOGPROBS = 20
"""`top_logprobs` asked for in `messages` mode (OpenAI's maximum)."""


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
    """

    name = "remote"
    is_async = True

    def __init__(self, urls: str | Sequence[str], *, model: str | None, tokens: bool, options: RemoteOptions):
        urls = [urls] if isinstance(urls, str) else list(urls)
        if not urls:
            raise ValueError("a remote judge needs at least one server URL")
        self.bases = [openai_base(u) for u in urls]
        self.model, self.tokens, self.options = model, tokens, options
        endpoint = "/completions" if tokens else "/chat/completions"
        self.urls = [b + endpoint for b in self.bases]
        api_key = (options.api_key if options.api_key is not None else api_key_from_env()) or None
        self.pool = ServerPool(self.urls, options, api_key, "judge server")
        self.max_length = None  # the server refuses an over-long prompt itself

    def _body(self, prompt: Any, **fields: Any) -> dict[str, Any]:
        body: dict[str, Any] = {"prompt": list(prompt)} if self.tokens else {"messages": prompt}
        if self.model is not None:
            body["model"] = self.model
        return body | fields

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

            def read(body: Any, url: str) -> list[float]:
                try:
                    step = body["choices"][0]["logprobs"]["top_logprobs"][0]
                    return [float(step[k]) if k in step else float("-inf") for k in keys]
                except (KeyError, IndexError, TypeError, ValueError) as err:
                    raise RemoteScoringError(
                        f"judge server {url} answered without logprobs in choices[0].logprobs.top_logprobs[0] (does it "
                        f"take vLLM's logprob_token_ids?): {str(body)[:300]}",
                        url,
                        200,
                    ) from err

        else:
            fields = {"max_tokens": 1, "temperature": 0.0, "logprobs": True, "top_logprobs": TOP_LOGPROBS}

            def read(body: Any, url: str) -> list[float]:
                try:
                    top = body["choices"][0]["logprobs"]["content"][0]["top_logprobs"]
                    found = {entry["token"]: float(entry["logprob"]) for entry in top}
                except (KeyError, IndexError, TypeError, ValueError) as err:
                    raise RemoteScoringError(
                        f"judge server {url} answered without logprobs in choices[0].logprobs.content[0].top_logprobs: "
                        f"{str(body)[:300]}",
                        url,
                        200,
                    ) from err
                return [found.get(label, float("-inf")) for label in labels]

        return await self.pool.post_all([self._body(p, **fields) for p in prompts], read)

    async def generate(self, prompts: Sequence[Any], max_new_tokens: int, temperature: float, seed: int) -> list[str]:
        """The judge's text for each prompt."""
        fields = {"max_tokens": max_new_tokens, "temperature": temperature, "seed": seed}

        def read(body: Any, url: str) -> str:
            try:
                choice = body["choices"][0]
                text = choice["text"] if self.tokens else choice["message"]["content"]
            except (KeyError, IndexError, TypeError) as err:
                raise RemoteScoringError(
                    f"judge server {url} answered without a choice's text: {str(body)[:300]}", url, 200
                ) from err
            return text or ""

        return await self.pool.post_all([self._body(p, **fields) for p in prompts], read)
