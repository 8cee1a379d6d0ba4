"""Is a predicted answer equivalent to the gold one?

Rules: exact rationals compare exactly; decimals are exact unless ``rel_tol`` > 0; closed
forms and identities by value (:mod:`numeric`); expressions with symbols at signed,
fractional sample points; sets and bare lists order-insensitive; tuples, points and
intervals ordered with their brackets; subsets of the line in any notation (intervals,
unions, inequalities, ``|x - a| < b``, ``\\mathbb{R}``) as merged intervals
(:mod:`intervals`); ``x = 3`` and ``AB = 3`` match ``3``, and in a chain ``a = b = c`` the
last side is the answer; ``a \\pm b`` is the set {a+b, a-b}; a percent matches with or
without ``%`` (but two percents only as written); a unit on one side is ignored, but
different units on both sides are wrong. Equations in variables are equal up to a constant
factor; solution lists ignore repeats; ``x = 2, y = 5`` is the point ``(2, 5)``.
"""

from __future__ import annotations

import re
from functools import lru_cache

import sympy as sp
from grpo_core_plugins.rewards.math.intervals import setlike, spans_equal, to_spans
from grpo_core_plugins.rewards.math.nodes import Equation, Inequality, ParseError, Seq, Text, Union
from grpo_core_plugins.rewards.math.numbers import plain_number
from grpo_core_plugins.rewards.math.numeric import _points, exact, expressions_equal
from grpo_core_plugins.rewards.math.parse import parse
from grpo_core_plugins.rewards.math.units import conflict, split_unit

#: what parsing or comparing hostile text may raise; each such item simply does not match
FAILURES = (
    ParseError,
    RecursionError,
    TypeError,
    ValueError,
    AttributeError,
    ArithmeticError,
    IndexError,
    KeyError,
    sp.polys.polyerrors.BasePolynomialError,
)


@lru_cache(maxsize=4096)
def parse_cached(text: str, max_length: int):
    """Gold answers repeat G times per prompt and across steps: parse each once."""
    return parse(text, max_length)


#: one number with a decimal comma: not a three-digit group (1,220 is a thousand two hundred
#: and twenty), and 0,111 cannot be one
_DECIMAL_COMMA = re.compile(r"-?(?:(?:\d{1,3}(?: \d{3})+|\d+),(?:\d{1,2}|\d{4,})|0,\d+)")


_CLOCK = re.compile(
    r"\s*(\d{1,2})\s*:\s*(\d{2})\s*(?:\\text\s*\{\s*)?(?:([ap])\.?\s?m\.?)?\s*\}?\s*\.?\s*",
    re.IGNORECASE,
)


def _clock(s: str) -> tuple[int, int, str | None] | None:
    """``3:45 PM`` -> (3, 45, 'p'), ``15:45`` -> (15, 45, None); None when not a time of day."""
    m = _CLOCK.fullmatch(s.replace("$", ""))
    if not m or int(m.group(2)) > 59 or int(m.group(1)) > 23:
        return None
    meridiem = m.group(3).lower() if m.group(3) else None
    if meridiem and not 1 <= int(m.group(1)) <= 12:
        return None  # 15:45 PM is no time
    return int(m.group(1)), int(m.group(2)), meridiem


def _clocks(pred: str, gold: str) -> bool | None:
    """Two times of day: equal as written with their a.m./p.m.; a 24-hour time (``15:45``)
    is converted against a 12-hour one (``3:45 PM``); a time without a.m./p.m. in 1-12 matches
    either. None when one side is no time of day (then they are compared as ratios)."""
    p, g = _clock(pred), _clock(gold)
    if p is None or g is None:
        return None
    if p[2] and g[2]:
        return p == g
    if not p[2] and not g[2]:
        return p[:2] == g[:2]
    bare, marked = (p, g) if g[2] else (g, p)
    if 1 <= bare[0] <= 12:
        return bare[:2] == marked[:2]  # 4:30 against 4:30 p.m.: the meridiem left out
    hour = marked[0] % 12 + (12 if marked[2] == "p" else 0)
    return (hour, marked[1]) == bare[:2]


