"""Deciding whether two parsed expressions have the same value, with bounded work.

Exact first: a tree of rationals, integer powers, exact roots, factorials and absolute
values is evaluated as a ``Fraction`` and compared exactly, so ``10^{-100}`` is not ``0``
and ``0.333`` is not ``1/3``. Anything else (pi, logarithms, trigonometry, irrational roots)
is evaluated with mpmath at two working precisions: the values must agree to the first
precision, and their difference must shrink by many orders of magnitude at the second. A
true identity (``\\log_2 8`` and ``3``, ``\\sin(\\pi/6)`` and ``1/2``) passes; a value that
is merely tiny (``e^{-1000}`` against ``0``) or a long decimal against an irrational does
not, because its difference stays put when the precision grows. The first precision also
grows with the number of digits written in the input, so no finite decimal can pass for
an irrational. Only a user-configured relative tolerance blurs values.

Expressions with variables are compared at several signed, fractional sample points (the
same ones for both sides, chosen from the text itself, so runs are reproducible); a single
point where both sides are defined and differ refuses the pair: ``|x|`` is not ``x``.
"""

from __future__ import annotations

import math
import random
import threading
import zlib
from fractions import Fraction

import mpmath
import sympy as sp

MAX_BITS = 100_000  # exact results past this size are evaluated approximately instead
MAX_ARG = 10**6  # exp/trig/power arguments beyond this are refused, not computed
SAMPLES = 6
MAX_PRECISION = 1500  # digits
_local = threading.local()


class Undefined(ArithmeticError):
    """The expression has no value here (division by zero, an argument out of range)."""


class Unsupported(ValueError):
    """A node this evaluator does not handle, or a value too extreme to compute safely."""


def low_precision() -> mpmath.ctx_mp.MPContext:
    """A 15-digit context of this thread, for bounds checks (sizes, not equality)."""
    ctx = getattr(_local, "low", None)
    if ctx is None:
        ctx = _local.low = mpmath.MPContext()
        ctx.dps = 15
    return ctx


def _ctx() -> mpmath.ctx_mp.MPContext:
    ctx = getattr(_local, "ctx", None)
    if ctx is None:
        ctx = _local.ctx = mpmath.MPContext()
    return ctx


# -- exact ----------------------------------------------------------------------------------


def _root(q: Fraction, n: int) -> Fraction | None:
    if q < 0:
        if n % 2 == 0:
            return None
        r = _root(-q, n)
        return None if r is None else -r
    out = []
    for v in (q.numerator, q.denominator):
        r = round(v ** (1.0 / n)) if v.bit_length() < 1000 else None
        if r is None:
            return None
        for c in (r - 1, r, r + 1):
            if c >= 0 and c**n == v:
                out.append(c)
                break
        else:
            return None
    return Fraction(out[0], out[1])


def exact(e, point: dict | None = None) -> Fraction | None:
    """The exact rational value of ``e``, or None when it is not (or not cheaply) rational.

    Dispatches on the node's type (:data:`_EXACT`); a node type with no handler has no
    cheap exact value, so the caller falls back to the approximate path."""
    return _handler(_EXACT, _EXACT_CACHE, type(e), _no_exact)(e, point)


def _handler(table: tuple, cache: dict, kind: type, default):
    """The handler of the first class in ``table`` that ``kind`` subclasses (so the table
    keeps the order of an ``isinstance`` chain), memoised per concrete type in ``cache``."""
    fn = cache.get(kind)
    if fn is None:
        fn = next((f for cls, f in table if issubclass(kind, cls)), default)
        cache[kind] = fn
    return fn


def _no_exact(e, point) -> None:
    """A node with no exact rational value here (pi, sin, log, ...)."""
    return None


def _exact_rational(e, point) -> Fraction:
    return Fraction(int(e.p), int(e.q))


def _exact_symbol(e, point) -> Fraction | None:
    """A variable's value at ``point``; None when unbound."""
    if point is not None and e in point:
        return point[e]
    return None


def _exact_sum(e, point) -> Fraction | None:
    total = Fraction(0)
    for a in e.args:
        v = exact(a, point)
        if v is None:
            return None
        total += v
    return total


def _exact_product(e, point) -> Fraction | None:
    prod = Fraction(1)
    for a in e.args:
        v = exact(a, point)
        if v is None:
            return None
        prod *= v
    return prod


