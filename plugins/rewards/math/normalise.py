"""Rewriting the many spellings of one answer into one LaTeX-ish form, before tokenising.

Every rule is a plain, linear-time regex or string replacement on text already bounded in
length by the caller. Rules that change a value (thousands separators, mixed numbers,
degrees) apply only where the reading is unambiguous in LaTeX.
"""

from __future__ import annotations

import re
import unicodedata

_SUPERSCRIPTS = str.maketrans("⁰¹²³⁴⁵⁶⁷⁸⁹⁻⁺", "0123456789-+")
_VULGAR = {
    "½": "1/2",
    "⅓": "1/3",
    "⅔": "2/3",
    "¼": "1/4",
    "¾": "3/4",
    "⅕": "1/5",
    "⅖": "2/5",
    "⅗": "3/5",
    "⅘": "4/5",
    "⅙": "1/6",
    "⅚": "5/6",
    "⅛": "1/8",
    "⅜": "3/8",
    "⅝": "5/8",
    "⅞": "7/8",
    "⅐": "1/7",
    "⅑": "1/9",
    "⅒": "1/10",
}
_UNICODE = {
    "−": "-",
    "–": "-",
    "×": "*",
    "·": "*",
    "⋅": "*",
    "÷": "/",
    "π": "\\pi ",
    "∞": "\\infty ",
    "√": "\\sqrt",
    "≤": "\\le ",
    "≥": "\\ge ",
    "∪": "\\cup ",
    "±": "\\pm ",
    "°": "^\\circ",
    "∓": "\\mp ",
    "≠": "\\neq ",
    "ℝ": "\\mathbb{R}",
    "∈": "\\in ",
}
_DROP = [
    r"\\left",
    r"\\right",
    r"\\bigl",
    r"\\bigr",
    r"\\Bigl",
    r"\\Bigr",
    r"\\big",
    r"\\Big",
    r"\\displaystyle",
    r"\\!",
    r"\\,",
    r"\\;",
    r"\\:",
    r"\\ ",
    r"\\quad",
    r"\\qquad",
    r"\\limits",
    "\\$",
    r"\\mathrm",
    r"\\mathbf",
    r"\\mathit",
    r"\\boldsymbol",
    r"\\operatorname",
    r"\\textstyle",
    r"\\hspace\{[^{}]*\}",
    "~",
]
_DROP_RE = [
    re.compile(
        (r"(?<!\\)" if d.startswith("\\") else "")
        + d
        + (r"(?![a-zA-Z])" if d[-1].isalpha() else "")
    )
    for d in _DROP
]  # never the second half of a row break \\
_TRIG = re.compile(r"\\?(?:sin|cos|tan|cot|sec|csc)(?![a-z])")
_DEGREES = re.compile(r"\^\s*\{?\s*\\circ\s*\}?")
_NUMBER_DEGREES = re.compile(r"(\d+(?:\.\d+)?)\s*\^\s*\{?\s*\\circ\s*\}?")
# LaTeX digit-group separators: 10,\!080  10{,}000  1\,000\,000 (only between digit groups)
_LATEX_SEP = re.compile(r"(?<=\d)(?:\{,\}|,\s*\\!\s*|\\,|\\!|,\\,|\\ )(?=\d{3}(?!\d))")
_MIXED = re.compile(r"(?<![\d.}^_a-zA-Z\\])(\d+)\s*\\frac\s*\{\s*(\d+)\s*\}\s*\{\s*(\d+)\s*\}")
_MIXED_PLAIN = re.compile(r"\s*([-+]?)(\d+)\s+(\d+)\s*/\s*(\d+)\s*(\\?%)?\s*")
_THOUSANDS = re.compile(r"[-+]?[1-9]\d{0,2}(?:,\d{3})+(?:\.\d+)?")  # not 0,111
#: a tuple written with semicolons (a decimal-comma locale): (0;-2;6)
_SEMICOLON_TUPLE = re.compile(r"\(\s*-?[\d.]+(?:\s*;\s*-?[\d.]+)+\s*\)")
_SPACED = re.compile(r"[-+]?\d{1,3}(?: \d{3})+(?:\.\d+)?")  # 1 000 000 (SI style)
_INFINITY_WORDS = [
    (re.compile(r"\b(?:negative|minus)\s+infinity\b", re.IGNORECASE), "-\\infty "),
    (re.compile(r"\b(?:positive\s+infinity|infinitely\s+many)\b", re.IGNORECASE), "\\infty "),
]
#: "the limit does not exist", spelled out or as DNE, is one answer
_NO_LIMIT = re.compile(r"\b(?:does\s*n[o']t\s+exist|DNE)\b", re.IGNORECASE)
_REALS = re.compile(
    r"\\mathbb\s*\{?\s*R\s*\}?|\b(?:[Aa]ll\s+)?[Rr]eal\s+[Nn]umbers\b"
    r"|\\R(?![a-zA-Z])"
)
_IN_PREFIX = re.compile(r"^\s*[a-zA-Z]\s*\\in\s*")
_SET_BUILDER = re.compile(
    r"\\\{\s*[a-zA-Z]\s*(?:\\in\s*\\mathbb\s*\{?\s*R\s*\}?\s*)?"
    r"(?:\\mid|\\vert|:|\|)\s*(.+?)\s*\\\}"
)
_REPEATING = re.compile(r"(\d*)\.(\d*)\\overline\s*\{\s*(\d{1,20})\s*\}")
_ANGLES = {"\\langle": "(", "\\rangle": ")"}


