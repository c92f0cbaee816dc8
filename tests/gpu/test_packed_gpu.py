"""The packed layout on the GPU, in bf16: the `varlen` branch with torch's FlashAttention varlen kernel
(`torch.nn.attention.varlen.varlen_attn`) against an fp32 one-at-a-time reference and the plain padded bf16 path.

Run on a CUDA machine with `python -m pytest -m gpu tests/gpu -q` (skipped without CUDA). With
`TRL_RM_ENV_GPU_TESTS_ON_CPU=1` it runs on the CPU instead, with `kernels.reference_varlen_attn` in the CUDA kernel's
place (the `reference_varlen` fixture) and bf16 models on the CPU: a check of this file, not of the kernel. With
`TRL_RM_ENV_GPU_REPORT=PATH` the errors of every case are written to PATH as a markdown table.

What is compared, per case (one micro-batch of a few groups: a shared context and several completions, random ids):

- reference: the fp32 model, each sequence run ALONE (no padding, no packing; math attention on CUDA, fp32 matmuls
  without TF32): scores, the per-pair Bradley-Terry losses (`ranked_bradley_terry_loss(...).pair_losses`) and the
  gradient of the loss for every (trainable) parameter. Its weights are rounded to bf16 numbers first
  (`ROUNDED_WEIGHTS`), so the bf16 copy (`copy.deepcopy(model).to(torch.bfloat16)`) holds exactly the same weights
  and the errors below are those of computing in bf16, not of rounding the weights;
- plain: the same weights in bf16, the right-padded batch of `DataCollatorForRankedPreference` with its attention
  mask, `model(...).logits[:, 0]` (what TRL's `RewardTrainer` runs);
- packed: the same bf16 model on the packed layout's one padding-free row through `packed_scores`, its
  forward AND backward inside `packed_attention(model)` (as `RankedRewardTrainer.training_step` runs them, so that
  activation checkpointing recomputes under the packed attention). The varlen kernel must have run, in bf16: one
  call per layer in forward (two per layer with activation checkpointing, the recompute), counted by wrapping
  `kernels.run_varlen`; on CUDA `kernels.varlen_usable(device, bf16)` must be True.

Tolerances (derived, not tuned): the plain path computes the same function as the packed one in the same precision,
so its distance to the fp32 reference measures what bf16 rounding does to this computation (it varies with the
model, the lengths, the quantity). The packed path may differ from the plain one only by its attention kernel and
the order of its sums, rounding effects of the same kind and size: `assert_like_bf16` requires

    err(packed, fp32) <= FACTOR * err(plain, fp32) + eps,        FACTOR = 2,

- scores and per-pair losses: err = max |x - x_fp32| over the batch, eps = EPS_ULPS = 4 bf16 ulps of max |x_fp32|
  (the spacing of bf16 numbers there, `bf16_ulp`: one ulp is 2**-7 relative to the leading power of two): the floor
  for a batch whose plain error happens to be small (the scores themselves are bf16 numbers: rounding the output
  alone costs up to half an ulp, and a few roundings of the last layers a few);
- gradients, parameter by parameter: err = ||g - g_fp32|| / max(||g_fp32||, floor), eps = EPS_ULPS * 2**-8 (a few
  units of bf16 relative rounding, the error of rounding the gradient alone), floor = GRAD_FLOOR (1e-6) times the
  largest parameter gradient norm of the case: a gradient that is ~0 next to the others (peft's zero-initialized
  adapters give exactly 0) is compared as an absolute error on that scale instead of relative to ~0.

Measured on the CPU (reference kernel, 15 seeds x the 9 short cases, every check): err(packed) / bound stayed below
0.7; the errors of both paths are in the report's table. A layout bug makes an error of the size of the score itself,
not of its rounding: the last test corrupts one completion's keys (it also sees its sibling completion, as packing
without the layout would, or only the sibling's first token, as a context range one too long would) and checks that
`assert_like_bf16` raises on the scores (the corrupted score moves by 0.34, and 0.16 for the one key, where the bound
is 0.02; over seeds 0-2 a single leaked key moved it by 1.1x to 8x the bound, a whole sibling by 7x to 22x).

Cases: Qwen3- and Llama-shaped classifiers (hidden 256, 4 heads x 64, GQA with 2 key/value heads and MHA), LoRA
(trainable parameters only), activation checkpointing (train mode), bf16 autocast over fp32 weights (the Trainer's
`bf16=True`), an 8,192-token context, Liger Kernel's fused kernels on the packed path (`fused_kernels`, CUDA and the
`liger-kernel` package only; bounded by the plain path's error without them), FlexAttention in the varlen kernel's
place (`TRL_RM_ENV_PACKED_KERNEL=flex`, CUDA only: its backward); every short case's batch holds a group of 4 completions ranked [0, 1, 1, 2]
and a group with two identical (tied) completions, whose packed scores must also be equal (to `eps`).
"""

