"""The listwise judge that writes its ranking (`JudgeEnvironment(mode="listwise", scoring="generate")`) end to end
against a scripted OpenAI-compatible chat server, and `trl-rm-env eval --judge-mode listwise` against the same server.

The server reads which answers a judgement shows, in which order, from the `[Answer k]` blocks of the prompt it
receives, and answers the text the test scripted for that order. Every expected reward below is written by hand from
the scripted rankings: a completion ranked `rank` (0: best) of N gets `(N - 1 - rank) / (N - 1)`, so for N = 4 the
positions named first to last get 1, 2/3, 1/3, 0; with `swap` the judge also sees the group reversed (position k of
that list is the group's completion N + 1 - k) and each completion gets the mean of its two standings. No model loads.
"""

from __future__ import annotations

import asyncio
import json
import re
import socket
import threading
from contextlib import contextmanager

import pytest
from aiohttp import web
from helpers import resolved
from trl_rm_env.recipes.cli import main as cli_main

import trl_rm_env.data.loaders  # noqa: F401 - `datasets` imports in a second, once: at collection, not in a test
from trl_rm_env import JudgeEnvironment

ANSWER_BLOCK = re.compile(r"\[Answer (\d+)\]\n(.*?)(?=\n\n\[Answer \d+\]\n|\n\nCompare the \d+ answers\.)", re.S)
USER_REQUEST = re.compile(r"\[User request\]\n(.*?)\n\n\[Answer 1\]\n", re.S)


def shown_of(content: str) -> tuple[str, ...]:
    """The answers a listwise judgement shows, in the order it numbers them."""
    blocks = ANSWER_BLOCK.findall(content)
    assert [int(k) for k, _ in blocks] == list(range(1, len(blocks) + 1)), content
    return tuple(text for _, text in blocks)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Script:
    """What the scripted judge answers: `answer(shown, request_text, attempt)` -> its text, where `shown` is the
    tuple of answers the judgement shows in order and `attempt` counts the requests already made for that same
    judgement (0: the first). Every request's `(shown, body)` is kept in `asked`."""

    def __init__(self) -> None:
        self.answer = None
        self.asked: list[tuple[tuple[str, ...], dict]] = []

    def reset(self, answer) -> Script:
        self.answer, self.asked = answer, []
        return self

    def reply(self, body: dict) -> str:
        content = body["messages"][-1]["content"]
        shown = shown_of(content)
        attempt = sum(1 for s, b in self.asked if s == shown and b["messages"] == body["messages"])
        self.asked.append((shown, body))
        return self.answer(shown, content, attempt)


@contextmanager
def scripted_judge():
    """An OpenAI-compatible `/v1/chat/completions` server on a thread (the `scripted_genrm` pattern of
    tests/test_genrm_judge.py) answering from a `Script`; yields `(url, script)`."""
    script = Script()

    async def chat(request: web.Request) -> web.Response:
        text = script.reply(await request.json())
        return web.json_response({"choices": [{"index": 0, "message": {"role": "assistant", "content": text}}]})

    loop = asyncio.new_event_loop()
    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    runner = web.AppRunner(app, shutdown_timeout=1.0)
    loop.run_until_complete(runner.setup())
    port = _free_port()
    loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", port).start())
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}", script
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


@pytest.fixture(scope="module")
def server():
    with scripted_judge() as found:
        yield found


def by_order(table: dict[tuple[str, ...], str]):
    """A script answering each shown order from `table` (a judgement it does not list fails the test)."""

    def answer(shown, content, attempt):
        assert shown in table, f"the judge was not scripted for the order {shown}"
        return table[shown]

    return answer


def judge(url: str, **options) -> JudgeEnvironment:
    return JudgeEnvironment(remote_url=url, remote_input="messages", mode="listwise", scoring="generate", **options)


