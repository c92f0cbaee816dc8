"""The reward pipeline's pieces driven directly, without a model:

- PAR's reference column (`ReferenceBound.references`): one reference per sample, shaped as its completion;
- NeMo RL's blocks (`trl_rm_env.rewards.nemo`): `env.reward_model` -> our arguments (`environment_arguments`), its
  `tokenizer.chat_template` (`nemo_chat_template`, a `.jinja` file read as UTF-8), `grpo.reward_shaping` ->
  `LengthShaping` arguments (`length_shaping_arguments`);
- `EnsembleReward` over plain reward functions (names, TRL's arguments passed on, aggregation, metrics, async);
- `RewardFunction` around a fake scorer (`Fixed`: a fixed score per completion text): TRL's inputs checked, empty
  completions, NaN/inf, group shaping (and its warning under several processes), normalization, NeMo RL's length
  shaping, clipping, metrics and the reward-hacking diagnostics; `Reward`'s request driver, sync and awaited.

Expected values are literals worked out by hand (the derivation in a comment), NeMo RL's and NeMo Gym's documented
semantics and formulas, or Python's `statistics` (`fmean`, `pstdev`, `median`, `correlation`); never the function
under test. Every error, warning and log line is asserted whole: its text is what a user reads.
"""

from __future__ import annotations

import builtins
import re

import numpy as np
import pytest
import torch

from trl_rm_env.rewards.base import RewardFunction, RewardOptions
from trl_rm_env.rewards.ensemble import EnsembleReward, aggregate
from trl_rm_env.rewards.reference_bound import ReferenceBound


def full(message: str) -> str:
    """A `match=` pattern for exactly `message`."""
    return "^" + re.escape(message) + "$"


# ---------------------------------------------------------------------------------------------------- PAR's references
def msg(content):
    return [{"role": "assistant", "content": content}]


def test_the_reference_column_gives_each_sample_its_reference_shaped_as_its_completion():
    """One reference per sample: a text completion's reference as it is; a conversational completion's text reference
    as the assistant's message, a reference already in messages as it is. Anything but one value per sample (no
    column, a string, a short list, a number, an array, a mapping) is refused naming the columns TRL did pass (lists
    and tuples of one value per sample only); None values are refused naming the first ten samples."""
    bound = ReferenceBound(reference_column="gold")
    assert bound.references(["a", "b"], {"gold": ["x", "y"]}, "rm") == ["x", "y"]
    assert bound.references([msg("a"), msg("b")], {"gold": ("x", msg("y"))}, "rm") == [msg("x"), msg("y")]
    # TRL's own keyword arguments (trainer_state, log_metric) have no length; a string of 2 characters is no column.
    passed = {"answer": ["p", "q"], "ids": (1, 2), "short": [1], "text": "pq", "trainer_state": object(), "step": 2}
    refused = ("rm: reference_column='gold', but TRL passed no such column with one value per sample; the dataset "
               "columns it passed: ['answer', 'ids']")  # fmt: skip
    for gold in (None, "xy", ["x"], 2, np.array(["x", "y"]), {0: "x", 1: "y"}):
        kwargs = passed if gold is None else {**passed, "gold": gold}
        with pytest.raises(ValueError, match=full(refused)):
            bound.references(["a", "b"], kwargs, "rm")
    # 12 samples, references 1 to 11 missing: the first ten of them are named.
    gold = ["x"] + [None] * 11
    with pytest.raises(ValueError, match=full("rm: reference column 'gold' is None for samples [1, 2, 3, 4, 5, 6, 7, "
                                              "8, 9, 10]")):  # fmt: skip
        bound.references(["a"] * 12, {"gold": gold}, "rm")
    # PAR's temperature divides the gap: any positive one, never 0.
    assert ReferenceBound(reference_column="gold", reference_temperature=0.5).reference_temperature == 0.5
    for bad in (0, -1.0):
        with pytest.raises(ValueError, match=full(f"reference_temperature must be > 0, got {bad}")):
            ReferenceBound(reference_column="gold", reference_temperature=bad)


# ---------------------------------------------------------------------------------------------------- NeMo RL's template
def test_a_jinja_chat_template_file_is_read_as_utf8_whatever_the_locale(tmp_path, monkeypatch):
    """NeMo RL's `tokenizer.chat_template: <path>.jinja` is that file's text, read as UTF-8 even where the locale's
    encoding is another (simulated: `open` without an encoding decodes Latin-1 here, as on a Latin-1 locale)."""
    from types import SimpleNamespace

    import trl_rm_env.rewards.nemo as nemo

    tiny_tokenizer = SimpleNamespace(chat_template="{{ the tokenizer's own }}")  # all nemo_chat_template reads
    text = "{% for m in messages %}¿{{ m['content'] }}? — ✓{% endfor %}"
    path = tmp_path / "template.jinja"
    path.write_bytes(text.encode("utf-8"))

    def latin1_locale_open(file, mode="r", buffering=-1, encoding=None, *args, **kwargs):
        return builtins.open(file, mode, buffering, encoding or "latin-1", *args, **kwargs)

    monkeypatch.setattr(nemo, "open", latin1_locale_open, raising=False)
    assert nemo.nemo_chat_template(str(path), tiny_tokenizer) == text
    # NeMo RL's other values: None is its passthrough (the contents concatenated), "default" the tokenizer's own,
    # anything else the template itself.
    assert nemo.nemo_chat_template(None, tiny_tokenizer) == (
        "{% for message in messages %}{{ message['content'] }}{% endfor %}"
    )
    assert nemo.nemo_chat_template("default", tiny_tokenizer) == tiny_tokenizer.chat_template
    assert nemo.nemo_chat_template("{{ messages }}", tiny_tokenizer) == "{{ messages }}"


