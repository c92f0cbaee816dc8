"""The judge's prompt: the built-in templates' text (each mode's, `builtin_modes.py`, says which it uses), a user's template with named fields, and how TRL's prompts
and completions become the text of those fields.

The judge reads exactly one user message, the filled template, rendered with the judge tokenizer's chat template and
its generation prompt (`judge_chat`). Fields:

- `{prompt}`: a text prompt as it is; a prompt that is one user message, its content; any other (a system message,
  several turns), its turns as role-labelled blocks (`User: ...`, `Assistant: ...`).
- `{completion}` (pointwise), `{completion_a}` and `{completion_b}` (pairwise), `{completions}` (listwise, numbered
  `[Response 1]` ... blocks): a text completion as it is; a message completion, its assistant content, tool calls
  written as JSON and tool results as `Tool: ...` blocks.
- `{max_score}` and `{answer_format}`: the rating scale, and how the judge must answer (one token for `logprobs`, a
  final verdict line for `generate`), so a user's template states the answer its scoring reads.
- any other name: a dataset column that TRL passes to reward functions (`{principle}`, `{reference}`), this sample's
  value, so a rubric per sample needs no code.

Content is inserted as text: the template is filled with `str.format` (a field's value is never parsed again) and the
message is encoded with special-token strings as text (`trl_rm_env.tokenization.encode_messages`), so a completion
that spells `<|im_end|>` cannot close the judge's turn.
"""

from __future__ import annotations

import json
import string
from collections.abc import Mapping, Sequence
from typing import Any

_GUIDE = (
    "You are an impartial judge of AI assistants' answers. Judge how well an answer fulfils the user's request: its "
    "helpfulness, correctness, relevance and clarity. Do not let the length of an answer or its position sway you."
)

POINTWISE = (
    _GUIDE + "\n\n[User request]\n{prompt}\n\n[Answer]\n{completion}\n\n"
    "Rate the answer on a scale of 1 to {max_score}, where 1 is useless or wrong and {max_score} is excellent. "
    "{answer_format}"
)
PAIRWISE = (
    _GUIDE + "\n\n[User request]\n{prompt}\n\n[Answer A]\n{completion_a}\n\n[Answer B]\n{completion_b}\n\n"
    "Which answer is better, A or B? {answer_format}"
)
LISTWISE = _GUIDE + "\n\n[User request]\n{prompt}\n\n{completions}\n\nCompare the {count} answers. {answer_format}"


def template_fields(template: str) -> set[str]:
    """The field names of a `str.format` template.

    Raises:
        ValueError: a template that `str.format` cannot read, or a positional field (`{}` or `{0}`).
    """
    try:
        fields = {name for _, name, _, _ in string.Formatter().parse(template) if name is not None}
    except ValueError as err:
        raise ValueError(
            f"the judge template cannot be read as a str.format template ({err}); write {{{{ }}}} for a brace"
        ) from err
    bad = sorted(f for f in fields if not f or f.isdigit() or not f.isidentifier())
    if bad:
        raise ValueError(
            f"the judge template has fields {bad}; give every field a name ({{prompt}}, {{completion}}, ...)"
        )
    return fields


def check_template(template: str, mode: Any) -> set[str]:
    """The dataset columns `template` reads (its fields that the mode, a `trl_rm_env.judges.mode_base.JudgeMode`, does
    not fill).

    Raises:
        ValueError: a template without the mode's completion fields, or one that cannot be read.
    """
    fields = template_fields(template)
    missing = sorted(mode.completion_fields - fields)
    if missing:
        raise ValueError(
            f"a {mode.name} judge template must contain {', '.join('{' + m + '}' for m in missing)}: the judge would "
            "not see what it judges"
        )
    return fields - mode.fields


def _tool_calls(message: Mapping[str, Any]) -> str:
    calls = message.get("tool_calls") or []
    return "\n".join(json.dumps(call, ensure_ascii=False, sort_keys=True) for call in calls)


def _message_text(message: Mapping[str, Any]) -> str:
    parts = [message.get("content") or "", _tool_calls(message)]
    return "\n".join(p for p in parts if p)


def prompt_text(prompt: str | Sequence[Mapping[str, Any]]) -> str:
    """`{prompt}`: text as it is; one user message, its content; else role-labelled turns."""
    if isinstance(prompt, str):
        return prompt
    if len(prompt) == 1 and prompt[0].get("role") == "user":
        return _message_text(prompt[0])
    return "\n\n".join(f"{str(m.get('role', '')).capitalize()}: {_message_text(m)}" for m in prompt)


def completion_text(completion: str | Sequence[Mapping[str, Any]]) -> str:
    """A completion's text: as it is, or its assistant turns' content and tool calls (JSON) and `Tool: ...` results."""
    if isinstance(completion, str):
        return completion
    parts = []
    for message in completion:
        text = _message_text(message)
        parts.append(
            text if message.get("role") == "assistant" else f"{str(message.get('role')).capitalize()}: {text}"
        )
    return "\n\n".join(parts)


def numbered(completions: Sequence[str]) -> str:
    """`{completions}`: `[Answer 1]\\n...` blocks."""
    return "\n\n".join(f"[Answer {i}]\n{text}" for i, text in enumerate(completions, 1))


def fill(template: str, values: Mapping[str, Any]) -> str:
    """The template with its fields replaced (values inserted as text, never parsed again)."""
    return template.format_map({k: "" if v is None else v for k, v in values.items()})


def judge_chat(text: str) -> list[dict[str, str]]:
    """The judge's conversation: one user message."""
    return [{"role": "user", "content": text}]