from __future__ import annotations

import contextlib
import copy
import functools
import math
import os
import time

import pytest
import torch

from trl_rm_env.sharing import kernels, packed_attention, packed_scores
from trl_rm_env.sharing.layouts import PACKED
from trl_rm_env.sharing.model_support import classifier
from trl_rm_env.tiny_models import build_tiny_tokenizer, tiny_qwen3_config
from trl_rm_env.trainer.collator import DataCollatorForRankedPreference
from trl_rm_env.trainer.loss import ranked_bradley_terry_loss

pytestmark = pytest.mark.gpu

ON_CPU = os.environ.get("TRL_RM_ENV_GPU_TESTS_ON_CPU") == "1"
REPORT = os.environ.get("TRL_RM_ENV_GPU_REPORT")

FACTOR = 2.0
"""How much farther from fp32 the packed path may be than the plain one (both bf16 roundings of one function)."""
EPS_ULPS = 4
"""The absolute floor of the bound, in bf16 ulps of the reference's magnitude (scores, losses) or in units of bf16
relative rounding, 2**-8 (gradients)."""
BF16_UNIT = 2.0**-8
"""bf16's unit roundoff: 8 significand bits (7 stored, 1 implicit)."""
ROUNDED_WEIGHTS = True
"""The fp32 model's weights are rounded to bf16 numbers first, so that the bf16 copy holds exactly the same weights."""
GRAD_FLOOR = 1e-6
"""A parameter's gradient norm below this fraction of the case's largest is ~0: compared on that scale."""

SIZES = dict(hidden_size=256, intermediate_size=512, num_attention_heads=4, head_dim=64, initializer_range=0.02)
"""The models' shapes: 4 heads x 64 (FlashAttention's head dims), a few layers per case."""

SHORT_GROUPS = [
    (40, [7, 12, 3, 9], [0, 1, 1, 2]),  # N > 2 completions, two of them tied in rank
    (25, [6, 6, 10], [1, 1, 0]),  # the first two identical (made so below), tied
    (8, [20, 5], [0, 1]),  # a short context, a long and a short completion
    (1, [9, 4], [1, 0]),
]
"""(context length, [completion lengths], ranks) of the short cases' micro-batch."""
TIE = (1, 4, 5)
"""The rows (record order) of SHORT_GROUPS' two identical completions: rows 4 and 5 (group 1)."""
LONG_GROUPS = [(8192, [96, 120, 80], [0, 1, 2])]
"""The long case: an 8,192-token context and three completions of about 100 tokens."""

RESULTS: list[dict] = []
"""One row per case: the errors of packed and plain against fp32 (the report's table)."""


# ---------------------------------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def device():
    """CUDA (with fp32 matmuls in full precision, for the reference), or the CPU where
    `TRL_RM_ENV_GPU_TESTS_ON_CPU=1` (the `varlen_calls` fixture puts the reference kernel in the CUDA kernel's place);
    otherwise every test here is skipped."""
    if torch.cuda.is_available():
        precision = torch.get_float32_matmul_precision()
        if precision != "highest":  # the fp32 reference without TF32
            torch.set_float32_matmul_precision("highest")
        yield torch.device("cuda", torch.cuda.current_device())
        if precision != "highest":
            torch.set_float32_matmul_precision(precision)
    elif ON_CPU:
        yield torch.device("cpu")
    else:
        pytest.skip("needs CUDA (TRL_RM_ENV_GPU_TESTS_ON_CPU=1 runs it on the CPU with the reference kernel)")


