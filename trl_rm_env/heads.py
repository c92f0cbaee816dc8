"""Reward heads: what a checkpoint's config says its outputs are, and how they become one reward.

A Bradley-Terry reward model has one output, the reward. A regression reward model (saved by
`RegressionRewardTrainer`: `reward_model_type: "regression"`, `id2label` naming the attributes) has one output per
attribute; its reward is a weighted sum of them. An ensemble (saved by `RankedRewardTrainer` with
`ensemble_heads=K`: `ensemble_heads` in its config) has K score heads; its reward is their mean. Inference (the GRPO
environment, `eval`, the server) reads these rules here, once, without the trainer.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

REWARD_MODEL_TYPE = "regression"
"""`config.reward_model_type` of a regression reward model."""


def is_regression_model(config: Any) -> bool:
    """Whether a model config is a regression reward model (saved by `RegressionRewardTrainer`)."""
    return getattr(config, "reward_model_type", None) == REWARD_MODEL_TYPE


def attribute_names(config: Any) -> list[str]:
    """A regression reward model's attributes, in output order (`id2label`)."""
    return [config.id2label[i] for i in range(config.num_labels)]


def set_regression_labels(config: Any, attributes: Sequence[str], weights: Sequence[float] | None = None) -> None:
    """Write what each output means into a model config (for the checkpoint): `id2label`, `label2id`,
    `problem_type: regression`, `reward_model_type: regression`, and the default reward weights when given."""
    config.id2label = dict(enumerate(attributes))
    config.label2id = {name: i for i, name in enumerate(attributes)}
    config.problem_type = "regression"
    config.reward_model_type = REWARD_MODEL_TYPE
    if weights is not None:
        config.attribute_weights = dict(zip(attributes, map(float, weights)))


def parse_attribute_weights(entries: Sequence[str], option: str = "attribute_weights") -> dict[str, float]:
    """`["helpfulness=1", "verbosity=-0.2"]` (command-line form) -> `{"helpfulness": 1.0, "verbosity": -0.2}`.

    Raises:
        ValueError: an entry that is not `name=<number>` or a name given twice; the message names `option`.
    """
    weights: dict[str, float] = {}
    for entry in entries:
        name, sep, value = str(entry).partition("=")
        name = name.strip()
        try:
            weight = float(value)
        except ValueError:
            weight = None
        if not sep or not name or weight is None:
            raise ValueError(f"{option} entry {entry!r} must be name=<number>, e.g. helpfulness=1.0")
        if name in weights:
            raise ValueError(f"{option} names {name!r} twice")
        weights[name] = weight
    return weights


def regression_reward_weights(
    config: Any,
    attribute_weights: Mapping[str, float] | Sequence[float] | None = None,
    kind: str | None = None,
    required: bool = True,
) -> tuple[list[str], list[float] | None] | None:
    """The attribute names of a regression RM's config and the weights that turn its outputs into one reward.

    For a reward function: `reward = sum_a weights[a] * output[a]`. Weights come from `attribute_weights` (a dict by
    name, where unnamed attributes weigh 0, or a list in output order), else from the checkpoint's own
    `attribute_weights`; a single-attribute model needs none.

    Args:
        config: The model config (`reward_model_type`, `id2label`, optional `attribute_weights`).
        attribute_weights: Weights given by the caller, or None.
        kind: The head kind the caller declares (NeMo RL's `reward_model_type`): `"regression"` reads the outputs
            as attributes (`id2label`) even when the config does not say so, `"bradley_terry"` keeps the reward one
            output column; None: what the config says.
        required: Whether one reward is needed: without weights for a model with several attributes, an error;
            with `required=False`, `(names, None)` (its outputs are read one by one, as `trl-rm-env eval` does).

    Returns:
        `(names, weights)` in output order, or None when the config is not a regression RM and no weights are given.

    Raises:
        ValueError: an unknown `kind`, weights for a head that is not a regression one, an unknown attribute name,
            a list of the wrong length, or no weights for a model with several attributes.
    """
    if kind not in (None, "bradley_terry", REWARD_MODEL_TYPE):
        raise ValueError(f"reward_model_type must be 'bradley_terry' or 'regression', got {kind!r}")
    if kind != REWARD_MODEL_TYPE and (kind == "bradley_terry" or not is_regression_model(config)):
        if attribute_weights is not None:
            raise ValueError(
                "attribute_weights applies to regression reward models (config.reward_model_type == 'regression', "
                "as RegressionRewardTrainer saves them, or reward_model_type='regression' given); this model has "
                f"reward_model_type={kind or getattr(config, 'reward_model_type', None)!r} and "
                f"{config.num_labels} output(s)."
            )
        return None
    names = attribute_names(config)
    weights = attribute_weights if attribute_weights is not None else getattr(config, "attribute_weights", None)
    if weights is None:
        if len(names) == 1:
            return names, [1.0]
        if not required:
            return names, None
        raise ValueError(
            f"This regression reward model predicts {names}: give attribute_weights, a dict by name (unnamed ones "
            f"weigh 0) or a list in this order, e.g. {{{names[0]!r}: 1.0}}."
        )
    if isinstance(weights, Mapping):
        unknown = sorted(set(weights) - set(names))
        if unknown:
            raise ValueError(
                f"attribute_weights names {unknown}, which the model does not predict; it predicts {names}."
            )
        return names, [float(weights.get(name, 0.0)) for name in names]
    weights = [float(w) for w in weights]
    if len(weights) != len(names):
        raise ValueError(f"attribute_weights has {len(weights)} values for the {len(names)} attributes {names}.")
    return names, weights


