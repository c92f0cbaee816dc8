"""The GenRM judge mode's own pieces that need no server (`judges/genrm.py`'s `GenRM`): the chat-template probe run at
construction (`check_tokenizer`: a template that raises on NeMo Gym's `genrm_compare` roles, or drops or rewrites
their text, is refused in one line naming the roles), a verdict read from text (one outside the protocol's ranges is
none, warned once), the `tiebreak_rate` metric, and its refusal of a log-probability verdict. The templates are Jinja chat templates written here and rendered by transformers'
`apply_chat_template` on the tiny tokenizer; every expected role list and rate is worked out by hand in a comment
(the roles are Gym's: the prompt's, then `principle` when one is sent, `response_1`, `response_2`)."""

from __future__ import annotations

import logging
import re

import pytest

from trl_rm_env.judges import genrm
from trl_rm_env.judges.genrm import Comparison, GenRM
from trl_rm_env.judges.judge_options import JudgeOptions

EVERY_ROLE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
CHAT_ROLES_ONLY = (  # a plain chat model's template: Jinja's raise_exception on any other role
    "{% for m in messages %}{% if m.role not in ['system', 'user', 'assistant'] %}"
    "{{ raise_exception('unexpected role ' + m.role) }}{% endif %}{{ m.content }}{% endfor %}"
)
NO_PRINCIPLE = (  # reads the responses but leaves a principle message out
    "{% for m in messages %}{% if m.role != 'principle' %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
USER_ONLY = "{% for m in messages %}{% if m.role == 'user' %}{{ m.content }}{% endif %}{% endfor %}"
LOWERED = "{% for m in messages %}{{ m.role }}: {{ m.content | lower }}\n{% endfor %}"  # rewrites every text
CANNOT = (
    "the GenRM's chat template cannot render the genrm_compare roles {roles}: unexpected role {first}. A GenRM's "
    "template reads `response_1` and `response_2` (and `principle` when one is sent)"
)
DROPS = (
    "the GenRM's chat template drops the text of the role(s) {roles}: it does not read the genrm_compare roles "
    "(`response_1`, `response_2`, `principle`); use the GenRM's own tokenizer"
)


class Templated:
    """The tiny tokenizer rendering `template`, recording the keyword arguments of each `apply_chat_template` call."""

    def __init__(self, tokenizer, template: str):
        self.tokenizer, self.template, self.calls = tokenizer, template, []

    def apply_chat_template(self, messages, **kwargs):
        self.calls.append((messages, kwargs))
        return self.tokenizer.apply_chat_template(messages, chat_template=self.template, **kwargs)


def probe(tokenizer, template: str, template_kwargs=None, **options) -> Templated:
    templated = Templated(tokenizer, template)
    GenRM().check_tokenizer(templated, JudgeOptions(mode="genrm", **options), template_kwargs or {})
    return templated


def test_a_template_that_renders_every_role_with_its_text_passes_rendered_as_the_judge_renders(tiny_tokenizer):
    asked = probe(tiny_tokenizer, EVERY_ROLE, {"enable_thinking": False}, principle_column="rule")
    ((messages, kwargs),) = asked.calls
    # one probe comparison: the prompt as a user message, the column's principle, the two responses; rendered to
    # text with the generation prompt and the judge's template_kwargs, as a judgement is
    assert [m["role"] for m in messages] == ["user", "principle", "response_1", "response_2"]
    assert len({m["content"] for m in messages}) == 4  # four distinct texts, each looked for in the rendering
    assert kwargs == {"tokenize": False, "add_generation_prompt": True, "enable_thinking": False}
    assert [m["role"] for m in probe(tiny_tokenizer, EVERY_ROLE).calls[0][0]] == ["user", "response_1", "response_2"]


def test_a_template_that_reads_the_roles_only_with_the_judges_template_kwargs_passes_only_with_them(tiny_tokenizer):
    gated = "{% if genrm %}" + EVERY_ROLE + "{% else %}" + USER_ONLY + "{% endif %}"
    probe(tiny_tokenizer, gated, {"genrm": True})
    with pytest.raises(ValueError, match="^" + re.escape(DROPS.format(roles=["response_1", "response_2"])) + "$"):
        probe(tiny_tokenizer, gated, {"genrm": False})


def test_a_template_that_raises_on_the_roles_is_refused_naming_them(tiny_tokenizer):
    # no principle: the probe's roles are the prompt's user message and the two responses; the first the template
    # refuses is response_1
    want = CANNOT.format(roles=["user", "response_1", "response_2"], first="response_1")
    with pytest.raises(ValueError, match="^" + re.escape(want) + "$"):
        probe(tiny_tokenizer, CHAT_ROLES_ONLY)
    # a principle column: a principle message before the responses, the first refused
    want = CANNOT.format(roles=["user", "principle", "response_1", "response_2"], first="principle")
    with pytest.raises(ValueError, match="^" + re.escape(want) + "$"):
        probe(tiny_tokenizer, CHAT_ROLES_ONLY, principle_column="rule")
    with pytest.raises(ValueError, match="^" + re.escape(want) + "$"):
        probe(tiny_tokenizer, CHAT_ROLES_ONLY, principle="Be kind.")


def test_a_template_that_drops_a_roles_text_is_refused_naming_the_roles(tiny_tokenizer):
    # the user's turn only: both responses dropped, and no principle to leave out (no ", or no principle")
    with pytest.raises(ValueError, match="^" + re.escape(DROPS.format(roles=["response_1", "response_2"])) + "$"):
        probe(tiny_tokenizer, USER_ONLY)
    # the principle left out: named, and "or no principle" offered. The principle "user" is a word every rendering
    # holds (the user role's label), so only a probe text of the probe's own finds it missing.
    principle_dropped = "^" + re.escape(DROPS.format(roles=["principle"]) + ", or no principle") + "$"
    with pytest.raises(ValueError, match=principle_dropped):
        probe(tiny_tokenizer, NO_PRINCIPLE, principle="user")
    with pytest.raises(ValueError, match=principle_dropped):
        probe(tiny_tokenizer, NO_PRINCIPLE, principle_column="rule")
    probe(tiny_tokenizer, NO_PRINCIPLE)  # no principle sent: nothing dropped


def test_a_template_that_rewrites_the_texts_drops_them(tiny_tokenizer):
    # every text lowercased: none of the probe's upper-case texts is found, whatever the role
    want = DROPS.format(roles=["user", "response_1", "response_2"])
    with pytest.raises(ValueError, match="^" + re.escape(want) + "$"):
        probe(tiny_tokenizer, LOWERED)
    want = DROPS.format(roles=["user", "principle", "response_1", "response_2"]) + ", or no principle"
    with pytest.raises(ValueError, match="^" + re.escape(want) + "$"):
        probe(tiny_tokenizer, LOWERED, principle="Be kind.")


def test_tiebreak_rate_is_the_share_of_verdicts_with_equal_scores():
    verdicts = [Comparison(4.0, 4.0, 1.0, 6.5, 1.5), None, Comparison(5.0, 1.0, 1.0, 5.0, 1.0),
                Comparison(3.0, 3.0, 3.5, 3.0, 3.0)]  # fmt: skip
    # three verdicts (the None is a failed judgement, not counted), two with equal scores: 2 / 3
    assert GenRM().metrics(verdicts) == {"tiebreak_rate": pytest.approx(2 / 3)}
    assert GenRM().metrics([Comparison(2.0, 2.0, 3.5, 2.0, 2.0)]) == {"tiebreak_rate": 1.0}
    assert GenRM().metrics([None]) == {} and GenRM().metrics([]) == {}  # nothing judged: no rate


def test_a_genrm_verdict_is_never_read_from_probabilities():
    with pytest.raises(NotImplementedError, match=r"^a GenRM's verdict is read from its text$"):
        GenRM().from_probabilities((0, 1), [0.5, 0.5])


def test_a_verdict_outside_the_protocols_ranges_is_none_and_warned_once(monkeypatch, caplog):
    monkeypatch.setattr(genrm, "_warned_ranges", [])  # the warning is once per process: this test's process
    options = JudgeOptions(mode="genrm")
    # in range, equal scores: simple_tiebreaker's d = 3.5 - 2 = 1.5 -> 4 + 1.5, 4 - 1.5
    assert GenRM().from_text((0, 1), '<think>{"score_1": 1}</think>{"score_1": 4, "score_2": 4, "ranking": 2}',
                             options) == Comparison(4.0, 4.0, 2.0, 5.5, 2.5)  # fmt: skip
    with caplog.at_level(logging.WARNING, logger="trl_rm_env.judges.genrm"):
        assert GenRM().from_text((0, 1), '{"score_1": 100, "score_2": 4, "ranking": 42}', options) is None
        assert GenRM().from_text((0, 1), '{"score_2": 0}', options) is None
    assert [r.getMessage() for r in caplog.records] == [
        "a GenRM verdict wrote score_1=100, ranking=42, outside the genrm_compare ranges (scores 1-5, ranking 1-6): "
        "it is no verdict (asked again, then a failed judgement, counted in judge_env/num_failed). A GenRM with other "
        "ranges: verdict_ranges='any'. Warned once."
    ]
    # verdict_ranges='any' (NeMo Gym's parser): taken as written, unequal scores as given
    anything = JudgeOptions(mode="genrm", verdict_ranges="any")
    assert GenRM().from_text((0, 1), '{"score_1": 100, "ranking": 42}', anything) == Comparison(100.0, 3.0, 42.0,
                                                                                                100.0, 3.0)  # fmt: skip
