"""`window_packing`: a gradient accumulation window's micro-batches run as few forwards as `pack_max_tokens` allows
(`trl_rm_env.trainer.windows`), with the accumulated step's loss, gradients, optimizer steps, schedule and metrics.

The reference is the same trainer with `window_packing=False`: transformers' own loop, one forward per micro-batch
(TRL's behaviour). Both train the tiny model from the same seed on ranked records of 3 and 4 completions (so the
micro-batches hold different numbers of pairs and the mean of micro-batch means differs from the mean over the
window's pairs), on the CPU under the packed layout (its `mask` kernel), fp32. The decoder passes are counted with a
hook on the input embeddings (one call per forward), per optimizer step with a callback.

Fast: two or three short training runs of the tiny model a test, a second or two each.
"""

from __future__ import annotations

import contextlib
import logging
import math
from types import SimpleNamespace

import pytest
import torch
from helpers import ranked_trainer
from transformers import TrainerCallback

from trl_rm_env import RankedRewardConfig, load_rank_dataset
from trl_rm_env.trainer.bounded_forwards import SCORES_OUT, BoundedForwardsMixin, ScoresOut
from trl_rm_env.trainer.collator import DataCollatorForRankedPreference
from trl_rm_env.trainer.loss import ranked_bradley_terry_loss
from trl_rm_env.trainer.windows import WINDOW_RECORDS, WINDOW_SLOT, WindowPackingMixin, weighted_pair_loss

COMPARED = ("loss", "accuracy", "margin", "min_reward", "mean_reward", "max_reward", "num_pairs", "grad_norm",
            "learning_rate", "num_tokens")  # fmt: skip


class ForwardsPerStep(TrainerCallback):
    """The input lengths of the model's forwards (embedding calls), grouped by optimizer step."""

    def __init__(self, model):
        self.steps: list[list[int]] = [[]]
        model.get_input_embeddings().register_forward_hook(
            lambda module, args, out: self.steps[-1].append(int(out.shape[1])) if module.training else None)

    def on_step_end(self, args, state, control, **kwargs):
        self.steps.append([])


def train(tmp_path, data, steps: int = 3, **overrides):
    """A short run; its train log rows, final weights, forwards per optimizer step and the trainer."""
    settings = dict(prefix_sharing="packed", per_device_train_batch_size=2, gradient_accumulation_steps=4,
                    lr_scheduler_type="linear", warmup_steps=1, max_grad_norm=0.5)  # fmt: skip
    trainer = ranked_trainer(tmp_path, _tokenizer(), data, **({"max_steps": steps} | settings | overrides))
    counter = ForwardsPerStep(trainer.model)
    trainer.add_callback(counter)
    trainer.train()
    rows = [row for row in trainer.state.log_history if "loss" in row]
    weights = [p.detach().clone() for p in trainer.model.parameters()]
    return rows, weights, counter.steps[:-1], trainer


def _tokenizer():
    from trl_rm_env.tiny_models import build_tiny_tokenizer

    return build_tiny_tokenizer()


def assert_same_training(windowed, reference):
    rows, weights = windowed[0], windowed[1]
    assert len(rows) == len(reference[0]) > 0
    for row, ref in zip(rows, reference[0]):
        for key in COMPARED:
            assert row[key] == pytest.approx(ref[key], abs=1e-5, rel=1e-5), (key, row["step"])
    for w, w_ref in zip(weights, reference[1]):
        torch.testing.assert_close(w, w_ref, atol=1e-5, rtol=1e-4)


@pytest.fixture(scope="module")
def ranked():
    return load_rank_dataset("sample:harder").select(range(24))


def test_one_forward_per_optimizer_step_with_the_accumulated_steps_training(tmp_path, ranked, caplog):
    reference = train(tmp_path / "ref", ranked, window_packing=False, include_num_input_tokens_seen="all")
    with caplog.at_level(logging.INFO, logger="trl_rm_env.trainer.windows"):
        windowed = train(tmp_path / "win", ranked, include_num_input_tokens_seen="all")  # "auto": on under packed
    assert "window_packing='auto': the 4 micro-batches of each optimizer step run as few forwards as one forward " \
           "allows." in caplog.messages
    # The tokens seen and the FLOPs are the micro-batches' (a slot counts none: its records are in the window's)
    assert windowed[3].state.num_input_tokens_seen == reference[3].state.num_input_tokens_seen > 0
    assert windowed[3].state.total_flos == reference[3].state.total_flos > 0
    assert windowed[3]._window_packing and not reference[3]._window_packing
    assert [len(step) for step in reference[2]] == [4, 4, 4]  # transformers' loop: a forward per micro-batch
    assert [len(step) for step in windowed[2]] == [1, 1, 1]  # one forward per window
    # The window's forward holds the four micro-batches' tokens: each record's context once, as they did.
    assert [sum(step) for step in windowed[2]] == [sum(step) for step in reference[2]]
    assert_same_training(windowed, reference)


