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
import pickle
import re

import numpy as np
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from trl_rm_env import JudgeEnvironment, JudgeOptions
from trl_rm_env.rewards.base import RewardOptions
from trl_rm_env.runtime.model_options import ModelOptions, ScoringOptions
from trl_rm_env.serving.client.judge_engine import RemoteJudgeEngine, openai_base, remote_judge_tokenizer
from trl_rm_env.serving.client.pool import RemoteScoringError
from trl_rm_env.serving.client.remote_options import RemoteOptions

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


LONG = "{'index': 0, 'logprobs': None, 'message': {'content': '"  # str() of the long choice below, as Python writes it


@pytest.mark.parametrize(
    "choice, shown_choice",
    [
        ({"index": 0, "message": {"content": "7"}}, "{'index': 0, 'message': {'content': '7'}}"),
        ({"index": 0, "logprobs": {"content": []}}, "{'index': 0, 'logprobs': {'content': []}}"),
        ({"index": 0, "logprobs": None}, "{'index': 0, 'logprobs': None}"),
        # A long answer is shown by its first 300 characters.
        ({"index": 0, "logprobs": None, "message": {"content": "x" * 400}}, LONG + "x" * (300 - len(LONG))),
    ],
)
def test_an_answer_without_logprobs_names_the_server(choice, shown_choice):
    async def check(url, bodies):
        engine = RemoteJudgeEngine(url, model=None, tokens=False, options=RemoteOptions())
        with pytest.raises(RemoteScoringError) as caught:
            await engine.label_logprobs([PROMPT], None, ["1", "2"])
        return url, caught.value

    url, error = serve(lambda body: {"choices": [choice]}, check)
    assert str(error) == (f"judge server {url}/v1/chat/completions answered without logprobs in "
                          f"choices[0].logprobs.content[0].top_logprobs: {shown_choice}")  # fmt: skip
    assert (error.url, error.status) == (f"{url}/v1/chat/completions", 200)
    with pytest.raises(RemoteScoringError, match=r"judge server http://127\.0\.0\.1:\d+/v1/chat/completions answered "
                       r"without logprobs in choices\[0\]\.logprobs\.content\[0\]\.top_logprobs"):  # fmt: skip
        judged(lambda body: {"choices": [choice]}, ANSWERS[:1])  # the same error through the reward function


def test_the_engine_reads_a_label_missing_from_the_top_logprobs_as_minus_infinity():
    """The server lists "1" (p = .5) and "3" (p = .25) and a non-label token: the labels' log-probabilities are
    log .5, -inf (never listed: probability 0) and log .25, in the labels' order."""

    async def check(url, bodies):
        engine = RemoteJudgeEngine(url, model="judge", tokens=False, options=RemoteOptions())
        return await engine.label_logprobs([PROMPT], None, ["1", "2", "3"]), list(bodies)

    got, (body,) = serve(lambda body: chat_logprobs({"1": 0.5, "x": 0.25, "3": 0.25}), check)
    assert got == [[math.log(0.5), -math.inf, math.log(0.25)]]
    assert body == {"messages": PROMPT, "model": "judge", "max_tokens": 1, "temperature": 0.0, "logprobs": True,
                    "top_logprobs": 20}  # fmt: skip


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
    """The message shows the answer's first 300 characters: here its start, then 300 - 79 of its 400 "y"s."""
    choice = {"index": 0, "text": "7", "logprobs": {"top_logprobs": [{"7": -0.1}]}, "pad": "y" * 400}
    start = "{'index': 0, 'text': '7', 'logprobs': {'top_logprobs': [{'7': -0.1}]}, 'pad': '"  # 79 characters

    async def check(url, bodies):
        with pytest.raises(RemoteScoringError) as caught:
            await token_judge(url, tiny_tokenizer)([PROMPT], completions(ANSWERS[:1]))
        return url, caught.value

    url, error = serve(lambda body: {"choices": [choice]}, check)
    assert str(error) == (
        f"judge server {url}/v1/completions answered without the verdict tokens' logprobs in "
        "choices[i].logprobs.top_logprobs[0] (it must take vLLM's logprob_token_ids; else use remote_input='messages'): "
        + start + "y" * 221
    )
    assert (error.url, error.status) == (f"{url}/v1/completions", 200)


