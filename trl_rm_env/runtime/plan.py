"""What loads a model and how, resolved once per call path: `plan_model` checks the model's source, reads its
config, tells its kind (a reward model, `*ForSequenceClassification`, or a judge, a causal LM), resolves a reward
model's head and chooses the engine (`choose_engine`), into an immutable `ModelPlan`. The engine of a plan
(`trl_rm_env.runtime.loading.load_engine`: the reward model's scorer and the judge alike) and `trl-rm-env serve`
(`trl_rm_env.serving.plan`) all start from one.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from transformers import AutoConfig, PreTrainedModel

from ..distributed import launched
from ..heads import RewardHead, check_label_index, reward_head
from ..model_source import check_model_source
from ..options import changed, option_fields, spelled, spelling
from .model_options import PRECISIONS, ModelOptions, ScoringOptions
from .vllm import prefix_caching, vllm_device, vllm_installed

logger = logging.getLogger(__name__)
_logged_choices: set[tuple[str, str]] = set()

KINDS = ("reward", "judge")
CAUSAL_SUFFIXES = ("ForCausalLM", "ForConditionalGeneration", "LMHeadModel")
LOADING_OPTIONS = frozenset({"precision", "trust_remote_code", "model_init_kwargs"})
"""The options that say how a model is loaded from its path: refused with a model already loaded."""


def is_causal_lm(config: Any) -> bool:
    """Whether a config's architectures name a causal LM (a judge) rather than a reward model."""
    return _names_causal_lm(getattr(config, "architectures", None) or [])


def _names_causal_lm(architectures: list[str]) -> bool:
    return any(a.endswith(CAUSAL_SUFFIXES) for a in architectures)


def load_dtype(precision: str, device: torch.device | str) -> torch.dtype | str:
    """What `from_pretrained(dtype=...)` gets for a precision name (`ModelOptions.precision`) on `device`:
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
class ModelPlan:
    """What loads and how, resolved once (`plan_model`), read by the loaders (`trl_rm_env.runtime.loading`).

    Args:
        model: The model's checked local folder or Hub id (None when `loaded` holds the model).
        loaded: A model the caller loaded, or None.
        config: The model's config (read once).
        options: The model's options: `ScoringOptions` for a reward model, `ModelOptions` for a judge.
        kind: `"reward"` (a `*ForSequenceClassification` reward model) or `"judge"` (a causal LM).
        head: How a reward model's outputs become one reward (`trl_rm_env.heads.RewardHead`); None for a judge.
        engine: `"vllm"` or `"hf"`.
        why: Why that engine (logged once per process).
        reason: The same as a code for code to test (`REASONS`): `"per_process"` when several processes each load a
            copy on transformers (where one served vLLM engine would do).
        prefix_sharing: The prefix sharing asked of the engine, decided here once for the kind and the engine
            (`planned_sharing`): a reward model's mode on transformers (`False`, `True`, `"auto"` or `"packed"`, which
            the engine resolves against its weights once: `trl_rm_env.sharing.scoring_sharing`), `False` for a
            judge there (its prompts are its own), and whether vLLM's prefix caching is on.
    """

    model: str | None
    loaded: PreTrainedModel | None
    config: Any
    options: ModelOptions
    kind: str
    head: RewardHead | None
    engine: str
    why: str
    reason: str = ""
    prefix_sharing: bool | str = False

    @property
    def source(self) -> str:
        """Where the weights and the tokenizer come from: the path or Hub id, or the loaded model's own."""
        return self.model if self.model is not None else str(self.loaded.config._name_or_path)


def planned_sharing(kind: str, engine: str, options: ModelOptions) -> bool | str:
    """`ModelPlan.prefix_sharing`: on vLLM, whether its prefix caching is on (unless `prefix_sharing=False`, for
    either kind); on any other engine, a reward model's `prefix_sharing` mode, and nothing for a judge."""
    if engine == "vllm":
        return prefix_caching(options)
    return options.prefix_sharing if kind == "reward" else False


def engine_specific(options: ModelOptions) -> dict[str, str]:
    """The options given (not at their defaults) that belong to one engine: `{name: engine}`."""
    given = changed(options)
    return {f.name: spelling(f).engine for f in option_fields(ModelOptions) if spelling(f).engine and f.name in given}


