"""`BoundedForwardsMixin`'s checks and transformers hooks (`trl_rm_env.trainer.bounded_forwards`) on a fake trainer: where
`pack_max_tokens` is refused (the whole message, naming why and the fix), where it is sized from the GPU's free
memory (`training_token_budget` stubbed: what it is asked with, the log line), which collators make the processes
even out their forwards, and transformers' token count and FLOP estimate over a batch's chunks (the base's hooks
stubbed: what they are handed). Expected values are literals; the stubs stand in for transformers' `Trainer` and for
the CUDA memory query, so nothing here needs a GPU or a model.

Fast: no model, no process group; a few ms a test.
"""

from __future__ import annotations

import logging
import re
from types import SimpleNamespace

import pytest
import torch

from trl_rm_env.trainer import bounded_forwards as bounded
from trl_rm_env.trainer.bounded_forwards import BoundedForwardsMixin


class Base:
    """transformers' `Trainer` hooks as the mixin calls them: each records what it is handed."""

    def _track_num_input_tokens(self, inputs):
        self.tracked.append(inputs)
        return "tracked"

    def floating_point_ops(self, inputs):
        return 6 * inputs["input_ids"].numel()  # transformers' estimate is 6 * tokens * parameters; parameters 1


class Trainer(BoundedForwardsMixin, Base):
    def __init__(self, pack_max_tokens=None, shares_contexts=True, sized_from_memory=True, device="cuda",
                 collator=None, num_processes=2):  # fmt: skip
        self.args = SimpleNamespace(pack_max_tokens=pack_max_tokens, device=SimpleNamespace(type=device),
                                    gradient_checkpointing=True)  # fmt: skip
        self._layout = SimpleNamespace(shares_contexts=shares_contexts, sized_from_memory=sized_from_memory)
        self.model = "the model"
        self.accelerator = SimpleNamespace(
            unwrap_model=lambda model: ("unwrapped", model), num_processes=num_processes
        )
        self.data_collator = collator
        self.tracked = []

    def _compute_dtype(self):
        return torch.bfloat16


@pytest.fixture
def budget_asked(monkeypatch):
    """`training_token_budget` stubbed (it reads CUDA's free memory): each call's arguments; it answers 4096."""
    asked = []
    monkeypatch.setattr(bounded, "training_token_budget", lambda *args: asked.append(args) or 4096)
    return asked


def test_pack_max_tokens_is_refused_where_nothing_reads_it(budget_asked):
    ours = "pack_max_tokens=512 bounds the forwards of the shared layouts, but {}; unset pack_max_tokens."
    given = ours.format("a data_collator was given (pack_max_tokens is read by ours)")
    with pytest.raises(ValueError, match=f"^{re.escape(given)}$"):
        Trainer(512)._check_forward_budget(user_collator=object())
    plain = ours.format(
        "this model trains on the plain path (prefix_sharing resolved to no shared layout; see the log)"
    )
    with pytest.raises(ValueError, match=f"^{re.escape(plain)}$"):
        Trainer(512, shares_contexts=False)._check_forward_budget(None)
    # A user's collator on the plain path: the collator is named (it is the one that must go).
    with pytest.raises(ValueError, match=f"^{re.escape(given)}$"):
        Trainer(512, shares_contexts=False)._check_forward_budget(object())
    # Read by a shared layout: kept as given, even on CUDA for a layout sized from memory.
    assert Trainer(512)._check_forward_budget(None) == 512
    assert budget_asked == []


def test_an_unset_budget_is_sized_from_the_gpus_free_memory_only_where_read(budget_asked, caplog):
    with caplog.at_level(logging.INFO, logger="trl_rm_env.trainer.bounded_forwards"):
        assert Trainer()._check_forward_budget(None) == 4096
    # the unwrapped model, activation checkpointing (on here), the attention's dtype and the device
    assert budget_asked == [(("unwrapped", "the model"), True, torch.bfloat16, SimpleNamespace(type="cuda"))]
    assert [r.getMessage() for r in caplog.records] == [
        "pack_max_tokens: 4096 tokens per packed training forward (from the GPU's free memory)."
    ]
    # Unset elsewhere: on the CPU, for a layout not sized from memory (KV), or with a user's collator.
    assert Trainer(device="cpu")._check_forward_budget(None) is None
    assert Trainer(sized_from_memory=False)._check_forward_budget(None) is None
    assert Trainer()._check_forward_budget(object()) is None
    assert len(budget_asked) == 1


def ours(cuts_chunks=True, pack_max_tokens=400):
    return SimpleNamespace(layout=SimpleNamespace(cuts_chunks=cuts_chunks), pack_max_tokens=pack_max_tokens)


def test_which_collators_even_out_the_processes_forwards():
    assert Trainer(collator=ours())._even_forwards()  # ours, bounded, cutting chunks, 2 processes
    assert not Trainer(collator=ours(), num_processes=1)._even_forwards()  # one process: nothing to even out
    assert not Trainer(collator=ours(cuts_chunks=False))._even_forwards()  # the layout never cuts (block mask)
    assert not Trainer(collator=ours(pack_max_tokens=None))._even_forwards()  # no budget: no chunks
    assert not Trainer(collator=ours(pack_max_tokens=0))._even_forwards()
    assert not Trainer(collator=lambda features: features)._even_forwards()  # a user's collator: no layout
    assert not Trainer(collator=SimpleNamespace(layout=SimpleNamespace(cuts_chunks=True)))._even_forwards()


def test_the_token_count_and_flops_of_a_chunked_batch_read_every_chunk():
    trainer = Trainer()
    chunks = [{"input_ids": torch.tensor([[1, 2, 3, 4, 5]])}, {"input_ids": torch.tensor([[6, 7], [8, 9], [10, 11]])}]
    assert trainer._track_num_input_tokens({"chunks": chunks, "ranks": torch.zeros(3)}) == "tracked"
    # the chunks' tokens as one batch row, in order: 5 + 6 of them
    ((tracked,),) = [trainer.tracked]
    assert list(tracked) == ["input_ids"] and tracked["input_ids"].tolist() == [list(range(1, 12))]
    # A batch that fits is handed on as it is; so is a batch whose chunks carry no input_ids.
    whole = {"input_ids": torch.ones(2, 3)}
    trainer._track_num_input_tokens(whole)
    embedded = {"chunks": [{"inputs_embeds": torch.ones(1, 2, 4)}]}
    trainer._track_num_input_tokens(embedded)
    assert trainer.tracked[1] is whole and trainer.tracked[2] is embedded
    # FLOPs: 6 per token here (the stub), summed over the chunks: 6 * (5 + 6); a batch that fits: 6 * 6.
    assert trainer.floating_point_ops({"chunks": chunks}) == 66
    assert trainer.floating_point_ops(whole) == 36
