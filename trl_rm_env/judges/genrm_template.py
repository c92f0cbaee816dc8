"""A chat template that reads the `genrm_compare` roles, for a model whose own template does not.

A GenRM is sent the prompt's messages, then `principle` (optional), `response_1` and `response_2`
(`genrm.genrm_messages`). A GenRM's own template renders those roles (Nemotron's GenRMs do); most base models' do not
(Qwen3's drops a message of an unknown role). `prepare_genrm_tokenizer` checks the model's template with the probe
the `genrm` judge runs (`GenRM.check_tokenizer`) and, where it fails, gives the tokenizer `genrm_chat_template(its
template)`: the model's own template, preceded by a Jinja prelude that turns the comparison into one user message,
our pairwise judge's text (the instruction, the request, the principle, the two responses, the verdict's JSON form),
and keeps every message after `response_2` (the assistant's verdict, in a warm start) as it was. The tokenizer saved
with the trained GenRM carries it, so `JudgeEnvironment(mode="genrm")` (transformers, vLLM, or a vLLM server) renders
the same text the GenRM was trained on.

The request is the prompt's single user message as it is, or its turns as `Role: content` blocks (tool calls are
not shown). The prelude rebinds `messages`, so the model's template must read `messages` (every Hugging Face
template does).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from .genrm import GenRM
from .templates import _GUIDE

GENRM_TEMPLATES = ("auto", "model", "builtin")
"""`auto`: the model's template where it renders the roles, else the built-in one; `model`: the model's, refused
where it cannot; `builtin`: always the built-in one."""

VERDICT_INSTRUCTION = (
    "Compare the two responses. Answer with one JSON object, "
    '{"score_1": <1-5>, "score_2": <1-5>, "ranking": <1-6>}: each response\'s score from 1 (poor) to 5 (excellent), '
    "and the ranking from 1 (response 1 is much better) through 3.5 (equal) to 6 (response 2 is much better)."
)


def _literal(text: str) -> str:
    """`text` as a Jinja string literal."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'").replace("\n", "\\n") + "'"


GENRM_PRELUDE = (
    "{%- set ns = namespace(request='', principle=none, r1='', r2='', seen=false, before=[], after=[]) -%}"
    "{%- for m in messages -%}"
    "{%- if m['role'] == 'principle' -%}{%- set ns.principle = m['content'] -%}{%- set ns.seen = true -%}"
    "{%- elif m['role'] == 'response_1' -%}{%- set ns.r1 = m['content'] -%}{%- set ns.seen = true -%}"
    "{%- elif m['role'] == 'response_2' -%}{%- set ns.r2 = m['content'] -%}{%- set ns.seen = true -%}"
    "{%- elif ns.seen -%}{%- set ns.after = ns.after + [m] -%}"
    "{%- else -%}{%- set ns.before = ns.before + [m] -%}{%- endif -%}"
    "{%- endfor -%}"
    "{%- if ns.seen -%}"
    "{%- if ns.before | length == 1 and ns.before[0]['role'] == 'user' -%}"
    "{%- set ns.request = ns.before[0]['content'] -%}"
    "{%- else -%}{%- for m in ns.before -%}"
    "{%- set ns.request = ns.request + ('' if loop.first else '\\n\\n') + (m['role'] | capitalize) + ': ' + "
    "(m['content'] or '') -%}"
    "{%- endfor -%}{%- endif -%}"
    "{%- set ns.text = " + _literal(_GUIDE + "\n\n[User request]\n") + " + ns.request -%}"
    "{%- if ns.principle is not none -%}{%- set ns.text = ns.text + '\\n\\n[Principle]\\n' + ns.principle -%}"
    "{%- endif -%}"
    "{%- set ns.text = ns.text + '\\n\\n[Response 1]\\n' + ns.r1 + '\\n\\n[Response 2]\\n' + ns.r2 + '\\n\\n' + "
    + _literal(VERDICT_INSTRUCTION) + " -%}"
    "{%- set messages = [{'role': 'user', 'content': ns.text}] + ns.after -%}"
    "{%- endif -%}"
)
"""The Jinja prelude of `genrm_chat_template` (see the module docstring)."""


def genrm_chat_template(model_template: str) -> str:
    """The model's chat template with the prelude that renders the `genrm_compare` roles as one user message."""
    return GENRM_PRELUDE + model_template


def renders_genrm_roles(tokenizer: Any, principle: bool = False) -> str | None:
    """None when `tokenizer`'s chat template renders the `genrm_compare` roles with their text (the `genrm` judge's
    probe), else why not."""
    if not getattr(tokenizer, "chat_template", None):
        return "the tokenizer has no chat template"
    options = SimpleNamespace(principle="PROBE-PRINCIPLE" if principle else None, principle_column=None)
    try:
        GenRM().check_tokenizer(tokenizer, options, {})
    except ValueError as err:
        return str(err)
    return None


def prepare_genrm_tokenizer(tokenizer: Any, template: str = "auto", principle: bool = False) -> str:
    """Make `tokenizer` render the `genrm_compare` roles (`template`: `GENRM_TEMPLATES`); return the template it
    uses, `"model"` or `"builtin"`.

    Raises:
        ValueError: an unknown `template`; `template="model"` with a template that cannot render the roles, naming
            them; a tokenizer without a chat template (nothing to build on).
    """
    if template not in GENRM_TEMPLATES:
        raise ValueError(f"genrm_template must be one of {', '.join(GENRM_TEMPLATES)}, got {template!r}")
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError(
            "the GenRM's base model has no chat template: a GenRM is sent chat messages (give a tokenizer with one, "
            "e.g. the instruct model's)"
        )
    why = renders_genrm_roles(tokenizer, principle) if template != "builtin" else "builtin asked"
    if why is None:
        return "model"
    if template == "model":
        raise ValueError(f"genrm_template='model': {why}. genrm_template='auto' or 'builtin' renders them")
    tokenizer.chat_template = genrm_chat_template(tokenizer.chat_template)
    problem = renders_genrm_roles(tokenizer, principle)
    if problem is not None:  # a template that does not read `messages`
        raise ValueError(f"the built-in GenRM template on this model's template still fails: {problem}")
    return "builtin"
