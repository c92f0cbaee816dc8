"""Loading a reward model for inference, resolved once per call path.

`plan_scoring` checks the model's source, reads its config, resolves its head (Bradley-Terry or regression) and
chooses the engine (`choose_engine`), all once, into an immutable `ScoringPlan`; `load_scorer(plan)` builds the
`RewardScorer` the plan describes. The GRPO environment, `trl-rm-env eval` and `trl-rm-env serve` (which hands a vLLM
plan to vLLM's own server instead) all go through these two steps.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from transformers import (
    AutoConfig,
    AutoModelForSequenceClassification,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from ..distributed import launched
from ..heads import RewardHead, reward_head
from ..model_source import check_model_source
from ..options import changed, option_fields, spelled, spelling
from .options import PRECISIONS, ScoringOptions
from .scorer import RewardScorer
from .vllm import VLLMEngine, vllm_device, vllm_installed

logger = logging.getLogger(__name__)
_logged_choices: set[tuple[str, str]] = set()

LOADING_OPTIONS = frozenset({"precision", "trust_remote_code", "model_init_kwargs"})
"""The options that say how a model is loaded from its path: refused with a model already loaded."""


def load_dtype(precision: str, device: torch.device | str) -> torch.dtype | str:
    """What `from_pretrained(dtype=...)` gets for a precision name (`ScoringOptions.precision`) on `device`:
    `auto` is the checkpoint's own dtype (transformers' `"auto"`) on an accelerator, fp32 on the CPU."""
    name = PRECISIONS[precision]
    if name == "auto":
        return torch.float32 if torch.device(device).type == "cpu" else "auto"
    return getattr(torch, name)


def default_device() -> torch.device:
    """The device of this process: Accelerate's (its GPU under a multi-GPU launch), else CUDA when available."""
    from accelerate import PartialState

    return PartialState().device


@dataclass(frozen=True)
class ScoringPlan:
    """What scores and how, resolved once: built by `plan_scoring`, read by `load_scorer` and `trl-rm-env serve`.

    Args:
        model: The reward model's checked local folder or Hub id (None when `loaded` holds the model).
        loaded: A model the caller loaded, or None.
        config: The model's config (read once).
        options: The `ScoringOptions`.
        head: How the outputs become one reward (`trl_rm_env.heads.RewardHead`).
        engine: `"vllm"` or `"hf"`.
        why: Why that engine (logged once per process).
    """

    model: str | None
    loaded: PreTrainedModel | None
    config: Any
    options: ScoringOptions
    head: RewardHead
    engine: str
    why: str


def engine_specific(options: ScoringOptions) -> dict[str, str]:
    """The options given (not at their defaults) that belong to one engine: `{name: engine}`."""
    given = changed(options)
    return {f.name: spelling(f).engine for f in option_fields(ScoringOptions) if spelling(f).engine and f.name in given}


