"""Subsets of the real line in any notation, reduced to sorted, merged intervals.

``x < 2 or x > 3``, ``(-\\infty, 2) \\cup (3, \\infty)``, ``|2x - 5| > 1``, ``x \\neq 2``,
``-2 \\le x \\le 7``, ``\\mathbb{R}`` and finite sets such as ``\\{-2\\} \\cup \\{3\\}`` all
become a tuple of :class:`Span`. Only inequalities linear in one variable (or an absolute
value of such) are solved; anything else is not converted, and the caller falls back to
comparing structure.
"""

from __future__ import annotations

from dataclasses import dataclass

import mpmath
import sympy as sp
from grpo_core_plugins.rewards.math.nodes import Difference, Equation, Inequality, Seq, Union
from grpo_core_plugins.rewards.math.numeric import Undefined, Unsupported, approx, expressions_equal

MAX_SPANS = 64


@dataclass(frozen=True)
class Span:
    lo: object
    hi: object
    lo_closed: bool
    hi_closed: bool


class NotASet(ValueError):
    """The node is not a subset of the line we can read."""


_CTX = mpmath.MPContext()
_CTX.dps = 30


def _val(e) -> mpmath.mpf:
    if _is_inf(e):
        v = e.doit()
        if v == sp.oo:
            return _CTX.inf
        if v == -sp.oo:
            return -_CTX.inf
        raise NotASet("not a signed infinity")
    try:
        v = approx(e, _CTX, {}, [_CTX.mpf(0)])
    except (Undefined, Unsupported, ZeroDivisionError) as exc:
        raise NotASet(str(exc)) from exc
    if _CTX.im(v) != 0 or not _CTX.isfinite(v):
        raise NotASet("endpoint not a real number")
    return _CTX.re(v)


def _const(e) -> bool:
    return isinstance(e, sp.Basic) and not isinstance(e, sp.MatrixBase) and not e.free_symbols


def _is_inf(e) -> bool:
    return isinstance(e, sp.Basic) and e.has(sp.oo, sp.S.NegativeInfinity)


def _infinity(e):
    if not _is_inf(e):
        return e
    return sp.oo if _val(e) > 0 else -sp.oo


def _whole() -> tuple[Span, ...]:
    return (Span(-sp.oo, sp.oo, False, False),)


def _ray(var_op: str, c) -> tuple[Span, ...]:
    """The solutions of ``x var_op c``."""
    c = _infinity(c)
    if var_op == "<":
        return (Span(-sp.oo, c, False, False),)
    if var_op == "<=":
        return (Span(-sp.oo, c, False, True),)
    if var_op == ">":
        return (Span(c, sp.oo, False, False),)
    if var_op == ">=":
        return (Span(c, sp.oo, True, False),)
    return (Span(-sp.oo, c, False, False), Span(c, sp.oo, False, False))  # !=


_FLIP = {"<": ">", ">": "<", "<=": ">=", ">=": "<=", "!=": "!="}


def _linear(f, var) -> tuple:
    """``f = k*var + m`` with constant k != 0, else NotASet. Checked by value at sample
    points (bounded work, no expansion): ``(x+1)^{9000} > 0`` is refused in microseconds."""
    m = f.xreplace({var: sp.Integer(0)})
    k = sp.Add(f.xreplace({var: sp.Integer(1)}), sp.Mul(-1, m, evaluate=False), evaluate=False)
    for t in (sp.Integer(2), sp.Rational(-3, 7), sp.Rational(5, 3)):
        line = sp.Add(sp.Mul(k, t, evaluate=False), m, evaluate=False)
        if not expressions_equal(f.xreplace({var: t}), line):
            raise NotASet("not linear")
    if _val(k) == 0:
        raise NotASet("no variable")
    return k, m