def test_pack_max_tokens_cuts_the_window_into_as_few_forwards_as_fit(tmp_path, ranked, caplog):
    budget = 600
    reference = train(tmp_path / "ref", ranked, window_packing=False, pack_max_tokens=budget)
    with caplog.at_level(logging.INFO, logger="trl_rm_env.trainer.windows"):
        windowed = train(tmp_path / "win", ranked, pack_max_tokens=budget)
    assert "window_packing='auto': the 4 micro-batches of each optimizer step run as few forwards as " \
           "pack_max_tokens=600 allows." in caplog.messages
    for step, ref_step in zip(windowed[2], reference[2]):
        assert sum(step) == sum(ref_step) and len(step) < len(ref_step)
        assert all(n <= budget for n in step)  # (no record of these is over the budget alone)
        assert all(a + b > budget for a, b in zip(step, step[1:]))  # no two consecutive forwards would fit in one
    assert_same_training(windowed, reference)


def test_trl_pairs_margins_and_centring_weigh_each_pair_as_its_micro_batch_does(tmp_path, ranked):
    """TRL's pair rows with margins, and `center_rewards_coefficient`: the window's batch takes them as two-way records
    (every micro-batch one pair a record: equal pair counts), the centring term and margins per pair."""
    pairs = ranked.map(lambda r, i: {"prompt": r["context"], "chosen": r["completions"][0]["completion"],
                                     "rejected": r["completions"][-1]["completion"], "margin": 0.1 * (i % 3)},
                       with_indices=True, remove_columns=ranked.column_names)  # fmt: skip
    options = dict(center_rewards_coefficient=0.05, per_device_train_batch_size=3, gradient_accumulation_steps=3)
    reference = train(tmp_path / "ref", pairs, window_packing=False, **options)
    windowed = train(tmp_path / "win", pairs, **options)
    assert [len(step) for step in windowed[2]] == [1, 1, 1]
    assert_same_training(windowed, reference)


def test_the_last_window_of_an_epoch_may_be_shorter(tmp_path, ranked):
    """10 records, 2 a micro-batch, 4 a window: the epoch's second window has one micro-batch (transformers divides
    its loss by 1, not 4); two epochs."""
    data = ranked.select(range(10))
    options = dict(num_train_epochs=2, max_steps=-1)
    reference = train(tmp_path / "ref", data, window_packing=False, **options)
    windowed = train(tmp_path / "win", data, **options)
    assert [len(step) for step in reference[2]] == [4, 1, 4, 1]
    assert [len(step) for step in windowed[2]] == [1, 1, 1, 1]
    assert_same_training(windowed, reference)


def test_auto_is_off_where_it_does_not_apply(tmp_path, ranked, caplog):
    with caplog.at_level(logging.DEBUG, logger="trl_rm_env.trainer.windows"):
        kv = ranked_trainer(tmp_path / "kv", _tokenizer(), ranked, gradient_accumulation_steps=2)  # CPU default: KV
    assert kv._layout.name == "kv" and not kv._window_packing
    assert "window_packing='auto': off (the kv layout)." in caplog.messages
    one = ranked_trainer(tmp_path / "one", _tokenizer(), ranked, prefix_sharing="packed")
    assert not one._window_packing  # one micro-batch a step
    on = ranked_trainer(tmp_path / "on", _tokenizer(), ranked, gradient_accumulation_steps=2, window_packing=True)
    assert on._layout.name == "kv" and on._window_packing  # True: the KV layout too


@pytest.mark.parametrize(("overrides", "why"), [
    (dict(prefix_sharing=False), "prefix_sharing resolved to the plain layout (windows are packed in the packed and KV "
                                 "layouts)"),
    (dict(ensemble_heads=3), "ensemble_heads=3 weighs each head's pairs by its own resample"),
    (dict(ensemble_heads=2), "ensemble_heads=2 weighs each head's pairs by its own resample"),
    (dict(gradient_accumulation_steps=1), "gradient_accumulation_steps=1: each optimizer step is one micro-batch "
                                          "already"),
])  # fmt: skip
def test_true_is_refused_where_it_cannot_apply(tmp_path, ranked, overrides, why):
    settings = dict(gradient_accumulation_steps=2, prefix_sharing="packed") | overrides
    with pytest.raises(ValueError) as error:
        ranked_trainer(tmp_path, _tokenizer(), ranked, window_packing=True, **settings)
    assert str(error.value) == (f"window_packing=True runs a gradient accumulation window's micro-batches together, "
                                f"but {why}; set window_packing to 'auto' or False.")


