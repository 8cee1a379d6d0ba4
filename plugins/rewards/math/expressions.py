"""The numbers and expressions of running text: which words are prose, and the whole
plain-text expression a number belongs to (``Therefore 7/2`` is ``7/2``, ``3 + 4 = 7`` is
``7``, ``abc12def`` and ``x^2`` are no answer). Shared by the marker patterns
(:mod:`.extract`) and the reading of completions without a marker (:mod:`.sentences`).

Every function is linear in the text it is given, and callers bound that text (``MAX_TAIL``).
"""

from __future__ import annotations

import re

from grpo_core_plugins.rewards.math.normalise import _VULGAR, separators
from grpo_core_plugins.rewards.math.units import MATH_NAMES, unit_name, unit_word

MAX_TAIL = 1_000  # characters read after an answer marker, or at the end of an unmarked text

DIGITS = frozenset("0123456789") | frozenset(_VULGAR)
#: characters a plain-text expression is written with (the last-number fallback's reach)
_EXPR_CHARS = DIGITS | frozenset(" \t+-−*/^().%=√π·×÷")
_PROSE_WORD = re.compile(r"(?<![\\A-Za-z0-9])[A-Za-z]{2,}")  # not 12abc
#: words that are math, not prose: the names a unit reader also skips, and LaTeX's
_MATH_WORDS = MATH_NAMES | {"arcsin", "arccos", "arctan", "pm", "mp", "frac", "dfrac", "tfrac"}


def depth_zero_words(s: str):
    """Prose words (two letters or more, not a command) outside braces, as matches; one pass."""
    depth, last = 0, 0
    for m in _PROSE_WORD.finditer(s):
        depth += s.count("{", last, m.start()) - s.count("}", last, m.start())
        last = m.start()
        if depth == 0:
            yield m


def is_prose(word: str) -> bool:
    return word.lower() not in _MATH_WORDS and not unit_word(word)


GLUED = re.compile(r"(?<![\\A-Za-z])[A-Za-z]+\d")  # a1b2: letters glued to digits, not x^2


def _expression_start(tail: str, end: int) -> int:
    """Where the plain-text expression that ends at ``tail[end]`` starts."""
    start = end
    while start > 0 and (
        tail[start - 1] in _EXPR_CHARS
        or tail[start - 1] == ","
        and tail[start - 2 : start - 1].isdigit()
        and tail[start].isdigit()
    ):
        start -= 1
    return start


def _enclosing_span(tail: str, k: int) -> str | None:
    """The content of the ``$...$`` or ``\\(...\\)`` span around position ``k`` (``""`` for
    an unclosed ``\\(``), or None when ``k`` is in prose (a lone ``$`` is a currency sign):
    ``$x \\geq 5$`` is read whole."""
    dollars = [j for j in range(k) if tail[j] == "$" and tail[j - 1 : j] != "\\"]
    if len(dollars) % 2:
        close = tail.find("$", k)
        inner = tail[dollars[-1] + 1 : close].strip("$ \n") if close >= 0 else ""
        if inner and not any(is_prose(m.group(0)) for m in depth_zero_words(inner)):
            # not "$5, so 350$": dollar signs around prose are currency; inline math does
            # not run over a line break ("$ \n 9 \n $" is no answer)
            return "" if "\n" in tail[dollars[-1] : close] else inner
    opened = max(tail.rfind("\\(", 0, k), tail.rfind("\\[", 0, k))
    if opened >= 0 and opened > max(tail.rfind("\\)", 0, k), tail.rfind("\\]", 0, k)):
        close = re.compile(r"\\[)\]]").search(tail, k)
        inner = tail[opened + 2 : close.start()] if close else ""
        return "" if tail[opened + 1] == "(" and "\n" in inner else inner.strip()
    return None


#: a number, then "or"/"and" right before the last expression: "5 or 6", "x = 2 or x = 5"
_HEDGED = re.compile(r"\d[?)]?\s*,?\s*(?:\b(or)\b[^.\n\d]{0,12}|\band[ \t]*)$", re.IGNORECASE)
_CLOCK = re.compile(r"(\d{1,2})[ \t]*:[ \t]*$")  # the 4: of 4:30, the 3: of 3:4
_MERIDIEM = re.compile(r"[ \t]*([ap])\.?[ \t]?m\b\.?", re.IGNORECASE)  # after a clock time
_SCALE = re.compile(r"[ \t]*(?:hundred|thousand|million|billion|trillion)s?\b", re.I)
_UNIT_AFTER = re.compile(r"[ \t]*([A-Za-z]+\.?)([²³]|\^\{?[23]\}?)?")


def _ordinal(tail: str, stop: int) -> bool:
    """Is the number ending at ``stop`` an ordinal with its right suffix (1st, 12th, 23rd)?"""
    suffix = re.match(r"(st|nd|rd|th)(?![A-Za-z])", tail[stop : stop + 3])
    if not suffix or not tail[stop - 1 : stop].isdigit():
        return False
    tens = tail[stop - 2 : stop - 1]
    last = tail[stop - 1]
    right = "th" if tens == "1" else {"1": "st", "2": "nd", "3": "rd"}.get(last, "th")
    return suffix.group(1) == right


