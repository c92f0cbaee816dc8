"""RewardScorer: parity with one-at-a-time scoring, bounded batches, truncation, fallbacks, templating rules."""

from __future__ import annotations

import copy
import math
import random

import pytest
import torch
from helpers import _one_thread, reference_ids, reference_scores, reference_text, score_one, watch_passes  # noqa: F401

from trl_rm_env.data.messages import strip_reasoning_text
from trl_rm_env.scoring.scorer import RewardScorer, as_pairs, split_conversation
from trl_rm_env.tiny_models import SAMPLE_DIR, build_tiny_reward_model
from trl_rm_env.tokenization import encode_conversation, left_truncate

# ---------------------------------------------------------------------------------------------------- data

SHORT = "Ok."
LONG = " ".join(f"Step {i}: add {i} and {i + 1} to get {2 * i + 1}." for i in range(8))


def conversations():
    """Eleven conversational (prompt, completion) pairs of very different lengths, a shared prompt object included."""
    shared = [
        {"role": "system", "content": "You are a careful math tutor."},
        {"role": "user", "content": "What is 2+2?"},
    ]
    prompts, completions = [], []
    answers = ["4", "The answer is 4.", "", SHORT, LONG, "2 + 2 = 5. The answer is 5.", LONG[:200]]
    for a in answers:
        prompts.append(shared)  # GRPO repeats the same prompt object
        completions.append([{"role": "assistant", "content": a}])
    for i in range(4):
        prompts.append([{"role": "user", "content": f"How much is {i} plus {i + 3}?" + " Explain." * i}])
        completions.append([{"role": "assistant", "content": f"{i} + {i + 3} = {2 * i + 3}. " * (1 + 5 * i)}])
    return prompts, completions


def plain_pairs():
    prompts = ["What is 1 + 1? ", "Compute 7 + 8. ", "Please add 3 and 4. " * 5, "Hi"]
    completions = ["The answer is 2.", SHORT, LONG, " there"]
    return prompts, completions


# ---------------------------------------------------------------------------------------------------- parity


@pytest.fixture(scope="module")
def conv_reference(tiny_rm, tiny_tokenizer):
    prompts, completions = conversations()
    return prompts, completions, reference_scores(tiny_rm, tiny_tokenizer, prompts, completions)


@pytest.mark.parametrize("batch_size", [1, 3, 8, None, 1000])
def test_parity_with_one_at_a_time_scoring(tiny_rm, tiny_tokenizer, conv_reference, batch_size):
    prompts, completions, want = conv_reference
    scorer = RewardScorer(tiny_rm, tiny_tokenizer, batch_size=batch_size, prefix_sharing=False)
    with watch_passes(scorer) as passes:
        got = scorer.score(prompts, completions)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, want, atol=1e-4, rtol=0)
    n = len(prompts)
    rows = [r for r, _ in passes.shapes]
    assert sum(rows) == n
    expected_rows = min(batch_size or 32, n)
    assert max(rows) == expected_rows
    # Input order: the scores of the reversed input are the reversed scores.
    back = scorer.score(prompts[::-1], completions[::-1])
    torch.testing.assert_close(back, want.flip(0), atol=1e-4, rtol=0)
    # The scores are not all equal (a permutation mix-up would otherwise go unnoticed).
    assert want.unique().numel() == n


@pytest.mark.parametrize("factor", [1.0, 1.5, 4.0])
def test_parity_with_token_budget(tiny_rm, tiny_tokenizer, conv_reference, factor):
    prompts, completions, want = conv_reference
    lengths = [len(reference_ids(tiny_tokenizer, p, c)) for p, c in zip(prompts, completions)]
    budget = int(factor * max(lengths))
    scorer = RewardScorer(tiny_rm, tiny_tokenizer, max_tokens_per_batch=budget, prefix_sharing=False)
    assert scorer.options.rows_per_pass() is None  # the budget alone limits the batches
    with watch_passes(scorer) as passes:
        got = scorer.score(prompts, completions)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=0)
    shapes = passes.shapes
    assert sum(rows for rows, _ in shapes) == len(prompts)
    for rows, length in shapes:
        assert rows * length <= budget
    assert max(rows for rows, _ in shapes) > 1  # the budget is used, not one row per batch
    assert [length for _, length in shapes] == sorted((length for _, length in shapes), reverse=True)


