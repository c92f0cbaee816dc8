"""`RemoteScorer`: score conversations with reward-model servers: vLLM's `/pooling` or `/classify`, OpenRLHF's
`/get_reward`.

Works with `trl-rm-env serve`, with `vllm serve <rm> --runner pooling` and with OpenRLHF-style reward servers: one
request per conversation, sent concurrently and spread round-robin over the given servers. `remote_api` picks the
dialect:

- `"pooling"` (default): `POST /pooling` with `{"input": [token ids] | "messages": [...] | "input": text, "task":
  "classify", "use_activation": false}`; the score is `data[0].data[0]`.
- `"classify"`: `POST /classify` with the same inputs and `"use_activation": false`; the score is `data[0].probs[0]`.
- `"openrlhf"`: `POST /get_reward` with `{"query": [text]}`; the score is `rewards[0]`. The protocol carries text
  only, so conversations are rendered here with `tokenizer` (the reward model's).

With the reward model's `tokenizer`, conversations go as token ids (`remote_input="tokens"`, the default then): they
are rendered here exactly as local scoring renders them (`trl_rm_env.tokenization`: the RM's chat template, special-
token text in content encoded as text, EOS after plain text), so served scores equal local ones and content cannot
forge turns on the server either. Without one (or with `remote_input="messages"`) they go as messages or text and the
server renders them.

Raw scores are always asked for (`use_activation: false`): vLLM's default activation turns a one-label reward into
`sigmoid(logit)`, and a softmax over one label is 1.0 for everything. If every score of a batch is exactly 0 or 1,
a warning (once per scorer) says the server is applying an activation.

    from trl_rm_env.serving import RemoteScorer

    scorer = RemoteScorer(["http://10.0.0.5:8000", "http://10.0.0.6:8000"], timeout=60, retries=5, backoff=0.5)
    scores = await scorer.score([[{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}]])
    scores = scorer.score_sync(conversations)  # from synchronous code (no running event loop)

API key: `api_key=`, else the `TRL_RM_ENV_API_KEY`, else the `VLLM_API_KEY` environment variable, sent as
`Authorization: Bearer <key>` (vLLM's convention).

Non-finite scores: a server answer of NaN/inf/null, or `trl-rm-env serve`'s HTTP 500 `NonFiniteScoreError`, is that
item's NaN; `nonfinite_reward` replaces it, or (None, the default) a `FloatingPointError` names the items, as local
scoring (`RewardScorer`) does.

Failures: a busy server (503), a gateway error (502/504), a refused connection or a timeout is retried, each time on
the next server, after `backoff * 2**attempt` seconds (capped by `max_backoff`). Any other 4xx (a malformed or
over-size request, an unknown model) and 500 are raised at once as `RemoteScoringError`, naming the URL, the status
and the server's message. When retries run out the error names the URL(s) that failed and why.
"""

from __future__ import annotations

import asyncio
import math
import os
import warnings
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit

try:
    import aiohttp
except ImportError as err:  # pragma: no cover - exercised only without aiohttp
    raise ImportError("RemoteScorer needs aiohttp: pip install aiohttp") from err
import torch

from ...data.messages import strip_completion_reasoning
from ...options import build, route
from ...runtime.model_options import ScoringOptions
from ...scoring.interfaces import NonfiniteScores, ScoredPairs
from ...scoring.scorer import split_conversation
from ...tokenization import (
    context_token_ids,
    encode_pair,
    encode_text,
    has_special_text,
    left_truncate,
    render_conversation,
)
from ..dialects import SCORE_FIELDS, SeveralOutputsError, api_key_from_env, endpoint_url, read_score
from .pool import RemoteScoringError, ServerPool
from .remote_options import RemoteOptions, local_only


def _payload(item: Any) -> dict[str, Any]:
    """One request body: a full conversation or a (context, completion) pair of message lists or of strings."""
    if isinstance(item, tuple) and len(item) == 2:
        context, completion = item
        if isinstance(context, str) and isinstance(completion, str):
            return {"input": context + completion}
        if isinstance(context, list | tuple) and isinstance(completion, list | tuple):
            return {"messages": [*context, *completion]}
        raise TypeError(
            "a (context, completion) pair must be two strings or two message lists, got "
            f"{type(context).__name__} and {type(completion).__name__}"
        )
    if isinstance(item, str):
        return {"input": item}
    if isinstance(item, list | tuple):
        return {"messages": list(item)}
    raise TypeError(f"cannot score a {type(item).__name__}; give a message list, a string or a (context, completion)")


