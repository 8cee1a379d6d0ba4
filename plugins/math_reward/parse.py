"""A LaTeX / plain-text math parser that never calls ``eval``.

Text is normalised (unicode, ``\\dfrac``, units, ``\\text{}``), tokenised, then parsed by
recursive descent straight into sympy objects built with ``evaluate=False``. Nothing from
the input is ever executed; every size that could explode is bounded:
input length, nesting depth, exponents of numbers, factorial arguments, matrix size.
Decimals become exact rationals, so ``0.5`` equals ``1/2`` but ``0.333`` is not ``1/3``.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass

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
    """A bracketed or bare comma list: ``open``/``close`` are '(', '[', '{', '' (bare)."""

    items: tuple
    open: str
    close: str


@dataclass(frozen=True)
class Equation:
    lhs: object
    rhs: object


@dataclass(frozen=True)
class Union:
    parts: tuple


@dataclass(frozen=True)
class Text:
    value: str


_SUPERSCRIPTS = str.maketrans("⁰¹²³⁴⁵⁶⁷⁸⁹⁻⁺", "0123456789-+")
_VULGAR = {"½": "(1/2)", "⅓": "(1/3)", "⅔": "(2/3)", "¼": "(1/4)", "¾": "(3/4)", "⅕": "(1/5)",
           "⅖": "(2/5)", "⅗": "(3/5)", "⅘": "(4/5)", "⅙": "(1/6)", "⅚": "(5/6)", "⅛": "(1/8)",
           "⅜": "(3/8)", "⅝": "(5/8)", "⅞": "(7/8)", "⅐": "(1/7)", "⅑": "(1/9)", "⅒": "(1/10)"}
_UNICODE = {"−": "-", "–": "-", "×": "*", "·": "*", "⋅": "*", "÷": "/", "π": "\\pi ",
            "∞": "\\infty ", "√": "\\sqrt", "≤": "\\le ", "≥": "\\ge ", "∪": "\\cup ",
            "±": "\\pm ", "°": "^\\circ", "∓": "\\mp "}
_DROP = [r"\\left", r"\\right", r"\\displaystyle", r"\\!", r"\\,", r"\\;", r"\\:", r"\\ ",
         r"\\quad", r"\\qquad", r"\\limits", "\\$", r"\\mathrm", r"\\mathbf", r"\\mathit",
         r"\\boldsymbol", r"\\operatorname"]
_UNITS = (r"(?:square\s+|sq\.?\s*|cubic\s+)?(?:units?|cm|mm|km|m|meters?|centimeters?|inches?|"
          r"feet|foot|ft|miles?|mph|hours?|hrs?|minutes?|mins?|seconds?|sec|s|days?|weeks?|"
          r"years?|dollars?|cents?|degrees?|pounds?|lbs?|ounces?|oz|kg|g|grams?|liters?|l|ml|"
          r"people|students?|apples?|items?|points?|percent)(?:\^?\{?[23]\}?)?")


def _superscripts(s: str) -> str:
    return re.sub(r"[⁰¹²³⁴⁵⁶⁷⁸⁹⁻⁺]+", lambda m: "^{" + m.group(0).translate(_SUPERSCRIPTS) + "}",
                  s)


def normalise(s: str) -> str:
    """Rewrite the many spellings of the same math into one LaTeX-ish form."""
    s = _superscripts(s)
    for k, v in _VULGAR.items():
        s = s.replace(k, v)
    for k, v in _UNICODE.items():
        s = s.replace(k, v)
    s = unicodedata.normalize("NFKC", s).replace("⁄", "/")
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac").replace("\\cfrac", "\\frac")
    s = re.sub(r"\\frac\s*(\d)\s*(\d)", r"\\frac{\1}{\2}", s)  # \frac34
    s = re.sub(r"\\frac\s*\{([^{}]*)\}\s*(\d)", r"\\frac{\1}{\2}", s)
    s = re.sub(r"\\frac\s*(\d)\s*\{", r"\\frac{\1}{", s)
    s = re.sub(r"\^\s*\{?\s*\\circ\s*\}?", "", s)  # degrees
    s = s.replace("\\circ", "")
    for d in _DROP:
        s = re.sub(d + r"(?![a-zA-Z])", " ", s)
    s = re.sub(r"\\(?:text|textbf|textit|mbox)\s*\{\s*\}", " ", s)
    s = re.sub(r"(\d)\s*\\(?:text|mbox)\s*\{\s*" + _UNITS + r"\s*\}", r"\1", s)
    s = re.sub(r"\\(?:text|textbf|textit|mbox)\s*\{([^{}]*)\}", r" \1 ", s)
    s = s.replace("\\%", "%").replace("$", "")
    s = re.sub(r"(\d)\s+" + _UNITS + r"\s*$", r"\1", s.strip())
    s = re.sub(r"^(?:\\approx|=)\s*", "", s.strip())
    s = re.sub(r"\.\s*$", "", s).strip()
    if re.fullmatch(r"[-+]?\d{1,3}(?:,\d{3})+(?:\.\d+)?", s):  # thousands separators
        s = s.replace(",", "")
    return s


_TOKEN = re.compile(r"""
    (?P<num>\d+(?:\.\d*)?(?:[eE][-+]?\d+(?![a-zA-Z]))?|\.\d+)
  | (?P<cmd>\\[a-zA-Z]+|\\[{}|]|\\\\)
  | (?P<word>[a-zA-Z]+)
  | (?P<op><=|>=|!=|\*\*|[-+*/^_()\[\]{}|,=<>!%&;:'])
  | (?P<ws>\s+)
""", re.VERBOSE)


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


_FUNCS = {"sin": sp.sin, "cos": sp.cos, "tan": sp.tan, "cot": sp.cot, "sec": sp.sec,
          "csc": sp.csc, "arcsin": sp.asin, "arccos": sp.acos, "arctan": sp.atan,
          "sinh": sp.sinh, "cosh": sp.cosh, "tanh": sp.tanh, "ln": sp.log, "log": sp.log,
          "exp": sp.exp}
_CONSTS = {"pi": sp.pi, "infty": sp.oo, "infinity": sp.oo, "inf": sp.oo, "oo": sp.oo,
           "e": sp.E}
_CLOSERS = {"(": ")", "[": "]", "\\{": "\\}", "{": "}"}


class Parser:
    def __init__(self, tokens):
        self.t, self.i, self.depth = tokens, 0, 0

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
        """answer := union | list | equation."""
        first = self.relation_list()
        if self.peek()[1] is not None:
            raise ParseError(f"unexpected {self.peek()[1]!r}")
        return first

    def relation_list(self):
        items = [self.relation()]
        while self.accept(",", ";"):
            if self.peek()[1] in ("and", "or"):
                self.take()
            items.append(self.relation())
        if len(items) > MAX_ITEMS:
            raise ParseError("too many items")
        return items[0] if len(items) == 1 else Seq(tuple(items), "", "")

    def relation(self):
        left = self.union()
        if self.accept("="):
            right = self.union()
            return Equation(left, right)
        op = self.accept("<", ">", "<=", ">=", "\\le", "\\ge", "\\leq", "\\geq", "\\lt", "\\gt",
                         "\\neq", "!=")
        if op:
            right = self.union()
            rel = {"<": sp.StrictLessThan, "\\lt": sp.StrictLessThan, ">": sp.StrictGreaterThan,
                   "\\gt": sp.StrictGreaterThan, "<=": sp.LessThan, "\\le": sp.LessThan,
                   "\\leq": sp.LessThan, ">=": sp.GreaterThan, "\\ge": sp.GreaterThan,
                   "\\geq": sp.GreaterThan, "\\neq": sp.Unequality, "!=": sp.Unequality}[op]
            return rel(_sym(left), _sym(right), evaluate=False)
        return left

    def union(self):
        parts = [self.expr()]
        while self.accept("\\cup", "U"):
            parts.append(self.expr())
        return parts[0] if len(parts) == 1 else Union(tuple(parts))

    def expr(self):
        self.enter()
        if self.accept("+"):
            pass
        node = self.term()
        while True:
            op = self.accept("+", "-", "\\pm", "\\mp")
            if not op:
                break
            right = self.term()
            if op == "+":
                node = sp.Add(_sym(node), _sym(right), evaluate=False)
            elif op == "-":
                node = sp.Add(_sym(node), sp.Mul(-1, _sym(right), evaluate=False), evaluate=False)
            else:
                node = Seq((sp.Add(_sym(node), _sym(right), evaluate=False),
                            sp.Add(_sym(node), -_sym(right), evaluate=False)), "", "")
        self.depth -= 1
        return node

    def term(self):
        node = self.unary()
        while True:
            op = self.peek()[1]
            if op in ("*", "\\cdot", "\\times", "/", "\\div"):
                self.take()
                right = self.unary()
                if op in ("/", "\\div"):
                    node = sp.Mul(_sym(node), sp.Pow(_sym(right), -1, evaluate=False),
                                  evaluate=False)
                else:
                    node = sp.Mul(_sym(node), _sym(right), evaluate=False)
            elif self._starts_atom():  # implicit multiplication: 2x, 2\pi, (a)(b)
                right = self.unary()
                node = sp.Mul(_sym(node), _sym(right), evaluate=False)
            else:
                return node

    def _starts_atom(self) -> bool:
        kind, value = self.peek()
        if kind in ("num", "word"):
            return value not in ("and", "or", "U")
        return value in ("(", "\\frac", "\\sqrt", "\\pi", "\\infty", "\\{") or (
            kind == "cmd" and value[1:] in _FUNCS)

    def unary(self):
        if self.accept("-"):
            return sp.Mul(-1, _sym(self.unary()), evaluate=False)
        if self.accept("+"):
            return self.unary()
        return self.power()

    def power(self):
        base = self.postfix(self.atom())
        if self.accept("^", "**"):
            exp = self.postfix(self.group_or_atom(allow_unary=True))
            return _pow(_sym(base), _sym(exp))
        return base

    def postfix(self, node):
        while True:
            if self.accept("!"):
                node = _factorial(_sym(node))
            elif self.accept("%"):
                node = sp.Mul(_sym(node), sp.Rational(1, 100), evaluate=False)
            elif self.peek()[1] == "_":  # subscripts are names: x_1
                self.take()
                sub = self.take()[1]
                node = sp.Symbol(f"{node}_{sub}")
            else:
                return node

    def group_or_atom(self, allow_unary=False):
        if self.accept("{"):
            node = self.expr()
            self.expect("}")
            return node
        if allow_unary and self.accept("-"):
            return sp.Mul(-1, _sym(self.atom()), evaluate=False)
        if self.peek()[0] == "num":  # x^23 in LaTeX means x^2 3; be lenient: whole number
            return self.atom()
        return self.atom()

    def atom(self):
        self.enter()
        kind, value = self.take()
        try:
            if kind == "num":
                return _number(value)
            if value in ("(", "[", "\\{"):
                return self.bracket(value)
            if value == "{":
                node = self.relation_list()
                self.expect("}")
                return node
            if value == "|":
                node = self.expr()
                self.expect("|")
                return sp.Abs(_sym(node), evaluate=False)
            if value == "\\frac" or value == "\\binom":
                a, b = _sym(self.group_or_atom()), _sym(self.group_or_atom())
                if value == "\\binom":
                    return sp.binomial(a, b, evaluate=False)
                return sp.Mul(a, sp.Pow(b, -1, evaluate=False), evaluate=False)
            if value == "\\sqrt":
                index = None
                if self.accept("["):
                    index = _sym(self.expr())
                    self.expect("]")
                arg = _sym(self.group_or_atom())
                return _pow(arg, sp.Pow(index if index is not None else sp.Integer(2), -1,
                                        evaluate=False))
            if value == "\\begin":
                return self.matrix()
            if kind == "cmd" and value[1:] in _FUNCS or kind == "word" and value in _FUNCS:
                name = value.lstrip("\\")
                power = None
                if self.accept("^"):
                    power = _sym(self.group_or_atom(allow_unary=True))
                arg = _sym(self.group_or_atom() if self.peek()[1] != "(" else self.atom())
                node = _FUNCS[name](arg, evaluate=False)
                return _pow(node, power) if power is not None else node
            if kind == "cmd" and value[1:] in _CONSTS:
                return _CONSTS[value[1:]]
            if kind == "word":
                if value in ("oo", "inf", "infinity", "infty", "pi"):
                    return _CONSTS[value]
                if len(value) == 1:
                    return sp.E if value == "e" else sp.Symbol(value)
                if value.lower() in ("sqrt",):
                    return _pow(_sym(self.atom()), sp.Rational(1, 2))
                return Text(value.lower())  # a word answer ("Monday", "odd")
            if kind == "cmd" and len(value) > 2:
                return sp.Symbol(value[1:])  # \alpha, \theta
            raise ParseError(f"unexpected {value!r}")
        finally:
            self.depth -= 1

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
        if opener == "(" and close == ")" and len(items) == 1:
            return items[0]
        return Seq(tuple(items), opener.lstrip("\\"), close.lstrip("\\"))

    def matrix(self):
        self.expect("{")
        env = self.take()[1]
        self.expect("}")
        rows, row = [], []
        while True:
            if self.peek()[1] == "\\end":
                self.take()
                self.expect("{")
                self.take()
                self.expect("}")
                break
            if self.peek()[1] is None:
                raise ParseError("unterminated matrix")
            row.append(_sym(self.expr()))
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
        if not rows or len({len(r) for r in rows}) != 1:
            raise ParseError(f"ragged {env}")
        return sp.ImmutableMatrix(rows)


def _sym(node):
    if isinstance(node, (Seq, Equation, Union, Text)):
        raise ParseError("a list, equation or word cannot be used inside arithmetic")
    return node


def _number(text: str):
    digits = len(text.replace(".", ""))
    if digits > MAX_DIGITS:
        raise ParseError("number too long")
    if "e" in text.lower() or "." in text:
        mant, _, exp = text.lower().partition("e")
        if exp and abs(int(exp)) > MAX_EXPONENT:
            raise ParseError("exponent too large")
        return sp.Rational(mant if mant != "." else "0") * sp.Rational(10) ** int(exp or 0)
    return sp.Integer(text)


def _magnitude(x) -> float | None:
    """|x| as a float when x is a plain number (no symbols), else None; bounded work."""
    if x.free_symbols:
        return None
    try:
        v = sp.N(x, 15, maxn=60)
        return abs(complex(v))
    except (TypeError, ValueError, OverflowError, ZeroDivisionError):
        return None


def _pow(base, exp):
    if not exp.free_symbols:
        m = _magnitude(exp)
        if m is None or m > MAX_EXPONENT:
            raise ParseError("exponent too large")
    return sp.Pow(base, exp, evaluate=False)


def _factorial(n):
    m = _magnitude(n)
    if m is None or m > MAX_FACTORIAL:
        raise ParseError("factorial too large or not a number")
    return sp.factorial(n, evaluate=False)


def parse(text: str, max_length: int = 2000):
    """Parse an answer string into sympy objects (or Seq / Equation / Union / Text)."""
    if len(text) > max_length:
        raise ParseError("answer too long")
    s = normalise(text)
    if not s:
        raise ParseError("empty answer")
    return Parser(tokenize(s)).top()