def _superscripts(s: str) -> str:
    return re.sub(r"[⁰¹²³⁴⁵⁶⁷⁸⁹⁻⁺]+", lambda m: "^{" + m.group(0).translate(_SUPERSCRIPTS) + "}", s)


def _vulgar(s: str) -> str:
    """``3½`` is the mixed number 7/2; a lone ``½`` is 1/2."""
    for k, v in _VULGAR.items():
        if k in s:
            s = re.sub(r"(\d)\s*" + k, lambda m, v=v: f"({m.group(1)}+{v})", s)
            s = s.replace(k, f"({v})")
    return s


def _mixed(m: re.Match) -> str:
    whole, num, den = m.group(1), int(m.group(2)), int(m.group(3))
    if 0 < num < den:  # 3\frac{3}{4} is 3 3/4; 2\frac{5}{4} stays a product
        return f"({whole}+\\frac{{{num}}}{{{den}}})"
    return m.group(0)


def _repeating(m: re.Match) -> str:
    """``0.1\\overline{6}`` -> the exact fraction 1/6."""
    whole, fixed, rep = m.group(1) or "0", m.group(2), m.group(3)
    num = int(whole + fixed + rep) - int(whole + fixed)
    den = (10 ** len(rep) - 1) * 10 ** len(fixed)
    return f"({num}/{den})"


def separators(s: str) -> str:
    """Drop digit-group separators that can only be separators (LaTeX's ``,\\!`` and kin)."""
    if "\\" in s or "{" in s:
        s = _LATEX_SEP.sub("", s)
    stripped = s.strip()
    if _THOUSANDS.fullmatch(stripped) or _SPACED.fullmatch(stripped):  # one grouped number
        return stripped.replace(",", "").replace(" ", "")
    return s


def _over(s: str) -> str:
    """TeX's ``{a \\over b}`` (or a whole ``a \\over b``) -> ``\\frac{a}{b}``."""
    for _ in range(20):
        m = re.search(r"\\over(?![a-zA-Z])", s)
        if not m:
            return s
        depth, open_ = 0, -1
        for j in range(m.start() - 1, -1, -1):
            depth += {"}": 1, "{": -1}.get(s[j], 0)
            if depth < 0:
                open_ = j
                break
        depth, close = 0, len(s)
        for j in range(m.end(), len(s)):
            depth += {"{": 1, "}": -1}.get(s[j], 0)
            if depth < 0:
                close = j
                break
        if (open_ < 0) != (close == len(s)):
            return s  # unbalanced: leave it for the parser to refuse
        frac = f"\\frac{{{s[open_ + 1 : m.start()]}}}{{{s[m.end() : close]}}}"
        s = s[: open_ + 1] + frac + s[close:]
    return s


