"""Is a predicted answer equivalent to the gold one?

Rules: exact rationals; decimals exact unless ``rel_tol`` > 0; closed forms equal to 50
digits; expressions with symbols equal at random rational points; sets and bare lists
order-insensitive; tuples, points and intervals ordered with their brackets; ``x = 3``
matches ``3``; ``a \\pm b`` is the set {a+b, a-b}; a percent matches with or without ``%``.
"""

from __future__ import annotations

import random
import re
from functools import lru_cache

import sympy as sp
from grpo_core_plugins.math_reward.parse import Equation, ParseError, Seq, Text, Union, parse

PRECISION = 50
#: what parsing or comparing hostile text may raise; each such item simply does not match
FAILURES = (ParseError, RecursionError, TypeError, ValueError, AttributeError,
            ZeroDivisionError, OverflowError)


@lru_cache(maxsize=4096)
def parse_cached(text: str, max_length: int):
    """Gold answers repeat G times per prompt and across steps: parse each once."""
    return parse(text, max_length)


def _squash(s: str) -> str:
    return re.sub(r"\s+", "", s)


def _variants(text: str) -> list[str]:
    if "%" in text:
        return [text, text.replace("\\%", "").replace("%", "")]
    return [text]


def equivalent(pred: str | None, gold: str, rel_tol: float = 0.0, max_length: int = 2000) -> bool:
    if pred is None or not pred.strip():
        return False
    if _squash(pred) == _squash(gold):
        return True
    for g_text in _variants(gold):
        try:
            g = parse_cached(g_text, max_length)
        except FAILURES:
            continue
        for p_text in _variants(pred):
            try:
                if same(parse(p_text, max_length), g, rel_tol):
                    return True
            except FAILURES:
                continue
    return False


def _is_name(x) -> bool:
    return isinstance(x, sp.Symbol)


def same(p, g, tol: float = 0.0) -> bool:
    """Structural comparison of parsed answers, numbers and expressions by value."""
    if isinstance(p, Equation) and isinstance(g, Equation):
        if same(p.lhs, g.lhs, tol) and same(p.rhs, g.rhs, tol):
            return True
        if all(isinstance(x, sp.Basic) for x in (p.lhs, p.rhs, g.lhs, g.rhs)):
            return _expr_equal(p.lhs - p.rhs, g.lhs - g.rhs, tol) or \
                _expr_equal(p.lhs - p.rhs, g.rhs - g.lhs, tol)
        return False
    if isinstance(p, Equation) and _is_name(p.lhs):
        return same(p.rhs, g, tol)
    if isinstance(g, Equation) and _is_name(g.lhs):
        return same(p, g.rhs, tol)
    if isinstance(p, Seq) or isinstance(g, Seq):
        return _seq_equal(_as_seq(p), _as_seq(g), tol)
    if isinstance(p, Union) or isinstance(g, Union):
        if not (isinstance(p, Union) and isinstance(g, Union)):
            return False
        return _unordered(list(p.parts), list(g.parts), tol)
    if isinstance(p, Text) or isinstance(g, Text):
        return isinstance(p, Text) and isinstance(g, Text) and p.value == g.value
    if isinstance(p, sp.MatrixBase) or isinstance(g, sp.MatrixBase):
        return (isinstance(p, sp.MatrixBase) and isinstance(g, sp.MatrixBase)
                and p.shape == g.shape and all(_expr_equal(a, b, tol) for a, b in zip(p, g)))
    if isinstance(p, sp.core.relational.Relational) or isinstance(g, sp.core.relational.Relational):
        return type(p) is type(g) and _expr_equal(p.lhs, g.lhs, tol) and \
            _expr_equal(p.rhs, g.rhs, tol)
    return _expr_equal(p, g, tol)


def _as_seq(x) -> Seq:
    if isinstance(x, Seq):
        return x
    return Seq((x,), "", "")


def _seq_equal(p: Seq, g: Seq, tol: float) -> bool:
    if len(p.items) != len(g.items):
        return False
    unordered = {"", "{"}
    if p.open in unordered and g.open in unordered:
        return _unordered(list(p.items), list(g.items), tol)
    if (p.open, p.close) != (g.open, g.close):
        return False
    return all(same(a, b, tol) for a, b in zip(p.items, g.items))


def _unordered(ps: list, gs: list, tol: float) -> bool:
    if len(ps) != len(gs):
        return False
    left = list(gs)
    for a in ps:
        for j, b in enumerate(left):
            if same(a, b, tol):
                del left[j]
                break
        else:
            return False
    return True


def _number(x):
    if x.has(sp.oo, sp.zoo, sp.nan):  # evalf mishandles unevaluated products with infinity
        x = x.doit()
    v = sp.N(x, PRECISION, maxn=200)
    return v if v.is_number else None


def _close(a, b, tol: float) -> bool:
    if a == b:
        return True
    if a.has(sp.oo, -sp.oo, sp.zoo, sp.nan) or b.has(sp.oo, -sp.oo, sp.zoo, sp.nan):
        return False
    diff = abs(complex(a - b))
    scale = max(abs(complex(b)), 1e-300)
    if tol > 0:
        return diff <= tol * scale
    return diff <= 10 ** -(PRECISION - 10) * max(scale, 1.0)


def _expr_equal(a, b, tol: float) -> bool:
    if not isinstance(a, sp.Basic) or not isinstance(b, sp.Basic):
        return False
    if a == b:
        return True
    if a.free_symbols != b.free_symbols:
        return False
    if not a.free_symbols:
        va, vb = _number(a), _number(b)
        if va is None or vb is None:
            return False
        return _close(va, vb, tol)
    rng = random.Random(0)
    syms = sorted(a.free_symbols, key=str)
    for _ in range(3):
        point = {s: sp.Rational(rng.randint(1, 97), rng.randint(1, 13)) for s in syms}
        va, vb = _number(a.xreplace(point)), _number(b.xreplace(point))
        if va is None or vb is None or not _close(va, vb, tol):
            return False
    return True