def _exact_power(e, point) -> Fraction | None:
    """``b^x`` for rational ``b``, ``x``: exact roots (denominator of ``x`` up to 64) and
    results up to :data:`MAX_BITS` only; anything bigger is left to the approximate path."""
    b = exact(e.args[0], point)
    x = exact(e.args[1], point)
    if b is None or x is None:
        return None
    if b == 0 and x < 0:
        raise Undefined("division by zero")
    if x.denominator != 1:
        r = _root(b, x.denominator) if x.denominator <= 64 else None
        if r is None:
            return None
        b, x = r, Fraction(x.numerator)
    bits = max(b.numerator.bit_length(), b.denominator.bit_length())
    if bits * abs(x.numerator) > MAX_BITS:
        return None
    return b ** int(x)


def _exact_abs(e, point) -> Fraction | None:
    v = exact(e.args[0], point)
    return None if v is None else abs(v)


def _exact_factorial(e, point) -> Fraction | None:
    """``n!`` for an integer 0 <= n <= 1000 (bounded work)."""
    v = exact(e.args[0], point)
    if v is None or v.denominator != 1 or not 0 <= v <= 1000:
        return None
    return Fraction(math.factorial(int(v)))


def _exact_binomial(e, point) -> Fraction | None:
    """``C(n, k)`` for integers with 0 <= n <= 10000; a negative ``k`` gives 0."""
    n, k = exact(e.args[0], point), exact(e.args[1], point)
    if n is None or k is None or n.denominator != 1 or k.denominator != 1 or not 0 <= n <= 10_000:
        return None
    return Fraction(math.comb(int(n), int(k)) if k >= 0 else 0)


#: node class -> exact evaluator, in the order the classes are tried
_EXACT = (
    (sp.Rational, _exact_rational),
    (sp.Symbol, _exact_symbol),
    (sp.Add, _exact_sum),
    (sp.Mul, _exact_product),
    (sp.Pow, _exact_power),
    (sp.Abs, _exact_abs),
    (sp.factorial, _exact_factorial),
    (sp.binomial, _exact_binomial),
)
_EXACT_CACHE: dict = {}


# -- approximate ----------------------------------------------------------------------------

_FUNCS = {
    sp.sin: "sin",
    sp.cos: "cos",
    sp.tan: "tan",
    sp.cot: "cot",
    sp.sec: "sec",
    sp.csc: "csc",
    sp.asin: "asin",
    sp.acos: "acos",
    sp.atan: "atan",
    sp.sinh: "sinh",
    sp.cosh: "cosh",
    sp.tanh: "tanh",
}


def approx(e, ctx, point: dict, scale: list):
    """mpmath value of ``e`` at ``ctx.dps``; ``scale[0]`` tracks the largest magnitude seen."""
    v = _approx(e, ctx, point, scale)
    m = abs(v)
    if ctx.isfinite(m) and m > scale[0]:
        scale[0] = m
    return v


def _approx(e, ctx, point, scale):
    """Dispatch on the node's type (:data:`_APPROX`); leaves first, then operators, whose
    handlers evaluate their arguments through :func:`approx` before combining them."""
    return _handler(_APPROX, _APPROX_CACHE, type(e), _approx_unsupported)(e, ctx, point, scale)


def _args(e, ctx, point, scale) -> list:
    """The values of ``e``'s arguments, each through :func:`approx` (which tracks scale)."""
    return [approx(a, ctx, point, scale) for a in e.args]


def _approx_rational(e, ctx, point, scale):
    return ctx.mpf(int(e.p)) / int(e.q)


def _approx_symbol(e, ctx, point, scale):
    """A variable's value at ``point``; an unbound one cannot be evaluated."""
    if e not in point:
        raise Unsupported(f"unbound symbol {e}")
    q = point[e]
    return ctx.mpf(q.numerator) / q.denominator


def _approx_pi(e, ctx, point, scale):
    return +ctx.pi


def _approx_e(e, ctx, point, scale):
    return +ctx.e


def _approx_inf(e, ctx, point, scale):
    return ctx.inf


def _approx_neg_inf(e, ctx, point, scale):
    return -ctx.inf


def _approx_sum(e, ctx, point, scale):
    return ctx.fsum(_args(e, ctx, point, scale))