REASONS = ("asked", "hf_only", "hf_option", "no_vllm", "per_process", "device", "vllm")
"""Why an engine was chosen, as `choose_engine`'s cases in order: asked for, a case only transformers serves, a
transformers-only option, vLLM not installed, several processes, a device vLLM is not placed on, vLLM installed."""


def choose_engine(
    options: ModelOptions, *, hf_only: str | None = None, what: str = "reward model"
) -> tuple[str, str]:
    """`(engine, why)` for a model (`what`, for messages) given by path or Hub id: `"vllm"` or `"hf"`; see
    `engine_choice`, which also says which case decided."""
    engine, why, _ = engine_choice(options, hf_only=hf_only, what=what)
    return engine, why


def engine_choice(
    options: ModelOptions, *, hf_only: str | None = None, what: str = "reward model"
) -> tuple[str, str, str]:
    """`(engine, why, reason)` for a model (`what`, for messages) given by path or Hub id: `"vllm"` or `"hf"`.

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
    if options.engine != "auto":  # vllm, hf or a registered engine (`runtime.engines.registry`)
        engine, why, reason = options.engine, "asked for", "asked"
    elif hf_only:
        engine, why, reason = "hf", hf_only, "hf_only"
    elif "hf" in specific.values():
        names = sorted(k for k, v in specific.items() if v == "hf")
        engine, why, reason = "hf", f"{', '.join(names)} are transformers loading arguments", "hf_option"
    elif not vllm_installed():
        engine, why, reason = "hf", "vLLM is not installed", "no_vllm"
    elif launched():
        engine, reason = "hf", "per_process"
        why = "several processes run (each would start its own vLLM: serve it once and use remote_url)"
    elif options.device is not None and not _vllm_runs_on(options.device):
        engine, reason = "hf", "device"
        why = f"device {options.device} is not one vLLM can be placed on ({vllm_device()})"
    else:
        engine, why, reason = "vllm", "vLLM is installed", "vllm"
    if engine == "vllm" and hf_only:
        raise ValueError(f"engine='vllm' cannot serve this {what}: {hf_only}")
    if engine == "vllm" and options.device is not None and vllm_installed() and not _vllm_runs_on(options.device):
        raise ValueError(
            f"device={options.device!r} applies to engine='hf'; vLLM places the model itself on its device "
            f"({vllm_device()}: choose the GPU with CUDA_VISIBLE_DEVICES)"
        )
    wrong = sorted(name for name, owner in specific.items() if owner != engine)
    if wrong:
        owner = specific[wrong[0]]
        fix = "install vLLM, or drop it" if reason == "no_vllm" else "drop it"
        if options.engine != "auto":
            fix += f", or set engine='{owner}'"
        raise ValueError(
            f"{spelled(ModelOptions, wrong)} applies to engine='{owner}', but this {what} scores on "
            f"{engine_label(engine)} ({why}): {fix}"
        )
    return engine, why, reason


def engine_label(engine: str) -> str:
    """An engine as messages name it: vLLM, transformers, or a registered engine's own name."""
    return {"vllm": "vLLM", "hf": "transformers"}.get(engine, engine)


def _vllm_runs_on(device: str | torch.device) -> bool:
    """Whether vLLM honours `device`: its own device type, with no index (vLLM picks the GPU itself)."""
    device = torch.device(device)
    return device.type == vllm_device() and device.index is None


def log_engine_choice(plan: ModelPlan) -> None:
    """Say once per process which engine runs a plan's kind of model and why."""
    if (plan.kind, plan.engine, plan.why) not in _logged_choices:
        _logged_choices.add((plan.kind, plan.engine, plan.why))
        what = "Reward model scoring" if plan.kind == "reward" else "Judge"
        logger.info("%s engine: %s (%s)", what, engine_label(plan.engine), plan.why)


def _what(kind: str | None) -> str:
    return {"reward": "reward model", "judge": "judge"}.get(kind or "", "model")


