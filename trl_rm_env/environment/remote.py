"""The scorer of a reward model behind HTTP servers (`trl-rm-env serve`, vLLM `--runner pooling`, OpenRLHF-style):
`RemoteScorer`, with the RM's tokenizer where conversations are rendered here."""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from typing import Any

from transformers import AutoTokenizer

from ..runtime.model_options import ScoringOptions
from ..serving.client import RemoteScorer
from ..serving.client.options import RemoteOptions

logger = logging.getLogger(__name__)


def remote_scorer(
    urls: str | Sequence[str],
    model: str | None,
    tokenizer: Any,
    options: RemoteOptions,
    scoring: ScoringOptions,
    name: str,
) -> RemoteScorer:
    """A `RemoteScorer` for `urls`: `model` is the model name sent to the servers; the RM's tokenizer is `tokenizer`
    (loaded when a path or Hub id), else `model`'s when the dialect takes token ids (`client_tokenizer`)."""
    tokenizer = client_tokenizer(tokenizer, model, options.remote_input, name, api=options.remote_api)
    return RemoteScorer(urls, model=model, tokenizer=tokenizer, options=options, scoring=scoring)


def client_tokenizer(
    tokenizer: Any, model: str | None, remote_input: str, name: str, *, api: str = "pooling", what: str = "reward model"
) -> Any:
    """The model's tokenizer for a client of servers (a reward model's, or a judge's: `what`): the one given (loaded
    when it is a path or Hub id), else `model`'s when the API takes token ids and `model` names a loadable tokenizer;
    None sends messages (logged)."""
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
                    f"{name}: remote_input='tokens' needs the {what}'s tokenizer; {model!r} is not one ({err}). "
                    "Give tokenizer= (its path or Hub id)."
                ) from err
    logger.info(
        "%s: sending messages to the server, which renders them with its chat template (give tokenizer= to send "
        "token ids encoded exactly as local scoring does).",
        name,
    )
    return None
