"""`trl-rm-env best-of-n`: sample a policy once (or read its samples), give each sample a gold reward, score it with
each proxy, and report the best-of-n curves (`trl_rm_env.evaluation.best_of_n`) as a table, a JSON file and a plot.

A samples file has one prompt a line: `{"context": [messages], "completions": [text, ...], "gold": [float, ...]}`
(`gold` once known; other keys, such as an `answer`, kept).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .best_of_n import Proxy, default_ns, defences, plot, report, table, verdicts

GOLDS = ("field", "number", "model")
AGGREGATIONS = ("mean", "min", "median", "mean_minus_std")
"""`trl_rm_env.rewards.ensemble.ENSEMBLES`, written out: importing it loads torch and TRL, which `trl-rm-env`'s parser
must not (tests/test_best_of_n.py holds the two equal)."""
NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


@dataclass
class Samples:
    """N sampled completions of each prompt, with their gold rewards once known; one line of a samples file each:
    `{"context": [messages], "completions": [text, ...], "gold": [float, ...]}` (`gold` optional; other keys, an
    `answer` for instance, kept)."""

    rows: list[dict[str, Any]]
    source: str = "samples"

    @property
    def per_prompt(self) -> int:
        return len(self.rows[0]["completions"]) if self.rows else 0

    def gold(self) -> np.ndarray:
        return np.array([row["gold"] for row in self.rows], dtype=np.float64)

    def pairs(self) -> tuple[list[Any], list[Any]]:
        """Every `(context, completion)` in order, the completion as an assistant message."""
        contexts, completions = [], []
        for row in self.rows:
            for text in row["completions"]:
                contexts.append(row["context"])
                completions.append([{"role": "assistant", "content": text}])
        return contexts, completions

    def write(self, path: str | Path) -> None:
        Path(path).write_text("".join(json.dumps(row) + "\n" for row in self.rows))


def read_prompts(path: str | Path) -> list[dict[str, Any]]:
    """The rows of a prompts (or samples) JSONL file, each with a `context` list of messages.

    Raises:
        DataValidationError: a line that is not JSON or has no valid `context`, naming the file, line and field.
    """
    return [row for _, row in _numbered_rows(path)]


def _numbered_rows(path: str | Path) -> list[tuple[int, dict[str, Any]]]:
    from ..data.messages import check_sample
    from ..data.schema import DataValidationError
    from ..data.sources import read_jsonl

    rows, source = [], str(path)
    if not Path(path).is_file():
        raise FileNotFoundError(f"{source}: no such file")
    for line, row in read_jsonl(Path(path)):
        if isinstance(row, Exception):
            raise row
        if not isinstance(row, dict) or not isinstance(row.get("context"), list) or not row["context"]:
            raise DataValidationError(source, line, "context", "each line needs a 'context' list of messages")
        try:
            check_sample(row["context"], "context")
        except (TypeError, ValueError) as err:  # a message that is not one, a bad role or text
            raise DataValidationError(source, line, "context", str(err)) from None
        rows.append((line, row))
    if not rows:
        raise DataValidationError(source, None, None, "no prompts in the file")
    return rows


def read_samples(path: str | Path, need_gold: bool = False) -> Samples:
    """A samples file (see `Samples`): every line with the same number of `completions` (strings), and a `gold`
    number per completion where `need_gold`.

    Raises:
        DataValidationError: naming the file, line and field of the first bad value.
    """
    from ..data.schema import DataValidationError

    source = str(path)
    numbered = _numbered_rows(path)
    rows = [row for _, row in numbered]
    for line, row in numbered:
        texts = row.get("completions")
        if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
            raise DataValidationError(source, line, "completions", "a non-empty list of completion texts")
        if len(texts) != len(rows[0]["completions"]):
            raise DataValidationError(source, line, "completions", f"{len(texts)} completions; the first line has "
                                      f"{len(rows[0]['completions'])} (every prompt needs the same N)")  # fmt: skip
        if need_gold:
            gold = row.get("gold")
            if not isinstance(gold, list) or len(gold) != len(texts):
                raise DataValidationError(source, line, "gold", f"a list of {len(texts)} numbers, one per completion")
            for k, value in enumerate(gold):
                if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
                    raise DataValidationError(source, line, f"gold[{k}]", f"a finite number, got {value!r}")
    return Samples(rows, source)


def generate_samples(
    policy: str,
    prompts: Sequence[Mapping[str, Any]],
    per_prompt: int,
    *,
    temperature: float = 1.0,
    max_new_tokens: int = 64,
    seed: int = 0,
    **options: Any,
) -> Samples:
    """`per_prompt` completions of each prompt sampled from `policy` (a causal LM's folder or Hub id) at
    `temperature` through the judge engines' `generate` (transformers or vLLM, `options`: `ModelOptions` by name),
    one random stream seeded with `seed`."""
    from ..runtime import plan_model
    from ..runtime.loading import load_engine, load_tokenizer
    from ..tokenization import encode_messages

    if per_prompt < 1 or temperature <= 0:
        raise ValueError(f"best-of-n needs per_prompt >= 1 and temperature > 0, got {per_prompt} and {temperature}")
    plan = plan_model(policy, kind="judge", **options)
    tokenizer = load_tokenizer(plan)
    engine = load_engine(plan, tokenizer)
    try:
        ids = [encode_messages(tokenizer, row["context"], add_generation_prompt=True) for row in prompts]
        texts = engine.generate([p for p in ids for _ in range(per_prompt)], max_new_tokens, temperature, [seed])
    finally:
        getattr(engine, "close", lambda: None)()
    rows = [dict(row, completions=texts[i * per_prompt : (i + 1) * per_prompt]) for i, row in enumerate(prompts)]
    return Samples(rows, "generated")


def number_gold(row: Mapping[str, Any], text: str) -> float:
    """1.0 when the last number in `text` (its final answer, as GSM8K-style checkers read it) equals the row's
    `answer` (a number), else 0.0: a program's check."""
    found = NUMBER.findall(text.replace(",", ""))
    return float(bool(found) and float(found[-1]) == float(row["answer"]))


def add_gold(samples: Samples, gold: str, gold_model: str | None = None, **options: Any) -> None:
    """Each row's `gold` from `gold`: `field` (already in the file), `number` (`number_gold` against each row's
    `answer`), or `model` (the reward model `gold_model`'s reward, `options`: its `ScoringOptions` by name).

    Raises:
        ValueError: an unknown `gold`, `model` without `gold_model` (or a model with another gold), a row without a
            numeric `answer` for `number`.
    """
    if gold not in GOLDS:
        raise ValueError(f"gold must be one of {list(GOLDS)}, got {gold!r}")
    if (gold == "model") != (gold_model is not None):
        raise ValueError("gold='model' needs gold_model (a reward model's path), and gold_model needs gold='model'")
    if gold == "number":
        for line, row in enumerate(samples.rows, start=1):
            answer = row.get("answer")
            if isinstance(answer, bool) or not isinstance(answer, int | float):
                raise ValueError(f"{samples.source}, line {line}, field 'answer': gold 'number' needs a number, got "
                                 f"{answer!r}")  # fmt: skip
            row["gold"] = [number_gold(row, text) for text in row["completions"]]
    elif gold == "model":
        from ..scoring import load_reward_scorer

        scores = load_reward_scorer(gold_model, **options).score(*samples.pairs()).tolist()
        per = samples.per_prompt
        for i, row in enumerate(samples.rows):
            row["gold"] = scores[i * per : (i + 1) * per]


# ---------------------------------------------------------------------------------------------------- proxies
def score_proxy(label: str, path: str, samples: Samples, **options: Any) -> Proxy:
    """Every head of the reward model at `path` on every sample (`options`: `ScoringOptions` by name)."""
    from ..scoring import load_reward_scorer

    scorer = load_reward_scorer(path, **options)
    outputs = scorer.outputs(*samples.pairs()).numpy().astype(np.float64)
    if np.isnan(outputs).any():
        raise ValueError(f"proxy {label} ({path}) scored a sample NaN (over max_length with overlength_reward?)")
    return Proxy(label, path, outputs.reshape(len(samples.rows), samples.per_prompt, -1))


# ---------------------------------------------------------------------------------------------------- the command
def labelled(values: Sequence[str], what: str) -> list[tuple[str, str]]:
    """`LABEL=VALUE` arguments as pairs, refusing one without a label."""
    out = []
    for value in values:
        label, sep, rest = value.partition("=")
        if not sep or not label or not rest:
            raise ValueError(f"{what} takes LABEL=VALUE, got {value!r}")
        out.append((label, rest))
    return out


def refuse_what_cannot_apply(args: Any) -> None:
    """An option that cannot apply is refused in one line, never ignored."""
    sampling = {"--prompts": args.prompts is not None, "--temperature": args.temperature != 1.0,
                "--max-new-tokens": args.max_new_tokens != 64, "--seed": args.seed != 0}  # fmt: skip
    if not args.policy and any(sampling.values()):
        given = [flag for flag, on in sampling.items() if on]
        raise ValueError(f"{', '.join(given)} set how --policy is sampled: give --policy, or leave them out")
    if args.gold_model is not None and args.gold != "model":
        raise ValueError(f"--gold-model is the gold of --gold model, but --gold is {args.gold!r}")
    if args.ensemble_penalty != 1.0 and "mean_minus_std" not in args.aggregations:
        raise ValueError("--ensemble-penalty weighs mean_minus_std's std, which --aggregations leaves out")


def run(args: Any, log: Callable[[str], None] = print) -> dict[str, Any]:
    """What `trl-rm-env best-of-n` does with its parsed arguments (see `add_parser`); returns the report."""
    options = {"batch_size": args.batch_size} if args.batch_size else {}
    refuse_what_cannot_apply(args)
    samples_path = Path(args.samples)
    if args.policy and not samples_path.exists():
        if not args.prompts:
            raise ValueError(f"--policy needs --prompts: {samples_path} does not exist yet, so the policy is sampled")
        prompts = read_prompts(args.prompts)
        n = args.n or 64
        log(f"sampling {n} completions of each of {len(prompts)} prompts from {args.policy} ...")
        samples = generate_samples(args.policy, prompts, n, temperature=args.temperature,
                                   max_new_tokens=args.max_new_tokens, seed=args.seed, **options)  # fmt: skip
        samples.write(samples_path)
        log(f"wrote {samples_path} (reused by the next run: delete it to sample anew)")
    elif args.policy:
        log(f"{samples_path} exists: its samples are reused (delete it to sample anew)")
    samples = read_samples(samples_path, need_gold=args.gold == "field")
    if args.n is not None and args.n != samples.per_prompt:
        raise ValueError(f"--n {args.n}, but {samples_path} holds {samples.per_prompt} samples a prompt: delete it to "
                         "sample anew")  # fmt: skip
    if args.gold != "field":
        add_gold(samples, args.gold, args.gold_model, **options)
        samples.write(samples_path)
    ns = sorted(set(args.ns)) if args.ns else default_ns(samples.per_prompt)
    if ns[0] < 1 or ns[-1] > samples.per_prompt:
        raise ValueError(f"--ns must lie within 1..{samples.per_prompt} (the samples per prompt), got {ns}")
    given = labelled(args.proxy, "--proxy")
    ensembles = dict(labelled(args.ensemble_of or [], "--ensemble-of"))
    baseline = args.baseline or given[0][0]
    if baseline not in {label for label, _ in given}:
        raise ValueError(f"--baseline {baseline!r} is not a proxy's label: {sorted({label for label, _ in given})}")
    proxies = []
    for label, path in given:
        log(f"scoring {samples.per_prompt * len(samples.rows)} samples with {label} ({path}) ...")
        proxies.append(score_proxy(label, path, samples, **options))
    result = report(samples.gold(), defences(proxies, args.aggregations, ensembles, args.ensemble_penalty), ns)
    if baseline not in result["defences"]:
        raise ValueError(f"--baseline {baseline!r} has several heads: the baseline is one proxy's reward")
    result["verdicts"] = verdicts(result, baseline)
    result["baseline"] = baseline
    result["proxies"] = [{"label": p.label, "path": p.path, "heads": int(p.outputs.shape[-1])} for p in proxies]
    if args.output:
        Path(args.output).write_text(json.dumps(result, indent=1))
    if args.plot:
        plot(result, args.plot, args.title)
    log(table(result))
    for name, verdict in result["verdicts"].items():
        log(f"{name}: {verdict}")
    return result


def add_parser(sub: Any) -> None:
    """The `best-of-n` subcommand of `trl-rm-env`."""
    p = sub.add_parser(
        "best-of-n",
        help="Over-optimization of best-of-n: the gold reward of each proxy's pick against sqrt(KL) (Gao et al.).",
        description="Sample N completions per prompt once (or read them), score them with each proxy reward model "
        "and the gold, and report for n = 1, 2, 4, ..., N the proxy's and the gold reward of the best-of-n pick, "
        "exactly over every n-subset, against KL_bon = log n - (n-1)/n, with Gao et al.'s fit d (alpha - beta d). "
        "Proxies sharing a label are seeds of one defence; a multi-head proxy gives a curve per aggregation.",
    )
    p.add_argument("--samples", required=True, help="Samples JSONL (one prompt a line: context, completions, gold); "
                   "written by --policy when missing, reused when present.")  # fmt: skip
    p.add_argument("--policy", default=None, help="Causal LM to sample from (folder or Hub id).")
    p.add_argument("--prompts", default=None, help="Prompts JSONL for --policy (a 'context' list of messages per "
                   "line; other keys, such as 'answer', kept).")  # fmt: skip
    p.add_argument("--n", type=int, default=None, help="Samples per prompt (the largest n). Default 64; a samples "
                   "file that holds another number is refused.")  # fmt: skip
    p.add_argument("--temperature", type=float, default=1.0, help="Sampling temperature. Default 1.0.")
    p.add_argument("--max-new-tokens", type=int, default=64, help="Longest completion. Default 64.")
    p.add_argument("--seed", type=int, default=0, help="Seed of the sampling. Default 0.")
    p.add_argument("--proxy", action="append", required=True, metavar="LABEL=PATH",
                   help="A proxy reward model; repeat (one label for several seeds of one defence).")  # fmt: skip
    p.add_argument("--gold", default="field", choices=GOLDS, help="field: each line's 'gold' list; number: the last "
                   "number of a completion equals the line's 'answer'; model: --gold-model's reward.")  # fmt: skip
    p.add_argument("--gold-model", default=None, help="The gold reward model (with --gold model).")
    p.add_argument("--aggregations", nargs="+", default=list(AGGREGATIONS), choices=AGGREGATIONS,
                   help="How a multi-head proxy's heads (and --ensemble's members) become one reward.")  # fmt: skip
    p.add_argument("--ensemble-penalty", type=float, default=1.0, help="mean_minus_std's weight of the std.")
    p.add_argument("--ensemble-of", action="append", metavar="NAME=LABEL",
                   help="The one-head proxies of LABEL (separately trained) as one ensemble.")  # fmt: skip
    p.add_argument("--ns", type=int, nargs="+", default=None, help="The n's (default 1, 2, 4, ..., N).")
    p.add_argument("--baseline", default=None, help="The defence the verdicts compare with (default: the first "
                   "proxy's label).")  # fmt: skip
    p.add_argument("--batch-size", type=int, default=None, help="Sequences per forward pass.")
    p.add_argument("--output", default=None, help="Write the report (curves, fits, verdicts) as JSON.")
    p.add_argument("--plot", default=None, help="Write the plot (PNG; needs matplotlib).")
    p.add_argument("--title", default="best-of-n", help="The plot's title.")
    p.set_defaults(func=command)


def command(args: Any) -> int:
    """`trl-rm-env best-of-n`: `run`, exit status 0."""
    run(args)
    return 0