NEMO_SUPPORTED = [  # NeMo RL's `env.reward_model` keys (examples/configs/grpo_rm_*.yaml), then our own two given
    "batch_size", "checkpoint_path", "clip", "dtensor_cfg", "dynamic_batching", "enabled", "generation",
    "logprob_batch_size", "make_sequence_length_divisible_by", "max_grad_norm", "max_model_len", "megatron_cfg",
    "model_name", "name", "offload_optimizer_for_logprob", "precision", "resources", "reward_model_cfg",
    "sequence_packing", "tokenizer",
]  # fmt: skip


def test_nemo_rls_reward_model_block_becomes_our_arguments(tmp_path, caplog):
    """`environment_arguments` on NeMo RL's `env.reward_model` block (the module docstring's mapping, every expected
    value a literal): what each key sets, the dynamic-batching budget (`logprob_mb_tokens` first, only when enabled),
    the Ray/Megatron keys accepted, a served model's local-only keys left to its server (logged), our own keys taken
    as they are, and every refusal and warning in full."""
    import logging

    from trl_rm_env.rewards.nemo import NOT_SET, environment_arguments

    ours = {"clip", "name", "precision", "batch_size"}  # `precision` and `batch_size` are spelled alike in both
    folder = tmp_path / "hf"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    # A tokenizer given as a string is its name; none given: the model's; no chat_template key: NOT_SET.
    assert environment_arguments({"model_name": "m", "tokenizer": "tok"}, ours) == ("m", "tok", {}, NOT_SET)
    assert environment_arguments({"model_name": "m", "dynamic_batching": None, "reward_model_cfg": None}, ours) == (
        "m", "m", {}, NOT_SET
    )
    # NeMo RL's ready-made block: every key mapped or ignored; the model's folder, not a Hub id, when checkpoint_path
    # is set (it wins over model_name).
    block = {
        "enabled": True, "model_name": "hub/rm", "checkpoint_path": str(folder), "precision": "bfloat16",
        "batch_size": 5, "max_model_len": 77, "logprob_batch_size": 8, "resources": {"gpus_per_node": 1},
        "dtensor_cfg": {"enabled": True}, "max_grad_norm": None, "offload_optimizer_for_logprob": False,
        "generation": None, "megatron_cfg": {}, "make_sequence_length_divisible_by": 1,
        "dynamic_batching": {"enabled": True, "logprob_mb_tokens": 999, "train_mb_tokens": 111},
        "sequence_packing": {"enabled": False},
        "tokenizer": {"name": "tok", "chat_template": None, "chat_template_kwargs": {"enable_thinking": False}},
        "reward_model_cfg": {"enabled": True, "reward_model_type": "regression"},
        "clip": 0.5, "name": "nemo_rm",
    }  # fmt: skip
    with caplog.at_level(logging.INFO, logger="trl_rm_env.rewards.nemo"):
        model, tokenizer, kwargs, template = environment_arguments(block, ours)
    assert (model, tokenizer, template) == (str(folder), "tok", None)  # chat_template: null is NeMo's passthrough
    assert kwargs == {"precision": "bfloat16", "batch_size": 5, "max_length": 77, "max_tokens_per_batch": 999,
                      "template_kwargs": {"enable_thinking": False}, "reward_model_type": "regression", "clip": 0.5,
                      "name": "nemo_rm"}  # fmt: skip
    assert caplog.records == []  # sequence_packing off: nothing to warn of
    # Without precision (the first key mapped) the others still are; the budget from train_mb_tokens when it is the
    # only one; not at all when dynamic batching is off.
    one = {"model_name": "m", "batch_size": 3, "dynamic_batching": {"enabled": True, "train_mb_tokens": 111}}
    assert environment_arguments(one, ours)[2] == {"batch_size": 3, "max_tokens_per_batch": 111}
    off = {"model_name": "m", "precision": "float32", "dynamic_batching": {"enabled": False, "logprob_mb_tokens": 9}}
    assert environment_arguments(off, ours)[2] == {"precision": "float32"}
    # Behind servers, the keys only a model loaded here applies describe the served model: left to it, logged.
    served = {**block, "checkpoint_path": None}
    with caplog.at_level(logging.INFO, logger="trl_rm_env.rewards.nemo"):
        model, tokenizer, kwargs, _ = environment_arguments(served, ours, served=True)
        assert environment_arguments({"model_name": "m", "max_model_len": 9}, ours, served=True)[2] == {"max_length": 9}
    assert (model, tokenizer) == ("hub/rm", "tok")
    assert kwargs == {"max_length": 77, "template_kwargs": {"enable_thinking": False}, "clip": 0.5, "name": "nemo_rm"}
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [(logging.INFO, (
        "reward_model block with remote_url: ['batch_size', 'max_tokens_per_batch', 'precision', 'reward_model_type'] "
        "describe the served model; the server applies them."))]  # fmt: skip
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="trl_rm_env.rewards.nemo"):
        environment_arguments({"model_name": "m", "sequence_packing": {"enabled": True}}, ours)
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [(logging.WARNING, (
        "sequence_packing is ignored: scoring uses token-budget batching (`max_tokens_per_batch`)."))]  # fmt: skip
    # Refusals, each whole.
    refusals = [
        ({"model_name": "m", "enabled": False},
         "The reward_model config has `enabled: false`; there is no reward model to build."),
        ({"model_name": "m", "reward_scale": 2.0},
         f"Unsupported reward_model config key(s) ['reward_scale']. Supported: {NEMO_SUPPORTED}."),
        ({"model_name": None, "checkpoint_path": None},
         "The reward_model config needs `model_name` (a Hub id or a local path)."),
        ({"model_name": "m", "reward_model_cfg": {"enabled": True, "reward_scale": 2.0}},
         "Unsupported reward_model_cfg key(s) ['reward_scale']. Supported: ['enabled', 'reward_model_type']."),
        ({"model_name": "m", "dynamic_batching": {"enabled": True}},
         "dynamic_batching.enabled needs `logprob_mb_tokens` (tokens per micro-batch)."),
        ({"checkpoint_path": str(tmp_path)},
         f"checkpoint_path={str(tmp_path)!r} is not a Hugging Face model folder (no config.json). NeMo RL DCP "
         "checkpoints must be converted first (NeMo RL's `convert_dcp_to_hf`), or set `model_name` only."),
    ]  # fmt: skip
    for config, message in refusals:
        with pytest.raises(ValueError, match=full(message)):
            environment_arguments(config, ours)
    # A checkpoint folder alone is the model and the tokenizer; a template given is returned as it is.
    only = {"checkpoint_path": str(folder), "tokenizer": {"chat_template": "{{ x }}"}}
    assert environment_arguments(only, ours) == (str(folder), str(folder), {}, "{{ x }}")


