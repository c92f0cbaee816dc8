"""The judge modes' logic without a model (`judges/builtin_modes.py`, `judges/mode_base.py`, `judges/judgements.py`,
`judges/templates.py`, `judges/verdicts.py`): which positions of a group are compared, the mode registry and its
template view, the judgements each mode asks for, how preference pairs are judged for `trl-rm-env eval --judge`
(driven by a scripted `ask` that returns chosen verdicts), the one-line error of samples left without a verdict, a
template's fields, the dataset columns it reads and the texts it is filled with, and the verdict labels' token ids
(on a SentencePiece-like tokenizer written here) and probabilities. Every expected value is a literal worked out by
hand from the documented rule (the derivation in a comment): `all` pairs are i < j, `circular` i against i+1 and the
last against the first (NeMo Gym's circular strategy); a pairwise preference is `(p_ij + 1 - p_ji) / 2`; a
default-mode pair's preference is the better one's mean share minus the worse one's; error texts are the full line."""

from __future__ import annotations

import datetime
import math
import re
from types import SimpleNamespace

import pytest

from trl_rm_env.judges import templates as T
from trl_rm_env.judges.builtin_modes import (
    MODES,
    TEMPLATES,
    Listwise,
    Pairwise,
    Pointwise,
    mode_of,
    pairs_of,
    register_mode,
)
from trl_rm_env.judges.genrm import Comparison, GenRM
from trl_rm_env.judges.judge_options import JudgeOptions
from trl_rm_env.judges.judgements import (
    Judgement,
    aggregate,
    ask_verdicts,
    build_judgements,
    failure_message,
    group_samples,
    template_columns,
)
from trl_rm_env.judges.mode_base import EvalPair, JudgeMode, PairVerdicts
from trl_rm_env.judges.templates import (
    check_template,
    completion_text,
    fill,
    judge_chat,
    numbered,
    prompt_text,
    template_fields,
)
from trl_rm_env.judges.verdicts import distribution, label_token_ids
from trl_rm_env.runtime.engines.contract import Generate, LabelLogprobs


class Scripted:
    """An `ask` answering the given verdicts in order, recording what it was asked."""

    def __init__(self, values):
        self.values, self.asked = list(values), []

    def __call__(self, contexts, shown):
        self.asked.append((list(contexts), [tuple(s) for s in shown]))
        found = SimpleNamespace(values=self.values[: len(shown)])
        self.values = self.values[len(shown) :]
        return found


def pair(index: int, better="good", worse="bad", better_key=None, worse_key=None) -> EvalPair:
    return EvalPair(f"q{index}", f"{better} {index}", f"{worse} {index}", better_key if better_key is not None
                    else ("b", index), worse_key if worse_key is not None else ("w", index), index)  # fmt: skip


def test_positions_compared_all_and_circular():
    assert pairs_of(3, "all") == [(0, 1), (0, 2), (1, 2)]  # i < j
    assert pairs_of(4, "all") == [(0, 1), (0, 2), (0, 3), (1, 2), (1, 3), (2, 3)]
    assert pairs_of(3, "circular") == [(0, 1), (1, 2), (2, 0)]  # i against i+1, the last against the first
    assert pairs_of(4, "circular") == [(0, 1), (1, 2), (2, 3), (3, 0)]
    assert pairs_of(2, "circular") == [(0, 1)]  # two: the one pair (circular would compare it twice)
    assert pairs_of(2, "all") == [(0, 1)]
    options = JudgeOptions(mode="pairwise", pairs="all", swap=False)
    assert list(Pairwise().judgements([5, 6, 7], options, "judge")) == [(5, 6), (5, 7), (6, 7)]
    swapped = JudgeOptions(mode="pairwise", pairs="circular", swap=True)
    assert list(Pairwise().judgements([5, 6, 7], swapped, "judge")) == [(5, 6), (6, 5), (6, 7), (7, 6), (7, 5),
                                                                         (5, 7)]  # fmt: skip


def test_a_name_registered_by_another_class_is_refused_and_the_same_class_may_register_again():
    class Impostor(Pairwise):
        name = "pairwise"

    original = MODES["pairwise"]
    try:
        with pytest.raises(ValueError, match=r"^judge mode 'pairwise' is already registered \(Pairwise\)$"):
            register_mode(Impostor)
        assert MODES["pairwise"] is original
        assert register_mode(Pairwise) is Pairwise  # a module imported twice registers its class again
        assert type(MODES["pairwise"]) is Pairwise
    finally:
        MODES["pairwise"] = original
    assert mode_of("pairwise") is original


