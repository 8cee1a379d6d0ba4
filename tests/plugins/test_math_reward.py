"""The math reward: extraction, comparison rules, strict mode, time budget, no code execution."""

from __future__ import annotations

import os
import threading
import time

import pytest
from grpo_core_plugins.rewards.math.compare import equivalent
from grpo_core_plugins.rewards.math.extract import extract_answer, gold_answer
from grpo_core_plugins.rewards.math.parse import ParseError, parse

import grpo_core

EXTRACT = [
    ("so it is \\boxed{\\frac{1}{2}}.", "\\frac{1}{2}"),
    ("\\boxed{a} then \\boxed{\\sqrt{\\frac{1}{\\{2\\}}}}", "\\sqrt{\\frac{1}{\\{2\\}}}"),
    ("\\fbox{42}", "42"),
    ("\\boxed 7 is it", "7"),
    ("work...\n#### 1,234", "1,234"),
    ("Final Answer: $\\frac{3}{4}$", "\\frac{3}{4}"),
    ("The final answer is 12. I hope", "12"),
    ("Thus, the answer is: 7.", "7"),
    ("Q: what\nA: 12", "12"),
    ("we get **42** apples", "42"),
    ("after 3 steps we have 17 left", "17"),
    ("-3.5", "-3.5"),
    ("<think>2+2</think><answer> 4 </answer>", "4"),
    ("<answer>so the answer is 12, as computed above in the long reasoning</answer>", "12"),
]


@pytest.mark.parametrize("text,expected", EXTRACT)
def test_extraction(text, expected):
    assert extract_answer(text) == expected


def test_extraction_negative_and_strict():
    assert extract_answer("no numbers here") is None
    assert extract_answer("") is None
    assert extract_answer("\\boxed{unclosed") is None  # unclosed brace, nothing else answer-like
    assert extract_answer("after 3 steps we have 17 left", strict=True) is None
    assert extract_answer("17", strict=True) == "17"  # a bare number is unambiguous
    assert extract_answer("the answer is 5", strict=True) == "5"


def test_gold_reduction():
    assert gold_answer("Janet sells 16 - 3 - 4 = <<16-3-4=9>>9 eggs.\n#### 18") == "18"
    assert gold_answer("So $x = \\boxed{\\frac{5}{2}}$.") == "\\frac{5}{2}"
    assert gold_answer(" 7 ") == "7"
    # reduced the way a completion is (#31): delimiters, several boxes, a one-line solution
    assert gold_answer("$$\\frac{1}{2}$$") == "\\frac{1}{2}" and gold_answer("\\(12\\)") == "12"
    assert gold_answer("$\\boxed{-2}$ and $\\boxed{3}$") == "-2, 3"
    assert gold_answer("$12\\text{ cm}$") == "12\\text{ cm}" and gold_answer("\\$5") == "\\$5"
    solution = (
        "Since the stock lost $10\\%$ on Monday and then another $20\\%$ of what was "
        "left, its value was multiplied by $0.9 \\cdot 0.8 = 0.72$, a loss of $28\\%$."
    )
    assert gold_answer(solution) == "28\\%"


def test_an_equation_equal_to_zero_is_not_the_value_zero():
    """A plane ``5x - 7y + 11z + 4 = 0`` is no answer 0; ``a + b + c = 10`` states 10 (#31)."""
    assert not equivalent("5x - 7y + 11z + 4 = 0", "0") and not equivalent("x + 1 = 0", "0")
    assert equivalent("a + b + c = 10", "10") and equivalent("f(0) = 0", "0")


def test_digits_split_by_a_space_are_refused():
    """``4 4/0`` is neither 16/0 nor 4, and ``3 5/4`` is no mixed number (#31)."""
    for text in ("4 4/0", "3 5/4", "2 3", "10 00", "3 0/5"):
        with pytest.raises(ParseError):
            parse(text)
    assert parse("1 000") == 1000 and parse("\\log_3 9") is not None