def _squash(s: str) -> str:
    """``s`` without its spaces, except one between two digits (``10 00`` is not ``1000``)."""
    return re.sub(r"(?<!\d)\s+|\s+(?!\d)", "", s)


def _variants(text: str, other: str) -> list[str]:
    """``50\\%`` is 50 and 0.5 against a gold without a percent sign; when both sides carry
    one, only as written (``0.05\\%`` is not ``5\\%``)."""
    if "%" in text and "%" not in other:
        return [text, text.replace("\\%", "").replace("%", "")]
    return [text]


def _forms(text: str, other: str, max_length: int, cached: bool) -> list:
    out = []
    for variant in _variants(text, other):
        try:
            out.append(parse_cached(variant, max_length) if cached else parse(variant, max_length))
        except FAILURES:
            continue
    return out


def equivalent(pred: str | None, gold: str, rel_tol: float = 0.0, max_length: int = 2000) -> bool:
    """True when ``pred`` states the same answer as ``gold``; any doubt or failure is False."""
    if pred is None or not pred.strip() or len(pred) > max_length:
        return False
    if _squash(pred) == _squash(gold):
        return True
    clock = _clocks(pred, gold)
    if clock is not None:
        return clock
    p_text, p_unit = split_unit(pred)
    g_text, g_unit = split_unit(gold)
    p_text, g_text = _decimal_comma(p_text, g_text), _decimal_comma(g_text, p_text)
    if conflict(p_unit, g_unit):
        return False  # 5 cm is not 5 m
    if not p_text.strip() or not g_text.strip():
        return False
    if _squash(p_text) == _squash(g_text):
        return True
    golds = _forms(g_text, p_text, max_length, cached=True)
    if not golds:
        return False
    for p in _forms(p_text, g_text, max_length, cached=False):
        for g in golds:
            try:
                if same(p, g, rel_tol):
                    return True
            except FAILURES:
                continue
    return False


def _decimal_comma(pred: str, gold: str) -> str:
    """``1,22`` (or ``1 234,5``) against one number without a comma (on the other side): a
    decimal comma, read as a point; anything else unchanged."""
    one_number = "," not in gold and plain_number(gold) is not None
    if one_number and _DECIMAL_COMMA.fullmatch(pred.strip()):
        return pred.replace(",", ".").replace(" ", "")
    return pred


def _is_name(x) -> bool:
    """A quantity's name: ``x``, ``AB``, or a tuple or ratio of names (``(p, q)``, ``S : T``)."""
    if isinstance(x, Seq):
        return x.open in ("(", ":") and all(isinstance(i, (sp.Symbol, Text)) for i in x.items)
    return isinstance(x, (sp.Symbol, Text))


def _as_point(x):
    """``x = 2, y = 5`` (distinct single names, put in alphabetical order: ``y = 5, x = 2`` too)
    as the point ``(2, 5)``; anything else unchanged."""
    if not (isinstance(x, Seq) and x.open == "" and 2 <= len(x.items) <= 8):
        return x
    if not all(isinstance(e, Equation) and isinstance(e.lhs, sp.Symbol) for e in x.items):
        return x
    items = sorted(x.items, key=lambda e: str(e.lhs))
    if len({str(e.lhs) for e in items}) != len(items):
        return x
    return Seq(tuple(e.rhs for e in items), "(", ")")


def _as_points(x):
    """``p = 5, q = 2; p = 7, q = 2`` (or ``... or p = 7, q = 2``: the same distinct names, in
    the same order, again and again) as the list of points ``(5, 2), (7, 2)``; anything else
    unchanged."""
    if not (isinstance(x, Seq) and x.open == "" and 4 <= len(x.items) <= 32):
        return x
    if not all(isinstance(e, Equation) and isinstance(e.lhs, sp.Symbol) for e in x.items):
        return x
    names = [str(e.lhs) for e in x.items]
    k = len(set(names))
    if k < 2 or len(names) % k or len(set(names[:k])) != k:
        return x
    if any(names[i : i + k] != names[:k] for i in range(k, len(names), k)):
        return x
    chunks = (Seq(x.items[i : i + k], "", "") for i in range(0, len(names), k))
    return Seq(tuple(_as_point(c) for c in chunks), "", "")


