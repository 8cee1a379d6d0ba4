"""The fast path: plain numbers and simple fractions as exact rationals, in-process, no parser.

Accepted: ``1,234.5``, ``-3``, ``2e3``, LaTeX digit separators (``10,\\!080``, ``10{,}000``),
``\\frac{3}{4}`` / ``\\dfrac34`` / ``3/4`` and mixed numbers ``3\\frac{1}{2}``, each with an
optional sign. Anything else returns None and goes to the parser in a worker. Every rule
here reads a form exactly as the parser would, so both paths give the same verdict.
"""

from __future__ import annotations

import re
from fractions import Fraction

from grpo_core_plugins.rewards.math.normalise import separators

_PLAIN = re.compile(r"^[-+]?(?:[1-9]\d{0,2}(?:,\d{3})+|\d+)?(?:\.\d+)?(?:[eE][-+]?\d{1,4})?$")
_FRAC = re.compile(
    r"^([-+]?)(?:(\d{1,30})\s*)?\\[dt]?frac\s*(?:\{\s*(\d{1,30})\s*\}|(\d))"
    r"\s*(?:\{\s*(\d{1,30})\s*\}|(\d))$"
)
_SLASH = re.compile(r"^([-+]?)(\d{1,30})\s*/\s*(\d{1,30})$")


def plain_number(text: str) -> Fraction | None:
    """``'1,234.5'``, ``'-3'``, ``'2e3'``, ``'\\frac{3}{4}'`` -> exact Fraction; else None."""
    s = text.strip().replace("−", "-").replace("$", "").strip()
    if not s or len(s) > 80:
        return None
    s = separators(s).strip()
    if "\\" in s or "{" in s:
        m = _FRAC.match(s)
        if m:
            sign, whole, num, den = (
                m.group(1),
                m.group(2),
                m.group(3) or m.group(4),
                m.group(5) or m.group(6),
            )
            if int(den) == 0:
                return None
            value = Fraction(int(num), int(den))
            if whole is not None:  # a mixed number only when proper, as the parser reads it
                if not 0 < value < 1:
                    return None
                value += int(whole)
            return -value if sign == "-" else value
        return None
    m = _SLASH.match(s)
    if m:
        if int(m.group(3)) == 0:
            return None
        value = Fraction(int(m.group(2)), int(m.group(3)))
        return -value if m.group(1) == "-" else value
    if not _PLAIN.match(s) or not any(c.isdigit() for c in s):
        return None
    try:
        return Fraction(s.replace(",", ""))
    except (ValueError, ZeroDivisionError):
        return None


def close(a: Fraction, b: Fraction, rel_tol: float) -> bool:
    """Exact equality, or within ``rel_tol`` of ``b`` when a tolerance is set."""
    if a == b:
        return True
    return rel_tol > 0 and abs(a - b) <= Fraction(rel_tol) * abs(b)
