"""The GenRM judge mode (`JudgeEnvironment(mode="genrm")`, NeMo Gym's `genrm_compare`) end to end against a scripted
OpenAI-compatible chat server that answers chosen texts per pair: the messages it receives (roles, order, `None` for
an empty answer, the principle on and off, the policy's reasoning left out); the rewards, every expected value a
literal derived by hand (the derivation in a comment) from NeMo Gym's `resources_servers/genrm_compare/utils.py` and
NeMo RL's weighted win/loss points: pairs x k judges x aggregators (EXPECTED), the Super recipe's shaping
(SUPER_EXPECTED), the top-percentile bonus at groups of 8, 10 and 16; and the failures (no JSON after the retries at
changed `default_score` / `default_ranking`, a failed request, a dead or hanging server, `masked`, a lone sample). The
pieces without a model (parsing, pairs, aggregation, shaping) are `test_genrm.py`'s."""

from __future__ import annotations

import asyncio
import copy
import json
import logging
import socket
import threading
import time
from contextlib import contextmanager

import pytest
from aiohttp import web
from helpers import resolved

from trl_rm_env import JudgeEnvironment
from trl_rm_env.serving.client.pool import RemoteScoringError


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def scripted_genrm(answer):
    """An OpenAI-compatible `/v1/chat/completions` server on a thread: `answer(messages, body)` returns the GenRM's
    text, an int (an HTTP status to fail with) or a float (seconds to hang before failing with 503). Yields
    `(url, bodies)`, every request body received."""
    bodies: list[dict] = []

    async def chat(request: web.Request) -> web.Response:
        body = await request.json()
        bodies.append(body)
        text = answer(body["messages"], body)
        if isinstance(text, float):  # a server that hangs
            await asyncio.sleep(text)
            text = 503
        if isinstance(text, int):
            return web.json_response({"error": {"message": "scripted failure", "type": "x"}}, status=text)
        return web.json_response({"choices": [{"index": 0, "message": {"role": "assistant", "content": text}}]})

    loop = asyncio.new_event_loop()
    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    runner = web.AppRunner(app, shutdown_timeout=0.1)  # a hanging handler is not waited for
    loop.run_until_complete(runner.setup())
    port = _free_port()
    loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", port).start())
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}", bodies
    finally:
        asyncio.run_coroutine_threadsafe(stop(runner), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


async def stop(runner: web.AppRunner) -> None:
    """Stop the server and end the handlers still running (a hanging one)."""
    await runner.cleanup()
    pending = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)


def verdict_for(answer_1: str, answer_2: str) -> dict:
    """The scripted GenRM's judgement of two answers: scores from their lengths (ties where equal), a ranking that
    prefers the shorter one."""
    s1, s2 = min(5, 1 + len(answer_1) % 5), min(5, 1 + len(answer_2) % 5)
    ranking = 2 if len(answer_1) < len(answer_2) else 5 if len(answer_1) > len(answer_2) else 3
    return {"score_1": s1, "score_2": s2, "ranking": ranking}


def genrm_text(messages, body) -> str:
    by_role = {m["role"]: m["content"] for m in messages}
    verdict = verdict_for(by_role["response_1"], by_role["response_2"])
    return f"<think>Comparing.</think>Here it is:\n```json\n{json.dumps(verdict)}\n```"


PROMPT = [{"role": "user", "content": "Explain tides."}]
OTHER = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a colour."}]
ANSWERS = ["<think>The moon pulls.</think>The moon pulls water.", "Gravity.", "# Tides\n- moon\n- **sun**",
           "Moon and sun pull the oceans.", "<think>hm</think>Red.", "Blue, a calm colour."]  # fmt: skip
GROUPS = [PROMPT] * 4 + [OTHER] * 2


def turns(completions):
    """Completions as TRL passes them with conversational prompts: one assistant message each."""
    return [[{"role": "assistant", "content": c}] if isinstance(c, str) else c for c in completions]


def rewards_of(env, completions=ANSWERS, prompts=GROUPS, **kwargs):
    logged = {}
    out = asyncio.run(env(list(prompts), turns(completions), log_metric=logged.__setitem__, **kwargs))
    return out, logged


SUPER = {"reasoning_bonus": 0.5, "answer_bonus": 0.5, "top_percentile": 0.2, "reasoning_length_coeff": 0.3,
         "answer_length_coeff": 0.35, "style_coeff": 0.05}  # fmt: skip

