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
    """The exact rational value of ``e``, or None when it is not (or not cheaply) rational."""
    if isinstance(e, sp.Rational):
        return Fraction(int(e.p), int(e.q))
    if isinstance(e, sp.Symbol):
        if point is not None and e in point:
            return point[e]
        return None
    if isinstance(e, sp.Add):
        total = Fraction(0)
        for a in e.args:
            v = exact(a, point)
            if v is None:
                return None
            total += v
        return total
    if isinstance(e, sp.Mul):
        prod = Fraction(1)
        for a in e.args:
            v = exact(a, point)
            if v is None:
                return None
            prod *= v
        return prod
    if isinstance(e, sp.Pow):
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
    if isinstance(e, sp.Abs):
        v = exact(e.args[0], point)
        return None if v is None else abs(v)
    if isinstance(e, sp.factorial):
        v = exact(e.args[0], point)
        if v is None or v.denominator != 1 or not 0 <= v <= 1000:
            return None
        return Fraction(math.factorial(int(v)))
    if isinstance(e, sp.binomial):
        n, k = exact(e.args[0], point), exact(e.args[1], point)
        if n is None or k is None or n.denominator != 1 or k.denominator != 1 or \
                not 0 <= n <= 10_000:
            return None
        return Fraction(math.comb(int(n), int(k)) if k >= 0 else 0)
    return None


# -- approximate ----------------------------------------------------------------------------

_FUNCS = {sp.sin: "sin", sp.cos: "cos", sp.tan: "tan", sp.cot: "cot", sp.sec: "sec",
          sp.csc: "csc", sp.asin: "asin", sp.acos: "acos", sp.atan: "atan", sp.sinh: "sinh",
          sp.cosh: "cosh", sp.tanh: "tanh"}


def approx(e, ctx, point: dict, scale: list):
    """mpmath value of ``e`` at ``ctx.dps``; ``scale[0]`` tracks the largest magnitude seen."""
    v = _approx(e, ctx, point, scale)
    m = abs(v)
    if ctx.isfinite(m) and m > scale[0]:
        scale[0] = m
    return v


def _approx(e, ctx, point, scale):
    if isinstance(e, sp.Rational):
        return ctx.mpf(int(e.p)) / int(e.q)
    if isinstance(e, sp.Symbol):
        if e not in point:
            raise Unsupported(f"unbound symbol {e}")
        q = point[e]
        return ctx.mpf(q.numerator) / q.denominator
    if e is sp.pi:
        return +ctx.pi
    if e is sp.E:
        return +ctx.e
    if e is sp.oo:
        return ctx.inf
    if e is sp.S.NegativeInfinity:
        return -ctx.inf
    args = [approx(a, ctx, point, scale) for a in e.args]
    if isinstance(e, sp.Add):
        return ctx.fsum(args)
    if isinstance(e, sp.Mul):
        out = ctx.mpf(1)
        for a in args:
            out *= a
        return out
    if isinstance(e, sp.Pow):
        b, x = args
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
    if isinstance(e, sp.Abs):
        return abs(args[0])
    if isinstance(e, sp.exp):
        if ctx.re(args[0]) > MAX_ARG:
            raise Unsupported("exp too large")
        return ctx.exp(args[0])
    if isinstance(e, sp.log):
        if args[0] == 0:
            raise Undefined("log 0")
        out = ctx.log(args[0])
        return out / ctx.log(args[1]) if len(args) > 1 else out
    for f, name in _FUNCS.items():
        if isinstance(e, f):
            if abs(args[0]) > MAX_ARG:
                raise Unsupported("argument too large")
            try:
                return getattr(ctx, name)(args[0])
            except ZeroDivisionError as exc:
                raise Undefined(name) from exc
    if isinstance(e, sp.factorial):
        if ctx.isint(args[0]) and args[0] < 0:
            raise Undefined("factorial of a negative integer")
        return ctx.factorial(args[0])
    if isinstance(e, sp.binomial):
        return ctx.binomial(*args)
    raise Unsupported(f"cannot evaluate {type(e).__name__}")


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
                    ctx.log10(abs(approx(base, ctx, {}, [ctx.mpf(0)])) or 1))
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
        return bool(d2 <= scale * ctx.mpf(10) ** (-(p2 - 15)) and
                    (d1 == 0 or d2 == 0 or d2 <= d1 * ctx.mpf(10) ** (-(p1 // 3))))
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