def test_the_templates_view_maps_each_registered_mode_to_its_template():
    assert TEMPLATES["pointwise"] is T.POINTWISE and TEMPLATES["pairwise"] is T.PAIRWISE
    assert TEMPLATES["listwise"] is T.LISTWISE and TEMPLATES["genrm"] == ""  # a GenRM's chat template writes it
    assert list(TEMPLATES)[:4] == ["pointwise", "pairwise", "listwise", "genrm"]  # in order of registration
    assert dict(TEMPLATES)["listwise"] is T.LISTWISE and len(TEMPLATES) == len(MODES)


def test_pointwise_reads_a_score_within_its_scale():
    options = JudgeOptions(mode="pointwise", scoring="generate", max_score=5)
    assert Pointwise().from_text((0,), "Fine. Score: 5", options) == 5.0
    assert Pointwise().from_text((0,), "Score: 6", options) is None  # above max_score 5


def test_pointwise_pairs_rate_each_completion_once_sorted_by_key_when_keys_sort():
    # two pairs sharing a completion (key 2): three ratings, asked in key order 1, 2, 3
    pairs = [pair(0, better_key=3, worse_key=2), pair(1, better_key=2, worse_key=1)]
    ask = Scripted([1.0, 4.0, 2.0])  # key 1: 1, key 2: 4, key 3: 2
    got = Pointwise().judge_pairs(ask, pairs, JudgeOptions(mode="pointwise"))
    assert ask.asked == [(["q1", "q0", "q0"], [("bad 1",), ("bad 0",), ("good 0",)])]
    # pair 0: key 3 (2) - key 2 (4) = -2; pair 1: key 2 (4) - key 1 (1) = 3
    assert got == PairVerdicts([-2.0, 3.0], None, {1: 1.0, 2: 4.0, 3: 2.0}, got.found)
    # keys that do not sort (an int and a str): asked in order of first appearance, better then worse
    mixed = [pair(0, better_key="x", worse_key=1), pair(1, better_key=1, worse_key="y")]
    ask = Scripted([3.0, 2.0, None])
    got = Pointwise().judge_pairs(ask, mixed, JudgeOptions(mode="pointwise"))
    assert ask.asked == [(["q0", "q0", "q1"], [("good 0",), ("bad 0",), ("bad 1",)])]
    assert got.preferences == [1.0, None]  # 3 - 2; key "y" has no rating


def test_pairwise_pairs_average_both_orders_and_keep_what_each_order_said():
    ask = Scripted([0.75, 0.5, 0.625, None, None, None])
    got = Pairwise().judge_pairs(ask, [pair(0), pair(1), pair(2)], JudgeOptions(mode="pairwise", swap=True))
    assert ask.asked[0][1] == [("good 0", "bad 0"), ("bad 0", "good 0"), ("good 1", "bad 1"), ("bad 1", "good 1"),
                               ("good 2", "bad 2"), ("bad 2", "good 2")]  # fmt: skip
    # pair 0: .75 shown first, 1 - .5 second: (.75 + .5) / 2; pair 1: .625 and no verdict; pair 2: none at all
    assert got == PairVerdicts([0.625, 0.625, None], [[0.75, 0.5], [0.625, None], [None, None]], {}, got.found)
    ask = Scripted([0.75, None])  # one order: the better first at even positions only
    got = Pairwise().judge_pairs(ask, [pair(0), pair(1)], JudgeOptions(mode="pairwise", swap=False))
    assert ask.asked[0][1] == [("good 0", "bad 0"), ("bad 1", "good 1")]
    assert got == PairVerdicts([0.75, None], [[0.75], [None]], {}, got.found)


