"""Generate the bundled regression sample data in `trl_rm_env/data/sample/` (run from the repo root; deterministic).

    python scripts/make_regression_data.py            # writes regression_{train,in_domain,harder}.jsonl
    python scripts/make_regression_data.py --out /tmp/x --seed 1

A *learnable* HelpSteer2-style task: an arithmetic tutor answers "What is a + b?" and each answer is rated on three
attributes (0-4) computed from its text:

    correctness  4 correct sum; 2 off by 1; 1 off by 2-3; 0 off by more, or no number at all
    verbosity    length in words: 0 for 1-2 words, 1 for 3-6, 2 for 7-11, 3 for 12-20, 4 for 21+
    helpfulness  correctness, one less (not below 0) when the answer is a bare number (verbosity 0) or rambles
                 (verbosity 4)

    "7"                                                    correctness 4, verbosity 0, helpfulness 3
    "3 + 4 = 8. The answer is 8."                          correctness 2, verbosity 2, helpfulness 2
    "I am not sure, sorry."                                correctness 0, verbosity 1, helpfulness 0

Verbosity can be read from the form of the answer; correctness and helpfulness need the sum checked. In the
training split one record in ten has one attribute left out (missing values are masked out of the loss). Splits:
`regression_train` (2000) and `regression_in_domain` (200) ask single-turn questions; `regression_harder` (200)
puts the question after an earlier exchange about other numbers (two user turns: the model must check the last
question, not the first) and asks it in wordings the training data never uses.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "trl_rm_env" / "data" / "sample"
LOW, HIGH = 1, 5  # operands, as in the rank sample data

QUESTIONS = ["What is {a} + {b}?", "Compute {a} + {b}.", "Please add {a} and {b}.", "How much is {a} plus {b}?"]
HARDER_QUESTIONS = ["And {a} + {b}?", "Now add {a} and {b}, please.", "What do you get from {a} plus {b}?"]
SYSTEM = "You are a careful math tutor."

# Answer forms, from terse to rambling; {c} is the number given (right or wrong).
FORMS = [
    "{c}",
    "The answer is {c}.",
    "{a} + {b} = {c}. The answer is {c}.",
    "Adding {a} and {b} gives {c}. The answer is {c}.",
    "Let me add {a} and {b}. {a} plus {b} equals {c}, so the answer is {c}.",
    "Sure! Let us work it out step by step. We start from {a} and count up {b} more, one at a time, and that "
    "gives {c}. So {a} + {b} = {c}, and the answer is {c}.",
]
NO_ANSWER = [
    "Sorry.",
    "I am not sure, sorry.",
    "Math is hard. Ask someone else.",
    "I cannot help with that.",
    "That is a good question, but I would rather not guess the answer to it right now.",
]


def verbosity(text: str) -> int:
    """Length bucket of `text` in words: 0 (1-2), 1 (3-6), 2 (7-11), 3 (12-20), 4 (21+)."""
    words = len(text.split())
    return sum(words > bound for bound in (2, 6, 11, 20))


def correctness(given: int | None, c: int) -> int:
    """4 for the right sum, 2 off by 1, 1 off by 2-3, 0 off by more or no number."""
    if given is None:
        return 0
    error = abs(given - c)
    return {0: 4, 1: 2, 2: 1, 3: 1}.get(error, 0)


def helpfulness(correct: int, verbose: int) -> int:
    """Correctness, one less (not below 0) for a bare number or a rambling answer."""
    return max(correct - (1 if verbose in (0, 4) else 0), 0)


def answer(rng: random.Random, a: int, b: int) -> tuple[str, int | None]:
    """An answer text and the number it gives (None: no number). Half right, a third wrong, a sixth no answer."""
    c, u = a + b, rng.random()
    if u < 1 / 6:
        return rng.choice(NO_ANSWER), None
    if u < 0.5:
        while True:
            given = c + rng.choice([-1, 1, -2, 2, -3, 3]) if rng.random() < 0.7 else rng.randint(0, 2 * HIGH + 8)
            if given != c and given >= 0:
                break
    else:
        given = c
    return rng.choice(FORMS).format(a=a, b=b, c=given), given


def make_record(rng: random.Random, harder: bool = False, drop_rate: float = 0.0) -> dict:
    a, b = rng.randint(LOW, HIGH), rng.randint(LOW, HIGH)
    context = []
    if rng.random() < 0.3:
        context.append({"role": "system", "content": SYSTEM})
    if harder:  # an earlier exchange about other numbers, answered correctly
        a0, b0 = rng.randint(LOW, HIGH), rng.randint(LOW, HIGH)
        context.append({"role": "user", "content": rng.choice(QUESTIONS).format(a=a0, b=b0)})
        context.append({"role": "assistant", "content": FORMS[2].format(a=a0, b=b0, c=a0 + b0)})
        question = rng.choice(HARDER_QUESTIONS)
    else:
        question = rng.choice(QUESTIONS)
    context.append({"role": "user", "content": question.format(a=a, b=b)})
    text, given = answer(rng, a, b)
    correct, verbose = correctness(given, a + b), verbosity(text)
    attributes = {"helpfulness": helpfulness(correct, verbose), "correctness": correct, "verbosity": verbose}
    if rng.random() < drop_rate:  # not rated on one attribute: masked out of the loss
        del attributes[rng.choice(sorted(attributes))]
    return {
        "context": context,
        "completion": [{"role": "assistant", "content": text}],
        "attributes": attributes,
        "task": f"{a}+{b}",
    }


def write_jsonl(path: Path, records: list[dict]) -> None:
    with path.open("w", encoding="utf-8") as f:
        for record in records:
            f.write(json.dumps(record, ensure_ascii=False) + "\n")


def main(out: Path = OUT, seed: int = 20261207) -> None:
    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    write_jsonl(out / "regression_train.jsonl", [make_record(rng, drop_rate=0.1) for _ in range(2000)])
    write_jsonl(out / "regression_in_domain.jsonl", [make_record(rng) for _ in range(200)])
    write_jsonl(out / "regression_harder.jsonl", [make_record(rng, harder=True) for _ in range(200)])
    print(f"wrote regression sample data to {out}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT, help="output folder (default: the package's sample data)")
    parser.add_argument("--seed", type=int, default=20261207)
    args = parser.parse_args()
    main(args.out, args.seed)
