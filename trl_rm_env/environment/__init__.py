"""`RewardModelEnvironment`: a reward model as the reward function of TRL's `GRPOTrainer`.

    from trl import GRPOTrainer
    from trl_rm_env import RewardModelEnvironment

    reward = RewardModelEnvironment("Skywork/Skywork-Reward-V2-Qwen3-0.6B", max_tokens_per_batch=16384)
    trainer = GRPOTrainer(model=..., reward_funcs=[reward], args=..., train_dataset=...)

It is a plain callable with TRL's reward signature `(prompts, completions, completion_ids=None, **kwargs)`, and a
stable `__name__` (TRL logs `rewards/<name>/mean`). Unlike passing the model to `GRPOTrainer` directly, it renders
each conversation with the RM's *own* chat template (policy and RM tokenizers may differ), strips a duplicated BOS
as the Skywork-Reward-V2 card does, scores in bounded micro-batches (no OOM on large generation batches),
left-truncates over-long contexts, and logs `reward_model_env/*` metrics. Scores equal one-at-a-time scoring with
the plain model (fp32, within 1e-4).

- `reward_model.py`: `RewardModelEnvironment`, one class holding a scorer, local or remote;
- `rewards.py`: `RewardOptions` and the pipeline every reward function runs around its scorer (checks, empties,
  NaN/inf, normalization, clipping, metrics);
- `local.py`: the scorer of an RM loaded here (planned once, sharded under ZeRO-3/FSDP2);
- `remote.py`: the scorer of an RM behind HTTP servers (`RemoteScorer`, async);
- `nemo.py`: NeMo RL's `env.reward_model` block read as arguments (`RewardModelEnvironment.from_config`).
"""

from ..rewards.base import NORMALIZATIONS, RewardFunction, RewardOptions
from .nemo import PASSTHROUGH_TEMPLATE
from .reward_model import RemoteRewardModelEnvironment, RewardModelEnvironment

__all__ = [
    "NORMALIZATIONS",
    "PASSTHROUGH_TEMPLATE",
    "RemoteRewardModelEnvironment",
    "RewardFunction",
    "RewardModelEnvironment",
    "RewardOptions",
]