# The scripted verdicts of ANSWERS (`verdict_for`: score 1 + len % 5, ranking 2 when response 1 is shorter, 5 when
# longer). Answer lengths: 0 "The moon pulls water." 21 -> score 2; 1 "Gravity." 8 -> 4; 2 "# Tides..." 24 -> 5;
# 3 "Moon and sun pull the oceans." 29 -> 5; 4 "Red." 4 -> 5; 5 "Blue, a calm colour." 20 -> 1. Each pair's verdict:
#   (0,1) 2,4,r5   (0,2) 2,5,r2   (0,3) 2,5,r2   (1,2) 4,5,r2   (1,3) 4,5,r2   (2,3) 5,5,r2 (a tie)   (3,0) 5,2,r5
#   (4,5) 5,1,r2   (5,4) 1,5,r5
# What each side receives, by NeMo Gym's `aggregate_scores` (simple_tiebreaker: on equal scores d = 3.5 - ranking,
# score_1 + d, score_2 - d; so (2,3) gives 6.5 and 3.5), individual_scores (the scores) and NeMo RL's weighted
# win/loss (ranking 2 -> .75 to response 1, .25 to response 2; ranking 5 -> .25 and .75). A reward is the mean of what
# the sample received. With k = 3 the 2nd and 3rd judgement of every pair answer COPY_VERDICT (1, 1, ranking 1):
# simple_tiebreaker: a tie, d = 2.5 -> 3.5 to response 1, -1.5 to response 2; individual_scores: 1 and 1; weighted
# win/loss: ranking 1 -> 1.0 and 0.0. With k = 3 a reward is the mean over every copy's share (3 per comparison).
COPY_VERDICT = {"score_1": 1, "score_2": 1, "ranking": 1}
EXPECTED = {
    # circular, group 1: 0 <- (0,1) 2, (3,0) 2; 1 <- (0,1) 4, (1,2) 4; 2 <- (1,2) 5, (2,3) 6.5; 3 <- (2,3) 3.5, (3,0) 5
    ("circular", 1, "simple_tiebreaker"): [2.0, 4.0, (5 + 6.5) / 2, (3.5 + 5) / 2, 5.0, 1.0],
    ("circular", 1, "individual_scores"): [2.0, 4.0, 5.0, 5.0, 5.0, 1.0],
    # 0 <- .25 (0,1), .75 (3,0); 1 <- .75, .75; 2 <- .25 (1,2), .75 (2,3); 3 <- .25 (2,3), .25 (3,0); 4 <- .75 twice
    ("circular", 1, "weighted_win_loss"): [0.5, 0.75, 0.5, 0.25, 0.75, 0.25],
    # k = 3, circular: every sample is response 1 once and response 2 once, so it gets its two k = 1 values and two
    # copies of each COPY_VERDICT side, out of 6: tiebreaker (2 * r + 2 * 3.5 - 2 * 1.5) / 6 = (r + 2) / 3
    ("circular", 3, "simple_tiebreaker"): [4 / 3, 6 / 3, 7.75 / 3, 6.25 / 3, 7 / 3, 3 / 3],
    ("circular", 3, "individual_scores"): [4 / 3, 6 / 3, 7 / 3, 7 / 3, 7 / 3, 3 / 3],  # (2 * r + 4 * 1) / 6
    ("circular", 3, "weighted_win_loss"): [1.5 / 3, 1.75 / 3, 1.5 / 3, 1.25 / 3, 1.75 / 3, 1.25 / 3],  # (2r + 2) / 6
    # all_pairs, group 1: 0 <- 2, 2, 2; 1 <- 4, 4, 4; 2 <- 5 (0,2), 5 (1,2), 6.5 (2,3); 3 <- 5, 5, 3.5; group 2: (4,5)
    ("all_pairs", 1, "simple_tiebreaker"): [2.0, 4.0, 16.5 / 3, 13.5 / 3, 5.0, 1.0],
    ("all_pairs", 1, "individual_scores"): [2.0, 4.0, 5.0, 5.0, 5.0, 1.0],
    # 0 <- .25 (0,1), .75 (0,2), .75 (0,3); 1 <- .75 x3; 2 <- .25, .25, .75; 3 <- .25 x3; 4 <- .75; 5 <- .25
    ("all_pairs", 1, "weighted_win_loss"): [1.75 / 3, 0.75, 1.25 / 3, 0.25, 0.75, 0.25],
    # k = 3, all_pairs: sample 0 is response 1 in 3 pairs, 1 in 2 (response 2 in 1), 2 in 1 (response 2 in 2),
    # 3 in none (response 2 in 3); 9 values each in group 1, 3 in group 2. Tiebreaker: 0: (6 + 6 * 3.5) / 9;
    # 1: (12 + 4 * 3.5 - 2 * 1.5) / 9; 2: (16.5 + 2 * 3.5 - 4 * 1.5) / 9; 3: (13.5 - 6 * 1.5) / 9; 4: (5 + 7) / 3;
    # 5: (1 - 3) / 3
    ("all_pairs", 3, "simple_tiebreaker"): [27 / 9, 23 / 9, 17.5 / 9, 4.5 / 9, 12 / 3, -2 / 3],
    ("all_pairs", 3, "individual_scores"): [12 / 9, 18 / 9, 21 / 9, 21 / 9, 7 / 3, 3 / 3],  # + 6 ones (2 in group 2)
    # 0: (1.75 + 6 * 1) / 9; 1: (2.25 + 4 * 1 + 2 * 0) / 9; 2: (1.25 + 2) / 9; 3: .75 / 9; 4: (.75 + 2) / 3; 5: .25 / 3
    ("all_pairs", 3, "weighted_win_loss"): [7.75 / 9, 6.25 / 9, 3.25 / 9, 0.75 / 9, 2.75 / 3, 0.25 / 3],
}


