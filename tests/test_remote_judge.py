"""A judge behind an OpenAI-compatible server (`RemoteJudgeEngine`), read by log-probabilities, against a scripted
server in this process (no model loads, so every test here is fast; the same path against a real vLLM server is
tests/test_judges_vllm.py's).

What the server answers is written in each test, and the rewards expected from it are worked out by hand from the
rules of docs/judges.md: a pointwise judge's reward is its expected rating over the verdict tokens `1..max_score`
renormalized over them (`sum_k k p(k) / sum_k p(k)`); a pairwise judge's preference for the first answer is
`p(A) / (p(A) + p(B))`, each completion getting its mean over its comparisons; a verdict token the server does not
list has probability 0.
"""

from __future__ import annotations

import asyncio
import json
import math

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from trl_rm_env import JudgeEnvironment
from trl_rm_env.serving.client.pool import RemoteScoringError

PROMPT = [{"role": "user", "content": "What is 2+2?"}]
ANSWERS = ["4", "Four.", "It is 5."]


def completions(texts):
    return [[{"role": "assistant", "content": t}] for t in texts]


def serve(answer, check):
    """Run the coroutine `check(url, bodies)` against a scripted server: `answer(body)` returns the JSON of every POST
    (any path), or `(status, text)`."""
    bodies: list[dict] = []

    async def handle(request: web.Request) -> web.Response:
        bodies.append(await request.json())
        out = answer(bodies[-1])
        if isinstance(out, tuple):
            return web.Response(status=out[0], text=out[1], content_type="application/json")
        return web.Response(text=json.dumps(out), content_type="application/json")

    async def main():
        app = web.Application()
        app.router.add_route("POST", "/{tail:.*}", handle)
        async with TestServer(app, host="127.0.0.1") as server:
            return await check(str(server.make_url("")).rstrip("/"), bodies)

    return asyncio.run(main())


def chat_logprobs(top: dict[str, float]) -> dict:
    """A chat completion whose first generated token's `top_logprobs` are `top` (token -> probability)."""
    entries = [{"token": t, "logprob": math.log(p)} for t, p in top.items()]
    return {"choices": [{"index": 0, "message": {"role": "assistant", "content": next(iter(top))},
                         "logprobs": {"content": [{"token": next(iter(top)), "top_logprobs": entries}]}}]}  # fmt: skip


def shown(body: dict) -> str:
    """The judge's one user message (messages mode)."""
    (message,) = body["messages"]
    return message["content"]


def judged(answer, texts=ANSWERS, prompts=None, **options):
    """Rewards, logged metrics and request bodies of one call of a messages-mode judge."""

    async def check(url, bodies):
        logged = {}
        env = JudgeEnvironment(remote_url=url, remote_input="messages", **options)
        rewards = await env(prompts or [PROMPT] * len(texts), completions(texts), log_metric=logged.__setitem__)
        return rewards, logged, list(bodies)

    return serve(answer, check)


# ------------------------------------------------------------------------------------------ messages: top_logprobs


def test_pointwise_expected_rating_from_the_servers_top_logprobs():
    """"4": p(7) = .6, p(8) = .2 and a non-verdict token .2 -> renormalized over the verdicts: .75 and .25 -> 7.25,
    their mass .8. "Four.": p(3) = .5, p(4) = .5 -> 3.5, mass 1. "It is 5.": only p(9) = .1 -> 9, mass .1."""
    tops = {"4": {"7": 0.6, "8": 0.2, "x": 0.2}, "Four.": {"3": 0.5, "4": 0.5}, "It is 5.": {"zz": 0.9, "9": 0.1}}

    def answer(body):
        return chat_logprobs(next(top for text, top in tops.items() if f"\n{text}\n" in shown(body)))

    rewards, logged, bodies = judged(answer)
    assert rewards == pytest.approx([7.25, 3.5, 9.0], abs=1e-9)
    assert logged["judge_env/rating_mass"] == pytest.approx((0.8 + 1.0 + 0.1) / 3, abs=1e-9)
    assert logged["judge_env/num_judgements"] == 3
    for body in bodies:  # one token, greedy, OpenAI's most top_logprobs
        assert (body["max_tokens"], body["temperature"], body["logprobs"], body["top_logprobs"]) == (1, 0.0, True, 20)


