"""Scoring conversations with a reward model: templating, batching, prefix sharing."""

from .templating import encode_conversation, render_conversation

__all__ = ["encode_conversation", "render_conversation"]
