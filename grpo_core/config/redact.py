"""Secrets kept out of everything a run prints or writes.

A config reads secrets from the environment (``${env:API_KEY}`` in a header, a URL, a path).
Once resolved, the value travels inside plugin options, and any message that quotes an option
(an HTTP failure naming its URL, "file not found" naming a path) would show it. Rather than
trusting every message to leave it out, every resolved value is registered here
(:func:`register`, called by :mod:`grpo_core.config.file` as it resolves a reference, and again
in a reward's worker process as it unpickles its options), and :func:`redact` puts the
reference back in its place, ``${env:API_KEY}``. The process's ``sys.stdout`` and
``sys.stderr`` are wrapped (:func:`install`) as soon as a value is registered, so errors,
warnings, tracebacks and progress lines are redacted when written; the files a run writes
(metrics, samples, summaries, compare logs) pass through :func:`redact` too.

Values shorter than :data:`MIN_LENGTH` characters are not redacted: replacing every ``1`` or
``cpu`` in the output would hide everything and protect nothing.
"""

from __future__ import annotations

import io
import re
import sys
from typing import Any

#: the shortest value treated as a secret
MIN_LENGTH = 4
_secrets: dict[str, str] = {}  # resolved value -> what is shown in its place
_pattern: re.Pattern | None = None  # every value, longest first
_ENV_REF = re.compile(r"\$\{env:([A-Za-z_][A-Za-z0-9_]*)\}")


def register(value: str, shown: str) -> None:
    """From now on, show ``shown`` wherever ``value`` would be printed or written."""
    global _pattern
    value = str(value)
    if len(value) >= MIN_LENGTH and value != shown and _secrets.get(value) != shown:
        _secrets[value] = shown
        _pattern = re.compile(
            "|".join(re.escape(v) for v in sorted(_secrets, key=len, reverse=True))
        )
    if _secrets:
        install()  # again: sys.stderr may have been replaced since


def register_resolved(value: str, template: str) -> None:
    """Register each ``${env:NAME}`` value inside ``value``, the resolved form of
    ``template`` (the text as written), found by matching the two."""
    names: list[str] = []
    parts, last = [], 0
    for m in _ENV_REF.finditer(template):
        parts.append(re.escape(template[last : m.start()]) + "(.*?)")
        names.append(m.group(1))
        last = m.end()
    found = re.fullmatch("".join(parts) + re.escape(template[last:]), value, re.DOTALL)
    if found:
        for name, secret in zip(names, found.groups()):
            register(secret, f"${{env:{name}}}")


def redact(text: Any) -> Any:
    """``text`` with every registered value replaced by its reference (non-text unchanged)."""
    if _pattern is None or not isinstance(text, str):
        return text
    return _pattern.sub(lambda m: _secrets[m.group(0)], text)


class RedactingStream(io.TextIOBase):
    """A text stream that redacts what is written to it, then hands it to ``inner``. A value
    is found when a single write holds it whole (``print`` writes its text at once)."""

    def __init__(self, inner):
        self.inner = inner

    def write(self, text: str) -> int:
        self.inner.write(redact(text))
        return len(text)

    def flush(self) -> None:
        self.inner.flush()

    def isatty(self) -> bool:
        return self.inner.isatty()

    def fileno(self) -> int:
        return self.inner.fileno()

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return getattr(self.inner, "encoding", "utf-8")

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def install() -> None:
    """Wrap ``sys.stdout`` and ``sys.stderr`` (once) so that what they carry is redacted."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if stream is not None and not isinstance(stream, RedactingStream):
            setattr(sys, name, RedactingStream(stream))