def _approx_product(e, ctx, point, scale):
    out = ctx.mpf(1)
    for a in _args(e, ctx, point, scale):
        out *= a
    return out


def _approx_power(e, ctx, point, scale):
    """``b^x``: ``0^x`` by hand, huge powers refused, and a real odd root of a negative
    base kept real (``cbrt(-8) = -2``, not mpmath's principal complex root)."""
    b, x = _args(e, ctx, point, scale)
    if b == 0:
        if ctx.re(x) < 0:
            raise Undefined("division by zero")
        return ctx.mpf(0) if x != 0 else ctx.mpf(1)
    if ctx.isfinite(b) and ctx.isfinite(x) and abs(x) * abs(ctx.log(abs(b))) > MAX_ARG:
        raise Unsupported("power too large")
    q = e.args[1]
    if isinstance(q, sp.Rational) and q.q % 2 == 1 and ctx.im(b) == 0 and b < 0:
        return -((-b) ** x) if q.p % 2 else (-b) ** x  # real odd roots: cbrt(-8) = -2
    return ctx.power(b, x)


def _approx_abs(e, ctx, point, scale):
    return abs(_args(e, ctx, point, scale)[0])


def _approx_exp(e, ctx, point, scale):
    """``e^x``, refused past :data:`MAX_ARG` (the value would be astronomically large)."""
    args = _args(e, ctx, point, scale)
    if ctx.re(args[0]) > MAX_ARG:
        raise Unsupported("exp too large")
    return ctx.exp(args[0])


def _approx_log(e, ctx, point, scale):
    """``log x`` or ``log(x, base)``; ``log 0`` has no value."""
    args = _args(e, ctx, point, scale)
    if args[0] == 0:
        raise Undefined("log 0")
    out = ctx.log(args[0])
    return out / ctx.log(args[1]) if len(args) > 1 else out


def _trig(name: str):
    """The evaluator of the mpmath function ``name`` (sin, atan, cosh, ...): arguments past
    :data:`MAX_ARG` are refused, a pole (``cot 0``) has no value."""

    def evaluate(e, ctx, point, scale):
        args = _args(e, ctx, point, scale)
        if abs(args[0]) > MAX_ARG:
            raise Unsupported("argument too large")
        try:
            return getattr(ctx, name)(args[0])
        except ZeroDivisionError as exc:
            raise Undefined(name) from exc

    return evaluate


def _approx_factorial(e, ctx, point, scale):
    """``x!`` as the gamma function; a pole at the negative integers."""
    args = _args(e, ctx, point, scale)
    if ctx.isint(args[0]) and args[0] < 0:
        raise Undefined("factorial of a negative integer")
    return ctx.factorial(args[0])


def _approx_binomial(e, ctx, point, scale):
    return ctx.binomial(*_args(e, ctx, point, scale))


def _approx_unsupported(e, ctx, point, scale):
    """Any other node: its arguments are still evaluated first (their errors win), then it
    is refused."""
    _args(e, ctx, point, scale)
    raise Unsupported(f"cannot evaluate {type(e).__name__}")


#: node class -> approximate evaluator, in the order the classes are tried: the leaves
#: (rationals, variables, the constants pi, e, +-oo), then the operators and functions
_APPROX = (
    (sp.Rational, _approx_rational),
    (sp.Symbol, _approx_symbol),
    (type(sp.pi), _approx_pi),
    (type(sp.E), _approx_e),
    (type(sp.oo), _approx_inf),
    (type(sp.S.NegativeInfinity), _approx_neg_inf),
    (sp.Add, _approx_sum),
    (sp.Mul, _approx_product),
    (sp.Pow, _approx_power),
    (sp.Abs, _approx_abs),
    (sp.exp, _approx_exp),
    (sp.log, _approx_log),
    *((f, _trig(name)) for f, name in _FUNCS.items()),
    (sp.factorial, _approx_factorial),
    (sp.binomial, _approx_binomial),
)
_APPROX_CACHE: dict = {}