def same(p, g, tol: float = 0.0) -> bool:
    """Structural comparison of parsed answers, numbers and expressions by value.

    Equations first (``x = 3`` against ``3``), then subsets of the line (compared as merged
    intervals when both sides read as one), then lists and tuples, then the other kinds of
    node (:data:`_KINDS`); plain expressions by value."""
    if isinstance(p, Equation) or isinstance(g, Equation):
        return _equations(p, g, tol)
    if setlike(p) or setlike(g):
        try:
            return spans_equal(to_spans(p), to_spans(g), tol)
        except FAILURES:
            pass  # not both subsets of the line: compare as written
    if isinstance(p, Seq) or isinstance(g, Seq):
        return _sequences(p, g, tol)
    for kind, compare in _KINDS:
        if isinstance(p, kind) or isinstance(g, kind):
            return compare(p, g, tol)
    if not isinstance(p, sp.Basic) or not isinstance(g, sp.Basic):
        return False
    return expressions_equal(p, g, tol)


def _sequences(p, g, tol: float) -> bool:
    """At least one side is a :class:`Seq` (a list, set, tuple, interval or ratio)."""
    p, g = _as_points(p), _as_points(g)
    if isinstance(p, Seq) and p.open == "" and p.joiner != "and" and not isinstance(g, Seq):
        # "15\frac{39}{40}, or \frac{639}{40}": one value written twice is that value; a
        # hedge ("5 or 6") is not, since not every item equals the gold
        return len(p.items) <= 4 and all(same(x, g, tol) for x in p.items)
    if isinstance(p, Seq) and isinstance(g, Seq) and "(" in (p.open, g.open):
        p, g = _as_point(p), _as_point(g)
    vector = _vector(p, g, tol)
    if vector is not None:
        return vector
    return _seq_equal(_as_seq(p), _as_seq(g), tol)


def _unions(p, g, tol: float) -> bool:
    """Unions of sets match only unions, part for part in any order."""
    if not (isinstance(p, Union) and isinstance(g, Union)):
        return False
    return _unordered(list(p.parts), list(g.parts), tol)


def _texts(p, g, tol: float) -> bool:
    """Word answers match only the same word (case-folded when parsed)."""
    return isinstance(p, Text) and isinstance(g, Text) and p.value == g.value


def _inequalities(p, g, tol: float) -> bool:
    """Inequalities (not read as sets) match side for side with the same operators."""
    return (
        isinstance(p, Inequality)
        and isinstance(g, Inequality)
        and p.ops == g.ops
        and all(same(a, b, tol) for a, b in zip(p.sides, g.sides))
        and len(p.sides) == len(g.sides)
    )


def _matrices(p, g, tol: float) -> bool:
    """Matrices match matrices of the same shape, entry for entry by value."""
    return (
        isinstance(p, sp.MatrixBase)
        and isinstance(g, sp.MatrixBase)
        and p.shape == g.shape
        and all(expressions_equal(a, b, tol) for a, b in zip(p, g))
    )


#: the kinds of node :func:`same` compares on their own terms, tried in order: when either
#: side is one, its comparison decides
_KINDS = ((Union, _unions), (Text, _texts), (Inequality, _inequalities), (sp.MatrixBase, _matrices))


def _equations(p, g, tol: float) -> bool:
    if isinstance(p, Equation) and isinstance(g, Equation):
        if same(p.lhs, g.lhs, tol) and same(p.rhs, g.rhs, tol):
            return True
        renamed = isinstance(p.lhs, sp.Symbol) and isinstance(g.lhs, sp.Symbol) and p.lhs != g.lhs
        if (p.named or g.named) and not renamed and same(p.rhs, g.rhs, tol):
            return True  # AB = 7 against BA = 7; but x = 5 is not y = 5
        if all(
            isinstance(x, sp.Basic) and not isinstance(x, sp.MatrixBase)
            for x in (p.lhs, p.rhs, g.lhs, g.rhs)
        ):
            return _proportional(
                sp.Add(p.lhs, sp.Mul(-1, p.rhs, evaluate=False), evaluate=False),
                sp.Add(g.lhs, sp.Mul(-1, g.rhs, evaluate=False), evaluate=False),
                tol,
            )
        return False
    if isinstance(p, Equation):  # x = 3, AB = 3, a+b+c = 10, a = b = 3: the answer is the rhs
        if (
            p.named or _is_name(p.lhs) or _constant(p.lhs) or _constant(p.rhs) and not _zero(p.rhs)
        ):  # 5x - 7y + 4 = 0 is a plane, not the value 0
            return same(p.rhs, g, tol)
        return False  # x + y = 2x is an equation, not the value 2x
    if g.named or _is_name(g.lhs) or _name_expr(g.lhs):  # gold x = 3, |AB| = 1 against 3, 1
        return same(p, g.rhs, tol)
    return False


