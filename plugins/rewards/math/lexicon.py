"""The parser's vocabulary: tokens, known functions and constants, relation operators, and
the small node helpers (``\\pm`` lifting, list flattening) the grammar shares."""

from __future__ import annotations

import re

import sympy as sp
from grpo_core_plugins.rewards.math.nodes import MAX_ITEMS, ParseError, Seq, as_expr

_TOKEN = re.compile(
    r"""
    (?P<num>\d+(?:\.\d*)?(?:[eE][-+]?\d+(?![a-zA-Z]))?|\.\d+)
  | (?P<cmd>\\[a-zA-Z]+|\\[{}|]|\\\\)
  | (?P<word>[a-zA-Z]+)
  | (?P<op><=|>=|!=|\*\*|[-+*/^_()\[\]{}|,=<>!%&;:'])
  | (?P<ws>\s+)
""",
    re.VERBOSE,
)


def tokenize(s: str) -> list[tuple[str, str]]:
    out, pos = [], 0
    while pos < len(s):
        m = _TOKEN.match(s, pos)
        if not m:
            raise ParseError(f"unexpected character {s[pos]!r}")
        pos = m.end()
        if m.lastgroup != "ws":
            out.append((m.lastgroup, m.group(0)))
    return out


_FUNCS = {
    "sin": sp.sin,
    "cos": sp.cos,
    "tan": sp.tan,
    "cot": sp.cot,
    "sec": sp.sec,
    "csc": sp.csc,
    "arcsin": sp.asin,
    "arccos": sp.acos,
    "arctan": sp.atan,
    "sinh": sp.sinh,
    "cosh": sp.cosh,
    "tanh": sp.tanh,
    "ln": sp.log,
    "log": sp.log,
    "exp": sp.exp,
}
_INVERSE = {"sin": sp.asin, "cos": sp.acos, "tan": sp.atan}
_CONSTS = {"pi": sp.pi, "infty": sp.oo, "infinity": sp.oo, "inf": sp.oo, "oo": sp.oo, "e": sp.E}
_INEQ = {
    "<": "<",
    "\\lt": "<",
    ">": ">",
    "\\gt": ">",
    "<=": "<=",
    "\\le": "<=",
    "\\leq": "<=",
    "\\leqslant": "<=",
    ">=": ">=",
    "\\ge": ">=",
    "\\geq": ">=",
    "\\geqslant": ">=",
    "\\neq": "!=",
    "\\ne": "!=",
    "!=": "!=",
}
_MATRICES = {"pmatrix", "bmatrix", "Bmatrix", "matrix", "smallmatrix", "array"}
_JOINERS = ("and", "or")
_FOLLOWERS = {
    None,
    "=",
    ",",
    ";",
    "and",
    "or",
    ")",
    "]",
    "}",
    "\\}",
    "&",
    "\\\\",
    "\\end",
    "\\cup",
    "U",
    ":",
    *_INEQ,
}
MAX_BRANCHES = 16  # a \pm b \pm c ... expands to at most this many values


_NOT_NAMES = {
    "\\end",
    "\\begin",
    "\\frac",
    "\\sqrt",
    "\\binom",
    "\\cdot",
    "\\times",
    "\\div",
    "\\pm",
    "\\mp",
    "\\cup",
    "\\in",
    "\\infty",
    "\\pi",
    "\\le",
    "\\ge",
    "\\leq",
    "\\geq",
    "\\lt",
    "\\gt",
    "\\neq",
    "\\ne",
    "\\approx",
    "\\to",
    "\\quad",
    "\\setminus",
    "\\backslash",
}


def _greek(value: str) -> bool:
    """A command that names a symbol (``\\alpha``, ``\\theta``), not an operator."""
    return (
        value.startswith("\\")
        and len(value) > 2
        and value[1:].isalpha()
        and value not in _NOT_NAMES
        and value[1:] not in _FUNCS
        and value[1:] not in _CONSTS
    )


def _mul(a, b):
    """``a * b``; a number times a matrix scales each entry (``2\\begin{pmatrix}...``)."""
    if isinstance(a, sp.MatrixBase) or isinstance(b, sp.MatrixBase):
        if isinstance(a, sp.MatrixBase) and isinstance(b, sp.MatrixBase):
            raise ParseError("a product of matrices is not an answer form we read")
        m, k = (a, b) if isinstance(a, sp.MatrixBase) else (b, a)
        return sp.ImmutableMatrix(m.rows, m.cols, [sp.Mul(k, x, evaluate=False) for x in m])
    return sp.Mul(a, b, evaluate=False)


def _div(a, b):
    if isinstance(b, sp.MatrixBase):
        raise ParseError("division by a matrix")
    return _mul(a, sp.Pow(b, -1, evaluate=False))


def _lift(op, a, b):
    """``op`` on two operands, either of which may be the two values of a ``\\pm``."""
    if not (_is_pm(a) or _is_pm(b)):
        return op(as_expr(a), as_expr(b))
    xs = a.items if _is_pm(a) else (a,)
    ys = b.items if _is_pm(b) else (b,)
    out = tuple(op(as_expr(x), as_expr(y)) for x in xs for y in ys)
    if len(out) > MAX_BRANCHES:
        raise ParseError("too many \\pm")
    return Seq(out, "", "")


def _is_pm(x) -> bool:
    return isinstance(x, Seq) and x.open == "" and x.joiner == ","


def _flatten(items: list) -> list:
    """Splice bare lists made by ``\\pm`` into the surrounding list."""
    out = []
    for x in items:
        if isinstance(x, Seq) and x.open == "" and x.joiner == ",":
            out.extend(x.items)
        else:
            out.append(x)
    if len(out) > MAX_ITEMS:
        raise ParseError("too many items")
    return out


def equals_ahead(tokens: list, start: int) -> int | None:
    """Index of the next '=' at bracket depth 0 (before any list separator)."""
    depth = 0
    for j in range(start, len(tokens)):
        v = tokens[j][1]
        if v in ("(", "[", "{", "\\{"):
            depth += 1
        elif v in (")", "]", "}", "\\}"):
            depth -= 1
        elif depth == 0 and v in (",", ";", "and", "or"):
            return None
        elif depth == 0 and v == "=":
            return j
    return None


def name_like(tokens: list) -> bool:
    """Tokens read as the name of a quantity: letters and symbol commands,
    with subscripts, braces and argument lists but no arithmetic outside them:
    ``f(2)``, ``a_{n}``, ``P(A)``, ``\\angle BAC``, ``\\overline{AB}``, ``f^{-1}(x)``."""
    toks = [v for _, v in tokens]
    depth, k = 0, 0
    while k < len(toks):
        v = toks[k]
        if v in ("(", "{", "[", "\\{"):
            depth += 1
        elif v in (")", "}", "]", "\\}"):
            depth -= 1
        elif depth == 0:
            if v == "^" and toks[k + 1 : k + 5] == ["{", "-", "1", "}"]:
                k += 5  # an inverse function
                continue
            if v == "_":
                k += 2 if toks[k + 1 : k + 2] != ["{"] else 1
                continue
            if not (v.isalpha() or _greek(v)):
                return False
        k += 1
    return bool(toks) and depth == 0 and (toks[0].isalpha() or _greek(toks[0]))