def _check_kind(kind: str, architectures: list[str], where: str) -> None:
    if kind == "judge" and architectures and not _names_causal_lm(architectures):
        raise ValueError(
            f"the judge {where}is a {', '.join(architectures)}, not a causal language model (*ForCausalLM): a judge "
            "writes its verdict. A reward model (*ForSequenceClassification) is RewardModelEnvironment's."
        )


def plan_model(
    model: str | os.PathLike | PreTrainedModel,
    options: ModelOptions | None = None,
    *,
    kind: str | None = "reward",
    hf_only: str | Callable[[ModelPlan], str | None] | None = None,
    one_reward: bool = True,
    **values: Any,
) -> ModelPlan:
    """Resolve, once, what the loaders need: the model's source (a typo'd local folder fails here, in one line),
    its config, its kind, a reward model's head and the engine.

    Args:
        model: A local folder or Hub id, or a loaded model.
        options, **values: The model's options, an instance and/or by name: a reward model's are `ScoringOptions`
            (a `ModelOptions` gets the head's defaults), a judge's `ModelOptions` (default: a reward model's when
            `kind` is None, the judge's when it is `"judge"`).
        kind: `"reward"` or `"judge"`; None: told from the config (a causal LM is a judge).
        hf_only: Why only transformers can serve this case (see `choose_engine`), or None; or a function of the plan
            (its engine not yet chosen) that says why (`trl-rm-env serve`: vLLM's server computes no regression
            reward).
        one_reward: Whether one reward per sample is needed (default): a regression model with several attributes
            then needs weights. `trl-rm-env eval` reads a regression model's attributes one by one instead.

    Raises:
        trl_rm_env.model_source.ModelSourceError: a missing local model folder.
        ValueError: an unknown `kind`, a bad option, a judge that is not a causal LM, weights that do not fit the head, an option of the
            engine not chosen, `engine="vllm"` or a loading option (`precision`, ...) with a model already loaded.
    """
    if kind is not None and kind not in KINDS:
        raise ValueError(f"kind must be one of {list(KINDS)} or None (told from the config), got {kind!r}")
    if kind == "judge":  # a judge's options are any model's; a reward model's (or one told later) its own
        options = ModelOptions.build(options, **values) if options is None else type(options).build(options, **values)
    else:
        options = ScoringOptions.build(None if options is None else ScoringOptions.of(options), **values)
    if isinstance(model, PreTrainedModel):
        path, loaded, config = None, model, model.config
        _check_kind(kind or "", [type(model).__name__], "")
        if options.engine == "vllm":
            raise ValueError(
                f"engine='vllm' loads the {_what(kind)} from its path or Hub id, not from a loaded model: give "
                "the path (RewardModelEnvironment(path, engine='vllm'), JudgeEnvironment(path, engine='vllm'))"
            )
        loading = sorted(set(changed(options)) & LOADING_OPTIONS)
        if loading:
            raise ValueError(
                f"{spelled(ModelOptions, loading)}: applied when a model is loaded from its path or Hub id; this "
                "one is already loaded (load it that way, or give the path)"
            )
    else:
        path, loaded = check_model_source(str(model), _what(kind)), None
        config = AutoConfig.from_pretrained(path, trust_remote_code=options.trust_remote_code)
        _check_kind(kind or "", list(getattr(config, "architectures", None) or []), f"{path} ")
    if kind is None:
        kind = "judge" if is_causal_lm(config) else "reward"
    head = None
    if kind == "reward":
        options = ScoringOptions.of(options)
        head = reward_head(config, options.attribute_weights, options.reward_model_type, one_reward=one_reward,
                           label_index=options.label_index)  # fmt: skip
        check_label_index(config, options.label_index)  # before any weights load or engine starts
    plan = ModelPlan(path, loaded, config, options, kind, head, engine="", why="")
    if callable(hf_only):
        hf_only = hf_only(plan)
    if loaded is not None:
        hf_only = hf_only or "the model is already loaded in this process"
    engine, why, reason = engine_choice(options, hf_only=hf_only, what=_what(kind))
    if kind == "judge" and reason == "per_process":
        logger.warning("The judge is loaded on transformers in each of the processes (a copy per process): %s", why)
    sharing = planned_sharing(kind, engine, options)
    return dataclasses.replace(plan, engine=engine, why=why, reason=reason, prefix_sharing=sharing)
