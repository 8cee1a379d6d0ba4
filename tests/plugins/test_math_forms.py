"""The math reward on labelled answer forms (tests/data/math_forms.jsonl), the holes that
farmed reward (tiny values, one-sided sampling, unit swaps), and bounded-time extraction."""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from fractions import Fraction

import pytest
from grpo_core_plugins.rewards.math.compare import equivalent
from grpo_core_plugins.rewards.math.extract import extract_answer, gold_answer
from grpo_core_plugins.rewards.math.numeric import _points
from grpo_core_plugins.rewards.math.units import split_unit
from helpers import ROOT

import grpo_core

DATA = os.path.join(ROOT, "tests", "data", "math_forms.jsonl")
with open(DATA, encoding="utf-8") as _f:
    ROWS = [json.loads(line) for line in _f if line.strip()]
CATEGORIES = sorted({r["category"] for r in ROWS})

#: every form and hole named in the issue has a category of labelled cases
REQUIRED = {
    "thousands_separators",
    "mixed_numbers",
    "percent_fractions",
    "unit_words",
    "unit_text",
    "currency_gsm8k",
    "equality_chains",
    "named_quantities",
    "set_unions",
    "pm_several",
    "list_vs_pm",
    "prose_solutions",
    "interval_inequalities",
    "abs_inequalities",
    "all_reals",
    "matrix_forms",
    "matrix_decimals",
    "trig_identities",
    "log_identities",
    "unclosed_box",
    "trailing_backslashes",
    "bold_final_answer",
    "which_is_ending",
    "exact_zero_and_tiny",
    "symbolic_signs",
    "unit_conflict",
    # issue #31: false 1s, then the false 0s by form
    "fallback_whole_expression",
    "junk_text",
    "percent_decimals",
    "gold_reduction",
    "multi_box",
    "bare_math",
    "answer_then_prose",
    "decimal_comma_spacing",
    "tuple_names",
    "matrix_scalar",
    "equation_forms",
    "repeated_solutions",
    "root_powers",
    "set_difference",
    "unicode_math",
}


def verdict(row: dict) -> bool:
    return equivalent(extract_answer(row["completion"]), gold_answer(row["gold"]))


def test_every_form_has_ten_equal_and_five_unequal_cases():
    assert REQUIRED <= set(CATEGORIES)
    counts = Counter((r["category"], r["expected"]) for r in ROWS)
    for c in CATEGORIES:
        assert counts[(c, True)] >= 10 and counts[(c, False)] >= 5, (c, counts)


@pytest.mark.parametrize("category", CATEGORIES)
def test_form(category):
    misses = [
        (r["expected"], extract_answer(r["completion"]), r["gold"])
        for r in ROWS
        if r["category"] == category and verdict(r) != r["expected"]
    ]
    assert not misses, misses


def test_the_reward_through_its_workers_agrees_with_the_labels():
    reward = grpo_core.create("reward", "math", {"timeout": 5.0})
    scores = reward(
        ["q"] * len(ROWS), [r["completion"] for r in ROWS], answer=[r["gold"] for r in ROWS]
    )
    wrong = [
        (r["category"], r["gold"], s) for r, s in zip(ROWS, scores) if (s == 1.0) != r["expected"]
    ]
    assert not wrong, wrong
    assert reward.verifier.timeouts == 0


# -- more forms, written apart from the fixture ---------------------------------------------

