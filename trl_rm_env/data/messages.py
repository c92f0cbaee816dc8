"""Chat messages: the one set of rules every entry point applies, and how each one reports a break.

The rules (`message_problem`, `messages_problem`):

- a message is an object with a string `role` and a string `content`;
- an assistant message may carry `tool_calls` (a list of objects, as in TRL's tool-calling rollouts); its `content`
  may then be `None` or absent; `tool_call_id` and `name`, when present, are strings;
- a role is one of `KNOWN_ROLES` where the caller checks roles (data files, the server; the environment leaves the
  prompt's roles to the chat template), and with a context a completion holds `COMPLETION_ROLES` only (a `user` or
  `system` turn in a completion would let a policy write the other side of the conversation);
- no string holds a lone surrogate (`"\\ud800"`): valid JSON, not valid Unicode, and no tokenizer can encode it.

Each entry point reports the first break in its own terms: the data loaders as a `DataValidationError` naming file,
line and field (`validate_messages`), the GRPO environment as a `TypeError`/`ValueError` naming `prompts[i][j]`
(`check_sample`), the server as a 400 naming `messages[j]` (`trl_rm_env.serving.server.requests`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

KNOWN_ROLES = ("system", "developer", "user", "assistant", "tool")
"""The message roles accepted (OpenAI's and the chat templates' roles)."""
COMPLETION_ROLES = ("assistant", "tool")
"""The roles a completion may hold when the record has a context (a tool call and its result are part of an answer)."""
KEPT_MESSAGE_KEYS = ("tool_calls", "tool_call_id", "name")
"""Message keys kept besides `role` and `content` (when not None): what chat templates render for tool calling."""
MAX_NESTING = 100
"""Deepest nesting of lists and objects in an in-memory record (files are limited by the JSON parser)."""


def type_name(value: Any) -> str:
    return type(value).__name__


# ---------------------------------------------------------------------------------------------------- text
def lone_surrogate(text: str) -> tuple[str, int] | None:
    """`(character, position)` of the first lone surrogate in `text`, or None when it is valid Unicode."""
    if text.isascii():
        return None
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        return text[err.start], err.start
    return None


def bad_text(value: Any, where: str = "", depth: int = 0) -> tuple[str, str] | None:
    """The first string in `value` (walking objects, their keys and lists) that is not valid Unicode, or a nesting
    deeper than `MAX_NESTING`, as `(field, reason)`; None when there is none."""
    if isinstance(value, str):
        found = lone_surrogate(value)
        if found is None:
            return None
        return where or "<record>", (
            f"text holds a lone surrogate {found[0]!r} at character {found[1]} (not valid Unicode, so it cannot be "
            "tokenized); fix the text or the program that wrote it"
        )
    if depth > MAX_NESTING and isinstance(value, Mapping | list | tuple):
        return where or "<record>", f"nested more than {MAX_NESTING} levels deep"
    if isinstance(value, Mapping):
        for key, item in value.items():
            path = f"{where}.{key}" if where else str(key)
            found = bad_text(key, path, depth + 1) or bad_text(item, path, depth + 1)
            if found:
                return found
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            found = bad_text(item, f"{where}[{i}]", depth + 1)
            if found:
                return found
    return None


def finite_number(value: Any) -> float | None:
    """`value` as a float when it is a finite int or float (not a bool, NaN, infinity, or an int too large for a
    float); else None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


# ---------------------------------------------------------------------------------------------------- the rules
@dataclass(frozen=True)
class MessageProblem:
    """The first rule a message list breaks: `index` of the message (None: the list itself), `field` (`role`,
    `content`, `tool_calls`, a kept key, or None for the whole message), `code` and the offending `value`."""

    index: int | None
    field: str | None
    code: str  # not_list, not_object, no_role, role_type, unknown_role, completion_role, tool_calls_role,
    #            tool_calls_type, no_content, content_type, key_type
    value: Any = None

    def at(self, where: str) -> str:
        """`where[index].field`, e.g. `completions[2][0].role`."""
        path = where if self.index is None else f"{where}[{self.index}]"
        return f"{path}.{self.field}" if self.field else path


def message_problem(message: Any, roles: Sequence[str] | None = KNOWN_ROLES) -> MessageProblem | None:
    """The first rule `message` breaks (with `index` None), or None. `roles`: the accepted roles (None: any string)."""
    if not isinstance(message, Mapping):
        return MessageProblem(None, None, "not_object", message)
    if "role" not in message:
        return MessageProblem(None, "role", "no_role")
    role = message["role"]
    if not isinstance(role, str):
        return MessageProblem(None, "role", "role_type", role)
    if roles is not None and role not in roles:
        return MessageProblem(None, "role", "unknown_role", role)
    tool_calls = message.get("tool_calls")
    if tool_calls is not None:
        if role != "assistant":
            return MessageProblem(None, "tool_calls", "tool_calls_role", role)
        if not isinstance(tool_calls, list) or not all(isinstance(call, Mapping) for call in tool_calls):
            return MessageProblem(None, "tool_calls", "tool_calls_type", tool_calls)
    content = message.get("content")
    if not (tool_calls and content is None):  # a tool call needs no text
        if "content" not in message:
            return MessageProblem(None, "content", "no_content")
        if not isinstance(content, str):
            return MessageProblem(None, "content", "content_type", content)
    for key in KEPT_MESSAGE_KEYS[1:]:
        value = message.get(key)
        if value is not None and not isinstance(value, str):
            return MessageProblem(None, key, "key_type", value)
    return None


