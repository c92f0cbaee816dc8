"""`RewardModelArguments`: the reward-model and prompt-data section of the GRPO recipe's `TrlParser`.

Its own keys are declared below; every option of the reward function (`ScoringOptions`, `RewardOptions`,
`RemoteOptions`, `GroupShaping`, `LengthShaping`, `ReferenceBound`, `EnsembleOptions`: the environment's
`OPTION_CLASSES`) is a generated key, `reward_<option>` (`recipes/spellings.py`), so the recipe offers each option the
environment takes, with its help, default and choices, and a new option needs no change here. A generative judge
(`reward_judge`, `reward_judge_url`: generated from `JudgeSource`) is a second reward source beside the reward model
or instead of it (`reward_model: null`); its `JudgeOptions` are generated keys too, `reward_judge_<option>`, and its
other options go in `reward_judge_options`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from trl_rm_env.judges.judge_options import JudgeOptions, JudgeSource
from trl_rm_env.rewards.reward_model import OPTION_CLASSES
from trl_rm_env.rewards.reward_sources import RewardSources
from trl_rm_env.runtime.model_options import ScoringOptions

from .spellings import options_from_recipe, recipe_fields, recipe_options, recipe_spellings


@dataclass
class RewardModelRecipeArguments:
    """Which reward model scores GRPO completions, and which prompts the policy answers.

    Args:
        reward_model: Hub id or local path of a `*ForSequenceClassification` reward model; with
            `reward_remote_url`, the model name sent to the servers (`trl-rm-env serve`: the path it serves).
        reward_tokenizer: Tokenizer of the RM (defaults to the RM's own; its chat template renders every sample).
        reward_remote_url: Score on reward-model servers at these URLs instead of loading the RM here. The API key
            is read from `TRL_RM_ENV_API_KEY` or `VLLM_API_KEY`, never from the command line (it would show in `ps`
            and in logs).
        prompt_data: Prompt source: a Hub dataset id (`:split` optional), a local file, or a rank-schema source
            (`sample:train`), whose contexts become the prompts.
        prompt_column: Column holding the prompt (string or messages) for Hub/local prompt datasets.
        build_tiny_model: Build the tiny offline models (`make-tiny`) when the policy path, a folder named `policy`, is
            missing (quickstart). A missing `reward_model` is always an error, never replaced by the untrained tiny RM.
        reward_per_attribute: A regression reward model's attributes as one reward function each
            (`RewardModelEnvironment.attribute_rewards()`, one forward per batch), for GDPO
            (`multi_objective_aggregation: normalize_then_sum`); `reward_weights` default to the model's attribute
            weights.
        reward_cascade_margin: With a reward model and a judge: one reward, `CascadeReward([rm, judge], margin=...)`,
            instead of the two weighed: the reward model's rewards stand for each GRPO group it separates by at least
            this margin, the judge rewards the others (the cascade `trl-rm-env eval --cascade` measures). None: both
            rewards, weighed by `reward_weights`.
        reward_ensemble_members: More reward models, each a mapping of `RewardModelEnvironment` arguments
            (`{"model": PATH}`, or `{"model": NAME, "remote_url": [URL]}` for one behind `trl-rm-env serve`, with
            `name` and any option; JSON on the command line): with the reward model, one `EnsembleReward`, its
            members' rewards aggregated per sample by `reward_ensemble` (default `mean`) and `reward_ensemble_penalty`.
    """

    reward_model: str | None = field(
        default="Skywork/Skywork-Reward-V2-Qwen3-0.6B",
        metadata={"help": "RM id or path (null: no reward model, a judge only)."},
    )
    reward_tokenizer: str | None = field(default=None, metadata={"help": "RM tokenizer (default: the RM's)."})
    reward_remote_url: list[str] | None = field(
        default=None,
        metadata={"help": "Score on RM servers (trl-rm-env serve, or vLLM --runner pooling) at these URLs."},
    )
    prompt_data: str = field(default="sample:train", metadata={"help": "Prompt dataset source."})
    prompt_column: str = field(default="prompt", metadata={"help": "Prompt column of a prompt dataset."})
    build_tiny_model: bool = field(
        default=False, metadata={"help": "Build the tiny offline models if the policy path is missing."}
    )
    reward_per_attribute: bool = field(
        default=False, metadata={"help": "A regression RM's attributes as one reward function each (GDPO)."}
    )
    reward_cascade_margin: float | None = field(
        default=None,
        metadata={"help": "One cascade reward: the RM for groups it separates by this margin, the judge for the rest."},
    )
    reward_ensemble_members: list[str] | None = field(
        default=None,
        metadata={"help": "More RMs for one EnsembleReward with reward_model, each a JSON object of RewardModelEnvironment "
                  "arguments ({\"model\": PATH} or {\"model\": NAME, \"remote_url\": [URL]}); aggregated by "
                  "reward_ensemble (default mean)."},
    )

    def judge_kwargs(self) -> dict | None:
        """Keyword arguments for `JudgeEnvironment` (besides the model), or None without a judge (neither
        `reward_judge` nor `reward_judge_url`): `JudgeSource.arguments`, as `trl-rm-env eval` reads its flags.

        Raises:
            ValueError: a `reward_judge_*` key without a judge, or a bad value, named by its key.
        """
        options = options_from_recipe(self, JudgeOptions)
        keys = {name: key for cls in (JudgeOptions, JudgeSource) for key, name in recipe_spellings(cls).items()}
        arguments = recipe_options(self, JudgeSource).arguments(options, lambda name: keys.get(name, name))
        if arguments is None:
            return None
        arguments.pop("model")  # the recipe passes reward_judge itself
        return {"tokenizer": None, **arguments}

    def environment_kwargs(self) -> dict:
        """Keyword arguments for `RewardModelEnvironment` (besides the model): `options`, the `ScoringOptions` the
        `reward_*` keys describe, built once (the environment, its scorer and engine read that one object), and the
        other options given (`reward_*` keys not at their defaults), mapped onto the environment's names in this one
        place.

        Raises:
            ValueError: a bad `reward_*` value, named by its key (a combination that cannot apply is refused by
                `reward_sources`).
        """
        scoring = recipe_options(self, ScoringOptions)
        kwargs: dict = {"options": scoring}
        for cls in OPTION_CLASSES:
            if cls is not ScoringOptions:
                kwargs.update(options_from_recipe(self, cls))
        if not self.reward_remote_url:  # options of servers without them: refused by `RewardSources`
            return dict(kwargs, tokenizer=self.reward_tokenizer)
        # OpenRLHF's /get_reward takes text, rendered here with the RM's tokenizer (its path or Hub id); vLLM's
        # dialects get token ids encoded with it (without `reward_tokenizer`, `reward_model`'s when it loads).
        openrlhf = kwargs.get("remote_api") == "openrlhf"
        tokenizer = self.reward_tokenizer or (self.reward_model if openrlhf else None)
        return dict(kwargs, remote_url=list(self.reward_remote_url), tokenizer=tokenizer)

    def reward_sources(self) -> RewardSources:
        """What the run is rewarded by (`trl_rm_env.rewards.reward_sources`): the reward model and the judge with their
        options (`environment_kwargs`, `judge_kwargs`), the cascade, the per-attribute split and the ensemble.

        Raises:
            ValueError: a bad `reward_*` value, or a combination of keys that cannot apply, named by its keys.
        """
        return RewardSources(
            reward_model=self.reward_model, reward_options=self.environment_kwargs(), judge=self.reward_judge,
            judge_options=self.judge_kwargs(), cascade_margin=self.reward_cascade_margin,
            per_attribute=self.reward_per_attribute, ensemble_members=self.reward_ensemble_members,
        )  # fmt: skip



RECIPE_OPTION_CLASSES = (*OPTION_CLASSES, JudgeSource, JudgeOptions)
"""The options classes with generated keys in the GRPO recipe: the reward model's (`reward_<option>`), which judge
(`reward_judge`, `reward_judge_url`, `reward_judge_tokenizer`, `reward_judge_options`) and how it judges
(`reward_judge_<option>`)."""


def _generated_doc() -> str:
    lines = [f"        {key}: {fld.metadata['help']}" for cls in RECIPE_OPTION_CLASSES for key, _, fld in recipe_fields(cls)]
    return (
        (RewardModelRecipeArguments.__doc__ or "").rstrip()
        + "\n\n    Options of the reward functions (generated: `reward_<option>` and `reward_judge_<option>`, see "
        "`recipes/spellings.py`):\n"
        + "\n".join(lines)
        + "\n"
    )


RewardModelArguments = dataclasses.make_dataclass(
    "RewardModelArguments",
    [spec for cls in RECIPE_OPTION_CLASSES for spec in recipe_fields(cls)],
    bases=(RewardModelRecipeArguments,),
    namespace={"__doc__": _generated_doc(), "__module__": __name__},
)
"""The GRPO recipe's reward-model section: `RewardModelRecipeArguments` and one `reward_<option>` key per option."""