def test_plain_text_parity(tiny_rm, tiny_tokenizer):
    prompts, completions = plain_pairs()
    scorer = RewardScorer(tiny_rm, tiny_tokenizer, batch_size=2)
    got = scorer.score(prompts, completions)
    want = reference_scores(tiny_rm, tiny_tokenizer, prompts, completions)
    torch.testing.assert_close(got, want, atol=1e-4, rtol=0)
    # EOS is appended exactly once, also when the completion already ends with it.
    eos = tiny_tokenizer.eos_token
    ids = encode_conversation(tiny_tokenizer, "Q: 1+1? ", "2" + eos)
    assert ids == tiny_tokenizer("Q: 1+1? 2" + eos)["input_ids"]
    assert ids.count(tiny_tokenizer.eos_token_id) == 1


def test_bos_template_single_bos_and_parity(bos_tokenizer):
    model = build_tiny_reward_model(bos_tokenizer, seed=3)
    bos = bos_tokenizer.bos_token_id
    prompts, completions = conversations()
    scorer = RewardScorer(model, bos_tokenizer, batch_size=4)
    # The naive path (template text, then tokenize) gives two BOS tokens: the case under test is real.
    naive = bos_tokenizer(bos_tokenizer.apply_chat_template(prompts[0] + completions[0], tokenize=False))["input_ids"]
    assert naive[:2] == [bos, bos]
    encoded = scorer.encode(prompts, completions)
    for ids, p, c in zip(encoded.ids, prompts, completions):
        assert ids[0] == bos and ids.count(bos) == 1
        assert ids == reference_ids(bos_tokenizer, p, c)
    got = scorer.score(prompts, completions)
    torch.testing.assert_close(got, reference_scores(model, bos_tokenizer, prompts, completions), atol=1e-4, rtol=0)


def test_mixed_lengths_exact_per_row(tiny_rm, tiny_tokenizer):
    """A very short sequence padded next to a long one scores as it does alone."""
    short = tiny_tokenizer("Hi")["input_ids"]
    long = tiny_tokenizer(LONG)["input_ids"]
    assert len(long) > 20 * len(short)
    scorer = RewardScorer(tiny_rm, tiny_tokenizer, batch_size=8)
    with watch_passes(scorer) as passes:
        got = scorer.score_ids([short, long, short[:1]])
    assert passes.shapes == [(3, len(long))]
    want = torch.tensor([score_one(tiny_rm, short), score_one(tiny_rm, long), score_one(tiny_rm, short[:1])])
    torch.testing.assert_close(got, want, atol=1e-4, rtol=0)


# ---------------------------------------------------------------------------------------------------- memory


@pytest.mark.slow
def test_token_budget_bounds_every_batch_at_scale(tiny_tokenizer):
    """512 completions of ~512 tokens: no forward pass is over the token budget; batches go longest first."""
    model = build_tiny_reward_model(
        tiny_tokenizer,
        seed=5,
        hidden_size=16,
        intermediate_size=16,
        num_hidden_layers=1,
        num_attention_heads=1,
        num_key_value_heads=1,
        head_dim=16,
    )
    corpus_ids = tiny_tokenizer((SAMPLE_DIR / "corpus.txt").read_text(encoding="utf-8"))["input_ids"]
    rng = random.Random(0)
    prompts, completions = [], []
    for i in range(512):
        n = rng.randint(448, 576)
        start = rng.randint(0, len(corpus_ids) - n)
        prompts.append([{"role": "user", "content": f"Question {i}"}])
        completions.append([{"role": "assistant", "content": tiny_tokenizer.decode(corpus_ids[start : start + n])}])
    budget = 4096
    scorer = RewardScorer(model, tiny_tokenizer, max_tokens_per_batch=budget, show_progress=False)
    encoded = scorer.encode(prompts, completions)
    lengths = [len(ids) for ids in encoded.ids]
    assert not encoded.truncated and 400 < sum(lengths) / len(lengths) < 600
    with watch_passes(scorer) as passes:
        scores = scorer.score(prompts, completions)
    assert scores.shape == (512,) and torch.isfinite(scores).all()
    shapes = passes.shapes
    assert sum(rows for rows, _ in shapes) == 512
    for rows, length in shapes:
        assert rows * length <= budget, (rows, length)
    assert max(rows for rows, _ in shapes) > 1  # it does batch
    # Longest first: padded lengths never increase, and the first batch holds the longest sequence.
    padded = [length for _, length in shapes]
    assert padded == sorted(padded, reverse=True) and padded[0] == max(lengths)
    # Sorting keeps padding small: under 10% of the tokens computed.
    assert sum(rows * length for rows, length in shapes) < 1.1 * sum(lengths)
    # Exact: a few items against one-at-a-time scoring.
    for i in (0, 17, 511, max(range(512), key=lengths.__getitem__)):
        assert (
            abs(scores[i].item() - score_one(model, reference_ids(tiny_tokenizer, prompts[i], completions[i]))) < 1e-4
        )