@pytest.fixture
def varlen_calls(device, request, monkeypatch):
    """The list of the varlen kernel's calls (their query dtypes): `kernels.run_varlen` wrapped (packed.py calls it
    as `kernels.run_varlen`). On CUDA the kernel must be usable in bf16; on the CPU the `reference_varlen` fixture
    answers yes and runs `kernels.reference_varlen_attn`, whose own call list must match at the end."""
    reference = None
    if device.type == "cuda":
        assert kernels.varlen_kernel() is not None, f"torch {torch.__version__} has no varlen_attn"
        assert kernels.varlen_usable(device, torch.bfloat16), "torch's varlen kernel does not run here in bf16"
    else:
        reference = request.getfixturevalue("reference_varlen")
    calls: list[torch.dtype] = []
    run_varlen, run_flex = kernels.run_varlen, kernels.run_flex

    def counted(query, *args, **kwargs):
        calls.append(query.dtype)
        return run_varlen(query, *args, **kwargs)

    def counted_flex(query, *args, **kwargs):  # the flex cases' kernel, counted alike
        calls.append(query.dtype)
        return run_flex(query, *args, **kwargs)

    monkeypatch.setattr(kernels, "run_varlen", counted)
    monkeypatch.setattr(kernels, "run_flex", counted_flex)
    yield calls
    if reference is not None:
        assert len(reference) == len(calls), (len(reference), len(calls))


@pytest.fixture(scope="module", autouse=True)
def report():
    """Prints each case's errors at the end (under `-s`) and writes them to `TRL_RM_ENV_GPU_REPORT` when set."""
    yield
    if not RESULTS:
        return
    columns = ["case", "device", "tokens packed / padded", "varlen calls", "scores packed", "scores plain",
               "pair losses packed", "pair losses plain", "worst grad packed", "worst grad plain", "worst parameter",
               "seconds"]
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for row in RESULTS:
        lines.append("| " + " | ".join(str(row.get(c, "")) for c in columns) + " |")
    table = "\n".join(lines)
    print("\n" + table)
    if REPORT:
        with open(REPORT, "w", encoding="utf-8") as f:
            import transformers

            f.write(f"Packed bf16 (varlen) vs plain bf16: errors against fp32 one-at-a-time (torch {torch.__version__}, "
                    f"transformers {transformers.__version__}; bound: packed <= {FACTOR:g} x plain + {EPS_ULPS} bf16 "
                    f"ulps; 'worst' = the gradient nearest its bound)\n\n{table}\n")


# ---------------------------------------------------------------------------------------------------- the check


def bf16_ulp(magnitude: float) -> float:
    """The spacing of bf16 numbers at `magnitude`: 2**(e - 7) for 2**e <= magnitude < 2**(e + 1)."""
    if not magnitude > 0 or not math.isfinite(magnitude):
        return torch.finfo(torch.bfloat16).tiny
    return 2.0 ** (math.floor(math.log2(magnitude)) - 7)


def assert_like_bf16(name: str, packed: torch.Tensor, plain: torch.Tensor, reference: torch.Tensor, *,
                     floor: float | None = None) -> tuple[float, float, float]:
    """Raise AssertionError unless `packed` is no farther from the fp32 `reference` than bf16 rounding puts `plain`
    (the same computation in the same precision): `err(packed) <= FACTOR * err(plain) + eps`.

    Without `floor`: err is the largest absolute difference, eps EPS_ULPS bf16 ulps of max |reference| (scores,
    losses). With `floor` (a gradient): err is the relative norm error ||x - ref|| / max(||ref||, floor), eps
    EPS_ULPS units of bf16 relative rounding. Returns (err packed, err plain, bound)."""
    ref = reference.detach().double()
    packed, plain = packed.detach().double(), plain.detach().double()
    if packed.shape != ref.shape or plain.shape != ref.shape:
        raise AssertionError(f"{name}: shapes packed {tuple(packed.shape)}, plain {tuple(plain.shape)}, "
                             f"fp32 {tuple(ref.shape)}")
    if floor is None:
        err_packed = (packed - ref).abs().max().item()
        err_plain = (plain - ref).abs().max().item()
        eps = EPS_ULPS * bf16_ulp(ref.abs().max().item())
        kind = "max abs error"
    else:
        scale = max(ref.norm().item(), floor)
        err_packed = (packed - ref).norm().item() / scale
        err_plain = (plain - ref).norm().item() / scale
        eps = EPS_ULPS * BF16_UNIT
        kind = "relative norm error"
    bound = FACTOR * err_plain + eps
    if not err_packed <= bound:  # NaN fails too
        raise AssertionError(
            f"{name}: packed bf16 is {err_packed:.3e} from fp32 ({kind}), plain bf16 {err_plain:.3e}; allowed "
            f"{FACTOR:g} x {err_plain:.3e} + {eps:.3e} = {bound:.3e}"
        )
    return err_packed, err_plain, bound