def test_nemo_rls_reward_shaping_block_becomes_length_shaping_arguments(caplog):
    """`length_shaping_arguments` on NeMo RL's `grpo.reward_shaping` block, as NeMo RL's GRPO applies it: nothing
    unless enabled (the keys set are logged), the stop-properly coefficient winning over the overlong keys (logged,
    naming those set), DAPO's three keys together, `eos_token_id` passed along (0 included), and each refusal whole."""
    import logging

    from trl_rm_env.rewards.nemo import length_shaping_arguments

    dapo = {"overlong_buffer_length": 128, "overlong_buffer_penalty": 1, "max_response_length": 2048}
    with caplog.at_level(logging.INFO, logger="trl_rm_env.rewards.nemo"):
        assert length_shaping_arguments(None) == {}
        assert length_shaping_arguments({"enabled": False, "mode": "response_length", "reasoning_length": {},
                                         "stop_properly_penalty_coef": None}) == {}  # fmt: skip
        assert caplog.records == []  # nothing set that would have applied
        assert length_shaping_arguments({**dapo, "enabled": False, "stop_properly_penalty_coef": None}) == {}
        assert length_shaping_arguments({**dapo, "enabled": True, "eos_token_id": 0}) == {**dapo, "eos_token_id": 0}
        assert length_shaping_arguments({**dapo, "enabled": True, "mode": "response_length"}) == dapo
        stop = {"enabled": True, "stop_properly_penalty_coef": 0.0, "eos_token_id": [2]}
        assert length_shaping_arguments(stop) == {"stop_properly_penalty_coef": 0.0, "eos_token_id": [2]}
        assert length_shaping_arguments({**stop, "overlong_buffer_length": None}) == {
            "stop_properly_penalty_coef": 0.0, "eos_token_id": [2]
        }
        assert length_shaping_arguments({**stop, "overlong_buffer_penalty": 1}) == {
            "stop_properly_penalty_coef": 0.0, "eos_token_id": [2]
        }
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (logging.INFO, "grpo.reward_shaping has enabled: false; ['max_response_length', 'overlong_buffer_length', "
                       "'overlong_buffer_penalty'] are not applied (as in NeMo RL)."),
        (logging.WARNING, "grpo.reward_shaping: stop_properly_penalty_coef is set, so ['overlong_buffer_penalty'] are "
                          "not applied (as in NeMo RL)."),
    ]  # fmt: skip
    refusals = [
        ({"enabled": True, "overlong_penalty": 1},
         "Unsupported grpo.reward_shaping key(s) ['overlong_penalty']. Supported: ['enabled', 'eos_token_id', "
         "'max_response_length', 'mode', 'overlong_buffer_length', 'overlong_buffer_penalty', 'reasoning_length', "
         "'stop_properly_penalty_coef']."),
        ({"enabled": True, "mode": "reasoning_length"},
         "grpo.reward_shaping.mode='reasoning_length': only 'response_length' (DAPO's overlong buffer, the "
         "stop-properly penalty) is built here; NeMo RL's 'reasoning_length' shapes NeMo Gym rollouts' reasoning "
         "chains."),
        ({"enabled": True, "overlong_buffer_length": 4, "overlong_buffer_penalty": 1.0},
         "grpo.reward_shaping is enabled without stop_properly_penalty_coef, so DAPO's overlong buffer applies and "
         "needs ['overlong_buffer_length', 'overlong_buffer_penalty', 'max_response_length']; missing "
         "['max_response_length']"),
    ]  # fmt: skip
    for block, message in refusals:
        with pytest.raises(ValueError, match=full(message)):
            length_shaping_arguments(block)