def test_pairwise_preference_is_p_a_over_p_a_plus_p_b_and_averaged_over_orders():
    """Two answers, `swap` on: judgement (0, 1) gives p(A) = .3, p(B) = .1 -> .75 for answer 0, .25 for answer 1;
    judgement (1, 0) gives p(A) = .2, p(B) = .6 -> .25 for answer 1, .75 for answer 0. Answer 0: (.75 + .75) / 2 =
    .75; answer 1: (.25 + .25) / 2 = .25."""

    def answer(body):
        first = shown(body).index(ANSWERS[0]) < shown(body).index(ANSWERS[1])
        return chat_logprobs({"A": 0.3, "B": 0.1} if first else {"A": 0.2, "B": 0.6})

    rewards, logged, bodies = judged(answer, ANSWERS[:2], mode="pairwise")
    assert rewards == pytest.approx([0.75, 0.25], abs=1e-9)
    assert len(bodies) == 2 and logged["judge_env/rating_mass"] == pytest.approx((0.4 + 0.8) / 2, abs=1e-9)


def test_no_verdict_token_among_the_top_logprobs_is_no_verdict():
    """A judgement whose top 20 hold no verdict token has nothing to read (never a 0): an error naming the samples,
    or `unparsed_reward`."""
    answer = lambda body: chat_logprobs({"Sure": 0.9, "The": 0.1})  # noqa: E731
    with pytest.raises(ValueError, match=r"the verdict tokens held no probability for completions \[0, 1\]"):
        judged(answer, ANSWERS[:2])
    rewards, logged, _ = judged(answer, ANSWERS[:2], unparsed_reward=-1.0)
    assert rewards == [-1.0, -1.0] and logged["judge_env/num_unparsed"] == 2


@pytest.mark.parametrize(
    "choice",
    [{"index": 0, "message": {"content": "7"}}, {"index": 0, "logprobs": {"content": []}}, {"index": 0, "logprobs": None}],
)
def test_an_answer_without_logprobs_names_the_server(choice):
    with pytest.raises(RemoteScoringError, match=r"judge server http://127\.0\.0\.1:\d+/v1/chat/completions answered "
                       r"without logprobs in choices\[0\]\.logprobs\.content\[0\]\.top_logprobs"):  # fmt: skip
        judged(lambda body: {"choices": [choice]}, ANSWERS[:1])


# ------------------------------------------------------------------------------------------ tokens: logprob_token_ids


@pytest.fixture(scope="module")
def label_ids(tiny_tokenizer):
    """The tiny tokenizer's ids of the pointwise verdicts "1".."9", as the judge writes them first."""
    return [tiny_tokenizer.convert_tokens_to_ids(str(k)) for k in range(1, 10)]


def completions_logprobs(prompts: list, probabilities) -> dict:
    """A `/v1/completions` answer in vLLM's form for `logprob_token_ids`: per prompt, the first position's
    log-probability of every asked token as `token_id:<id>` (`probabilities(prompt, ids)` -> {id: p}), choices in
    reverse order with their indices (the client must sort them)."""
    choices = []
    for k, prompt in enumerate(prompts["prompt"]):
        asked = prompts["logprob_token_ids"]
        p = probabilities(prompt, asked)
        step = {f"token_id:{t}": math.log(p[t]) if p.get(t) else -9999.0 for t in asked}
        choices.append({"index": k, "text": "", "logprobs": {"top_logprobs": [step]}})
    return {"choices": choices[::-1]}


def token_judge(url, tokenizer, **options):
    return JudgeEnvironment(tokenizer=tokenizer, remote_url=url, remote_input="tokens", **options)


