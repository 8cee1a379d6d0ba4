"""A LaTeX / plain-text math parser that never calls ``eval``.

Text is normalised (:mod:`normalise`), tokenised, then parsed by recursive descent straight
into sympy objects built with ``evaluate=False`` (plus the list, equation, inequality, union
and word nodes of :mod:`nodes`). Nothing from the input is ever executed; every size that
could explode is bounded: input length, nesting depth, exponents of numbers, factorial
arguments, matrix size, number of items. Decimals become exact rationals, so ``0.5`` equals
``1/2`` but ``0.333`` is not ``1/3``.
"""

from __future__ import annotations

import re

import sympy as sp
from grpo_core_plugins.rewards.math.lexicon import (
    _CONSTS,
    _FOLLOWERS,
    _FUNCS,
    _INEQ,
    _INVERSE,
    _JOINERS,
    _MATRICES,
    MAX_BRANCHES,
    _div,
    _flatten,
    _greek,
    _lift,
    _mul,
    equals_ahead,
    name_like,
    tokenize,
)
from grpo_core_plugins.rewards.math.nodes import (  # noqa: F401  (re-exported names)
    MAX_DEPTH,
    MAX_ITEMS,
    NAMED,
    Difference,
    Equation,
    Inequality,
    ParseError,
    Seq,
    Text,
    Union,
    as_expr,
    factorial,
    number,
    power,
)
from grpo_core_plugins.rewards.math.normalise import normalise  # noqa: F401

_SPLIT_DIGITS = re.compile(r"(?<![_^\d.])\d+\s+\.?\d")  # not \log_3 9