def copies_differ():
    """A scripted GenRM that answers a pair's first request with `genrm_text` and any later request of the same
    messages (another of its k judges) with COPY_VERDICT."""
    asked: dict[str, int] = {}

    def answer(messages, body):
        key = json.dumps(messages)
        asked[key] = asked.get(key, 0) + 1
        return genrm_text(messages, body) if asked[key] == 1 else f"```json\n{json.dumps(COPY_VERDICT)}\n```"

    return answer


@pytest.mark.parametrize("strategy", ["circular", "all_pairs"])
@pytest.mark.parametrize("k", [1, 3])
@pytest.mark.parametrize("aggregator", ["simple_tiebreaker", "individual_scores", "weighted_win_loss"])
def test_rewards_are_the_protocols_by_hand(strategy, k, aggregator):
    """Each pair of a group (circular or all_pairs) asked k times, each completion the mean of every share it
    received: the rewards are EXPECTED's, derived by hand above from NeMo Gym's `generate_comparison_pairs` and
    `aggregate_scores` (NeMo RL's points for weighted_win_loss); the requests' count, sampling and k seeds."""
    with scripted_genrm(copies_differ()) as (url, bodies):
        env = JudgeEnvironment(
            "genrm", remote_url=url, remote_input="messages", mode="genrm", comparison_strategy=strategy,
            judges_per_comparison=k, aggregator=aggregator, temperature=0.6, top_p=0.95,
        )  # fmt: skip
        got, logged = rewards_of(env)
    assert got == pytest.approx(EXPECTED[strategy, k, aggregator], abs=1e-9)
    per_group = {"circular": 4 + 2, "all_pairs": 6 + 1}[strategy] * k
    assert len(bodies) == per_group and logged["judge_env/num_judgements"] == per_group
    assert logged["judge_env/num_failed"] == 0
    assert {b["temperature"] for b in bodies} == {0.6} and {b["top_p"] for b in bodies} == {0.95}
    copies = {}
    for body in bodies:  # the k judges of one pair are sampled apart
        copies.setdefault(json.dumps(body["messages"]), set()).add(body["seed"])
    assert all(len(seeds) == k for seeds in copies.values())


# The Super recipe's shaping (SUPER) of circular simple_tiebreaker rewards, by hand from NeMo Gym's
# `apply_length_bonuses` then `apply_style_penalties`.
# Group 1, base [2, 4, 5.75, 4.25] (EXPECTED). Bonus threshold: index max(0, int(4 * .2) - 1) = 0, the best, 5.75.
# The shortest non-empty reasoning is sample 0's ("The moon pulls.", the only one) at 2.0: no bonus; the shortest
# answer is sample 1's ("Gravity.", 8) at 4.0: no bonus. Reasoning lengths [15, 0, 0, 0]: 1 - (L - 0) / 15 =
# [0, 1, 1, 1], minus the mean .75: [-.75, .25, .25, .25]. Answer lengths [21, 8, 24, 29]: 1 - (L - 8) / 21 =
# [8/21, 1, 5/21, 0], mean 17/42: [-1/42, 25/42, -7/42, -17/42]. Style densities: sample 2's answer has a header,
# two list items and a bold span in 24 characters (4/24), the others none: [1, 1, 0, 1] minus .75.
# Group 2, base [5, 1]: threshold index max(0, int(2 * .2) - 1) = 0, 5.0; sample 4 has the only reasoning ("hm") and
# the shortest answer ("Red."): 5.0 >= 5.0, +.5, then 5.5 >= 5.0, +.5. Reasoning [2, 0] -> [-.5, .5]; answers [4, 20]
# -> [.5, -.5]; equal style densities (0): nothing.
SUPER_EXPECTED = [
    2.0 + 0.3 * -0.75 + 0.35 * (-1 / 42) + 0.05 * 0.25,
    4.0 + 0.3 * 0.25 + 0.35 * (25 / 42) + 0.05 * 0.25,
    5.75 + 0.3 * 0.25 + 0.35 * (-7 / 42) + 0.05 * -0.75,
    4.25 + 0.3 * 0.25 + 0.35 * (-17 / 42) + 0.05 * 0.25,
    5.0 + 0.5 + 0.5 + 0.3 * -0.5 + 0.35 * 0.5,  # 6.025
    1.0 + 0.3 * 0.5 + 0.35 * -0.5,  # 0.975
]


def test_the_super_recipes_shaping_is_gyms_by_hand():
    """The Super recipe's bonuses, length and style coefficients on the judge's rewards: SUPER_EXPECTED, derived by
    hand from NeMo Gym's `apply_length_bonuses` and `apply_style_penalties`."""
    with scripted_genrm(genrm_text) as (url, _):
        env = JudgeEnvironment("genrm", remote_url=url, remote_input="messages", mode="genrm", **SUPER)
        got, _ = rewards_of(env)
    assert got == pytest.approx(SUPER_EXPECTED, abs=1e-9)
    assert got[4] == pytest.approx(6.025, abs=1e-12) and got[5] == pytest.approx(0.975, abs=1e-12)