def messages_problem(
    messages: Any, roles: Sequence[str] | None = KNOWN_ROLES, completion_roles: Sequence[str] | None = None
) -> MessageProblem | None:
    """The first rule a list of messages breaks, or None. `completion_roles`: the roles allowed once the roles pass
    `roles` (a completion of a record with a context: `COMPLETION_ROLES`)."""
    if not isinstance(messages, list | tuple):
        return MessageProblem(None, None, "not_list", messages)
    for j, message in enumerate(messages):
        problem = message_problem(message, roles)
        if problem is None and completion_roles is not None and message["role"] not in completion_roles:
            problem = MessageProblem(None, "role", "completion_role", message["role"])
        if problem is not None:
            return MessageProblem(j, problem.field, problem.code, problem.value)
    return None


def message_is_blank(message: Mapping[str, Any]) -> bool:
    """True when a valid message has neither non-blank text nor a tool call."""
    content = message.get("content")
    return not message.get("tool_calls") and not (isinstance(content, str) and content.strip())


def normalize_message(message: Mapping[str, Any]) -> dict[str, Any]:
    """A valid message reduced to `role`, `content` (None for a tool call without text) and the `KEPT_MESSAGE_KEYS`
    that are not None; other keys are dropped."""
    out = {"role": message["role"], "content": message.get("content")}
    out.update({key: message[key] for key in KEPT_MESSAGE_KEYS if message.get(key) is not None})
    return out


# ---------------------------------------------------------------------------------------------------- the environment
def check_sample(value: Any, where: str, completion: bool = False) -> None:
    """Check one prompt or completion handed to a GRPO reward function: text, or a list of messages under the rules
    above (prompt roles are the chat template's business; a completion holds `COMPLETION_ROLES`), and no lone
    surrogate anywhere.

    Raises:
        TypeError: a sample or message of the wrong shape, naming `where[j].field`.
        ValueError: a completion role outside `COMPLETION_ROLES`, or a lone surrogate, naming the field.
    """
    if not isinstance(value, str):
        problem = messages_problem(value, roles=None, completion_roles=COMPLETION_ROLES if completion else None)
        if problem is not None:
            _raise_sample_problem(problem, value, where)
    found = bad_text(value, where)
    if found:
        raise ValueError(f"{found[0]}: {found[1]}")


def _raise_sample_problem(problem: MessageProblem, messages: Any, where: str) -> None:
    at, value, code = problem.at(where), problem.value, problem.code
    if code == "not_list":
        raise TypeError(f"{where} must be a string or a list of messages, got {type_name(value)}")
    if code == "not_object":
        raise TypeError(f"{at} must be a message with 'role' and 'content', got {value!r:.80}")
    if code in ("no_role", "no_content"):
        keys = sorted(map(str, messages[problem.index]))
        raise TypeError(
            f"{where}[{problem.index}] must be a message with 'role' and 'content'; it has no {problem.field!r} "
            f"(keys: {keys})"
        )
    if code in ("tool_calls_role", "tool_calls_type"):
        message = messages[problem.index]
        raise TypeError(
            f"{at} must be a list of objects on an assistant message, got {type_name(message.get('tool_calls'))} "
            f"on role {message.get('role')!r}"
        )
    if code == "content_type":
        raise TypeError(
            f"{at} must be a string, got {type_name(value)}. Multimodal content is not supported by text reward models."
        )
    if code == "completion_role":
        what = "a role a completion cannot hold" if value in KNOWN_ROLES else f"not a known role {KNOWN_ROLES}"
        raise ValueError(
            f"{at} is {value!r}, {what}: a completion holds the policy's turns only (roles {list(COMPLETION_ROLES)}); "
            "put other turns in the prompt."
        )
    raise TypeError(f"{at} must be a string, got {type_name(value)}")  # role_type, key_type


_THINK_BLOCK = re.compile(r"<think>.*?</think>\s*", re.DOTALL)
_OPEN_THINK = re.compile(r"<think>.*\Z", re.DOTALL)


def strip_reasoning_text(text: str) -> str:
    """Drop `<think>...</think>` blocks; an unclosed `<think>` drops the rest of the text (no answer came)."""
    return _OPEN_THINK.sub("", _THINK_BLOCK.sub("", text))


def strip_completion_reasoning(completion: str | Sequence[Mapping[str, Any]]) -> str | list[dict[str, Any]]:
    """`completion` with `strip_reasoning_text` applied to its text, or to every assistant message's content."""
    if isinstance(completion, str):
        return strip_reasoning_text(completion)
    return [
        {**m, "content": strip_reasoning_text(m["content"])} if m.get("role") == "assistant" else dict(m)
        for m in completion
    ]


END_OF_REASONING = "</think>"


def split_reasoning(text: str, end_of_reasoning: str = END_OF_REASONING) -> tuple[str, str]:
    """`(reasoning, answer)` of a text: what precedes the last `end_of_reasoning` (an opening `<think>` dropped) and
    what follows it; no marker: no reasoning."""
    if end_of_reasoning not in text:
        return "", text
    reasoning, _, answer = text.rpartition(end_of_reasoning)
    return reasoning.replace("<think>", "", 1).strip(), answer.lstrip()


def reasoning_and_answer(completion: str | Sequence[Mapping[str, Any]]) -> tuple[str, str]:
    """`(reasoning, answer)` of a policy completion (a GenRM's and the group shaping's reading): its text, or its last
    assistant message's content (tool calls left out), split at the last `</think>`; a `<think>` never closed is all
    reasoning (the answer never came)."""
    if isinstance(completion, str):
        text = completion
    else:
        contents = [m.get("content") or "" for m in completion if m.get("role") == "assistant"]
        text = contents[-1] if contents else ""
    if END_OF_REASONING not in text and text.lstrip().startswith("<think>"):
        return text.lstrip()[len("<think>") :].strip(), ""
    return split_reasoning(text)