MORE = [
    ("The total cost is \\$1,\\!200.", "1200", True),
    ("\\boxed{1\\,200}", "1200", True),
    ("\\boxed{4\\frac{1}{2}\\text{ hours}}", "4.5", True),
    ("\\boxed{4 \\frac12}", "\\frac{9}{2}", True),
    ("\\boxed{62\\frac{1}{2}\\%}", "62.5\\%", True),
    ("\\boxed{25\\text{ m}^2}", "25", True),
    ("\\boxed{25\\text{ m}^2}", "25\\text{ cm}^2", False),
    ("\\boxed{\\$42.50}", "42.5", True),
    ("#### 42", "\\$42.00", True),
    ("\\boxed{h = \\frac{3}{2}}", "\\frac32", True),
    ("\\boxed{\\angle BAC = 45^{\\circ}}", "45", True),
    (
        "\\boxed{x=\\frac{-3\\pm\\sqrt{17}}{4}}",
        "\\frac{-3+\\sqrt{17}}{4}, \\frac{-3-\\sqrt{17}}{4}",
        True,
    ),
    ("\\boxed{(-\\infty,-3]\\cup[3,\\infty)}", "|x|\\ge 3", True),
    ("\\boxed{x \\le -3 \\text{ or } x \\ge 3}", "(-\\infty,-3]\\cup[3,\\infty)", True),
    ("\\boxed{-1 < x < 5}", "(-1,5)", True),
    ("\\boxed{[-1, 5)}", "-1 \\le x < 5", True),
    (
        "\\boxed{\\left(\\begin{array}{cc}1&-1\\\\2&0\\end{array}\\right)}",
        "\\begin{pmatrix}1&-1\\\\2&0\\end{pmatrix}",
        True,
    ),
    (
        "\\boxed{\\begin{pmatrix}0.5\\\\-0.25\\end{pmatrix}}",
        "\\begin{pmatrix}\\frac12\\\\-\\frac14\\end{pmatrix}",
        True,
    ),
    ("\\boxed{\\tan^2 x + 1}", "\\sec^2 x", True),
    ("\\boxed{\\log_3 9}", "2", True),
    ("\\boxed{\\cos 2x}", "\\cos^2 x - \\sin^2 x", True),
    ("The answer is \\boxed{\\frac{3}{4}", "\\frac34", True),
    ("so we get $\\boxed{12 \\\\}$", "12", True),
    ("**Final Answer**\n\\[ \\frac{7}{2} \\]", "3.5", True),
    ("Adding these, the final count is $17$.", "17", True),
    ("Thus the area equals $\\frac{25\\pi}{4}$.", "\\frac{25}{4}\\pi", True),
    ("\\boxed{10^{-20}}", "0", False),
    ("\\boxed{\\sqrt{x^2}}", "x", False),
    ("\\boxed{5\\text{ miles}}", "5 \\text{ km}", False),
    ("\\boxed{2, 3}", "2", False),
    ("\\boxed{x = 3 \\text{ or } x = -3}", "\\pm 3", True),
    ("\\boxed{3 \\text{ and } -3}", "3", False),
    ("\\boxed{\\text{No solution}}", "\\emptyset", False),
    ("\\boxed{(1, 2)}", "(2, 1)", False),
    ("\\boxed{\\frac{1}{3}}", "0.33", False),
    ("\\boxed{\\frac{\\sqrt{2}}{2}}", "\\frac{1}{\\sqrt{2}}", True),
    ("\\boxed{2\\sqrt{2}}", "\\sqrt{8}", True),
    ("\\boxed{y = -\\frac{1}{2}x + 3}", "y = 3 - \\frac{x}{2}", True),
    ("\\boxed{f^{-1}(x) = \\frac{x-3}{2}}", "\\frac{x-3}{2}", True),
    ("\\boxed{1.5 \\times 10^{3}}", "1500", True),
    ("\\boxed{3.0 \\text{ cm}}", "3", True),
    ("\\boxed{30^\\circ}", "\\frac{\\pi}{6}", False),
    ("\\boxed{\\dfrac{1}{2}\\text{ inch}}", "\\frac12", True),
    ("\\boxed{90\\%}", "0.9", True),
    ("\\boxed{x \\in [2, \\infty)}", "x \\ge 2", True),
    ("\\boxed{(2, \\infty)}", "x \\ge 2", False),
    ("\\boxed{\\{3, -1\\}}", "-1, 3", True),
    ("\\boxed{-1, 3}", "\\{-1, 3, 4\\}", False),
    ("\\boxed{\\text{(B)}}", "B", True),
    ("\\boxed{B}", "\\text{(C)}", False),
    ("\\boxed{6 - 5i}", "6-5i", True),
    ("\\boxed{\\frac{1}{2} \\cdot 3}", "1.5", True),
    ("\\boxed{18\\ \\text{inches}}", "18", True),
    ("\\boxed{x \\in \\{2, 5\\}}", "2, 5", True),
    ("\\boxed{\\frac{5}{2}\\text{ cm}^2}", "2.5", True),
    ("\\boxed{\\{x \\mid x > 2\\}}", "(2,\\infty)", True),
    ("\\boxed{\\{x : -1 \\le x \\le 3\\}}", "[-1,3]", True),
    ("\\boxed{(-\\infty, -2) \\cup (2, \\infty)}", "|x| > 2", True),
    ("The final answer is $\\boxed{\\frac{\\sqrt{2}}{2}}$.", "\\cos 45^\\circ", True),
    ("**Final Answer**\n\\[\n\\boxed{42}\n\\]", "42", True),
    ("**Final Answer**\n\n\\[ 1,\\!024 \\]", "1024", True),
    ("Final Answer: The final answer is $2\\sqrt{5}$. I hope it is correct.", "\\sqrt{20}", True),
    ("\\boxed{x=2,\\ x=5}", "\\{2,5\\}", True),
    ("\\boxed{2 \\text{ or } 5}", "\\{5,2\\}", True),
    ("\\boxed{1.5 \\text{ hours}}", "1\\frac{1}{2}", True),
    ("\\boxed{1,000}", "1000", True),
    ("\\boxed{(1,000)}", "1000", False),
    ("\\boxed{0.\\overline{3}}", "\\frac13", True),
    ("\\boxed{\\text{undefined}}", "\\text{undefined}", True),
    ("\\boxed{\\infty}", "\\infty", True),
    ("\\boxed{-\\infty}", "\\infty", False),
    ("\\boxed{\\frac{3}{4}\\%}", "0.75\\%", True),
    ("\\boxed{75\\%}", "\\frac{3}{4}", True),
    ("\\boxed{2x^2 + 4x}", "2x(x+2)", True),
    ("\\boxed{x^2 - 4}", "(x-2)(x+2)", True),
    ("\\boxed{(x-2)(x+2)}", "x^2-4", True),
    ("\\boxed{\\frac{1}{x}}", "x^{-1}", True),
    ("\\boxed{e^{i\\pi}}", "-1", False),
    ("\\boxed{3\\sqrt{3}/2}", "\\frac{3\\sqrt3}{2}", True),
    ("\\boxed{\\sqrt{3}/2 \\cdot 3}", "\\frac{3\\sqrt3}{2}", True),
    ("\\boxed{50^\\circ \\text{C}}", "50", True),
    ("\\boxed{\\text{12 cm}}", "12", True),
    ("\\boxed{12\\text{cm}}", "12", True),
    ("\\boxed{7 \\text{ units}^2}", "7", True),
    ("\\boxed{36\\pi \\text{ cm}^3}", "36\\pi", True),
    ("\\boxed{5\\sqrt{2} \\text{ units}}", "5\\sqrt2", True),
    ("\\boxed{4 \\mathrm{~cm}}", "4", True),
    ("\\boxed{\\frac{1}{2}\\sqrt{3}}", "\\frac{\\sqrt{3}}{2}", True),
    ("\\boxed{20\\sqrt{2}\\,\\text{m}}", "20\\sqrt{2}", True),
]