def graded(messages, body) -> str:
    """A scripted GenRM that gives each response the number its answer starts with, ranking 3.5."""
    by_role = {m["role"]: m["content"] for m in messages}
    score_1, score_2 = (float(by_role[r].split()[0]) for r in ("response_1", "response_2"))
    return json.dumps({"score_1": score_1, "score_2": score_2, "ranking": 3.5})


def graded_group(scores, short_reasoning, short_answer):
    """Completions of one group whose answers start with their score; `short_reasoning` has the shortest reasoning
    ("ab"; the others a 16-character one), `short_answer` the shortest answer (its score alone; the others add
    " points")."""
    return [
        f"<think>{'ab' if i == short_reasoning else 'a longer thought'}</think>"
        + (f"{s}" if i == short_answer else f"{s} points")
        for i, s in enumerate(scores)
    ]


def test_the_top_percentile_bonus_at_groups_of_8_10_and_16():
    """NeMo Gym's `apply_length_bonuses` at the Super recipe's top_percentile 0.2 over groups of 8, 10 and 16
    (individual_scores, circular: each reward is the score its answer names). The threshold is the
    max(0, int(N * .2) - 1)-th best score: in each group the shortest reasoning sits exactly at it (bonus, since
    `>=`) and the shortest answer one rank below (none); `int(N * p)` without the `- 1`, or `>`, changes both."""
    g8 = [3.0, 1.0, 4.0, 2.0, 5.0, 2.5, 4.5, 3.5]  # N=8: int(1.6) - 1 = 0 -> the best, 5.0 (sample 4)
    g10 = [2.0, 4.5, 1.0, 3.0, 5.0, 2.5, 4.0, 1.5, 3.5, 1.25]  # N=10: int(2.0) - 1 = 1 -> the 2nd best, 4.5 (sample 1)
    # N=16: int(3.2) - 1 = 2 -> the 3rd best of 5.0, 5.0, 4.5, 4.0, 4.0, ... = 4.5 (sample 3)
    g16 = [3.0, 5.0, 2.0, 4.5, 1.0, 4.0, 3.5, 2.5, 5.0, 1.5, 3.0, 2.0, 4.0, 2.5, 1.0, 3.5]
    completions = graded_group(g8, 4, 6) + graded_group(g10, 1, 6) + graded_group(g16, 3, 5)
    prompts = [[{"role": "user", "content": f"Group of {n}"}] for n in (8, 10, 16) for _ in range(n)]
    with scripted_genrm(graded) as (url, bodies):
        env = JudgeEnvironment(remote_url=url, remote_input="messages", mode="genrm", aggregator="individual_scores",
                               reasoning_bonus=0.5, answer_bonus=0.25, top_percentile=0.2)  # fmt: skip
        got, _ = rewards_of(env, completions, prompts)
    assert len(bodies) == 8 + 10 + 16
    assert got == pytest.approx([
        3.0, 1.0, 4.0, 2.0, 5.5, 2.5, 4.5, 3.5,  # sample 4 (5.0 >= 5.0): +.5; sample 6 (4.5 < 5.0): nothing
        2.0, 5.0, 1.0, 3.0, 5.0, 2.5, 4.0, 1.5, 3.5, 1.25,  # sample 1 (4.5 >= 4.5): +.5; sample 6 (4.0 < 4.5)
        3.0, 5.0, 2.0, 5.0, 1.0, 4.0, 3.5, 2.5, 5.0, 1.5, 3.0, 2.0, 4.0, 2.5, 1.0, 3.5,  # 3 (4.5): +.5; 5 (4.0)
    ], abs=1e-12)  # fmt: skip


def test_gyms_reference_cases_through_the_judge():
    """NeMo Gym's cases: (4,2,1) -> [4, 2]; the tie (3,3,2) -> [4.5, 1.5]; a plain answer against a styled one with
    style coefficient 1 -> [3.5, 2.5]."""
    for verdict, want, extra in (
        ({"score_1": 4, "score_2": 2, "ranking": 1}, [4.0, 2.0], {}),
        ({"score_1": 3, "score_2": 3, "ranking": 2}, [4.5, 1.5], {}),
        ({"score_1": 3, "score_2": 3, "ranking": 3.5}, [3.5, 2.5], {"style_coeff": 1.0}),
    ):
        with scripted_genrm(lambda messages, body, v=verdict: json.dumps(v)) as (url, _):
            env = JudgeEnvironment(remote_url=url, remote_input="messages", mode="genrm",
                                   comparison_strategy="all_pairs", **extra)  # fmt: skip
            got, _ = rewards_of(env, ["Plain answer here", "# Title\n- item\n**bold**"], [PROMPT, PROMPT])
        assert got == pytest.approx(want, abs=1e-9)


