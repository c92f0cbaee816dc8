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
    assert list(overlap.context_groups([a, a, list(a), b, a])) == [(0, 3), (3, 4), (4, 5)]  # equal, not only the same
    assert list(overlap.context_groups([])) == []


def test_progress_is_one_bar_over_the_items(model, tiny_tokenizer, monkeypatch):
    """As the engine's bar over its passes: shown when asked, and unasked only past 8 waves (opened at the ninth,
    counting what the first 8 did)."""
    import tqdm.auto

    bars = []

    class Bar:
        def __init__(self, total, initial, desc, unit):
            self.total, self.n, self.closed = total, initial, False
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
    assert [(b.total, b.n, b.closed) for b in bars] == [(24, 24, True)]
    scorer.score(prompts[:4], completions[:4], progress=True)
    assert [(b.total, b.n, b.closed) for b in bars[1:]] == [(4, 4, True)]