@pytest.mark.parametrize("text,gold,expected", MORE)
def test_more_forms(text, gold, expected):
    assert equivalent(extract_answer(text), gold_answer(gold)) == expected


# -- holes ----------------------------------------------------------------------------------

TINY = [
    ("10^{-100}", "0"),
    ("10^{-1000}", "0"),
    ("1\\times10^{-60}", "0"),
    ("e^{-1000}", "0"),
    ("e^{-e^{5}}", "0"),
    ("2^{-500}", "0"),
    ("\\frac{1}{10^{80}}", "0"),
    ("0." + "0" * 70 + "1", "0"),
    ("1 + 10^{-100}", "1"),
    ("\\pi + 10^{-80}", "\\pi"),
    ("\\sqrt{2} - 10^{-200}", "\\sqrt{2}"),
    ("1.41421356237309504880168872420969807856967187537694", "\\sqrt{2}"),
    ("3.14159265358979323846264338", "\\pi"),
    ("\\sin(10^{-90})", "0"),
    ("x + 10^{-100}", "x"),
]


@pytest.mark.parametrize("pred,gold", TINY)
def test_a_tiny_difference_is_a_difference(pred, gold):
    assert not equivalent(pred, gold)
    assert not equivalent(gold, pred)


def test_only_a_configured_tolerance_blurs_values():
    assert not equivalent("1.0000001", "1")
    assert equivalent("1.0000001", "1", rel_tol=1e-6)
    assert not equivalent("10^{-100}", "0", rel_tol=1e-6)  # relative to 0: still exact
    assert equivalent("3.1416", "\\pi", rel_tol=1e-4) and not equivalent("3.1416", "\\pi")
    for pred, gold in [
        ("\\sin\\pi", "0"),
        ("\\log_2 8", "3"),
        ("\\cos(\\pi/3)", "0.5"),
        ("\\sqrt{8}", "2\\sqrt2"),
        ("e^{\\ln 7}", "7"),
    ]:
        assert equivalent(pred, gold), (pred, gold)  # identities still hold exactly


