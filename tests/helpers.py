"""What several test modules share: reference scoring (the model-card recipe, one sequence at a time), short-run
training and GRPO arguments, `accelerate launch` of the recipes, and `trl-rm-env serve` in a subprocess.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import multiprocessing as mp
import os
import pickle
import re
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
import torch

# The cores a test has: the machine's 2, or one under the README's `pytest -n 2` (pytest-xdist), where each worker
# has one and a launched process must not spin its OpenMP threads against the other worker's.
CORES = 1 if os.environ.get("PYTEST_XDIST_WORKER") else 2


def threads(processes: int = 1) -> str:
    """`OMP_NUM_THREADS` for each of `processes` launched processes: the test's cores shared, at least one each."""
    return str(max(1, CORES // processes))


# ---------------------------------------------------------------------------------------------------- watching passes
class Passes:
    """What a scoring engine ran, watched from outside (`watch_passes`); the package keeps no such state.

    - `shapes`: `(rows, length)` of every forward pass, in order (a forward hook on the input embeddings: every pass,
      plain, context, completion or packed row, embeds its token ids once);
    - `key_shapes`: `(rows, keys)` of each completion pass run against a shared context, as planned (`plan_passes`);
    - `shared`: the items scored against a shared context (`share_plan`'s groups), in the engine's numbering (the
      caller's where every item was scored).
    """

    def __init__(self) -> None:
        self.shapes: list[tuple[int, int]] = []
        self.key_shapes: list[tuple[int, int]] = []
        self.shared: list[int] = []


@contextlib.contextmanager
def watch_passes(target: Any):
    """`Passes` of what `target` (a model, or a scorer, environment or server holding one) runs meanwhile."""
    import trl_rm_env.sharing.layouts as layouts  # where the layouts plan their passes

    model = target
    while not isinstance(model, torch.nn.Module):
        model = next(getattr(model, name) for name in ("scorer", "engine", "model") if hasattr(model, name))
    passes = Passes()
    embeddings = model.get_input_embeddings()
    handle = embeddings.register_forward_hook(lambda module, args, out: passes.shapes.append(tuple(out.shape[:2])))
    share_plan, plan_passes = layouts.share_plan, layouts.plan_passes

    def watched_share_plan(*args, **kwargs):
        groups, plain = share_plan(*args, **kwargs)
        passes.shared = sorted(i for _, members in groups for i in members)
        return groups, plain

    def watched_plan_passes(lengths, max_rows=None, max_tokens=None, extra=None, **kwargs):
        chunks = plan_passes(lengths, max_rows, max_tokens, extra, **kwargs)
        if extra is not None:  # completion passes: their keys are the longest context's plus their own
            passes.key_shapes += [(len(rows), max(extra[i] for i in rows) + length) for rows, length in chunks]
        return chunks

    layouts.share_plan, layouts.plan_passes = watched_share_plan, watched_plan_passes
    try:
        yield passes
    finally:
        handle.remove()
        layouts.share_plan, layouts.plan_passes = share_plan, plan_passes


# ---------------------------------------------------------------------------------------------------- reference scoring
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


def record_full_weights(monkeypatch) -> list:
    """Stand in for `distributed.FullWeights` (FSDP2's gathering, which needs several processes): returns the list of
    the models gathered, one per entry."""
    from trl_rm_env import distributed

    gathered: list = []

    @contextlib.contextmanager
    def full_weights(model):
        gathered.append(model)
        yield

    monkeypatch.setattr(distributed, "FullWeights", full_weights)
    return gathered


def resolved(value):
    """A coroutine (a judge behind servers answers with one) run to its result; anything else as it is."""
    return asyncio.run(value) if asyncio.iscoroutine(value) else value


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


def ranked_trainer(tmp_path, tokenizer, dataset, eval_sets=None, max_steps: int = 6, **overrides):
    """A `RankedRewardTrainer` of the tiny model (seed 0; `ensemble_heads` outputs when set) for a short CPU run in
    `tmp_path`: 8 records a step, 16 an evaluation batch, a loss every step, nothing saved; `overrides` on top of
    those arguments."""
    from trl_rm_env import RankedRewardConfig, RankedRewardTrainer
    from trl_rm_env.tiny_models import build_tiny_reward_model

    settings = dict(
        output_dir=str(tmp_path), max_steps=max_steps, per_device_train_batch_size=8, per_device_eval_batch_size=16,
        learning_rate=3e-3, use_cpu=True, report_to="none", save_strategy="no", logging_steps=1, seed=0,
        disable_tqdm=True, dataloader_num_workers=0,
    )
    args = RankedRewardConfig(**(settings | overrides))
    model = build_tiny_reward_model(tokenizer, seed=0, num_labels=args.ensemble_heads).train()
    return RankedRewardTrainer(model=model, args=args, train_dataset=dataset, eval_dataset=eval_sets,
                               processing_class=tokenizer)


# ---------------------------------------------------------------------------------------------------- arguments
def training_args(config_cls: type, tmp_path: Path, **overrides: Any):
    """`config_cls` (a `RewardConfig` or one of ours) for a short CPU run in `tmp_path/out`: no reporting, no
    checkpoints, no progress bars, seed 0; `overrides` on top."""
    values: dict[str, Any] = dict(
        output_dir=str(tmp_path / "out"), use_cpu=True, report_to="none", save_strategy="no", disable_tqdm=True, seed=0
    )
    values.update(overrides)
    return config_cls(**values)


def grpo_config(tmp_path: Path, **overrides: Any):
    """TRL's `GRPOConfig` for a one-step CPU run in `tmp_path/grpo` (fp32, metrics every step, nothing saved)."""
    from trl import GRPOConfig

    values: dict[str, Any] = dict(
        output_dir=str(tmp_path / "grpo"),
        max_steps=1,
        use_cpu=True,
        bf16=False,
        report_to="none",
        logging_steps=1,
        save_strategy="no",
        disable_tqdm=True,
        seed=0,
    )
    values.update(overrides)
    return GRPOConfig(**values)


def record_scored_batches(trainer) -> list[dict[str, Any]]:
    """Every batch a `GRPOTrainer` generates and scores, as TRL logged it for `log_completions`: after each call of
    its `_generate_and_score_completions`, that batch's tail of `trainer._logs` (`prompt`, `completion`, and
    `rewards` by reward function) and `mode` (`train` or `eval`, as TRL names its metrics). Returns the list it
    fills, in call order (one process: TRL's gathers are the batch itself)."""
    batches: list[dict[str, Any]] = []
    score = trainer._generate_and_score_completions

    def recorded(inputs):
        out = score(inputs)
        n, logs = len(inputs), trainer._logs
        batches.append({
            "mode": "train" if trainer.model.training else "eval",
            "prompt": list(logs["prompt"])[-n:],
            "completion": list(logs["completion"])[-n:],
            "rewards": {name: list(values)[-n:] for name, values in logs["rewards"].items()},
        })  # fmt: skip
        return out

    trainer._generate_and_score_completions = recorded
    return batches


# ---------------------------------------------------------------------------------------------------- launching
ROOT = Path(__file__).resolve().parent.parent
ACCELERATE_CONFIGS = ROOT / "accelerate_configs"
SAMPLE = ROOT / "trl_rm_env" / "data" / "sample"
TIMEOUT = 600  # seconds per launch


def _has_deepspeed() -> bool:
    # Found, not imported: importing DeepSpeed takes most of a second of every run's collection.
    return importlib.util.find_spec("deepspeed") is not None


# No C++ compiler needed: the launched processes skip the JIT build of DeepSpeed's CPU comm op (`prepare_process`).
needs_deepspeed = pytest.mark.skipif(not _has_deepspeed(), reason="needs deepspeed")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def launch(
    config: str,
    script: str,
    *args: str,
    timeout: int = TIMEOUT,
    processes: int | None = None,
    env: dict[str, str] | None = None,
    cwd: Path = ROOT,
) -> str:
    """`accelerate launch --config_file accelerate_configs/<config> <script> args...`; returns its output.

    `script` is relative to the repository root; `processes` overrides the config's `num_processes`; `env` adds
    variables (a `PYTHONPATH` there goes in front of the repository's). Fails the test, with the output's tail, on a
    non-zero exit or a run over `timeout` seconds (then the launcher and its workers are killed together).
    """
    port = free_port()
    cmd = [
        sys.executable, "-m", "accelerate.commands.launch",
        "--config_file", str(ACCELERATE_CONFIGS / config),
        "--main_process_port", str(port),
        *(["--num_processes", str(processes)] if processes else []),
        str(ROOT / script), *args,
    ]  # fmt: skip
    variables = launch_env(port, env)
    return run_process(cmd, cwd, variables, timeout, f"{config} {script}")


def recipe_in_process(recipe: str, *argv: str) -> None:
    """`recipes/<recipe>.py` run in this process as its launched worker runs it (`run_recipe`): what `accelerate
    launch --num_processes 1` would run, without a launcher and a second import of TRL. For one-process runs whose
    test checks what the recipe computes, not how it is launched (every launch path has tests of its own); paths in
    `argv` absolute."""
    import importlib

    from trl_rm_env.errors import run_recipe

    module = importlib.import_module(f"trl_rm_env.recipes.{recipe}")
    run_recipe(module.make_parser, module.main, list(argv))


def launch_env(port: int, env: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a launched recipe: this one without Accelerate's and torch's launch variables, offline,
    one thread per process, quiet bars; `env` added (its `PYTHONPATH` in front of the repository's)."""
    variables = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("ACCELERATE_", "FSDP_"))
        and k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
    }
    extra = dict(env or {})
    variables.update(
        MASTER_PORT=str(port),
        OMP_NUM_THREADS="1",
        MKL_NUM_THREADS="1",
        TOKENIZERS_PARALLELISM="false",
        HF_HUB_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        TRANSFORMERS_NO_ADVISORY_WARNINGS="1",
        HF_DATASETS_DISABLE_PROGRESS_BARS="1",
        TQDM_DISABLE="1",
        PYTHONUNBUFFERED="1",
        PYTHONPATH=os.pathsep.join(
            p for p in (extra.pop("PYTHONPATH", None), str(ROOT), os.environ.get("PYTHONPATH")) if p
        ),
    )
    variables.update(extra)
    return variables


PROBE = ROOT / "tests" / "scripts" / "exit_probe"


def probe_env(probe_dir: Path) -> dict[str, str]:
    """Variables that make every process of a launch report how it ended (`tests/scripts/exit_probe`) in `probe_dir`."""
    probe_dir.mkdir(parents=True, exist_ok=True)
    return {"PYTHONPATH": str(PROBE), "TRL_RM_ENV_EXIT_PROBE_DIR": str(probe_dir)}


def assert_quiet(output: str) -> None:
    """Nothing a user cannot act on: no DeepSpeed deprecation FutureWarnings, no DDP `find_unused_parameters` warning,
    DeepSpeed's "Setting accelerator to CPU" at most once (the launcher's own)."""
    assert "FutureWarning" not in output, output[-4000:]
    assert "find_unused_parameters=True" not in output, output[-4000:]
    assert output.count("Setting accelerator to CPU") <= 1, output[-4000:]


def assert_clean_exits(probe_dir: Path) -> None:
    """Both workers ran their exit handlers, and none reached interpreter finalization with a gloo thread alive
    (see tests/test_clean_exit.py)."""
    ran = sorted(p.name.split(".")[0] for p in probe_dir.glob("*.atexit.json"))
    assert [r for r in ran if r != "launcher"] == ["0", "1"], ran
    for path in probe_dir.glob("*.finalized.json"):
        threads = json.loads(path.read_text())
        assert not [t for t in threads if "gloo" in t], f"{path.name}: finalization with gloo threads alive: {threads}"


def run_process(cmd: list[str], cwd: Path, env: dict[str, str], timeout: int, what: str) -> str:
    """Run `cmd` in its own process group, its output captured; fail the test with the output's tail on a non-zero
    exit, or on a run over `timeout` seconds (then the whole group is killed: a launcher and its workers)."""
    proc = subprocess.Popen(
        cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        stdin=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        pytest.fail(f"{what} ran over {timeout}s:\n{output[-6000:]}")
    assert proc.returncode == 0, f"{what} exited with {proc.returncode}:\n{output[-6000:]}"
    return output


# ---------------------------------------------------------------------------------------------------- serving
class ServerProcess:
    """`python -m trl_rm_env.recipes.cli serve ... --port 0` in a subprocess; `url` once it prints that it listens."""

    def __init__(self, model: str, *options: str, env: dict[str, str] | None = None, preexec_fn=None):
        if "--engine" not in options:  # our server unless a test asks for vLLM's (`serve` picks vLLM where installed)
            options = ("--engine", "hf", *options)
        command = [sys.executable, "-m", "trl_rm_env.recipes.cli", "serve", "--model", model, "--port", "0", *options]
        # One torch thread per server: two servers and pytest share 2 cores, and oversubscribed OpenMP threads
        # spin (a forward pass of the tiny model goes from 0.15 s to 1.7 s). No API key unless `env` sets one.
        base = {k: v for k, v in os.environ.items() if k not in ("TRL_RM_ENV_API_KEY", "VLLM_API_KEY")}
        env = {**base, "OMP_NUM_THREADS": "1", **(env or {})}
        self.proc = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, preexec_fn=preexec_fn
        )
        self.lines: list[str] = []
        self.url: str | None = None
        self._ready = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:  # drained to the end, so the pipe never fills
            self.lines.append(line)
            found = re.search(r" on (http://127\.0\.0\.1:\d+) ", line)
            if found:
                self.url = found.group(1)
                self._ready.set()
        self._ready.set()  # the process ended

    def wait(self, timeout: float = 120) -> str:
        if not self._ready.wait(timeout) or self.url is None:
            self.stop()
            raise RuntimeError("the server did not start:\n" + "".join(self.lines[-30:]))
        return self.url

    def shut_down(self, grace: float = 60) -> None:
        """SIGTERM, as a user's Ctrl-C or a scheduler sends it; `grace` seconds to end cleanly, then killed."""
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(grace)
        finally:
            self.stop(kill=True)

    def stop(self, kill: bool = False) -> None:
        if self.proc.poll() is None:
            self.proc.kill() if kill else self.proc.terminate()
        if self.proc.returncode is None:
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def conversations(n: int, offset: int = 0, repeat: int = 1) -> list[tuple[list[dict], list[dict]]]:
    """`n` distinct (context, completion) pairs of varied shape and length."""
    out = []
    for i in range(offset, offset + n):
        a, b = i % 97, (i * 7) % 89
        context = [{"role": "user", "content": f"What is {a} + {b}?"}]
        if i % 3 == 0:
            context = [{"role": "system", "content": "Answer briefly."}, *context]
        if i % 4 == 1:
            context += [{"role": "assistant", "content": "Let me think."}, {"role": "user", "content": "Go on."}]
        text = f"The answer is {a + b + i % 5}. " * (repeat + i % 3)
        out.append((context, [{"role": "assistant", "content": text.strip()}]))
    return out


# ---------------------------------------------------------------------------------------------------- judges
def judge_conversations():
    """GRPO-shaped judge inputs: two groups (a one-turn prompt, and a multi-turn prompt with a system message), each
    prompt repeated once per completion as TRL passes them."""
    one = [{"role": "user", "content": "What is 2+2?"}]
    multi = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Name a colour."},
        {"role": "assistant", "content": "Red."},
        {"role": "user", "content": "Another one?"},
    ]
    answers = [(one, "4"), (one, "Four, of course."), (one, "It is 5."), (multi, "Blue."), (multi, "Green, I think.")]
    prompts = [p for p, _ in answers]
    completions = [[{"role": "assistant", "content": a}] for _, a in answers]
    return prompts, completions


def judge_prompt_text(prompt):
    if len(prompt) == 1:
        return prompt[0]["content"]
    return "\n\n".join(f"{m['role'].capitalize()}: {m['content']}" for m in prompt)


@torch.no_grad()
def judge_reference(model, tok, prompts, completions, mode, max_score=9):
    """What a `logprobs` judge must give, from one forward of the plain model per judgement over the built-in template
    rendered here with the judge's chat template (the model card's rule): pointwise, the expected rating over the
    tokens `1..max_score`; pairwise (`pairs="all"`, `swap=True`), each completion's mean preference over its
    comparisons in both orders; listwise (`swap=True`), each completion's mean probability of being the best over the
    group as given and reversed."""
    from trl_rm_env.judges.builtin_modes import MODES

    def distribution(text, labels):
        rendered = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False)
        ids = tok(rendered, return_tensors="pt")["input_ids"]
        logprobs = torch.log_softmax(model(input_ids=ids).logits[0, -1].double(), -1)
        p = logprobs[[tok.convert_tokens_to_ids(label) for label in labels]].exp()
        return p / p.sum()

    def fill(mode, count=0, **values):
        answer = MODES[mode].answer_formats["logprobs"].format(max_score=max_score, count=count)
        return MODES[mode].template.format(answer_format=answer, max_score=max_score, count=count, **values)

    texts = [c[0]["content"] for c in completions]
    if mode == "pointwise":
        out = []
        for prompt, text in zip(prompts, texts):
            p = distribution(fill("pointwise", prompt=judge_prompt_text(prompt), completion=text), [str(k) for k in range(1, max_score + 1)])
            out.append(float((p * torch.arange(1, max_score + 1, dtype=torch.double)).sum()))
        return torch.tensor(out)
    groups = {}
    for i, prompt in enumerate(prompts):
        groups.setdefault(repr(prompt), []).append(i)
    shares = {i: [] for i in range(len(prompts))}
    if mode == "listwise":  # swap=True: the group as given and reversed; each its probability of being the best
        for members in groups.values():
            for order in (members, members[::-1]):
                listed = "\n\n".join(f"[Answer {k}]\n{texts[i]}" for k, i in enumerate(order, 1))
                text = fill("listwise", count=len(order), prompt=judge_prompt_text(prompts[order[0]]), completions=listed)
                p = distribution(text, [str(k) for k in range(1, len(order) + 1)])
                for k, i in enumerate(order):
                    shares[i].append(float(p[k]))
        return torch.tensor([sum(v) / len(v) for _, v in sorted(shares.items())])
    for members in groups.values():
        for a in members:
            for b in members:
                if a != b:  # every ordered pair: both orders of every pair
                    p_a = float(distribution(fill("pairwise", prompt=judge_prompt_text(prompts[a]), completion_a=texts[a], completion_b=texts[b]), ["A", "B"])[0])
                    shares[a].append(p_a)
                    shares[b].append(1 - p_a)
    return torch.tensor([sum(v) / len(v) for _, v in sorted(shares.items())])