def test_a_server_answering_fewer_choices_than_prompts_is_named(tiny_tokenizer):
    def answer(body):
        out = completions_logprobs(body, lambda prompt, asked: {asked[0]: 1.0})
        out["choices"] = out["choices"][:1]
        return out

    async def check(url, bodies):
        with pytest.raises(RemoteScoringError, match=r"answered 1 choices for 3 prompts"):
            await token_judge(url, tiny_tokenizer)([PROMPT] * 3, completions(ANSWERS))

    serve(answer, check)


# ------------------------------------------------------------------------------------------ JudgeEnvironment's API


def test_verdicts_show_each_completion_before_its_other_and_fill_dataset_columns():
    """Pairwise `verdicts(contexts, completions, others)`: item k shows completions[k] first, then others[k]; the
    server answers p(A) = .3, p(B) = .1 when ANSWERS[0] is shown first (.75 for the first), else p(A) = .2,
    p(B) = .6 (.25). Pointwise with a `{rubric}` column: "Be brief." -> p(7) = p(9) = .5 (8), else p(2) = 1 (2)."""

    def answer(body):
        text = shown(body)
        if "Rubric:" in text:
            return chat_logprobs({"7": 0.5, "9": 0.5} if "Rubric: Be brief." in text else {"2": 1.0})
        first = text.index(ANSWERS[0]) < text.index(ANSWERS[1])
        return chat_logprobs({"A": 0.3, "B": 0.1} if first else {"A": 0.2, "B": 0.6})

    async def check(url, bodies):
        pairwise = JudgeEnvironment(remote_url=url, remote_input="messages", mode="pairwise")
        pairs = await pairwise.verdicts([PROMPT, PROMPT], ANSWERS[:2], ANSWERS[1::-1])
        rated = JudgeEnvironment(remote_url=url, remote_input="messages", template_kwargs={"enable_thinking": False},
                                 template="Rubric: {rubric}\n{prompt}\n{completion}\n{answer_format}")  # fmt: skip
        ratings = await rated.verdicts([PROMPT, PROMPT], ANSWERS[:2], rubric=["Be brief.", "Be exact."])
        return pairs, ratings, [shown(b) for b in bodies], [b.get("chat_template_kwargs") for b in bodies]

    pairs, ratings, texts, template_kwargs = serve(answer, check)
    assert template_kwargs == [None, None, {"enable_thinking": False}, {"enable_thinking": False}]  # the server's template's
    assert pairs.values == pytest.approx([0.75, 0.25], abs=1e-9)
    assert ratings.values == pytest.approx([8.0, 2.0], abs=1e-9) and ratings.tokens is None
    assert "Rubric: Be exact.\nWhat is 2+2?\nFour.\n" in texts[3]


def test_repr_and_replace_name_the_judge_and_refuse_options_it_cannot_change():
    env = JudgeEnvironment(remote_url="http://127.0.0.1:1", remote_input="messages")
    assert repr(env) == "JudgeEnvironment(name='judge', mode='pointwise', scoring='logprobs', remote_url=['http://127.0.0.1:1/v1'])"
    other = env.replace(mode="pairwise", name="pairwise_judge", scoring="generate")
    assert repr(other) == (
        "JudgeEnvironment(name='pairwise_judge', mode='pairwise', scoring='generate', remote_url=['http://127.0.0.1:1/v1'])"
    )
    # The reward function's options not given to `replace` are the judge's own.
    custom = JudgeEnvironment(remote_url="http://127.0.0.1:1", remote_input="messages", name="custom", clip=2.0,
                              empty_completion_reward=-1.0)  # fmt: skip
    assert custom.replace(mode="listwise").reward_options == RewardOptions(
        name="custom", clip=2.0, empty_completion_reward=-1.0
    )
    accepted = ["aggregator", "clip", "comparison_strategy", "default_ranking", "default_score", "empty_completion_reward",
                "failed_judgement", "judges_per_comparison", "max_new_tokens", "max_score", "mode", "name", "normalization",
                "pairs", "parse_retries", "principle", "principle_column", "scoring", "single_reward", "swap",
                "temperature", "template", "top_p", "unparsed_reward", "verdict_ranges"]  # fmt: skip
    error = f"unexpected keyword option(s) ['batch_size', 'precision']; accepted: {accepted}"
    with pytest.raises(TypeError, match="^" + re.escape(error) + "$"):  # how the judge loads and runs: a new judge
        env.replace(precision="bf16", batch_size=2)