def rewards_of(env, prompts, texts, **kwargs):
    """The environment's rewards for `texts` (one assistant turn each, as TRL passes them) and what it logged."""
    logged: dict[str, float] = {}
    completions = [[{"role": "assistant", "content": t}] for t in texts]
    out = asyncio.run(env(list(prompts), completions, log_metric=logged.__setitem__, **kwargs))
    return out, logged


def ask(question: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": question}]


# --- the ranking's standing, in order and reversed ----------------------------------------------------------------
THREE = ("Paris.", "Lyon is the capital.", "It is Paris, on the Seine.")
FOUR = ("Red.", "Blue is a colour.", "Green, like grass.", "Purple.")
EIGHT = tuple(f"Answer number {k} to the question." for k in "ABCDEFGH")

CASES = {
    # N = 3. As given: "2 > 1 > 3" -> [1/2, 1, 0]. Reversed (shows C, B, A): "3 > 1 > 2" names A, C, B -> A 1, C 1/2,
    # B 0. The means: A (1/2 + 1) / 2 = 3/4, B (1 + 0) / 2 = 1/2, C (0 + 1/2) / 2 = 1/4.
    "n3": (THREE, "Answer 2 reads best, then 1.\nRanking: 2 > 1 > 3", "Ranking: 3 > 1 > 2",
           [0.5, 1.0, 0.0], [0.75, 0.5, 0.25]),
    # N = 4. As given: "3 > 1 > 4 > 2" -> [2/3, 0, 1, 1/3]. Reversed (shows D, C, B, A), a judge that always ranks the
    # list as shown: "1 > 2 > 3 > 4" names D, C, B, A -> D 1, C 2/3, B 1/3, A 0. Means: A (2/3 + 0) / 2 = 1/3,
    # B (0 + 1/3) / 2 = 1/6, C (1 + 2/3) / 2 = 5/6, D (1/3 + 1) / 2 = 2/3.
    "n4": (FOUR, "Ranking: 3 > 1 > 4 > 2", "Ranking: 1 > 2 > 3 > 4",
           [2 / 3, 0.0, 1.0, 1 / 3], [1 / 3, 1 / 6, 5 / 6, 2 / 3]),
    # N = 8 (a GRPO group). As given: "5 > 2 > 8 > 1 > 7 > 3 > 6 > 4" -> E 7/7, B 6/7, H 5/7, A 4/7, G 3/7, C 2/7,
    # F 1/7, D 0. Reversed (shows H, G, ..., A: position k is completion 9 - k), a consistent judge names the same
    # completions E, B, H, A, G, C, F, D at positions 4, 7, 1, 8, 2, 6, 3, 5: the means equal the first order's.
    "n8": (EIGHT, "Ranking: 5 > 2 > 8 > 1 > 7 > 3 > 6 > 4", "Ranking: 4 > 7 > 1 > 8 > 2 > 6 > 3 > 5",
           [4 / 7, 6 / 7, 2 / 7, 0.0, 1.0, 1 / 7, 3 / 7, 5 / 7], [4 / 7, 6 / 7, 2 / 7, 0.0, 1.0, 1 / 7, 3 / 7, 5 / 7]),
}  # fmt: skip


@pytest.mark.parametrize("swap", [False, True], ids=["one_order", "swap"])
@pytest.mark.parametrize("case", list(CASES))
def test_rewards_are_the_written_rankings_standing(server, case, swap):
    """Each completion's reward is `(N - 1 - rank) / (N - 1)` of the ranking written for the order shown (best 1,
    worst 0), for N = 3, 4 and 8; with `swap` the reversed list's positions map back to the completions and each
    completion gets the mean of its two standings. Expected values: the hand-worked literals of `CASES`."""
    url, script = server
    texts, forward, backward, want_one, want_swap = CASES[case]
    script.reset(by_order({texts: forward, texts[::-1]: backward}))
    got, logged = rewards_of(judge(url, swap=swap), [ask("Which is best?")] * len(texts), texts)
    assert got == pytest.approx(want_swap if swap else want_one, abs=1e-12)
    assert [shown for shown, _ in script.asked] == ([texts, texts[::-1]] if swap else [texts])
    assert logged["judge_env/num_judgements"] == (2 if swap else 1) and logged["judge_env/num_failed"] == 0


def test_each_group_of_a_batch_is_ranked_alone_and_its_rewards_go_back_to_its_samples(server):
    """A GRPO batch of two interleaved groups (prompts P, Q, P, Q, P, Q): each group is one judgement of its three
    completions in batch order, and the standings return to the samples' batch positions. P's "3 > 1 > 2" gives
    (P0, P1, P2) = (1/2, 0, 1); Q's "1 > 2 > 3" gives (1, 1/2, 0); interleaved: [1/2, 1, 0, 1/2, 1, 0]."""
    url, script = server
    p, q = ask("Name a city."), ask("Name a river.")
    texts = ["Rome.", "The Nile.", "Oslo, in Norway.", "The Rhine river.", "A city: Lima.", "Danube."]
    script.reset(by_order({("Rome.", "Oslo, in Norway.", "A city: Lima."): "Ranking: 3 > 1 > 2",
                           ("The Nile.", "The Rhine river.", "Danube."): "Ranking: 1 > 2 > 3"}))  # fmt: skip
    got, _ = rewards_of(judge(url, swap=False), [p, q, p, q, p, q], texts)
    assert got == pytest.approx([0.5, 1.0, 0.0, 0.5, 1.0, 0.0], abs=1e-12)


# --- reading the ranking from the text ----------------------------------------------------------------------------
READINGS = {
    # A draft ranking, then the final one: the last is read. "3 > 1 > 2" -> [1/2, 0, 1] (the first, "1 > 2 > 3",
    # would give [1, 1/2, 0]).
    "draft_then_final": ("Draft. Ranking: 1 > 2 > 3\nOn reflection answer 3 is the most precise.\nRanking: 3 > 1 > 2",
                         [0.5, 0.0, 1.0]),
    "bold_final": ("Ranking: 2 > 3 > 1\n\n**Ranking: 1 > 3 > 2**", [1.0, 0.0, 0.5]),
    # A JSON list: `[2, 1, 3]` -> [1/2, 1, 0]; after a "Ranking:" label too; the last list when there are two.
    "json_list": ("My ranking, best first:\n[2, 1, 3]", [0.5, 1.0, 0.0]),
    "json_after_label": ("Ranking: [2, 1, 3]", [0.5, 1.0, 0.0]),
    "json_last_list": ("I first thought [1, 2, 3], but finally:\n```json\n[3, 1, 2]\n```", [0.5, 0.0, 1.0]),
    # The judge's reasoning is no verdict: the ranking inside <think> is skipped, the JSON list after it read
    # (reading the think text would give "3 > 2 > 1" -> [0, 1/2, 1]).
    "think_then_json": ("<think>Ranking: 3 > 2 > 1 is my guess.</think>Final: [2, 1, 3]", [0.5, 1.0, 0.0]),
    "think_then_ranking": ("<think>Ranking: 3 > 2 > 1</think>\nRanking: 1 > 3 > 2", [1.0, 0.0, 0.5]),
}  # fmt: skip


@pytest.mark.parametrize("reading", list(READINGS))
def test_the_ranking_is_the_last_one_written_outside_the_reasoning(server, reading):
    """`parse_ranking` through the judge: of several rankings the last is read, `Ranking: a > b > c` or a JSON list,
    and `<think>...</think>` is no answer. Expected rewards: the hand-worked standings of `READINGS` (N = 3)."""
    url, script = server
    text, want = READINGS[reading]
    script.reset(lambda shown, content, attempt: text)
    got, logged = rewards_of(judge(url, swap=False), [ask("Capital of France?")] * 3, THREE)
    assert got == pytest.approx(want, abs=1e-12)
    assert len(script.asked) == 1 and logged["judge_env/num_retried"] == 0


NOT_RANKINGS = [
    "Ranking: 1 > 1 > 2",  # a repeat
    "Ranking: 1 > 2",  # one missing
    "Ranking: 1 > 2 > 3 > 4",  # one too many
    "Ranking: 0 > 1 > 2",  # 0-based
    "Ranking: 1 > 2 > 4",  # out of range
    "[1, 2]",  # a JSON list that is no permutation
    "<think>Ranking: 2 > 1 > 3</think>They are all fine.",  # a ranking in the reasoning only
    "<think>Ranking: 2 > 1 > 3",  # reasoning never closed: no answer came
    "Answer 2 is best.",  # no ranking
]


def test_a_ranking_that_is_no_permutation_is_asked_again_until_one_is(server):
    """Each answer of `NOT_RANKINGS` is unparsed, so the judgement is asked again (`parse_retries`, sampling at 1.0
    after a greedy first try) until the scripted judge writes "Ranking: 2 > 3 > 1" -> [0, 1, 1/2]."""
    url, script = server
    script.reset(lambda shown, content, attempt: NOT_RANKINGS[attempt] if attempt < len(NOT_RANKINGS)
                 else "Ranking: 2 > 3 > 1")  # fmt: skip
    env = judge(url, swap=False, parse_retries=len(NOT_RANKINGS))
    got, logged = rewards_of(env, [ask("Capital of France?")] * 3, THREE)
    assert got == pytest.approx([0.0, 1.0, 0.5], abs=1e-12)
    assert len(script.asked) == len(NOT_RANKINGS) + 1
    assert [body["temperature"] for _, body in script.asked] == [0.0] + [1.0] * len(NOT_RANKINGS)
    assert logged["judge_env/num_retried"] == len(NOT_RANKINGS) and logged["judge_env/num_failed"] == 0


def test_a_judgement_never_parsed_gets_unparsed_reward_or_an_error_naming_its_samples(server):
    """Two interleaved groups (P at batch positions 0, 2, 4; Q at 1, 3, 5); Q's judge never writes a permutation.
    After `parse_retries` (2: three requests) Q's samples get `unparsed_reward` (0.25) while P keeps its ranking
    "2 > 1 > 3" -> (1/2, 1, 0); without `unparsed_reward` the call fails naming Q's samples [1, 3, 5]."""
    url, script = server
    p, q = ask("Capital of France?"), ask("Capital of Peru?")
    texts = ["Paris.", "Lima.", "Lyon.", "Cusco.", "Nice.", "Lima, on the coast."]
    p_shown = ("Paris.", "Lyon.", "Nice.")
    script.reset(lambda shown, content, attempt: "Ranking: 2 > 1 > 3" if shown == p_shown else "Ranking: 1 > 2 > 2")
    got, logged = rewards_of(judge(url, swap=False, unparsed_reward=0.25), [p, q] * 3, texts)
    assert got == pytest.approx([0.5, 0.25, 1.0, 0.25, 0.0, 0.25], abs=1e-12)
    assert sum(shown != p_shown for shown, _ in script.asked) == 3  # the first try and 2 retries
    assert logged["judge_env/num_unparsed"] == 1 and logged["judge_env/num_retried"] == 2
    with pytest.raises(ValueError, match=r"no verdict could be read for completions \[1, 3, 5\] after 2 retries .*"
                                         r"began 'Ranking: 1 > 2 > 2'"):  # fmt: skip
        rewards_of(judge(url, swap=False), [p, q] * 3, texts)


def test_with_swap_an_order_never_parsed_leaves_the_other_orders_standing(server):
    """With `swap`, the reversed list's answer is never a ranking: each completion's reward is its standing in the
    order that was read, "3 > 1 > 2" -> [1/2, 0, 1] (not averaged with `unparsed_reward`, which goes only to a
    completion without any verdict)."""
    url, script = server
    script.reset(by_order({THREE: "Ranking: 3 > 1 > 2", THREE[::-1]: "I would rather not say."}))
    got, logged = rewards_of(judge(url, swap=True, unparsed_reward=0.9), [ask("Capital of France?")] * 3, THREE)
    assert got == pytest.approx([0.5, 0.0, 1.0], abs=1e-12)
    assert logged["judge_env/num_unparsed"] == 1 and len(script.asked) == 1 + 3


# --- trl-rm-env eval --judge-mode listwise ------------------------------------------------------------------------
EVAL_PAIRS = [  # LLMBar's format: output 1 or 2 is the better one (`label`); what the scripted judge does with it
    ({"input": "What is 2+2?", "output_1": "4", "output_2": "5", "label": 1}, "better"),
    ({"input": "Name a colour.", "output_1": "Seven.", "output_2": "Blue.", "label": 2}, "worse"),
    ({"input": "Say hi.", "output_1": "Hello!", "output_2": "Bye.", "label": 1}, "first shown"),
    ({"input": "Count to three.", "output_1": "1, 2, 3.", "output_2": "3, 2, 1.", "label": 1}, "better"),
    ({"input": "Spell cat.", "output_1": "Dog.", "output_2": "C-A-T.", "label": 2}, "no ranking"),
    ({"input": "Name a fruit.", "output_1": "A chair.", "output_2": "An apple.", "label": 2}, "last shown"),
]


def eval_judge(shown, content, attempt):
    """The scripted eval judge: by the pair's question, ranks the better answer first, the worse first, the one
    shown first or last first, or writes no ranking."""
    question = USER_REQUEST.search(content).group(1)
    record, does = next((r, d) for r, d in EVAL_PAIRS if r["input"] == question)
    better = record[f"output_{record['label']}"]
    assert sorted(shown) == sorted([record["output_1"], record["output_2"]])
    if does == "no ranking":
        return "Both answers have merit."
    first = {"better": better, "worse": next(t for t in shown if t != better), "first shown": shown[0],
             "last shown": shown[1]}[does]  # fmt: skip
    return "Ranking: 1 > 2" if shown[0] == first else "Ranking: 2 > 1"


@pytest.mark.parametrize("swap", [True, False], ids=["swap", "one_order"])
def test_eval_listwise_reports_the_accuracy_of_the_scripted_rankings(server, tmp_path, capsys, swap):
    """`trl-rm-env eval --judge-url URL --judge-mode listwise --judge-scoring generate`, in process: each pair is a
    group of two (better answer shown first at even pair positions 0, 2, 4; second at 1, 3, 5; with `swap` also
    reversed) and goes to the completion with the higher reward. By hand, from `EVAL_PAIRS`:

    - swap: pairs 0 and 3 right (the judge prefers the better answer in both orders), 1 wrong, 2 and 5 ties (a judge
      of position alone gives each answer 1 and 0: equal means), 4 no verdict -> accuracy 2/6, 2 ties, 1 no verdict,
      12 judgements;
    - one order: 0 and 3 right, 1 wrong, 2 right (even: the better answer is shown first), 5 right (odd: shown last),
      4 no verdict -> accuracy 4/6, no ties, 6 judgements.
    """
    url, script = server
    script.reset(eval_judge)
    data = tmp_path / "natural.json"
    data.write_text(json.dumps([record for record, _ in EVAL_PAIRS]))
    out = tmp_path / "results.json"
    argv = ["eval", "--judge-url", url, "--judge-mode", "listwise", "--judge-scoring", "generate", "--data", str(data),
            "--format", "llmbar", "--output", str(out), "--no-progress"]  # fmt: skip
    argv += [] if swap else ["--no-judge-swap"]
    assert cli_main(argv) == 0
    results = json.loads(out.read_text())["judge"]
    got = results["sets"]["llmbar-natural"]
    want_accuracy, ties, judgements = (2 / 6, 2, 12) if swap else (4 / 6, 0, 6)
    assert results["mode"] == "listwise" and results["scoring"] == "generate"
    assert got["pairs"] == 6 and got["accuracy"] == pytest.approx(want_accuracy, abs=1e-12)
    assert got["correct"] == round(6 * want_accuracy) and got["verdict_ties"] == ties and got["no_verdict"] == 1
    assert results["cost"]["judgements"] == judgements and results["cost"]["unparsed"] == (2 if swap else 1)
    source = "judge (listwise, generate)"
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith(source))
    assert row[len(source) :].split()[0] == ("33.33%" if swap else "66.67%")  # the printed accuracy of the one set


