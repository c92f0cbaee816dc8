"""One factory from a reward function to its model (`trl_rm_env.rewards.backend.connect`): a reward function of a new
kind reaches a model loaded here and one behind servers through it, with no local/remote split of its own; and the
factory's guards are the same for both kinds of model.

The new kind here is a test's own: each completion's share of its GRPO group it beats by the reward model's score
(ties count half). Expected values: one forward of the plain model per conversation (`tests.helpers.reference_scores`),
ranked by hand in the test.
"""

from __future__ import annotations

import asyncio
from collections.abc import Generator

import pytest
import torch
from helpers import reference_scores
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from trl_rm_env.rewards.backend import Backend, connect
from trl_rm_env.rewards.base import Reward
from trl_rm_env.runtime.model_options import ModelOptions, ScoringOptions

GROUPS, SIZE = 2, 8  # GRPO's group size
PROMPTS = [[{"role": "user", "content": f"Name a prime above {10 * g}."}] for g in range(GROUPS) for _ in range(SIZE)]
ANSWERS = [[{"role": "assistant", "content": f"{k} is one." + " Sure." * (k % 3)}] for _ in range(GROUPS)
           for k in range(SIZE)]  # fmt: skip


class GroupShareReward(Reward):
    """A new reward kind: the share of its group a completion beats by the reward model's score. It names the model
    once (`connect`) and calls what it gets; here or behind servers is the factory's business."""

    def __init__(self, model=None, tokenizer=None, *, remote_url=None, **remote_values):
        self.backend: Backend = connect("reward", type(self).__name__, model, tokenizer, options=ScoringOptions(),
                                        remote_url=remote_url, remote_values=remote_values)  # fmt: skip
        self.__name__ = "group_share"

    @property
    def is_async(self) -> bool:
        return self.backend.runs.is_async

    def _answer(self, request):
        return self.backend.runs.score_pairs(*request)

    def _steps(self, prompts, completions, completion_ids, kwargs) -> Generator:
        scored = yield (list(prompts), list(completions))
        scores = scored.scores.tolist()
        groups: dict[str, list[int]] = {}
        for i, prompt in enumerate(prompts):
            groups.setdefault(str(prompt), []).append(i)
        rewards = [0.0] * len(prompts)
        for members in groups.values():
            for i in members:
                beaten = sum((scores[i] > scores[j]) + 0.5 * (scores[i] == scores[j]) for j in members if j != i)
                rewards[i] = beaten / (len(members) - 1)
        return rewards


def by_hand(scores: list[float]) -> list[float]:
    """The shares computed from the plain model's scores, group by group (groups are consecutive here)."""
    out = []
    for g in range(GROUPS):
        group = scores[g * SIZE : (g + 1) * SIZE]
        for i, s in enumerate(group):
            others = group[:i] + group[i + 1 :]
            out.append(sum(1.0 if s > t else 0.5 if s == t else 0.0 for t in others) / (SIZE - 1))
    return out


@pytest.fixture(scope="module")
def plain(tiny_dir):
    path = tiny_dir / "reward_model"
    model = AutoModelForSequenceClassification.from_pretrained(path).eval()
    tokenizer = AutoTokenizer.from_pretrained(path)
    return path, model, tokenizer, reference_scores(model, tokenizer, PROMPTS, ANSWERS).tolist()


def test_a_new_reward_kind_reaches_a_model_loaded_here(plain):
    path, _, _, scores = plain
    reward = GroupShareReward(str(path))
    backend = reward.backend
    assert not reward.is_async and backend.engine == "hf" and backend.tokens and backend.remote_url is None
    assert backend.head is not None and backend.config.num_labels == 1 and backend.model is not None
    assert reward(PROMPTS, ANSWERS) == pytest.approx(by_hand(scores))
    assert len(set(scores)) == len(scores)  # no ties: each share is decided by the model, not by the tie rule