def choose_engine(options: ScoringOptions, *, hf_only: str | None = None) -> tuple[str, str]:
    """`(engine, why)` for a reward model given by path or Hub id: `"vllm"` or `"hf"`.

    `"vllm"` and `"hf"` are taken as asked. `"auto"` keeps transformers when the caller says only transformers can
    serve the case (`hf_only`: a model to shard with FSDP2, a model already loaded), when a transformers-only option
    is given (`model_init_kwargs`), when vLLM is not installed, when several processes run (each would start its
    own vLLM engine: serve one instead, `trl-rm-env serve --engine vllm`, and pass `remote_url`), or when `device` is
    not the device vLLM's build runs on; otherwise vLLM.

    Raises:
        ValueError: an option of one engine while the other is chosen (named, with why that engine), `hf_only`
            with `engine="vllm"`, or a `device` vLLM does not run on with `engine="vllm"`.
    """
    specific = engine_specific(options)
    if options.engine in ("vllm", "hf"):
        engine, why = options.engine, "asked for"
    elif hf_only:
        engine, why = "hf", hf_only
    elif "hf" in specific.values():
        names = sorted(k for k, v in specific.items() if v == "hf")
        engine, why = "hf", f"{', '.join(names)} are transformers loading arguments"
    elif not vllm_installed():
        engine, why = "hf", "vLLM is not installed"
    elif launched():
        engine, why = "hf", "several processes run (each would start its own vLLM: serve it once and use remote_url)"
    elif options.device is not None and not _vllm_runs_on(options.device):
        engine, why = "hf", f"device {options.device} is not one vLLM can be placed on ({vllm_device()})"
    else:
        engine, why = "vllm", "vLLM is installed"
    if engine == "vllm" and hf_only:
        raise ValueError(f"engine='vllm' cannot serve this reward model: {hf_only}")
    if engine == "vllm" and options.device is not None and vllm_installed() and not _vllm_runs_on(options.device):
        raise ValueError(
            f"device={options.device!r} applies to engine='hf'; vLLM places the model itself on its device "
            f"({vllm_device()}: choose the GPU with CUDA_VISIBLE_DEVICES)"
        )
    wrong = sorted(name for name, owner in specific.items() if owner != engine)
    if wrong:
        owner = specific[wrong[0]]
        fix = "install vLLM, or drop it" if why == "vLLM is not installed" else "drop it"
        if options.engine != "auto":
            fix += f", or set engine='{owner}'"
        raise ValueError(
            f"{spelled(ScoringOptions, wrong)} applies to engine='{owner}', but this reward model scores on "
            f"{'vLLM' if engine == 'vllm' else 'transformers'} ({why}): {fix}"
        )
    return engine, why


def _vllm_runs_on(device: str | torch.device) -> bool:
    """Whether vLLM honours `device`: its own device type, with no index (vLLM picks the GPU itself)."""
    device = torch.device(device)
    return device.type == vllm_device() and device.index is None


def log_engine_choice(engine: str, why: str) -> None:
    """Say once per process which engine scores and why."""
    if (engine, why) not in _logged_choices:
        _logged_choices.add((engine, why))
        logger.info("Reward model scoring engine: %s (%s)", "vLLM" if engine == "vllm" else "transformers", why)


def plan_scoring(
    model: str | os.PathLike | PreTrainedModel,
    options: ScoringOptions | None = None,
    *,
    hf_only: str | Callable[[Any, RewardHead], str | None] | None = None,
    one_reward: bool = True,
    **values: Any,
) -> ScoringPlan:
    """Resolve, once, what `load_scorer` needs: the model's source (a typo'd local folder fails here, in one
    line), its config, its head and the engine.

    Args:
        model: A local folder or Hub id of a `*ForSequenceClassification` checkpoint, or a loaded model.
        options, **values: The `ScoringOptions`, an instance and/or by name.
        hf_only: Why only transformers can serve this case (see `choose_engine`), or None; or a function of the
            model's config and head that says why (`trl-rm-env serve`: vLLM's server computes no regression reward).
        one_reward: Whether one reward per sample is needed (default): a regression model with several attributes
            then needs weights. `trl-rm-env eval` reads a regression model's attributes one by one instead.

    Raises:
        trl_rm_env.model_source.ModelSourceError: a missing local model folder.
        ValueError: a bad option, weights that do not fit the head, an option of the engine not chosen, or a
            loading option (`precision`, ...) for a model already loaded.
    """
    options = ScoringOptions.build(options, **values)
    if isinstance(model, PreTrainedModel):
        path, loaded, config = None, model, model.config
        if options.engine == "vllm":
            raise ValueError(
                "engine='vllm' loads the reward model from its path or Hub id, not from a loaded model: give "
                "the path (RewardModelEnvironment(path, engine='vllm'), load_reward_scorer(path, engine='vllm'))"
            )
        loading = sorted(set(changed(options)) & LOADING_OPTIONS)
        if loading:
            raise ValueError(
                f"{spelled(ScoringOptions, loading)}: applied when a model is loaded from its path or Hub id; this "
                "one is already loaded (load it that way, or give the path)"
            )
    else:
        path, loaded = check_model_source(str(model), "reward model"), None
        config = AutoConfig.from_pretrained(path, trust_remote_code=options.trust_remote_code)
    head = reward_head(config, options.attribute_weights, options.reward_model_type, one_reward=one_reward)
    if callable(hf_only):
        hf_only = hf_only(config, head)
    if loaded is not None:
        hf_only = hf_only or "the model is already loaded in this process"
    engine, why = choose_engine(options, hf_only=hf_only)
    return ScoringPlan(path, loaded, config, options, head, engine, why)