def test_a_replaced_judge_makes_its_own_process_group(monkeypatch):
    """Two processes (faked): a comparing judge exchanges its samples over a process group it makes on its first
    call; one made by `replace` must make its own, not reuse (nor lack) the first judge's."""
    from trl_rm_env.rewards import judge as judge_module
    from trl_rm_env.rewards import whole_groups

    made, used = [], []
    monkeypatch.setattr(whole_groups, "world_size", lambda: 2)
    monkeypatch.setattr(whole_groups, "rank", lambda: 0)
    monkeypatch.setattr(judge_module, "own_group", lambda: made.append(f"group {len(made) + 1}") or made[-1])
    monkeypatch.setattr(whole_groups, "gather_objects", lambda value, what, group: used.append(group) or [value, value])
    first = JudgeEnvironment(remote_url="http://127.0.0.1:1", remote_input="messages", mode="pairwise")
    for judge in (first, first.replace(name="second")):
        steps = judge._steps([PROMPT] * 2, completions(ANSWERS[:2]), None, {})
        asyncio.run(judge._answer(next(steps)))  # the first exchange: share the samples of the call
    assert made == ["group 1", "group 2"] and used == ["group 1", "group 2"]


# ------------------------------------------------------------------------------------------ RemoteJudgeEngine itself


def on_server(answer, call):
    """`call(url)` (a coroutine function) against a scripted server: `answer(body)` returns the JSON of every POST or
    `(status, json)`. Returns what `call` returned (or the exception it raised) and every request as `(path,
    Authorization header, body)`."""
    requests: list[tuple] = []

    async def handle(request: web.Request) -> web.Response:
        body = await request.json()
        requests.append((request.path, request.headers.get("Authorization"), body))
        out = answer(body)
        if isinstance(out, tuple):
            return web.json_response(out[1], status=out[0])
        return web.json_response(out)

    async def main():
        app = web.Application()
        app.router.add_route("POST", "/{tail:.*}", handle)
        async with TestServer(app, host="127.0.0.1") as server:
            url = str(server.make_url("")).rstrip("/")
            try:
                return await call(url), url
            except Exception as err:  # noqa: BLE001 - the test reads it
                return err, url

    got, url = asyncio.run(main())
    return got, url, requests


def engine(url, tokens=True, **kwargs):
    return RemoteJudgeEngine(url, model=kwargs.pop("model", None), tokens=tokens,
                             options=RemoteOptions(**kwargs.pop("options", {})), **kwargs)  # fmt: skip


@pytest.mark.parametrize(
    "given, base",
    [
        ("http://judge:8000", "http://judge:8000/v1"),
        ("http://judge:8000/", "http://judge:8000/v1"),
        ("https://judge/v1/", "https://judge/v1"),
        ("https://proxyX/apiX/", "https://proxyX/apiX/v1"),  # only slashes are stripped
        ("http://judge/v1/chat/completions", "http://judge/v1"),
        ("http://judge/v1/completions/", "http://judge/v1"),
        ("http://judge:1/chat/completions", "http://judge:1/v1"),
        ("http://v1", "http://v1/v1"),  # the host is no path
    ],
)
def test_a_server_url_becomes_its_openai_base(given, base):
    assert openai_base(given) == base


def test_a_judge_needs_http_server_urls():
    with pytest.raises(ValueError, match=re.escape("judge server URL must start with http:// or https://, got 'ftp://judge'")):
        openai_base("ftp://judge/")
    with pytest.raises(ValueError, match="^a remote judge needs at least one server URL$"):
        engine([])
    two = engine(["http://a:1/v1/completions", "https://b"], max_length=50)
    assert two.bases == ["http://a:1/v1", "https://b/v1"] and two.max_length == 50
    assert two.urls == ["http://a:1/v1/completions", "https://b/v1/completions"]
    assert engine("http://a:1", tokens=False).urls == ["http://a:1/v1/chat/completions"]


