"""Built-in environments: ``calculator`` (a tool) and ``guess_number`` (a game with feedback).

The calculator evaluates what the model writes between its tags with the math reward's
parser (plugins/rewards/math/parse.py), which builds sympy objects without evaluating any
input as code and bounds every size that could explode; errors come back as observations.
"""

from __future__ import annotations

import re
from fractions import Fraction

import sympy as sp
from grpo_core_plugins.rewards.math.nodes import as_expr
from grpo_core_plugins.rewards.math.numeric import approx, exact
from grpo_core_plugins.rewards.math.parse import parse

from grpo_core.hookspecs import Environment, Observation, hookimpl

GRPO_CORE_API = (2,)

MAX_RESULT = 60  # characters of a result; longer exact values are given in scientific form


def calculate(expression: str, max_length: int = 200) -> str:
    """The value of an arithmetic expression as text; ValueError (or ArithmeticError) with
    a short reason when it has none."""
    node = as_expr(parse(expression, max_length))
    if not isinstance(node, sp.Expr) or node.free_symbols:
        raise ValueError(
            "not an arithmetic expression"
            if not isinstance(node, sp.Expr)
            else f"unknown name {sorted(map(str, node.free_symbols))[0]!r}"
        )
    value = exact(node)
    if value is not None:
        return _fraction(value)
    import mpmath

    ctx = mpmath.MPContext()
    ctx.dps = 15
    v = approx(node, ctx, {}, [ctx.mpf(0)])
    if not isinstance(v, ctx.mpf) or not ctx.isfinite(v):
        raise ValueError("the value is not a finite real number")
    return ctx.nstr(v, 12)


def _fraction(q: Fraction) -> str:
    if q.denominator == 1:
        text = str(q.numerator)
        if len(text) <= MAX_RESULT:
            return text
    import mpmath

    ctx = mpmath.MPContext()
    ctx.dps = 15
    return ctx.nstr(ctx.mpf(q.numerator) / q.denominator, 12)


class Calculator(Environment):
    """A tool: the model writes ``<calc>EXPRESSION</calc>`` (the closing tag ends its turn)
    and gets the value back (``error: ...`` when there is none); a turn without a call is
    the final answer and ends the episode."""

    role = "tool"

    def __init__(
        self,
        open_tag: str = "<calc>",
        close_tag: str = "</calc>",
        result_delimiters: tuple[str, str] | list[str] = ("<result>", "</result>"),
        max_length: int = 200,
    ):
        self.open, self.close_tag, self.max_length = open_tag, close_tag, max_length
        self.stop_strings = (close_tag,)
        self.delimiters = tuple(result_delimiters)

    def reset(self, row: dict) -> None:
        return None  # the calculator keeps nothing between calls

    def step(self, state, text: str) -> Observation:
        start = text.rfind(self.open)
        if start < 0:
            return Observation(done=True)
        end = text.find(self.close_tag, start + len(self.open))
        if end < 0:
            return Observation("error: no closing tag", tool_call=True, tool_error=True)
        try:
            return Observation(
                calculate(text[start + len(self.open) : end], self.max_length), tool_call=True
            )
        except (ValueError, ArithmeticError, TypeError, RecursionError) as exc:  # no value
            reason = str(exc).splitlines()[0][:80] if str(exc) else type(exc).__name__
            return Observation(f"error: {reason}", tool_call=True, tool_error=True)


_INT = re.compile(r"-?\d+")


class GuessNumber(Environment):
    """A game: the model guesses an integer, hears ``higher`` or ``lower`` and guesses again
    until it is right (``correct``, the episode ends). The secret is the row's
    ``target_column``; the last number in a turn is its guess."""

    role = "user"
    delimiters = ("\n", "\n")

    @classmethod
    def columns_for(cls, options: dict) -> tuple[str, ...]:
        return (options["target_column"],)

    def __init__(self, target_column: str = "answer", low: int = 1, high: int = 100):
        self.column, self.low, self.high = target_column, low, high

    def reset(self, row: dict) -> dict:
        return {"target": int(str(row[self.column]).strip())}

    def step(self, state: dict, text: str) -> Observation:
        found = _INT.findall(text[-1000:])
        if not found:
            return Observation(f"say a number from {self.low} to {self.high}", tool_error=True)
        guess = int(found[-1][-20:])
        if guess == state["target"]:
            return Observation("correct", done=True)
        return Observation("higher" if guess < state["target"] else "lower")


@hookimpl
def environment(register):
    register(
        "calculator",
        Calculator,
        schema={
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "open_tag": {"type": "string", "minLength": 1, "default": "<calc>"},
                "close_tag": {
                    "type": "string",
                    "minLength": 1,
                    "default": "</calc>",
                    "description": "ends the model's turn (a stop string)",
                },
                "result_delimiters": {
                    "type": "array",
                    "items": {"type": "string"},
                    "minItems": 2,
                    "maxItems": 2,
                    "default": ["<result>", "</result>"],
                    "description": "around a result when there is no chat template",
                },
                "max_length": {
                    "type": "integer",
                    "minimum": 1,
                    "maximum": 2000,
                    "default": 200,
                    "description": "longest expression parsed",
                },
            },
        },
        description="a calculator tool: <calc>expression</calc>, evaluated by the safe parser",
    )
    register(
        "guess_number",
        GuessNumber,
        schema={
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "target_column": {
                    "type": "string",
                    "default": "answer",
                    "description": "dataset field holding the secret integer",
                },
                "low": {"type": "integer", "default": 1},
                "high": {"type": "integer", "default": 100},
            },
        },
        description="guess the row's number; feedback higher / lower / correct",
    )
