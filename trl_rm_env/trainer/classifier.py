"""Loading a sequence classifier with several outputs for training (a regression RM's attributes, an ensemble's
heads), where TRL's `RewardTrainer` forces `num_labels=1` and refuses any other model."""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from transformers import AutoConfig, AutoModelForSequenceClassification
from trl.trainer.reward_trainer import suppress_seqcls_warning
from trl.trainer.utils import create_model_from_path

logger = logging.getLogger(__name__)


@contextmanager
def one_label_view(config: Any) -> Iterator[None]:
    """Show TRL's `RewardTrainer.__init__` a one-label config (it refuses `num_labels != 1`); restore it after."""
    id2label, label2id = config.id2label, config.label2id
    config.id2label, config.label2id = {0: "LABEL_0"}, {"LABEL_0": 0}
    try:
        yield
    finally:
        config.id2label, config.label2id = id2label, label2id


@contextmanager
def _transformers_log_level(level: int | None) -> Iterator[None]:
    """Raise transformers' log level for a block (None: leave it)."""
    from transformers.utils import logging as hf_logging

    if level is None:
        yield
        return
    before = hf_logging.get_verbosity()
    hf_logging.set_verbosity(max(level, before))
    try:
        yield
    finally:
        hf_logging.set_verbosity(before)


def load_classifier(path: str, args: Any, quantization_config: Any, labels: Sequence[str], what: str) -> Any:
    """Load `path` as TRL's `RewardTrainer` does (seeded new head, `model_init_kwargs`, quantization, no device map
    under DDP/DeepSpeed), but with one output per name of `labels` (`id2label`). A trained classifier with another
    head size (a one-label Bradley-Terry RM) keeps its body and gets a new head (random, seeded; a warning naming
    `what` it is for)."""
    from transformers import set_seed

    set_seed(args.seed)  # the new score head is random: seed it as TRL does
    init_kwargs = dict(args.model_init_kwargs or {})
    if quantization_config is not None:
        init_kwargs["quantization_config"] = quantization_config
    if args.distributed_state.distributed_type in ["MULTI_GPU", "DEEPSPEED"]:
        init_kwargs["device_map"] = None  # distributed training requires device_map=None ("auto" fails)
    init_kwargs.update(
        num_labels=len(labels), id2label=dict(enumerate(labels)), label2id={name: i for i, name in enumerate(labels)}
    )
    init_kwargs.setdefault("trust_remote_code", args.trust_remote_code)
    config = AutoConfig.from_pretrained(
        path, revision=init_kwargs.get("revision"), trust_remote_code=init_kwargs["trust_remote_code"]
    )
    classifier = any(a.endswith("ForSequenceClassification") for a in getattr(config, "architectures", None) or [])
    new_head = config.num_labels if classifier and config.num_labels != len(labels) else None
    if new_head is not None:
        # transformers would refuse the other head size (`ignore_mismatched_sizes`) with a long report.
        init_kwargs["ignore_mismatched_sizes"] = True
        logger.warning("%s has a %d-output score head; building a new %d-output head %s (random, seeded).",
                       path, new_head, len(labels), what)  # fmt: skip
    with suppress_seqcls_warning(), _transformers_log_level(logging.ERROR if new_head is not None else None):
        model = create_model_from_path(path, AutoModelForSequenceClassification, **init_kwargs)
    args.model_init_kwargs = None  # used here; TRL would only warn that they are ignored for a loaded model
    return model


def ensemble_model(model: Any, args: Any, kwargs: dict) -> Any:
    """The model of `ensemble_heads=K` (`args.ensemble_heads`): a path loaded with K outputs (a one-label checkpoint
    keeps its body and gets K new heads; `kwargs`' `quantization_config` is taken), a model checked to have them;
    `config.ensemble_heads` set, so the checkpoint says so."""
    heads = args.ensemble_heads
    if isinstance(model, str):
        labels = [f"head_{k}" for k in range(heads)]
        model = load_classifier(model, args, kwargs.pop("quantization_config", None), labels,
                                f"for an ensemble of {heads}")  # fmt: skip
    elif getattr(model.config, "num_labels", None) != heads:
        raise ValueError(
            f"ensemble_heads={heads} needs a model with num_labels={heads} (one output per head), got "
            f"num_labels={model.config.num_labels}: build it with num_labels={heads}, or pass its path and it is "
            "loaded so."
        )
    model.config.ensemble_heads = heads
    return model