def test_plan_batches_longest_first_and_limits(tiny_rm, tiny_tokenizer):
    lengths = [3, 10, 5, 10, 1, 7, 7]
    scorer = RewardScorer(tiny_rm, tiny_tokenizer, max_tokens_per_batch=20)
    batches = scorer.engine.plan_batches(lengths)
    flat = [i for b in batches for i in b]
    assert sorted(flat) == list(range(len(lengths)))
    assert [lengths[i] for i in flat] == sorted(lengths, reverse=True)
    for b in batches:
        assert len(b) * max(lengths[i] for i in b) <= 20
    scorer = RewardScorer(tiny_rm, tiny_tokenizer, batch_size=3, max_tokens_per_batch=1000)
    assert [len(b) for b in scorer.engine.plan_batches(lengths)] == [3, 3, 1]


def test_sequence_longer_than_budget(tiny_rm, tiny_tokenizer):
    """score_ids scores an over-budget sequence alone; score() caps max_length at the budget and truncates."""
    budget = 64
    # The plain path's budget: `short` is a prefix of `long`, which prefix sharing would find and share.
    scorer = RewardScorer(tiny_rm, tiny_tokenizer, max_tokens_per_batch=budget, prefix_sharing=False)
    assert scorer.max_length == budget  # documented: a single sequence must always fit in one batch
    long = tiny_tokenizer(LONG)["input_ids"]
    short = long[:10]
    assert len(long) > budget
    with watch_passes(scorer) as passes:
        got = scorer.score_ids([short, long, short])
    assert passes.shapes == [(1, len(long)), (2, 10)]
    want = torch.tensor([score_one(tiny_rm, short), score_one(tiny_rm, long), score_one(tiny_rm, short)])
    torch.testing.assert_close(got, want, atol=1e-4, rtol=0)

    prompt = [{"role": "user", "content": LONG}]
    completion = [{"role": "assistant", "content": "Done."}]
    with watch_passes(scorer) as passes:
        scorer.score([prompt], [completion])
    assert passes.shapes == [(1, budget)]


# ---------------------------------------------------------------------------------------------------- truncation


def _manual_left_truncation(tok, prompt, completion, max_length):
    full = reference_ids(tok, prompt, completion)
    keep = [full[0]] if tok.bos_token_id is not None and full[0] == tok.bos_token_id else []
    return full, keep + full[len(full) - (max_length - len(keep)) :]


