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

`easy` is not arithmetic: 40 general-knowledge questions written by hand, each with a right and a wrong short answer
(rank 0 and 1), for judging with a real instruct model (`trl-rm-env make-real`; docs/real_models.md), where a model
of 135M parameters can be right and LLMBar is beyond it.
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


EASY = [  # (question, right answer, wrong answer), written by hand: facts a small instruct model may know
    ("What is the capital of France?", "The capital of France is Paris.", "The capital of France is Berlin."),
    ("How many days are in a week?", "There are 7 days in a week.", "There are 12 days in a week."),
    ("What color is the sky on a clear day?", "Blue.", "Green."),
    ("What is 2 + 2?", "4", "5"),
    ("Which animal barks?", "A dog barks.", "A fish barks."),
    ("What is the opposite of hot?", "Cold.", "Tall."),
    ("How many legs does a cat have?", "Four.", "Nine."),
    ("What do bees make?", "Honey.", "Steel."),
    ("What is the largest planet in our solar system?", "Jupiter.", "Mercury."),
    ("What is frozen water called?", "Ice.", "Sand."),
    ("In which direction does the sun rise?", "In the east.", "In the north."),
    ("What is 10 minus 3?", "7", "13"),
    ("How many hours are in a day?", "There are 24 hours in a day.", "There are 10 hours in a day."),
    ("What is the chemical formula of water?", "H2O.", "CO2."),
    ("Which is bigger, an elephant or a mouse?", "An elephant is bigger.", "A mouse is bigger."),
    ("What do plants need from the sun to grow?", "Light.", "Noise."),
    ("How many months are in a year?", "Twelve.", "Thirty."),
    ("What is the first letter of the English alphabet?", "A.", "Q."),
    ("What is 5 times 2?", "10", "52"),
    ("Which season comes after winter?", "Spring.", "Autumn."),
    ("What is the capital of Japan?", "Tokyo.", "Cairo."),
    ("What do we call a baby dog?", "A puppy.", "A kitten."),
    ("What gas do humans need to breathe to live?", "Oxygen.", "Helium."),
    ("How many sides does a triangle have?", "Three.", "Six."),
    ("What is the boiling point of water at sea level in Celsius?", "100 degrees Celsius.", "30 degrees Celsius."),
    ("Which ocean is the largest?", "The Pacific Ocean.", "The Arctic Ocean."),
    ("What is the color of a ripe banana?", "Yellow.", "Purple."),
    ("Who wrote 'Romeo and Juliet'?", "William Shakespeare.", "Charles Darwin."),
    ("What is the opposite of up?", "Down.", "Left."),
    ("How many wheels does a bicycle have?", "Two.", "Five."),
    ("What is the main language spoken in Spain?", "Spanish.", "Swedish."),
    ("What planet do we live on?", "Earth.", "Mars."),
    ("What is 100 divided by 10?", "10", "1000"),
    ("Which animal is known as the king of the jungle?", "The lion.", "The rabbit."),
    ("What do cows drink?", "Water.", "Gasoline."),
    ("What shape is a ball?", "A sphere, round.", "A cube, with sharp corners."),
    ("How many minutes are in an hour?", "Sixty.", "Fifteen."),
    ("What is the freezing point of water in Celsius?", "0 degrees Celsius.", "50 degrees Celsius."),
    ("Which is heavier, a kilogram of iron or a gram of feathers?", "A kilogram of iron.", "A gram of feathers."),
    ("What is the capital of Italy?", "Rome.", "Madrid."),
]


def easy_record(question: str, right: str, wrong: str) -> dict:
    return {"context": [{"role": "user", "content": question}],
            "completions": [{"rank": 0, "completion": [{"role": "assistant", "content": right}]},
                            {"rank": 1, "completion": [{"role": "assistant", "content": wrong}]}]}  # fmt: skip


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
    write_jsonl(OUT / "easy.jsonl", [easy_record(*row) for row in EASY])
    print(f"wrote sample data to {OUT}")


if __name__ == "__main__":
    main()
