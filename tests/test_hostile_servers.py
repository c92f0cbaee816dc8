"""Servers that answer what they should not: a GenRM whose verdict leaves the protocol's ranges, and a judge or
reward-model server that answers 200 with a body that is not JSON (an HTML page from a proxy).

Expected rewards are worked out by hand from NeMo Gym's `genrm_compare` (`resources_servers/genrm_compare/utils.py`:
the circle of pairs, the mean of what each response received, the tie-break `3.5 - ranking` on equal scores) and
written down as literals. The servers are scripted aiohttp apps in this process (no model loads), so every test here
is fast.
"""

from __future__ import annotations

import asyncio
import json
import logging

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from trl_rm_env import JudgeEnvironment, RewardModelEnvironment
from trl_rm_env.judges.genrm import GenRM, out_of_range, parse_genrm_verdict, written_verdict
from trl_rm_env.judges.judge_options import JudgeOptions
from trl_rm_env.serving.client.pool import RemoteScoringError

PROMPT = [{"role": "user", "content": "Explain tides."}]
ANSWERS = ["The moon pulls the water.", "Gravity.", "Sun and moon.", "Tides rise and fall twice a day."]
HOSTILE = {"score_1": 100, "score_2": -7, "ranking": 42}  # what a scripted hostile GenRM answered in review


def completions(texts):
    return [[{"role": "assistant", "content": t}] for t in texts]


def serve(answer):
    """Run `check(url, bodies)` against a scripted server: `answer(body)` returns `(status, text, content_type)` for
    every POST, whatever its path. Returns a function that runs a coroutine `check` with the server up."""
    bodies: list[dict] = []

    async def handle(request: web.Request) -> web.Response:
        bodies.append(await request.json())
        status, text, content_type = answer(bodies[-1])
        return web.Response(status=status, text=text, content_type=content_type)

    def run(check):
        async def main():
            app = web.Application()
            app.router.add_route("POST", "/{tail:.*}", handle)
            async with TestServer(app, host="127.0.0.1") as server:
                return await check(str(server.make_url("")).rstrip("/"), bodies)

        return asyncio.run(main())

    return run


def genrm_answer(verdict: dict):
    """A chat server whose GenRM always writes `verdict` (as NeMo Gym's prompt asks: a fenced JSON block)."""
    text = f"Both answers considered.\n```json\n{json.dumps(verdict)}\n```"
    reply = json.dumps({"choices": [{"index": 0, "message": {"role": "assistant", "content": text}}]})
    return lambda body: (200, reply, "application/json")


def judge_rewards(answer, texts=ANSWERS, **options):
    """A GenRM judge's rewards of one group against the scripted server, its logged metrics and the request bodies."""

    async def check(url, bodies):
        logged = {}
        env = JudgeEnvironment(remote_url=url, remote_input="messages", mode="genrm", **options)
        rewards = await env([PROMPT] * len(texts), completions(texts), log_metric=logged.__setitem__)
        return rewards, logged, list(bodies)

    return serve(answer)(check)


# ------------------------------------------------------------------------------------------ verdicts out of range


@pytest.mark.parametrize(
    "text, outside",
    [
        ('{"score_1": 1, "score_2": 5, "ranking": 1}', {}),  # the protocol's bounds are in range
        ('{"score_1": 5, "score_2": 1, "ranking": 6}', {}),
        ('{"ranking": 2.5}', {}),
        ('{"score_1": 5.5, "score_2": 3, "ranking": 2}', {"score_1": 5.5}),
        ('{"score_1": 3, "score_2": 0.99, "ranking": 2}', {"score_2": 0.99}),
        ('{"score_1": 3, "score_2": 3, "ranking": 6.01}', {"ranking": 6.01}),
        ('{"ranking": 0}', {"ranking": 0.0}),
        (json.dumps(HOSTILE), {"score_1": 100.0, "score_2": -7.0, "ranking": 42.0}),
    ],
)
def test_out_of_range_names_what_the_verdict_wrote_outside_the_protocol(text, outside):
    """Scores 1-5 and ranking 1-6 (the protocol's ranges, NeMo Gym's `GenRMOutputParseError` docstring); only the
    values the verdict writes are held to them, a missing key's default is not."""
    assert out_of_range(written_verdict(text)) == outside