def test_messages_go_with_the_model_key_and_template_arguments(monkeypatch):
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    monkeypatch.setenv("TRL_RM_ENV_API_KEY", "from-env")
    top = lambda body: chat_logprobs({"1": 0.5, "2": 0.5})  # noqa: E731
    fields = {"max_tokens": 1, "temperature": 0.0, "logprobs": True, "top_logprobs": 20}

    async def call(url):
        given = engine(url, tokens=False, model="judge", options={"api_key": "k1"}, template_kwargs={"think": False})
        await given.label_logprobs([PROMPT], None, ["1"])
        await engine(url, tokens=False).label_logprobs([PROMPT], None, ["1"])  # the key from the environment
        await engine(url, tokens=False, options={"api_key": ""}).label_logprobs([PROMPT], None, ["1"])  # none at all

    _, url, requests = on_server(top, call)
    assert requests == [
        ("/v1/chat/completions", "Bearer k1", {"messages": PROMPT, "chat_template_kwargs": {"think": False},
                                               "model": "judge", **fields}),
        ("/v1/chat/completions", "Bearer from-env", {"messages": PROMPT, **fields}),
        ("/v1/chat/completions", None, {"messages": PROMPT, **fields}),
    ]  # fmt: skip


def completion_texts(body):
    """A `/v1/completions` answer: each prompt's text is its length spelled out, choices in reverse order."""
    words = {1: "one", 2: "two", 3: "three"}
    choices = [{"index": k, "text": words.get(len(p))} for k, p in enumerate(body["prompt"])]
    return {"choices": choices[::-1]}


def test_generate_asks_each_seed_once_and_answers_in_the_prompts_order():
    """Prompts of 2, 1, 3 and 4 tokens with seeds 5, 7, 5, 7: one request per seed (in order of first use), the
    answers put back at their prompts; a choice without text (the 4-token prompt) is an empty judgement."""
    prompts = [np.array([1, 2]), [3], [4, 5, 6], [7, 8, 9, 10]]

    async def call(url):
        judge = engine(url, model="judge")
        first = await judge.generate(prompts, 9, 0.5, np.array([5, 7, 5, 7]))
        nucleus = await judge.generate(prompts[:1], 9, 0.5, [1], top_p=0.9)
        empty = await judge.generate([], 9, 0.5, [])
        return first, nucleus, empty

    (first, nucleus, empty), _, requests = on_server(completion_texts, call)
    assert first == ["two", "one", "three", ""] and nucleus == ["two"] and empty == []
    common = {"model": "judge", "max_tokens": 9, "temperature": 0.5}
    assert [(path, body) for path, _, body in requests] == [
        ("/v1/completions", {"prompt": [[1, 2], [4, 5, 6]], **common, "seed": 5}),
        ("/v1/completions", {"prompt": [[3], [7, 8, 9, 10]], **common, "seed": 7}),
        ("/v1/completions", {"prompt": [[1, 2]], **common, "top_p": 0.9, "seed": 1}),
    ]


def test_many_token_prompts_split_evenly_into_requests_of_at_most_64():
    """130 prompts on one server: ceil(130 / 64) = 3 requests of ceil(130 / 3) = 44, 44 and 42 prompts."""

    async def call(url):
        return await engine(url).generate([[1]] * 130, 1, 0.0, [0] * 130)

    got, _, requests = on_server(completion_texts, call)
    assert got == ["one"] * 130 and [len(body["prompt"]) for _, _, body in requests] == [44, 44, 42]


def test_failed_requests_answer_none_when_kept_else_raise_naming_the_server(caplog):
    """Seed 7's request is refused (HTTP 400): kept, its prompts answer None and a warning counts it; not kept, the
    call fails; every request refused fails even when kept."""
    prompts, seeds = [[1, 2], [3], [4, 5, 6]], [5, 7, 5]
    refuse_7 = lambda body: (400, {"error": {"message": "too long"}}) if body["seed"] == 7 else completion_texts(body)  # noqa: E731

    async def call(url):
        return await engine(url).generate(prompts, 4, 0.0, seeds, keep_failures=True)

    with caplog.at_level("WARNING", logger="trl_rm_env.serving.client.judge_engine"):
        got, url, _ = on_server(refuse_7, call)
    refused = f"judge server {url}/v1/completions refused the request: HTTP 400: too long"
    assert got == ["two", None, "three"]
    assert [r.getMessage() for r in caplog.records if r.name == "trl_rm_env.serving.client.judge_engine"] == [
        "1 of 2 requests to the judge servers failed (their judgements count as failed, in judge_env/num_failed); "
        f"the first: {refused}"
    ]

    async def strict(url):
        return await engine(url).generate(prompts, 4, 0.0, seeds)

    error, url, _ = on_server(refuse_7, strict)
    assert isinstance(error, RemoteScoringError)
    assert str(error) == f"judge server {url}/v1/completions refused the request: HTTP 400: too long"


