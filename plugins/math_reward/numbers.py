"""The fast path: plain numbers compared as exact rationals, in-process, no parser."""

from __future__ import annotations

import re
from fractions import Fraction

_PLAIN = re.compile(r"^[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)?(?:\.\d+)?(?:[eE][-+]?\d{1,4})?$")


def plain_number(text: str) -> Fraction | None:
    """``'1,234.5'``, ``'-3'``, ``'2e3'`` -> exact Fraction; None for anything else."""
    s = text.strip().replace("−", "-").replace("$", "").strip()
    if not s or len(s) > 60 or not _PLAIN.match(s) or not any(c.isdigit() for c in s):
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
