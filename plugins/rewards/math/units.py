"""Units after (or a currency sign before) an answer: split them off and name them.

``split_unit("15\\mbox{ cm}^2") == ("15", "cm^2")``. The comparison then uses the value, and
rejects the pair when both sides name units and the units differ: ``5 cm`` is not ``5 m``.
A unit on one side only is fine (``5`` matches ``5 cm``). Unit names are canonicalised
(``inches`` -> ``in``, ``square feet`` / ``ft^2`` / ``sq ft`` -> ``ft^2``, ``\\$`` ->
``usd``); unknown words are compared after a plain singular rule (``apples`` -> ``apple``).
Conversions are never attempted: ``1 m`` and ``100 cm`` are different answers here.
"""

from __future__ import annotations

import re

_ALIASES = {
    "cm": "cm",
    "centimeter": "cm",
    "centimetre": "cm",
    "mm": "mm",
    "millimeter": "mm",
    "millimetre": "mm",
    "km": "km",
    "kilometer": "km",
    "kilometre": "km",
    "m": "m",
    "meter": "m",
    "metre": "m",
    "in": "in",
    "inch": "in",
    "ft": "ft",
    "foot": "ft",
    "feet": "ft",
    "yd": "yd",
    "yard": "yd",
    "mi": "mi",
    "mile": "mi",
    "s": "s",
    "sec": "s",
    "second": "s",
    "min": "min",
    "minute": "min",
    "h": "h",
    "hr": "h",
    "hour": "h",
    "day": "day",
    "week": "week",
    "month": "month",
    "year": "year",
    "yr": "year",
    "g": "g",
    "gram": "g",
    "kg": "kg",
    "kilogram": "kg",
    "mg": "mg",
    "lb": "lb",
    "pound": "lb",
    "oz": "oz",
    "ounce": "oz",
    "ton": "ton",
    "l": "l",
    "liter": "l",
    "litre": "l",
    "ml": "ml",
    "milliliter": "ml",
    "gal": "gal",
    "gallon": "gal",
    "degree": "deg",
    "deg": "deg",
    "radian": "rad",
    "rad": "rad",
    "dollar": "usd",
    "usd": "usd",
    "cent": "cent",
    "euro": "eur",
    "mph": "mi/h",
    "kph": "km/h",
    "percent": "percent",
    "pct": "percent",
    "unit": "unit",
    "sq": "square",
    "p.m": "pm",
    "a.m": "am",
    "pm": "pm",
    "am": "am",
}
_UNIT_NAMES = frozenset(_ALIASES.values())
_PROSE_TOO = {"in", "am"}  # units that are also common words ("12 in total")
_SQUARE = {"square", "sq", "sq."}
_CUBIC = {"cubic", "cu", "cu."}
_POWER_WORDS = {"squared": 2, "cubed": 3}
#: names of mathematics that are no unit and no prose word ("3 pi", "2 sqrt 3", "5 times")
MATH_NAMES = frozenset(
    {
        "and",
        "or",
        "pi",
        "sqrt",
        "sin",
        "cos",
        "tan",
        "cot",
        "sec",
        "csc",
        "log",
        "ln",
        "exp",
        "infty",
        "infinity",
        "inf",
        "times",
        "cdot",
    }
)
#: words after a number that are math, not a unit
_NOT_UNITS = MATH_NAMES | {
    "i",
    "e",
    "x",
    "y",
    "z",
    "n",
    "k",
    "t",
    "div",
    "to",
    "of",
    "is",
    "but",
    "not",
    "if",
    "for",
    "with",
    "when",
    "where",
    "are",
}
_CURRENCY = {
    "\\$": "usd",
    "$": "usd",
    "€": "eur",
    "£": "gbp",
    "¥": "jpy",
    "\\euro": "eur",
    "\\pounds": "gbp",
    "USD": "usd",
    "US$": "usd",
    "Rs.": "inr",
}

_TEXT = (
    r"\\(?:text|mbox|textrm|mathrm|textnormal|textbf|textit)\s*\{(?:\s|~|\\[,;: ])*"
    r"([A-Za-z][A-Za-z./ ]{0,40}?)\s*\}"
)
_POWER = r"(?:\s*\^\s*\{?\s*([23])\s*\}?)?"
_TRAILING_TEXT = re.compile(r"(?:\\[,;: !]|~|\s)*" + _TEXT + _POWER + r"\s*\.?\s*$")
_TRAILING_WORDS = re.compile(
    r"(?<=[\d}).π])\s+([A-Za-z][A-Za-z./]{0,20}(?:\s+[A-Za-z][A-Za-z./]"
    r"{0,20}){0,2})" + _POWER + r"\s*\.?\s*$"
)
_DEGREES = re.compile(
    r"\s*(?:\^\s*\{?\s*\\circ\s*\}?|°|\\degree)\s*(?:\\text\s*\{\s*([CF])\s*\}|"
    r"\\mathrm\s*\{\s*([CF])\s*\}|([CF]))?\s*\.?\s*$"
)
_WRAPPED = re.compile(r"\\(?:text|mbox|textrm|mathrm)\s*\{\s*([-+]?\d[^{}]*)\}\s*\.?\s*")
_HAS_VALUE = re.compile(r"[\d}]|\\(?:pi|sqrt|frac|infty)")