def test_listwise_labels_and_the_largest_group_it_ranks_by_logprobs():
    assert Listwise().labels(None) == ["1", "2", "3", "4", "5", "6", "7", "8", "9"]
    logprobs = JudgeOptions(mode="listwise", scoring="logprobs", swap=False)
    assert list(Listwise().judgements(range(9), logprobs, "judge")) == [tuple(range(9))]  # nine: one token each
    want = ("judge: a listwise judgement by logprobs ranks at most 9 answers (one verdict token each); this group has "
            "10. Use mode='pairwise' or scoring='generate'.")  # fmt: skip
    with pytest.raises(ValueError, match="^" + re.escape(want) + "$"):
        list(Listwise().judgements(range(10), logprobs, "judge"))
    generate = JudgeOptions(mode="listwise", scoring="generate", swap=False)
    assert list(Listwise().judgements(range(10), generate, "judge")) == [tuple(range(10))]  # a written ranking


def test_default_pairs_are_groups_of_two_and_the_preference_is_the_difference_of_shares():
    ask = Scripted([[1.0, 0.0], [1.0, 0.0], None])
    options = JudgeOptions(mode="listwise", scoring="generate", swap=False)
    got = Listwise().judge_pairs(ask, [pair(0), pair(1), pair(2)], options)
    # even positions show the better first: pair 0 ranks it first (1 - 0); pair 1 shows the worse first and ranks it
    # first (0 - 1); pair 2 has no verdict
    assert ask.asked[0][1] == [("good 0", "bad 0"), ("bad 1", "good 1"), ("good 2", "bad 2")]
    assert got == PairVerdicts([1.0, -1.0, None], None, {}, got.found)


class FirstOnly(JudgeMode):
    """A custom mode (not registered) judging only the first sample of a group shown to it, or none (`skip`), and
    recording the `what` its judgements are asked under."""

    name = "first_only"
    compares = False

    def __init__(self, skip: bool = False):
        self.skip, self.whats = skip, []

    def judgements(self, members, options, what):
        self.whats.append(what)
        if not self.skip:
            yield (members[0],)

    def shares(self, shown, verdict):
        return [(shown[0], verdict)]


def test_default_pairs_without_a_verdict_for_both_sides_have_no_preference():
    mode = FirstOnly()
    ask = Scripted([1.0, 1.0])
    got = mode.judge_pairs(ask, [pair(0), pair(1)], None)
    # the better (pair 0) or the worse (pair 1) alone got a share: no difference to take
    assert ask.asked[0][1] == [("good 0",), ("bad 1",)] and got.preferences == [None, None]
    assert mode.whats == ["eval", "eval"]  # what a mode's own errors name in evaluation
    skipping = FirstOnly(skip=True)
    assert skipping.judge_pairs(Scripted([]), [pair(0)], None).preferences == [None]  # no judgement at all


@pytest.fixture
def failing_judge():
    return SimpleNamespace(name="judge", engine=SimpleNamespace(max_length=64),
                           options=SimpleNamespace(scoring="logprobs", parse_retries=2))  # fmt: skip


def test_the_error_of_samples_without_a_verdict_names_at_most_ten_and_the_fix(failing_judge):
    ten, eleven = list(range(10)), list(range(11))
    assert failure_message(failing_judge, "overlength", ten) == (
        "judge: the judge's prompt for completions [0, 1, 2, 3, 4, 5, 6, 7, 8, 9] is longer than its max length 64 "
        "(with room for its answer); set overlength_reward, or raise max_length"
    )
    assert failure_message(failing_judge, "overlength", eleven).startswith(
        "judge: the judge's prompt for completions [0, 1, 2, 3, 4, 5, 6, 7, 8, 9] ... is longer"
    )  # eleven: the first ten, then "..."
    assert failure_message(failing_judge, "unparsed", [3]) == (
        "judge: the verdict tokens held no probability for completions [3] (the judge's logits are NaN/inf, or with "
        "remote_input='messages' no verdict token was among the server's top_logprobs); set unparsed_reward, or send "
        "token ids"
    )
    failing_judge.options.scoring = "generate"
    assert failure_message(failing_judge, "unparsed", [3, 4], "z" * 250) == (
        "judge: no verdict could be read for completions [3, 4] after 2 retries (one of the judge's last answers "
        f"began '{'z' * 200}'); set unparsed_reward, or fix the template's answer format"
    )  # the answer's first 200 characters


