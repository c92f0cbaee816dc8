"""The GenRM judge mode (`JudgeEnvironment(mode="genrm")`, NeMo Gym's `genrm_compare`) end to end against a scripted
OpenAI-compatible chat server that answers chosen texts per pair: the messages it receives (roles, order, `None` for
an empty answer, the principle on and off, the policy's reasoning left out), the rewards against a plain
re-implementation of the protocol's formulas (pairs, k judges, aggregators, group shaping), and the failures (no JSON,
a dead server, `masked`). The pieces without a model (parsing, pairs, aggregation, shaping) are `test_genrm.py`'s."""

from __future__ import annotations

import asyncio
import copy
import itertools
import json
import socket
import threading
import time
from contextlib import contextmanager

import pytest
from aiohttp import web

from trl_rm_env import JudgeEnvironment
from trl_rm_env.rewards.shaping import style_density
from trl_rm_env.serving.client.pool import RemoteScoringError

WIN_POINTS = {1: 1.0, 2: 0.75, 3: 0.6, 4: 0.4, 5: 0.25, 6: 0.0}


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
    runner = web.AppRunner(app, shutdown_timeout=1.0)  # a hanging handler is not waited for
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


def answer_of(text: str) -> tuple[str, str]:
    """(reasoning, answer) as the protocol reads a policy completion."""
    if "</think>" in text:
        reasoning, _, answer = text.rpartition("</think>")
        return reasoning.replace("<think>", "", 1).strip(), answer.lstrip()
    return "", text


def centred(values):
    low, high = min(values), max(values)
    if low == high:
        return [0.0] * len(values)
    raw = [1 - (v - low) / (high - low) for v in values]
    return [w - sum(raw) / len(raw) for w in raw]


def reference(texts, strategy="circular", k=1, aggregator="simple_tiebreaker", shaping=None):
    """The protocol's rewards for one group, written out plainly from the formulas (NeMo Gym's, as issue 38 states
    them); `shaping`: Gym's bonuses and coefficients."""
    n = len(texts)
    if n == 1:
        return [3.0]
    pairs = [(i, (i + 1) % n) for i in range(n)] if strategy == "circular" else list(itertools.combinations(range(n), 2))
    received = [[] for _ in range(n)]
    answers = [answer_of(t)[1] for t in texts]
    for i, j in pairs:
        for _ in range(k):
            v = verdict_for(answers[i], answers[j])
            s1, s2, r = float(v["score_1"]), float(v["score_2"]), float(v["ranking"])
            if aggregator == "weighted_win_loss":
                s1 = WIN_POINTS[min(6, max(1, round(r)))]
                s2 = 1 - s1
            elif aggregator == "simple_tiebreaker" and s1 == s2:
                s1, s2 = s1 + (3.5 - r), s2 - (3.5 - r)
            received[i].append(s1)
            received[j].append(s2)
    scores = [sum(r) / len(r) if r else 3.0 for r in received]
    if not shaping:
        return scores
    reasonings = [answer_of(t)[0] for t in texts]
    threshold = sorted(scores, reverse=True)[max(0, int(n * shaping["top_percentile"]) - 1)]
    for bonus, parts in ((shaping["reasoning_bonus"], reasonings), (shaping["answer_bonus"], answers)):
        lengths = [(len(p.strip()), i) for i, p in enumerate(parts) if p.strip()]
        if bonus > 0 and lengths and scores[min(lengths)[1]] >= threshold:
            scores[min(lengths)[1]] += bonus
    for coeff, parts in ((shaping["reasoning_length_coeff"], reasonings), (shaping["answer_length_coeff"], answers)):
        if coeff > 0:
            scores = [s + coeff * w for s, w in zip(scores, centred([len(p.strip()) for p in parts]))]
    if shaping["style_coeff"] > 0:
        weights = centred([style_density(a) for a in answers])
        scores = [s + shaping["style_coeff"] * w for s, w in zip(scores, weights)]
    return scores