@pytest.mark.parametrize("which", ["plain", "bos"])
def test_left_truncation_keeps_completion(which, tiny_rm, tiny_tokenizer, bos_tokenizer):
    tok = tiny_tokenizer if which == "plain" else bos_tokenizer
    model = tiny_rm if which == "plain" else build_tiny_reward_model(bos_tokenizer, seed=3)
    max_length = 48
    prompt = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": LONG}]
    answer = "The answer is 4."
    completion = [{"role": "assistant", "content": answer}]
    short_prompt = [{"role": "user", "content": "2+2?"}]
    scorer = RewardScorer(model, tok, max_length=max_length, truncation="left")
    encoded = scorer.encode([prompt, short_prompt], [completion, completion])
    assert encoded.truncated == [0]
    full, expected = _manual_left_truncation(tok, prompt, completion, max_length)
    assert len(full) > max_length and encoded.ids[0] == expected and len(expected) == max_length
    if which == "bos":
        assert expected[0] == tok.bos_token_id and expected.count(tok.bos_token_id) == 1
    # The completion's tokens (the assistant turn) are all kept, at the end.
    turn = tok("<|im_start|>assistant\n" + answer + "<|im_end|>\n", add_special_tokens=False)["input_ids"]
    assert expected[-len(turn) :] == turn
    got = scorer.score([prompt, short_prompt], [completion, completion])
    want = [score_one(model, expected), score_one(model, reference_ids(tok, short_prompt, completion))]
    torch.testing.assert_close(got, torch.tensor(want), atol=1e-4, rtol=0)


def test_overlength_completion_error_and_fallback(tiny_rm, tiny_tokenizer):
    prompt = [{"role": "user", "content": "Count."}]
    completion = [{"role": "assistant", "content": LONG}]
    ok = [{"role": "assistant", "content": "1 2 3"}]
    scorer = RewardScorer(tiny_rm, tiny_tokenizer, max_length=32)
    with pytest.raises(
        ValueError, match=r"Item 1 is \d+ tokens, over max_length=32 even after cutting its whole context"
    ):
        scorer.score([prompt, prompt], [ok, completion])
    scorer = RewardScorer(tiny_rm, tiny_tokenizer, max_length=32, overlength_reward=-7.0)
    got = scorer.score([prompt, prompt], [ok, completion])
    assert got[1].item() == -7.0
    assert abs(got[0].item() - score_one(tiny_rm, reference_ids(tiny_tokenizer, prompt, ok))) < 1e-4
    # "none" never truncates: an over-long context also gets the fallback reward.
    long_prompt = [{"role": "user", "content": LONG}]
    scorer = RewardScorer(tiny_rm, tiny_tokenizer, max_length=32, truncation="none", overlength_reward=-3.0)
    got = scorer.score([long_prompt, prompt], [ok, ok])
    assert got[0].item() == -3.0 and got[1].item() != -3.0
    scorer = RewardScorer(tiny_rm, tiny_tokenizer, max_length=32, truncation="none")
    with pytest.raises(ValueError, match=r"Item 0 is \d+ tokens, over max_length=32\. Set `overlength_reward`"):
        scorer.score([long_prompt], [ok])


def test_completion_never_cut_at_merged_token_boundary(tiny_rm, tiny_tokenizer):
    """Plain text: the context's last token can merge with the completion's first; that token is not context."""
    prompt, completion = "Please add 3 and 4. " * 3, "7 is the sum."
    full = reference_ids(tiny_tokenizer, prompt, completion)
    alone = tiny_tokenizer(prompt)["input_ids"]
    context_length = 0
    while full[context_length] == alone[context_length]:
        context_length += 1
    assert context_length < len(alone)  # the boundary token merged: the case is real
    fits = len(full) - context_length  # everything but the context
    scorer = RewardScorer(tiny_rm, tiny_tokenizer, max_length=fits, overlength_reward=-9.0)
    assert abs(scorer.score([prompt], [completion]).item() - score_one(tiny_rm, full[context_length:])) < 1e-4
    scorer = RewardScorer(tiny_rm, tiny_tokenizer, max_length=fits - 1, overlength_reward=-9.0)
    assert scorer.score([prompt], [completion]).item() == -9.0


def test_left_truncate_helper():
    assert left_truncate([1, 2, 3], 2, 5, None) == [1, 2, 3]
    assert left_truncate([9, 1, 2, 3, 4, 5], 4, 4, 9) == [9, 3, 4, 5]
    assert left_truncate([1, 2, 3, 4, 5, 6], 3, 4, None) == [3, 4, 5, 6]
    assert left_truncate([1, 2, 3, 4, 5, 6], 1, 4, None) is None  # would cut into the completion