def _solve(lhs, op: str, rhs, var) -> tuple[Span, ...]:
    """Solutions of ``lhs op rhs`` in ``var``: linear, or |linear| against a constant."""
    if lhs == var and _const(rhs):
        return _ray(op, rhs)
    if rhs == var and _const(lhs):
        return _ray(_FLIP[op], lhs)
    for a, o, b in ((lhs, op, rhs), (rhs, _FLIP[op], lhs)):
        if isinstance(a, sp.Abs) and _const(b) and o != "!=":
            inner = a.args[0]
            c = b
            if _val(c) < 0 or (_val(c) == 0 and o == "<"):
                return () if o in ("<", "<=") else _whole()
            inside = _intersect(
                _solve(inner, ">" if o == "<" else ">=", -c, var), _solve(inner, o, c, var)
            )
            if o in ("<", "<="):
                return inside
            outside_op = "<" if o == ">" else "<="
            return _merge(_solve(inner, outside_op, -c, var) + _solve(inner, o, c, var))
    k, m = _linear(sp.Add(lhs, -rhs), var)
    bound = sp.Mul(-1, m, sp.Pow(k, -1, evaluate=False), evaluate=False)
    return _ray(op if _val(k) > 0 else _FLIP[op], bound)


def _later_start(s: Span, t: Span) -> tuple:
    vs, vt = _val(s.lo), _val(t.lo)
    if vs > vt or (vs == vt and not s.lo_closed):
        return s.lo, s.lo_closed
    return t.lo, t.lo_closed


def _earlier_end(s: Span, t: Span) -> tuple:
    vs, vt = _val(s.hi), _val(t.hi)
    if vs < vt or (vs == vt and not s.hi_closed):
        return s.hi, s.hi_closed
    return t.hi, t.hi_closed


def _intersect(a: tuple[Span, ...], b: tuple[Span, ...]) -> tuple[Span, ...]:
    out = []
    for s in a:
        for t in b:
            lo, lo_c = _later_start(s, t)
            hi, hi_c = _earlier_end(s, t)
            if _val(lo) < _val(hi) or (_val(lo) == _val(hi) and lo_c and hi_c):
                out.append(Span(lo, hi, lo_c, hi_c))
    return _merge(tuple(out))


def _merge(spans: tuple[Span, ...]) -> tuple[Span, ...]:
    if len(spans) > MAX_SPANS:
        raise NotASet("too many pieces")
    ordered = sorted(spans, key=lambda s: (_val(s.lo), not s.lo_closed))
    out: list[Span] = []
    for s in ordered:
        if out:
            cur = out[-1]
            gap = _val(s.lo) - _val(cur.hi)
            if gap < 0 or (gap == 0 and (cur.hi_closed or s.lo_closed)):
                if _val(s.hi) > _val(cur.hi) or (_val(s.hi) == _val(cur.hi) and s.hi_closed):
                    out[-1] = Span(cur.lo, s.hi, cur.lo_closed, s.hi_closed)
                continue
        out.append(s)
    return tuple(out)


def _complement(spans: tuple[Span, ...]) -> tuple[Span, ...]:
    """The rest of the line: the gaps between merged, sorted spans."""
    out = []
    lo, lo_closed = -sp.oo, False
    for s in spans:
        if _val(s.lo) > _val(lo) or _val(s.lo) == _val(lo) and lo_closed and not s.lo_closed:
            out.append(Span(lo, s.lo, lo_closed, not s.lo_closed))
        lo, lo_closed = s.hi, not s.hi_closed
    if not _is_inf(lo) or _val(lo) < 0:
        out.append(Span(lo, sp.oo, lo_closed, False))
    return tuple(out)


def to_spans(node, var=None) -> tuple[Span, ...]:
    """The subset of the line that ``node`` denotes; NotASet when it is not one we read."""
    if isinstance(node, Difference):  # \mathbb{R} \setminus \{0\}
        return _intersect(to_spans(node.left, var), _complement(to_spans(node.right, var)))
    if isinstance(node, Union):
        return _merge(tuple(s for part in node.parts for s in to_spans(part, var)))
    if isinstance(node, Inequality):
        return _inequality_spans(node)
    if isinstance(node, Equation) and isinstance(node.lhs, sp.Symbol) and _const(node.rhs):
        return (Span(node.rhs, node.rhs, True, True),)  # x = 3 inside a list of solutions
    if isinstance(node, Seq):
        return _seq_spans(node, var)
    if _const(node):
        if _is_inf(node):
            raise NotASet("infinity is not a point")
        return (Span(node, node, True, True),)
    raise NotASet(type(node).__name__)