# ---------------------------------------------------------------------------------------------------- ensembles
def test_an_ensemble_of_reward_functions_calls_each_with_trls_arguments_and_aggregates_per_sample():
    """`EnsembleReward` over plain reward functions (no model): each member gets TRL's arguments as they came (its
    own columns and `log_metric` included), a member's None makes that sample's reward None, each sample aggregated
    in fp64 against `statistics`, the metrics (`ensemble_std`: the mean of each sample's `pstdev`; each member's
    mean) over the complete samples; names from `__name__` (through `functools.partial`) or the class; every refusal
    whole."""
    import functools
    import math
    import statistics
    import threading

    received = []

    def first(prompts, completions, **kwargs):
        received.append(("first", prompts, completions, kwargs.get("completion_ids"), kwargs.get("gold")))
        return [0.1, 1.0, None]

    def scaled(prompts, completions, factor=1.0, **kwargs):
        return [0.2 * factor, 4.0 * factor, 5.0 * factor]

    class Scorer:  # no __name__: named by its class
        def __call__(self, prompts, completions, **kwargs):
            return [0.6, -2.0, 1.0]

    members = [first, functools.partial(functools.partial(scaled, factor=1.0)), Scorer()]
    ensemble = EnsembleReward(members)
    assert (ensemble.__name__, ensemble.member_names, ensemble.is_async) == ("ensemble", ["first", "scaled", "Scorer"],
                                                                            False)  # fmt: skip
    assert repr(ensemble) == "EnsembleReward(['first', 'scaled', 'Scorer'], ensemble='mean')"
    logged = {}
    got = ensemble(["p"] * 3, ["a", "b", "c"], completion_ids=[[1], [2], [3]], gold=["g"] * 3,
                   log_metric=logged.__setitem__)  # fmt: skip
    assert received == [("first", ["p"] * 3, ["a", "b", "c"], [[1], [2], [3]], ["g"] * 3)]
    rows = [[0.1, 0.2, 0.6], [1.0, 4.0, -2.0]]  # sample 2: the first member gave None
    assert got[:2] == pytest.approx([statistics.fmean(r) for r in rows], abs=1e-12) and got[2] is None
    assert logged == pytest.approx({
        "reward_model_env/ensemble_std": statistics.fmean(statistics.pstdev(r) for r in rows),
        "reward_model_env/ensemble_member_0_mean": 0.55, "reward_model_env/ensemble_member_1_mean": 2.1,
        "reward_model_env/ensemble_member_2_mean": -0.7,
    }, abs=1e-12)  # fmt: skip
    assert ensemble(["p"] * 3, ["a", "b", "c"]) == got  # no log_metric: nothing logged, same rewards
    penalised = EnsembleReward(members, ensemble="mean_minus_std", ensemble_penalty=0.5, name="cautious")
    want = [statistics.fmean(r) - 0.5 * statistics.pstdev(r) for r in rows]
    assert penalised.__name__ == "cautious"
    assert penalised(["p"] * 3, ["a", "b", "c"])[:2] == pytest.approx(want, abs=1e-12)
    assert EnsembleReward(members, ensemble="mean_minus_std", ensemble_penalty=0.0)(["p"] * 3, ["a"] * 3)[:2] == (
        pytest.approx([statistics.fmean(r) for r in rows], abs=1e-12)  # a penalty of 0 is the mean
    )
    assert EnsembleReward(members[:2], ensemble="min")(["p"] * 3, ["a"] * 3) == [0.1, 1.0, None]
    assert EnsembleReward(members, ensemble="median")(["p"] * 3, ["a"] * 3) == [0.2, 1.0, None]
    # aggregate's default penalty is 1; `NaN` rows stay NaN.
    table = torch.tensor([[1.0, 3.0], [2.0, math.nan]], dtype=torch.float64)
    assert aggregate(table, "mean_minus_std")[0].item() == 1.0  # mean 2, pstdev 1
    assert math.isnan(aggregate(table, "mean_minus_std")[1].item())

    # Concurrently when any member is asynchronous: the synchronous one in a thread, not holding the event loop.
    threads = []

    async def remote(prompts, completions, **kwargs):
        return [2.0] * len(prompts)

    def local(prompts, completions, **kwargs):
        threads.append(threading.current_thread() is threading.main_thread())
        return [4.0] * len(prompts)

    mixed = EnsembleReward([remote, local], ensemble="min")
    assert mixed.is_async
    import asyncio

    assert asyncio.run(mixed(["p"] * 2, ["a"] * 2)) == [2.0, 2.0] and threads == [False]

    def zero(prompts, completions, **kwargs):
        return [0.0] * len(prompts)

    logged = {}
    assert EnsembleReward([local, zero])([], [], log_metric=logged.__setitem__) == [] and logged == {}  # no samples

    def short(prompts, completions, **kwargs):
        return [1.0]

    with pytest.raises(ValueError, match=full("ensemble: member 'short' returned 1 rewards for 2")):
        EnsembleReward([short, local])(["p"] * 2, ["a"] * 2)
    refusals = [
        (([first],), {}, "EnsembleReward needs two or more members with distinct names, got ['first']"),
        (([first, first],), {}, "EnsembleReward needs two or more members with distinct names, got ['first', 'first']"),
        ((members,), {"ensemble": None},
         "EnsembleReward needs an aggregation, one of ['mean', 'min', 'median', 'mean_minus_std']"),
        ((members,), {"ensemble": "max"}, "ensemble must be one of ['mean', 'min', 'median', 'mean_minus_std'], got 'max'"),
        ((members,), {"ensemble": "mean_minus_std", "ensemble_penalty": -1.0}, "ensemble_penalty must be >= 0, got -1.0"),
        ((members,), {"ensemble": "min", "ensemble_penalty": 2.0},
         "ensemble_penalty weighs mean_minus_std's std; ensemble is 'min'"),
    ]  # fmt: skip
    for args, kwargs, message in refusals:
        with pytest.raises(ValueError, match=full(message)):
            EnsembleReward(*args, **kwargs)
    with pytest.raises(ValueError, match=full("ensemble must be one of ['mean', 'min', 'median', 'mean_minus_std'], "
                                              "got 'max'")):  # fmt: skip
        aggregate(table, "max")


