"""What differs between the transformers 5 releases we support, in one place.

vLLM's CPU build pins `transformers<5.20`, so an environment with in-process vLLM runs an older transformers than
a plain install. The one difference our code meets: transformers 5.20 renamed `TrainingArguments.gradient_checkpointing`
to `activation_checkpointing` (the old name stays as a deprecated alias). Our recipes and docs use the new name; on
older releases `accept_activation_checkpointing` (called by every recipe's `make_parser`) makes a recipe's parser
read it as the old one.
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

from transformers import TrainingArguments

HAS_ACTIVATION_CHECKPOINTING = any(f.name == "activation_checkpointing" for f in dataclasses.fields(TrainingArguments))
CHECKPOINTING_FIELD = "activation_checkpointing" if HAS_ACTIVATION_CHECKPOINTING else "gradient_checkpointing"
"""The `TrainingArguments` field that turns activation (gradient) checkpointing on, in this transformers."""


def checkpointing_enabled(args: Any) -> bool:
    """Whether training arguments turn activation checkpointing on, under either name."""
    return bool(getattr(args, "activation_checkpointing", False) or getattr(args, "gradient_checkpointing", False))


def accept_activation_checkpointing(parser: Any) -> Any:
    """On transformers before 5.20, let a `TrlParser` take `activation_checkpointing` (YAML key or flag) as
    `gradient_checkpointing`; on later releases return it unchanged."""
    if HAS_ACTIVATION_CHECKPOINTING or not hasattr(parser, "set_defaults_with_config"):
        return parser
    from transformers.hf_argparser import string_to_bool

    parser.add_argument(
        "--activation_checkpointing",
        dest="gradient_checkpointing",
        type=string_to_bool,
        nargs="?",
        const=True,
        default=argparse.SUPPRESS,
        help="Activation checkpointing (this transformers calls it gradient_checkpointing).",
    )
    set_defaults = parser.set_defaults_with_config

    def renamed(**values: Any) -> list[str]:
        if "activation_checkpointing" in values:
            values.setdefault("gradient_checkpointing", values.pop("activation_checkpointing"))
        return set_defaults(**values)

    parser.set_defaults_with_config = renamed
    return parser
