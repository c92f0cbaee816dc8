"""`overlap_encoding` (`trl_rm_env.scoring.overlap`): a scoring call encoded in waves of one forward pass each, the
next wave on a worker thread while the model runs the current one.

References from outside the code under test: every sequence scored alone by the plain model (`score_one`: no
padding, no batching), and the same scorer with `overlap_encoding=False`. Calls are GRPO-shaped (groups of 8 and of
16 completions of one prompt, and a group of 5), on the CPU in fp32 (`overlap_encoding=True`: on the CPU it is only
on when asked), under the packed layout and the CPU's KV layout, with wave bounds small enough for several waves.

Fast: the tiny model, a few calls.
"""

from __future__ import annotations

import random
import threading

import pytest
import torch
from helpers import score_one

from trl_rm_env import RewardScorer
from trl_rm_env.scoring import overlap
from trl_rm_env.tiny_models import build_tiny_reward_model

WORDS = "the cat sat on a mat while seven dogs ran past quickly and one bird sang loudly".split()


def grpo_call(group_sizes, seed: int = 0):
    """`(prompts, completions)`: one chat prompt per group, repeated for each of its completions (as TRL passes them)."""
    rng = random.Random(seed)
    prompts, completions = [], []
    for size in group_sizes:
        prompt = [{"role": "user", "content": " ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 60)))}]
        for _ in range(size):
            prompts.append(prompt)
            answer = " ".join(rng.choice(WORDS) for _ in range(rng.randint(0, 25))) or "4"
            completions.append([{"role": "assistant", "content": answer}])
    return prompts, completions


@pytest.fixture(scope="module")
def model(tiny_tokenizer):
    return build_tiny_reward_model(tiny_tokenizer, seed=3)


class Watched:
    """The engine calls of a scorer (their items, by the call's numbering) and the threads `encode` ran on."""

    def __init__(self, scorer, monkeypatch):
        self.calls, self.threads = [], []
        engine_outputs, encode = scorer.engine.outputs, scorer.encode

        def outputs(ids, lengths=None, progress=None):
            self.calls.append(len(ids))
            return engine_outputs(ids, lengths, progress)

        def encoding(*args, **kwargs):
            self.threads.append(threading.current_thread().name)
            return encode(*args, **kwargs)

        monkeypatch.setattr(scorer.engine, "outputs", outputs)
        monkeypatch.setattr(scorer, "encode", encoding)


@pytest.mark.parametrize("layout", ["packed", "auto"])  # the packed row; the CPU's KV cache
def test_waves_score_as_one_call_and_as_each_sequence_alone(model, tiny_tokenizer, layout, monkeypatch):
    prompts, completions = grpo_call([8, 16, 5, 8], seed=1)
    options = dict(prefix_sharing=layout, max_tokens_per_batch=700)  # a few groups a wave
    whole = RewardScorer(model, tiny_tokenizer, overlap_encoding=False, **options)
    waved = RewardScorer(model, tiny_tokenizer, overlap_encoding=True, **options)
    watched = Watched(waved, monkeypatch)
    reference = torch.tensor([score_one(model, ids) for ids in whole.encode(prompts, completions).ids])
    scores = waved.score(prompts, completions)
    torch.testing.assert_close(scores, reference, atol=1e-5, rtol=0)
    torch.testing.assert_close(scores, whole.score(prompts, completions), atol=1e-5, rtol=0)
    assert len(watched.calls) > 1 and sum(watched.calls) == len(prompts)  # several waves, every item once
    # Whole groups only: the waves' sizes are sums of consecutive group sizes.
    bounds, edges, total = {0}, [8, 16, 5, 8], 0
    for size in edges:
        total += size
        bounds.add(total)
    running = 0
    for size in watched.calls:
        running += size
        assert running in bounds, watched.calls
    assert set(watched.threads) == {"trl-rm-env-encode-ahead"}  # encoded on the worker, a group at a time
    assert len(watched.threads) == len(edges)


def test_the_item_numbers_of_the_call_are_kept(model, tiny_tokenizer):
    prompts, completions = grpo_call([8, 8], seed=2)
    long = [{"role": "assistant", "content": " ".join(["word"] * 1500)}]
    completions[11] = long  # in the second group, the second wave
    options = dict(max_tokens_per_batch=2000, max_length=1024, truncation="none", prefix_sharing="packed")
    waved = RewardScorer(model, tiny_tokenizer, overlap_encoding=True, overlength_reward=-7.0, **options)
    whole = RewardScorer(model, tiny_tokenizer, overlap_encoding=False, overlength_reward=-7.0, **options)
    scored = waved.score_pairs(prompts, completions)
    assert scored.scores[11].item() == -7.0
    torch.testing.assert_close(scored.scores, whole.score_pairs(prompts, completions).scores, atol=1e-5, rtol=0)
    strict = RewardScorer(model, tiny_tokenizer, overlap_encoding=True, **options)
    with pytest.raises(ValueError, match=r"^Item 11 is \d+ tokens, over max_length=1024\. Set `overlength_reward`"):
        strict.score(prompts, completions)  # raised on the worker, here with the call's numbering


def test_auto_overlaps_only_on_a_gpu_and_true_is_refused_where_no_pass_runs_here(model, tiny_tokenizer, monkeypatch):
    prompts, completions = grpo_call([8, 8], seed=4)
    scorer = RewardScorer(model, tiny_tokenizer, max_tokens_per_batch=300)  # auto, on the CPU: one encoding
    watched = Watched(scorer, monkeypatch)
    scorer.score(prompts, completions)
    assert watched.calls == [16] and watched.threads == [threading.current_thread().name]

    class OtherEngine:
        name, is_async, num_labels = "vllm", False, 1

    with pytest.raises(ValueError, match=r"^overlap_encoding=True encodes a call in waves of the forward passes "
                                         r"transformers runs here, but the engine is 'vllm' \(which batches the call "
                                         r"itself\); set overlap_encoding to 'auto' or False\.$"):
        scorer = RewardScorer(model, tiny_tokenizer, overlap_encoding=True)
        scorer.engine = OtherEngine()
        scorer.score(prompts, completions)


def test_a_worker_that_dies_without_its_results_is_an_error(model, tiny_tokenizer, monkeypatch):
    prompts, completions = grpo_call([4, 4], seed=5)
    scorer = RewardScorer(model, tiny_tokenizer, overlap_encoding=True, max_tokens_per_batch=200)
    monkeypatch.setattr(overlap, "WAIT_STEP_S", 0.05)

    def dies(*args, **kwargs):  # a thread that ends without putting anything (not an exception: those are raised)
        raise SystemExit

    monkeypatch.setattr(overlap, "waves", dies)
    monkeypatch.setattr(threading.Thread, "run", lambda self: None)  # the worker runs nothing and ends
    with pytest.raises(RuntimeError, match="^The encoding thread of this scoring call ended without handing over its "
                                           "results.$"):
        scorer.score(prompts, completions)


def test_context_groups_are_runs_of_equal_contexts():
    a, b = [{"role": "user", "content": "x"}], [{"role": "user", "content": "y"}]
    assert list(overlap.context_groups([a, b, b])) == [(0, 1), (1, 3)]
    assert list(overlap.context_groups([a])) == [(0, 1)]
    assert list(overlap.context_groups([a, a, list(a), b, a])) == [(0, 3), (3, 4), (4, 5)]  # equal, not only the same
    assert list(overlap.context_groups([])) == []


def test_progress_is_one_bar_over_the_items(model, tiny_tokenizer, monkeypatch):
    """As the engine's bar over its passes: shown when asked, and unasked only past 8 waves (opened at the ninth,
    counting what the first 8 did)."""
    import tqdm.auto

    bars = []

    class Bar:
        def __init__(self, total, initial, desc, unit):
            self.total, self.n, self.closed, self.opened_at = total, initial, False, initial
            assert (desc, unit) == ("Scoring", "item")
            bars.append(self)

        def update(self, n):
            self.n += n

        def close(self):
            self.closed = True

    monkeypatch.setattr(tqdm.auto, "tqdm", Bar)
    prompts, completions = grpo_call([2] * 12, seed=6)  # 12 groups, a wave each (`rows=2`)
    scorer = RewardScorer(model, tiny_tokenizer, overlap_encoding=True, batch_size=2)
    scorer.score(prompts, completions, progress=False)
    assert bars == []
    scorer.score(prompts[:8], completions[:8])  # 4 waves, nothing asked: no bar
    assert bars == []
    scorer.score(prompts, completions)  # 12 waves: a bar from the ninth, over every item
    assert [(b.total, b.n, b.closed, b.opened_at) for b in bars] == [(24, 24, True, 16)]  # 8 waves of 2 done
    scorer.score(prompts[:4], completions[:4], progress=True)
    assert [(b.total, b.n, b.closed, b.opened_at) for b in bars[1:]] == [(4, 4, True, 0)]
    shown = RewardScorer(model, tiny_tokenizer, overlap_encoding=True, batch_size=2, show_progress=True)
    shown.score(prompts[:4], completions[:4])  # the scorer's show_progress when the call asks nothing
    assert [(b.total, b.n, b.closed, b.opened_at) for b in bars[2:]] == [(4, 4, True, 0)]
    quiet = RewardScorer(model, tiny_tokenizer, overlap_encoding=True, batch_size=2, show_progress=False)
    quiet.score(prompts, completions)  # 12 waves, but the scorer says no
    assert len(bars) == 3


# ------------------------------------------------------------------------------------------- waves, worked by hand
class CountingScorer:
    """A scorer whose items are token counts: item k of a call is `completions[k]` tokens (its context 1 of them),
    over `max_length` it is given the fallback (no ids, listed as over-length); its engine returns each sequence's
    length and the first item's call number, so where every output landed can be read back."""

    def __init__(self, max_length=50):
        from trl_rm_env.scoring.scorer import EncodedBatch

        self.batch, self.max_length, self.engine_calls = EncodedBatch, max_length, []
        self.config = type("Config", (), {"num_labels": 2})()
        self.options = type("Options", (), {"show_progress": None})()
        self.engine = self

    def encode(self, contexts, completions, *, first=0):
        out = self.batch([], [])
        for i, n in enumerate(completions):
            over = n > self.max_length
            out.ids.append(None if over else [first + i] * n)
            out.context_lengths.append(first + i)  # (not a real length: where it lands is read back)
            if over:
                out.overlength.append(i)
        return out

    def outputs(self, ids, lengths, progress):
        assert lengths == [seq[0] for seq in ids]  # each sequence's context length goes with it
        self.engine_calls.append([seq[0] for seq in ids])
        return torch.tensor([[float(len(seq)), float(seq[0])] for seq in ids])


GROUPS = ["a"] * 3 + ["b"] * 2 + ["c"] * 4 + ["d"]  # four GRPO groups
TOKENS = [5, 5, 5, 7, 7, 3, 3, 3, 3, 100]  # group d's only item is over max_length=50


def summary(found):
    return [(items, [len(s) for s in ids], skipped) for items, ids, _, skipped in found]


@pytest.mark.parametrize(("tokens", "rows", "expected"), [
    # a wave closes once it holds `tokens` tokens (a: 15, b: +14) or `rows` sequences, after a whole group; the last
    # wave holds what is left, the over-length item of group d with it
    (20, None, [([0, 1, 2, 3, 4], [5, 5, 5, 7, 7], []), ([5, 6, 7, 8], [3, 3, 3, 3], [9])]),
    # a: 15 closes a wave; b (14) and c (12) the next; group d alone over max_length: a last wave of no sequence,
    # which still carries its over-length item
    (15, None, [([0, 1, 2], [5, 5, 5], []), ([3, 4, 5, 6, 7, 8], [7, 7, 3, 3, 3, 3], []), ([], [], [9])]),
    (None, 4, [([0, 1, 2, 3, 4], [5, 5, 5, 7, 7], []), ([5, 6, 7, 8], [3, 3, 3, 3], []), ([], [], [9])]),
    # 16: a (15) is under it; with b (29) the wave closes
    (16, None, [([0, 1, 2, 3, 4], [5, 5, 5, 7, 7], []), ([5, 6, 7, 8], [3, 3, 3, 3], [9])]),
    (None, None, [(list(range(9)), TOKENS[:9], [9])]),  # no bound: one wave
])  # fmt: skip
def test_waves_by_hand(tokens, rows, expected):
    found = list(overlap.waves(CountingScorer(), GROUPS, TOKENS, tokens, rows))
    assert summary(found) == expected
    assert [lengths for _, _, lengths, _ in found] == [items for items, _, _, _ in found]  # each item's own


def test_a_wave_keeps_the_over_length_items_of_all_its_groups():
    found = overlap.waves(CountingScorer(), ["a", "a", "b", "b", "c"], [60, 5, 5, 70, 6], None, None)
    assert summary(found) == [([1, 2, 4], [5, 5, 6], [0, 3])]


def test_a_mismatched_call_is_refused_as_a_whole_call_is():
    with pytest.raises(ValueError, match=r"^Got 3 contexts but 2 completions; they must match\.$"):
        overlap.overlapped_outputs(CountingScorer(), ["a"] * 3, [1, 2], (None, 1))


def test_the_worker_encodes_at_most_a_few_waves_ahead_and_stops_when_the_call_fails(monkeypatch):
    """A slow engine: the worker fills the queue and waits (its put timing out and retrying) rather than encoding the
    whole call ahead; at most 2 waves queued and 1 in its hands beyond the one running. When the engine fails, the
    worker stops within a wait step and the call raises (no hang)."""
    import time

    monkeypatch.setattr(overlap, "WAIT_STEP_S", 0.05)
    contexts = [f"group {g}" for g in range(12)]  # 12 groups of one item: 12 waves of one row

    class Slow(CountingScorer):
        def __init__(self, fail_at=None):
            super().__init__()
            self.encoded, self.ahead, self.fail_at = 0, [], fail_at

        def encode(self, contexts, completions, *, first=0):
            self.encoded += 1
            return super().encode(contexts, completions, first=first)

        def outputs(self, ids, lengths, progress):
            wave = len(self.engine_calls)
            if wave == self.fail_at:
                time.sleep(0.3)  # the worker is waiting to hand over a wave when the call fails
                raise RuntimeError("the device fell over")
            time.sleep(0.3 if wave < 2 else 0.0)  # long enough for the worker to fill the queue
            self.ahead.append(self.encoded - wave - 1)
            return super().outputs(ids, lengths, progress)

    slow = Slow()
    outputs, present, _ = overlap.overlapped_outputs(slow, contexts, [2] * 12, (None, 1))
    assert present == list(range(12)) and outputs[:, 1].tolist() == [float(k) for k in range(12)]
    assert max(slow.ahead) == 3 and slow.ahead[:2] == [3, 3]  # 2 queued + 1 waiting to be put, while one runs

    failing = Slow(fail_at=1)
    done = []

    def call():
        try:
            overlap.overlapped_outputs(failing, contexts, [2] * 12, (None, 1))
        except RuntimeError as err:
            done.append(str(err))

    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    thread.join(timeout=10)
    assert not thread.is_alive() and done == ["the device fell over"]
    assert failing.encoded <= 5  # it stopped: the first wave, the one that failed, and at most 3 more


@pytest.mark.parametrize("wave_rows", [1, 2, 3])
def test_more_waves_than_the_worker_holds_ahead_land_in_place(wave_rows):
    # 24 groups of 1 to 3 items (47 items, a few over max_length): from 47 waves of one item down to 17 waves
    rng = random.Random(wave_rows)
    contexts, tokens = [], []
    for g in range(24):
        for _ in range(1 + g % 3):
            contexts.append(f"group {g}")
            tokens.append(rng.choice([2, 3, 4, 60]))
    scorer = CountingScorer()
    outputs, present, over = overlap.overlapped_outputs(scorer, contexts, tokens, (None, wave_rows))
    expected_over = [k for k, n in enumerate(tokens) if n > 50]
    assert over == expected_over and present == [k for k in range(len(tokens)) if k not in expected_over]
    assert len(scorer.engine_calls) > 2  # more waves than the queue holds
    for k, n in enumerate(tokens):  # each item's output is its own: its length, its number
        if k in expected_over:
            assert torch.isnan(outputs[k]).all()
        else:
            assert outputs[k].tolist() == [float(n), float(k)]


def test_items_scored_nan_are_all_named_across_waves(model, tiny_tokenizer, monkeypatch):
    """13 NaN items over several waves: the error names the first 10 and carries all 13; with `nonfinite_reward`
    each of the 13 gets it and is listed, every other item keeps its score."""
    from trl_rm_env.scoring.interfaces import NonfiniteScores

    prompts, completions = grpo_call([4] * 7, seed=7)  # 28 items, a wave per group
    scorer = RewardScorer(model, tiny_tokenizer, overlap_encoding=True, batch_size=4)
    whole = RewardScorer(model, tiny_tokenizer, overlap_encoding=False).score(prompts, completions)
    bad = set(range(1, 27, 2))  # 1, 3, ..., 25: 13 items, in every wave but the last
    engine_outputs = scorer.engine.outputs
    seen = []

    def outputs(ids, lengths=None, progress=None):
        values = engine_outputs(ids, lengths, progress).clone()
        first = len(seen)
        seen.extend(ids)
        for row in range(len(ids)):
            if first + row in bad:
                values[row] = float("nan")
        return values

    monkeypatch.setattr(scorer.engine, "outputs", outputs)
    with pytest.raises(NonfiniteScores, match=r"item\(s\) \[1, 3, 5, 7, 9, 11, 13, 15, 17, 19\]\.\.\.") as err:
        scorer.score(prompts, completions)
    assert err.value.items == sorted(bad)
    scorer = RewardScorer(model, tiny_tokenizer, overlap_encoding=True, batch_size=4, nonfinite_reward=-5.0)
    engine_outputs = scorer.engine.outputs
    monkeypatch.setattr(scorer.engine, "outputs", outputs)
    seen.clear()
    scored = scorer.score_pairs(prompts, completions)
    assert scored.nonfinite == sorted(bad)
    for k in range(len(prompts)):
        if k in bad:
            assert scored.scores[k].item() == -5.0
        else:
            assert scored.scores[k].item() == pytest.approx(whole[k].item(), abs=1e-5)


def test_a_slow_encoder_is_waited_for_and_every_item_is_counted_once(monkeypatch):
    """A wave that takes several wait steps to encode is waited for (the worker is alive), not taken for a dead
    worker; the progress bar counts every item of the call once, the over-length ones included."""
    import time

    import tqdm.auto

    monkeypatch.setattr(overlap, "WAIT_STEP_S", 0.02)
    bars = []

    class Bar:
        def __init__(self, total, initial, desc, unit):
            self.total, self.n = total, initial
            bars.append(self)

        def update(self, n):
            self.n += n

        def close(self):
            pass

    monkeypatch.setattr(tqdm.auto, "tqdm", Bar)

    class SlowEncoding(CountingScorer):
        def encode(self, contexts, completions, *, first=0):
            time.sleep(0.1)  # five wait steps
            return super().encode(contexts, completions, first=first)

    outputs, present, over = overlap.overlapped_outputs(SlowEncoding(), GROUPS, TOKENS, (None, 4), progress=True)
    assert present == list(range(9)) and over == [9] and outputs[:9, 1].tolist() == [float(k) for k in range(9)]
    assert [(b.total, b.n) for b in bars] == [(10, 10)]