# --- judge_items (eval's path): what each judgement shows, a judgement asked again, lists of the wrong length ------
def judged_items(env, contexts, shown, **columns):
    return resolved(env.judge_items(contexts, shown, **columns))


def turn(text: str) -> list[dict[str, str]]:
    return [{"role": "assistant", "content": text}]


def test_judge_items_shows_each_answer_in_order_its_reasoning_stripped_where_asked(server):
    url, script = server
    script.reset(lambda shown, content, attempt: "Ranking: 1 > 2 > 3")
    items = [tuple(turn(t) for t in ("<think>Paris? Yes.</think>Paris.", "Lyon.", "Nice.")),
             tuple(turn(t) for t in ("A.", "B.", "C."))]  # fmt: skip
    judged_items(judge(url, strip_reasoning=True), [ask("Capital?"), ask("Letters?")], items)
    assert sorted(shown for shown, _ in script.asked) == [("A.", "B.", "C."), ("Paris.", "Lyon.", "Nice.")]
    script.reset(lambda shown, content, attempt: "Ranking: 1 > 2 > 3")
    judged_items(judge(url), [ask("Capital?")], items[:1])  # the default (strip_reasoning=False): shown whole
    assert [shown for shown, _ in script.asked] == [("<think>Paris? Yes.</think>Paris.", "Lyon.", "Nice.")]