# ---------------------------------------------------------------------------------------------------- the cases


@functools.cache
def tokenizer():
    return build_tiny_tokenizer()


def build_model(arch: str, kv_heads: int, layers: int, max_positions: int = 4096, seed: int = 0):
    """An fp32 `*ForSequenceClassification` (one label, SDPA), deterministic from `seed`."""
    tok = tokenizer()
    sizes = dict(SIZES, num_hidden_layers=layers, num_key_value_heads=kv_heads, max_position_embeddings=max_positions,
                 num_labels=1, attn_implementation="sdpa")
    if arch == "qwen3":
        from transformers import Qwen3ForSequenceClassification

        cls, config = Qwen3ForSequenceClassification, tiny_qwen3_config(tok, **sizes)
    else:
        from transformers import LlamaConfig, LlamaForSequenceClassification

        cls = LlamaForSequenceClassification
        config = LlamaConfig(vocab_size=len(tok), pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
                             **sizes)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = cls(config)
    return model.eval()


def with_lora(model, seed: int = 0):
    """`model` with LoRA adapters on the attention projections (peft), A and B both random (peft's default B = 0
    would leave A without a gradient and the adapters without an effect)."""
    peft = pytest.importorskip("peft")
    config = peft.LoraConfig(task_type="SEQ_CLS", r=8, lora_alpha=8, init_lora_weights=False,
                             target_modules=["q_proj", "k_proj", "v_proj", "o_proj"])
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return peft.get_peft_model(model, config)


@torch.no_grad()
def round_to_bf16(model) -> None:
    """Round `model`'s fp32 weights to bf16 numbers in place: its bf16 copy then holds exactly the same weights."""
    for p in model.parameters():
        p.copy_(p.to(torch.bfloat16))


def make_examples(shapes, vocab: int, seed: int = 0) -> list[dict]:
    """Rank examples (`completion_ids`, `ranks`) of random ids in [10, vocab); SHORT_GROUPS' tie made identical."""
    g = torch.Generator().manual_seed(seed)
    examples = []
    for context_length, lengths, ranks in shapes:
        context = torch.randint(10, vocab, (context_length,), generator=g).tolist()
        completions = [context + torch.randint(10, vocab, (n,), generator=g).tolist() for n in lengths]
        examples.append({"completion_ids": completions, "ranks": ranks})
    if shapes is SHORT_GROUPS:
        group = examples[TIE[0]]["completion_ids"]
        group[1] = list(group[0])
    return examples


def reference_fp32(model32, sequences, ranks, record_index, params, device):
    """Scores, pair losses and gradients (None without `params`) of the fp32 model, each sequence alone (math
    attention on CUDA)."""
    backend = contextlib.nullcontext()
    if device.type == "cuda":
        from torch.nn.attention import SDPBackend, sdpa_kernel

        backend = sdpa_kernel(SDPBackend.MATH)
    with backend:
        scores = torch.stack([
            model32(input_ids=torch.tensor([seq], device=device), use_cache=False).logits[0, 0] for seq in sequences
        ])
        pairwise = ranked_bradley_terry_loss(scores, ranks, record_index)
        grads = torch.autograd.grad(pairwise.loss, params) if params else None
    return scores.detach(), pairwise.pair_losses.detach(), grads


def forward_context(device, autocast: bool):
    return torch.autocast(device.type, dtype=torch.bfloat16) if autocast else contextlib.nullcontext()


def plain_bf16(model, examples, params, device, autocast: bool):
    """The plain path: right-padded batch with its attention mask, `logits[:, 0]`."""
    batch = DataCollatorForRankedPreference(tokenizer().pad_token_id)(examples)
    batch = {k: v.to(device) for k, v in batch.items()}
    with forward_context(device, autocast):
        scores = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], use_cache=False).logits
        pairwise = ranked_bradley_terry_loss(scores[:, 0], batch["ranks"], batch["record_index"])
    grads = torch.autograd.grad(pairwise.loss, params) if params else None
    return scores[:, 0].detach(), pairwise.pair_losses.detach(), grads, batch["input_ids"].numel()