def test_every_request_failing_is_an_error_naming_the_first_failure():
    """Two requests on two servers (here two paths of one), both refused; the seed-7 one answers 0.1 s later, so the
    seed-5 refusal (HTTP 400 on /a) is the first failure, named with its server and status."""
    refusals = {5: (400, "too long"), 7: (422, "bad seed")}

    async def handle(request):
        body = await request.json()
        if body["seed"] == 7:
            await asyncio.sleep(0.1)
        status, message = refusals[body["seed"]]
        return web.json_response({"error": {"message": message}}, status=status)

    async def main():
        app = web.Application()
        app.router.add_route("POST", "/{tail:.*}", handle)
        async with TestServer(app, host="127.0.0.1") as server:
            url = str(server.make_url("")).rstrip("/")
            judge = engine([url + "/a", url + "/b"])
            with pytest.raises(RemoteScoringError) as caught:
                await judge.generate([[1], [2]], 4, 0.0, [5, 7], keep_failures=True)
            return url, caught.value

    url, error = asyncio.run(main())
    first = f"judge server {url}/a/v1/completions refused the request: HTTP 400: too long"
    assert str(error) == f"every request of this call to the judge servers failed (2): {first}"
    assert (error.url, error.status) == (f"{url}/a/v1/completions", 400) and str(error.__cause__) == first


def test_choices_are_read_in_index_order_and_a_missing_index_is_0():
    """Choices answered out of order are put back by their `index`; one without an index counts as index 0 (the
    order of several without one is kept)."""

    async def call(url):
        return await engine(url).generate([[1], [2]], 4, 0.0, [0, 0])

    def answer(choices):
        return lambda body: {"choices": choices}

    assert on_server(answer([{"index": 1, "text": "second"}, {"text": "first"}]), call)[0] == ["first", "second"]
    assert on_server(answer([{"text": "a"}, {"text": "b"}]), call)[0] == ["a", "b"]


def test_answers_without_choices_or_text_or_enough_choices_name_the_server():
    long_body = {"detail": "z" * 400}
    start = "{'detail': '"  # str() of long_body, then its z's: 300 characters in all

    async def generate(url):
        return await engine(url).generate([[1], [2], [3]], 4, 0.0, [0, 0, 0])

    error, url, _ = on_server(lambda body: long_body, generate)
    assert isinstance(error, RemoteScoringError)
    assert str(error) == f"judge server {url}/v1/completions answered without choices: {start}" + "z" * 288
    assert (error.url, error.status) == (f"{url}/v1/completions", 200)
    error, url, _ = on_server(lambda body: {"choices": [{"index": 0, "text": "a"}]}, generate)
    assert isinstance(error, RemoteScoringError)
    assert str(error) == f"judge server {url}/v1/completions answered 1 choices for 3 prompts"
    assert (error.url, error.status) == (f"{url}/v1/completions", 200)
    choice = {"index": 0, "message": {"content": "x" * 400}}

    other = [{"role": "user", "content": "Say nothing."}]

    async def chat(url):
        return await engine(url, tokens=False).generate([PROMPT, other], 4, 0.0, [0, 0])

    error, url, _ = on_server(lambda body: {"choices": [choice]}, generate)
    assert isinstance(error, RemoteScoringError)
    assert str(error) == (f"judge server {url}/v1/completions answered without a choice's text: "
                          "{'index': 0, 'message': {'content': '" + "x" * 263)  # fmt: skip
    assert (error.url, error.status) == (f"{url}/v1/completions", 200)
    silent = {"index": 0, "message": {"content": None}}  # no text: an empty judgement
    texts, _, requests = on_server(lambda body: {"choices": [choice if body["messages"] == PROMPT else silent]}, chat)
    assert texts == ["x" * 400, ""] and len(requests) == 2  # a conversation per request
    error, url, _ = on_server(lambda body: {"choices": [{"index": 0, "text": "7"}]}, chat)
    assert isinstance(error, RemoteScoringError)
    assert str(error) == (f"judge server {url}/v1/chat/completions answered without a choice's text: "
                          "{'index': 0, 'text': '7'}")  # fmt: skip
    assert (error.url, error.status) == (f"{url}/v1/chat/completions", 200)