def test_true_is_refused_with_a_collator_of_ones_own(tmp_path, ranked):
    from trl_rm_env import RankedRewardTrainer
    from trl_rm_env.tiny_models import build_tiny_reward_model

    tokenizer = _tokenizer()
    args = RankedRewardConfig(str(tmp_path), use_cpu=True, report_to="none", gradient_accumulation_steps=2,
                              window_packing="true", prefix_sharing="packed")  # fmt: skip
    with pytest.raises(ValueError, match=r"^window_packing=True runs .* but a data_collator was given \(the window is "
                                         r"laid out by ours\); set window_packing to 'auto' or False\.$"):
        RankedRewardTrainer(model=build_tiny_reward_model(tokenizer), args=args, train_dataset=ranked,
                            processing_class=tokenizer,
                            data_collator=DataCollatorForRankedPreference(tokenizer.pad_token_id))  # fmt: skip


@pytest.mark.parametrize("text", ["yes", "2", "on"])
def test_window_packing_takes_auto_true_or_false(tmp_path, text):
    assert RankedRewardConfig(str(tmp_path), window_packing="TRUE").window_packing is True
    assert RankedRewardConfig(str(tmp_path), window_packing=None).window_packing == "auto"
    with pytest.raises(ValueError, match=f"^window_packing must be True, False or 'auto', got '{text}'.$"):
        RankedRewardConfig(str(tmp_path), window_packing=text)


# ---------------------------------------------------------------------------------------------------- two processes
class FakeAccelerator:
    """One of 2 processes: `gather` adds the other process's `[forwards, pairs of each micro-batch]`; `no_sync`
    records that a backward only accumulates."""

    num_processes = 2

    def __init__(self, other: list[int]):
        self.other, self.gathered, self.unsynced = other, [], False
        self.sync_gradients = True

    def gather(self, tensor):
        self.gathered.append(tensor.tolist())
        return torch.cat([tensor, torch.tensor([self.other], dtype=tensor.dtype)])

    @contextlib.contextmanager
    def no_sync(self, model):
        self.unsynced = True
        try:
            yield
        finally:
            self.unsynced = False


class RecordingBase:
    """transformers' `training_step` as the window's forwards reach it: records the chunk and its `record_weight`,
    and leaves the chunk's scores and tokens in the inputs' `ScoresOut` as `compute_loss` does."""

    def training_step(self, model, inputs, num_items_in_batch=None):
        self.forwards.append((inputs["name"], inputs["record_weight"].tolist(), not self.accelerator.unsynced))
        self.handed.append((set(inputs), num_items_in_batch))
        inputs[SCORES_OUT].add(inputs["scores"], inputs["tokens"])
        return torch.tensor(1.0)


class FakeTrainer(WindowPackingMixin, BoundedForwardsMixin, RecordingBase):
    is_deepspeed_enabled = False

    def __init__(self, accelerator):
        self.accelerator = accelerator
        self.args = SimpleNamespace(device=torch.device("cpu"), center_rewards_coefficient=None)
        self._layout = SimpleNamespace(attention=lambda model: contextlib.nullcontext())
        self.forwards, self.logged, self.handed = [], [], []

    def _log_train_metrics(self, scores, pairwise, record_index, token_count):
        self.logged.append((scores.tolist(), record_index.tolist(), pairwise.better.numel(), token_count))


def chunk(name, records, first_score, tokens):
    ranks = [r for record in records for r in record]
    return {"name": name, "ranks": torch.tensor(ranks), "tokens": tokens,
            "record_index": torch.tensor([k for k, record in enumerate(records) for _ in record]),
            "scores": first_score + torch.arange(len(ranks), dtype=torch.float32)}  # fmt: skip