def test_the_same_reward_kind_reaches_a_model_behind_servers(plain):
    """The same class, given `remote_url`: an asynchronous reward function whose rewards equal the local ones."""
    from aiohttp.test_utils import TestServer

    from trl_rm_env.scoring.scorer import RewardScorer
    from trl_rm_env.serving.server import ScoringServer

    path, model, tokenizer, scores = plain

    async def served() -> tuple[list[float], Backend]:
        app = ScoringServer(RewardScorer(model, tokenizer), "rm").make_app()
        async with TestServer(app, host="127.0.0.1") as server:
            reward = GroupShareReward("rm", str(path), remote_url=str(server.make_url("")), remote_input="tokens")
            assert reward.is_async
            return await reward(PROMPTS, ANSWERS), reward.backend

    rewards, backend = asyncio.run(served())
    assert rewards == pytest.approx(by_hand(scores))
    assert backend.engine == "remote" and backend.tokens and backend.model is None and backend.config is None
    assert len(backend.remote_url) == 1 and backend.sharding == "none"


def test_a_judge_is_reached_the_same_way(tiny_dir):
    """A causal LM through the same factory: here, the runtime's engine; behind servers that render messages, the
    OpenAI client with no tokenizer held (nothing set on one here could change a verdict)."""
    here = connect("judge", "J", str(tiny_dir / "policy"), None, options=ModelOptions(engine="hf"))
    assert here.engine == "hf" and here.runs.name == "hf" and here.tokens and here.head is None
    assert here.model is here.runs.model and here.model is not None and here.sharding == "none"
    assert here.config.architectures[0].endswith("ForCausalLM")
    seen = []
    served = connect("judge", "J", None, None, options=ModelOptions(), remote_url="http://127.0.0.1:9",
                     remote_values={"remote_input": "messages"}, check_tokenizer=seen.append)  # fmt: skip
    assert served.engine == "remote" and not served.tokens and served.tokenizer is None and seen == [None]
    assert served.runs.is_async and served.remote_url == ["http://127.0.0.1:9/v1"]


def test_the_tokenizer_is_checked_before_the_weights_load(tiny_dir, monkeypatch):
    """`check_tokenizer` runs with the tokenizer before any weights load, for either kind of model, and its error
    stops the loading."""
    from trl_rm_env.runtime import loading

    monkeypatch.setattr(loading, "load_engine", lambda *a, **k: pytest.fail("the model's weights loaded"))

    def refuse(tokenizer):
        assert tokenizer.chat_template  # the model's own, loaded
        raise ValueError("refused")

    for kind, folder in (("judge", "policy"), ("reward", "reward_model")):
        options = ModelOptions() if kind == "judge" else ScoringOptions()
        with pytest.raises(ValueError, match="refused"):
            connect(kind, "X", str(tiny_dir / folder), None, options=options, check_tokenizer=refuse)


@pytest.mark.parametrize("kind", ["reward", "judge"])
def test_the_factory_refuses_in_one_line_for_both_kinds(kind, tiny_rm, tiny_dir):
    what = {"reward": "reward model", "judge": "judge"}[kind]
    options = ModelOptions() if kind == "judge" else ScoringOptions()
    with pytest.raises(TypeError, match=f"Owner needs a model \\(a path, a Hub id or a loaded {what}\\), or remote_url"):
        connect(kind, "Owner", None, None, options=options)
    with pytest.raises(ValueError, match=f"retries, timeout: options of a {what} behind servers; this one is loaded"):
        connect(kind, "Owner", str(tiny_dir / "policy"), None, options=options, remote_values={"timeout": 3, "retries": 1})
    with pytest.raises(TypeError, match="with remote_url, model is the model name sent to the servers"):
        connect(kind, "Owner", tiny_rm, None, options=options, remote_url="http://127.0.0.1:9")
    with pytest.raises(ValueError, match=f"fsdp_shard shards a {what} loaded here; with remote_url a server holds it"):
        connect(kind, "Owner", None, None, options=options, remote_url="http://127.0.0.1:9", fsdp_shard=True)
    with pytest.raises(ValueError, match=r"kind must be one of \['reward', 'judge'\], got 'critic'"):
        connect("critic", "Owner", None, None, options=options)


def test_a_judge_behind_servers_refuses_what_only_a_local_one_applies():
    with pytest.raises(ValueError, match="remote_api is the dialect of reward-model servers"):
        connect("judge", "J", None, None, options=ModelOptions(), remote_url="http://127.0.0.1:9",
                remote_values={"remote_api": "openrlhf", "remote_input": "messages"})  # fmt: skip
    with pytest.raises(ValueError, match="batch_size.*applied by a judge loaded in this process"):
        connect("judge", "J", None, None, options=ModelOptions(batch_size=3), remote_url="http://127.0.0.1:9",
                remote_values={"remote_input": "messages"})  # fmt: skip


