"""The multi-process arithmetic of whole GRPO groups and of bounded training forwards, held in one process with a
fake world, so the fast loop (`pytest -m "not slow"`) holds what the slow 2-process launches check end to end
(tests/test_genrm_judge.py and tests/test_quickstart.py for the GenRM; tests/test_distributed.py for
`pack_max_tokens` under ZeRO-3 and FSDP2):

- `trl_rm_env.rewards.whole_groups`: `whole_call` and `shared_values` are generators whose exchanges are `Gather`
  requests; here each process's generator is run in lockstep with the others (`lockstep`) and every request answered
  with every process's value in rank order, as `gather_objects` would (`rank` monkeypatched per process). The merged
  samples, the shifted `to_score`/`empty`, each process's `offset` and the errors are checked against literals; a
  request's answer (`gather`: `gather_objects` stubbed, awaited off the event loop's thread for an asynchronous call)
  and the reward function's own group (`torch.distributed.new_group` stubbed: a gloo group).
- `JudgeEnvironment._steps` under a fake world of 2 (`world_size`, `rank` and `own_group` monkeypatched): a judge
  behind a server that is never reached, its engine requests answered here with scripted verdicts that depend on the
  two answers compared. The two processes' rewards, concatenated, equal one process judging the whole batch, sample
  by sample, with groups split between the processes, and every comparison is asked once over both.
- `BoundedForwardsMixin._forwards` and `_chunked_training_step` on a fake trainer (a base whose `training_step`
  records the `loss_weight` it is given, as `RankedRewardTrainer.compute_loss` uses it) and a fake accelerator whose
  `gather` adds another process's `[chunks, pairs]`: the forwards each process runs, each chunk's weight and where
  gradients only accumulate, against weights worked out by hand from the module's rule; the model each chunk's
  forward and attention get, the whole batch's pairs handed to the metrics (margins and TRL's centring term, by
  hand), a step without any pair refused, and every tensor moved to the scores' device (the meta device standing in
  for an accelerator, the loss stubbed since meta tensors hold no data).

Fast: no process group, no launch, no network (the judge's server is never called), no model, one torch thread
(`one_torch_thread`); a few ms a test.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
import math
import threading
from types import SimpleNamespace

import pytest
import torch

from trl_rm_env import JudgeEnvironment
from trl_rm_env.rewards import base as base_module
from trl_rm_env.rewards import judge as judge_module
from trl_rm_env.rewards import whole_groups
from trl_rm_env.rewards.judge import JudgeCall
from trl_rm_env.rewards.whole_groups import Gather, _raise_any, processes, shared_values, whole_call
from trl_rm_env.runtime.engines.contract import Generate, LabelLogprobs
from trl_rm_env.trainer.bounded_forwards import SCORES_OUT, BoundedForwardsMixin, ScoresOut


@pytest.fixture(autouse=True)
def one_torch_thread():
    """Tensors of a few elements: one intra-op thread. Two threads on a busy 2-core box spin against other work
    (`repeat_interleave` in `ranked_pairs` took 13 ms a call that way, 0.1 ms alone)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


NOWHERE = "http://127.0.0.1:9"  # the judges' server: never reached, their engine requests are answered here