def _load_with_transformers(
    model: str | os.PathLike | PreTrainedModel,
    tokenizer: str | os.PathLike | PreTrainedTokenizerBase | None = None,
    options: ScoringOptions | None = None,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """A `*ForSequenceClassification` reward model and its tokenizer, ready to score with transformers: frozen, in
    eval mode, on `options.device` (default `default_device()`), in `options.precision`.

    Args:
        model: A local folder or Hub id (loaded with `options.trust_remote_code` and `model_init_kwargs`), or a
            loaded model.
        tokenizer: Its tokenizer, a path or Hub id of one, or None (the model's own).
        options: The `ScoringOptions` (default: the defaults).
    """
    options = options or ScoringOptions()
    if isinstance(model, str | os.PathLike):
        path = str(model)
        device = options.device if options.device is not None else default_device()
        kwargs = {"dtype": load_dtype(options.precision, device), "trust_remote_code": options.trust_remote_code}
        model = AutoModelForSequenceClassification.from_pretrained(path, **kwargs | (options.model_init_kwargs or {}))
        tokenizer = path if tokenizer is None else tokenizer
    if tokenizer is None:
        tokenizer = model.config._name_or_path
    if isinstance(tokenizer, str | os.PathLike):
        tokenizer = AutoTokenizer.from_pretrained(str(tokenizer), trust_remote_code=options.trust_remote_code)
    model.requires_grad_(False)  # a scoring model is never trained here
    model.eval().to(options.device if options.device is not None else default_device())
    return model, tokenizer


def load_scorer(
    plan: ScoringPlan, tokenizer: str | os.PathLike | PreTrainedTokenizerBase | None = None
) -> RewardScorer:
    """The `RewardScorer` of `plan`: vLLM's engine, or the model loaded with transformers. Under `engine="auto"`
    with no vLLM option given, a vLLM that fails to start is a warning and transformers scores instead."""
    if plan.engine == "vllm":
        try:
            engine = VLLMEngine(plan.model, plan.config, plan.options)
        except Exception as err:
            if plan.options.engine == "vllm" or engine_specific(plan.options):
                raise
            logger.warning("vLLM could not start (%s: %s); scoring with transformers instead.", type(err).__name__, err)
            plan = dataclasses.replace(plan, engine="hf", why="vLLM failed to start")
        else:
            log_engine_choice(plan.engine, plan.why)
            if tokenizer is None or isinstance(tokenizer, str | os.PathLike):
                trust = plan.options.trust_remote_code
                tokenizer = AutoTokenizer.from_pretrained(str(tokenizer or plan.model), trust_remote_code=trust)
            return RewardScorer(None, tokenizer, plan.options, engine=engine, config=plan.config, head=plan.head)
    log_engine_choice(plan.engine, plan.why)
    model, tokenizer = _load_with_transformers(
        plan.loaded if plan.loaded is not None else plan.model, tokenizer, plan.options
    )
    return RewardScorer(model, tokenizer, plan.options, head=plan.head)


def load_reward_scorer(
    model: str | os.PathLike, options: ScoringOptions | None = None, *, one_reward: bool = True, **values: Any
) -> RewardScorer:
    """Load a `*ForSequenceClassification` checkpoint (path or Hub id) and its tokenizer into a `RewardScorer`, on
    the engine `options.engine` picks (`choose_engine`; `"auto"` by default): `load_scorer(plan_scoring(...))`.

    Args:
        model: Local folder or Hub id of the reward model.
        options, **values: The `ScoringOptions` (`batch_size`, `max_tokens_per_batch`, `precision`, `engine`, ...).
        one_reward: False to read a regression model's attributes without weights (`RewardScorer.outputs`).

    Raises:
        ValueError: a bad option value.
        ImportError: `engine="vllm"` without vLLM installed.
    """
    return load_scorer(plan_scoring(model, options, one_reward=one_reward, **values))
