"""The pretrained demo's word problems: GSM8K-style, distinct, a held-out part kept apart."""

from __future__ import annotations

import random
import re

from grpo_core.cli import word_problems


def test_problems_are_worded_distinct_and_split_apart():
    train, held = word_problems.split(300, 50, seed=1)
    assert len(train) == 300 and len(held) == 50
    prompts = [r["prompt"] for r in train + held]
    assert len(set(prompts)) == 350 and not {r["prompt"] for r in held} & set(prompts[:300])
    assert all(
        r["prompt"].endswith("?") and not re.search(r"\d\s*[-+*/x]\s*\d", r["prompt"])
        for r in train + held
    )  # words, never a bare "a + b"
    assert all(r["answer"].isdigit() for r in train + held)  # whole, non-negative answers
    assert word_problems.split(300, 50, seed=1) == (train, held)  # the seed decides


FORMULAS = {  # the answer from the story's numbers, in the order the story gives them
    "_add": lambda a, b: a + b,
    "_sub": lambda a, b: a - b,
    "_mul": lambda a, b: a * b,
    "_div": lambda total, k: total // k,
    "_buy_give": lambda a, b, c: a + b - c,
    "_packs_plus": lambda k, each, had: k * each + had,
    "_trays_sold": lambda k, each, sold: k * each - sold,
    "_spend": lambda k, price, pen: k * price + pen,
}


def test_each_template_answers_its_own_story():
    rng = random.Random(0)
    for template in word_problems.ONE_STEP + word_problems.TWO_STEP:
        for _ in range(200):
            question, answer = template(rng, "Tom", "apples")
            numbers = [int(n) for n in re.findall(r"\d+", question)]
            assert answer == FORMULAS[template.__name__](*numbers) > 0, question


ONE_STEP_WORDS = ("buys", "gave", "A box holds", "shares")
TWO_STEP_WORDS = ("then gives", "packs of", "trays of", "notebooks")
TEMPLATE_OF = {  # words only one template's stories hold; "buys" last (three others buy too)
    "then gives": "buy_give",
    "gave": "sub",
    "A box holds": "mul",
    "shares": "div",
    "packs of": "packs_plus",
    "trays of": "trays_sold",
    "notebooks": "spend",
    "buys": "add",
}


def test_the_default_split_holds_both_kinds_half_each_and_names_them():
    train, held = word_problems.split(300, 50, seed=1)
    for rows in (train, held):
        kinds = [r["kind"] for r in rows]
        assert kinds.count("one-step") == kinds.count("two-step") == len(rows) // 2
        for r in rows:  # the kind and the template name the template that wrote the story
            two = any(w in r["prompt"] for w in TWO_STEP_WORDS)
            assert two == (r["kind"] == "two-step"), r
            words = next(w for w in TEMPLATE_OF if w in r["prompt"])
            assert r["template"] == TEMPLATE_OF[words], r


def test_one_step_training_rows_keep_the_mixed_heldout_apart():
    train, held = word_problems.split(300, 50, seed=1, train_templates=word_problems.ONE_STEP)
    assert held == word_problems.split(300, 50, seed=1)[1]  # the same held-out problems
    assert len(train) == 300 and not {r["prompt"] for r in train} & {r["prompt"] for r in held}
    assert all(any(w in r["prompt"] for w in ONE_STEP_WORDS) for r in train)
    assert not any(any(w in r["prompt"] for w in TWO_STEP_WORDS) for r in train)
    assert {r["kind"] for r in train} == {"one-step"}
    assert any(any(w in r["prompt"] for w in TWO_STEP_WORDS) for r in held)
