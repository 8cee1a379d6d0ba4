"""Linear-time regular expressions for the built-in rewards.

Patterns from configs and datasets, and the rewards' own scanning of completions, run on RE2
(``google-re2``): its matching time grows linearly with the text, so no pattern can stall a
training step the way a backtracking engine does on ``^(\\w+\\s?)*$``. RE2 has no lookaround,
backreferences, atomic groups or possessive quantifiers; ``compile_linear`` refuses those with a
one-line reason that callers prefix with the option's name.
"""

from __future__ import annotations

import re

import re2

__all__ = ["RegexRefused", "clean", "compile_linear", "search"]


class RegexRefused(ValueError):
    """A pattern the linear-time engine cannot run; the message is one line and quotes it."""


def _options(dotall: bool) -> re2.Options:
    opts = re2.Options()
    opts.log_errors = False  # RE2 would otherwise print each refused pattern on stderr
    opts.dot_nl = dotall
    return opts


# What RE2 reports after "invalid perl operator: " -> the construct a reader recognises.
_GROUP_REASONS = (
    ("(?<=", "lookbehind"),
    ("(?<!", "lookbehind"),
    ("(?=", "lookahead"),
    ("(?!", "lookahead"),
    ("(?P", "named backreference"),
    ("(?>", "atomic group"),
    ("(?(", "conditional group"),
    ("(?#", "comment group"),
)


def _reason(detail: str) -> str:
    """A short name for the construct RE2 rejected, from RE2's own error text."""
    kind, _, arg = detail.partition(": ")
    if kind == "invalid perl operator":
        for prefix, name in _GROUP_REASONS:
            if arg.startswith(prefix):
                return name
        return f"inline flag in {arg!r}; only i, m, s and U exist"
    if kind == "invalid escape sequence":
        if arg[1:2].isdigit() or arg == "\\g":
            return f"backreference {arg}"
        if arg == "\\Z":
            return "\\Z; write \\z for the end of the text"
        if arg in ("\\u", "\\U"):
            return f"escape {arg}; write \\x{{hex}} for a code point"
        return f"escape {arg}"
    if kind == "bad repetition operator":
        return f"possessive quantifier {arg}"
    if kind == "invalid repetition size":
        return f"repetition count {arg}; counts, nested ones multiplied, may not exceed 1000"
    if "pattern too large" in detail:
        return "the compiled pattern is too large"
    return detail


def compile_linear(pattern: str, dotall: bool = False):
    """Compile ``pattern`` with RE2 (``dotall``: ``.`` also matches a newline).

    Raises RegexRefused: either the pattern is not a valid regex at all (judged by Python's
    ``re``, so the message matches what users know), or it is valid but uses a construct RE2
    cannot run in linear time.
    """
    if not isinstance(pattern, str):
        raise RegexRefused(f"{pattern!r} is not a string")
    shown = repr(pattern) if len(pattern) <= 80 else repr(pattern[:77]) + "..."
    try:
        return re2.compile(pattern, _options(dotall))
    except UnicodeEncodeError:
        raise RegexRefused(f"{shown} is not valid text (lone surrogate)") from None
    except re2.error as exc:
        detail = exc.args[0] if exc.args else ""
        detail = detail.decode("utf-8", "replace") if isinstance(detail, bytes) else str(detail)
    try:
        re.compile(pattern, re.DOTALL if dotall else 0)
    except (re.error, RecursionError, OverflowError, ValueError) as exc:
        msg = getattr(exc, "msg", None) or str(exc)
        raise RegexRefused(f"{shown} is not a valid regex ({msg})") from None
    detail = " ".join(detail.split())
    raise RegexRefused(
        f"{shown} is not supported by the linear-time regex engine "
        f"({_reason(detail)}); RE2 syntax has no lookaround, backreferences, "
        "atomic groups or possessive quantifiers"
    )


def clean(text: str) -> str:
    """``text`` with lone surrogates (e.g. from a JSON ``\\ud800`` escape), which RE2 cannot
    take as UTF-8, replaced by U+FFFD; other text is returned as it is."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "surrogatepass").decode("utf-8", "replace")
    return text


def search(rx, text: str):
    """``rx.search(text)`` for any str, lone surrogates included (see ``clean``)."""
    try:
        return rx.search(text)
    except UnicodeEncodeError:
        return rx.search(clean(text))