def _inequality_spans(node: Inequality) -> tuple[Span, ...]:
    """A chain ``a op b op c`` in one variable: the intersection of its links' solutions."""
    if not all(isinstance(s, sp.Basic) for s in node.sides):
        raise NotASet("not an inequality in one variable")
    node = _range_of(node)
    syms = set().union(*(s.free_symbols for s in node.sides))
    if len(syms) != 1:
        raise NotASet("not an inequality in one variable")
    (v,) = syms
    out = _whole()
    for a, op, b in zip(node.sides, node.ops, node.sides[1:]):
        out = _intersect(out, _solve(a, op, b, v))
    return out


def _range_of(node: Inequality) -> Inequality:
    """``0 < f(x) < 1`` (a function's value between two constants; the parser reads ``f(x)``
    as the product ``f*x``) bounds that value: the chain on one fresh variable, so it
    reads as the interval ``(0, 1)``. Anything else unchanged."""
    lo, mid, hi = node.sides if len(node.sides) == 3 else (None, None, None)
    if mid is None or not (_const(lo) and _const(hi)):
        return node
    if not (isinstance(mid, sp.Mul) and all(isinstance(a, sp.Symbol) for a in mid.args)):
        return node  # x + y, 2x: not a function's value
    return Inequality((lo, sp.Dummy("t"), hi), node.ops)


def _seq_spans(node: Seq, var) -> tuple[Span, ...]:
    """An interval ``(a, b]``, or a list or set of pieces; a tuple is not a set."""
    if (
        node.open in "(["
        and node.close in ")]"
        and node.open
        and len(node.items) == 2
        and all(_const(x) for x in node.items)
    ):
        return _interval(node)
    if node.open in ("", "{"):
        return _pieces(node, var)
    raise NotASet("a tuple")


def _interval(node: Seq) -> tuple[Span, ...]:
    """``(a, b)``, ``[a, b)``, ...: an infinite end is always open; ``a > b`` is refused."""
    lo, hi = (_infinity(x) for x in node.items)
    if _val(lo) > _val(hi):
        raise NotASet("empty interval")
    return (
        Span(lo, hi, node.open == "[" and not _is_inf(lo), node.close == "]" and not _is_inf(hi)),
    )


def _pieces(node: Seq, var) -> tuple[Span, ...]:
    """A list or set of subsets: their union, or, for inequalities joined by "and", their
    (nonempty) intersection."""
    parts = [to_spans(x, var) for x in node.items]
    if node.joiner == "and" and any(isinstance(x, Inequality) for x in node.items):
        out = _whole()
        for p in parts:
            out = _intersect(out, p)
        if not out:
            raise NotASet("empty intersection")
        return out
    return _merge(tuple(s for p in parts for s in p))


def spans_equal(a: tuple[Span, ...], b: tuple[Span, ...], tol: float = 0.0) -> bool:
    if len(a) != len(b):
        return False
    for s, t in zip(a, b):
        if (s.lo_closed, s.hi_closed) != (t.lo_closed, t.hi_closed):
            return False
        for x, y in ((s.lo, t.lo), (s.hi, t.hi)):
            if _is_inf(x) or _is_inf(y):
                if not (_is_inf(x) and _is_inf(y) and _val(x) == _val(y)):
                    return False
            elif not expressions_equal(x, y, tol):
                return False
    return True


def setlike(node) -> bool:
    """Written as a set of reals: an inequality, a union, or a list joined by and/or."""
    if isinstance(node, (Inequality, Union, Difference)):
        return True
    return (
        isinstance(node, Seq)
        and node.open == ""
        and any(isinstance(x, (Inequality, Union)) for x in node.items)
    )