def _word(w: str) -> str:
    w = w.lower().rstrip(".")
    if w in _ALIASES:
        return _ALIASES[w]
    if w.endswith("ies") and len(w) > 4:
        w = w[:-3] + "y"
    elif w.endswith("es") and w[:-2] in _ALIASES:
        w = w[:-2]
    elif w.endswith("s") and not w.endswith("ss") and len(w) > 2:
        w = w[:-1]
    return _ALIASES.get(w, w)


def unit_word(word: str) -> bool:
    """Is ``word`` (part of) a unit name: ``cm``, ``inches``, ``square``, ``per``?"""
    low = word.lower().rstrip(".")
    if low in _PROSE_TOO:
        return False
    return (
        low in _SQUARE
        or low in _CUBIC
        or low in _POWER_WORDS
        or low == "per"
        or _word(low) in _UNIT_NAMES
    )


def unit_name(words: str, power: str | None = None) -> str | None:
    """Canonical name of a unit phrase such as ``square feet`` or ``meters per second``."""
    parts = words.replace("/", " per ").split()
    if not parts or any(p.lower() in _NOT_UNITS for p in parts):
        return None
    if any(len(p) == 1 and p.lower() not in _ALIASES for p in parts):
        return None  # a lone letter is a variable, not a unit
    exp = int(power) if power else 1
    out: list[str] = []
    per = False
    for p in parts:
        low = p.lower().rstrip(".")
        if low in _SQUARE:
            exp = max(exp, 2)
        elif low in _CUBIC:
            exp = max(exp, 3)
        elif low in _POWER_WORDS:
            exp = _POWER_WORDS[low]
        elif low == "per":
            per = True
        else:
            name = _word(p)
            out.append(("/" if per else "") + name)
            per = False
    if not out:
        return None
    name = out[0] + (f"^{exp}" if exp > 1 else "") + "".join(out[1:])
    return name


def split_unit(text: str) -> tuple[str, str | None]:
    """``(value text, canonical unit or None)``; the text is returned unchanged when no unit."""
    s = text.strip()
    unit = None
    m = _WRAPPED.fullmatch(s)
    if m:  # \text{12 cm}: the value is inside the text
        s = m.group(1).strip()
    for sign, name in _CURRENCY.items():
        if s.startswith(sign) and len(s) > len(sign):
            s, unit = s[len(sign) :].strip(), name
            break
        if s.startswith("-" + sign):
            s, unit = "-" + s[len(sign) + 1 :].strip(), name
            break
    m = _TRAILING_TEXT.search(s)
    if m and _HAS_VALUE.search(s[: m.start()]):
        name = unit_name(m.group(1), m.group(2))
        if name is not None:
            return s[: m.start()].strip(), _merge(unit, name)
    m = _TRAILING_WORDS.search(s)
    if m and _HAS_VALUE.search(s[: m.start()]):
        name = unit_name(m.group(1), m.group(2))
        if name == "percent":
            return s[: m.start()].strip() + "\\%", unit
        if name is not None:
            return s[: m.start()].strip(), _merge(unit, name)
    m = _DEGREES.search(s)
    if (
        m
        and _HAS_VALUE.search(s[: m.start()])
        and not re.search(r"\\(?:sin|cos|tan|cot|sec|csc)", s)
    ):
        scale = m.group(1) or m.group(2) or m.group(3)
        return s[: m.start()].strip(), _merge(unit, "deg" + (scale or ""))
    return s if unit or s != text.strip() else text, unit


def conflict(a: str | None, b: str | None) -> bool:
    """Both sides name units and they differ (a bare degree sign fits °C and °F)."""
    if not a or not b or a == b:
        return False
    return {a, b} not in ({"deg", "degC"}, {"deg", "degF"})


def _merge(currency: str | None, name: str) -> str:
    if currency is None or currency == name:
        return name
    return f"{currency} {name}"  # "$5 dollars" stays one (odd) unit