# ---------------------------------------------------------------------------------------------------- RewardFunction
class Fixed(RewardFunction):
    """The pipeline of `RewardFunction` around a "model" that gives each completion's text a fixed score (NaN allowed),
    as a model's reward function runs it (`_plan`, the scorer's request with NaN/inf named, `_filled`, `_finish`);
    `nonfinite` texts are the ones the scorer reports as NaN/inf (they get `nonfinite_reward`)."""

    def __init__(self, table, outputs=None, nonfinite=(), **kwargs):
        from types import SimpleNamespace

        setup = {k: kwargs.pop(k) for k in ("strip_reasoning", "checkpoint_stats", "attributes", "shaping",
                                            "length_shaping") if k in kwargs}  # fmt: skip
        self.table, self.nonfinite, self.asked = table, set(nonfinite), []
        self.outputs = outputs
        self._setup(SimpleNamespace(nonfinite_reward=-5.0), RewardOptions(**kwargs), **setup)

    def _steps(self, prompts, completions, completion_ids, kwargs):
        empty, to_score, rewards = self._plan(prompts, completions, torch.float64)
        nonfinite = []
        if to_score:
            with self._nonfinite_named(to_score, "completions") as nonfinite:
                scores, bad = yield [completions[i] for i in to_score]
                nonfinite.extend(bad)
            rewards[torch.tensor(to_score)] = torch.tensor(scores, dtype=torch.float64)
        rewards = self._filled(rewards, empty, (prompts, completions))
        samples = (prompts, completions, completion_ids)
        log_metric = kwargs.get("log_metric")
        return self._finish(
            rewards, len(empty), log_metric, nonfinite=len(nonfinite), samples=samples, outputs=self.outputs
        )

    def _answer(self, request):
        texts = [c if isinstance(c, str) else c[-1]["content"] for c in request]
        self.asked.append(texts)
        bad = [k for k, t in enumerate(texts) if t in self.nonfinite]
        return [-5.0 if t in self.nonfinite else self.table[t] for t in texts], bad