def test_a_template_field_without_a_name_or_a_lone_brace_is_refused():
    assert template_fields("{prompt} {{literal}} {completion} {reference}") == {"prompt", "completion", "reference"}
    with pytest.raises(ValueError, match=r"^the judge template cannot be read as a str\.format template \(Single '\{' "
                                         r"encountered in format string\); write \{\{ \}\} for a brace$"):  # fmt: skip
        template_fields("{prompt} {")
    # str.format's positional fields ('' and '0'), an attribute and an index: none is a dataset column's name
    with pytest.raises(ValueError, match=r"^the judge template has fields \['', '0', 'a\.b', 'x\[0\]'\]; give every "
                                         r"field a name \(\{prompt\}, \{completion\}, \.\.\.\)$"):  # fmt: skip
        template_fields("{prompt} {} {0} {a.b} {x[0]} {completion}")


def test_a_template_must_show_the_judge_what_it_judges_and_its_other_fields_are_columns():
    pointwise = "{prompt} {completion} {max_score} {answer_format} {reference} {rubric}"
    assert check_template(pointwise, mode_of("pointwise")) == {"reference", "rubric"}
    with pytest.raises(ValueError, match=r"^a pairwise judge template must contain \{completion_a\}, \{completion_b\}: "
                                         r"the judge would not see what it judges$"):  # fmt: skip
        check_template("{prompt} {answer_format}", mode_of("pairwise"))


def test_the_columns_a_template_reads_are_one_value_per_sample_each_named_when_wrong():
    kwargs = {"gold": ["a", "b"], "tup": ("x", "y"), "text": "ab", "short": ["a"], "rubric": ["r", None]}
    assert template_columns(["gold", "tup"], kwargs, 2, "judge") == {"gold": ["a", "b"], "tup": ("x", "y")}
    # the columns TRL passed: lists and tuples of one value per sample ("text" is a string, "short" one value)
    want = ("judge: the judge template reads {reference}, but the reward function got no column 'reference'; the "
            "dataset columns TRL passed: ['gold', 'rubric', 'tup']")  # fmt: skip
    with pytest.raises(ValueError, match="^" + re.escape(want) + "$"):
        template_columns(["gold", "reference"], kwargs, 2, "judge")
    for bad in ("text", "short"):
        with pytest.raises(ValueError, match=rf"^judge: column '{bad}' must hold one value per sample \(2\), as TRL "
                                             r"passes it$"):  # fmt: skip
            template_columns([bad], kwargs, 2, "judge")
    with pytest.raises(ValueError, match=r"^judge: column 'n' must hold one value per sample \(2\), as TRL passes it$"):
        template_columns(["n"], {"n": 5}, 2, "judge")
    with pytest.raises(ValueError, match=r"^judge: column 'rubric', which the judge template reads, is None for "
                                         r"samples \[1\]$"):  # fmt: skip
        template_columns(["rubric"], kwargs, 2, "judge")
    assert template_columns(["rubric"], kwargs, 2, "judge", optional=["rubric"]) == {"rubric": ["r", None]}
    # eleven None values: the first ten named
    with pytest.raises(ValueError, match=r"^judge: column 'p', which the judge template reads, is None for samples "
                                         r"\[0, 1, 2, 3, 4, 5, 6, 7, 8, 9\]$"):  # fmt: skip
        template_columns(["p"], {"p": [None] * 11}, 11, "judge")


class SentencePieceLike:
    """A tokenizer that, like SentencePiece, encodes a lone digit as a word boundary and the digit (two tokens) while
    the bare digit is a token of its own; "A" and "B" are one token each; a BOS is added unless told not to."""

    vocab = {"<unk>": 0, "<s>": 1, "\u2581": 4, "1": 6, "2": 7, "A": 8, "B": 9}
    unk_token_id = 0

    def encode(self, text, add_special_tokens=True):
        ids = [self.vocab[text]] if text in ("A", "B") else [4, self.vocab.get(text, 0)]
        return [1, *ids] if add_special_tokens else ids

    def convert_tokens_to_ids(self, token):
        return self.vocab.get(token, self.unk_token_id)