@dataclass(frozen=True)
class RewardHead:
    """How a model's outputs become one reward: output `label_index` (a Bradley-Terry head: no attributes), the mean
    of an ensemble's first `ensemble` outputs, or `sum_a weights[a] * output[a]` over a regression head's
    `attributes` (no `weights`: no single reward, only the outputs; see `reward_head(..., one_reward=False)`)."""

    attributes: tuple[str, ...] = ()
    weights: tuple[float, ...] | None = None
    ensemble: int = 1  # score heads whose mean is the reward (an ensemble checkpoint's `ensemble_heads`), else 1

    def output_weights(self, num_labels: int) -> list[float] | None:
        """The weights of the outputs whose sum is the reward (`outputs @ weights`): a regression head's, or an
        ensemble's `1/K` on each of its K heads; None: one output column is the reward (`label_index`)."""
        if self.weights is not None:
            return list(self.weights)
        if self.ensemble > 1:
            return [1.0 / self.ensemble] * self.ensemble + [0.0] * (num_labels - self.ensemble)
        return None


def reward_head(
    config: Any,
    attribute_weights: Mapping[str, float] | Sequence[float] | None = None,
    kind: str | None = None,
    one_reward: bool = True,
    label_index: int | None = None,
) -> RewardHead:
    """The `RewardHead` of a model config, given weights and a declared kind (`regression_reward_weights`; with
    `one_reward=False` a regression head may have no weights: only its outputs are read). An ensemble checkpoint
    (`config.ensemble_heads` K > 1) is rewarded the mean of its K heads unless the caller reads it otherwise: a
    declared `kind` (`bradley_terry`: one head) or a `label_index` (head k alone)."""
    resolved = regression_reward_weights(config, attribute_weights, kind, required=one_reward)
    if resolved is None:
        heads = int(getattr(config, "ensemble_heads", None) or 1)  # `RankedRewardConfig(ensemble_heads=K)`
        mean = heads > 1 and kind is None and label_index is None
        return RewardHead(ensemble=heads if mean else 1)
    names, weights = resolved
    return RewardHead(tuple(names), None if weights is None else tuple(weights))


def check_label_index(config: Any, label_index: int | None) -> None:
    """Refuse a `label_index` that is not one of the model's outputs (None: unset, always fine).

    Raises:
        ValueError: the index is outside 0 .. num_labels - 1, in one line naming both.
    """
    outputs = int(getattr(config, "num_labels", 1) or 1)
    if label_index is not None and not 0 <= label_index < outputs:
        raise ValueError(
            f"label_index {label_index} is not an output of this model (it has {outputs}: 0 to {outputs - 1})"
        )