def packed_batch(examples, device):
    batch = DataCollatorForRankedPreference(tokenizer().pad_token_id, layout=PACKED)(examples)
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}


def packed_bf16(model, batch, params, autocast: bool, calls: list, layers: int, checkpointing: bool = False):
    """The packed path, forward and backward under the packed attention (as `RankedRewardTrainer.training_step`);
    checks the varlen kernel's calls: one per layer in forward, one more per layer in a checkpointed backward, all in
    bf16 (but under the CPU's autocast, where the packed attention computes in the query's dtype, fp32)."""
    before = len(calls)
    device = batch["input_ids"].device
    with packed_attention(model):
        with forward_context(device, autocast):
            scores, _ = packed_scores(model, batch)
            pairwise = ranked_bradley_terry_loss(scores, batch["ranks"], batch["record_index"])
        assert len(calls) - before == layers, f"{len(calls) - before} varlen kernel calls in forward, {layers} layers"
        grads = torch.autograd.grad(pairwise.loss, params) if params else None
    expected = 2 * layers if checkpointing and params else layers
    assert len(calls) - before == expected, f"{len(calls) - before} varlen kernel calls, expected {expected}"
    if device.type == "cuda" or not autocast:
        assert set(calls[before:]) == {torch.bfloat16}, f"the varlen kernel ran in {set(calls[before:])}"
    return scores.detach(), pairwise.pair_losses.detach(), grads


CASES = {
    # name: (arch, key/value heads, layers, options)
    "qwen3-gqa": ("qwen3", 2, 2, {}),
    "qwen3-mha": ("qwen3", 4, 2, {}),
    "llama-gqa": ("llama", 2, 2, {}),
    "llama-mha": ("llama", 4, 2, {}),
    "qwen3-gqa-lora": ("qwen3", 2, 2, {"lora": True}),
    "llama-gqa-lora": ("llama", 2, 2, {"lora": True}),
    "qwen3-gqa-checkpointing": ("qwen3", 2, 2, {"checkpointing": True}),
    "llama-mha-checkpointing": ("llama", 4, 2, {"checkpointing": True}),
    "qwen3-gqa-autocast": ("qwen3", 2, 2, {"autocast": True}),
    "qwen3-gqa-8k-context": ("qwen3", 2, 2, {"long": True}),
    # `fused_kernels`: Liger Kernel's RMSNorm, SwiGLU and RoPE on the packed path (CUDA only), against the plain
    # path's error WITHOUT them (the bound the unfused packed path meets)
    # FlexAttention (`TRL_RM_ENV_PACKED_KERNEL=flex`: key/value heads shared, not repeated; CUDA only, its backward)
    "qwen3-gqa-flex": ("qwen3", 2, 2, {"kernel": "flex"}),
    "llama-mha-flex": ("llama", 4, 2, {"kernel": "flex"}),
    "qwen3-gqa-flex-checkpointing": ("qwen3", 2, 2, {"kernel": "flex", "checkpointing": True}),
    "qwen3-gqa-fused": ("qwen3", 2, 2, {"fused": True}),
    "llama-gqa-fused": ("llama", 2, 2, {"fused": True}),
    "qwen3-gqa-fused-checkpointing": ("qwen3", 2, 2, {"fused": True, "checkpointing": True}),
}


@contextlib.contextmanager
def module_restored(arch: str):
    """Liger patches the model type's module for the whole process (its RoPE function, RMSNorm and MLP classes):
    put every name of `transformers.models.<arch>.modeling_<arch>` back after the case."""
    import importlib

    module = importlib.import_module(f"transformers.models.{arch}.modeling_{arch}")
    saved = dict(vars(module))
    try:
        yield
    finally:
        for name in [n for n in vars(module) if n not in saved]:
            delattr(module, name)
        for name, value in saved.items():
            setattr(module, name, value)