def test_two_processes_weigh_each_pair_by_its_micro_batchs_pairs_over_both():
    # This process's window: micro-batch 0 is one record ranked 0 < 1 < 2 (3 pairs), micro-batch 1 two records 0 < 1
    # (1 pair each); cut into 2 forwards (record 0; records 1 and 2). The other process: 3 forwards, micro-batch 0
    # with 1 pair and micro-batch 1 with 6. So micro-batch 0 holds N_0 = 3 + 1 = 4 pairs over both processes and
    # micro-batch 1 N_1 = 2 + 6 = 8. Today's step gives micro-batch m's pairs the weight 1 / N_m once DDP averages
    # the 2 processes' gradients, i.e. 2 / N_m on each process: 2/4 = 0.5 and 2/8 = 0.25.
    accelerator = FakeAccelerator(other=[3, 1, 6])
    trainer = FakeTrainer(accelerator)
    a, b = chunk("a", [[0, 1, 2]], 0.0, 9), chunk("b", [[0, 1], [0, 1]], 10.0, 8)
    window = {"chunks": [a, b], "ranks": torch.tensor([0, 1, 2, 0, 1, 0, 1]),
              "record_index": torch.tensor([0, 0, 0, 1, 1, 2, 2]), WINDOW_RECORDS: torch.tensor([1, 2])}  # fmt: skip
    loss = trainer._window_training_step("model", window, None)
    assert accelerator.gathered == [[[2, 3, 2]]]  # one collective: this process's forwards and pairs per micro-batch
    assert trainer.forwards == [("a", [0.5], False), ("b", [0.25, 0.25], False), ("b", [0.0, 0.0], True)]
    assert loss.item() == 3.0  # the three forwards' returns, the repeat's included (it weighs 0)
    # Metrics per micro-batch, from its own scores, records numbered from 0; the window's tokens with the last.
    assert trainer.logged == [([0.0, 1.0, 2.0], [0, 0, 0], 3, 0), ([10.0, 11.0, 12.0, 13.0], [0, 0, 1, 1], 2, 17)]
    assert not any(isinstance(v, ScoresOut) for v in vars(trainer).values())  # nothing handed over on the trainer
    # A slot is no forward at all.
    assert trainer._window_training_step("model", {WINDOW_SLOT: 0}, None).item() == 0.0 and len(trainer.forwards) == 3


def test_a_window_of_one_forward_hands_transformers_a_batch_and_its_item_count_only():
    # No `chunks`: the window's batch is the one forward; its window keys stay with the window, and transformers'
    # `num_items_in_batch` reaches the forward as the step got it.
    trainer = FakeTrainer(FakeAccelerator(other=[1, 1, 1]))
    window = {**chunk("w", [[0, 1], [1, 0]], 0.0, 5), WINDOW_RECORDS: torch.tensor([1, 1])}
    trainer._window_training_step("model", window, 16)
    ((keys, items),) = trainer.handed
    assert items == 16
    assert keys == {"name", "ranks", "record_index", "scores", "tokens", "record_weight", SCORES_OUT}


def test_a_micro_batch_without_a_pair_is_refused_as_its_own_step_would_be():
    trainer = FakeTrainer(FakeAccelerator(other=[1, 1, 1]))
    window = {"chunks": [chunk("a", [[0, 1], [0, 0]], 0.0, 4)], "ranks": torch.tensor([0, 1, 0, 0]),
              "record_index": torch.tensor([0, 0, 1, 1]), WINDOW_RECORDS: torch.tensor([1, 1])}  # fmt: skip
    with pytest.raises(ValueError, match=r"^Micro-batch\(es\) \[1\] of this accumulation window hold no strictly "
                                         r"ordered pair \(every record's completions are tied\)\.$"):
        trainer._window_training_step("model", window, None)


def test_weighted_pair_loss_by_hand():
    # One record scored [2, 0.5, 1] ranked 0 < 1 < 2, weight 0.5; a second [0, 1] ranked 0 < 1, weight 2.
    scores = torch.tensor([2.0, 0.5, 1.0, 0.0, 1.0], dtype=torch.float64)
    record_index = torch.tensor([0, 0, 0, 1, 1])
    pairwise = ranked_bradley_terry_loss(scores, torch.tensor([0, 1, 2, 0, 1]), record_index)
    softplus = lambda d: math.log1p(math.exp(-d))  # noqa: E731  -log sigmoid(d)
    pairs = [(2.0, 0.5, 0.5), (2.0, 1.0, 0.5), (0.5, 1.0, 0.5), (0.0, 1.0, 2.0)]  # (better, worse, weight)
    weights = torch.tensor([0.5, 2.0])
    assert weighted_pair_loss(pairwise, scores, record_index, weights, None).item() == pytest.approx(
        sum(w * softplus(b - x) for b, x, w in pairs), abs=1e-12)
    assert weighted_pair_loss(pairwise, scores, record_index, weights, 0.1).item() == pytest.approx(
        sum(w * (softplus(b - x) + 0.1 * (b + x) ** 2) for b, x, w in pairs), abs=1e-12)