def test_trls_inputs_are_checked_and_refused_in_one_line():
    """What TRL passes is checked before anything is scored: lists of one prompt per completion, text with text or
    messages with messages, a completion's roles the policy's own; each refusal whole."""
    reward = Fixed({"a": 1.0}, name="fixed")
    user, answer = [{"role": "user", "content": "q"}], [{"role": "assistant", "content": "a"}]
    refusals = [
        (("q", ["a"]), TypeError, "prompts must be a list (one item per completion, as TRL passes them), got str"),
        ((b"q", ["a"]), TypeError, "prompts must be a list (one item per completion, as TRL passes them), got bytes"),
        ((["q"], {"a": 1}), TypeError,
         "completions must be a list (one item per completion, as TRL passes them), got dict"),
        ((["q"], iter(["a"])), TypeError,
         "completions must be a list (one item per completion, as TRL passes them), got list_iterator"),
        ((["q", "q"], ["a"]), ValueError, "fixed: got 2 prompts but 1 completions; there must be one prompt per "
                                          "completion (TRL repeats each prompt num_generations times)."),
        (([user, "q"], [answer, answer]), TypeError,
         "prompts[1] and completions[1] must both be text or both be message lists, got str and list."),
        (([user], [[{"role": "user", "content": "a"}]]), ValueError,
         "completions[0][0].role is 'user', a role a completion cannot hold: a completion holds the policy's turns "
         "only (roles ['assistant', 'tool']); put other turns in the prompt."),
        (([user, [{"content": "q"}]], [answer, answer]), TypeError,
         "prompts[1][0] must be a message with 'role' and 'content'; it has no 'role' (keys: ['content'])"),
    ]  # fmt: skip
    for args, error, message in refusals:
        with pytest.raises(error, match=full(message)):
            reward(*args)
    assert reward.asked == []  # nothing was scored
    assert reward([user], [answer]) == [1.0] and reward(("q",), ("a",)) == [1.0]  # tuples are lists too