def test_the_messages_are_the_protocols_exactly():
    completions = [[{"role": "assistant", "content": "<think>secret plan</think>Forty-two."}],
                   [{"role": "assistant", "content": "   "}]]  # fmt: skip
    with scripted_genrm(genrm_text) as (url, bodies):
        env = JudgeEnvironment(remote_url=url, remote_input="messages", mode="genrm", empty_completion_reward=None)
        rewards_of(env, completions, [OTHER, OTHER])
        assert bodies[0]["messages"] == [
            *OTHER,
            {"role": "response_1", "content": "Forty-two."},  # the policy's reasoning left out
            {"role": "response_2", "content": "None"},  # an empty answer
        ]
        assert bodies[1]["messages"][-2:] == [
            {"role": "response_1", "content": "None"},
            {"role": "response_2", "content": "Forty-two."},
        ]
        bodies.clear()
        principled = JudgeEnvironment(
            remote_url=url, remote_input="messages", mode="genrm", principle="Be concise.", principle_column="rule"
        )
        rewards_of(principled, completions, [OTHER, OTHER], rule=["Be exact.", "Be exact."])
        roles = [m["role"] for m in bodies[0]["messages"]]
        assert roles == ["system", "user", "principle", "response_1", "response_2"]
        assert bodies[0]["messages"][2]["content"] == "Be exact."  # the row's, before the default
        bodies.clear()
        rewards_of(principled, completions, [OTHER, OTHER], rule=[None, None])
        assert bodies[0]["messages"][2] == {"role": "principle", "content": "Be concise."}


def defaults_script(messages, body) -> str:
    """A scripted GenRM for the failure cases: a full verdict (4, 2, ranking 5) with "First." as response 1, only
    `score_1` (5) with "Second.", no verdict with anything else."""
    first = messages[-2]["content"]
    if first == "First.":
        return 'Mine:\n```json\n{"score_1": 4, "score_2": 2, "ranking": 5}\n```'
    return '{"score_1": 5}' if first == "Second." else "no verdict here"


@pytest.mark.parametrize(
    ("aggregator", "want"),
    [
        # (0,1) gives 4 and 2; (1,2) gives 5 and 2.0; (2,0) the failed (2.0, 2.0, 2.5): a tie, d = 3.5 - 2.5 = 1.0,
        # 3.0 to sample 2 and 1.0 to sample 0. Rewards: 0 <- 4, 1.0; 1 <- 2, 5; 2 <- 2.0, 3.0
        ("simple_tiebreaker", [(4 + 1.0) / 2, (2 + 5) / 2, (2.0 + 3.0) / 2]),
        ("individual_scores", [(4 + 2.0) / 2, (2 + 5) / 2, (2.0 + 2.0) / 2]),
        # ranking 5 -> .25 / .75; ranking 2.5 rounds half to even to 2 -> .75 / .25 (half up, 3, would give .6 / .4)
        ("weighted_win_loss", [(0.25 + 0.25) / 2, (0.75 + 0.75) / 2, (0.25 + 0.75) / 2]),
    ],
)
def test_unparseable_answers_are_retried_then_neutral_at_the_given_defaults(aggregator, want):
    """A group of 3, circular: (0,1) answers a verdict, (1,2) only `score_1` (the other two keys are the options'
    defaults, as NeMo Gym's `parse_genrm_output` fills them), (2,0) nothing, asked 1 + parse_retries times and then
    Gym's neutral verdict built from the options: `(default_score, default_score, default_ranking)` = (2.0, 2.0, 2.5).
    Expected rewards by hand per aggregator; the retries and the failure counted."""
    asked = []

    def answer(messages, body):
        asked.append(messages[-2]["content"])
        return defaults_script(messages, body)

    with scripted_genrm(answer) as (url, _):
        env = JudgeEnvironment(remote_url=url, remote_input="messages", mode="genrm", parse_retries=3,
                               aggregator=aggregator, default_score=2.0, default_ranking=2.5,
                               failed_judgement="neutral")  # fmt: skip
        got, logged = rewards_of(env, ["First.", "Second.", "Third."], [PROMPT] * 3)
    assert sorted(asked) == ["First.", "Second."] + ["Third."] * 4  # (2,0) asked once and retried 3 times
    assert got == pytest.approx(want, abs=1e-12)
    assert logged["judge_env/num_failed"] == 1 and logged["judge_env/num_retried"] == 3


def test_gyms_default_neutral_verdict_is_3_3_3_5():
    """Without options the failed comparison is NeMo Gym's (3, 3, 3.5): no tie-break shift, 3 to each side."""
    with scripted_genrm(defaults_script) as (url, _):
        env = JudgeEnvironment(remote_url=url, remote_input="messages", mode="genrm", parse_retries=0)
        got, _ = rewards_of(env, ["First.", "Second.", "Third."], [PROMPT] * 3)
    # (0,1) 4 and 2; (1,2) (5, 3, 3.5): 5 and 3; (2,0) (3, 3, 3.5): a tie, d = 0: 3 and 3
    assert got == pytest.approx([(4 + 3) / 2, (2 + 5) / 2, (3 + 3) / 2], abs=1e-12)