# ---------------------------------------------------------------------------------------------------- a fake world
class FakeWorld:
    """`world_size`, `rank` and `own_group` of `size` processes, `current` being the one whose generator runs."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, size: int):
        self.size, self.current, self.groups_made = size, 0, 0
        monkeypatch.setattr(whole_groups, "world_size", lambda: self.size)
        monkeypatch.setattr(whole_groups, "rank", lambda: self.current)
        monkeypatch.setattr(judge_module, "own_group", self._own_group)

    def _own_group(self):
        self.groups_made += 1
        return "the judge's own group"


def lockstep(world: FakeWorld, steps: list, answer=None) -> tuple[list, list[str]]:
    """Run every process's generator (`steps[rank]`) to its end, answering its engine requests with `answer(rank,
    request)` (an exception it raises is thrown into the generator, as `Reward._drive_sync` does) and its `Gather`
    requests, once every process has made one, with every process's value in rank order (each process its own copy,
    as pickled by `gather_objects`). Returns each process's result (a judge's: its rewards), or the exception it raised,
    and the `what` of each exchange."""
    results: list = [None] * len(steps)
    exchanges: list[str] = []

    def advance(r: int, value, first: bool):
        steps_r = steps[r]
        try:
            world.current = r
            request = next(steps_r) if first else steps_r.send(value)
            while not isinstance(request, Gather):
                try:
                    reply = answer(r, request)
                except Exception as err:
                    world.current = r
                    request = steps_r.throw(err)
                else:
                    world.current = r
                    request = steps_r.send(reply)
            return request
        except StopIteration as done:  # a judge's `JudgeCall`: its rewards, what TRL receives
            results[r] = done.value.rewards if isinstance(done.value, JudgeCall) else done.value
        except Exception as err:
            results[r] = err
        return None

    requests = [advance(r, None, True) for r in range(len(steps))]
    while any(request is not None for request in requests):
        left = [r for r, request in enumerate(requests) if request is None]
        assert not left, f"processes {left} left while the others wait on an exchange: they would hang"
        whats = {request.what for request in requests}
        assert len(whats) == 1, f"the processes are in different exchanges: {whats}"
        exchanges.append(whats.pop())
        values = [request.value for request in requests]
        requests = [advance(r, copy.deepcopy(values), False) for r in range(len(steps))]
    return results, exchanges


# ---------------------------------------------------------------------------------------------------- whole_call
def share(prompts, completions, rules, to_score, empty):
    return {"prompts": prompts, "completions": completions, "columns": {"rule": rules}, "to_score": to_score,
            "empty": empty}  # fmt: skip


# Process 0 holds 3 samples, process 1 holds 5 (uneven shares; group "p1" spans both).
TWO = [
    share(["p0", "p0", "p1"], ["a", "b", "c"], ["r0", "r0", "r1"], [0, 2], [1]),
    share(
        ["p1", "p1", "p1", "p2", "p2"], ["d", "e", "f", "g", "h"], ["r1", "r1", "r1", "r2", "r2"], [0, 1, 3, 4], [2]
    ),
]


def calls_of(world: FakeWorld, shares: list[dict], errors=None) -> list:
    world.size = len(shares)
    errors = errors or [None] * len(shares)
    steps = [whole_call(s["prompts"], s["completions"], s["columns"], s["to_score"], s["empty"], len(shares),
                        "sharing", errors[r]) for r, s in enumerate(shares)]  # fmt: skip
    results, exchanges = lockstep(world, steps)
    assert exchanges == ["sharing"]  # one exchange per call
    return results


def test_whole_call_merges_two_uneven_shares_in_rank_order_each_process_at_its_offset(monkeypatch):
    world = FakeWorld(monkeypatch, 2)
    calls = calls_of(world, TWO)
    for r, call in enumerate(calls):
        assert call.prompts == ["p0", "p0", "p1", "p1", "p1", "p1", "p2", "p2"]
        assert call.completions == ["a", "b", "c", "d", "e", "f", "g", "h"]
        assert call.columns == {"rule": ["r0", "r0", "r1", "r1", "r1", "r1", "r2", "r2"]}
        # process 0's indices as they were (base 0), process 1's shifted by process 0's 3 samples (base 3)
        assert call.to_score == [0, 2, 3, 4, 6, 7]
        assert call.empty == [1, 5]
        assert (call.rank, call.world) == (r, 2)
    # where each process's own samples start in the merged lists: process 0 first, process 1 after its 3
    assert [call.offset for call in calls] == [0, 3]
    for r, call in enumerate(calls):  # each process's own slice is its own share
        own = slice(call.offset, call.offset + len(TWO[r]["prompts"]))
        assert call.completions[own] == TWO[r]["completions"]


@pytest.mark.parametrize(
    ("shares", "merged_to_score", "merged_empty", "offsets"),
    [
        # sizes 2, 1, 3: bases 0, 2, 3
        (
            [
                share(["x", "x"], ["a", "b"], [1, 1], [0, 1], []),
                share(["x"], ["c"], [1], [], [0]),
                share(["y", "y", "y"], ["d", "e", "f"], [2, 2, 2], [0, 2], [1]),
            ],
            [0, 1, 3, 5],
            [2, 4],
            [0, 2, 3],
        ),
        # sizes 2, 0, 3 (a process with no sample): bases 0, 2, 2
        (
            [
                share(["x", "x"], ["a", "b"], [1, 1], [1], [0]),
                share([], [], [], [], []),
                share(["y", "y", "y"], ["d", "e", "f"], [2, 2, 2], [0, 1, 2], []),
            ],
            [1, 2, 3, 4],
            [0],
            [0, 2, 2],
        ),
    ],
    ids=["sizes-2-1-3", "sizes-2-0-3"],
)
def test_whole_call_in_three_processes(monkeypatch, shares, merged_to_score, merged_empty, offsets):
    world = FakeWorld(monkeypatch, 3)
    calls = calls_of(world, shares)
    completions = [c for s in shares for c in s["completions"]]
    for r, call in enumerate(calls):
        assert call.completions == completions and call.to_score == merged_to_score and call.empty == merged_empty
        assert (call.rank, call.world) == (r, 3)
    assert [call.offset for call in calls] == offsets


def test_one_process_keeps_its_own_call_without_an_exchange(monkeypatch):
    FakeWorld(monkeypatch, 1)
    steps = whole_call(["p"], ["a"], {"rule": ["r"]}, [0], [], 1, "sharing")
    with pytest.raises(StopIteration) as done:
        next(steps)  # nothing asked
    call = done.value.value
    assert (call.prompts, call.completions, call.columns, call.to_score, call.empty) == (["p"], ["a"], {"rule": ["r"]},
                                                                                         [0], [])  # fmt: skip
    assert (call.offset, call.rank, call.world) == (0, 0, 1)
    with pytest.raises(ValueError, match="own"):
        next(whole_call([], [], {}, [], [], 1, "sharing", ValueError("own")))
    values = {0: 1.5}
    with pytest.raises(StopIteration) as done:
        next(shared_values(values, 1, "rewards"))
    assert done.value.value == {0: 1.5}


def test_the_gather_request_carries_this_process_share_and_its_error_message(monkeypatch):
    FakeWorld(monkeypatch, 2)
    request = next(whole_call(["p"], ["a"], {"rule": ["r"]}, [0], [], 2, "sharing", KeyError("k")))
    assert request == Gather(((["p"], ["a"], {"rule": ["r"]}, [0], []), "KeyError: 'k'"), "sharing")
    assert next(shared_values({3: 0.5}, 2, "rewards")) == Gather(({3: 0.5}, None), "rewards")


def test_shared_values_merge_every_process_share_on_every_process(monkeypatch):
    world = FakeWorld(monkeypatch, 2)
    # process 0 judged the group of samples 0..4, process 1 the one of 5..7 (indices into the whole call)
    shares = [{0: 1.0, 1: 2.0, 2: 3.0, 3: 4.0, 4: 5.0}, {5: 6.0, 6: 7.0, 7: 8.0}]
    results, exchanges = lockstep(world, [shared_values(s, 2, "rewards") for s in shares])
    assert exchanges == ["rewards"]
    assert results == [{i: float(i + 1) for i in range(8)}] * 2


@pytest.mark.parametrize("exchange", ["whole_call", "shared_values"])
def test_an_error_on_one_process_raises_on_every_process(monkeypatch, exchange):
    world = FakeWorld(monkeypatch, 3)
    own = ValueError("column 'rule' is None")
    errors = [None, None, own]  # process 2 failed before the exchange; it still enters it
    if exchange == "whole_call":
        shares = [share(["p"], [c], ["r"], [0], []) for c in "abc"]
        steps = [whole_call(s["prompts"], s["completions"], s["columns"], s["to_score"], s["empty"], 3, "sharing",
                            errors[r]) for r, s in enumerate(shares)]  # fmt: skip
    else:
        steps = [shared_values({r: 1.0}, 3, "sharing", errors[r]) for r in range(3)]
    results, exchanges = lockstep(world, steps)
    assert exchanges == ["sharing"]  # every process entered the exchange, none left waiting
    assert results[2] is own  # the failing process raises its own error
    for r in (0, 1):  # the others raise, naming the process and its error
        assert isinstance(results[r], RuntimeError)
        assert str(results[r]) == "process 2 failed while sharing: ValueError: column 'rule' is None"


def test_raise_any_names_the_first_failed_process():
    _raise_any([(None, None), (None, None)], None, "x")  # nobody failed: nothing raised
    with pytest.raises(RuntimeError, match=r"^process 1 failed while x: A: one$"):
        _raise_any([(None, None), (None, "A: one"), (None, "B: two")], None, "x")
    mine = OSError("mine")
    with pytest.raises(OSError, match="mine"):
        _raise_any([(None, "A: one"), (None, None)], mine, "x")


def test_processes_judging_a_call_together(monkeypatch):
    FakeWorld(monkeypatch, 2)
    assert processes(True, "none") == 2  # a comparing judge whose forwards are its own
    assert processes(False, "none") == 1  # a pointwise judge judges its own samples
    assert processes(True, "fsdp2") == 1  # a judge sharded across processes: its forwards are collectives


def test_a_gather_request_is_answered_over_the_group_in_a_thread_for_an_asynchronous_call(monkeypatch):
    # `gather_objects` (waiting.py: every process's value over a process group, bounded by its timeout) stubbed:
    # what it is asked, from which thread.
    asked = []

    def gather_objects(value, what, group):
        asked.append((value, what, group, threading.current_thread() is threading.main_thread()))
        return [value, "the other process's"]

    monkeypatch.setattr(whole_groups, "gather_objects", gather_objects)
    request = Gather({"mine": 1}, "rewards")
    assert whole_groups.gather(request, "group", asynchronous=False) == [{"mine": 1}, "the other process's"]
    assert asked == [({"mine": 1}, "rewards", "group", True)]  # a synchronous call waits in its own thread
    awaitable = whole_groups.gather(request, "group", asynchronous=True)
    assert asked[1:] == []  # nothing asked until awaited
    assert asyncio.run(awaitable) == [{"mine": 1}, "the other process's"]
    assert asked[1:] == [({"mine": 1}, "rewards", "group", False)]  # off the event loop's thread


def test_a_reward_functions_own_group_is_a_gloo_group_of_every_process(monkeypatch):
    made = []
    monkeypatch.setattr(torch.distributed, "new_group", lambda *args, **kwargs: made.append((args, kwargs)) or "g")
    assert whole_groups.own_group() == "g"
    assert made == [((), {"backend": "gloo"})]  # CPU exchanges: TRL's event-loop thread has no CUDA device set


# ---------------------------------------------------------------------------------------------------- the judge
def user(text):
    return [{"role": "user", "content": text}]


def turn(text):
    return [{"role": "assistant", "content": text}]


TIDES, COLOUR, SKY = user("Explain tides."), user("Name a colour."), user("Why is the sky blue?")
GROUPS = [
    (TIDES, ["<think>The moon pulls.</think>The moon pulls water.", "Gravity.", "# Tides\n- moon\n- **sun**",
             "Moon and sun pull the oceans."]),
    (COLOUR, ["<think>hm</think>Red.", "Blue, a calm colour.", "", "Green, like grass in spring."]),  # one empty
    (SKY, ["Rayleigh.", "<think>light</think>Scattering of sunlight.", "Blue light.", "Because **air** scatters blue."]),
]  # fmt: skip
PROMPTS = [p for p, answers in GROUPS for _ in answers]
COMPLETIONS = [turn(a) for _, answers in GROUPS for a in answers]
SHAPING = {"reasoning_bonus": 0.5, "answer_bonus": 0.5, "top_percentile": 0.2, "reasoning_length_coeff": 0.3,
           "answer_length_coeff": 0.35, "style_coeff": 0.05}  # fmt: skip  # group shaping reads the whole group


def genrm_verdict(first: str, second: str) -> str:
    """The scripted GenRM's verdict on two answers: scores from their lengths (ties broken by the ranking, which
    prefers the shorter)."""
    ranking = 2 if len(first) < len(second) else 5 if len(first) > len(second) else 3
    return f'```json\n{{"score_1": {1 + len(first) % 5}, "score_2": {1 + len(second) % 5}, "ranking": {ranking}}}\n```'


def preference_logprobs(first: str, second: str) -> list[float]:
    """The scripted pairwise judge's log p(A), log p(B) for answer A `first`, answer B `second` (order-dependent)."""
    p = (1 + len(first) % 7) / (2 + len(first) % 7 + len(second) % 5)
    return [math.log(p), math.log(1 - p)]


class Engine:
    """Answers a judge's engine requests as its server would, recording each comparison asked: `(process, prompt,
    first answer, second answer)`. `fail_on`: a process whose requests fail."""

    def __init__(self, fail_on=None):
        self.asked: list[tuple] = []
        self.fail_on = fail_on

    def __call__(self, r: int, request: tuple):
        if r == self.fail_on:
            raise ConnectionError("judge server down")
        prompts = request.prompts
        if isinstance(request, Generate):  # a GenRM: the conversation, then response_1 and response_2
            out = []
            for messages in prompts:
                roles = {m["role"]: m["content"] for m in messages}
                self.asked.append((r, roles["user"], roles["response_1"], roles["response_2"]))
                out.append(genrm_verdict(roles["response_1"], roles["response_2"]))
            return out
        assert isinstance(request, LabelLogprobs)  # a pairwise judge: its template filled in a message
        out = []
        for messages in prompts:
            text = next(m["content"] for m in messages if "[Answer A]" in m["content"])
            request_text = text.split("[User request]\n", 1)[1].split("\n\n[Answer A]\n", 1)[0]
            first, rest = text.split("[Answer A]\n", 1)[1].split("\n\n[Answer B]\n", 1)
            second = rest.rsplit("\n\nWhich answer", 1)[0]
            self.asked.append((r, request_text, first, second))
            out.append(preference_logprobs(first, second))
        return out


def make_judge(mode: str, shaping: bool = True, **options) -> JudgeEnvironment:
    extra = SHAPING if mode == "genrm" and shaping else {}
    return JudgeEnvironment(remote_url=NOWHERE, remote_input="messages", mode=mode, empty_completion_reward=-1.0,
                            **extra, **options)  # fmt: skip


def judged_alone(world: FakeWorld, mode: str, prompts, completions) -> tuple[list, list]:
    """One process judging the whole batch: its rewards and the comparisons it asked."""
    world.size = 1
    engine = Engine()
    results, exchanges = lockstep(world, [make_judge(mode)._steps(prompts, completions, None, {})], engine)
    assert exchanges == [] and not isinstance(results[0], Exception), results[0]
    return results[0], engine.asked


def judged_by_two(world: FakeWorld, mode: str, prompts, completions, split: int, engine=None, kwargs=None, **options):
    """Processes 0 and 1 each judging their share (`[:split]`, `[split:]`) of the batch, in lockstep."""
    world.size = 2
    engine = engine or Engine()
    kwargs = kwargs or [{}, {}]
    judges = [make_judge(mode, **options) for _ in range(2)]
    shares = [slice(0, split), slice(split, len(prompts))]
    steps = [j._steps(prompts[s], completions[s], None, kw) for j, s, kw in zip(judges, shares, kwargs)]
    results, exchanges = lockstep(world, steps, engine)
    return results, exchanges, engine.asked, judges


@pytest.mark.parametrize("mode", ["genrm", "pairwise"])
@pytest.mark.parametrize(
    ("samples", "split"),
    [(4, 2), (8, 3), (12, 6), (12, 5)],
    ids=["one-group-2+2", "3+5", "6+6", "5+7"],
)
def test_two_processes_reward_their_samples_as_one_process_judging_the_whole_batch(monkeypatch, mode, samples, split):
    world = FakeWorld(monkeypatch, 1)
    prompts, completions = PROMPTS[:samples], COMPLETIONS[:samples]
    want, asked_alone = judged_alone(world, mode, prompts, completions)
    assert len(set(want)) >= 4  # the scripted verdicts tell the samples apart
    results, exchanges, asked, judges = judged_by_two(world, mode, prompts, completions, split)
    assert not any(isinstance(r, Exception) for r in results), results
    assert [len(r) for r in results] == [split, samples - split]
    assert results[0] + results[1] == pytest.approx(want, abs=1e-12)  # sample by sample
    assert exchanges == ["judge: share the samples of a call (its GRPO groups are judged whole)",
                         "judge: share the rewards of the whole GRPO groups"]  # fmt: skip
    assert world.groups_made == 2 and all(j._gather_group == "the judge's own group" for j in judges)
    # Every comparison of the whole groups asked once over both processes, the same ones one process asks.
    comparisons = sorted(a[1:] for a in asked)
    assert comparisons == sorted(a[1:] for a in asked_alone)
    assert len(set(comparisons)) == len(comparisons)
    # Each process asks the comparisons of its share of the groups (groups[rank::2], in order of first appearance).
    group_of = {prompt[0]["content"]: k for k, (prompt, _) in enumerate(GROUPS)}
    for r, request, *_ in asked:
        assert group_of[request] % 2 == r


def test_a_split_group_is_compared_whole_by_process_0_each_circle_comparison_once(monkeypatch):
    # The slow quickstart launch's case: one group of 4, 2 samples per process; the circle i -> i + 1 of the group.
    world = FakeWorld(monkeypatch, 2)
    results, _, asked, _ = judged_by_two(world, "genrm", PROMPTS[:4], COMPLETIONS[:4], 2)
    a = ["The moon pulls water.", "Gravity.", "# Tides\n- moon\n- **sun**", "Moon and sun pull the oceans."]
    tides = "Explain tides."
    assert sorted(asked) == sorted([(0, tides, a[0], a[1]), (0, tides, a[1], a[2]), (0, tides, a[2], a[3]),
                                    (0, tides, a[3], a[0])])  # fmt: skip
    assert [len(r) for r in results] == [2, 2]


def test_an_empty_completion_on_process_1_keeps_its_reward_at_its_own_index(monkeypatch):
    # 8 samples split 3 + 5: the empty completion is sample 6 of the call, process 1's sample 3 (3 + 3). Without
    # group shaping (which would move it) its reward is empty_completion_reward exactly.
    world = FakeWorld(monkeypatch, 2)
    results, _, asked, _ = judged_by_two(world, "genrm", PROMPTS[:8], COMPLETIONS[:8], 3, shaping=False)
    assert results[1][3] == -1.0 and -1.0 not in results[0] + results[1][:3] + results[1][4:]
    assert all("" not in (first, second) for _, _, first, second in asked)  # never shown to the judge


def test_a_pointwise_judge_judges_its_own_samples_without_exchanges(monkeypatch):
    world = FakeWorld(monkeypatch, 2)
    monkeypatch.setattr(judge_module, "own_group", lambda: pytest.fail("a pointwise judge makes no process group"))
    judge = JudgeEnvironment(remote_url=NOWHERE, remote_input="messages", mode="pointwise", scoring="logprobs")
    steps = judge._steps(PROMPTS[:2], COMPLETIONS[:2], None, {})
    results, exchanges = lockstep(world, [steps], lambda r, request: [[0.0] + [-50.0] * 9] * len(request.prompts))
    assert exchanges == [] and results == [[1.0, 1.0]]  # every rating 1 (all the mass on "1")


def test_a_process_failing_before_the_first_exchange_raises_on_both(monkeypatch):
    # The slow launch's bad batch: the principle column is None on process 1 only, without a default.
    world = FakeWorld(monkeypatch, 2)
    kwargs = [{"rule": ["Be kind.", "Be kind."]}, {"rule": [None, None]}]
    results, exchanges, asked, _ = judged_by_two(
        world, "genrm", PROMPTS[:4], COMPLETIONS[:4], 2, kwargs=kwargs, principle_column="rule"
    )
    assert exchanges == ["judge: share the samples of a call (its GRPO groups are judged whole)"] and not asked
    assert isinstance(results[1], ValueError) and "column 'rule'" in str(results[1])
    assert isinstance(results[0], RuntimeError)
    assert str(results[0]).startswith("process 1 failed while judge: share the samples of a call")


def test_a_process_failing_while_judging_raises_on_both_after_the_second_exchange(monkeypatch):
    # 12 samples split 6 + 6: process 1 judges the colour group; its judge server fails.
    world = FakeWorld(monkeypatch, 2)
    engine = Engine(fail_on=1)
    results, exchanges, _, _ = judged_by_two(world, "genrm", PROMPTS, COMPLETIONS, 6, engine=engine)
    assert len(exchanges) == 2  # both processes reached the rewards' exchange
    assert isinstance(results[1], ConnectionError)
    assert str(results[0]) == ("process 1 failed while judge: share the rewards of the whole GRPO groups: "
                               "ConnectionError: judge server down")  # fmt: skip


# ---------------------------------------------------------------------------------------------------- bounded forwards
class FakeAccelerator:
    """`num_processes` processes; `gather` returns this process's tensor then the `others`' (their `[chunk count,
    pair count]`), as accelerate's gather concatenates every process's along dim 0."""

    def __init__(self, num_processes: int, others=(), sync_gradients: bool = True):
        self.num_processes, self.others, self.sync_gradients = num_processes, [list(o) for o in others], sync_gradients
        self.gathered: list[torch.Tensor] = []
        self.no_sync_models: list = []
        self.unsynced = False
        self.gradient_state = SimpleNamespace(sync_gradients=True)
        self.gradient_state._set_sync_gradients = lambda value: setattr(self.gradient_state, "sync_gradients", value)

    def gather(self, tensor: torch.Tensor) -> torch.Tensor:
        self.gathered.append(tensor.clone())
        return torch.cat([tensor, torch.tensor(self.others, dtype=tensor.dtype).reshape(-1, 2)])

    @contextlib.contextmanager
    def no_sync(self, model):
        self.no_sync_models.append(model)
        self.unsynced = True
        try:
            yield
        finally:
            self.unsynced = False


class RecordingBase:
    """The trainer's base as `BoundedForwardsMixin` calls it: `training_step` runs one chunk through what
    `RankedRewardTrainer.compute_loss` does with a `loss_weight` (leaves the chunk's detached scores and token count in
    the `ScoresOut` of its inputs, returns its loss times the weight), recording what it was given."""

    def training_step(self, model, inputs, num_items_in_batch=None):
        weight = inputs["loss_weight"]
        syncs = not self.accelerator.unsynced and self.accelerator.gradient_state.sync_gradients
        self.forwards.append({"chunk": inputs["name"], "weight": weight, "syncs": syncs, "num_items": num_items_in_batch,
                              "in_attention": self.attention_depth == 1, "keys": set(inputs),
                              "model": model, "out": inputs[SCORES_OUT]})  # fmt: skip
        inputs[SCORES_OUT].add(inputs["scores"], inputs["tokens"])
        return torch.tensor(inputs["loss"], dtype=torch.float64) * weight


class FakeTrainer(BoundedForwardsMixin, RecordingBase):
    def __init__(self, accelerator: FakeAccelerator, bounded: bool = True, deepspeed: bool = False):
        self.accelerator = accelerator
        self.args = SimpleNamespace(device=torch.device("cpu"), center_rewards_coefficient=None)
        self.is_deepspeed_enabled = deepspeed
        self.data_collator = SimpleNamespace(layout=SimpleNamespace(cuts_chunks=True),
                                             pack_max_tokens=400 if bounded else None)  # fmt: skip
        self._layout = SimpleNamespace(attention=self._attention)
        self.attention_depth = 0
        self.attention_models: list = []  # the model each chunk's attention context was entered with
        self.forwards: list[dict] = []
        self.logged: list[tuple] = []

    @contextlib.contextmanager
    def _attention(self, model):
        self.attention_models.append(model)
        self.attention_depth += 1
        try:
            yield
        finally:
            self.attention_depth -= 1

    def _log_train_metrics(self, scores, pairwise, record_index, token_count):
        self.logged.append((scores, pairwise, record_index, token_count))


def ranked_chunk(name, records, loss, tokens, first_score=0.0):
    """A chunk of ranked records (`records`: each record's ranks; record_index from 0, as the collator's chunks)."""
    ranks = [r for record in records for r in record]
    return {"name": name, "ranks": torch.tensor(ranks), "loss": loss, "tokens": tokens,
            "record_index": torch.tensor([k for k, record in enumerate(records) for _ in record]),
            "scores": first_score + torch.arange(len(ranks), dtype=torch.float32)}  # fmt: skip


def batch_of(chunks):
    """A batch cut into `chunks`, with the whole batch's ranks and record_index (records numbered over the batch)."""
    ranks = torch.cat([c["ranks"] for c in chunks])
    offsets, record_index = 0, []
    for c in chunks:
        record_index.append(c["record_index"] + offsets)
        offsets += int(c["record_index"].max()) + 1
    return {"chunks": chunks, "ranks": ranks, "record_index": torch.cat(record_index)}


# This process: a chunk of one record ranked 0 < 1 < 2 (3 pairs), then one of a record 0 < 1 (1 pair).
MINE = [ranked_chunk("a", [[0, 1, 2]], loss=0.7, tokens=9), ranked_chunk("b", [[0, 1]], loss=0.3, tokens=4,
                                                                           first_score=10.0)]  # fmt: skip
# The other process: 3 chunks of 2 pairs each (two records 0 < 1 per chunk).
THEIRS = [ranked_chunk(name, [[0, 1], [0, 1]], loss=0.5, tokens=6) for name in "xyz"]


def test_forwards_even_out_the_chunks_and_divide_the_global_pairs_by_the_processes():
    accelerator = FakeAccelerator(2, others=[[3, 6]])  # the other process: 3 chunks, 2 + 2 + 2 pairs
    trainer = FakeTrainer(accelerator)
    chunks, real, pairs, total = trainer._forwards(batch_of(MINE))
    assert [c["name"] for c in chunks] == ["a", "b", "b"]  # 3 forwards like the other process: the last repeated
    assert (real, pairs) == (2, [3, 1])
    assert total == (3 + 1 + 6) / 2 == 5.0  # the step's pairs over both processes, per process
    assert [t.tolist() for t in accelerator.gathered] == [[[2, 4]]]  # what this process sends: 2 chunks, 4 pairs


def test_a_chunked_step_weights_each_real_chunk_by_its_pairs_over_the_global_pairs_per_process():
    # Rule (bounded_forwards.py and compute_loss): the step's loss is the mean over all pairs of all processes, DDP averaging
    # the processes' gradients. With P processes and N pairs over all of them, a chunk's loss (mean over its n
    # pairs) gets weight n / (N / P): sum over processes of sum_chunks (n / (N / P)) * (S_chunk / n), averaged over
    # P, is S_all / N. Here N = (3 + 1) + (2 + 2 + 2) = 10, P = 2: total = 5.
    # This process: pairs [3, 1] -> weights [3/5, 1/5], and its repeated chunk 0.
    accelerator = FakeAccelerator(2, others=[[3, 6]])
    trainer = FakeTrainer(accelerator)
    loss = trainer._chunked_training_step("model", batch_of(MINE), 16)
    assert [f["chunk"] for f in trainer.forwards] == ["a", "b", "b"]
    assert [f["weight"] for f in trainer.forwards] == pytest.approx([3 / 5, 1 / 5, 0.0], abs=1e-15)
    assert trainer.forwards[2]["weight"] == 0.0  # the repeated chunk adds nothing
    assert loss.item() == pytest.approx(0.7 * 3 / 5 + 0.3 * 1 / 5, abs=1e-12)
    # Chunks before the last accumulate gradients only (no sync); the last one syncs.
    assert [f["syncs"] for f in trainer.forwards] == [False, False, True]
    assert accelerator.no_sync_models == ["model", "model"]
    assert all(f["in_attention"] and f["num_items"] == 16 and f["model"] == "model" for f in trainer.forwards)
    assert trainer.attention_models == ["model"] * 3  # each chunk's forward and backward in the layout's attention
    assert all("chunks" not in f["keys"] and "loss_weight" in f["keys"] for f in trainer.forwards)
    # Metrics once, over the real chunks only: their 3 + 2 scores and 9 + 4 tokens (not the repeat's).
    ((scores, pairwise, record_index, tokens),) = trainer.logged
    assert scores.tolist() == [0.0, 1.0, 2.0, 10.0, 11.0] and tokens == 13
    assert record_index.tolist() == [0, 0, 0, 1, 1] and pairwise.better.numel() == 4
    assert len({id(f["out"]) for f in trainer.forwards}) == 1  # one ScoresOut for the step's forwards, not kept
    assert not any(isinstance(v, ScoresOut) for v in vars(trainer).values())

    # The other process: pairs [2, 2, 2], the same total 5 -> weights [2/5, 2/5, 2/5], no repeat.
    other = FakeTrainer(FakeAccelerator(2, others=[[2, 4]]))
    other._chunked_training_step("model", batch_of(THEIRS), 16)
    assert [f["chunk"] for f in other.forwards] == ["x", "y", "z"]
    assert [f["weight"] for f in other.forwards] == pytest.approx([2 / 5, 2 / 5, 2 / 5], abs=1e-15)
    assert [f["syncs"] for f in other.forwards] == [False, False, True]
    # A chunk's loss is the mean over its n pairs: each pair weighs w / n = 1/5 on each process, 1/10 once DDP averages
    # the 2 processes' gradients: the mean over the 10 pairs.
    per_pair = [w / n for w, n in zip([f["weight"] for f in trainer.forwards], [3, 1])]
    per_pair += [f["weight"] / 2 for f in other.forwards]
    assert [w / 2 for w in per_pair] == pytest.approx([1 / 10] * 5, abs=1e-15)


def test_equal_chunk_counts_repeat_nothing():
    # Both processes 2 chunks; this one 2 + 2 pairs, the other 4 pairs: total (4 + 4) / 2 = 4 -> weights [1/2, 1/2].
    trainer = FakeTrainer(FakeAccelerator(2, others=[[2, 4]]))
    trainer._chunked_training_step("model", batch_of(THEIRS[:2]), None)
    assert [f["chunk"] for f in trainer.forwards] == ["x", "y"]
    assert [f["weight"] for f in trainer.forwards] == [0.5, 0.5]


def test_a_batch_that_fits_runs_as_many_forwards_as_the_other_process():
    # No chunks here (one forward would do: 3 pairs), the other process cuts its batch into 3 (6 pairs): this batch
    # runs 3 times, weight 3 / ((3 + 6) / 2) = 2/3, then 0 twice.
    trainer = FakeTrainer(FakeAccelerator(2, others=[[3, 6]]))
    whole = ranked_chunk("whole", [[0, 1, 2]], loss=0.9, tokens=8)
    trainer._chunked_training_step("model", whole, None)
    assert [f["chunk"] for f in trainer.forwards] == ["whole"] * 3
    assert [f["weight"] for f in trainer.forwards] == pytest.approx([2 / 3, 0.0, 0.0], abs=1e-15)
    assert trainer.logged[0][3] == 8  # the tokens of one forward


def test_a_single_process_does_not_gather():
    # total = the local pairs, 4 -> weights [3/4, 1/4]; accelerate's gather would be a collective of one.
    accelerator = FakeAccelerator(1)
    accelerator.gather = lambda tensor: pytest.fail("one process gathers nothing")
    trainer = FakeTrainer(accelerator)
    assert not trainer._even_forwards()
    trainer._chunked_training_step("model", batch_of(MINE), None)
    assert [f["weight"] for f in trainer.forwards] == [3 / 4, 1 / 4]
    assert [f["syncs"] for f in trainer.forwards] == [False, True]


def test_no_bound_no_gather():
    # Without pack_max_tokens no batch is cut: the processes' forwards are even already.
    accelerator = FakeAccelerator(2, others=[[3, 6]])
    trainer = FakeTrainer(accelerator, bounded=False)
    assert not trainer._even_forwards()
    chunks, real, pairs, total = trainer._forwards(batch_of(MINE))
    assert (len(chunks), real, pairs, total) == (2, 2, [3, 1], 4.0) and not accelerator.gathered


def test_under_gradient_accumulation_and_deepspeed_the_chunks_defer_as_the_step_does():
    # The step's own micro-batch already defers its sync (gradient accumulation): no no_sync of its own.
    accelerator = FakeAccelerator(2, others=[[2, 4]], sync_gradients=False)
    FakeTrainer(accelerator)._chunked_training_step("model", batch_of(MINE), None)
    assert accelerator.no_sync_models == []
    # DeepSpeed: chunks before the last turn the gradient state's sync off (no optimizer step), then restore it.
    accelerator = FakeAccelerator(2, others=[[2, 4]])
    trainer = FakeTrainer(accelerator, deepspeed=True)
    trainer._chunked_training_step("model", batch_of(MINE), None)
    assert [f["syncs"] for f in trainer.forwards] == [False, True] and accelerator.no_sync_models == []
    assert accelerator.gradient_state.sync_gradients is True


def test_trl_pair_chunks_count_rows_over_two_and_log_chosen_then_rejected():
    # A batch of TRL pairs that fits (no ranks; the collator put its score_index in TRL's layout): 3 pairs from its
    # 6 rows. The other process 2 chunks, 5 pairs: total (3 + 5) / 2 = 4 -> weights [3/4, 0].
    trainer = FakeTrainer(FakeAccelerator(2, others=[[2, 5]]))
    pairs_batch = {"name": "pairs", "input_ids": torch.zeros(6, 5, dtype=torch.long), "loss": 1.0, "tokens": 30,
                   "score_index": torch.zeros(6, 2, dtype=torch.long),
                   "scores": torch.tensor([3.0, 2.0, 1.0, 0.0, 1.0, -1.0])}  # fmt: skip
    trainer._chunked_training_step("model", pairs_batch, None)
    assert [f["weight"] for f in trainer.forwards] == [3 / 4, 0.0]
    assert trainer.accelerator.gathered[0].tolist() == [[1, 3]]  # 1 forward, 3 pairs: counted as integers
    assert trainer.accelerator.gathered[0].dtype == torch.long
    ((scores, pairwise, record_index, _),) = trainer.logged
    assert record_index.tolist() == [0, 1, 2, 0, 1, 2] and pairwise.better.tolist() == [0, 1, 2]  # TRL's layout
    # Without a score_index (TRL's own rows): input_ids' rows over two.
    assert FakeTrainer(FakeAccelerator(1))._forwards({"input_ids": torch.zeros(4, 3)})[2] == [2]

    # TRL pairs cut into chunks: each chunk's records are pairs (chosen 0, rejected 1), scores concatenated in record
    # order and put back in TRL's layout by score_order (every chosen, then every rejected).
    first = ranked_chunk("c01", [[0, 1], [0, 1]], loss=0.4, tokens=10)  # scores c0=0, r0=1, c1=2, r1=3
    second = ranked_chunk("c2", [[0, 1]], loss=0.2, tokens=5, first_score=4.0)  # c2=4, r2=5
    chunked = {"chunks": [first, second], "score_order": torch.tensor([0, 2, 4, 1, 3, 5])}
    trainer = FakeTrainer(FakeAccelerator(1))
    trainer._chunked_training_step("model", chunked, None)
    assert [f["weight"] for f in trainer.forwards] == [2 / 3, 1 / 3]  # 2 and 1 of the 3 pairs
    ((scores, pairwise, record_index, tokens),) = trainer.logged
    assert scores.tolist() == [0.0, 2.0, 4.0, 1.0, 3.0, 5.0] and record_index.tolist() == [0, 1, 2, 0, 1, 2]
    assert tokens == 15


def test_the_metrics_get_the_whole_batchs_pairs_with_their_margins_and_the_centring_term():
    # MINE's scores: record 0 = rows 0, 1, 2 (scores 0, 1, 2; ranks 0, 1, 2), record 1 = rows 3, 4 (10, 11; 0, 1).
    # Pairs (0, 1), (0, 2), (1, 2) with margin 0.5 and (3, 4) with 0.25: differences 0 - 1 - 0.5, 0 - 2 - 0.5,
    # 1 - 2 - 0.5, 10 - 11 - 0.25. TRL's centring, c = 0.01: c * mean of (s_i + s_j)^2 = 0.01 * (1 + 4 + 9 + 441) / 4.
    trainer = FakeTrainer(FakeAccelerator(1))
    trainer.args.center_rewards_coefficient = 0.01
    batch = batch_of(MINE) | {"margin": torch.tensor([0.5, 0.25], dtype=torch.float64)}
    trainer._chunked_training_step("model", batch, None)
    ((_, pairwise, _, _),) = trainer.logged
    nll = [math.log1p(math.exp(-x)) for x in (-1.5, -2.5, -1.5, -1.25)]  # -log sigmoid(x)
    assert pairwise.pair_losses.tolist() == pytest.approx(nll, abs=1e-6)
    assert pairwise.loss.item() == pytest.approx(sum(nll) / 4 + 0.01 * 455 / 4, abs=1e-5)


def test_a_step_without_any_pair_weighs_its_chunks_0_and_is_refused():
    # Every record tied (one process): 0 pairs in all, so no chunk has a share; the step's loss has no pair.
    trainer = FakeTrainer(FakeAccelerator(1))
    tied = [ranked_chunk("t0", [[0, 0]], loss=0.0, tokens=3), ranked_chunk("t1", [[1, 1, 1]], loss=0.0, tokens=4)]
    with pytest.raises(
        ValueError,
        match=r"^The batch holds no strictly ordered pair \(every record's completions "
        r"are tied\)\.$",
    ):
        trainer._chunked_training_step("model", batch_of(tied), None)
    assert [f["weight"] for f in trainer.forwards] == [0.0, 0.0]


class MetaAccelerator(FakeAccelerator):
    """`gather` on the meta device (standing in for the processes' accelerator): checks what is sent, answers
    `answer` (the gathered counts, this process's first)."""

    def __init__(self, answer):
        super().__init__(len(answer))
        self.answer = answer

    def gather(self, tensor):
        self.gathered.append((tensor.device.type, tensor.dtype, tuple(tensor.shape)))
        return torch.tensor(self.answer)


def test_every_tensor_of_the_step_goes_to_the_scores_device(monkeypatch):
    # The meta device stands in for an accelerator: the chunks' scores are there, the collator's ranks, record
    # indices and margins on the CPU. The loss (stubbed: meta tensors hold no data to pair) and the metrics get them
    # all on the scores' device; the chunk counts are gathered on the process's device (NCCL gathers no CPU tensor).
    from trl_rm_env.trainer import bounded_forwards as bounded

    seen = []

    def loss(scores, ranks, record_index, margin, center):
        seen.append([t.device.type for t in (scores, ranks, record_index, margin) if t is not None])
        return SimpleNamespace(loss=None)

    monkeypatch.setattr(bounded, "ranked_bradley_terry_loss", loss)
    accelerator = MetaAccelerator([[2, 4], [3, 6]])
    trainer = FakeTrainer(accelerator)
    trainer.args.device = torch.device("meta")
    chunks = [c | {"scores": c["scores"].to("meta")} for c in MINE]
    trainer._chunked_training_step("model", batch_of(chunks) | {"margin": torch.tensor([0.5, 0.25])}, None)
    assert accelerator.gathered == [("meta", torch.long, (1, 2))]
    assert [f["weight"] for f in trainer.forwards] == [3 / 5, 1 / 5, 0.0]
    # TRL pairs cut into chunks: their layout made by the trainer, on the scores' device.
    trl = [ranked_chunk("c01", [[0, 1], [0, 1]], 0.4, 10), ranked_chunk("c2", [[0, 1]], 0.2, 5)]
    trl = {
        "chunks": [c | {"scores": c["scores"].to("meta")} for c in trl],
        "score_order": torch.tensor([0, 2, 4, 1, 3, 5]),
    }
    FakeTrainer(FakeAccelerator(1))._chunked_training_step("model", trl, None)
    assert seen == [["meta"] * 4, ["meta"] * 3]
    assert [logged[2].device.type for logged in trainer.logged] == ["meta"]  # the metrics' record indices


def test_a_comparing_judge_sharded_across_the_processes_judges_its_own_call_without_exchanges(monkeypatch):
    """A judge whose weights are sharded across the processes (ZeRO-3 or FSDP2: each forward is a collective every
    process runs) compares the samples of its own call, as one process does: no process group, no exchange."""
    world = FakeWorld(monkeypatch, 1)
    want, _ = lockstep(world, [make_judge("genrm", shaping=False)._steps(PROMPTS[:4], COMPLETIONS[:4], None, {})],
                       Engine())  # fmt: skip
    world.size = 2
    monkeypatch.setattr(judge_module, "own_group", lambda: pytest.fail("a sharded judge makes no process group"))
    judge = make_judge("genrm", shaping=False)
    judge.engine.sharding = "fsdp2"  # as `shard_if_requested` sets it for a judge loaded under FSDP2
    results, exchanges = lockstep(world, [judge._steps(PROMPTS[:4], COMPLETIONS[:4], None, {})], Engine())
    assert exchanges == [] and results == want and len(set(want[0])) > 1


SPLIT_SHAPING = (
    "pointwise_judge: group shaping reads each process's share of a call: a GRPO group that TRL splits between "
    "processes (a per-device batch smaller than num_generations) is shaped in parts. Keep a process's batch a multiple "
    "of num_generations. Warned once."
)


def test_shaping_warns_of_split_groups_only_where_a_process_shapes_its_own_share(monkeypatch, caplog):
    """Under 2 processes a comparing judge shapes the whole groups it gathered (nothing to warn); a pointwise judge
    shapes its own share, which may hold part of a group: warned once."""
    world = FakeWorld(monkeypatch, 2)
    monkeypatch.setattr(base_module, "world_size", lambda: 2)
    split = lambda: [r.getMessage() for r in caplog.records if "group shaping reads" in r.getMessage()]  # noqa: E731
    with caplog.at_level(logging.WARNING):
        results, *_ = judged_by_two(world, "genrm", PROMPTS[:8], COMPLETIONS[:8], 3)  # SHAPING on
        assert not any(isinstance(r, Exception) for r in results) and split() == []
        pointwise = JudgeEnvironment(remote_url=NOWHERE, remote_input="messages", mode="pointwise", scoring="logprobs",
                                     answer_length_coeff=0.35, name="pointwise_judge")  # fmt: skip
        for _ in range(2):
            world.current = 0
            steps = pointwise._steps(PROMPTS[:4], COMPLETIONS[:4], None, {})
            lockstep(world, [steps], lambda r, request: [[0.0] + [-50.0] * 9] * len(request.prompts))
    assert split() == [SPLIT_SHAPING]
