"""Arithmetic word problems of one and two steps, written the way GSM8K writes them.

Each template is a short story with whole-number quantities and one question; the answer is
a whole number reached in one step (add, subtract, multiply, divide) or two (buy then give
away, packs plus what one had, trays minus what was sold, a price times a count plus
another price). :func:`split` draws distinct problems from a seed and sets aside a held-out
part that training never sees.
"""

from __future__ import annotations

import random
from collections.abc import Callable

NAMES = [
    "Maria",
    "James",
    "Aisha",
    "Tom",
    "Lena",
    "Carlos",
    "Priya",
    "Ben",
    "Sofia",
    "Omar",
    "Grace",
    "Liam",
    "Mei",
    "Noah",
    "Hana",
    "Ravi",
    "Zoe",
    "Ethan",
    "Fatima",
    "Lucas",
]
ITEMS = [
    "apples",
    "marbles",
    "stickers",
    "pencils",
    "cookies",
    "books",
    "stamps",
    "shells",
    "cards",
    "oranges",
    "balloons",
    "crayons",
]
FRIENDS = ["her brother", "his sister", "a friend", "their teacher", "a neighbor"]

Problem = tuple[str, int]  # (question, answer)


def _add(r: random.Random, n: str, it: str) -> Problem:
    a, b = r.randint(12, 80), r.randint(5, 60)
    return (
        f"{n} has {a} {it}. Then {n} buys {b} more {it} at the store. How many {it} "
        f"does {n} have now?",
        a + b,
    )


def _sub(r: random.Random, n: str, it: str) -> Problem:
    a = r.randint(30, 99)
    b = r.randint(5, a - 5)
    return (
        f"{n} had {a} {it} and gave {b} of them to {r.choice(FRIENDS)}. How many {it} "
        f"does {n} have left?",
        a - b,
    )


def _mul(r: random.Random, n: str, it: str) -> Problem:
    a, b = r.randint(3, 12), r.randint(3, 9)
    return (f"A box holds {a} {it}. {n} buys {b} boxes. How many {it} does {n} buy in all?", a * b)


def _div(r: random.Random, n: str, it: str) -> Problem:
    each, k = r.randint(3, 12), r.randint(2, 8)
    return (
        f"{n} shares {each * k} {it} equally among {k} friends. How many {it} does each "
        f"friend get?",
        each,
    )


def _buy_give(r: random.Random, n: str, it: str) -> Problem:
    a, b = r.randint(12, 60), r.randint(5, 40)
    c = r.randint(3, a + b - 3)
    return (
        f"{n} has {a} {it}. {n} buys {b} more and then gives {c} to "
        f"{r.choice(FRIENDS)}. How many {it} does {n} have now?",
        a + b - c,
    )


def _packs_plus(r: random.Random, n: str, it: str) -> Problem:
    k, each, had = r.randint(2, 9), r.randint(3, 10), r.randint(4, 30)
    return (
        f"{n} buys {k} packs of {it} with {each} {it} in each pack. {n} already had "
        f"{had} {it}. How many {it} does {n} have now?",
        k * each + had,
    )


def _trays_sold(r: random.Random, n: str, it: str) -> Problem:
    k, each = r.randint(3, 9), r.randint(4, 12)
    sold = r.randint(2, k * each - 2)
    return (
        f"{n} bakes {k} trays of cookies with {each} cookies on each tray and sells "
        f"{sold} of them. How many cookies does {n} have left?",
        k * each - sold,
    )


def _spend(r: random.Random, n: str, it: str) -> Problem:
    k, price, pen = r.randint(2, 9), r.randint(2, 15), r.randint(1, 9)
    return (
        f"{n} buys {k} notebooks that cost ${price} each and one pen that costs ${pen}. "
        f"How many dollars does {n} spend in all?",
        k * price + pen,
    )


ONE_STEP: list[Callable[[random.Random, str, str], Problem]] = [_add, _sub, _mul, _div]
TWO_STEP: list[Callable[[random.Random, str, str], Problem]] = [
    _buy_give,
    _packs_plus,
    _trays_sold,
    _spend,
]


def problems(
    n: int,
    seed: int = 0,
    templates: list[Callable[[random.Random, str, str], Problem]] | None = None,
    exclude: frozenset[str] = frozenset(),
) -> list[dict]:
    """``n`` distinct problems as rows ``{"prompt", "answer", "kind", "template"}`` (kind:
    ``one-step`` or ``two-step``; template: the story's, e.g. ``sub`` or ``trays_sold``, for
    ``grpo eval --by template``) in a seeded order: from ``templates`` when given, else half
    one-step and half two-step; none whose question is in ``exclude``."""
    rng = random.Random(seed)
    seen: set[str] = set(exclude)
    rows: list[dict] = []
    while len(rows) < n:
        kinds = templates or (ONE_STEP if len(rows) % 2 == 0 else TWO_STEP)
        template = rng.choice(kinds)
        question, answer = template(rng, rng.choice(NAMES), rng.choice(ITEMS))
        if question not in seen:
            seen.add(question)
            kind = "one-step" if template in ONE_STEP else "two-step"
            name = template.__name__.lstrip("_")
            rows.append({"prompt": question, "answer": str(answer), "kind": kind, "template": name})
    return rows


def split(
    n_train: int,
    n_heldout: int,
    seed: int = 0,
    train_templates: list[Callable[[random.Random, str, str], Problem]] | None = None,
) -> tuple[list[dict], list[dict]]:
    """(training rows, held-out rows): distinct problems, none in both, each half one-step and
    half two-step; ``train_templates`` draws the training rows from those templates only
    (the pretrained demo trains on :data:`ONE_STEP`, docs/recipes.md), with the same held-out
    rows."""
    rows = problems(n_train + n_heldout, seed)
    if train_templates is None:
        return rows[:n_train], rows[n_train:]
    held = rows[n_train:]
    exclude = frozenset(r["prompt"] for r in held)
    return problems(n_train, seed + 1, train_templates, exclude), held