def test_no_prompts_send_no_request_and_token_ids_need_a_tokenizer(tiny_tokenizer, tmp_path):
    async def call(url):
        return await engine(url).label_logprobs([], [5], ["1"]), await engine(url).generate([], 3, 0.0, [])

    got, _, requests = on_server(completion_texts, call)
    assert got == ([], []) and requests == []
    with pytest.raises(ValueError, match=re.escape(
        "judge: remote_input='tokens' needs the judge's tokenizer: give tokenizer= (its path or Hub id)"
    )):  # fmt: skip
        remote_judge_tokenizer(None, None, "tokens", "judge")
    assert remote_judge_tokenizer(None, None, "messages", "judge") is None
    assert remote_judge_tokenizer(tiny_tokenizer, None, "tokens", "judge") is tiny_tokenizer
    # The model names the tokenizer: loaded for token ids (`auto`, `tokens`), not for messages; a folder without one
    # is an error naming it (after transformers' own reason).
    (tmp_path / "judge").mkdir()
    tiny_tokenizer.save_pretrained(tmp_path / "judge")
    assert remote_judge_tokenizer(None, str(tmp_path / "judge"), "auto", "judge").vocab == tiny_tokenizer.vocab
    assert remote_judge_tokenizer(None, str(tmp_path / "judge"), "messages", "judge") is None
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError) as caught:
        remote_judge_tokenizer(None, str(tmp_path / "empty"), "tokens", "my_judge")
    start = f"my_judge: remote_input='tokens' needs the judge's tokenizer; {str(tmp_path / 'empty')!r} is not one ("
    assert str(caught.value).startswith(start) and str(caught.value).endswith("). Give tokenizer= (its path or Hub id).")


def test_a_remote_judge_takes_its_tokenizer_from_the_model_and_names_itself_where_it_has_none(tiny_tokenizer, tmp_path):
    """The judge's `model` (a folder with a tokenizer) gives the tokenizer of a remote judge given none: token ids
    are sent. Without model or tokenizer, `remote_input='tokens'` is refused naming the judge."""
    tiny_tokenizer.save_pretrained(tmp_path / "judge")
    env = JudgeEnvironment(str(tmp_path / "judge"), remote_url="http://127.0.0.1:1")
    assert env.tokens is True and env.tokenizer.get_vocab() == tiny_tokenizer.get_vocab()
    assert env.engine.model == str(tmp_path / "judge")
    with pytest.raises(ValueError, match="^" + re.escape(
        "named_judge: remote_input='tokens' needs the judge's tokenizer: give tokenizer= (its path or Hub id)"
    ) + "$"):  # fmt: skip
        JudgeEnvironment(remote_url="http://127.0.0.1:1", remote_input="tokens", name="named_judge")


def test_a_replaced_judges_verdict_tokens_are_checked_under_its_new_name(tiny_tokenizer):
    """`replace` builds no new judge: the verdicts of the options it changes are checked there, and a verdict that is
    not one token is refused under the replaced judge's name."""
    env = JudgeEnvironment(remote_url="http://127.0.0.1:1", tokenizer=tiny_tokenizer, name="first")
    one = tiny_tokenizer.convert_tokens_to_ids("1")  # "11" is "1" twice in the tiny tokenizer
    with pytest.raises(ValueError, match="^" + re.escape(
        f"second: the verdict '11' is 2 tokens in the judge's tokenizer [{one}, {one}]; scoring='logprobs' reads each "
        "verdict as one token (lower max_score, or use scoring='generate')"
    ) + "$"):  # fmt: skip
        env.replace(max_score=12, name="second")


def test_strip_reasoning_shows_the_judge_only_the_answer():
    """With `strip_reasoning`, a completion's `<think>...</think>` is removed before the judge sees it: the judge reads
    "4" and rates it by the server's top log-probabilities (p(7) = p(9) = .5 -> 8); without it, the reasoning is shown
    (the default)."""

    def answer(body):
        return chat_logprobs({"7": 0.5, "9": 0.5} if "\n4\n" in shown(body) else {"1": 1.0})

    texts = ["<think>The user wants 2+2, so a secret plan.</think>4"]
    rewards, _, bodies = judged(answer, texts=texts, strip_reasoning=True)
    assert rewards == pytest.approx([8.0], abs=1e-9) and "secret plan" not in shown(bodies[0])
    rewards, _, bodies = judged(answer, texts=texts)
    assert rewards == pytest.approx([1.0], abs=1e-9) and "secret plan" in shown(bodies[0])