SIGNED = [
    ("|x|", "x"),
    ("\\sqrt{x^2}", "x"),
    ("x", "|x|"),
    ("\\sqrt{x^2}", "-x"),
    ("|x|^3", "x^3"),
    ("\\sqrt{4x^2}", "2x"),
    ("|x - 1|", "x - 1"),
    ("x|x|", "x^2"),
    ("\\frac{|x|}{x}", "1"),
    ("\\sqrt{x^2 y^2}", "xy"),
    ("\\ln(x^2)", "2\\ln x"),
    ("\\lfloor x \\rfloor", "x"),
]


@pytest.mark.parametrize("pred,gold", SIGNED)
def test_symbolic_equality_is_checked_at_negative_and_fractional_points(pred, gold):
    assert not equivalent(pred, gold)


def test_sample_points_are_signed_and_fractional():
    import sympy as sp

    x, y = sp.symbols("x y")
    pts = _points("a", "b", [x, y], 6)
    for s in (x, y):
        values = [p[s] for p in pts]
        assert any(v < 0 for v in values) and any(v > 0 for v in values)
        assert all(isinstance(v, Fraction) and v.denominator > 1 for v in values)
    assert equivalent("\\sqrt{x^2}", "|x|") and equivalent("|x|^2", "x^2")


UNITS = [
    ("5 \\text{ cm}", "5 \\text{ m}"),
    ("5\\text{ cm}^2", "5 \\text{ cm}"),
    ("3 hours", "3 \\text{ minutes}"),
    ("40^\\circ", "40 \\text{ radians}"),
    ("\\$5", "5 \\text{ cents}"),
    ("12 \\text{ feet}", "12 \\text{ inches}"),
    ("100 \\text{ km/h}", "100 mph"),
    ("7 \\text{ apples}", "7 \\text{ oranges}"),
]


@pytest.mark.parametrize("pred,gold", UNITS)
def test_different_units_on_both_sides_are_wrong(pred, gold):
    assert not equivalent(pred, gold) and not equivalent(gold, pred)
    assert equivalent(pred, split_unit(gold)[0])  # a unit on one side only is fine


def test_unit_names_are_canonical():
    assert split_unit("15\\mbox{ cm}^2") == ("15", "cm^2")
    assert split_unit("12 square feet")[1] == split_unit("12 \\text{ ft}^2")[1] == "ft^2"
    assert split_unit("\\$32,\\!348") == ("32,\\!348", "usd")
    assert split_unit("x + 2")[1] is None and split_unit("\\text{Evelyn}")[1] is None
    assert split_unit("3 x")[1] is None  # a lone letter is a variable