EQUAL = [
    ("\\frac{1}{2}", "0.5"),
    ("\\dfrac{3}{4}", "\\frac34"),
    ("\\tfrac{3}{4}", "0.75"),
    ("x=3", "3"),
    ("3", "x = 3"),
    ("(1,2]", "(1,2]"),
    ("\\{2,1\\}", "\\{1,2\\}"),
    ("1, 2", "2, 1"),
    ("2\\pm\\sqrt3", "2+\\sqrt{3}, 2-\\sqrt{3}"),
    ("50\\%", "50"),
    ("50%", "0.5"),
    ("1,000,000", "1000000"),
    ("\\sqrt{2}/2", "\\frac{1}{\\sqrt2}"),
    ("x^2+2x+1", "(x+1)^2"),
    ("10 \\text{ cm}", "10"),
    ("10 cm", "10"),
    ("90^\\circ", "90"),
    ("90°", "90"),
    (
        "\\begin{pmatrix} 1 & 2 \\\\ 3 & 4 \\end{pmatrix}",
        "\\begin{pmatrix}1&2\\\\3&4\\end{pmatrix}",
    ),
    ("\\infty", "\\infty"),
    ("(-\\infty, 3)", "(-\\infty,3)"),
    ("−5", "-5"),
    ("½", "1/2"),
    ("x²", "x^2"),
    ("１２", "12"),
    ("√2", "\\sqrt{2}"),
    ("π", "\\pi"),
    ("2π", "2\\pi"),
    ("1.2e3", "1200"),
    ("1.2\\times10^{3}", "1200"),
    ("\\text{Monday}", "Monday"),
    ("[1,2)\\cup(3,4]", "[1,2) \\cup (3,4]"),
    ("\\left(3, 4\\right)", "(3,4)"),
    ("y = 2x + 3", "y=3+2x"),
    ("\\frac{\\sqrt{3}}{2}", "\\sin(\\pi/3)"),
    ("4!", "24"),
    ("\\binom{5}{2}", "10"),
    ("2^{10}", "1024"),
    ("-\\frac{1}{3}", "\\frac{-1}{3}"),
    ("\\text{(C)}", "C"),
    ("3.0", "3"),
    ("0.1 + 0.2", "0.3"),
]

NOT_EQUAL = [
    ("0.333", "\\frac13"),
    ("3.14", "\\pi"),
    ("(1,2)", "(1,2]"),
    ("(2,1)", "(1,2)"),
    ("x^2+2x", "(x+1)^2"),
    ("2", "3"),
    ("x", "y"),
    ("1, 2", "1, 2, 3"),
    ("\\begin{pmatrix}1&2\\end{pmatrix}", "\\begin{pmatrix}1\\\\2\\end{pmatrix}"),
    ("\\infty", "-\\infty"),
    ("Monday", "Tuesday"),
    ("[1,2)", "[1,2]"),
    ("-5", "5"),
    ("\\sqrt{2}", "1.41421356"),
    ("", "3"),
]


@pytest.mark.parametrize("pred,gold", EQUAL)
def test_equivalent(pred, gold):
    assert equivalent(pred, gold)


@pytest.mark.parametrize("pred,gold", NOT_EQUAL)
def test_not_equivalent(pred, gold):
    assert not equivalent(pred, gold)


FAST = [
    "3",
    "-3",
    "3.0",
    "1,234",
    "1234",
    "10,\\!080",
    "10{,}080",
    "\\frac{3}{4}",
    "\\dfrac34",
    "0.75",
    "3/4",
    "-\\frac{3}{4}",
    "3\\frac{1}{2}",
    "3.5",
    "2\\frac{5}{4}",
    "2e3",
    "2000",
    "1/0",
    "\\frac{1}{0}",
    "12 \\frac{3}{5}",
    "12.6",
]


def test_fast_path_agrees_with_the_parser():
    from grpo_core_plugins.rewards.math.verify import Verifier

    v = Verifier.__new__(Verifier)  # the in-process path only: no worker pool
    v.rel_tol, v.max_length, v.cache, v.cache_lock = 0.0, 2000, {}, threading.Lock()
    decided = 0
    for p in FAST:
        for g in FAST:
            fast = v.fast(p, g)
            if fast is not None:
                decided += 1
                assert fast == equivalent(p, g), (p, g)
    assert decided > len(FAST) ** 2 // 2


def test_relative_tolerance_is_opt_in():
    assert not equivalent("3.1416", "\\pi")
    assert equivalent("3.1416", "\\pi", rel_tol=1e-4)
    assert not equivalent("3.2", "\\pi", rel_tol=1e-4)


def test_parser_bounds():
    for text in [
        "2^{100000}",
        "10^{10^{10}}",
        "5000!",
        "(" * 100 + "1" + ")" * 100,
        "1" * 500,
        "x" * 3000,
    ]:
        with pytest.raises(ParseError):
            parse(text)


def reward(**opts):
    return grpo_core.create("reward", "math", opts)


