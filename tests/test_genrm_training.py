"""Training a GenRM from ranked data (docs/genrm_training.md): the comparisons a record becomes (both orders, ties),
the rewards of a verdict against values written down by hand, the chat template that renders the protocol's roles,
and the GenRM's pairwise evaluation (position consistency). The listwise metrics are tests/test_listwise_metrics.py; the
recipe end to end (it learns, it rewards GRPO) is tests/test_genrm_recipe.py."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trl_rm_env.judges.genrm import Comparison, GenRM, parse_genrm_verdict
from trl_rm_env.judges.genrm_data import genrm_comparisons, record_pairs, target_verdict, warm_start_rows
from trl_rm_env.judges.genrm_template import prepare_genrm_tokenizer, renders_genrm_roles
from trl_rm_env.judges.judgements import JudgeVerdicts
from trl_rm_env.judges.mode_base import EvalPair
from trl_rm_env.rewards.genrm_verdicts import ReasoningLength, VerdictAgreement, VerdictFormat

USER = [{"role": "user", "content": "How much is 2 plus 2?"}]


def answer(text: str) -> list[dict]:
    return [{"role": "assistant", "content": text}]


RECORD = {
    "context": USER,
    "completions": [
        {"rank": 0, "completion": answer("4")},
        {"rank": 1, "completion": answer("<think>maybe</think>5")},
        {"rank": 1, "completion": answer("")},
    ],
    "principle": "Be correct.",
}


# --------------------------------------------------------------------------------------------------- comparisons
def test_a_record_becomes_its_pairs_in_both_orders_with_ties_as_tie_targets():
    rows, counts = genrm_comparisons([RECORD])
    # pairs (0,1), (0,2), (1,2): the last a tie; each shown as listed, then swapped
    assert [(r["pair"], r["order"], r["rank_1"], r["rank_2"], r["preference"]) for r in rows] == [
        ("0:0:1", 0, 0, 1, 1), ("0:0:1", 1, 1, 0, 2),
        ("0:0:2", 0, 0, 1, 1), ("0:0:2", 1, 1, 0, 2),
        ("0:1:2", 0, 1, 1, 0), ("0:1:2", 1, 1, 1, 0),
    ]  # fmt: skip
    # the final answer is shown (reasoning left out), an empty answer as the protocol's "None"
    assert rows[0]["prompt"] == [*USER, {"role": "response_1", "content": "4"}, {"role": "response_2", "content": "5"}]
    assert rows[3]["prompt"] == [*USER, {"role": "response_1", "content": "None"}, {"role": "response_2", "content": "4"}]
    assert (counts.records, counts.pairs, counts.ties, counts.comparisons) == (1, 2, 1, 6)
    assert counts.by_preference == {1: 2, 2: 2, 0: 2}


def test_without_ties_and_with_a_sample_of_pairs_and_a_principle():
    rows, counts = genrm_comparisons([RECORD], ties=False, principle_column="principle", principle="fallback")
    assert [r["pair"] for r in rows] == ["0:0:1", "0:0:1", "0:0:2", "0:0:2"]
    assert rows[0]["prompt"][1] == {"role": "principle", "content": "Be correct."}
    rows, _ = genrm_comparisons([{**RECORD, "principle": None}], principle_column="principle", principle="fallback")
    assert rows[0]["prompt"][1] == {"role": "principle", "content": "fallback"}
    rows, counts = genrm_comparisons([RECORD] * 3, pairs_per_record=1, seed=3)
    assert counts.comparisons == 6 and counts.sampled_out == 6  # 3 records x (3 pairs - 1 kept)
    assert len({r["pair"] for r in rows}) == 3
    assert rows == genrm_comparisons([RECORD] * 3, pairs_per_record=1, seed=3)[0]  # seeded
    with pytest.raises(ValueError, match="record 0: 'principle' must be a string"):
        genrm_comparisons([{**RECORD, "principle": 7}], principle_column="principle")
    with pytest.raises(ValueError, match="pairs_per_record must be at least 1"):
        genrm_comparisons([RECORD], pairs_per_record=0)


def test_sampled_pairs_vary_across_records_of_one_size_and_follow_the_seed():
    """40 four-way records, 2 of their 6 pairs sampled from each: one random stream over the records (seeded), so the
    records do not all keep the same pairs, each pair is kept about a third of the time, and a seed gives the same
    comparisons again."""
    import collections

    records = [{"context": USER, "completions": [{"rank": r, "completion": answer(f"a{r}")} for r in range(4)]}] * 40
    rows, counts = genrm_comparisons(records, pairs_per_record=2, seed=11)
    kept = collections.defaultdict(set)
    for row in rows:
        r, i, j = map(int, row["pair"].split(":"))
        kept[r].add((i, j))
    assert sorted(kept) == list(range(40)) and all(len(p) == 2 for p in kept.values())
    assert (counts.pairs, counts.ties, counts.sampled_out, counts.comparisons) == (80, 0, 160, 160)
    assert len({frozenset(p) for p in kept.values()}) >= 8  # 15 possible samples: not one for every record
    drawn = collections.Counter(pair for pairs in kept.values() for pair in pairs)
    assert sorted(drawn) == [(i, j) for i in range(4) for j in range(i + 1, 4)]
    assert all(5 <= n <= 22 for n in drawn.values())  # 80 draws of 6 pairs: about 13 each
    assert rows == genrm_comparisons(records, pairs_per_record=2, seed=11)[0]
    assert rows != genrm_comparisons(records, pairs_per_record=2, seed=12)[0]
    assert genrm_comparisons(records, pairs_per_record=2)[0] == genrm_comparisons(records, pairs_per_record=2, seed=0)[0]
    # A record with no more pairs than asked (here exactly as many: a tie left out) keeps them all, and draws nothing
    # from the stream
    short = {"context": USER, "completions": [{"rank": r, "completion": answer(f"a{r}")} for r in (0, 1, 1)]}
    mixed, counts = genrm_comparisons([short, *records[:3]], ties=False, pairs_per_record=2, seed=11)
    assert [r["pair"] for r in mixed[:4]] == ["0:0:1", "0:0:1", "0:0:2", "0:0:2"] and counts.sampled_out == 12
    mixed = mixed[2:]
    assert [r["pair"][2:] for r in mixed[2:]] == [r["pair"][2:] for r in rows[:12]]


def test_ties_are_counted_over_records_and_a_text_context_is_a_user_message():
    tied = {"context": "How much is 1 plus 1?", "completions": [
        {"rank": 0, "completion": answer("2")}, {"rank": 0, "completion": answer("two")},
        {"rank": 1, "completion": answer("3")}]}  # fmt: skip
    rows, counts = genrm_comparisons([tied, RECORD, tied])
    assert (counts.records, counts.pairs, counts.ties, counts.comparisons) == (3, 6, 3, 18)
    assert counts.by_preference == {1: 6, 2: 6, 0: 6}
    assert rows[0]["prompt"][0] == {"role": "user", "content": "How much is 1 plus 1?"}
    with pytest.raises(ValueError, match=r"^<records>: record 1: 'principle' must be a string \(a principle\), got "
                                         r"int$"):
        genrm_comparisons([RECORD, {**RECORD, "principle": 7}], principle_column="principle")


def test_record_pairs_by_hand():
    assert record_pairs([2, 0, 2]) == ([(0, 1), (0, 2), (1, 2)], 0)
    assert record_pairs([2, 0, 2], ties=False) == ([(0, 1), (1, 2)], 0)
    kept, left = record_pairs(list(range(5)), pairs_per_record=4)
    assert len(kept) == 4 and left == 6 and kept == sorted(kept)
    assert all(record_pairs(list(range(5)), pairs_per_record=4)[0] == kept for _ in range(5))  # seeded without rng


def test_warm_start_targets_are_verdicts_the_judge_reads_on_the_right_side():
    assert parse_genrm_verdict(target_verdict(1)) == (4.0, 2.0, 2.0)
    assert parse_genrm_verdict(target_verdict(2)) == (2.0, 4.0, 5.0)
    assert parse_genrm_verdict(target_verdict(0)) == (3.0, 3.0, 3.5)
    rows, _ = genrm_comparisons([RECORD])
    sft = warm_start_rows(rows)
    assert sft[1] == {"prompt": rows[1]["prompt"], "completion": answer(target_verdict(2))}
    agreement = VerdictAgreement(margin_credit=0.0)
    assert agreement([], [r["completion"] for r in sft], preference=[r["preference"] for r in rows]) == [1.0] * 6
    # the default credits the score margin too: 0.75 * side + 0.25 * (4 - 2) / 4 for a pair, 0.75 + 0.25 * 1 for a tie
    assert VerdictAgreement()([], [r["completion"] for r in sft], preference=[r["preference"] for r in rows]) == [
        0.875, 0.875, 0.875, 0.875, 1.0, 1.0]
    assert VerdictFormat()([], [r["completion"] for r in sft]) == [1.0] * 6


# ------------------------------------------------------------------------------------------------------ rewards
V = '{{"score_1": {}, "score_2": {}, "ranking": {}}}'.format
AGREEMENT_CASES = [  # (text, preference, margin_credit, reward by hand)
    (V(5, 1, 1), 1, 0.0, 1.0),
    (V(5, 1, 1), 2, 0.0, 0.0),
    (V(1, 5, 6), 2, 0.0, 1.0),
    (V(4, 3, 3), 1, 0.0, 1.0),  # slightly better is the right side
    (V(3, 3, 4), 1, 0.0, 0.0),
    (V(3, 3, 3.5), 1, 0.0, 0.0),  # no preference is no side
    (V(3, 3, 3.5), 0, 0.0, 1.0),
    (V(3, 3, 3.5), 2, 0.0, 0.0),  # no preference is no side for response 2 either
    (V(3, 3, 3), 0, 0.0, 1.0),  # a tie: 1 for 3 to 4
    (V(3, 3, 4), 0, 0.0, 1.0),
    (V(3, 3, 2), 0, 0.0, 0.0),  # 1.5 - 1.5
    (V(3, 3, 5), 0, 0.0, 0.0),
    (V(3, 3, 1), 0, 0.0, 0.0),
    (V(3, 3, 6), 0, 0.0, 0.0),
    (V(3, 3, 2.5), 0, 0.0, 0.5),  # 1.5 - 1
    (V(3, 3, 4.25), 0, 0.0, 0.75),  # 1.5 - 0.75
    (V(5, 1, 2), 1, 0.5, 1.0),  # 0.5 * 1 + 0.5 * (4 / 4)
    (V(4, 3, 2), 1, 0.5, 0.625),  # 0.5 * 1 + 0.5 * (1 / 4)
    (V(4, 3, 5), 2, 0.5, 0.5),  # right side, a score margin the wrong way: 0.5 * 1 + 0.5 * 0
    (V(3, 5, 4), 0, 0.5, 0.75),  # 0.5 * 1 + 0.5 * (1 - 2 / 4)
    ('{"ranking": 2}', 1, 0.5, 0.5),  # missing scores are the default 3: no margin
    ('{"score_1": 5, "score_2": 1}', 1, 0.0, 0.0),  # no ranking written
    (V(5, 1, 7), 1, 0.0, 0.0),  # out of range: no verdict
    (V(6, 1, 1), 1, 0.0, 0.0),
    ("I think the first one.", 1, 0.0, 0.0),
    ("", 0, 0.0, 0.0),
    ('<think>{"ranking": 6}</think>' + V(5, 1, 1), 1, 0.0, 1.0),  # the reasoning is not read
    ("```json\n" + V(5, 1, 1) + "\n```\n" + V(1, 5, 6), 1, 0.0, 1.0),  # the fenced block wins, as the judge reads it
    (V(1, 5, 6) + " then " + V(5, 1, 1), 1, 0.0, 1.0),  # else the last
]


@pytest.mark.parametrize("text, preference, credit, expected", AGREEMENT_CASES)
def test_agreement_reward_by_hand(text, preference, credit, expected):
    reward = VerdictAgreement(margin_credit=credit)
    assert reward([None], [text], preference=[preference]) == [pytest.approx(expected)]
    assert reward([None], [answer(text)], preference=[preference]) == [pytest.approx(expected)]  # TRL's messages


FORMAT_CASES = [  # (text, reward by hand)
    (V(5, 1, 1), 1.0),
    ("Response 1 is right.\n```json\n" + V(4, 2, 2) + "\n```", 1.0),
    (V(5, 1, 1) + ' {"note": 1}', 1.0),  # an object that is no verdict does not count
    (V(5, 1, 1) + V(5, 1, 1), 0.0),  # two verdicts
    ('{"score_1": 5, "ranking": 1}', 0.0),  # a key missing
    (V(5, 1, 0), 0.0),  # out of range
    (V(5, 0, 1), 0.0),
    ('{"score_1": "high", "score_2": 1, "ranking": 1}', 0.0),
    ("no verdict", 0.0),
    ('<think>{"ranking": 1}</think>' + V(5, 1, 1), 1.0),  # the reasoning's objects are not the answer's
]


@pytest.mark.parametrize("text, expected", FORMAT_CASES)
def test_format_reward_by_hand(text, expected):
    assert VerdictFormat()([None], [text]) == [expected]


def test_agreement_alone_reads_the_side_unless_given_a_margin_credit():
    from trl_rm_env.rewards.genrm_verdicts import agreement

    equal_scores = {"score_1": 3.0, "score_2": 3.0, "ranking": 2.0}  # the right side, no score margin
    assert agreement(equal_scores, 1) == 1.0 and agreement(equal_scores, 1, margin_credit=1.0) == 0.0


def test_reasoning_length_reward_by_hand():
    assert ReasoningLength(1)([None, None], ["a", "a b c"]) == [0.0, -1.0]  # the smallest target: -(3 - 1) / 1, clipped
    for bad in (True, 2.0, -3, "4"):
        with pytest.raises(ValueError, match="target_words must be a positive int"):
            ReasoningLength(bad)
    reward = ReasoningLength(target_words=4)
    texts = ["a b c " + V(5, 1, 1), "a b c d e f " + V(5, 1, 1), "<think>a b c d e f g h</think>" + V(5, 1, 1),
             "a b c d e f g h i j"]  # fmt: skip
    # 3 words: 0; 6: -(6 - 4) / 4; 8 (the reasoning counts): -1; 10 without a verdict: -1 (clipped)
    assert reward([None] * 4, texts) == [0.0, -0.5, -1.0, -1.0]
    with pytest.raises(ValueError, match="target_words"):
        ReasoningLength(0)


def test_rewards_name_a_bad_or_missing_preference():
    with pytest.raises(ValueError, match="sample 1: 'preference' must be 1 .* got 3"):
        VerdictAgreement()([None, None], ["", ""], preference=[1, 3])
    with pytest.raises(ValueError, match=r"no 'preference' column \(the human preference of each comparison: "
                                         r"trl_rm_env\.judges\.genrm_data\.genrm_comparisons writes it\)"):
        VerdictAgreement()([None], [""])
    with pytest.raises(ValueError, match="margin_credit"):
        VerdictAgreement(margin_credit=2)
    assert VerdictAgreement(margin_credit=1.0)([None], [V(5, 1, 6)], preference=[1]) == [1.0]  # the scores alone
    assert VerdictAgreement().__name__ == "genrm_agreement" and VerdictFormat().__name__ == "genrm_format"


# -------------------------------------------------------------------------------------------------- template
# A template that, like Qwen3's, renders system, user and assistant turns and drops any other role.
KNOWN_ROLES_ONLY = (
    "{% for m in messages %}{% if m['role'] in ['system', 'user', 'assistant'] %}"
    "{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def test_a_template_that_renders_the_roles_is_kept(tiny_tokenizer):
    tok = _copy(tiny_tokenizer)
    assert renders_genrm_roles(tok) is None
    before = tok.chat_template
    assert prepare_genrm_tokenizer(tok, "auto") == "model" and tok.chat_template == before


def _copy(tok):
    import copy

    return copy.deepcopy(tok)


def test_a_template_that_drops_the_roles_gets_the_builtin_one_or_is_refused(tiny_tokenizer):
    tok = _copy(tiny_tokenizer)
    tok.chat_template = KNOWN_ROLES_ONLY
    assert "drops the text of the role(s) ['response_1', 'response_2']" in renders_genrm_roles(tok)
    with pytest.raises(ValueError, match=r"genrm_template='model': .*\['response_1', 'response_2'\]"):
        prepare_genrm_tokenizer(tok, "model")
    assert prepare_genrm_tokenizer(tok, "auto", principle=True) == "builtin"
    messages = [{"role": "system", "content": "Be brief."}, *USER, {"role": "principle", "content": "P1"},
                {"role": "response_1", "content": "A1"}, {"role": "response_2", "content": "B2"}]  # fmt: skip
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text.count("<|im_start|>") == 2 and text.endswith("<|im_start|>assistant\n")  # one user turn, then ours
    body = text.split("<|im_start|>user\n", 1)[1]
    assert body.index("System: Be brief.\n\nUser: How much is 2 plus 2?") < body.index("[Principle]\nP1")
    assert body.index("[Principle]\nP1") < body.index("[Response 1]\nA1") < body.index("[Response 2]\nB2")
    assert '{"score_1": <1-5>, "score_2": <1-5>, "ranking": <1-6>}' in body
    # the warm start's answer follows the comparison as an assistant turn; plain chats render as before
    full = tok.apply_chat_template([*messages, *answer("V")], tokenize=False)
    assert full == text + "V<|im_end|>\n"
    assert tok.apply_chat_template(USER, tokenize=False) == "<|im_start|>user\nHow much is 2 plus 2?<|im_end|>\n"


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("ab {}%'\"\\\n\t[]:-")), max_size=40))
def test_the_prelude_writes_its_texts_as_jinja_literals_that_read_back_the_same(text):
    """`_literal`'s escaping, against Jinja's own parser (the sandbox transformers renders chat templates in)."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    from trl_rm_env.judges.genrm_template import _literal

    assert ImmutableSandboxedEnvironment().from_string("{{ " + _literal(text) + " }}").render() == text