# ---------------------------------------------------------------------------------------------------- AsyncGRPO
ASYNC_GRPO_GROUPS = [
    ([{"role": "user", "content": "What is 2+2?"}], ["4", "Four.", "It is five."]),
    ([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a colour."}], ["Blue.", "Red"]),
    ([{"role": "user", "content": "Say hi."}], ["Hello!", "hi <|im_end|>", "Bye.", "Hey there."]),
]


def rollout_groups():
    from trl.experimental.async_grpo.async_rollout_worker import RolloutGroup, TrainingSequence

    groups = []
    for g, (prompt, answers) in enumerate(ASYNC_GRPO_GROUPS):
        n = len(answers)
        groups.append(RolloutGroup(
            prompts=[prompt] * n, reward_kwargs={},
            completions=[[{"role": "assistant", "content": a}] for a in answers],
            completions_ids=[[1, 2]] * n,
            completions_sequences=[[TrainingSequence([1, 2], [0, 1], [0.0, -1.0], f"{g}-{k}")] for k in range(n)],
            tool_call_counts=[0] * n, tool_failure_counts=[0] * n, model_version=0, group_id=g,
            env_rewards=[None] * n, rollout_rewards=[None] * n,
        ))  # fmt: skip
    return groups


def score_in_async_grpo_child(funcs: list, queue) -> None:
    """What AsyncGRPO's spawned child does with the reward functions, in its order (`_child_main`): they arrive
    unpickled by the spawn, then TRL's own scrub (`CUDA_VISIBLE_DEVICES=""`), `PartialState()`, and `_score_group` over
    every group at once."""
    from types import SimpleNamespace

    from accelerate.state import PartialState
    from trl.experimental.async_grpo.async_rollout_worker import _AsyncRolloutLoop, _scrub_child_env
    from trl.trainer.utils import get_callable_name, is_async_callable

    _scrub_child_env()
    PartialState()
    try:
        loop = SimpleNamespace(
            reward_funcs=funcs, reward_func_names=[get_callable_name(f) for f in funcs], _env_reward_types=[],
            _provides_rollout_reward=False,
        )  # fmt: skip

        async def run():
            return await asyncio.gather(*(_AsyncRolloutLoop._score_group(loop, g) for g in rollout_groups()))

        samples = asyncio.run(run())
        queue.put({
            "async": [is_async_callable(f) for f in funcs],
            "metrics": [[s.metrics for s in group] for group in samples],
            "cuda": torch.cuda.is_available(),
        })  # fmt: skip
    except BaseException as err:  # noqa: BLE001 - reported to the parent, which fails the test with it
        import traceback

        queue.put({"error": f"{type(err).__name__}: {err}\n{traceback.format_exc()[-3000:]}"})


def score_like_async_grpo(funcs) -> dict:
    """`funcs` pickled into a spawned child that scores `ASYNC_GRPO_GROUPS` as AsyncGRPO does; its results."""
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    pickle.dumps(funcs)  # what AsyncRolloutWorker checks in the parent before it spawns
    child = ctx.Process(target=score_in_async_grpo_child, args=(funcs, queue))
    child.start()
    try:
        result = queue.get(timeout=300)
    finally:
        child.join(60)
        if child.is_alive():  # never left behind to hang pytest's exit
            child.kill()
            child.join(10)
    assert "error" not in result, result.get("error")
    return result


REFUSALS = ("I cannot help with that.", "I am not sure, sorry.", "Math is hard. Ask someone else.")


def visible_cue_records(n: int, seed: int) -> list[dict[str, Any]]:
    """A preference task a tiny model can learn (the GenRM learning test): arithmetic questions whose better answer
    works the sum out and whose worse ones (rank 1, tied with each other) refuse; every third record has two refusals
    (a tie, and three completions for the listwise metrics). Completions in a shuffled order."""
    import random

    rng = random.Random(seed)
    records = []
    for k in range(n):
        a, b = rng.randint(1, 9), rng.randint(1, 9)
        good = {"rank": 0, "completion": [{"role": "assistant", "content": f"Adding {a} and {b} gives {a + b}. "
                                           f"The answer is {a + b}."}]}  # fmt: skip
        bad = [{"rank": 1, "completion": [{"role": "assistant", "content": text}]}
               for text in rng.sample(REFUSALS, 2 if k % 3 == 0 else 1)]  # fmt: skip
        completions = [good, *bad]
        rng.shuffle(completions)
        records.append({"context": [{"role": "user", "content": f"How much is {a} plus {b}?"}],
                        "completions": completions})  # fmt: skip
    return records


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path