def run_case(case: str, device: torch.device, calls: list, seed: int = 0, rounded: bool = ROUNDED_WEIGHTS):
    """Score, lose and differentiate one case's micro-batch three ways and check packed against plain
    (`assert_like_bf16`, every quantity). Returns the report's row and the checks' (err packed / bound) ratios."""
    arch, kv_heads, layers, options = CASES[case]
    start = time.perf_counter()
    long, autocast = options.get("long", False), options.get("autocast", False)
    checkpointing = options.get("checkpointing", False)
    shapes = LONG_GROUPS if long else SHORT_GROUPS
    model32 = build_model(arch, kv_heads, layers, max_positions=8448 if long else 4096, seed=seed)
    if options.get("lora"):
        model32 = with_lora(model32, seed=seed)
    if rounded:
        round_to_bf16(model32)
    # The bf16 copy (fp32 weights under bf16 autocast: the Trainer's `bf16=True`).
    model16 = copy.deepcopy(model32) if autocast else copy.deepcopy(model32).to(torch.bfloat16)
    model32.to(device)
    model16.to(device)
    if checkpointing:
        if hasattr(model16, "activation_checkpointing_enable"):  # transformers >= 5.2x's name (the old one warns)
            model16.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        else:
            model16.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model16.train()
    names = [n for n, p in model32.named_parameters() if p.requires_grad]
    params32 = [p for p in model32.parameters() if p.requires_grad]
    params16 = [p for p in model16.parameters() if p.requires_grad]
    assert names == [n for n, p in model16.named_parameters() if p.requires_grad]

    examples = make_examples(shapes, model32.config.vocab_size, seed=seed)
    sequences = [seq for example in examples for seq in example["completion_ids"]]
    batch = packed_batch(examples, device)
    ranks, record_index = batch["ranks"], batch["record_index"]

    ref_scores, ref_losses, ref_grads = reference_fp32(model32, sequences, ranks, record_index, params32, device)
    plain_scores, plain_losses, plain_grads, padded = plain_bf16(model16, examples, params16, device, autocast)
    if options.get("fused"):  # the fp32 reference and the plain path above ran without Liger
        if device.type != "cuda":
            pytest.skip("Liger Kernel's kernels need CUDA")
        from trl_rm_env.fused_kernels import use_fused_kernels

        with module_restored(arch):
            assert use_fused_kernels(True, model16, device, "the GPU tests")
            scores, losses, grads = packed_bf16(model16, batch, params16, autocast, calls, layers, checkpointing)
    elif options.get("kernel"):
        if device.type != "cuda":
            pytest.skip("FlexAttention's backward runs on CUDA only")
        previous = os.environ.get(kernels.PACKED_KERNEL_ENV)
        os.environ[kernels.PACKED_KERNEL_ENV] = options["kernel"]
        kernels.packed_kernel.cache_clear()
        try:
            scores, losses, grads = packed_bf16(model16, batch, params16, autocast, calls, layers, checkpointing)
        finally:
            if previous is None:
                os.environ.pop(kernels.PACKED_KERNEL_ENV)
            else:
                os.environ[kernels.PACKED_KERNEL_ENV] = previous
            kernels.packed_kernel.cache_clear()
    else:
        scores, losses, grads = packed_bf16(model16, batch, params16, autocast, calls, layers, checkpointing)
    assert classifier(model16).config._attn_implementation == "sdpa"  # restored after the packed call

    ratios = []
    s = assert_like_bf16(f"{case}: scores", scores, plain_scores, ref_scores)
    pl = assert_like_bf16(f"{case}: pair losses", losses, plain_losses, ref_losses)
    ratios += [("scores", s[0] / s[2]), ("pair losses", pl[0] / pl[2])]
    largest = max(g.norm().item() for g in ref_grads)
    worst = (-1.0, 0.0, 0.0, "")
    for name, g, g_plain, g32 in zip(names, grads, plain_grads, ref_grads):
        err, err_plain, bound = assert_like_bf16(f"{case}: gradient of {name}", g, g_plain, g32,
                                                 floor=GRAD_FLOOR * largest)
        ratios.append((name, err / bound))
        if err / bound > worst[0]:
            worst = (err / bound, err, err_plain, name)
    if not long:  # the identical (tied) completions score the same in the packed row
        a, b = TIE[1], TIE[2]
        assert sequences[a] == sequences[b]
        tie_eps = EPS_ULPS * bf16_ulp(ref_scores.abs().max().item())
        assert abs(scores[a] - scores[b]).item() <= tie_eps, (case, scores[a].item(), scores[b].item())
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu (reference kernel)"
    row = {"case": case, "device": name, "tokens packed / padded": f"{batch['num_tokens']} / {padded}",
           "varlen calls": len(calls), "scores packed": f"{s[0]:.2e}", "scores plain": f"{s[1]:.2e}",
           "pair losses packed": f"{pl[0]:.2e}", "pair losses plain": f"{pl[1]:.2e}",
           "worst grad packed": f"{worst[1]:.2e}", "worst grad plain": f"{worst[2]:.2e}", "worst parameter": worst[3],
           "seconds": f"{time.perf_counter() - start:.1f}"}
    return row, ratios


