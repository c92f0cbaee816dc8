"""How many tokens one training forward of the packed layout may take on a GPU, from its free memory."""

from __future__ import annotations

import torch

MIN_TRAINING_TOKENS, MAX_TRAINING_TOKENS = 4096, 262144
"""The bounds of the default `pack_max_tokens` on a GPU (`training_token_budget`)."""


def training_token_budget(
    model: torch.nn.Module, checkpointing: bool, dtype: torch.dtype, device: torch.device, share: float = 0.5
) -> int:
    """The default `pack_max_tokens` of the packed layout on CUDA: `share` of the free memory, less what training will
    still allocate (gradients and Adam's two float32 moments of the trainable parameters, and the weights themselves
    where they are not on the GPU yet), over the activations one
    token keeps for backward in every decoder layer, `8 hidden + 4 (q + kv) + 6 ffn` elements (the norms' inputs and
    their float32 upcasts, q/k/v and the gathered keys, the attention output, the MLP's projections and activation;
    under activation checkpointing one hidden state per layer plus one layer's recompute), within
    [`MIN_TRAINING_TOKENS`, `MAX_TRAINING_TOKENS`], a multiple of 1,024. The coefficients are calibrated on a
    measurement (an H200, Qwen3-0.6B's width in bf16, hh-rlhf pairs: 79 KB a token and layer; this formula gives
    78): an estimate to keep a step from running out of memory; set `pack_max_tokens` to bound a forward exactly."""
    config = getattr(model, "config", None)
    hidden = getattr(config, "hidden_size", 4096)
    heads = getattr(config, "num_attention_heads", 32)
    head_dim = getattr(config, "head_dim", None) or hidden // heads
    kv = (getattr(config, "num_key_value_heads", None) or heads) * head_dim
    ffn = getattr(config, "intermediate_size", None) or 4 * hidden
    layers = getattr(config, "num_hidden_layers", 32)
    size = torch.empty((), dtype=dtype).element_size()
    per_layer = size * (8 * hidden + 4 * (heads * head_dim + kv) + 6 * ffn)
    per_token = (size * hidden * layers + per_layer) if checkpointing else per_layer * layers
    to_come = 0
    for p in model.parameters():
        numel = getattr(p, "ds_numel", p.numel())  # ZeRO-3 partitions report 0 elements; DeepSpeed keeps the count
        if p.requires_grad:
            to_come += numel * (p.element_size() + 8)  # gradients in the parameters' dtype, Adam's moments in fp32
        if p.device.type != "cuda":  # not moved yet (DeepSpeed, FSDP prepare the model later)
            to_come += numel * p.element_size()
    free, _ = torch.cuda.mem_get_info(device)  # the training device (DeepSpeed may not have moved the model yet)
    tokens = int(max(free - to_come, 0) * share / per_token) // 1024 * 1024
    return max(MIN_TRAINING_TOKENS, min(MAX_TRAINING_TOKENS, tokens))