def test_verdict_labels_are_one_token_each_the_bare_token_when_encoding_splits_it():
    tokenizer = SentencePieceLike()
    assert label_token_ids(tokenizer, ["A", "B"], "judge") == [8, 9]
    assert label_token_ids(tokenizer, ["1", "2"], "judge") == [6, 7]  # "\u25811" is two tokens: the bare "1", 6
    # "3" has no bare token (the unknown id): two tokens, [4, 0], refused
    want = ("judge: the verdict '3' is 2 tokens in the judge's tokenizer [4, 0]; scoring='logprobs' reads each verdict "
            "as one token (lower max_score, or use scoring='generate')")  # fmt: skip
    with pytest.raises(ValueError, match="^" + re.escape(want) + "$"):
        label_token_ids(tokenizer, ["1", "3"], "judge")
    with pytest.raises(ValueError, match=r"^judge: two verdicts \['A', 'A'\] share a token in the judge's tokenizer$"):
        label_token_ids(tokenizer, ["A", "A"], "judge")


def test_the_prompt_and_completion_texts_the_judge_is_shown():
    """templates.py's rules: a text as it is; a prompt of one user message, its content; other prompts, role-labelled
    turns; a message completion, its assistant content with tool calls as JSON (sorted keys) and other turns
    role-labelled; blocks joined by a blank line."""
    assert prompt_text("2+2?") == "2+2?" and prompt_text([{"role": "user", "content": "2+2?"}]) == "2+2?"
    turns = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}]
    assert prompt_text(turns) == "System: Be brief.\n\nUser: 2+2?"
    assert prompt_text([{"role": "system", "content": "Be brief."}]) == "System: Be brief."  # one turn, not a user's
    assert prompt_text([{"content": "no role"}, {"role": "user", "content": "hi"}]) == ": no role\n\nUser: hi"
    call = {"type": "function", "function": {"name": "add", "arguments": "{\"a\": 2}"}}
    completion = [
        {"role": "assistant", "content": "Let me add.", "tool_calls": [call]},
        {"role": "tool", "content": "4"},
        {"role": "assistant", "content": "It is 4."},
    ]
    assert completion_text(completion) == (
        'Let me add.\n{"function": {"arguments": "{\\"a\\": 2}", "name": "add"}, "type": "function"}\n\nTool: 4\n\n'
        "It is 4."
    )
    assert completion_text("plain") == "plain"
    assert prompt_text([{"role": "user", "content": "", "tool_calls": [{"id": 1}]}]) == '{"id": 1}'
    assert numbered(["x", "y"]) == "[Answer 1]\nx\n\n[Answer 2]\ny"
    assert fill("{prompt}|{reference}|{n}", {"prompt": "p", "reference": None, "n": 3}) == "p||3"  # None: empty
    assert fill("{a}", {"a": "{b}"}) == "{b}"  # a value is inserted as text, never parsed again
    assert judge_chat("judge this") == [{"role": "user", "content": "judge this"}]


def test_verdict_probabilities_are_renormalized_over_the_labels():
    # exp(log .2) = .2 and exp(log .3) = .3: mass .5, renormalized .4 and .6; None, NaN and -inf hold nothing
    probs, mass = distribution([math.log(0.2), math.log(0.3), None, float("nan"), float("-inf")])
    assert probs == pytest.approx([0.4, 0.6, 0.0, 0.0, 0.0]) and mass == pytest.approx(0.5)
    assert distribution([None, float("nan"), float("-inf"), float("inf")]) == ([0.25] * 4, 0.0)  # no mass: uniform
    assert distribution([0.0]) == ([1.0], 1.0)  # log 1: all the mass


def drive(asking, replies):
    """Run `ask_verdicts` as an engine would: each request answered by the next reply; returns the requests and the
    `Asked` it returned."""
    requests, replies = [], iter(replies)
    try:
        request = next(asking)
        while True:
            requests.append(request)
            request = asking.send(next(replies))
    except StopIteration as stop:
        return requests, stop.value