def test_bad_truncation_and_batch_size(tiny_rm, tiny_tokenizer):
    with pytest.raises(ValueError, match=r"truncation must be one of \['left', 'none'\], got 'right'"):
        RewardScorer(tiny_rm, tiny_tokenizer, truncation="right")
    with pytest.raises(ValueError, match="batch_size must be >= 1"):
        RewardScorer(tiny_rm, tiny_tokenizer, batch_size=0)


# ---------------------------------------------------------------------------------------------------- bad inputs


def test_count_mismatch_and_mixed_formats(tiny_rm, tiny_tokenizer):
    prompts, completions = conversations()
    scorer = RewardScorer(tiny_rm, tiny_tokenizer)
    with pytest.raises(ValueError, match=r"Got 11 contexts but 10 completions"):
        scorer.score(prompts, completions[:-1])
    with pytest.raises(TypeError, match="both be strings .* or both be lists of messages"):
        scorer.score(["plain prompt"], [completions[0]])


def test_nonfinite_scores(tiny_rm, tiny_tokenizer):
    prompts, completions = conversations()
    broken = copy.deepcopy(tiny_rm)
    with torch.no_grad():
        broken.score.weight.fill_(float("nan"))
    with pytest.raises(FloatingPointError, match=r"NaN/inf for item\(s\) \[0, 1, 2, 3, 4, 5, 6, 7, 8, 9\]\.\.\."):
        RewardScorer(broken, tiny_tokenizer).score(prompts, completions)
    got = RewardScorer(broken, tiny_tokenizer, nonfinite_reward=-10.0).score(prompts, completions)
    assert got.tolist() == [-10.0] * len(prompts)


def test_nonfinite_only_for_bad_rows(tiny_rm, tiny_tokenizer, conv_reference, monkeypatch):
    """Only the rows that came back NaN get `nonfinite_reward`; the error names exactly those items."""
    prompts, completions, want = conv_reference
    bad_length = len(reference_ids(tiny_tokenizer, prompts[4], completions[4]))  # LONG: a unique length
    model = copy.deepcopy(tiny_rm)
    forward = model.forward

    def nan_forward(*args, **kwargs):
        out = forward(*args, **kwargs)
        rows = kwargs["attention_mask"].sum(-1) == bad_length
        out.logits[rows] = float("nan")
        return out

    monkeypatch.setattr(model, "forward", nan_forward)
    with pytest.raises(FloatingPointError, match=r"item\(s\) \[4\]\. Check the model dtype"):
        RewardScorer(model, tiny_tokenizer, batch_size=3, prefix_sharing=False).score(prompts, completions)
    got = RewardScorer(model, tiny_tokenizer, batch_size=3, nonfinite_reward=0.5, prefix_sharing=False).score(
        prompts, completions
    )
    want = want.clone()
    want[4] = 0.5
    torch.testing.assert_close(got, want, atol=1e-4, rtol=0)


# ---------------------------------------------------------------------------------------------------- reasoning


def test_strip_reasoning_text():
    assert strip_reasoning_text("<think>a\nb</think>\n\nAnswer 4") == "Answer 4"
    assert strip_reasoning_text("Pre <think>x</think> mid <think>y</think>end") == "Pre mid end"
    assert strip_reasoning_text("Answer <think>never closed") == "Answer "
    assert strip_reasoning_text("no tags") == "no tags"


def test_strip_reasoning_scores_stripped_text(tiny_rm, tiny_tokenizer):
    prompts = [[{"role": "user", "content": "2+2?"}], "Plain: 2+2? "]
    completions = [
        [{"role": "assistant", "content": "<think>Two and two.\nThat is four.</think>\nThe answer is 4."}],
        "<think>hmm</think>It is 4.",
    ]
    stripped = [[{"role": "assistant", "content": "The answer is 4."}], "It is 4."]
    got = RewardScorer(tiny_rm, tiny_tokenizer, strip_reasoning=True).score(prompts, completions)
    torch.testing.assert_close(got, reference_scores(tiny_rm, tiny_tokenizer, prompts, stripped), atol=1e-4, rtol=0)
    raw = RewardScorer(tiny_rm, tiny_tokenizer).score(prompts, completions)
    assert (raw - got).abs().min() > 1e-4  # stripping changed what was scored
    assert completions[0][0]["content"].startswith("<think>")  # inputs are not mutated