def _without_reasoning(item: Any) -> Any:
    """An item with `<think>...</think>` dropped from its completion (rendered text is left as it is)."""
    if isinstance(item, tuple) and len(item) == 2:
        return item[0], strip_completion_reasoning(item[1])
    if isinstance(item, list | tuple) and not isinstance(item, str):
        context, completion = split_conversation(item)
        return context, strip_completion_reasoning(completion)
    return item


class RemoteScorer:
    """Async client for reward-model servers: vLLM's `/pooling` or `/classify`, OpenRLHF's `/get_reward`.

    Args:
        urls: One server or several (`http://host:port`, or a full endpoint URL such as `.../pooling`); requests
            are spread over them round-robin and a retry goes to the next one.
        model: The `model` field sent with each request (None: omitted, the server's own model).
        tokenizer: The reward model's tokenizer, or its path or Hub id (loaded here, as the environments load
            one): conversations are encoded here (`remote_input`), or rendered into text for `remote_api="openrlhf"`.
        use_activation: Sent as `use_activation` (`pooling`/`classify`); False (default) asks for the raw
            Bradley-Terry logit.
        options, **values: The `RemoteOptions` (`remote_api`, `remote_input`, `timeout`, `retries`, `backoff`,
            `max_backoff`, `max_concurrency`, `api_key`), an instance and/or by name.
        scoring, **values: The `ScoringOptions` that apply on a server too, an instance and/or by name:
            `nonfinite_reward` (None raises `FloatingPointError` naming the items), `max_length` (tokens mode: the
            server's longest sequence, a longer one has its context cut on the left as local scoring does; None: the
            server's `max_model_len` from `GET /v1/models`, asked once), `template_kwargs` (applied where
            conversations are rendered here: token ids, and text for `openrlhf`; with messages the server renders
            them, so there they are refused) and `strip_reasoning`.

    Raises:
        TypeError: an unknown option name.
        ValueError: a bad option value, a scoring option only local scoring applies (`batch_size`, ...), or a
            dialect and input that do not fit the tokenizer.
    """

    def __init__(
        self,
        urls: str | Sequence[str],
        *,
        model: str | None = None,
        tokenizer: Any = None,
        use_activation: bool = False,
        options: RemoteOptions | None = None,
        scoring: ScoringOptions | None = None,
        **values: Any,
    ):
        if isinstance(tokenizer, str | os.PathLike):  # a path or Hub id, as the environments take it
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(str(tokenizer))
        given = route(values, RemoteOptions, ScoringOptions, what="option")
        options = build(RemoteOptions, options, **given[RemoteOptions])
        scoring = ScoringOptions.build(scoring, **given[ScoringOptions])
        local = local_only(scoring)
        if local:
            raise ValueError(
                f"{', '.join(local)}: applied by a reward model scored in this process, not by one behind a server; "
                "give them to the server (`trl-rm-env serve --help`) or drop them"
            )
        api, input_format, template_kwargs = options.remote_api, options.remote_input, scoring.template_kwargs
        if input_format == "tokens" and (tokenizer is None or api == "openrlhf"):
            raise ValueError(
                "remote_input='tokens' needs the reward model's tokenizer and a dialect that takes token ids "
                f"(pooling or classify); got tokenizer={'set' if tokenizer is not None else None}, remote_api={api!r}"
            )
        if input_format == "auto":
            input_format = "tokens" if tokenizer is not None and api != "openrlhf" else "messages"
        self.options, self.remote = scoring, options  # how it scores (as a local scorer's), how servers are reached
        self.remote_input = input_format
        # Conversations are rendered here (token ids, or OpenRLHF's text), else by the server (messages).
        self.renders_here = tokenizer is not None and (input_format == "tokens" or api == "openrlhf")
        if template_kwargs and not self.renders_here:
            raise ValueError(
                f"template_kwargs {sorted(template_kwargs)} are applied where conversations are rendered, here; "
                f"with remote_input={input_format!r} and tokenizer={'set' if tokenizer is not None else None} they "
                "would go as messages, which the server renders with its own settings. Give RemoteScorer(tokenizer="
                "...) (the reward model's) and remote_input='tokens'."
            )
        self.max_length = scoring.max_length  # tokens mode: None until the server says (`_server_max_length`)
        self._asked_max_length = scoring.max_length is not None
        urls = [urls] if isinstance(urls, str) else list(urls)
        if not urls:
            raise ValueError("RemoteScorer needs at least one server URL")
        self.urls = [endpoint_url(u, api) for u in urls]
        self.model = model
        self.use_activation = use_activation
        self.api_key = (options.api_key if options.api_key is not None else api_key_from_env()) or None
        self.pool = ServerPool(self.urls, options, self.api_key, "reward model server")
        self.tokenizer = tokenizer
        self._warned_special_text = False
        self._warned_activation = False

    @property
    def nonfinite_reward(self) -> float | None:
        """The `Scorer` protocol's reward for a NaN/inf score (`options.nonfinite_reward`)."""
        return self.options.nonfinite_reward

    # ------------------------------------------------------------------ the Scorer protocol
    is_async = True

    async def score_pairs(
        self, contexts: Sequence[Any], completions: Sequence[Any], progress: bool | None = None, *,
        every_output: bool = False,
    ) -> ScoredPairs:
        """The `Scorer` protocol's call: `score` of `(context, completion)` pairs, as an fp32 tensor with the items
        the server scored NaN/inf (no raw outputs: a server returns one score per item).

        Raises:
            ValueError: `every_output` (a server returns one score per item, not every output of the model).
        """
        if every_output:
            raise ValueError(
                f"{self!r} returns one score per item: every output of the model (a regression RM's attributes, an "
                "ensemble's heads) needs the reward model loaded here"
            )
        nonfinite: list[int] = []
        scores = await self._scores(list(zip(contexts, completions)), nonfinite)
        return ScoredPairs(torch.tensor(scores, dtype=torch.float32), None, nonfinite)

    def __repr__(self) -> str:  # never shows the API key
        return f"RemoteScorer(urls={self.urls!r}, api={self.remote.remote_api!r}, api_key={'set' if self.api_key else None})"

    async def score(self, conversations: Sequence[Any]) -> list[float]:
        """Scores of full conversations (message lists), `(context, completion)` pairs, or rendered strings.

        Returns:
            One float per item, in input order (a non-finite score replaced by `nonfinite_reward`).

        Raises:
            RemoteScoringError: a request refused (4xx other than retried ones, 500) or still failing after
                `retries` retries; it names the URL.
            NonfiniteScores: the server scored items NaN/inf and `nonfinite_reward` is None (a `FloatingPointError`).
        """
        return await self._scores(conversations, [])

    async def _scores(self, conversations: Sequence[Any], nonfinite: list[int]) -> list[float]:
        """`score`, with the items scored NaN/inf (given `nonfinite_reward`) appended to `nonfinite`."""
        if self.options.strip_reasoning:
            conversations = [_without_reasoning(item) for item in conversations]
        if self.remote_input == "tokens" and not self._asked_max_length:
            self.max_length = await self._server_max_length()
        contexts: dict[int, tuple[Any, list[int]]] = {}  # context ids by context object (GRPO repeats prompts)
        payloads = [
            self._body(self._encode(item, contexts) if self.remote_input == "tokens" else _payload(item))
            for item in conversations
        ]
        if not payloads:
            return []
        scores = await self._score_all(payloads)
        bad = [i for i, s in enumerate(scores) if not math.isfinite(s)]
        if bad:
            if self.options.nonfinite_reward is None:
                raise NonfiniteScores.naming("The reward model server", bad)
            nonfinite.extend(bad)
            bad_set = set(bad)
            scores = [float(self.options.nonfinite_reward) if i in bad_set else s for i, s in enumerate(scores)]
        elif not self._warned_activation and all(s in (0.0, 1.0) for s in scores):
            self._warned_activation = True
            warnings.warn(
                f"every score of this batch from {self.urls[0]} is exactly 0 or 1: the server seems to apply an "
                "activation (vLLM's softmax/sigmoid default) to the reward. Serve the raw score (vLLM: "
                "--pooler-config '{\"use_activation\": false}'); this client already sends use_activation: false.",
                RuntimeWarning,
                stacklevel=2,
            )
        return scores

    def _encode(self, item: Any, contexts: dict[int, tuple[Any, list[int]]]) -> dict[str, Any]:
        """One item as token ids, encoded as local scoring encodes it (`RewardScorer.encode`); `contexts` caches the
        contexts' own ids by object (each kept beside its ids, so no other object takes its id during the call)."""
        if isinstance(item, str):  # already rendered: special tokens in it are the template's
            return {"input": encode_text(self.tokenizer, item)}
        if isinstance(item, tuple) and len(item) == 2:
            context, completion = item
        elif isinstance(item, list | tuple):
            context, completion = split_conversation(item)
        else:
            _payload(item)  # raises the TypeError that names what is accepted
        if id(context) not in contexts:
            contexts[id(context)] = (context, context_token_ids(self.tokenizer, context, **self.options.template_kwargs))
        ids, context_length = encode_pair(
            self.tokenizer, context, completion, context_ids=contexts[id(context)][1], **self.options.template_kwargs
        )
        if self.max_length is not None and len(ids) > self.max_length:
            ids = left_truncate(ids, context_length, self.max_length, self.tokenizer.bos_token_id) or ids
        return {"input": ids}

    async def _server_max_length(self) -> int | None:
        """The first server's `max_model_len` (`GET /v1/models`, vLLM's and ours), or None when it does not say."""
        self._asked_max_length = True
        parts = urlsplit(self.urls[0])
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else None
        try:
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.remote.timeout)) as session:
                async with session.get(f"{parts.scheme}://{parts.netloc}/v1/models", headers=headers) as response:
                    body = await response.json(content_type=None) if response.status == 200 else {}
        except (TimeoutError, aiohttp.ClientError, ValueError):
            return None  # scoring will say what is wrong with the server
        models = body.get("data") if isinstance(body, dict) else None
        length = models[0].get("max_model_len") if isinstance(models, list) and models else None
        return int(length) if isinstance(length, int) and length > 0 else None

    def _body(self, payload: dict[str, Any]) -> dict[str, Any]:
        """The request body of one item for the server's dialect (`remote_api`)."""
        if self.remote.remote_api == "openrlhf":
            if "messages" in payload:
                if self.tokenizer is None:
                    raise TypeError(
                        "remote_api='openrlhf' sends text (OpenRLHF's `query`): give RemoteScorer(tokenizer=...) (the reward "
                        "model's) to render conversations, or score rendered strings"
                    )
                messages = payload["messages"]
                if not self._warned_special_text and has_special_text(self.tokenizer, messages):
                    # OpenRLHF's protocol carries rendered text only: the server cannot tell content from the
                    # template, so special-token text in content reaches the model as control tokens.
                    self._warned_special_text = True
                    warnings.warn(
                        "remote_api='openrlhf' sends rendered text, and a conversation's content spells a special token of "
                        "the reward model's tokenizer: the server will read it as a control token (a policy can forge "
                        "turns this way). Use remote_api='pooling' or 'classify', which send messages and keep it as text.",
                        RuntimeWarning,
                        stacklevel=2,
                    )
                return {"query": [render_conversation(self.tokenizer, messages, **self.options.template_kwargs)]}
            return {"query": [payload["input"]]}
        body = dict(payload, use_activation=self.use_activation)
        if self.remote.remote_api == "pooling":
            body["task"] = "classify"
        if self.model is not None:
            body["model"] = self.model
        return body

    async def _score_all(self, payloads: list[dict[str, Any]]) -> list[float]:
        return await self.pool.post_all(payloads, self._read_score, error_values={"NonFiniteScoreError": math.nan})

    def score_sync(self, conversations: Sequence[Any]) -> list[float]:
        """`score` from synchronous code. Raises RuntimeError inside a running event loop (await `score` there)."""
        return asyncio.run(self.score(conversations))

    def _read_score(self, body: Any, url: str) -> float:
        try:
            return read_score(body, self.remote.remote_api)
        except SeveralOutputsError as err:
            raise RemoteScoringError(
                f"reward model server {url} answered {err.count} outputs per sample in "
                f"{SCORE_FIELDS[self.remote.remote_api]}, where one is the reward: a model with several outputs (an "
                "ensemble's heads, a regression RM's attributes) is served with `trl-rm-env serve`, which turns them "
                "into its reward",
                url,
                200,
            ) from err
        except (KeyError, IndexError, TypeError, ValueError) as err:
            raise RemoteScoringError(
                f"reward model server {url} answered without a score in {SCORE_FIELDS[self.remote.remote_api]}: {str(body)[:300]}",
                url,
                200,
            ) from err
