"""`RemoteRewardModelEnvironment`: the GRPO reward function over reward-model servers (`trl-rm-env serve`, vLLM,
OpenRLHF-style), with the same checks, fallbacks, normalization and metrics as local scoring."""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from typing import Any

import torch
from transformers import AutoTokenizer

from ..scoring.scorer import as_pairs, strip_completion_reasoning
from ..serving.client import RemoteScorer
from .local import RewardModelEnvironment
from .rewards import Ids, Samples, check_postprocessing

logger = logging.getLogger(__name__)


class RemoteRewardModelEnvironment(RewardModelEnvironment, remote=True):
    """A `RewardModelEnvironment` whose reward model runs behind HTTP servers with vLLM's `POST /pooling` API.

    Built by `RewardModelEnvironment(remote_url=...)` (or directly). The server is `trl-rm-env serve`, or vLLM
    started with `--runner pooling` on a `*ForSequenceClassification` model; requests ask for raw logits
    (`use_activation: false`), so rewards are the Bradley-Terry scores the local environment returns. With the RM's
    tokenizer (`tokenizer`, else `model` when it names a loadable tokenizer) samples are sent as token ids encoded
    here exactly as local scoring encodes them, so rewards equal local ones; without one they are sent as messages
    (rendered by the server with the RM's chat template) or `prompt + completion` text (no EOS added).

    `__call__` is async: TRL's `GRPOTrainer` runs async reward functions concurrently with the others. Requests are
    spread over the URLs, retried with exponential backoff on 502/503/504, timeouts and connection errors (never on
    other 4xx), and a server that stays down raises an error naming its URL.

    Args:
        remote_url: One URL or several (`http://host:port`).
        model: The model name sent with each request (None: the server's own).
        timeout, retries, backoff, max_concurrency: Client settings (see `trl_rm_env.serving.RemoteScorer`).
        remote_api: The server's dialect: `"pooling"` (vLLM `/pooling`, default), `"classify"` (vLLM `/classify`)
            or `"openrlhf"` (OpenRLHF's `/get_reward`, text only: conversations are rendered here with `tokenizer`,
            the RM's tokenizer or its path). Raw scores are always asked for.
        api_key: Sent as `Authorization: Bearer <key>`; None: `TRL_RM_ENV_API_KEY`, else `VLLM_API_KEY`.
        remote_input: `"tokens"` (the RM's tokenizer is required), `"messages"` or `"auto"` (default: tokens when
            the tokenizer can be loaded; which one is used is logged once).
        template_kwargs: Extra keyword arguments of the RM's chat template, as for local scoring; applied to the
            token ids (or OpenRLHF text) rendered here, so they need the RM's tokenizer.
        nonfinite_reward: Reward for an item the server scored NaN/inf; None raises an error, as local scoring does.
        empty_completion_reward, strip_reasoning, clip, name: As for `RewardModelEnvironment`.
        normalization: `none` or `running` (`checkpoint` needs the model config, which a remote RM does not give).
    """

    def __new__(cls, *args: Any, **kwargs: Any):
        return object.__new__(cls)

    def __init__(
        self,
        model: str | None = None,
        tokenizer: Any = None,
        *,
        remote_url: str | Sequence[str],
        timeout: float = 60.0,
        retries: int = 5,
        backoff: float = 0.5,
        max_concurrency: int = 64,
        remote_api: str = "pooling",
        api_key: str | None = None,
        nonfinite_reward: float | None = None,
        empty_completion_reward: float | None = None,
        strip_reasoning: bool = False,
        normalization: str = "none",
        clip: float | None = None,
        name: str = "reward_model_env",
        remote_input: str = "auto",
        template_kwargs: dict[str, Any] | None = None,
        **unused: Any,
    ):
        local_only = sorted(k for k, v in unused.items() if v not in (None, False))
        if local_only:
            logger.warning("%s: options %s apply to local scoring and are ignored with remote_url.", name, local_only)
        if normalization not in ("none", "running"):  # no model config here, so no checkpoint statistics
            raise ValueError(f"normalization must be 'none' or 'running' with remote_url, got {normalization!r}")
        check_postprocessing(normalization, clip)
        tokenizer = _client_tokenizer(tokenizer, model, remote_api, remote_input, name)
        self.client = RemoteScorer(
            remote_url,
            model=model,
            timeout=timeout,
            retries=retries,
            backoff=backoff,
            max_concurrency=max_concurrency,
            api=remote_api,
            api_key=api_key,
            nonfinite_reward=nonfinite_reward,
            tokenizer=tokenizer,
            input_format="auto" if remote_input == "auto" else remote_input,
            template_kwargs=template_kwargs,
        )
        self.model = None
        # The RM's tokenizer where conversations are rendered here (token ids, OpenRLHF text); None where the server
        # renders them (messages), so nothing set on it here could change a reward.
        self.tokenizer = tokenizer if self.client.renders_here else None
        self.remote_url = self.client.urls
        self._setup(
            self.client,
            name=name,
            normalization=normalization,
            clip=clip,
            empty_completion_reward=empty_completion_reward,
            strip_reasoning=strip_reasoning,
        )

    async def score(self, conversations: Sequence[Any]) -> torch.Tensor:  # type: ignore[override]
        """Raw scores (fp32 tensor, input order) of full conversations or `(context, completion)` pairs."""
        contexts, completions = as_pairs(conversations)
        with self._nonfinite_named(range(len(contexts)), "conversations"):
            scores = await self.client.score(list(zip(contexts, completions)))
        return torch.tensor(scores, dtype=torch.float32)

    async def __call__(  # type: ignore[override]
        self, prompts: Samples, completions: Samples, completion_ids: Ids = None, **kwargs: Any
    ) -> list[float]:
        """TRL reward function (async): one float reward per `(prompt, completion)`."""
        empty, to_score, rewards = self._plan(prompts, completions)
        nonfinite: list[int] = []
        if to_score:
            pairs = [
                (prompts[i], strip_completion_reasoning(completions[i]) if self.strip_reasoning else completions[i])
                for i in to_score
            ]
            with self._nonfinite_named(to_score, "completions") as nonfinite:  # NaN/inf: as local scoring
                scores = await self.client.score(pairs)
            rewards[torch.tensor(to_score)] = torch.tensor(scores, dtype=torch.float32)
        return self._finish(rewards, empty, kwargs.get("log_metric"), nonfinite=len(nonfinite))

    def __repr__(self) -> str:
        return f"RemoteRewardModelEnvironment(name={self.name!r}, remote_url={self.remote_url!r})"


def _client_tokenizer(tokenizer: Any, model: str | None, api: str, remote_input: str, name: str) -> Any:
    """The RM's tokenizer for the client: the one given (loaded when it is a path or Hub id), else `model`'s when
    the API takes token ids and `model` names a loadable tokenizer; None sends messages (logged once)."""
    if isinstance(tokenizer, str | os.PathLike):
        return AutoTokenizer.from_pretrained(str(tokenizer))  # given: failing to load it is an error
    if tokenizer is not None or api == "openrlhf" or remote_input == "messages":
        return tokenizer
    if model:
        try:
            return AutoTokenizer.from_pretrained(model)
        except (OSError, ValueError) as err:
            if remote_input == "tokens":
                raise ValueError(
                    f"{name}: remote_input='tokens' needs the reward model's tokenizer; {model!r} is not one ({err}). "
                    "Give tokenizer= (its path or Hub id)."
                ) from err
    logger.info(
        "%s: sending messages to the server, which renders them with its chat template (give tokenizer= to send "
        "token ids encoded exactly as local scoring does).",
        name,
    )
    return None