def test_a_regression_reward_model_refuses_it_and_its_auto_is_off(tmp_path):
    from trl_rm_env import RegressionRewardConfig

    assert RegressionRewardConfig(str(tmp_path)).window_packing is False
    with pytest.raises(ValueError, match=r"^window_packing lays out the ranked records of an accumulation window in the "
                                         r"packed layout; a regression reward model trains on the plain one"):
        RegressionRewardConfig(str(tmp_path), window_packing=True)


def test_the_forward_repeated_for_the_other_process_is_the_last_one():
    """This process cuts its window into 3 forwards, the other into 4: the 4th here repeats the 3rd (weight 0), the
    forward whose layer calls match the other process's last (ZeRO-3 and FSDP2 gather weights per forward)."""
    accelerator = FakeAccelerator(other=[4, 1, 1])
    trainer = FakeTrainer(accelerator)
    a, b, c = chunk("a", [[0, 1]], 0.0, 2), chunk("b", [[0, 1]], 2.0, 2), chunk("c", [[0, 1]], 4.0, 2)
    window = {"chunks": [a, b, c], "ranks": torch.tensor([0, 1] * 3), "record_index": torch.tensor([0, 0, 1, 1, 2, 2]),
              WINDOW_RECORDS: torch.tensor([2, 1])}  # fmt: skip
    trainer._window_training_step("model", window, None)
    assert [name for name, _, _ in trainer.forwards] == ["a", "b", "c", "c"]
    assert trainer.forwards[-1][1] == [0.0] and trainer.forwards[-1][2] is True
    one = FakeTrainer(FakeAccelerator(other=[3, 1]))  # one forward here, three there
    one._window_training_step("model", {"chunks": [a], "ranks": torch.tensor([0, 1]), "record_index": torch.tensor([0, 0]),
                                        WINDOW_RECORDS: torch.tensor([1])}, None)  # fmt: skip
    assert [name for name, _, _ in one.forwards] == ["a", "a", "a"]


@pytest.mark.parametrize("other_forwards", [1, 4])  # the other process runs fewer forwards, or more
def test_uneven_micro_batches_and_forwards_across_two_processes(other_forwards):
    # This process: micro-batch 0 holds records 0 ([0, 1]: 1 pair) and 1 ([0, 1, 2]: 3 pairs), micro-batch 1 record 2
    # ([0, 1]: 1 pair), micro-batch 2 record 3 ([0, 0, 1]: 2 pairs, the tie none); in 2 forwards (records 0-1, 2-3).
    # The other process: micro-batches of 2, 3 and 6 pairs. Over both: N = (4 + 2, 1 + 3, 2 + 6) = (6, 4, 8), so the
    # weights are 2 / N_m: 1/3, 1/2, 1/4 (records 0 and 1, 2, 3).
    accelerator = FakeAccelerator(other=[other_forwards, 2, 3, 6])
    trainer = FakeTrainer(accelerator)
    a = chunk("a", [[0, 1], [0, 1, 2]], 0.0, 5)
    b = chunk("b", [[0, 1], [0, 0, 1]], 10.0, 6)
    window = {"chunks": [a, b], "ranks": torch.tensor([0, 1, 0, 1, 2, 0, 1, 0, 0, 1]),
              "record_index": torch.tensor([0, 0, 1, 1, 1, 2, 2, 3, 3, 3]), WINDOW_RECORDS: torch.tensor([2, 1, 1])}  # fmt: skip
    trainer._window_training_step("model", window, None)
    assert accelerator.gathered == [[[2, 4, 1, 2]]]
    third, half, quarter = 1 / 3, 0.5, 0.25
    repeats = [("b", [0.0, 0.0], False)] * (max(other_forwards, 2) - 2)  # as many forwards as the other, weight 0
    expected = [("a", [third, third], False), ("b", [half, quarter], False), *repeats]
    expected[-1] = (expected[-1][0], expected[-1][1], True)  # only the last forward's backward syncs
    assert [(name, pytest.approx(w), synced) for name, w, synced in trainer.forwards] == expected
    # Each micro-batch's metrics from its own rows, its records numbered from 0; the window's tokens (5 + 6) once
    assert trainer.logged == [([0.0, 1.0, 2.0, 3.0, 4.0], [0, 0, 1, 1, 1], 4, 0), ([10.0, 11.0], [0, 0], 1, 0),
                              ([12.0, 13.0, 14.0], [0, 0, 0], 2, 11)]  # fmt: skip