def test_the_pipeline_fills_empties_shapes_normalizes_clips_and_logs(monkeypatch, caplog):
    """The steps around a model's scores, each expected value by hand: empty completions (blank text, blank messages,
    with `strip_reasoning` a reasoning alone) get `empty_completion_reward` unscored, or are scored when it is None
    (counted either way); a NaN score is no reward (None, left out of every statistic); NaN/inf reported by the
    scorer get `nonfinite_reward`, warned once; then normalization, NeMo RL's length shaping (from completion_ids),
    clipping; the metrics (population std), the hacking diagnostics read before length shaping."""
    import logging
    import math
    import statistics

    table = {"a": 0.1, "bb": 3.0, "ccc": float("nan"), "dddd": 2.0, "  ": 7.0, "<think>x</think>": 4.0}  # 0.1: fp64
    prompts = ["p"] * 6
    completions = ["a", "bb", "ccc", "dddd", "  ", "<think>x</think>"]
    ids = [[5, 2], [5, 5, 2], [5], [5, 5, 5, 5], [5], [5, 2]]
    # Empties scored (None): "  " is empty but scored (7); the reasoning is an answer without strip_reasoning.
    reward = Fixed(table, name="fixed")
    assert reward.num_nonfinite == 0 and reward.__name__ == "fixed"
    logged = {}
    got = reward(prompts, completions, completion_ids=ids, log_metric=logged.__setitem__)
    assert got == [0.1, 3.0, None, 2.0, 7.0, 4.0]
    assert reward.asked == [completions]
    kept = [0.1, 3.0, 2.0, 7.0, 4.0]
    lengths = [2, 3, 4, 1, 2]  # completion_ids of the kept samples
    assert logged == pytest.approx({
        "reward_model_env/num_samples": 5.0, "reward_model_env/mean_reward": statistics.fmean(kept),
        "reward_model_env/std_reward": statistics.pstdev(kept), "reward_model_env/min_reward": 0.1,
        "reward_model_env/max_reward": 7.0, "reward_model_env/num_empty": 1.0, "reward_model_env/num_nonfinite": 0.0,
        "reward_model_env/length_corr": statistics.correlation(kept, lengths), "reward_model_env/flat_groups": 0.0,
    }, abs=1e-12)  # fmt: skip
    # Empties at -1, unscored; strip_reasoning makes the reasoning alone empty too; "bb" reported NaN/inf by the
    # scorer: nonfinite_reward (-5), warned once, counted.
    reward = Fixed(table, nonfinite={"bb"}, name="fixed", empty_completion_reward=-1.0, strip_reasoning=True)
    logged = {}
    with caplog.at_level(logging.WARNING, logger="trl_rm_env.rewards.base"):
        got = reward(prompts, completions, log_metric=logged.__setitem__)
        assert reward(prompts, completions) == got
    assert got == [0.1, -5.0, None, 2.0, -1.0, -1.0]
    assert reward.asked == [["a", "bb", "ccc", "dddd"]] * 2 and reward.num_nonfinite == 2
    assert logged["reward_model_env/num_empty"] == 2.0 and logged["reward_model_env/num_nonfinite"] == 1.0
    assert [r.getMessage() for r in caplog.records] == [
        "fixed: the reward model returned NaN/inf for 1 of 4 samples (completions[1]); they get nonfinite_reward=-5.0. "
        "Warned once: later ones are counted in `reward_model_env/num_nonfinite` and `num_nonfinite`."
    ]
    # Checkpoint normalization (r - 2) / 4, NeMo RL's stop-properly penalty (x 0.5 for a completion not ending with
    # 2), clipping to [-0.3, 0.3]; the diagnostics read the normalized rewards before the penalty.
    from trl_rm_env.rewards.shaping import LengthShaping

    shaping = LengthShaping(stop_properly_penalty_coef=0.5, eos_token_id=2)
    reward = Fixed(table, name="fixed", normalization="checkpoint", checkpoint_stats=(2.0, 4.0), clip=0.3,
                   length_shaping=shaping)  # fmt: skip
    logged = {}
    got = reward(prompts[:4], completions[:4], completion_ids=ids[:4], log_metric=logged.__setitem__)
    # normalized: -0.475, 0.25, NaN, 0; shaped: -0.475, 0.25, NaN, 0 * 0.5 (truncated); clipped: -0.3, 0.25, NaN, 0
    assert got == [-0.3, 0.25, None, 0.0]
    assert logged["reward_model_env/raw_mean_reward"] == pytest.approx(1.7, abs=1e-12)  # raw scores 0.1, 3, 2
    assert logged["reward_model_env/length_corr"] == pytest.approx(
        statistics.correlation([-0.475, 0.25, 0.0], [2, 3, 4]), abs=1e-12
    )
    # Length shaping reads TRL's completion_ids: without them, refused.
    with pytest.raises(ValueError, match=full("fixed: length shaping reads TRL's completion_ids (one list per "
                                              "completion); got none")):  # fmt: skip
        reward(prompts[:2], completions[:2])
    with pytest.raises(ValueError, match=full("fixed: length shaping reads TRL's completion_ids (one list per "
                                              "completion); got none")):  # fmt: skip
        reward._finish(torch.zeros(2, dtype=torch.float64), 0, None)
    wide = Fixed({"a": 3e-6, "b": -3e-6}, normalization="checkpoint", checkpoint_stats=(0.0, 0.0), clip=2.0)
    assert wide(["p", "p"], ["a", "b"]) == [2.0, -2.0]  # (r - 0) / 1e-6 (the std's floor): +-3, clipped to [-2, 2]
    logged = {}
    assert Fixed({"a": 1.0}, attributes=("x",))(["p"], ["a"], log_metric=logged.__setitem__) == [1.0]
    assert logged == {"reward_model_env/num_samples": 1.0, "reward_model_env/mean_reward": 1.0,
                      "reward_model_env/std_reward": 0.0, "reward_model_env/min_reward": 1.0,
                      "reward_model_env/max_reward": 1.0, "reward_model_env/num_empty": 0.0,
                      "reward_model_env/num_nonfinite": 0.0}  # fmt: skip
    logged = {}
    assert Fixed({"ccc": float("nan")})(["p"], ["ccc"], log_metric=logged.__setitem__) == [None]
    assert logged == {}  # no reward: no statistics
    assert Fixed(table, normalization="running")([], []) == []
    # A regression model's attributes: each one's mean over the samples that have it.
    outputs = torch.tensor([[1.0, math.nan, math.nan], [3.0, 4.0, math.nan]])
    logged = {}
    Fixed(table, outputs=outputs, attributes=("helpful", "safe", "terse"))(["p", "p"], ["a", "bb"],
                                                                            log_metric=logged.__setitem__)  # fmt: skip
    assert logged["reward_model_env/helpful_mean"] == 2.0 and logged["reward_model_env/safe_mean"] == 4.0
    assert "reward_model_env/terse_mean" not in logged


def test_group_shaping_reads_a_whole_group_and_warns_once_when_processes_split_it(monkeypatch, caplog):
    """Empty completions get their reward, then the group is shaped (NeMo Gym's answer-length weights); under several
    processes a call's share may hold part of a group: warned once, unless the rewards are of every process."""
    import logging

    import trl_rm_env.rewards.base as base
    from trl_rm_env.rewards.shaping import GroupShaping

    table = {"a": 1.0, "bbb": 1.0}
    prompts, completions = ["p"] * 3, ["a", "bbb", " "]
    # filled: 1, 1, 0 (empty); answer lengths 1, 3, 0: raw 2/3, 0, 1 (mean 5/9): 1/9, -5/9, 4/9; times 0.9
    reward = Fixed(table, name="shaped", empty_completion_reward=0.0, shaping=GroupShaping(answer_length_coeff=0.9))
    with caplog.at_level(logging.WARNING, logger="trl_rm_env.rewards.base"):
        assert reward(prompts, completions) == pytest.approx([1.1, 0.5, 0.4], abs=1e-12)
        assert caplog.records == []  # one process
        monkeypatch.setattr(base, "world_size", lambda: 2)
        assert reward._filled(torch.ones(2, dtype=torch.float64), [], (["p"] * 2, ["a", "a"]), whole=True).tolist() == [
            1.0, 1.0
        ]
        assert caplog.records == []  # every process's rewards
        for _ in range(2):
            assert reward(prompts, completions) == pytest.approx([1.1, 0.5, 0.4], abs=1e-12)
        plain = Fixed(table, name="plain")
        assert plain(prompts[:2], completions[:2]) == [1.0, 1.0]  # no shaping: nothing to warn of
    assert [r.getMessage() for r in caplog.records] == [
        "shaped: group shaping reads each process's share of a call: a GRPO group that TRL splits between processes "
        "(a per-device batch smaller than num_generations) is shaped in parts. Keep a process's batch a multiple of "
        "num_generations. Warned once."
    ]