# -- extraction ----------------------------------------------------------------------------

EXTRACT = [
    ("The roots are $\\boxed{-2}$ and $\\boxed{3}$.", "-2, 3"),
    ("First $a = \\boxed{3}$, then $b = 4$, so $a + b = \\boxed{7}$.", "7"),
    ("Thus the answer is $\\boxed{\\frac{3}{8}", "\\frac{3}{8}"),
    ("so it is \\boxed{\\frac{1}{2}$.", "\\frac{1}{2}"),
    ("$$\\boxed{12 \\\\}$$", "12 \\\\"),
    ("Work.\n\n**Final Answer**\n\n42", "42"),
    ("Work.\n\n**Final Answer**\n$$\\frac{7}{2}$$", "\\frac{7}{2}"),
    ("Work.\n\n### Final Answer\n\n$x = 5$", "x = 5"),
    ("Adding up, the total, which is $\\frac{1}{6}$.", "\\frac{1}{6}"),
    ("So $x = -\\frac{1}{2}$ or $x = 4$.", "x = -\\frac{1}{2}, x = 4"),
    ("Therefore, the roots are $-2$ and $3$.", "-2, 3"),
    ("The answer is 12. Check: $3 \\cdot 4 = 12$.", "12"),  # marked answer, same paragraph
    ("The answer is 12.\n\nOn reflection, the total is $14$.", "14"),  # the last word wins
    ("The total cost is \\$1,\\!200.", "1200"),
    # the last-number fallback takes a whole expression, or nothing (#31)
    ("Dividing the total by two, therefore 7/2", "7/2"),
    ("so the count is n - 2", "n - 2"),  # stated whole after "is"
    ("and the leading term is x^2", "x^2"),
    ("the count is then reduced by n - 2", None),  # a part: no stating verb before it
    ("Meet at 10:30", "10:30"),
    ("abc12def", None),
    ("It happened on the 5x", None),
    ("she was in 6th place", "6"),
    ("17 apples are left", "17"),
    ("the point is (3, 4)", None),
    ("the sizes are 3, 4, 5", None),
    ("The value is (5).", "(5)"),
    ("the 3th", None),
    ("Her salary is $57500/year.", "57500"),
    ("Total = 3 + ", None),
    ("I think it's 5 or 6", "5 or 6"),
    ("between 5 and 6", "5 and 6"),
    ("Adding the two parts, 3 + 4 = 7", "7"),
    ("so x=5", "5"),
    ("They ran 17km", "17 km"),
    ("Therefore $x \\geq 5$ is the solution.", "x \\geq 5"),
    ("He pays $15 for it.", "15"),
    # an answer stated after the last box; boxes joined by a few words with and/or
    ("We get \\boxed{4}. Then the final answer is $7$.", "7"),
    ("We get \\boxed{4}. Then the answer is correct.", "4"),
    ("$\\boxed{(3, 3)}$ for part (a) and $\\boxed{(1, 1)}$", "(3, 3), (1, 1)"),
    ("\\boxed{5} and then we compute \\boxed{7}", "7"),
    ("So $x = \\boxed{3}$, $y = \\boxed{5}$.", "x = 3, y = 5"),
    ("Final Answer: The number of apples is 12.", "12"),
    ("7 \\over 2", "7 \\over 2"),
    ("the work <|im_start|>user", None),
]


@pytest.mark.parametrize("text,expected", EXTRACT)
def test_extraction_of_malformed_and_unmarked_endings(text, expected):
    assert extract_answer(text) == expected


def test_strict_mode_reads_a_trailing_math_span_only_after_is_or_equals():
    assert extract_answer("so the probability is $\\frac{1}{6}$.", strict=True) == "\\frac{1}{6}"
    assert extract_answer("we drew a picture of $\\triangle ABC$.", strict=True) is None