def _digits(e) -> int:
    """Digits a value written in the input can pin down: its numbers' digits, and the size
    of its powers (``10^{-70}``, ``e^{-200}``); a finite trick needs that much precision."""
    n = 0
    ctx = _ctx()
    ctx.dps = 15
    for a in sp.preorder_traversal(e):
        if isinstance(a, sp.Rational):
            n = max(n, len(str(abs(int(a.p)))) + len(str(int(a.q))))
        elif isinstance(a, (sp.Pow, sp.exp)) and not a.free_symbols:
            base, x = (sp.E, a.args[0]) if isinstance(a, sp.exp) else a.args
            try:
                size = abs(approx(x, ctx, {}, [ctx.mpf(0)])) * abs(
                    ctx.log10(abs(approx(base, ctx, {}, [ctx.mpf(0)])) or 1)
                )
            except (Undefined, Unsupported, ZeroDivisionError, ValueError):
                continue
            if ctx.isfinite(size):
                n = max(n, int(min(size, MAX_PRECISION)) + 1)
        if n >= MAX_PRECISION:
            return MAX_PRECISION
    return n


def _at(ctx, dps: int, a, b, point):
    ctx.dps = dps
    sa, sb = [ctx.mpf(0)], [ctx.mpf(0)]
    va, vb = approx(a, ctx, point, sa), approx(b, ctx, point, sb)
    return va, vb, max(sa[0], sb[0], ctx.mpf(1) if point else ctx.mpf(0))


def values_equal(a, b, tol: float = 0.0, point: dict | None = None, digits=0) -> bool:
    """Do ``a`` and ``b`` (no free symbols besides those in ``point``) have one value?"""
    point = point or {}
    try:
        ea, eb = exact(a, point), exact(b, point)
    except ZeroDivisionError as exc:
        raise Undefined("division by zero") from exc
    if ea is not None and eb is not None:
        if ea == eb:
            return True
        return tol > 0 and abs(ea - eb) <= Fraction(tol) * abs(eb)
    ctx = _ctx()
    if callable(digits):
        digits = digits()
    p1 = min(max(30, 2 * digits + 15), MAX_PRECISION)
    try:
        va, vb, scale = _at(ctx, p1, a, b, point)
        if not (ctx.isfinite(va) and ctx.isfinite(vb)):
            return bool(va == vb) and not ctx.isnan(va)
        d1 = abs(va - vb)
        if tol > 0:
            return bool(d1 <= tol * abs(vb))
        if d1 > scale * ctx.mpf(10) ** (-(p1 // 2)):
            return False
        p2 = 2 * p1
        va, vb, scale = _at(ctx, p2, a, b, point)
        d2 = abs(va - vb)
        return bool(
            d2 <= scale * ctx.mpf(10) ** (-(p2 - 15))
            and (d1 == 0 or d2 == 0 or d2 <= d1 * ctx.mpf(10) ** (-(p1 // 3)))
        )
    except (ZeroDivisionError, ValueError) as exc:
        if isinstance(exc, Unsupported):
            raise
        raise Undefined(str(exc)) from exc


def _points(a, b, syms: list, n: int) -> list[dict]:
    rng = random.Random(zlib.crc32(f"{a}|{b}".encode()))
    pts = []
    for k in range(n):
        pt = {}
        for i, s in enumerate(syms):
            sign = -1 if (k + i) % 2 == 0 else 1  # every symbol negative at some points
            den = rng.randint(2, 13)
            num = rng.randint(1, 6 * den)
            if num % den == 0:
                num += 1
            pt[s] = Fraction(sign * num, den)
        pts.append(pt)
    return pts


def expressions_equal(a, b, tol: float = 0.0) -> bool:
    """Value equality of two sympy expressions; with variables, at signed fractional points."""
    if a == b:
        return True
    memo: list[int] = []

    def digits() -> int:  # only needed when the exact path does not decide
        if not memo:
            memo.append(max(_digits(a), _digits(b)))
        return memo[0]

    syms = sorted(a.free_symbols | b.free_symbols, key=str)  # sec^2 x - tan^2 x is 1
    if not syms:
        try:
            return values_equal(a, b, tol, None, digits)
        except (Undefined, Unsupported):
            return False
    agreed = 0
    for pt in _points(a, b, syms, SAMPLES + 4):
        try:
            if not values_equal(a, b, tol, pt, digits):
                return False
        except Undefined:
            continue  # a pole or a domain edge hit by chance: try the next point
        except Unsupported:
            return False
        agreed += 1
        if agreed >= SAMPLES:
            return True
    return agreed >= 3
