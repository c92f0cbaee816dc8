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