def test_generated_verdicts_are_asked_again_with_new_seeds_until_read_or_out_of_retries():
    judge = JudgeOptions(mode="pointwise", scoring="generate", max_score=5, parse_retries=2, temperature=0.0)
    judgements = [Judgement((0,), "p0"), Judgement((1,), "p1", overlength=True), Judgement((2,), "p2", copy=1),
                  Judgement((3,), "p3"), Judgement((4,), "p4")]  # fmt: skip
    requests, asked = drive(ask_verdicts(Pointwise(), judge, judgements), [
        ["Score: 4", "no verdict", None, "garbled"],  # p3's request failed: not asked again
        ["Score: 2", "still nothing"],
        ["nope"],
    ])  # fmt: skip
    # seeds: attempt + 1000 * copy; a retry of a greedy judge (temperature 0) samples at 1.0
    assert requests == [Generate(["p0", "p2", "p3", "p4"], 0.0, [0, 1000, 0, 0]),
                        Generate(["p2", "p4"], 1.0, [1001, 1]), Generate(["p4"], 1.0, [2])]  # fmt: skip
    assert asked.verdicts == [4.0, None, 2.0, None, None] and asked.failed == [3, 4] and asked.masses == []
    # 5 judgements, 1 over-length; retried 2 then 1; failed p3 (its request) and p4 (unread): 1 unparsed
    assert asked.counts == {"num_judgements": 5.0, "num_overlength": 1.0, "num_retried": 3.0, "num_unparsed": 1.0,
                            "num_failed": 2.0}  # fmt: skip
    assert asked.unparsed_text == "nope"  # the last answer no verdict was read from
    # all read at once: no retry, nothing failed
    judge = JudgeOptions(mode="pointwise", scoring="generate", max_score=5, parse_retries=2, temperature=0.7)
    requests, asked = drive(ask_verdicts(Pointwise(), judge, [Judgement((0,), "p0")]), [["Score: 3"]])
    assert requests == [Generate(["p0"], 0.7, [0])] and asked.verdicts == [3.0] and asked.unparsed_text == ""
    assert asked.counts == {"num_judgements": 1.0, "num_overlength": 0.0, "num_retried": 0.0, "num_unparsed": 0.0,
                            "num_failed": 0.0}  # fmt: skip


def test_a_genrm_judgement_never_read_gets_the_neutral_verdict_of_the_defaults():
    judge = JudgeOptions(mode="genrm", parse_retries=1, temperature=0.7, default_score=2.0, default_ranking=4.0,
                         aggregator="individual_scores")  # fmt: skip
    requests, asked = drive(ask_verdicts(GenRM(), judge, [Judgement((0, 1), "p0"), Judgement((1, 0), "p1")]),
                            [['{"score_1": 4, "score_2": 2, "ranking": 2}', "none"], ["still none"]])  # fmt: skip
    assert requests == [Generate(["p0", "p1"], 0.7, [0, 0]), Generate(["p1"], 0.7, [1])]  # a sampling judge
    # the unread one: (default_score, default_score, default_ranking), individual_scores gives each its score
    assert asked.verdicts == [Comparison(4.0, 2.0, 2.0, 4.0, 2.0), Comparison(2.0, 2.0, 4.0, 2.0, 2.0)]
    assert asked.failed == [1] and asked.counts["num_failed"] == 1.0 and asked.unparsed_text == "still none"
    masked = JudgeOptions(mode="genrm", parse_retries=0, failed_judgement="masked")
    _, asked = drive(ask_verdicts(GenRM(), masked, [Judgement((0, 1), "p0")]), [["none"]])
    assert asked.verdicts == [None] and asked.failed == [0]


def test_logprob_verdicts_are_read_over_the_labels_shown():
    judge = JudgeOptions(mode="listwise", scoring="logprobs")
    three = [math.log(0.5), math.log(0.25), math.log(0.25)] + [math.log(0.9)] * 6  # labels 1..9, three shown
    nothing = [float("-inf")] * 9
    judgements = [Judgement((0, 1, 2), "p0"), Judgement((3, 4), "p1", overlength=True), Judgement((5, 6), "p2")]
    requests, asked = drive(ask_verdicts(Listwise(), judge, judgements), [[three, nothing]])
    assert requests == [LabelLogprobs(["p0", "p2"])]
    # labels 1-3: .5, .25, .25 (mass 1, the other labels' probability not counted); p2's labels held nothing
    assert asked.verdicts == [[0.5, 0.25, 0.25], None, None] and asked.masses == [1.0, 0.0]
    assert asked.failed == [2] and asked.counts == {"num_judgements": 3.0, "num_overlength": 1.0, "num_retried": 0.0,
                                                    "num_unparsed": 1.0, "num_failed": 1.0}  # fmt: skip
    _, asked = drive(ask_verdicts(Listwise(), judge, [Judgement((0, 1), "p", overlength=True)]), [])
    assert asked.verdicts == [None] and asked.counts["num_overlength"] == 1.0  # nothing to send: nothing asked