# ---------------------------------------------------------------------------------------------------- pairs


def test_split_conversation_and_as_pairs():
    conv = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "a1"},
        {"role": "user", "content": "q2"},
        {"role": "assistant", "content": "a2"},
    ]
    context, completion = split_conversation(conv)
    assert context == conv[:3] and completion == conv[3:]
    with pytest.raises(ValueError, match="does not end with an assistant message"):
        split_conversation(conv[:3])
    contexts, completions = as_pairs([conv, ("p", "c")])
    assert contexts == [conv[:3], "p"] and completions == [conv[3:], "c"]


# ---------------------------------------------------------------------------------------------------- the scoring seam


class OneAtATimeEngine:
    """An `Engine` that runs the plain model on each sequence alone and records what it was asked."""

    name = "one-at-a-time"

    def __init__(self, model):
        self.model = model
        self.num_labels = model.config.num_labels
        self.calls: list[int] = []

    def outputs(self, sequences, context_lengths=None, progress=None):
        self.calls.append(len(sequences))
        rows = [self.model(input_ids=torch.tensor([list(s)])).logits[0].float() for s in sequences]
        return torch.stack(rows) if rows else torch.empty(0, self.num_labels)


def test_both_backends_implement_the_scorer_protocol(tiny_rm, tiny_tokenizer):
    from trl_rm_env.scoring.interfaces import Scorer
    from trl_rm_env.serving.client import RemoteScorer

    local = RewardScorer(tiny_rm, tiny_tokenizer)
    remote = RemoteScorer("http://127.0.0.1:9")  # nothing is sent until it scores
    assert isinstance(local, Scorer) and not local.is_async
    assert isinstance(remote, Scorer) and remote.is_async
    assert not isinstance(object(), Scorer)


def test_an_engine_plugged_into_the_scorer_serves_scoring_ids_and_eval(tiny_rm, tiny_tokenizer, conv_reference):
    """A new engine is one object with `outputs()`: the scorer's templates, token ids (the server's path) and
    `eval` all run through it, with the exact scores of the default engine."""
    from trl_rm_env.evaluation import evaluate_reward_model

    engine = OneAtATimeEngine(tiny_rm)
    scorer = RewardScorer(tiny_rm, tiny_tokenizer, engine=engine)
    prompts, completions, want = conv_reference
    with torch.no_grad():
        scores = scorer.score(prompts, completions)
    torch.testing.assert_close(scores, want, atol=1e-4, rtol=0)
    assert engine.calls == [len(prompts)]

    ids = [reference_ids(tiny_tokenizer, p, c) for p, c in zip(prompts[:3], completions[:3])]
    with torch.no_grad():
        torch.testing.assert_close(scorer.score_ids(ids), want[:3], atol=1e-4, rtol=0)
    assert engine.calls[-1] == 3

    records = [
        {"context": prompts[7], "completions": [{"rank": 0, "completion": completions[7]},
                                                {"rank": 1, "completion": completions[8]}]},
    ]  # fmt: skip
    with torch.no_grad():
        results = evaluate_reward_model(scorer, {"set": records}, progress=False)
    assert engine.calls[-1] == 2
    expected = float(want[7] > want[8])
    assert results["sets"]["set"]["accuracy"] == expected


def test_vllm_cpu_worker_gets_every_core_of_a_small_machine(monkeypatch):
    """vLLM's CPU worker keeps a core for its scheduler; on a machine of a few cores ours asks for none (measured
    about 2x faster on 2 cores), and a user's own setting of vLLM's thread variables always wins."""
    from trl_rm_env.runtime.vllm import FEW_CPUS, cpu_thread_env

    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(2)), raising=False)
    assert cpu_thread_env({}) == {"VLLM_CPU_NUM_OF_RESERVED_CPU": "0"}
    assert cpu_thread_env({"VLLM_CPU_NUM_OF_RESERVED_CPU": "1"}) == {}
    assert cpu_thread_env({"VLLM_CPU_OMP_THREADS_BIND": "0-1"}) == {}
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(FEW_CPUS + 1)), raising=False)
    assert cpu_thread_env({}) == {}