def test_a_missing_key_is_not_held_to_the_range_but_a_written_one_is():
    """`default_score=0` (outside 1-5) fills a missing `score_2` without making the verdict out of range."""
    judge = JudgeOptions(mode="genrm", default_score=0.0)
    found = GenRM().from_text((0, 1), '{"score_1": 4, "ranking": 2}', judge)
    assert (found.score_1, found.score_2, found.ranking) == (4.0, 0.0, 2.0)
    assert GenRM().from_text((0, 1), '{"score_1": 4, "score_2": 0, "ranking": 2}', judge) is None


def test_gyms_parser_still_reads_any_finite_value():
    """`parse_genrm_verdict` stays NeMo Gym's `parse_genrm_output` (ranges unchecked): the judge holds the ranges."""
    assert parse_genrm_verdict(json.dumps(HOSTILE)) == (100.0, -7.0, 42.0)


def test_a_hostile_verdict_is_no_verdict_asked_again_then_neutral(caplog, monkeypatch):
    """Circular over 4: 4 comparisons, each asked 1 + parse_retries = 3 times, then NeMo Gym's neutral (3, 3, 3.5):
    equal scores, tie-break 3.5 - 3.5 = 0, so each response receives 3 from both its comparisons: [3, 3, 3, 3]. The
    review's hostile server got 46.5 for every sample ((100 - 7) / 2). Warned once, naming the values."""
    monkeypatch.setattr("trl_rm_env.judges.genrm._warned_ranges", [])
    with caplog.at_level(logging.WARNING, logger="trl_rm_env.judges.genrm"):
        rewards, logged, bodies = judge_rewards(genrm_answer(HOSTILE), parse_retries=2)
    warned = [r.getMessage() for r in caplog.records if "outside the genrm_compare ranges" in r.getMessage()]
    assert len(warned) == 1 and "score_1=100, score_2=-7, ranking=42" in warned[0]
    assert rewards == [3.0, 3.0, 3.0, 3.0]
    assert len(bodies) == 12
    assert logged["judge_env/num_failed"] == 4 and logged["judge_env/num_retried"] == 8
    assert logged["judge_env/num_unparsed"] == 4


def test_changed_defaults_are_the_failed_comparisons_verdict():
    """All pairs over 3 (0-1, 0-2, 1-2), every verdict out of range, `default_score=2`, `default_ranking=2.5`: each
    failed comparison is (2, 2, 2.5), a tie, so response 1 gets 2 + (3.5 - 2.5) = 3 and response 2 gets 2 - 1 = 1.
    Sample 0 is response 1 twice: 3; sample 1 is response 2 then response 1: (1 + 3) / 2 = 2; sample 2 is response 2
    twice: 1."""
    rewards, logged, _ = judge_rewards(
        genrm_answer({"score_1": 9, "score_2": 2, "ranking": 2}), ANSWERS[:3], comparison_strategy="all_pairs",
        default_score=2.0, default_ranking=2.5, parse_retries=0,
    )  # fmt: skip
    assert rewards == [3.0, 2.0, 1.0]
    assert logged["judge_env/num_failed"] == 3


def test_a_hostile_verdict_masks_its_samples_when_failures_are_masked():
    rewards, logged, _ = judge_rewards(genrm_answer(HOSTILE), failed_judgement="masked", parse_retries=1)
    assert rewards == [None, None, None, None]
    assert logged["judge_env/num_failed"] == 4


def test_verdict_ranges_any_takes_a_genrm_with_other_ranges_at_its_word():
    """`verdict_ranges="any"`: the values as written, as NeMo Gym's parser takes them. Circular over 4, every verdict
    (100, -7, 42): no tie, each response gets 100 as response 1 and -7 as response 2, so (100 - 7) / 2 = 46.5."""
    rewards, logged, bodies = judge_rewards(genrm_answer(HOSTILE), verdict_ranges="any")
    assert rewards == [46.5, 46.5, 46.5, 46.5]
    assert len(bodies) == 4 and logged["judge_env/num_failed"] == 0