def test_reward_scores_and_extras():
    r = reward()
    out = r(["q"] * 4, ["\\boxed{4}", "it is 5", "#### 4.0", "none"], answer=["4"] * 4)
    assert list(out) == [1.0, 0.0, 1.0, 0.0]
    assert out.extras["extracted"] == ["4", "5", "4.0", None]
    worked = r(["q"], ["\\boxed{\\frac{9}{2}}"], answer=["so it is \\boxed{4.5}"])
    assert list(worked) == [1.0]
    other = reward(answer_column="solution")
    assert list(other(["q"], ["7"], solution=["#### 7"])) == [1.0]
    with pytest.raises(KeyError, match="answer"):
        r(["q"], ["7"])


HOSTILE = [
    "\\boxed{" + "9" * 300 + "^{" + "9" * 300 + "^{" + "9" * 300 + "}}}",
    "\\boxed{" + "(" * 10_000 + "1" + ")" * 10_000 + "}",
    "\\boxed{" + "{" * 10_000 + "}" * 10_000 + "}",
    "x" * 1_000_000,
    "\\boxed{99999!}",
    "\\boxed{2^{2^{2^{2^{2^{2^{2}}}}}}}",
    "\\boxed{\\frac{x^{999}+1}{x+1} - (x^{998} - x^{997} + x)}",
    "\\boxed{__import__('os').system('touch /tmp/pwned')}",
    "\\boxed{(x+1)^{9000} > 0}",  # an inequality is solved by value, never by expansion
    "\\boxed{|(x+1)^{5000} - x| < 2^{10000}}",
    "\\boxed{\\sin(10^{9999}) + e^{e^{e^{10}}}}",
    "\\boxed{" + "\\pm 1" * 40 + "}",
    "\\boxed{" + "\\frac{1}{" * 40 + "x" + "}" * 40 + "}",
]


def test_hostile_inputs_score_zero_within_budget_from_a_thread():
    r = reward(timeout=1.0)
    result = {}

    def work():
        t0 = time.monotonic()
        result["scores"] = list(r(["q"] * len(HOSTILE), HOSTILE, answer=["2"] * len(HOSTILE)))
        result["seconds"] = time.monotonic() - t0

    t = threading.Thread(target=work)  # not the main thread: no signal-based timeout works here
    t.start()
    t.join(timeout=600)  # a hang guard (ten minutes), not a bound on speed
    assert not t.is_alive()
    assert result["scores"] == [0.0] * len(HOSTILE)
    # the work: each item cut at most once at its budget (its worker killed), none retried
    assert r.verifier.timeouts <= len(HOSTILE)


def test_slow_symbolic_item_is_cut_at_the_budget():
    r = reward(timeout=0.5, workers=1)
    r.verifier.fast("1", "1")  # pool not started by the fast path
    slow = "\\boxed{(x+1)^{9000} - (x-1)^{9000}}"
    assert list(r(["q"], ["\\boxed{x+1}"], answer=["1+x"])) == [1.0]  # starts the worker
    assert r.verifier.timeouts == 0
    assert list(r(["q"], [slow], answer=["x"])) == [0.0]
    # refused before expanding (the parser's bounds) or cut at the budget once (its worker
    # killed and replaced), where the expansion left alone runs for minutes; then served again
    assert r.verifier.timeouts <= 1
    assert list(r(["q"], ["\\boxed{x+1}"], answer=["1+x"])) == [1.0]


INJECTIONS = [
    "__import__('os').system('touch {f}')",
    "\\boxed{{__import__('os').system('touch {f}')}}",
    "\\boxed{{exec(\"open('{f}','w')\")}}",
    '\\boxed{{eval(\'open("{f}","w")\')}}',
    "\\boxed{{().__class__.__bases__[0].__subclasses__()}}",
    "\\boxed{{lambda: open('{f}','w')}}",
    "\\boxed{{Symbol('x').__init__.__globals__}}",
]


def test_injection_strings_never_run(tmp_path):
    marker = tmp_path / "pwned"
    texts = [t.format(f=marker) for t in INJECTIONS]
    scores = reward()(["q"] * len(texts), texts, answer=["1"] * len(texts))
    assert list(scores) == [0.0] * len(texts)
    for t in texts:  # and straight through the comparison, both ways
        assert not equivalent(t, "1") and not equivalent("1", t)
    assert not marker.exists()
    assert not os.path.exists("/tmp/pwned")