def test_the_builtin_template_shows_the_judges_guide_and_instruction_whole(tiny_tokenizer):
    from trl_rm_env.judges.genrm_template import VERDICT_INSTRUCTION
    from trl_rm_env.judges.templates import _GUIDE

    tok = _copy(tiny_tokenizer)
    prepare_genrm_tokenizer(tok, "builtin")
    messages = [*USER, {"role": "response_1", "content": "A"}, {"role": "response_2", "content": "B"}]
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    body = text.split("<|im_start|>user\n", 1)[1].split("<|im_end|>", 1)[0]
    assert body == (f"{_GUIDE}\n\n[User request]\nHow much is 2 plus 2?\n\n[Response 1]\nA\n\n[Response 2]\nB\n\n"
                    f"{VERDICT_INSTRUCTION}")  # fmt: skip
    assert "'" in _GUIDE and "'" in VERDICT_INSTRUCTION  # quotes to escape, besides the newlines


def test_template_choices_are_checked(tiny_tokenizer):
    tok = _copy(tiny_tokenizer)
    assert prepare_genrm_tokenizer(tok) == "model"  # auto by default: the tiny model's template renders the roles
    with pytest.raises(ValueError, match=r"^the GenRM's base model has no chat template: a GenRM is sent chat messages "
                                         r"\(give a tokenizer with one, e\.g\. the instruct model's\)$"):
        prepare_genrm_tokenizer(SimpleNamespace(), "auto")  # no chat_template attribute at all
    assert renders_genrm_roles(SimpleNamespace()) == "the tokenizer has no chat template"
    fixed = _copy(tiny_tokenizer)
    fixed.chat_template = "{{ 'the same text whatever the messages' }}"  # does not read `messages`
    with pytest.raises(ValueError, match=r"^the built-in GenRM template on this model's template still fails: .*drops"):
        prepare_genrm_tokenizer(fixed, "auto")
    with pytest.raises(ValueError, match="genrm_template must be one of auto, model, builtin"):
        prepare_genrm_tokenizer(tok, "yes")
    assert prepare_genrm_tokenizer(tok, "builtin") == "builtin" and "[Response 1]" in tok.chat_template
    tok.chat_template = None
    with pytest.raises(ValueError, match="no chat template"):
        prepare_genrm_tokenizer(tok, "auto")