def test_a_remote_judge_pickles_as_its_arguments_and_unpickles_the_same_judge(tiny_tokenizer):
    """AsyncGRPO pickles reward functions into a child process: a judge behind servers is rebuilt there from every
    argument it was given (model name, tokenizer, URL, both options objects and the options by name)."""
    env = JudgeEnvironment(
        "judge-model", tiny_tokenizer, remote_url="http://127.0.0.1:1", options=JudgeOptions(mode="pairwise", swap=False),
        scoring_options=ModelOptions(max_length=4000), name="pickled", timeout=7.0,
    )  # fmt: skip
    copy = pickle.loads(pickle.dumps(env))
    assert repr(copy) == "JudgeEnvironment(name='pickled', mode='pairwise', scoring='logprobs', remote_url=['http://127.0.0.1:1/v1'])"
    assert copy.options == JudgeOptions(mode="pairwise", swap=False) and copy.scoring_options == ModelOptions(max_length=4000)
    assert (copy.engine.model, copy.engine.tokens, copy.engine.max_length, copy.engine.options.timeout) == (
        "judge-model", True, 4000, 7.0
    )  # fmt: skip
    assert copy.tokenizer.get_vocab() == tiny_tokenizer.get_vocab()


def test_a_remote_judges_refused_arguments_are_one_line_each(tiny_tokenizer, caplog):
    url = "http://127.0.0.1:1"
    with pytest.raises(TypeError, match="^" + re.escape(
        "scoring_options must be a ModelOptions (how the judge model loads and runs), got ScoringOptions: a reward "
        "model's own options are no judge's"
    ) + "$"):  # fmt: skip
        JudgeEnvironment(remote_url=url, scoring_options=ScoringOptions())
    with pytest.raises(ValueError, match="^" + re.escape(
        "remote_api is the dialect of reward-model servers; a judge speaks OpenAI's API"
    ) + "$"):  # fmt: skip
        JudgeEnvironment(remote_url=url, remote_api="openrlhf")
    with pytest.raises(ValueError, match="^" + re.escape(
        "batch_size (--batch-size, reward_batch_size), overlength_reward (--overlength-reward, reward_overlength_reward), "
        "precision (--precision, reward_precision): applied by a judge loaded in this process, not by one behind "
        "servers; give them to the server or drop them"
    ) + "$"):  # fmt: skip
        JudgeEnvironment(remote_url=url, remote_input="messages", batch_size=2, precision="bf16", overlength_reward=0.0)
    one = tiny_tokenizer.convert_tokens_to_ids("1")  # "11" is "1" twice in the tiny tokenizer
    with pytest.raises(ValueError, match="^" + re.escape(
        f"big_judge: the verdict '11' is 2 tokens in the judge's tokenizer [{one}, {one}]; scoring='logprobs' reads each "
        "verdict as one token (lower max_score, or use scoring='generate')"
    ) + "$"):  # fmt: skip
        JudgeEnvironment(remote_url=url, tokenizer=tiny_tokenizer, max_score=12, name="big_judge")
    # A tokenizer given with remote_input='messages' still sends messages.
    chat = JudgeEnvironment(remote_url=url, tokenizer=tiny_tokenizer, remote_input="messages")
    assert chat.tokens is False and chat.engine.urls == [f"{url}/v1/chat/completions"]
    # Token ids are rendered here, so an over-long judgement is known here: `overlength_reward` and `max_length` apply.
    tokens = JudgeEnvironment(remote_url=url, tokenizer=tiny_tokenizer, overlength_reward=0.0, max_length=300)
    assert tokens.tokens is True and tokens.engine.max_length == 300 and tokens.overlength_reward == 0.0
    caplog.clear()
    with caplog.at_level("WARNING", logger="trl_rm_env.rewards.judge"):
        messages = JudgeEnvironment(remote_url=url, remote_input="messages", max_length=300, name="chat_judge")
    assert messages.tokens is False and messages.engine.max_length is None  # the server checks its own lengths
    assert [r.getMessage() for r in caplog.records if r.name == "trl_rm_env.rewards.judge"] == [
        "chat_judge: judgements go to the server as messages, which it renders with its own chat template: "
        "special-token text in a completion is read there as control tokens (a policy could forge the judge's turns), "
        "and verdict log-probabilities come from its top 20. Give the judge's tokenizer to send token ids."
    ]