def test_an_out_of_range_first_answer_is_asked_again_and_the_retry_counts():
    """The first answer to each comparison is out of range, the retry writes (4, 2, 2): circular over 2, comparisons
    (0, 1) and (1, 0): sample 0 receives 4 then 2, sample 1 receives 2 then 4: [3, 3]; 2 retries in all."""
    asked: dict[str, int] = {}

    def answer(body):
        key = json.dumps(body["messages"])
        asked[key] = asked.get(key, 0) + 1
        verdict = HOSTILE if asked[key] == 1 else {"score_1": 4, "score_2": 2, "ranking": 2}
        return genrm_answer(verdict)(body)

    rewards, logged, bodies = judge_rewards(answer, ANSWERS[:2])
    assert rewards == [3.0, 3.0]
    assert len(bodies) == 4 and logged["judge_env/num_retried"] == 2 and logged["judge_env/num_failed"] == 0


def test_verdict_ranges_is_a_genrm_option():
    with pytest.raises(ValueError, match="verdict_ranges: options of another mode"):
        JudgeOptions(mode="pairwise", verdict_ranges="any")
    with pytest.raises(ValueError, match="verdict_ranges"):
        JudgeOptions(mode="genrm", verdict_ranges="loose")


# ------------------------------------------------------------------------------------------ bodies that are not JSON

HTML = "<html>\n  <head><title>Proxy</title></head>\n  <body>Sign in to continue</body>\n</html>\n"


def not_json(body):
    return 200, HTML, "text/html"


def assert_one_line_naming(error: BaseException, url: str, status: int = 200) -> None:
    message = str(error)
    assert "\n" not in message, message
    assert url in message and f"HTTP {status}" in message and "not JSON" in message, message
    assert "<html> <head><title>Proxy</title></head>" in message, message  # the body's start, on one line


def test_a_judge_server_answering_html_is_one_line_naming_it():
    async def check(url, bodies):
        env = JudgeEnvironment(remote_url=url, remote_input="messages", mode="pointwise", scoring="generate")
        with pytest.raises(RemoteScoringError) as caught:
            await env([PROMPT, PROMPT], completions(ANSWERS[:2]))
        return caught.value, len(bodies)

    error, requests = serve(not_json)(check)
    assert_one_line_naming(error, "/v1/chat/completions")
    assert error.status == 200
    assert requests <= 2  # not retried: one request per judgement at most before the first error stops the call


def test_a_genrm_server_answering_html_fails_the_call_naming_it():
    """A GenRM keeps failed requests as failed judgements; when every request of a call fails, the call fails, naming
    the server, the status and the body's start."""

    async def check(url, bodies):
        env = JudgeEnvironment(remote_url=url, remote_input="messages", mode="genrm")
        with pytest.raises(RemoteScoringError) as caught:
            await env([PROMPT] * 2, completions(ANSWERS[:2]))
        return caught.value, len(bodies)

    error, requests = serve(not_json)(check)
    assert_one_line_naming(error, "/v1/chat/completions")
    assert requests == 2  # the two comparisons of the circle, neither retried


def test_a_reward_model_server_answering_html_is_one_line_naming_it():
    async def check(url, bodies):
        env = RewardModelEnvironment(remote_url=url, remote_input="messages", retries=3)
        with pytest.raises(RemoteScoringError) as caught:
            await env([PROMPT], completions(ANSWERS[:1]))
        return caught.value, len(bodies)

    error, requests = serve(not_json)(check)
    assert_one_line_naming(error, "/pooling")
    assert requests == 1  # a proxy's page is not a busy server: not retried


def test_an_empty_200_body_is_named_as_empty():
    async def check(url, bodies):
        env = RewardModelEnvironment(remote_url=url, remote_input="messages")
        with pytest.raises(RemoteScoringError, match=r"HTTP 200 with a body that is not JSON: an empty body$"):
            await env([PROMPT], completions(ANSWERS[:1]))

    serve(lambda body: (200, "", "application/json"))(check)


def test_an_error_page_is_reported_on_one_line():
    """A 403 from a proxy (HTML, several lines) is refused in one line with the page's start."""

    async def check(url, bodies):
        env = RewardModelEnvironment(remote_url=url, remote_input="messages")
        with pytest.raises(RemoteScoringError) as caught:
            await env([PROMPT], completions(ANSWERS[:1]))
        return caught.value

    error = serve(lambda body: (403, HTML, "text/html"))(check)
    assert "\n" not in str(error) and "refused the request: HTTP 403" in str(error) and error.status == 403
    assert "<html> <head><title>Proxy</title></head>" in str(error)