class Parser:
    def __init__(self, tokens):
        self.t, self.i, self.depth = tokens, 0, 0
        self.bars = 0  # open |...| around the current position

    # -- helpers ---------------------------------------------------------------------------
    def peek(self, k: int = 0):
        j = self.i + k
        return self.t[j] if j < len(self.t) else (None, None)

    def take(self):
        tok = self.peek()
        self.i += 1
        return tok

    def accept(self, *values) -> str | None:
        if self.peek()[1] in values:
            return self.take()[1]
        return None

    def expect(self, value):
        if self.take()[1] != value:
            raise ParseError(f"expected {value!r}")

    def enter(self):
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise ParseError("nesting too deep")

    # -- grammar ---------------------------------------------------------------------------
    def top(self):
        """answer := relation ((',' | ';' | 'and' | 'or') relation)*."""
        first = self.relation_list()
        if self.peek()[1] is not None:
            raise ParseError(f"unexpected {self.peek()[1]!r}")
        return first

    def relation_list(self):
        items, joiner = [self.relation()], ","
        while True:
            sep = self.accept(",", ";")
            word = self.accept(*_JOINERS)
            if not sep and not word:
                break
            if word:
                joiner = word
            items.append(self.relation())
            if len(items) > MAX_ITEMS:
                raise ParseError("too many items")
        items = _flatten(items)
        return items[0] if len(items) == 1 else Seq(tuple(items), "", "", joiner)

    def relation(self):
        start, depth = self.i, self.depth
        named = False
        try:
            left = self.union()
            if self.peek()[1] == "=" and (
                isinstance(left, Text) or name_like(self.t[start : self.i])
            ):
                named = True  # AB = 7, area = 12, f(2) = 5, a_n = 3n, P(A) = 1/3
            elif self.peek()[1] not in _FOLLOWERS:
                raise ParseError(f"unexpected {self.peek()[1]!r}")
        except ParseError:  # a name we cannot read: \angle PQR = 40, \overline{AB} = 3
            j = equals_ahead(self.t, start)
            if j is None:
                raise
            self.i, self.depth, left, named = j, depth, NAMED, True
        sides, ops = [left], []
        while True:
            if self.accept("="):
                ops.append("=")
            else:
                op = self.accept(*_INEQ)
                if not op:
                    break
                ops.append(_INEQ[op])
            sides.append(self.union())
            if len(sides) > MAX_ITEMS:
                raise ParseError("too many sides")
        if not ops:
            return left
        if all(o == "=" for o in ops):
            return Equation(sides[0], sides[-1], named or len(sides) > 2)
        if "=" in ops:
            raise ParseError("= mixed with inequalities")
        return Inequality(tuple(sides), tuple(ops))

    def union(self):
        """``a \\cup b``, ``A \\setminus B`` and ratios or clock times ``a : b`` (kept in order)."""
        parts = [self.expr()]
        while self.accept("\\cup", "U"):
            parts.append(self.expr())
        node = parts[0] if len(parts) == 1 else Union(tuple(parts))
        if self.accept("\\setminus", "\\backslash"):
            node = Difference(node, self.union())
        if self.peek()[1] == ":":
            items = [node]
            while self.accept(":"):
                items.append(self.expr())
            node = Seq(tuple(items), ":", ":")
        return node

    def expr(self):
        self.enter()
        self.accept("+")
        first = self.term()
        if isinstance(first, Seq) and first.open == "" and len(first.items) <= MAX_BRANCHES:
            nodes = [as_expr(x) for x in first.items]  # \pm 3 + 1
        else:
            nodes = [first]
        while True:
            op = self.accept("+", "-", "\\pm", "\\mp")
            if not op:
                break
            right = as_expr(self.term())
            neg = sp.Mul(-1, right, evaluate=False)
            if op == "+":
                nodes = [sp.Add(as_expr(n), right, evaluate=False) for n in nodes]
            elif op == "-":
                nodes = [sp.Add(as_expr(n), neg, evaluate=False) for n in nodes]
            else:
                first_sign, second = (right, neg) if op == "\\pm" else (neg, right)
                nodes = [
                    sp.Add(as_expr(n), s, evaluate=False)
                    for n in nodes
                    for s in (first_sign, second)
                ]
                if len(nodes) > MAX_BRANCHES:
                    raise ParseError("too many \\pm")
        self.depth -= 1
        return nodes[0] if len(nodes) == 1 else Seq(tuple(nodes), "", "")

    def term(self):
        node = self.unary()
        while True:
            op = self.peek()[1]
            if op in ("*", "\\cdot", "\\times", "/", "\\div"):
                self.take()
                right = self.unary()
                if op in ("/", "\\div"):
                    node = _lift(_div, node, right)
                else:
                    node = _lift(_mul, node, right)
            elif self._starts_atom():  # implicit multiplication: 2x, 2\pi, (a)(b)
                node = _lift(_mul, node, self.unary())
            else:
                return node

    def _starts_atom(self) -> bool:
        kind, value = self.peek()
        if kind in ("num", "word"):
            return value not in ("and", "or", "U")
        if value == "|":
            return self.bars == 0  # x|x|; inside |...| a bar closes
        return value in (
            "(",
            "\\frac",
            "\\sqrt",
            "\\pi",
            "\\infty",
            "\\{",
            "\\binom",
            "\\begin",
        ) or (kind == "cmd" and (value[1:] in _FUNCS or _greek(value)))

    def unary(self):
        if self.accept("-"):
            return _mul(sp.Integer(-1), as_expr(self.unary()))
        if self.accept("+"):
            return self.unary()
        sign = self.accept("\\pm", "\\mp")
        if sign:  # \pm 2\sqrt3: both values of the whole term
            v = as_expr(self.term())
            return Seq((v, sp.Mul(-1, v, evaluate=False)), "", "")
        return self.power()

    def power(self):
        base = self.postfix(self.atom())
        if self.accept("^", "**"):
            exp = self.postfix(self.group_or_atom(allow_unary=True))
            return power(as_expr(base), as_expr(exp))
        return base

    def postfix(self, node):
        while True:
            if self.accept("!"):
                node = factorial(as_expr(node))
            elif self.accept("%"):
                node = sp.Mul(as_expr(node), sp.Rational(1, 100), evaluate=False)
            elif self.accept("_"):  # subscripts are names: x_1, a_{12}
                node = sp.Symbol(f"{node}_{self.subscript()}")
            else:
                return node

    def subscript(self) -> str:
        if not self.accept("{"):
            return str(self.take()[1])
        parts = []
        while self.peek()[1] not in ("}", None):
            parts.append(self.take()[1])
            if len(parts) > 20:
                raise ParseError("subscript too long")
        self.expect("}")
        return "".join(parts)

    def group_or_atom(self, allow_unary=False):
        if self.accept("{"):
            node = self.expr()
            self.expect("}")
            return node
        if allow_unary and self.accept("-"):
            return sp.Mul(-1, as_expr(self.atom()), evaluate=False)
        return self.atom()

    def function(self, name: str):
        """``\\sin x``, ``\\sin^2(2x)``, ``\\sin^{-1} x``, ``\\log_2 8``, ``\\ln(e^3)``."""
        base = as_expr(self.group_or_atom()) if name == "log" and self.accept("_") else None
        exp = as_expr(self.group_or_atom(allow_unary=True)) if self.accept("^") else None
        if self.peek()[1] in ("(", "{"):
            arg = as_expr(self.atom() if self.peek()[1] == "(" else self.group_or_atom())
        else:  # \sin 2x: the argument runs over a product of simple factors
            arg = as_expr(self.unary())
            while (
                self.peek()[0] in ("num", "word")
                and self.peek()[1] not in _JOINERS
                or self.peek()[0] == "cmd"
                and _greek(self.peek()[1])
            ):
                arg = sp.Mul(arg, as_expr(self.power()), evaluate=False)
        if exp == -1 and name in _INVERSE:
            return _INVERSE[name](arg, evaluate=False)
        node = _FUNCS[name](arg, evaluate=False)
        if base is not None:
            node = sp.Mul(
                node, sp.Pow(sp.log(base, evaluate=False), -1, evaluate=False), evaluate=False
            )
        return power(node, exp) if exp is not None else node

    def atom(self):
        """One factor: a number, a bracketed or braced group, ``|...|``, ``\\frac``,
        ``\\binom``, ``\\sqrt``, a matrix, a function, a constant, a name or a word."""
        self.enter()
        kind, value = self.take()
        try:
            if kind == "num":
                return number(value)
            opener = self._OPENERS.get(value)
            if opener is not None:
                return opener(self, value)
            if kind == "word":
                return self._word(value)
            if kind == "cmd":
                return self._command(value)
            raise ParseError(f"unexpected {value!r}")
        finally:
            self.depth -= 1

    def _braces(self, value):
        """``{...}``: a group that may hold a whole list of relations."""
        node = self.relation_list()
        self.expect("}")
        return node

    def _bars(self, value):
        """``|x|``; while it is open, a bar closes it rather than starting a new one."""
        self.bars += 1
        node = self.expr()
        self.expect("|")
        self.bars -= 1
        return sp.Abs(as_expr(node), evaluate=False)

    def _fraction(self, value):
        """``\\frac{a}{b}`` (both values of ``\\frac{-1 \\pm \\sqrt5}{2}``) or
        ``\\binom{n}{k}``."""
        a, b = self.group_or_atom(), self.group_or_atom()
        if value == "\\binom":
            return sp.binomial(as_expr(a), as_expr(b), evaluate=False)
        return _lift(_div, a, b)  # \frac{-1 \pm \sqrt5}{2}: both values

    def _sqrt(self, value):
        """``\\sqrt x`` or ``\\sqrt[n]{x}``: a power ``1/n``, kept symbolic when ``n`` is
        not a positive integer."""
        index = None
        if self.accept("["):
            index = as_expr(self.expr())
            self.expect("]")
        arg = as_expr(self.group_or_atom())
        if index is None or isinstance(index, sp.Integer) and index > 0:
            return power(arg, sp.Rational(1, int(index or 2)))
        return power(arg, sp.Pow(index, -1, evaluate=False))

    def _begin(self, value):
        return self.matrix()

    def _word(self, value: str):
        """A bare word: a function (``sin x``), a constant (``pi``, ``oo``), a one-letter
        variable (``e`` is Euler's number), ``sqrt``, or else a word answer (``Monday``)."""
        if value in _FUNCS:
            return self.function(value.lstrip("\\"))
        if value in ("oo", "inf", "infinity", "infty", "pi"):
            return _CONSTS[value]
        if value in _JOINERS:
            raise ParseError(f"unexpected {value!r}")
        if len(value) == 1:
            return sp.E if value == "e" else sp.Symbol(value)
        if value.lower() in ("sqrt",):
            return power(as_expr(self.atom()), sp.Rational(1, 2))
        return Text(value.lower(), value)  # a word answer ("Monday", "odd")

    def _command(self, value: str):
        """A command: a function (``\\sin``), a constant (``\\pi``) or a Greek letter."""
        if value[1:] in _FUNCS:
            return self.function(value.lstrip("\\"))
        if value[1:] in _CONSTS:
            return _CONSTS[value[1:]]
        if _greek(value):
            return sp.Symbol(value[1:])  # \alpha, \theta
        raise ParseError(f"unexpected {value!r}")

    def bracket(self, opener):
        closer_ok = {"(": (")", "]"), "[": ("]", ")"), "\\{": ("\\}",)}[opener]
        items = [self.relation()] if self.peek()[1] not in closer_ok else []
        while self.accept(","):
            items.append(self.relation())
            if len(items) > MAX_ITEMS:
                raise ParseError("too many items")
        close = self.take()[1]
        if close not in closer_ok:
            raise ParseError(f"expected one of {closer_ok}")
        if opener == "\\{":
            items = _flatten(items)  # \{1 \pm \sqrt5, -2\}: three elements
        if len(items) == 1 and (
            opener == "(" and close == ")" or isinstance(items[0], sp.MatrixBase)
        ):
            return items[0]
        return Seq(tuple(items), opener.lstrip("\\"), close.lstrip("\\"))

    def matrix(self):
        """``\\begin{pmatrix} a & b \\\\ c & d \\end{pmatrix}`` (any of :data:`_MATRICES`),
        at most :data:`MAX_ITEMS` entries, every row the same length."""
        env = self._matrix_env()
        rows = self._matrix_rows()
        if not rows or len({len(r) for r in rows}) != 1:
            raise ParseError(f"ragged {env}")
        return sp.ImmutableMatrix(rows)

    def _matrix_env(self) -> str:
        """The environment's name, after ``\\begin``; an array's column spec is skipped."""
        self.expect("{")
        env = self.take()[1]
        self.expect("}")
        if env not in _MATRICES:
            raise ParseError(f"not a matrix: {env}")
        if env == "array" and self.accept("{"):  # column spec {cc}, {c|c}
            for _ in range(40):
                if self.take()[1] in ("}", None):
                    break
        return env

    def _matrix_rows(self) -> list:
        """The entries up to and including ``\\end{...}``, split into rows at ``\\\\``."""
        rows, row = [], []
        while not self._matrix_end():
            row.append(as_expr(self.expr()))
            sep = self.accept("&", "\\\\")
            if sep == "\\\\":
                rows.append(row)
                row = []
            elif sep is None and self.peek()[1] != "\\end":
                raise ParseError("expected & or \\\\ in matrix")
            if sum(len(r) for r in rows) + len(row) > MAX_ITEMS:
                raise ParseError("matrix too large")
        if row:
            rows.append(row)
        return rows

    def _matrix_end(self) -> bool:
        """Consume ``\\end{...}`` when it is next; fail at the end of the input."""
        if self.peek()[1] == "\\end":
            self.take()
            self.expect("{")
            self.take()
            self.expect("}")
            return True
        if self.peek()[1] is None:
            raise ParseError("unterminated matrix")
        return False

    _OPENERS = {
        "(": bracket,
        "[": bracket,
        "\\{": bracket,
        "{": _braces,
        "|": _bars,
        "\\frac": _fraction,
        "\\binom": _fraction,
        "\\sqrt": _sqrt,
        "\\begin": _begin,
    }


def parse(text: str, max_length: int = 2000):
    """Parse an answer string into sympy objects (or Seq / Equation / Union / Text ...)."""
    if len(text) > max_length:
        raise ParseError("answer too long")
    s = normalise(text)
    if not s:
        raise ParseError("empty answer")
    if _SPLIT_DIGITS.search(s):  # 4 4/0, 3 5/4, 2 3: not a product, not a mixed number
        raise ParseError("digits separated by a space")
    return Parser(tokenize(s)).top()