def test_a_failed_request_is_neutral_at_once_or_masks_exactly_its_responses():
    """A request that fails (HTTP 500 for the pair (1,2) of the first group, circular) is not retried. `neutral`: it
    counts as (3, 3, 3.5); `masked`: samples 1 and 2 get None, every other sample its reward from the comparisons
    that answered; with shaping, the masked samples are left out of their group (lengths of samples 0 and 3 only)."""

    def answer(messages, body):
        return 500 if messages[-2]["content"] == "Gravity." else genrm_text(messages, body)

    with scripted_genrm(answer) as (url, bodies):
        neutral = JudgeEnvironment(remote_url=url, remote_input="messages", mode="genrm", retries=0)
        got, logged = rewards_of(neutral)
        assert len(bodies) == 6 and logged["judge_env/num_failed"] == 1  # no retry of a failed request
        masked = JudgeEnvironment(remote_url=url, remote_input="messages", mode="genrm", retries=0,
                                  failed_judgement="masked")  # fmt: skip
        got_masked, logged_masked = rewards_of(masked)
        shaped = JudgeEnvironment(remote_url=url, remote_input="messages", mode="genrm", retries=0,
                                  failed_judgement="masked", answer_length_coeff=0.35)  # fmt: skip
        got_shaped, _ = rewards_of(shaped)
    # Verdicts (see EXPECTED): (0,1) 2 and 4; (1,2) failed; (2,3) the tie 6.5 and 3.5; (3,0) 5 and 2; group 2 5 and 1.
    # neutral: 1 <- 4, 3; 2 <- 3, 6.5
    assert got == pytest.approx([2.0, (4 + 3) / 2, (3 + 6.5) / 2, (3.5 + 5) / 2, 5.0, 1.0], abs=1e-12)
    assert got_masked[1] is None and got_masked[2] is None and logged_masked["judge_env/num_failed"] == 1
    assert got_masked[:1] + got_masked[3:] == pytest.approx([2.0, (3.5 + 5) / 2, 5.0, 1.0], abs=1e-12)
    # Answer lengths of what is left: group 1 samples 0 and 3, 21 and 29 -> weights [1, 0] - .5; group 2: 4 and 20
    assert got_shaped[1] is None and got_shaped[2] is None
    want = [2.0 + 0.35 * 0.5, 4.25 - 0.35 * 0.5, 5.0 + 0.35 * 0.5, 1.0 - 0.35 * 0.5]
    assert got_shaped[:1] + got_shaped[3:] == pytest.approx(want, abs=1e-12)


def test_a_group_of_one_gets_default_score_and_options_of_genrm_are_refused_elsewhere():
    """A sample alone in its group is compared with nothing and gets `default_score` (NeMo Gym's `aggregate_scores`:
    no comparison -> default_score), not `default_ranking`; its neighbours' group is judged as usual."""
    with scripted_genrm(genrm_text) as (url, bodies):
        env = JudgeEnvironment(remote_url=url, remote_input="messages", mode="genrm", default_score=2.5,
                               default_ranking=1.5)  # fmt: skip
        got, logged = rewards_of(env, ["Alone."], [PROMPT])
        assert got == [2.5] and not bodies
        got, logged = rewards_of(env, ["The moon pulls water.", "Gravity.", "Alone."], [PROMPT, PROMPT, OTHER])
    # (0,1) 2, 4, ranking 5; (1,0) 4, 2, ranking 2: no tie either way
    assert got == pytest.approx([2.0, 4.0, 2.5], abs=1e-12)
    assert len(bodies) == 2 and logged["judge_env/num_single"] == 1
    with pytest.raises(ValueError, match=r"comparison_strategy: options of another mode than 'pairwise'"):
        JudgeEnvironment(remote_url="http://127.0.0.1:9", remote_input="messages", mode="pairwise",
                         comparison_strategy="all_pairs")  # fmt: skip
    with pytest.raises(ValueError, match=r"a genrm judge reads its verdict by generate, not logprobs"):
        JudgeEnvironment(remote_url="http://127.0.0.1:9", remote_input="messages", mode="genrm", scoring="logprobs")
    with pytest.raises(ValueError, match=r"judge template reads \{rule\}|column 'rule'"):
        rewards_of(JudgeEnvironment(remote_url="http://127.0.0.1:9", remote_input="messages", mode="genrm",
                                    principle_column="rule"), ANSWERS[:2], [PROMPT, PROMPT])  # fmt: skip


def test_in_process_the_genrm_tokenizer_must_render_the_roles(tiny_tokenizer):
    from trl_rm_env.tiny_models import build_tiny_policy

    model = build_tiny_policy(tiny_tokenizer, seed=3)
    env = JudgeEnvironment(model, tiny_tokenizer, mode="genrm", max_new_tokens=4)  # the tiny template renders any role
    got, logged = rewards_of_sync(env)
    assert got == [3.0] * len(ANSWERS)  # a random model writes no verdict: every comparison neutral
    assert logged["judge_env/num_failed"] == logged["judge_env/num_judgements"] == 6
    strict = copy.deepcopy(tiny_tokenizer)  # a template that renders the user's turns only
    strict.chat_template = "{% for m in messages %}{% if m.role == 'user' %}{{ m.content }}{% endif %}{% endfor %}"
    with pytest.raises(ValueError, match=r"drops the text of the role\(s\) \['response_1', 'response_2'\]"):
        JudgeEnvironment(model, strict, mode="genrm")


def rewards_of_sync(env):
    logged = {}
    return env(list(GROUPS), turns(ANSWERS), log_metric=logged.__setitem__), logged


