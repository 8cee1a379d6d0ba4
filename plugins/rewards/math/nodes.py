"""What the parser builds besides sympy expressions, and the bounded number constructors."""

from __future__ import annotations

from dataclasses import dataclass, field

import sympy as sp

MAX_DEPTH = 60
MAX_EXPONENT = 10_000
MAX_FACTORIAL = 1_000
MAX_DIGITS = 400
MAX_ITEMS = 256


class ParseError(ValueError):
    """The text is not math we accept (or exceeds a bound)."""


@dataclass(frozen=True)
class Seq:
    """A bracketed or bare list: ``open``/``close`` are '(', '[', '{', '' (bare).

    ``joiner`` says how a bare list was written: ',' , 'or', 'and' (prose lists).
    """

    items: tuple
    open: str
    close: str
    joiner: str = ","


@dataclass(frozen=True)
class Equation:
    """``lhs = rhs``; ``named`` when the answer is the right side only: a chain
    ``a = b = c`` (kept as a = c) or a named quantity such as ``\\angle PQR = 40``."""

    lhs: object
    rhs: object
    named: bool = False


@dataclass(frozen=True)
class Inequality:
    """``sides[0] ops[0] sides[1] ops[1] ...`` with ops among < <= > >= !=."""

    sides: tuple
    ops: tuple


@dataclass(frozen=True)
class Union:
    parts: tuple


@dataclass(frozen=True)
class Difference:
    """``left \\setminus right``: a subset of the line with points or intervals taken out."""

    left: object
    right: object


@dataclass(frozen=True)
class Text:
    """A word answer, compared lower-cased; ``raw`` keeps the spelling (``AB`` is A*B in
    arithmetic)."""

    value: str
    raw: str = field(default="", compare=False)


NAMED = Text("?")  # the left side of a named quantity we did not need to read


def as_expr(node):
    """``node`` as a sympy expression, or ParseError for a list, equation or long word."""
    if (
        isinstance(node, Text)
        and 2 <= len(node.raw) <= 3
        and node.raw.isalpha()
        and node.raw.isascii()
        and node.raw not in ("and", "or")
    ):
        return sp.Mul(*[sp.Symbol(c) for c in node.raw], evaluate=False)  # 2ab is 2*a*b
    if isinstance(node, (Seq, Equation, Union, Text, Inequality, Difference)):
        raise ParseError("a list, equation or word cannot be used inside arithmetic")
    return node


def number(text: str):
    digits = len(text.replace(".", ""))
    if digits > MAX_DIGITS:
        raise ParseError("number too long")
    if "e" in text.lower() or "." in text:
        mant, _, exp = text.lower().partition("e")
        if exp and abs(int(exp)) > MAX_EXPONENT:
            raise ParseError("exponent too large")
        return sp.Rational(mant if mant != "." else "0") * sp.Rational(10) ** int(exp or 0)
    return sp.Integer(text)


def magnitude(x) -> float | None:
    """|x| as a float when x is a plain number (no symbols), else None; bounded work."""
    if x.free_symbols:
        return None
    from grpo_core_plugins.rewards.math.numeric import approx, low_precision

    ctx = low_precision()
    try:
        v = abs(approx(x, ctx, {}, [ctx.mpf(0)]))
    except (ArithmeticError, TypeError, ValueError):
        return None
    return float(v) if ctx.isfinite(v) and v < 1e300 else float("inf")


def power(base, exp):
    """``base^exp`` with the exponent bounded; a constant rational exponent is folded
    (``x^{2/3}`` is x to the 2/3, so a negative x has the real cube root squared)."""
    if isinstance(exp, sp.Rational):
        if abs(exp) > MAX_EXPONENT:
            raise ParseError("exponent too large")
    elif not exp.free_symbols:
        m = magnitude(exp)
        if m is None or m > MAX_EXPONENT:
            raise ParseError("exponent too large")
        from grpo_core_plugins.rewards.math.numeric import exact

        q = exact(exp)
        if q is not None:
            exp = sp.Rational(q.numerator, q.denominator)
    return sp.Pow(base, exp, evaluate=False)


def factorial(n):
    m = magnitude(n)
    if m is None or m > MAX_FACTORIAL:
        raise ParseError("factorial too large or not a number")
    return sp.factorial(n, evaluate=False)
