"""The tokenizer a client of servers renders conversations with (a reward model's, or a judge's)."""

from __future__ import annotations

import logging
import os
from typing import Any

from transformers import AutoTokenizer

logger = logging.getLogger(__name__)


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