@pytest.mark.parametrize("case", list(CASES))
def test_packed_bf16_is_as_close_to_fp32_as_plain_bf16(case, device, varlen_calls):
    row, _ = run_case(case, device, varlen_calls)
    RESULTS.append(row)
    print(f"\n[packed bf16] {case}: scores packed {row['scores packed']} plain {row['scores plain']}; pair losses "
          f"packed {row['pair losses packed']} plain {row['pair losses plain']}; worst gradient "
          f"({row['worst parameter']}) packed {row['worst grad packed']} plain {row['worst grad plain']}")


def see_sibling(packed, segment: int, sibling: int, keys: int | None = None):
    """Corrupt `packed` in place: `segment` (a completion) also sees the first `keys` keys (None: all) of `sibling`
    (another completion of its group), between its context and its own tokens: packing without the layout, or a
    context range one token too long."""
    cu_q, cu_k = packed.cu_seqlens_q.tolist(), packed.cu_seqlens_k.tolist()
    end = cu_q[sibling + 1] if keys is None else cu_q[sibling] + keys
    extra = torch.arange(cu_q[sibling], end, dtype=packed.key_index.dtype)
    own_start = cu_k[segment + 1] - (cu_q[segment + 1] - cu_q[segment])  # its own keys come after its context's
    packed.key_index = torch.cat([packed.key_index[:own_start], extra, packed.key_index[own_start:]])
    lengths = packed.cu_seqlens_k.diff().long()
    lengths[segment] += extra.numel()
    packed.cu_seqlens_k = torch.cat([lengths.new_zeros(1), lengths.cumsum(0)]).to(torch.int32)
    packed.max_k = int(lengths.max())


@pytest.mark.parametrize("leak", [None, 1], ids=["whole-sibling", "one-key"])
def test_a_broken_layout_fails_the_check(device, varlen_calls, leak):
    """The tolerance catches a layout bug: one completion that also sees its sibling's keys (all of them, or only the
    first: an off-by-one context range) makes the packed scores fail `assert_like_bf16` (the same check, data and
    models as the cases above)."""
    model32 = build_model("qwen3", 2, 2)
    if ROUNDED_WEIGHTS:
        round_to_bf16(model32)
    model16 = copy.deepcopy(model32).to(torch.bfloat16).to(device)
    model32.to(device)
    examples = make_examples(SHORT_GROUPS, model32.config.vocab_size)
    sequences = [seq for example in examples for seq in example["completion_ids"]]
    batch = DataCollatorForRankedPreference(tokenizer().pad_token_id, layout=PACKED)(examples)
    # The row's segments: each group's context, then its completions. Group 2 (a context of 8, completions of 20
    # and 5 tokens): its second completion also sees the first.
    sibling = sum(1 + len(own) for _, own, _ in SHORT_GROUPS[:2]) + 1  # past groups 0 and 1, and group 2's context
    segment = sibling + 1
    segment_lengths = batch["packed"].cu_seqlens_q.diff().tolist()
    assert segment_lengths[sibling - 1:segment + 1] == [8, 20, 5], segment_lengths
    see_sibling(batch["packed"], segment, sibling, leak)
    batch = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
    with torch.no_grad():
        ref_scores, _, _ = reference_fp32(model32, sequences, batch["ranks"], batch["record_index"], [], device)
        plain_scores, _, _, _ = plain_bf16(model16, examples, [], device, autocast=False)
        scores, _, _ = packed_bf16(model16, batch, [], False, varlen_calls, 2)
    corrupted = sum(len(own) for _, own, _ in SHORT_GROUPS[:2]) + 1  # its row (completions in record order)
    errors = (scores.double() - ref_scores.double()).abs()
    print(f"\n[packed bf16] broken layout ({leak or 'all'} sibling keys): |packed - fp32| "
          f"{[f'{e:.1e}' for e in errors.tolist()]}")
    assert int(errors.argmax()) == corrupted  # the corrupted completion's score moved, not (only) rounding
    with pytest.raises(AssertionError, match="broken layout: scores"):
        assert_like_bf16("broken layout: scores", scores, plain_scores, ref_scores)