LONG = 100_000
HOSTILE_TEXTS = [
    ",".join(["1"] * (LONG // 2)),
    ", ".join(["1"] * (LONG // 3)),
    "1," * (LONG // 2),
    "1,000," * (LONG // 6),
    "\\boxed{" * (LONG // 7),
    "{" * LONG,
    "}" * LONG,
    "$" * LONG,
    "**" * (LONG // 2),
    "answer is " * (LONG // 10),
    "<answer>" * (LONG // 8),
    "final answer " * (LONG // 13),
    "$1$ and " * (LONG // 8),
    "\\boxed{1}, " * (LONG // 11),
    "\\(" * (LONG // 2),
    "the roots of " * (LONG // 13) + "are",
    "#### " + "9" * LONG,
    "\\boxed{" + "1," * (LONG // 2) + "}",
    "x" * LONG + "$",
    ". " * (LONG // 2) + "$5$",
]


def test_extraction_time_is_bounded_on_long_hostile_text():
    """Extraction runs in the trainer, outside the workers' budget (issue #19)."""
    worst = 0.0
    for text in HOSTILE_TEXTS:
        t0 = time.process_time()  # CPU time, the work: waiting for a core is not counted
        pred = extract_answer(text)
        gold_answer(text)
        extract_answer(text, strict=True)
        worst = max(worst, time.process_time() - t0)
        assert pred is None or isinstance(pred, str)
    assert worst < 2.0, worst  # CPU seconds; measured ~0.05 s


# -- issue #50: the forms behind the false 1s, as labelled pairs --------------------------

PAIRS_PATH = os.path.join(ROOT, "tests", "data", "math_pairs.jsonl")
with open(PAIRS_PATH, encoding="utf-8") as _f:
    PAIRS = [json.loads(line) for line in _f if line.strip()]
PAIR_FORMS = sorted({r["form"] for r in PAIRS})
#: the forms of issue #50, each with right and near-miss wrong pairs
FORMS_50 = {
    "answer_then_prose",
    "restated_numbers",
    "mixed_numbers",
    "unicode_math",
    "text_golds",
    "spaces_and_decimal_commas",
    "limits_in_words",
    "junk_numbers",
}


#: the forms of the last Math-Verify errors closed in #50 (its published cases), and the
#: estimate in the answer's own sentence
FORMS_50_MV = {"quoted_answer", "function_range", "assignment_solutions", "estimate_in_sentence"}


def test_every_form_of_issue_50_has_right_and_wrong_pairs():
    assert FORMS_50 | FORMS_50_MV <= set(PAIR_FORMS)
    counts = Counter((r["form"], r["label"]) for r in PAIRS)
    for form in FORMS_50:
        assert counts[(form, True)] >= 8 and counts[(form, False)] >= 10, (form, counts)
    for form in FORMS_50_MV:
        assert counts[(form, True)] >= 7 and counts[(form, False)] >= 9, (form, counts)


@pytest.mark.parametrize("form", PAIR_FORMS)
def test_no_wrong_pair_of_a_form_is_paid(form):
    rows = [r for r in PAIRS if r["form"] == form]
    false_ones = [
        (r["gold"], extract_answer(r["completion"])) for r in rows if not r["label"] and verdict(r)
    ]
    assert not false_ones, false_ones
    right = [r for r in rows if r["label"]]
    missed = [(r["gold"], extract_answer(r["completion"])) for r in right if not verdict(r)]
    # recall: the misses left are read as "cannot tell" on purpose (docs/rewards.md)
    assert len(missed) <= 0.15 * len(right), missed


def test_the_reward_through_its_workers_never_pays_a_wrong_pair():
    reward = grpo_core.create("reward", "math", {"timeout": 5.0})
    scores = reward(
        ["q"] * len(PAIRS), [r["completion"] for r in PAIRS], answer=[r["gold"] for r in PAIRS]
    )
    paid_wrong = [
        (r["form"], r["gold"]) for r, s in zip(PAIRS, scores) if s == 1.0 and not r["label"]
    ]
    assert not paid_wrong, paid_wrong
    accuracy = sum((s == 1.0) == r["label"] for r, s in zip(PAIRS, scores)) / len(PAIRS)
    assert accuracy >= 0.97, accuracy
    assert reward.verifier.timeouts == 0


#: the same forms in new phrasings (not in the corpus): (completion, gold, paid)
PHRASINGS_50 = [
    # an answer, then a check / an estimate / a restated given
    ("So he saved 64 dollars. As a quick check, 8 weeks at 8 dollars is 64.", "64", True),
    ("So he saved 64 dollars. As a quick check, 8 weeks at 8 dollars is 64.", "8", False),
    ("The pool fills in 6 hours. That is roughly 400 minutes.", "400", False),
    ("The pool fills in 6 hours. That is roughly 400 minutes.", "6", True),
    ("In total, 35 students passed. Initially there were 40.", "40", False),
    ("In total, 35 students passed. Initially there were 40.", "35", True),
    # a final sentence that restates the question's numbers around the result
    ("8 * 3 = 24, so after 3 weeks at 8 books a week she owns 24 books.", "24", True),
    ("8 * 3 = 24, so after 3 weeks at 8 books a week she owns 24 books.", "3", False),
    ("So 5 friends sharing 20 cookies each get 4 cookies.", "20", False),
    # mixed numbers and improper fractions, both ways, and look-alikes
    ("The board is 3 1/4 feet long.", "\\frac{13}{4}", True),
    ("The board is 13/4 feet long.", "3\\frac14", True),
    ("The board is 31/4 feet long.", "3 1/4", False),
    ("\\boxed{3\\frac{1}{4}}", "\\frac{31}{4}", False),
    # Unicode superscripts and symbols
    ("The surface area is 6a².", "6a^2", True),
    ("The surface area is 6a².", "6a", False),
    ("The side is 3√5 cm.", "3\\sqrt{5}", True),
    ("The side is 3√5 cm.", "35", False),
    # text golds against other notations
    ("The store closes at 21:30.", "9:30 PM", True),
    ("The store closes at 9:30 a.m.", "9:30 PM", False),
    ("The rope is 7 yards long.", "7 \\text{ yards}", True),
    ("The rope is 7 feet long.", "7 \\text{ yards}", False),
    # thousands by spaces, decimal commas
    ("The farm has 25 000 chickens.", "25000", True),
    ("The farm has 25 000 chickens.", "25", False),
    ("The average is 4,5 points.", "4.5", True),
    ("The average is 4,5 points.", "45", False),
    # limits in words
    ("As n grows, the sum grows without bound: the limit is infinity.", "\\infty", True),
    ("As n grows, the sum grows without bound: the limit is infinity.", "-\\infty", False),
    ("The one-sided limits disagree, so the limit doesn't exist.", "\\text{DNE}", True),
    ("The one-sided limits disagree, so the limit doesn't exist.", "1", False),
    # junk numbers inside words and expressions
    ("The answer is on page X7.", "7", False),
    ("We end with 4y - 9.", "9", False),
    ("We end with 4y - 9.", "4y-9", False),  # no stating verb: not read
    ("The result is 4y - 9.", "4y-9", True),
]


#: a marked answer whose sentence restates other numbers, or denies one
MARKED_SENTENCES_50 = [
    ("Final Answer: After 3 days at 5 pages a day, she has read 15 pages.", "15", True),
    ("Final Answer: After 3 days at 5 pages a day, she has read 15 pages.", "3", False),
    ("Final Answer: After 3 days at 5 pages a day, she has read 15 pages.", "5", False),
    ("The final answer is 15, because 3 × 5 = 15.", "15", True),
    ("The final answer is 15, because 3 × 5 = 15.", "5", False),
    ("The answer is 15 pages. That is 5 more than the 10 she read yesterday.", "10", False),
    ("The answer is x² + 1, not x² − 1.", "x^2+1", True),
    ("The answer is x² + 1, not x² − 1.", "x^2-1", False),
    ("The answer is 5 meters (about 16 feet).", "5 m", True),
    ("The answer is 5 meters (about 16 feet).", "16 feet", False),
    ("Answer: 2 1/3 cups, or 7/3 cups.", "21/3", False),
    ("The answer is 8. Wait, let me recompute: 5 + 4 = 9. So the answer is 9.", "9", True),
    ("The answer is 8. Wait, let me recompute: 5 + 4 = 9. So the answer is 9.", "8", False),
]


#: one sentence, several values: read only when the text says which one is the result
SEVERAL_VALUES_50 = [
    ("With 24 students in 6 groups, each group has 4 students.", "24", False),
    ("With 24 students in 6 groups, each group has 4 students.", "6", False),
    ("In 2 hours at 30 mph, he covers 60 miles.", "60", True),
    ("In 2 hours at 30 mph, he covers 60 miles.", "30", False),
    ("The area is 36 and the perimeter is 24.", "24", False),  # which was asked? refused
    ("The area is 36 and the perimeter is 24.", "36", False),
    ("So, 12 + 8 = 20 apples are left from the 30 she bought.", "20", True),
    ("So, 12 + 8 = 20 apples are left from the 30 she bought.", "30", False),
    ("The result is 1/2. Or 0.4 if rounded down.", "0.4", False),
    ("x = 5, so y = 2(5) + 1 = 11.", "11", True),
    ("x = 5, so y = 2(5) + 1 = 11.", "5", False),
    ("The total is 30, which is 10 more than Bob's 20.", "10", False),
    ("The total is 30, which is 10 more than Bob's 20.", "20", False),
    ("She is 12 years old. Her brother is 15.", "15", False),  # about whom? refused
    ("It will take 6 days. After that, 2 more days for painting.", "2", False),
    ("Tom has 5 apples. He buys 3 more. Now he has 8 apples.", "8", True),
    ("Tom has 5 apples. He buys 3 more. Now he has 8 apples.", "3", False),
    ("x = 3 is the solution since 2(3) + 1 = 7.", "3", True),  # the reason is not the answer
    ("x = 3 is the solution since 2(3) + 1 = 7.", "7", False),
]


#: the shapes of Math-Verify's cases that were still refused, and an estimate in the answer's
#: sentence (a false 1 before): written apart from the corpus
MV_SHAPES_50 = [
    ('The final answer is "$7$ and $9$". I hope it is correct.', "7 \\text{ and } 9", True),
    ('The final answer is "$7$ and $9$". I hope it is correct.', "7", False),
    ("The answer is “$\\frac{2}{3}$”.", "\\frac23", True),
    ('The answer is "$12$", not "$13$".', "13", False),
    ("The range is $(-1, 4]$.", "-1 < g(t) \\le 4", True),
    ("The range is $(-1, 4]$.", "-1 \\le g(t) \\le 4", False),
    ("The range is $(-1, 4]$.", "-1 < s + t \\le 4", False),  # a sum, not a function's value
    ("The solutions are $x = 2, y = 1$; $x = -2, y = 1$.", "(2,1),(-2,1)", True),
    ("The solutions are $x = 2, y = 1$; $x = -2, y = 1$.", "(2,1)", False),
    ("The solutions are $x = 2, y = 1$; $x = -2, y = 1$.", "(1,2),(1,-2)", False),
    ("$(3,0),(0,3)$", "a=3,b=0;a=0,b=3", True),
    ("$(3,0),(0,3)$", "a=3,b=0;b=3,a=0", False),  # names in another order: refused, not guessed
    ("She has 12 apples, which is close to 10.", "10", False),
    ("She has 12 apples, which is close to 10.", "12", False),  # refused: cannot tell
    ("So the trip takes 12 hours. Give or take, 10.", "12", True),
    ("So the trip takes 12 hours. Give or take, 10.", "10", False),
]


@pytest.mark.parametrize(
    "text,gold,expected", PHRASINGS_50 + MARKED_SENTENCES_50 + SEVERAL_VALUES_50 + MV_SHAPES_50
)
def test_issue_50_forms_in_new_phrasings(text, gold, expected):
    """Pairs written apart from the corpus: paid exactly when ``expected``."""
    assert equivalent(extract_answer(text), gold_answer(gold)) is expected, extract_answer(text)
