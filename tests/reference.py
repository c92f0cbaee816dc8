"""Reference scoring shared by the scorer and environment tests: the model-card recipe, one sequence at a time."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """The tensors here are tiny: one intra-op thread is as fast, and does not crawl when the CPU is shared."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def reference_text(tok, prompt, completion):
    """The Skywork-Reward-V2 model-card recipe (messages) or TRL's standard format `prompt + completion + EOS`."""
    if isinstance(prompt, str):
        text = prompt + completion
        if tok.eos_token and not text.endswith(tok.eos_token):
            text += tok.eos_token
        return text
    text = tok.apply_chat_template(list(prompt) + list(completion), tokenize=False)
    if tok.bos_token and text.startswith(tok.bos_token):
        text = text[len(tok.bos_token) :]
    return text


def reference_ids(tok, prompt, completion):
    return tok(reference_text(tok, prompt, completion), return_tensors="pt")["input_ids"][0].tolist()


@torch.no_grad()
def score_one(model, ids):
    """Score one sequence alone: no padding, no batching."""
    input_ids = torch.tensor([list(ids)])
    return model(input_ids=input_ids, attention_mask=torch.ones_like(input_ids)).logits[0][0].float().item()


@torch.no_grad()
def reference_scores(model, tok, prompts, completions):
    """`reference_text` of each pair, scored alone."""
    out = []
    for prompt, completion in zip(prompts, completions):
        enc = tok(reference_text(tok, prompt, completion), return_tensors="pt")
        out.append(model(**enc).logits[0][0].float().item())
    return torch.tensor(out)


def assert_same_loss_and_gradients(model, scores, reference, batch, loss_ref, grads_ref):
    """`scores` of a shared layout equal the plain `reference` (1e-4), and so do the ranked loss over `batch`'s
    ranks and its gradients with respect to every parameter (the plain ones given as `loss_ref`, `grads_ref`)."""
    from trl_rm_env.trainer.loss import ranked_bradley_terry_loss

    torch.testing.assert_close(scores, reference, atol=1e-4, rtol=0)
    loss = ranked_bradley_terry_loss(scores, batch["ranks"], batch["record_index"]).loss
    assert abs(loss.item() - loss_ref.item()) < 1e-4
    grads = torch.autograd.grad(loss, list(model.parameters()))
    for g, g_ref in zip(grads, grads_ref):
        torch.testing.assert_close(g, g_ref, atol=1e-4, rtol=1e-3)
