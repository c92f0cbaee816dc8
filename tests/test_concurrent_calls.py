"""Two calls of one remote reward in flight at once, as AsyncGRPO makes them: each gets its own rewards, metrics and
results (`Reward.call`), none of them read back from the shared object. The servers are scripted aiohttp apps in
this process that hold the first call's answers until the second call has been answered, so the two calls overlap
for certain; the rewards expected are the scripted scores, written down by hand."""

from __future__ import annotations

import ast
import asyncio
import json
from pathlib import Path

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from trl_rm_env import JudgeEnvironment, RewardModelEnvironment

PACKAGE = Path(__file__).resolve().parent.parent / "trl_rm_env"
SCORES = {"slow-1": 1.0, "slow-nan": None, "fast-1": 3.0, "fast-2": 4.0, "fast-nan": None}
"""The scripted reward model: a completion's text -> its score (None: the server's null, an item's NaN)."""


def user(text):
    return [{"role": "user", "content": text}]


def assistant(text):
    return [{"role": "assistant", "content": text}]


def overlapping(answer):
    """Run `check(url)` against a server that answers every POST with `answer(body)`, holding each answer whose body
    says "slow" until an answer without it has gone out."""
    fast_answered = asyncio.Event()

    async def handle(request: web.Request) -> web.Response:
        body = await request.json()
        text = json.dumps(body)
        if "slow" in text:
            await asyncio.wait_for(fast_answered.wait(), timeout=30)
        reply = web.Response(text=json.dumps(answer(body)), content_type="application/json")
        if "slow" not in text:
            fast_answered.set()
        return reply

    def run(check):
        async def main():
            app = web.Application()
            app.router.add_route("POST", "/{tail:.*}", handle)
            async with TestServer(app, host="127.0.0.1") as server:
                return await check(str(server.make_url("")).rstrip("/"))

        return asyncio.run(main())

    return run


def test_two_concurrent_calls_of_a_remote_reward_model_each_get_their_own_rewards_and_metrics():
    """Call A (held by the server: one score and one NaN) and call B (answered first: three scores, one NaN in a
    different place) awaited together: each its own rewards, its own NaN count and its own mean."""

    def pooled(body):
        return {"data": [{"data": [SCORES[body["messages"][-1]["content"]]]}]}

    async def check(url):
        env = RewardModelEnvironment(remote_url=url, remote_input="messages", nonfinite_reward=-9.0)
        logged_a, logged_b = {}, {}
        a = env([user("qa")] * 2, [assistant("slow-1"), assistant("slow-nan")],
                log_metric=logged_a.__setitem__)  # fmt: skip
        b = env([user("qb")] * 3, [assistant("fast-nan"), assistant("fast-1"), assistant("fast-2")],
                log_metric=logged_b.__setitem__)  # fmt: skip
        return await asyncio.gather(a, b), logged_a, logged_b, env.num_nonfinite

    (rewards_a, rewards_b), logged_a, logged_b, total = overlapping(pooled)(check)
    assert rewards_a == [1.0, -9.0] and rewards_b == [-9.0, 3.0, 4.0]
    assert logged_a["reward_model_env/num_nonfinite"] == 1.0 and logged_b["reward_model_env/num_nonfinite"] == 1.0
    assert logged_a["reward_model_env/num_samples"] == 2.0 and logged_b["reward_model_env/num_samples"] == 3.0
    assert logged_a["reward_model_env/mean_reward"] == pytest.approx((1.0 - 9.0) / 2, abs=1e-6)
    assert logged_b["reward_model_env/mean_reward"] == pytest.approx((-9.0 + 3.0 + 4.0) / 3, abs=1e-6)  # fp32
    assert total == 2  # the environment's running count: both calls'


def test_two_concurrent_calls_of_a_remote_judge_each_get_their_own_judgements():
    """A pointwise judge read by log-probabilities: the server puts all its mass on one rating per completion (the
    rating written in `RATINGS` for the answer it is shown), so each reward is that rating. Call A (held: 2
    completions) and call B (answered first: 3 completions) each return their own rewards, judgement count and
    judgements."""
    ratings = {"slow-two": "2", "slow-seven": "7", "fast-three": "3", "fast-five": "5", "fast-six": "6"}

    def rated(body):
        (message,) = body["messages"]
        digit = next(r for answer, r in ratings.items() if answer in message["content"])
        top = [{"token": digit, "logprob": 0.0}]
        return {"choices": [{"index": 0, "message": {"role": "assistant", "content": digit},
                             "logprobs": {"content": [{"token": digit, "top_logprobs": top}]}}]}  # fmt: skip

    async def check(url):
        judge = JudgeEnvironment(remote_url=url, remote_input="messages")
        logged_a, logged_b = {}, {}
        a = judge.call([user("question A")] * 2, [assistant("slow-two"), assistant("slow-seven")],
                       log_metric=logged_a.__setitem__)  # fmt: skip
        b = judge.call([user("question B")] * 3, [assistant(t) for t in ("fast-three", "fast-five", "fast-six")],
                       log_metric=logged_b.__setitem__)  # fmt: skip
        return await asyncio.gather(a, b), logged_a, logged_b

    (call_a, call_b), logged_a, logged_b = overlapping(rated)(check)
    assert call_a.rewards == [2.0, 7.0] and call_b.rewards == [3.0, 5.0, 6.0]
    assert logged_a["judge_env/num_judgements"] == 2.0 and logged_b["judge_env/num_judgements"] == 3.0
    assert [j.samples for j in call_a.judgements] == [(0,), (1,)]
    assert [j.samples for j in call_b.judgements] == [(0,), (1,), (2,)]


def test_no_reward_scorer_or_judge_keeps_a_calls_results_on_itself():
    """A call's results are returned (`ScoredPairs`, `RewardCall`): no `self.last_*` (or `self._last_*`) attribute is
    assigned anywhere in the package, where a concurrent call would overwrite it."""
    found = [
        f"{path.relative_to(PACKAGE.parent)}:{node.lineno} self.{target.attr}"
        for path in sorted(PACKAGE.rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign)
        for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
        if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == "self"
        and target.attr.lstrip("_").startswith("last_")
    ]  # fmt: skip
    assert not found, found
