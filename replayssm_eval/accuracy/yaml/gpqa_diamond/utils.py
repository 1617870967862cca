"""GPQA choices in a fixed order per question: the order is drawn from a seed and the question text only."""

import random

from lm_eval.tasks.gpqa.cot_zeroshot.utils import preprocess

SHUFFLE_SEED = 0
LETTERS = "ABCD"


def shuffled_choices(doc: dict, seed: int = SHUFFLE_SEED) -> tuple[list[str], int]:
    """(the four answers in this question's order, index of the correct one); the same on every run."""
    correct = preprocess(doc["Correct Answer"])
    choices = [preprocess(doc[f"Incorrect Answer {i}"]) for i in (1, 2, 3)] + [correct]
    random.Random(f"gpqa:{seed}:{doc['Question']}").shuffle(choices)  # str seeds hash with sha512: stable
    return choices, choices.index(correct)


def process_docs(dataset):
    """lm-eval's gpqa process_docs with the fixed shuffle: choice1..4, choices, answer "(X)"."""

    def _process_doc(doc):
        choices, index = shuffled_choices(doc)
        return {**{f"choice{i + 1}": c for i, c in enumerate(choices)}, "choices": choices,
                "answer": f"({LETTERS[index]})"}

    return dataset.map(_process_doc)