def test_a_max_length_beyond_the_models_positions_is_refused_before_vllm_starts():
    """vLLM refuses it too, but as a traceback deep in its engine's log; `serve --engine vllm --max-length` and the
    vLLM engine of the environment get one line naming both lengths. A scaled RoPE is vLLM's to judge."""
    from types import SimpleNamespace

    from trl_rm_env.runtime.model_options import ScoringOptions
    from trl_rm_env.runtime.vllm import check_max_length, engine_arguments

    config = SimpleNamespace(max_position_embeddings=4096, rope_parameters={"rope_type": "default"}, hidden_size=64,
                             num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16)  # fmt: skip
    check_max_length(config, 4096)
    check_max_length(config, None)
    with pytest.raises(ValueError, match=r"max_length 8192 is beyond the model's 4096 positions .*use at most 4096"):
        engine_arguments(config, ScoringOptions(max_length=8192))
    check_max_length(SimpleNamespace(max_position_embeddings=4096, rope_parameters={"rope_type": "yarn"}), 8192)
    check_max_length(SimpleNamespace(max_position_embeddings=4096, rope_scaling={"type": "linear"}), 8192)


def test_vllms_server_gets_every_engine_argument_as_llm_gets_it():
    """The server's flags say what `LLM(**arguments)` is told, False included: `prefix_sharing=False` turns vLLM's
    prefix caching off on its server too (`--no-enable-prefix-caching`, not vLLM's default), and
    `vllm_enforce_eager` is `--enforce-eager` there and `enforce_eager=True` in process."""
    from types import SimpleNamespace

    from trl_rm_env.runtime.model_options import ScoringOptions
    from trl_rm_env.runtime.vllm import engine_arguments
    from trl_rm_env.serving.server.vllm_server import vllm_server_command

    config = SimpleNamespace(max_position_embeddings=256, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                             num_key_value_heads=2, head_dim=16)  # fmt: skip
    default = engine_arguments(config, ScoringOptions())
    assert default["enable_prefix_caching"] is True and "enforce_eager" not in default
    arguments = engine_arguments(config, ScoringOptions(prefix_sharing=False, vllm_enforce_eager=True))
    assert arguments["enable_prefix_caching"] is False and arguments["enforce_eager"] is True
    command = vllm_server_command("m", arguments, served_names=["m"], host="127.0.0.1", port=1)
    assert "--no-enable-prefix-caching" in command and "--enforce-eager" in command
    assert "--no-trust-remote-code" in command and "--enable-prefix-caching" not in command
    assert command[command.index("--max-model-len") + 1] == "256"
    from trl_rm_env.runtime.plan import choose_engine

    with pytest.raises(ValueError, match=r"vllm_enforce_eager \(--enforce-eager, reward_vllm_enforce_eager\) applies "
                                         r"to engine='vllm'"):
        choose_engine(ScoringOptions(engine="hf", vllm_enforce_eager=True))


def test_a_server_answering_several_outputs_per_sample_is_refused_naming_it():
    """vLLM's own server of a model with several outputs (an ensemble's heads, a regression RM's attributes) answers
    all of them; the client reads one reward and takes none of them as it, in one error naming the server."""
    from trl_rm_env.serving.client import RemoteScorer, RemoteScoringError

    url = "http://127.0.0.1:9"
    for api, field in (("pooling", "data"), ("classify", "probs")):
        client = RemoteScorer(url, remote_api=api)
        assert client._read_score({"data": [{field: [1.5]}]}, url) == 1.5
        assert math.isnan(client._read_score({"data": [{field: [None]}]}, url))
        with pytest.raises(RemoteScoringError, match=rf"server {url} answered 3 outputs per sample in data\[0\]\.{field}, "
                                                     r"where one is the reward: .* `trl-rm-env serve`"):  # fmt: skip
            client._read_score({"data": [{field: [1.5, -0.5, 2.0]}]}, url)
        with pytest.raises(RemoteScoringError, match="answered without a score"):
            client._read_score({"data": [{}]}, url)