def test_token_prompts_read_the_full_vocabulary_logprob_of_each_verdict(tiny_tokenizer, label_ids):
    """Each prompt's verdict probabilities are given by its length parity: even -> p("2") = .25, p("4") = .75, so
    2 * .25 + 4 * .75 = 3.5; odd -> p("9") = .4, p("1") = .1, a mass of .5: (9 * .4 + 1 * .1) / .5 = 7.4."""
    two, four, nine, one = label_ids[1], label_ids[3], label_ids[8], label_ids[0]

    def probabilities(prompt, asked):
        return {two: 0.25, four: 0.75} if len(prompt) % 2 == 0 else {nine: 0.4, one: 0.1}

    async def check(url, bodies):
        env = token_judge(url, tiny_tokenizer)
        rewards = await env([PROMPT] * 3, completions(ANSWERS))
        return rewards, list(bodies)

    rewards, bodies = serve(lambda body: completions_logprobs(body, probabilities), check)
    (body,) = bodies  # three prompts in one request
    assert body["logprob_token_ids"] == label_ids and body["max_tokens"] == 1 and body["temperature"] == 0.0
    assert body["return_tokens_as_token_ids"] is True and body["logprobs"] == 1
    lengths = [len(p) for p in body["prompt"]]
    want = [3.5 if n % 2 == 0 else 7.4 for n in lengths]
    assert rewards == pytest.approx(want, abs=1e-9)
    assert all(isinstance(t, int) for p in body["prompt"] for t in p)


def test_token_prompts_go_64_to_a_request_and_answers_return_in_order(tiny_tokenizer, label_ids):
    """70 judgements on one server: ceil(70 / 64) = 2 requests of 35 prompts each. Each answer's verdict is "k" where
    k is the prompt's length mod 9 + 1, so a choice put back at the wrong prompt would show."""

    def probabilities(prompt, asked):
        return {asked[len(prompt) % 9]: 1.0}

    texts = [f"answer {'x' * k}" for k in range(70)]

    async def check(url, bodies):
        env = token_judge(url, tiny_tokenizer)
        rewards = await env([PROMPT] * 70, completions(texts))
        return rewards, list(bodies)

    rewards, bodies = serve(lambda body: completions_logprobs(body, probabilities), check)
    assert [len(b["prompt"]) for b in bodies] == [35, 35]
    lengths = [len(p) for b in bodies for p in b["prompt"]]
    assert sorted(rewards) == sorted(float(n % 9 + 1) for n in lengths)
    assert len(set(lengths)) > 9  # the prompts differ, so the check above can see a misplaced answer


def test_token_prompts_spread_over_every_server(tiny_tokenizer, label_ids):
    """Three judgements and two servers: at least one request per server, so ceil(3 / 2) = 2 prompts, then 1."""
    seen: dict[str, int] = {}

    def make(name):
        async def handle(request):
            body = await request.json()
            seen[name] = len(body["prompt"])
            return web.json_response(completions_logprobs(body, lambda prompt, asked: {asked[4]: 1.0}))

        return handle

    async def main():
        servers = []
        for name in ("a", "b"):
            app = web.Application()
            app.router.add_route("POST", "/{tail:.*}", make(name))
            servers.append(TestServer(app, host="127.0.0.1"))
        async with servers[0] as first, servers[1] as second:
            env = token_judge([str(first.make_url("")), str(second.make_url(""))], tiny_tokenizer)
            return await env([PROMPT] * 3, completions(ANSWERS))

    assert asyncio.run(main()) == [5.0, 5.0, 5.0]
    assert sorted(seen.values()) == [1, 2]


def test_a_token_answer_without_the_verdict_logprobs_names_the_server(tiny_tokenizer):
    async def check(url, bodies):
        with pytest.raises(RemoteScoringError, match=r"answered without the verdict tokens' logprobs .*logprob_token_ids"):
            await token_judge(url, tiny_tokenizer)([PROMPT], completions(ANSWERS[:1]))

    serve(lambda body: {"choices": [{"index": 0, "text": "7", "logprobs": {"top_logprobs": [{"7": -0.1}]}}]}, check)


def test_a_server_answering_fewer_choices_than_prompts_is_named(tiny_tokenizer):
    def answer(body):
        out = completions_logprobs(body, lambda prompt, asked: {asked[0]: 1.0})
        out["choices"] = out["choices"][:1]
        return out

    async def check(url, bodies):
        with pytest.raises(RemoteScoringError, match=r"answered 1 choices for 3 prompts"):
            await token_judge(url, tiny_tokenizer)([PROMPT] * 3, completions(ANSWERS))

    serve(answer, check)