def test_the_super_recipe_config_builds_this_judge_and_its_rewards_are_the_formulas(repo_root):
    """recipes/configs/grpo_genrm.yaml's reward keys, read as the GRPO recipe reads them, give a GenRM judge whose
    rewards are SUPER_EXPECTED (by hand, from Gym's formulas) with the Super stage's sampling (its server swapped for
    the scripted one)."""
    import yaml
    from trl_rm_env.recipes.grpo_args import RewardModelArguments

    config = yaml.safe_load((repo_root / "recipes" / "configs" / "grpo_genrm.yaml").read_text())
    args = RewardModelArguments(**{k: v for k, v in config.items() if k.startswith("reward_")})
    kwargs = args.judge_kwargs()
    assert kwargs["mode"] == "genrm" and kwargs["remote_input"] == "messages" and kwargs["reasoning_bonus"] == 0.5
    with scripted_genrm(genrm_text) as (url, bodies):
        env = JudgeEnvironment(args.reward_judge, **{**kwargs, "remote_url": [url]})
        got, _ = rewards_of(env)
    assert {k: kwargs[k] for k in SUPER} == SUPER
    assert got == pytest.approx(SUPER_EXPECTED, abs=1e-9)
    assert {(b["temperature"], b["top_p"], b["max_tokens"], b["model"]) for b in bodies} == {
        (0.6, 0.95, 16384, "nvidia/Qwen3-Nemotron-235B-A22B-GenRM")
    }


@pytest.mark.slow
@pytest.mark.distributed
def test_groups_split_across_two_processes_are_judged_whole_each_comparison_once(tmp_path):
    """TRL splits a global batch between processes; with a process's batch smaller than a group, a group spans two.
    Under `accelerate launch --num_processes 2` the GenRM still compares each group whole, each comparison once, and
    every process gets its samples' rewards exactly as one process judging the whole batch would."""
    from helpers import launch

    prompts = [PROMPT] * 4 + [OTHER] * 4 + [[{"role": "user", "content": "Why is the sky blue?"}]] * 4
    completions = turns(ANSWERS + ["Rayleigh.", "<think>light</think>Scattering of sunlight.", "Blue light.",
                                   "Because **air** scatters blue.", "Sunlight scatters.", "Air."])  # fmt: skip
    options = {"reasoning_bonus": 0.5, "answer_length_coeff": 0.35, "style_coeff": 0.05}
    batch = tmp_path / "batch.json"
    batch.write_text(json.dumps({"prompts": prompts, "completions": completions, "options": options}))
    with scripted_genrm(genrm_text) as (url, bodies):
        one = JudgeEnvironment(remote_url=url, remote_input="messages", mode="genrm", **options)
        want = asyncio.run(one(prompts, completions))
        asked_once = sorted(json.dumps(b["messages"]) for b in bodies)
        bodies.clear()
        out, bad_batch, bad_out = tmp_path / "rewards.json", tmp_path / "bad.json", tmp_path / "failed.json"
        bad = json.loads(batch.read_text()) | {"options": {"principle_column": "rule"}}
        bad["columns"] = {"rule": ["Be kind."] * 7 + [None] * 5}  # None on process 1 only, without a default
        bad_batch.write_text(json.dumps(bad))
        launch("ddp_cpu.yaml", "tests/scripts/genrm_whole_groups.py", url, str(batch), str(out), str(bad_batch),
               str(bad_out), processes=2)  # fmt: skip
        asked_split = sorted(json.dumps(b["messages"]) for b in bodies)  # the bad batch asks nothing
        shares, failed = json.loads(out.read_text()), json.loads(bad_out.read_text())
    assert [[len(c) for c in s] for s in shares] == [[6, 6], [6, 6]]  # OTHER's group spans both processes
    for call in range(2):
        assert shares[0][call] + shares[1][call] == pytest.approx(want, abs=1e-9)
    assert asked_split == sorted(asked_once * 2)  # every comparison of the whole groups, once a call
    # A process that fails still enters the exchanges: every process raises, none is left waiting.
    assert failed[1]["error"].startswith("ValueError: ") and "column 'rule'" in failed[1]["error"]
    assert failed[0]["error"].startswith("RuntimeError: process 1 failed while judge: share the samples")


def test_a_dead_genrm_server_is_an_error_naming_it_not_neutral_rewards():
    url = f"http://127.0.0.1:{_free_port()}"  # nothing listens there
    env = JudgeEnvironment(remote_url=url, remote_input="messages", mode="genrm", retries=0, timeout=5)
    dead = rf"every request of this call to the judge servers failed \(4\).*{url}"
    with pytest.raises(RemoteScoringError, match=dead):
        rewards_of(env, ANSWERS[:4], [PROMPT] * 4)
    with scripted_genrm(lambda messages, body: 503) as (url, _):  # a server that answers, but never with a verdict
        env = JudgeEnvironment(remote_url=url, remote_input="messages", mode="genrm", retries=1, backoff=0.01)
        with pytest.raises(RemoteScoringError, match=r"every request .* failed \(4\).*503"):
            rewards_of(env, ANSWERS[:4], [PROMPT] * 4)