def test_an_item_asked_again_in_one_call_is_sampled_apart_by_its_seed(server):
    """The rule of `SEED_STRIDE` (trl_rm_env/judges/judgements.py: seed = attempt + 1000 * copy): an item's first
    judgement keeps the attempt's seed 0; the same item (same request, same answers in the same order) asked again in
    the call gets 1000, then 2000; another request or another order is another item, seed 0."""
    url, script = server
    script.reset(lambda shown, content, attempt: "Ranking: 1 > 2")
    ab, ba = (turn("A."), turn("B.")), (turn("B."), turn("A."))
    judged_items(judge(url), [ask("Q1"), ask("Q1"), ask("Q2"), ask("Q1"), ask("Q1")], [ab, ab, ab, ba, ab])
    seeds: dict[tuple, list[int]] = {}
    for shown, body in script.asked:
        request = USER_REQUEST.search(body["messages"][-1]["content"]).group(1)
        seeds.setdefault((request, shown), []).append(body["seed"])
    assert {key: sorted(found) for key, found in seeds.items()} == {
        ("Q1", ("A.", "B.")): [0, 1000, 2000], ("Q2", ("A.", "B.")): [0], ("Q1", ("B.", "A.")): [0]}  # fmt: skip


def test_judge_items_refuses_lists_of_the_wrong_length_in_one_line_naming_them():
    pairwise = JudgeEnvironment(remote_url="http://127.0.0.1:1", remote_input="messages", mode="pairwise",
                                name="pair_judge")  # fmt: skip  # refused before any request
    with pytest.raises(ValueError) as found:
        judged_items(pairwise, [ask("Q")] * 12, [(turn("A."),)] * 12)
    assert str(found.value) == (
        "pair_judge: a pairwise judge shows 2 completion(s) per judgement, one list per context; got 12 lists for 12 "
        "contexts, wrong lengths at [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]"
    )
    with pytest.raises(ValueError) as found:
        judged_items(pairwise, [ask("Q")] * 2, [(turn("A."), turn("B."))] * 3)
    assert str(found.value) == (
        "pair_judge: a pairwise judge shows 2 completion(s) per judgement, one list per context; got 3 lists for 2 "
        "contexts, wrong lengths at []"
    )
