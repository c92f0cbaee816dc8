"""Generate the bundled sample data in `trl_rm_env/data/sample/` (run from the repo root; deterministic).

    python scripts/make_sample_data.py

A *learnable* preference task in the rank schema: an arithmetic tutor. Each record asks for a sum and ranks 3-4
answers (lower rank is better):

    rank 0  correct, shows the work     "3 + 4 = 7. The answer is 7."
    rank 1  correct, terse              "The answer is 7."
    rank 2  wrong (two wrong answers are a tie when both are present)
    rank 3  no answer                   "I am not sure, sorry."

Half of the pairs can be told apart from the form of the answer; the rest need the sum checked. Splits:
`train` and `in_domain` use single-digit operands, `harder` two-digit operands (the tiny model has not seen those
sums, so its accuracy there is lower: a second, distinct validation set). `corpus.txt` is extra plain text for the
tiny tokenizer (the chat prompts of the GRPO quickstart are drawn from the same templates).
"""

from __future__ import annotations

import json
import random
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "trl_rm_env" / "data" / "sample"

QUESTIONS = [
    "What is {a} + {b}?",
    "Compute {a} + {b}.",
    "Please add {a} and {b}.",
    "How much is {a} plus {b}?",
]
WORKED = ["{a} + {b} = {c}. The answer is {c}.", "Adding {a} and {b} gives {c}. The answer is {c}."]
TERSE = ["The answer is {c}.", "{c}"]
NO_ANSWER = ["I am not sure, sorry.", "I cannot help with that.", "Math is hard. Ask someone else."]
SYSTEM = "You are a careful math tutor."


def wrong_sum(rng: random.Random, c: int, low: int, high: int) -> int:
    while True:
        w = c + rng.choice([-3, -2, -1, 1, 2, 3, 10, -10]) if rng.random() < 0.7 else rng.randint(low, high)
        if w != c and w >= 0:
            return w


def make_record(rng: random.Random, low: int, high: int) -> dict:
    a, b = rng.randint(low, high), rng.randint(low, high)
    c = a + b
    context = []
    if rng.random() < 0.3:
        context.append({"role": "system", "content": SYSTEM})
    context.append({"role": "user", "content": rng.choice(QUESTIONS).format(a=a, b=b)})

    w1 = wrong_sum(rng, c, low, 2 * high)
    w2 = wrong_sum(rng, c, low, 2 * high)
    while w2 == w1:
        w2 = wrong_sum(rng, c, low, 2 * high)
    wrong_form = rng.choice(WORKED + TERSE[:1])
    pool = [
        (0, rng.choice(WORKED).format(a=a, b=b, c=c)),
        (1, rng.choice(TERSE).format(c=c)),
        (2, wrong_form.format(a=a, b=b, c=w1)),
        (2, rng.choice(WORKED + TERSE[:1]).format(a=a, b=b, c=w2)),
        (3, rng.choice(NO_ANSWER)),
    ]
    while True:
        chosen = rng.sample(pool, rng.choice([3, 3, 4]))
        if len({rank for rank, _ in chosen}) >= 2:
            break
    completions = [{"rank": rank, "completion": [{"role": "assistant", "content": text}]} for rank, text in chosen]
    return {"context": context, "completions": completions, "task": f"{a}+{b}"}


def write_jsonl(path: Path, records: list[dict]) -> None:
    with path.open("w", encoding="utf-8") as f:
        for record in records:
            f.write(json.dumps(record, ensure_ascii=False) + "\n")


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    rng = random.Random(20261122)
    write_jsonl(OUT / "train.jsonl", [make_record(rng, 1, 5) for _ in range(2000)])
    write_jsonl(OUT / "in_domain.jsonl", [make_record(rng, 1, 5) for _ in range(200)])
    write_jsonl(OUT / "harder.jsonl", [make_record(rng, 10, 99) for _ in range(200)])
    corpus = []
    for a in range(0, 20):
        for b in range(0, 20):
            corpus.append(rng.choice(QUESTIONS).format(a=a, b=b) + " " + rng.choice(WORKED).format(a=a, b=b, c=a + b))
    corpus += [SYSTEM, *NO_ANSWER, "Think step by step before you answer.", "<think>Let me add the numbers.</think>"]
    (OUT / "corpus.txt").write_text("\n".join(corpus) + "\n", encoding="utf-8")
    print(f"wrote sample data to {OUT}")


if __name__ == "__main__":
    main()