def _expression_end(tail: str, end: int) -> tuple[int, str] | None:
    """(where the expression ending at digit ``tail[end]`` stops, the unit written after it);
    None when letters are glued to the number (``12abc``, ``5th``) or an operator follows it
    (``3 +``): then the number is not a whole expression."""
    stop = end + 1
    meridiem = _MERIDIEM.match(tail, stop)
    if meridiem and re.search(r"\d:\d\d$", tail[max(0, stop - 5) : stop]):
        return stop, " " + meridiem.group(1).replace(".", "").lower() + "m"  # 3:45 a.m.
    while tail[stop : stop + 1] in ("%", "π", "∞", "²", "³"):
        stop += 1
    if _SCALE.match(tail, stop):
        return None  # 3,5 million: not the number 3,5
    unit = _UNIT_AFTER.match(tail, stop)
    if unit and unit_word(unit.group(1)) and unit_name(unit.group(1)) is not None:
        power = {"²": "^2", "³": "^3"}.get(unit.group(2), unit.group(2) or "")
        return stop, " " + unit.group(1) + power
    per = re.match(r"/([A-Za-z]+)\b", tail[stop : stop + 30])
    if per and unit_word(per.group(1)) or _ordinal(tail, stop):
        return stop, ""  # $57500/year, 6th place
    if re.match(r"[A-Za-z0-9]", tail[stop : stop + 1]):
        return None
    if tail[stop:].lstrip(" \t")[:1] in ("+", "-", "−", "*", "/", "^", "=", "×", "÷", "·"):
        return None
    return stop, ""


def _whole_from(tail: str, start: int, end: int) -> int | None:
    """Where the answer in ``tail[start:end]`` starts: after its last "=" (``3 + 4 = 7``,
    ``x=5``), at a clock time's hour (``4:30``); None when the expression is glued to what
    comes before it (``x2``, ``\\frac{7}{2}`` in prose) or ends a list (``3, 4``)."""
    equals = tail.rfind("=", start, end)
    if equals >= 0:
        return equals + 1
    start += len(re.match(r"(?:[ \t)]|\*\*)*", tail[start:end]).group(0))
    clock = _CLOCK.search(tail, max(0, start - 6), start)
    if clock:
        start = clock.start()
    prev = tail[start - 1 : start]
    if prev and (prev.isalnum() or prev in "_^\\{}|!:"):
        return None
    if re.search(r"\d\s*,\s*$", tail[max(0, start - 8) : start]):
        return None  # (3, 4), "sizes 3, 4, 5": one item of a list
    return start


def _last_expression(text: str, first: bool = True) -> str | None:
    """The whole plain-text expression around the last number, or None when that number is
    part of something else: ``Therefore 7/2`` -> ``7/2``, ``so x=5`` -> ``5``, ``3 + 4 = 7``
    -> ``7``, ``at 4:30 PM`` -> ``4:30 PM``, ``3/8 or 0.375`` and ``5 or 6`` whole (a list,
    which matches one gold only when every item does); ``abc12def``, ``x^2``, ``n - 2`` and
    ``3 +`` give None (junk, or a part)."""
    tail = separators(text[-MAX_TAIL:]) if first else text
    end = last_digit(tail, len(tail))
    if end < 0:
        return None
    found = expression_at(tail, end, first)
    return found[1] if found else None


def last_digit(tail: str, before: int) -> int:
    """Position of the last digit (or ``∞``) in ``tail[:before]``; -1 when there is none."""
    return next((j for j in range(before - 1, -1, -1) if tail[j] in DIGITS or tail[j] == "∞"), -1)


def expression_at(tail: str, end: int, first: bool = True) -> tuple[int, str] | None:
    """(start, text) of the whole expression whose last digit is ``tail[end]``, or None when
    that number is part of something else (see :func:`_last_expression`)."""
    span = _enclosing_span(tail, end)
    if span is not None:
        return (_span_start(tail, end), span) if span else None
    found = _expression_end(tail, end)
    if found is None:
        return None
    stop, unit = found
    start = _expression_start(tail, end)
    hedge = _HEDGED.search(tail, max(0, start - 40), start)
    start = _whole_from(tail, start, end)
    if start is None:
        return None
    while tail[stop : stop + 1] == ")" and tail.count("(", start, stop) > tail.count(
        ")", start, stop
    ):
        stop += 1  # (5)
    run = tail[start:stop].strip()
    if (
        run[:1] in ("*", "/", "^", "×", "÷", "·")
        or run[:1] in "+-−"
        and run[1:2] in " \t"
        or tail[stop:].lstrip(" \t")[:1] == ")"
    ):
        return None  # n - 2, a/2: the rest of an expression; (3, 4): inside a bracket
    while run.startswith("(") and run.count("(") > run.count(")"):
        run = run[1:].strip()
    if run.count("(") != run.count(")"):
        return None
    if hedge is None:
        return start, run + unit
    before = _last_expression(tail[: hedge.start() + 1], first=False) if first else None
    if not before:
        return None
    return hedge.start(), f"{before} {'or' if hedge.group(1) else 'and'} {run}{unit}"


def _span_start(tail: str, k: int) -> int:
    """Where the math span around position ``k`` opens (see :func:`_enclosing_span`)."""
    return max(tail.rfind("$", 0, k), tail.rfind("\\(", 0, k), tail.rfind("\\[", 0, k), 0)