def mixed_numbers(s: str) -> str:
    """``3\\frac{3}{4}`` and a whole ``3 3/4`` are mixed numbers: 3 + 3/4."""
    if "\\frac" in s:
        s = _MIXED.sub(_mixed, s)
    m = _MIXED_PLAIN.fullmatch(s)
    if m and 0 < int(m.group(3)) < int(m.group(4)):
        return f"{m.group(1)}({m.group(2)}+{m.group(3)}/{m.group(4)}){m.group(5) or ''}"
    return s


def normalise(s: str) -> str:
    """Rewrite the many spellings of the same math into one LaTeX-ish form."""
    s = _superscripts(s)
    s = _vulgar(s)
    s = _NO_LIMIT.sub("DNE", s)
    if "infinit" in s.lower():
        for pattern, value in _INFINITY_WORDS:
            s = pattern.sub(lambda _, v=value: v, s)
    for k, v in _UNICODE.items():
        s = s.replace(k, v)
    s = _SEMICOLON_TUPLE.sub(lambda m: m.group(0).replace(";", ","), s)
    approx = s.find("\\approx")
    if approx > 0 and "=" in s[:approx]:
        s = s[:approx]  # x = 1/3 \approx 0.33: the exact side; x \approx 11 alone stays
    s = unicodedata.normalize("NFKC", s).replace("⁄", "/")
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac").replace("\\cfrac", "\\frac")
    s = re.sub(r"\\frac\s*(\d)\s*(\d)", r"\\frac{\1}{\2}", s)  # \frac34
    s = re.sub(r"\\frac\s*\{([^{}]*)\}\s*(\d)", r"\\frac{\1}{\2}", s)
    s = re.sub(r"\\frac\s*(\d)\s*\{", r"\\frac{\1}{", s)
    s = separators(s)
    s = mixed_numbers(s)
    if "\\over" in s:
        s = _over(s)
    if "\\overline" in s:
        s = _REPEATING.sub(_repeating, s)
    for k, v in _ANGLES.items():
        s = s.replace(k, v)
    if _TRIG.search(s):  # inside trig, 30^\circ is an angle in degrees: pi/6
        s = _NUMBER_DEGREES.sub(r"(\1\\pi/180)", s)
    s = _DEGREES.sub("", s)
    s = s.replace("\\circ", "")
    for d in _DROP_RE:
        s = d.sub(" ", s)
    s = re.sub(r"\\(?:text|textbf|textit|textrm|mbox)\s*\{\s*\}", " ", s)
    s = re.sub(r"\\(?:text|textbf|textit|textrm|mbox)\s*\{([^{}]*)\}", r" \1 ", s)
    m = _SET_BUILDER.fullmatch(s.strip())
    if m:  # \{x \mid x > 2\}, \{x \in \mathbb{R} : x \ne 2\}: the condition
        s = m.group(1)
    s = _REALS.sub("(-\\\\infty,\\\\infty)", s)
    s = s.replace("\\%", "%").replace("$", "")
    s = re.sub(r"(?:\\\\\s*)+$", "", s.strip())  # a trailing \\ left inside a box
    s = _IN_PREFIX.sub("", s)
    s = re.sub(r"^(?:\\approx|=)\s*", "", s.strip())
    s = re.sub(r"(?:\.|(?<!\\)[,;])\s*$", "", s).strip()  # 12. and a trailing comma: 5,
    if _THOUSANDS.fullmatch(s):  # thousands separators
        s = s.replace(",", "")
    return s