def _name_expr(x) -> bool:
    """A quantity named by a formula of points only: ``\\frac{NO}{BO}``, ``|AB|`` (capital
    letters, no numbers, no sums: ``x + 1 = 0`` and ``xy = 6`` are equations, not values)."""
    return (
        isinstance(x, sp.Basic)
        and not isinstance(x, sp.MatrixBase)
        and bool(x.free_symbols)
        and not x.has(sp.Add)
        and all(isinstance(a, sp.Symbol) and str(a).isupper() or a == -1 for a in x.atoms())
    )


def _proportional(dp, dg, tol: float) -> bool:
    """Do the equations ``dp = 0`` and ``dg = 0`` (in variables) say the same: is ``dp`` a
    constant nonzero multiple of ``dg``? ``2x + 4y = 6`` is ``x + 2y = 3``, ``3x - y = 2`` is
    ``y = 3x - 2``. The factor is read at one sample point, then checked everywhere."""
    syms = sorted(dp.free_symbols | dg.free_symbols, key=str)
    if not syms:
        return False
    for point in _points(dp, dg, syms, 4):
        try:
            vp, vg = exact(dp, point), exact(dg, point)
        except ArithmeticError:
            continue
        if vp is None or vg is None:
            break
        if vg != 0:
            if vp == 0:
                return False
            k = vp / vg
            scaled = sp.Mul(sp.Rational(k.numerator, k.denominator), dg, evaluate=False)
            return expressions_equal(dp, scaled, tol)
    return expressions_equal(dp, dg, tol) or expressions_equal(
        dp, sp.Mul(-1, dg, evaluate=False), tol
    )


def _zero(x) -> bool:
    return isinstance(x, sp.Integer) and x == 0


def _constant(x) -> bool:
    return isinstance(x, sp.Basic) and not isinstance(x, sp.MatrixBase) and not x.free_symbols


def _vector(p, g, tol: float) -> bool | None:
    """A tuple against a one-row or one-column matrix: the same vector written two ways."""
    seq, mat = (p, g) if isinstance(p, Seq) else (g, p)
    if not isinstance(mat, sp.MatrixBase) or seq.open != "(" or 1 not in mat.shape:
        return None
    return len(seq.items) == len(mat) and all(
        isinstance(a, sp.Basic) and expressions_equal(a, b, tol)
        for a, b in zip(seq.items, list(mat))
    )


def _as_seq(x) -> Seq:
    if isinstance(x, Seq):
        return x
    return Seq((x,), "", "")


def _seq_equal(p: Seq, g: Seq, tol: float) -> bool:
    unordered = {"", "{"}
    if p.open in unordered and g.open in unordered:
        return _unordered(list(p.items), list(g.items), tol)
    if len(p.items) != len(g.items):
        return False
    if (p.open, p.close) != (g.open, g.close):
        return False
    return all(same(a, b, tol) for a, b in zip(p.items, g.items))


def _distinct(items: list, tol: float) -> list:
    """A solution list's elements, each once: ``2, 2, 3`` lists the set {2, 3}."""
    try:
        items = list(dict.fromkeys(items))  # the same tree twice: cheap
    except TypeError:
        pass
    if len(items) > 32:
        return items
    out: list = []
    for a in items:
        if not any(same(a, b, tol) for b in out):
            out.append(a)
    return out


def _unordered(ps: list, gs: list, tol: float) -> bool:
    if len(ps) != len(gs):
        ps, gs = _distinct(ps, tol), _distinct(gs, tol)
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