def test_grpo_renders_the_comparison_as_the_genrm_judge_sends_it(tiny_tokenizer):
    """What the GenRM is trained on (TRL's `apply_chat_template` of the comparison) is what the `genrm` judge sends
    (its messages, encoded with the saved tokenizer)."""
    from trl_rm_env.tokenization import encode_messages

    tok = _copy(tiny_tokenizer)
    tok.chat_template = KNOWN_ROLES_ONLY
    prepare_genrm_tokenizer(tok, "auto")
    rows, _ = genrm_comparisons([RECORD])
    options = SimpleNamespace(principle=None, principle_column=None)
    for row in rows:
        shown = [m["content"] for m in row["prompt"][-2:]]
        sent = GenRM().messages(USER, shown, options, {})
        trained = tok.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=True, return_dict=True)
        assert encode_messages(tok, sent, add_generation_prompt=True) == list(trained["input_ids"])


# ------------------------------------------------------------------------------------------------- evaluation
def test_genrm_judges_each_pair_in_both_orders_for_position_consistency():
    from trl_rm_env.evaluation.judge import verdict_metrics

    pairs = [EvalPair("c", "good", "bad", ("s", 0, 0), ("s", 0, 1), index=n) for n in range(4)]
    asked = []
    # pair 0: right in both orders; pair 1: "response 1 is better" whatever is shown; pair 2: no verdict when swapped;
    # pair 3: response 1 a little ahead whatever is shown (+0.25, then -0.25: a position bias below 0.5)
    scripted = {(0, True): (5, 1, 1), (0, False): (1, 5, 6), (1, True): (5, 1, 1), (1, False): (5, 1, 1),
                (2, True): (4, 2, 2), (2, False): None, (3, True): (3.25, 3, 3), (3, False): (3.25, 3, 3)}  # fmt: skip

    def ask(contexts, shown):
        asked.extend(shown)
        values = []
        for k, (first, _) in enumerate(shown):
            verdict = scripted[(k // 2, first == "good")]
            values.append(None if verdict is None else Comparison(*verdict, verdict[0], verdict[1]))
        return JudgeVerdicts(values, {}, [], None)

    options = SimpleNamespace(judges_per_comparison=1)
    found = GenRM().judge_pairs(ask, pairs, options)
    assert asked == [("good", "bad"), ("bad", "good")] * 4
    assert found.orders == [[4, 4], [4, -4], [2, None], [0.25, -0.25]]
    assert found.preferences == [4, 0, 2, 0]
    picks = ["better" if p > 0 else "tie" if p == 0 else "worse" for p in found.preferences]
    metrics = verdict_metrics([("s", 0, 0, 1)] * 4, picks, found.orders, neutral=0.0)["s"]
    assert metrics["accuracy"] == pytest.approx(2 / 4) and metrics["verdict_ties"] == 2
    assert metrics["both_orders"] == 3 and metrics["position_consistency"] == pytest.approx(1 / 3)


def test_genrm_calls_a_tied_pair_a_tie_when_both_orders_rank_it_near_the_middle():
    pairs = [EvalPair("c", "a", "b", None, None, index=n) for n in range(4)]
    rankings = [(3, 4), (3.5, 3.5), (3, 5), (4, None)]  # per pair: shown as listed, then swapped

    def ask(contexts, shown):
        found = [rankings[k // 2][k % 2] for k in range(len(shown))]
        return JudgeVerdicts([None if r is None else Comparison(3, 3, r, 3, 3) for r in found], {}, [], None)

    assert GenRM().judge_ties(ask, pairs, SimpleNamespace()) == [True, True, False, False]


def test_eval_judge_mode_genrm_reports_consistency_failed_verdicts_and_listwise(tiny_dir, tmp_path):
    """`trl-rm-env eval --judge-mode genrm` on the untrained tiny model: it writes no verdict, and each pair counts
    as no verdict (not as the neutral verdict GRPO would give it); both orders asked."""
    from trl_rm_env.recipes.cli import main as cli_main

    data = tmp_path / "three.jsonl"
    record = {**RECORD, "completions": [*RECORD["completions"][:2], {"rank": 1, "completion": answer("Five.")}]}
    other = {**record, "context": [{"role": "user", "content": "Say 4."}]}
    data.write_text(json.dumps(record) + "\n" + json.dumps(other) + "\n")
    out = tmp_path / "results.json"
    code = cli_main(["eval", "--judge", str(tiny_dir / "policy"), "--judge-mode", "genrm", "--judge-max-new-tokens",
                     "4", "--judge-parse-retries", "0", "--data", str(data), "--output", str(out), "--no-progress"])  # fmt: skip
    assert code == 0
    got = json.loads(out.read_text())["judge"]
    assert got["mode"] == "genrm" and got["cost"]["judgements"] == 4 * 2  # pairs x orders
    sets = got["sets"]["three"]
    assert sets["pairs"] == 4 and sets["no_verdict"] == 4 and sets["accuracy"] == 0
    assert (sets["tie_pairs"], sets["ties_correct"], sets["accuracy_with_ties"]) == (2, 0, 0.0)  # ranks 1 and 1
    assert sets["n_way"] == {"records": 0, "kendall_tau": None, "top1_accuracy": None, "constant": 0, "failed": 2}


# ------------------------------------------------------------------------------------------------------ recipe
def _recipe_args(tmp_path, *flags):
    from trl_rm_env.recipes.train_genrm import make_parser

    config = str(Path(__file__).resolve().parent.parent / "recipes" / "configs" / "genrm_tiny.yaml")
    return make_parser().parse_args_and_config(
        ["--config", config, "--output_dir", str(tmp_path / "out"), "--model_name_or_path", str(tmp_path / "policy"),
         *flags]  # fmt: skip
    )


@pytest.mark.parametrize(
    "flags, message",
    [
        (("--reward_weights", "1.0", "2.0"), "^reward_weights: the GenRM recipe weighs its rewards with agreement_weight, "
                                             "format_weight and reasoning_length_weight$"),
        (("--margin_credit", "1.5"), r"margin_credit must be in \[0, 1\], got 1.5"),
        (("--warm_start_steps", "-1"), "warm_start_steps must be >= 0"),
        (("--pairs_per_record", "0"), "pairs_per_record must be >= 1"),
    ],
)
def test_recipe_refuses_what_cannot_apply_before_loading_anything(tmp_path, flags, message):
    from trl_rm_env.recipes.train_genrm import main

    with pytest.raises(ValueError, match=message):
        main(*_recipe_args(tmp_path, *flags))


def test_recipe_refuses_eval_at_start_under_several_processes(tmp_path, monkeypatch):
    from trl import GRPOConfig
    from trl_rm_env.recipes.train_genrm import main

    args = _recipe_args(tmp_path, "--eval_at_start", "true")
    monkeypatch.setattr(GRPOConfig, "world_size", property(lambda self: 2))
    with pytest.raises(ValueError, match=r"^eval_at_start: the evaluation before training runs in one process, this "
                                         r"launch has 2; evaluate the base model with `trl-rm-env eval --judge MODEL "
                                         r"--judge-mode genrm --data \.\.\.`, or launch with one process \(the held-out "
                                         r"evaluation at the end runs either way\)$"):
        main(*args)


def test_recipe_refuses_a_model_whose_template_drops_the_roles_with_template_model(tiny_dir, tmp_path):
    import shutil

    from trl_rm_env.recipes.train_genrm import main

    policy = tmp_path / "policy"
    shutil.copytree(tiny_dir / "policy", policy)
    config = json.loads((policy / "tokenizer_config.json").read_text())
    (policy / "chat_template.jinja").unlink(missing_ok=True)
    config["chat_template"] = KNOWN_ROLES_ONLY
    (policy / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"genrm_template='model': .*\['response_1', 'response_2'\]"):
        main(*_recipe_args(tmp_path, "--genrm_template", "model", "--train_data", "sample:harder"))