def turns(completions):
    """Completions as TRL passes them with conversational prompts: one assistant message each."""
    return [[{"role": "assistant", "content": c}] if isinstance(c, str) else c for c in completions]


def rewards_of(env, completions=ANSWERS, prompts=GROUPS, **kwargs):
    logged = {}
    out = asyncio.run(env(list(prompts), turns(completions), log_metric=logged.__setitem__, **kwargs))
    return out, logged


SUPER = {"reasoning_bonus": 0.5, "answer_bonus": 0.5, "top_percentile": 0.2, "reasoning_length_coeff": 0.3,
         "answer_length_coeff": 0.35, "style_coeff": 0.05}  # fmt: skip


@pytest.mark.parametrize("strategy", ["circular", "all_pairs"])
@pytest.mark.parametrize("k", [1, 3])
@pytest.mark.parametrize("aggregator", ["simple_tiebreaker", "individual_scores", "weighted_win_loss"])
@pytest.mark.parametrize("shaping", [None, SUPER], ids=["plain", "super_shaping"])
def test_rewards_equal_the_protocols_formulas(strategy, k, aggregator, shaping):
    with scripted_genrm(genrm_text) as (url, bodies):
        env = JudgeEnvironment(
            "genrm", remote_url=url, remote_input="messages", mode="genrm", comparison_strategy=strategy,
            judges_per_comparison=k, aggregator=aggregator, temperature=0.6, top_p=0.95, **(shaping or {}),
        )  # fmt: skip
        got, logged = rewards_of(env)
    want = reference(ANSWERS[:4], strategy, k, aggregator, shaping) + reference(ANSWERS[4:], strategy, k, aggregator, shaping)
    assert got == pytest.approx(want, abs=1e-9)
    per_group = {"circular": 4 + 2, "all_pairs": 6 + 1}[strategy] * k
    assert len(bodies) == per_group and logged["judge_env/num_judgements"] == per_group
    assert logged["judge_env/num_failed"] == 0
    assert {b["temperature"] for b in bodies} == {0.6} and {b["top_p"] for b in bodies} == {0.95}
    copies = {}
    for body in bodies:  # the k judges of one pair are sampled apart
        copies.setdefault(json.dumps(body["messages"]), set()).add(body["seed"])
    assert all(len(seeds) == k for seeds in copies.values())


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
        assert [m["role"] for m in bodies[0]["messages"]] == ["system", "user", "principle", "response_1", "response_2"]
        assert bodies[0]["messages"][2]["content"] == "Be exact."  # the row's, before the default
        bodies.clear()
        rewards_of(principled, completions, [OTHER, OTHER], rule=[None, None])
        assert bodies[0]["messages"][2] == {"role": "principle", "content": "Be concise."}


def test_unparseable_answers_are_retried_then_neutral_and_counted():
    asked = []

    def answer(messages, body):
        asked.append(messages[-1]["content"])
        return "no verdict here" if messages[-2]["content"] == "Gravity." else genrm_text(messages, body)

    with scripted_genrm(answer) as (url, _):
        env = JudgeEnvironment(remote_url=url, remote_input="messages", mode="genrm", parse_retries=3)
        got, logged = rewards_of(env, ANSWERS[:2], [PROMPT, PROMPT])
    assert len(asked) == 1 + 4  # circular over 2: (0, 1) parsed; (1, 0) asked 4 times, then (3, 3, 3.5)
    v = verdict_for(answer_of(ANSWERS[0])[1], "Gravity.")
    s1, s2 = float(v["score_1"]), float(v["score_2"])
    if s1 == s2:
        s1, s2 = s1 + 3.5 - v["ranking"], s2 - 3.5 + v["ranking"]
    assert got == pytest.approx([(s1 + 3.0) / 2, (s2 + 3.0) / 2], abs=1e-9)
    assert logged["judge_env/num_failed"] == 1 and logged["judge_env/num_retried"] == 3