def test_scores_are_the_plain_models_at_group_sizes_users_run(plain):
    """The scorer the factory hands over scores a GRPO batch of 2 groups of 8 as the plain model does, one
    conversation at a time (fp32, 1e-4)."""
    path, _, _, scores = plain
    got = connect("reward", "X", str(path), None, options=ScoringOptions(batch_size=3)).runs.score(PROMPTS, ANSWERS)
    assert torch.allclose(got, torch.tensor(scores), atol=1e-4)


def test_a_tokenizer_rendered_here_for_servers_is_checked(tiny_dir):
    """Behind servers that take token ids, the tokenizer that renders them is the one checked, for both kinds; without
    one, the error names the reward function (`name`, default `reward`)."""
    policy, rm = str(tiny_dir / "policy"), str(tiny_dir / "reward_model")
    seen = []
    judge = connect("judge", "J", None, policy, options=ModelOptions(), remote_url="http://127.0.0.1:9",
                    remote_values={"remote_input": "tokens"}, check_tokenizer=seen.append)  # fmt: skip
    reward = connect("reward", "R", None, rm, options=ScoringOptions(), remote_url="http://127.0.0.1:9",
                     remote_values={"remote_input": "tokens"}, check_tokenizer=seen.append)  # fmt: skip
    assert judge.tokens and reward.tokens and seen == [judge.tokenizer, reward.tokenizer]
    assert all(t is not None and t.chat_template for t in seen)
    with pytest.raises(ValueError, match=r"^reward: remote_input='tokens' needs the reward model's tokenizer"):
        connect("reward", "R", "no-such/model", None, options=ScoringOptions(), remote_url="http://127.0.0.1:9",
                remote_values={"remote_input": "tokens"})  # fmt: skip


@pytest.mark.parametrize("kind", ["reward", "judge"])
def test_weights_loaded_here_are_held_as_the_launch_says(kind, tiny_dir, monkeypatch, caplog):
    """Loaded here, either kind of model goes through the launch's sharding step with the caller's logger: a ZeRO-3
    launch of 2 processes (simulated) whose model was loaded before its GRPOConfig is warned about, naming the kind
    and its reward function."""
    import logging

    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")
    monkeypatch.setenv("ACCELERATE_DEEPSPEED_ZERO_STAGE", "3")
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda group=None: 2)
    caller = logging.getLogger("tests.caller")
    what, owner = {"reward": ("reward model", "RewardModelEnvironment"), "judge": ("judge", "JudgeEnvironment")}[kind]
    options = ScoringOptions(device="cpu") if kind == "reward" else ModelOptions(engine="hf", device="cpu")
    folder = "reward_model" if kind == "reward" else "policy"
    with caplog.at_level(logging.WARNING, logger=caller.name):
        backend = connect(kind, "X", str(tiny_dir / folder), None, options=options, log=caller)
    assert backend.sharding == "none"
    assert [r.getMessage() for r in caplog.records if r.name == caller.name] == [
        f"The Accelerate config is DeepSpeed ZeRO-3 but the {what} is not partitioned: it was loaded before the "
        "training arguments (GRPOConfig) existed, so every process holds a full copy. Create the GRPOConfig first, "
        f"then {owner} (as recipes/grpo_rm.py does), to partition it."
    ]


def test_a_judges_verdict_that_is_not_one_token_fails_before_the_weights_load(tiny_dir, monkeypatch):
    """`JudgeEnvironment` hands the factory its verdict check: `max_score=11` makes the verdict '11', two tokens in the
    tiny tokenizer, refused with `scoring="logprobs"` before any weights load; `scoring="generate"` parses text, so
    the same judge loads."""
    from trl_rm_env import JudgeEnvironment
    from trl_rm_env.runtime import loading

    real = loading.load_engine
    monkeypatch.setattr(loading, "load_engine", lambda *a, **k: pytest.fail("the judge's weights loaded"))
    with pytest.raises(ValueError, match=r"^judge: the verdict '11' is 2 tokens in the judge's tokenizer"):
        JudgeEnvironment(str(tiny_dir / "policy"), engine="hf", max_score=11)
    monkeypatch.setattr(loading, "load_engine", real)
    assert JudgeEnvironment(str(tiny_dir / "policy"), engine="hf", max_score=11, scoring="generate").label_ids is None

