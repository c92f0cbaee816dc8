"""Where a reward function's model runs, decided once for reward models and judges alike: loaded in this process, or
behind servers (`remote_url`), with the same guards and messages for both."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from transformers import PreTrainedModel


def loaded_here(
    owner: str, what: str, model: Any, remote_url: Any, remote_values: Mapping[str, Any], verb: str
) -> bool:
    """True when the model of `owner` (`RewardModelEnvironment`, `JudgeEnvironment`) is loaded in this process, False
    when servers at `remote_url` run it. `what` names the model (`reward model`, `judge`) and `verb` what servers do
    with it (`score`, `judge`).

    Raises:
        ValueError: options of servers (`remote_values`) without `remote_url`, named.
        TypeError: neither a model nor `remote_url`; or a loaded model with `remote_url` (there `model` is the name
            sent to the servers).
    """
    if remote_url is None:
        if remote_values:
            raise ValueError(
                f"{', '.join(sorted(remote_values))}: options of a {what} behind servers; this one is loaded here "
                f"(give remote_url to {verb} on servers)"
            )
        if model is None:
            raise TypeError(f"{owner} needs a model (a path, a Hub id or a loaded {what}), or remote_url")
        return True
    if isinstance(model, PreTrainedModel):
        raise TypeError("with remote_url, model is the model name sent to the servers, not a loaded model")
    return False