def test_a_micro_batch_over_pack_max_tokens_trains_as_one_forward(device, varlen_calls, tmp_path):
    """`RankedRewardTrainer` under `prefix_sharing="auto"` (the packed layout on the device) with `pack_max_tokens`
    below the micro-batch's tokens: the step runs one packed forward per chunk of consecutive records, and its loss
    and gradients are as close to the fp32 reference of the whole micro-batch as the plain bf16 path's
    (`assert_like_bf16`)."""
    from datasets import Dataset

    from trl_rm_env import RankedRewardConfig, RankedRewardTrainer

    model32 = build_model("qwen3", 2, 2)
    round_to_bf16(model32)
    model16 = copy.deepcopy(model32).to(torch.bfloat16)
    model32.to(device)
    examples = make_examples(SHORT_GROUPS, model32.config.vocab_size)
    sequences = [seq for example in examples for seq in example["completion_ids"]]
    args = RankedRewardConfig(
        output_dir=str(tmp_path), per_device_train_batch_size=len(examples), max_steps=1, report_to="none",
        save_strategy="no", disable_tqdm=True, use_cpu=device.type == "cpu", bf16=False, pack_max_tokens=80,
        dataloader_num_workers=0, train_sampling_strategy="sequential", max_length=None,
    )
    trainer = RankedRewardTrainer(model=model16, args=args, train_dataset=Dataset.from_list(examples),
                                  processing_class=tokenizer())
    assert trainer._layout.name == "packed" and trainer._forward_budget == 80
    batch = next(iter(trainer.get_train_dataloader()))
    chunks = batch["chunks"]
    assert len(chunks) >= 3 and all(c["num_tokens"] <= 80 or int(c["record_index"].max()) == 0 for c in chunks)
    params = [p for p in trainer.model.parameters() if p.requires_grad]
    trainer.model.zero_grad()
    trainer.current_gradient_accumulation_steps = 1
    before = len(varlen_calls)
    loss = trainer.training_step(trainer.model, batch)
    assert len(varlen_calls) - before == 2 * len(chunks)  # one call per layer (2) in each chunk's forward
    grads = [p.grad.detach().clone() for p in params]
    ranks, record_index = batch["ranks"].to(device), batch["record_index"].to(device)
    ref_scores, ref_pairs, ref_grads = reference_fp32(model32, sequences, ranks, record_index,
                                                      [p for p in model32.parameters()], device)
    model16.zero_grad()
    plain_scores, plain_pairs, plain_grads, _ = plain_bf16(trainer.model, examples, params, device, autocast=False)
    ref_loss = ref_pairs.mean()
    plain_loss = plain_pairs.float().mean()
    assert_like_bf16("bounded step: loss", loss.float().reshape(1), plain_loss.reshape(1), ref_loss.reshape(1))
    largest = max(float(g.float().norm()) for g in ref_grads)
    for (name, _), g, g_plain, g_ref in zip(trainer.model.named_parameters(), grads, plain_grads, ref_grads):
        assert_like_bf16(f"bounded step: gradient of {name}", g, g_plain, g_ref, floor=GRAD_FLOOR * largest)
    RESULTS.append({"case": f"pack_max_tokens=80, {len(chunks)} chunks", "device": str(device),
                    "tokens packed / padded": f"{sum(c['num_tokens'] for c in chunks)} / -",
                    "varlen calls": 2 * len(chunks), "scores packed": "-", "scores plain": "-",
                    "pair losses packed": f"{abs(loss.item() - ref_loss.item()):.2e} (loss)",
                    "pair losses plain": f"{abs(plain_loss.item() - ref_loss.item()):.2e} (loss)",
                    "worst grad packed": "-", "worst grad plain": "-", "worst parameter": "-", "seconds": "-"})