def test_a_hanging_genrm_server_times_out_naming_it_and_the_timeout_not_a_silent_wait():
    with scripted_genrm(lambda messages, body: 30.0) as (url, bodies):  # accepts, then never answers in time
        env = JudgeEnvironment(remote_url=url, remote_input="messages", mode="genrm", retries=1, backoff=0.01,
                               timeout=0.25)  # fmt: skip
        started = time.monotonic()
        with pytest.raises(RemoteScoringError, match=rf"every request .* failed \(2\).*{url}.*timed out \(2 times\)"):
            rewards_of(env, ANSWERS[:2], [PROMPT] * 2)
        assert time.monotonic() - started < 10  # two tries of 0.25 s each, concurrently: bounded, not 30 s
        assert len(bodies) <= 4  # both comparisons, each retried once at most (a loaded box may time out sooner)


def test_nemo_rls_length_shaping_applies_to_the_judges_rewards_from_trls_completion_ids():
    ids = [[5, 2], [5, 5, 5], [5, 2], [5, 5]]  # the 2nd and 4th truncated (no end token 2)
    with scripted_genrm(genrm_text) as (url, _):
        plain = JudgeEnvironment(remote_url=url, remote_input="messages", mode="genrm")
        stop = JudgeEnvironment(remote_url=url, remote_input="messages", mode="genrm", stop_properly_penalty_coef=0.5,
                                eos_token_id=2)  # fmt: skip
        want, _ = rewards_of(plain, ANSWERS[:4], [PROMPT] * 4, completion_ids=ids)
        got, _ = rewards_of(stop, ANSWERS[:4], [PROMPT] * 4, completion_ids=ids)
        with pytest.raises(ValueError, match="reads TRL's completion_ids"):
            rewards_of(stop, ANSWERS[:4], [PROMPT] * 4)
    assert got == pytest.approx([want[0], want[1] * 0.5, want[2], want[3] * 0.5], abs=1e-12)


def test_judge_items_reads_the_principle_column_a_none_falling_back_to_the_principle_and_names_a_missing_column():
    with scripted_genrm(genrm_text) as (url, bodies):
        env = JudgeEnvironment(remote_url=url, remote_input="messages", mode="genrm", principle="Be accurate.",
                               principle_column="rubric", name="genrm_eval")  # fmt: skip
        resolved(env.judge_items([PROMPT, PROMPT], [turns(ANSWERS[1:3]), turns(ANSWERS[2:4])], rubric=["Be brief.", None]))
    # The GenRM's principle message: the row's rubric, or `principle` where the row has None (docs/judges.md).
    principles = sorted(m["content"] for body in bodies for m in body["messages"] if m["role"] == "principle")
    assert principles == ["Be accurate.", "Be brief."]
    strict = JudgeEnvironment(remote_url="http://127.0.0.1:1", remote_input="messages", mode="genrm",
                              principle_column="rubric", name="genrm_eval")  # fmt: skip
    with pytest.raises(ValueError) as error:
        resolved(strict.judge_items([PROMPT], [turns(ANSWERS[1:3])]))
    assert str(error.value) == (
        "genrm_eval: the judge template reads {rubric}, but the reward function got no column 'rubric'; the dataset "
        "columns TRL passed: []"
    )


def test_a_column_the_genrm_reads_that_the_call_lacks_is_named_with_the_judge():
    env = JudgeEnvironment(remote_url="http://127.0.0.1:1", remote_input="messages", mode="genrm",
                           principle_column="rubric", name="genrm_judge")  # fmt: skip  # refused before any request
    with pytest.raises(ValueError) as error:
        rewards_of(env, ANSWERS[:2], [PROMPT] * 2)
    assert str(error.value) == (
        "genrm_judge: the judge template reads {rubric}, but the reward function got no column 'rubric'; the dataset "
        "columns TRL passed: []"
    )


def test_groups_of_different_sizes_in_one_call_are_warned_once_naming_the_sizes(caplog):
    """A comparing judge compares the completions of one call with equal prompts: a call whose groups differ in size
    (a cascade decided part of one) is warned once, with the sizes; equal groups are not warned."""
    warned = lambda: [r.getMessage() for r in caplog.records if "groups of this call" in r.getMessage()]  # noqa: E731
    with scripted_genrm(genrm_text) as (url, _), caplog.at_level(logging.WARNING):
        env = JudgeEnvironment(remote_url=url, remote_input="messages", mode="genrm", name="genrm_judge")
        rewards_of(env, ANSWERS[:4], [PROMPT] * 2 + [OTHER] * 2)  # groups of 2 and 2
        assert warned() == []
        rewards_of(env, ANSWERS[:5], [PROMPT] * 3 + [OTHER] * 2)  # groups of 3 and 2
        rewards_of(env, ANSWERS[:5], [PROMPT] * 3 + [OTHER] * 2)
    assert warned() == [
        "genrm_judge: the groups of this call have [2, 3] completions: a genrm judge compares the completions of one "
        "call with equal prompts, so a GRPO group partly decided by an earlier cascade source (or split across "
        "processes that each hold a shard of the judge) is compared in parts. Warned once."
    ]