def test_reward_options_and_the_checkpoint_statistics_are_refused_in_one_line():
    refusals = [
        ({"clip": 0}, "clip must be > 0, got 0"),
        ({"clip": -1.0}, "clip must be > 0, got -1.0"),
        ({"normalization": "zscore"}, "normalization must be one of ['none', 'running', 'checkpoint'], got 'zscore'"),
        ({"normalization": "checkpoint"},
         "normalization='checkpoint' needs `reward_mean` and `reward_std` in the model config; RankedRewardTrainer "
         "writes them when it trains with validation sets (a served reward model gives no config). Use 'running' "
         "instead."),
    ]  # fmt: skip
    for kwargs, message in refusals:
        with pytest.raises(ValueError, match=full(message)):
            Fixed({}, **kwargs)
    assert Fixed({"a": 9.0}, clip=0.5)(["p"], ["a"]) == [0.5]


def test_reward_hacking_diagnostics_on_the_smallest_cases():
    """Pearson's correlation (`statistics.correlation`) from two samples on, whatever the spread, absent when the
    lengths are all equal; `flat_groups` counts groups of two; lengths of messages are their contents' characters."""
    import statistics

    from trl_rm_env.rewards.base import completion_length, diagnostics, is_empty

    rewards = torch.tensor([0.1, 0.3], dtype=torch.float64)
    assert diagnostics(rewards, ["p", "q"], ["a", "bb"], None) == {"length_corr": pytest.approx(1.0, abs=1e-12)}
    assert diagnostics(rewards, ["p", "p"], ["ab", "cd"], None) == {"flat_groups": 0.0}  # equal lengths: no corr
    four = torch.tensor([0.2, 0.2, 0.1, 0.4], dtype=torch.float64)
    got = diagnostics(four, ["a", "a", "b", "b"], ["w", "xx", "yyy", "zzzz"], None)
    want = statistics.correlation([0.2, 0.2, 0.1, 0.4], [1, 2, 3, 4])
    assert got == {"length_corr": pytest.approx(want, abs=1e-12), "flat_groups": 0.5}
    message = [{"role": "assistant", "content": "abc"}, {"role": "tool", "content": None}]
    assert completion_length(message, None) == 3 and completion_length("abcd", [1, 2]) == 2
    assert is_empty("  ") and not is_empty("x") and is_empty([{"role": "assistant", "content": " "}])
    call = [{"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "f"}}]}]
    assert not is_empty(call)


def test_a_reward_call_runs_its_requests_in_order_with_errors_raised_where_they_were_asked():
    """`Reward`'s driver, synchronous and awaited: each request's answer sent back in order, an answer that raises
    thrown in at the `yield` that asked (handled there, the call goes on), awaitable answers awaited; TRL's
    signature."""
    import asyncio
    import inspect

    from trl_rm_env.rewards.base import Reward

    class Runaway(BaseException):  # not an Exception: the driver's handlers let it through
        pass

    class Steps(Reward):
        __name__ = "steps"

        def __init__(self, is_async):
            self.is_async, self.asked = is_async, []

        def _steps(self, prompts, completions, completion_ids, kwargs):
            first = yield ("double", prompts)
            try:
                yield ("fail", completions)
            except KeyError as error:
                second = [f"caught {error.args[0]}"]
            third = yield ("ids", completion_ids, kwargs["extra"])
            return [*first, *second, *third]

        def _answer(self, request):
            self.asked.append(request)
            if len(self.asked) > 3:  # a driver that never moves on: fail now, not at a timeout
                raise Runaway(self.asked)
            if request[0] == "fail":
                raise KeyError(len(request[1]))
            answer = [2 * p for p in request[1]] if request[0] == "double" else [request[1], request[2]]
            if not self.is_async:
                return answer

            async def later():
                return answer

            return later()

    for is_async in (False, True):
        reward = Steps(is_async)
        call = reward([1, 2], ["a", "b", "c"], completion_ids=[[7]], extra="x")
        got = asyncio.run(call) if is_async else call
        assert got == [2, 4, "caught 3", [[7]], "x"]
        assert reward.asked == [("double", [1, 2]), ("fail", ["a", "b", "c"]), ("ids", [[7]], "x")]
        assert inspect.iscoroutinefunction(reward.__call__) is is_async
        assert list(inspect.signature(reward).parameters) == ["prompts", "completions", "completion_ids", "kwargs"]