def test_each_sample_gets_the_mean_of_its_shares_or_why_it_has_none():
    judgements = [Judgement((0, 1), "a"), Judgement((1, 5), "b", overlength=True), Judgement((2, 0), "c"),
                  Judgement((4, 5), "d")]  # fmt: skip
    values, missing = aggregate(Pairwise(), judgements, [0.75, None, 0.5, None], range(7), [3], 0.3)
    # 0: .75 and 1 - .5 -> .625; 1: 1 - .75; 2: .5; 3 alone: single_reward .3; 4: its judgement unread; 5: over-length
    # first (then unread); 6: in no judgement -> unparsed
    assert values == {0: 0.625, 1: 0.25, 2: 0.5, 3: 0.3} and missing == {"overlength": [5], "unparsed": [4, 6]}


def test_groups_are_equal_prompts_and_column_values_in_order_of_first_appearance():
    same = [{"role": "user", "content": "q"}]
    reordered = [{"content": "q", "role": "user"}]  # the same message, its keys in another order
    assert group_samples([same, "b", reordered, "c", "b"], [0, 1, 2, 4]) == [[0, 2], [1, 4]]
    day = datetime.date(2024, 1, 2)  # not JSON: compared by its text
    assert group_samples(["a", "b", "a", "a", "b"], range(5), {"ref": ["x", "y", "z", "x", "y"],
                                                               "day": [day] * 5}) == [[0, 3], [1, 4], [2]]  # fmt: skip


def test_the_judgements_of_a_call_and_the_samples_alone_in_their_group():
    def render(context, texts, row):
        return (context, tuple(texts), row), context == "long"

    texts = {i: f"t{i}" for i in range(6)}
    prompts = ["q", "q", "q", "solo", "long", "long"]
    columns = {"ref": ["r0", "r1", "r2", "r3", "r4", "r5"]}
    pairwise = JudgeOptions(mode="pairwise", pairs="all", swap=False)
    out, alone = build_judgements(Pairwise(), pairwise, prompts, texts, [[0, 1, 2], [3], [5, 4]], columns, render, "j")
    # each judgement's row holds the column values of the first sample it shows
    assert out == [Judgement((0, 1), ("q", ("t0", "t1"), {"ref": "r0"})),
                   Judgement((0, 2), ("q", ("t0", "t2"), {"ref": "r0"})),
                   Judgement((1, 2), ("q", ("t1", "t2"), {"ref": "r1"})),
                   Judgement((5, 4), ("long", ("t5", "t4"), {"ref": "r5"}), overlength=True)]  # fmt: skip
    assert alone == [3]
    pointwise = JudgeOptions(mode="pointwise")  # judges each completion alone: none is alone
    out, alone = build_judgements(Pointwise(), pointwise, prompts, texts, [[3]], {}, render, "j")
    assert out == [Judgement((3,), ("solo", ("t3",), {}))] and alone == []
    # a GenRM's k judges of a pair: the same samples in the same order numbered 0..k-1
    genrm = JudgeOptions(mode="genrm", judges_per_comparison=2)
    out, _ = build_judgements(GenRM(), genrm, prompts, texts, [[0, 1]], {}, render, "j")
    assert [(j.samples, j.copy) for j in out] == [((0, 1), 0), ((0, 1), 1), ((1, 0), 0), ((1, 0), 1)]


def test_a_completions_tool_calls_are_shown_as_json_one_per_line_unescaped():
    """What a judge is shown of an assistant turn that calls tools: its content, then each call as JSON with sorted
    keys on its own line, non-ASCII text kept as written (a judge reads "café", not "caf\\u00e9")."""
    calls = [{"type": "function", "function": {"name": "find", "arguments": {"place": "café"}}},
             {"type": "function", "function": {"name": "add", "arguments": {"b": 2, "a": 1}}}]  # fmt: skip
    completion = [{"role": "assistant", "content": "Looking.", "tool_calls": calls},
                  {"role": "tool", "content": "3"}]  # fmt: skip
    assert T.completion_text(completion) == (
        'Looking.\n{"function": {"arguments": {"place": "café"}, "name": "find"}, "type": "function"}\n'
        '{"function": {"arguments": {"a": 1, "b": 2}, "name": "add"}, "type": "function"}\n\nTool: 3'
    )