def test_a_failed_request_is_neutral_at_once_or_masks_its_responses():
    def answer(messages, body):
        return 500 if messages[-2]["content"] == "Gravity." else genrm_text(messages, body)

    with scripted_genrm(answer) as (url, bodies):
        neutral = JudgeEnvironment(remote_url=url, remote_input="messages", mode="genrm", retries=0)
        got, logged = rewards_of(neutral, ANSWERS[:3], [PROMPT] * 3)
        assert len(bodies) == 3 and logged["judge_env/num_failed"] == 1  # no retry of a failed request
        masked = JudgeEnvironment(remote_url=url, remote_input="messages", mode="genrm", retries=0,
                                  failed_judgement="masked")  # fmt: skip
        got_masked, _ = rewards_of(masked, ANSWERS[:3], [PROMPT] * 3)
    # circular over 3: (0,1) ok, (1,2) failed, (2,0) ok.
    assert got_masked[0] is not None and got_masked[1] is None and got_masked[2] is None
    assert got[0] == pytest.approx(got_masked[0], abs=1e-9) and got[1] is not None


def test_a_group_of_one_gets_default_score_and_options_of_genrm_are_refused_elsewhere():
    with scripted_genrm(genrm_text) as (url, bodies):
        env = JudgeEnvironment(remote_url=url, remote_input="messages", mode="genrm", default_score=2.5)
        got, _ = rewards_of(env, ["Alone."], [PROMPT])
    assert got == [2.5] and not bodies
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
    rewards are the protocol's with the Super stage's sampling and shaping (its server swapped for the scripted one)."""
    import yaml
    from trl_rm_env.recipes.grpo_args import RewardModelArguments

    config = yaml.safe_load((repo_root / "recipes" / "configs" / "grpo_genrm.yaml").read_text())
    args = RewardModelArguments(**{k: v for k, v in config.items() if k.startswith("reward_")})
    kwargs = args.judge_kwargs()
    assert kwargs["mode"] == "genrm" and kwargs["remote_input"] == "messages" and kwargs["reasoning_bonus"] == 0.5
    with scripted_genrm(genrm_text) as (url, bodies):
        env = JudgeEnvironment(args.reward_judge, **{**kwargs, "remote_url": [url]})
        got, _ = rewards_of(env)
    assert got == pytest.approx(reference(ANSWERS[:4], shaping=SUPER) + reference(ANSWERS[4:], shaping=SUPER), abs=1e-9)
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
    with pytest.raises(RemoteScoringError, match=rf"every request of this call to the judge servers failed \(4\).*{url}"):
        rewards_of(env, ANSWERS[:4], [PROMPT] * 4)
    with scripted_genrm(lambda messages, body: 503) as (url, _):  # a server that answers, but never with a verdict
        env = JudgeEnvironment(remote_url=url, remote_input="messages", mode="genrm", retries=1, backoff=0.01)
        with pytest.raises(RemoteScoringError, match=r"every request .* failed \(4\).*503"):
            rewards_of(env, ANSWERS[:4], [PROMPT] * 4)


def test_a_hanging_genrm_server_times_out_naming_it_and_the_timeout_not_a_silent_wait():
    with scripted_genrm(lambda messages, body: 30.0) as (url, bodies):  # accepts, then never answers in time
        env = JudgeEnvironment(remote_url=url, remote_input="messages", mode="genrm", retries=1, backoff=0.01,
                               timeout=0.5)  # fmt: skip
        started = time.monotonic()
        with pytest.raises(RemoteScoringError, match=rf"every request .* failed \(2\).*{url}.*timed out \(2 times\)"):
            rewards_of(env, ANSWERS[:2], [PROMPT] * 2)
        assert time.monotonic() - started < 10  # two tries of 0.5 s each, concurrently: bounded, not 30 s
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
