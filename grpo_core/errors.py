"""Errors the CLI turns into a one-line message and exit code 2 (the user's fault)."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from contextlib import contextmanager


class UserError(Exception):
    """Bad input from the user: a config, a plugin name, a file. Printed without traceback."""


class ConfigError(UserError):
    """One or more config problems; ``problems`` holds one line each."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("\n".join(problems))


class PluginError(UserError):
    """A plugin could not be loaded, found or built."""


class TrainingError(UserError):
    """The run cannot go on (for example, repeated non-finite losses)."""


def write_failure(exc: Exception, where: str) -> str:
    """Why a write failed, in words: torch.save reports a full disk as a position mismatch."""
    strerror = getattr(exc, "strerror", None)
    if strerror:
        return strerror
    try:
        if os.statvfs(where).f_bavail * os.statvfs(where).f_frsize < 1 << 20:
            return "No space left on device"
    except OSError:
        pass
    return str(exc).splitlines()[0]


@contextmanager
def out_of_memory(advice: str) -> Iterator[None]:
    """Running out of memory inside (a MemoryError, torch's CPU allocator failing, or
    ``torch.OutOfMemoryError`` on a GPU) as a UserError: ``advice``, then the size refused."""
    try:
        yield
    except (MemoryError, RuntimeError) as exc:  # torch.OutOfMemoryError is a RuntimeError
        text = str(exc)
        oom = isinstance(exc, MemoryError) or type(exc).__name__ == "OutOfMemoryError"
        if not (oom or "can't allocate memory" in text):
            raise
        size = re.search(r"allocate (\d[\d.]* ?[A-Za-z]+)", text, re.IGNORECASE)
        refused = f"could not allocate {size.group(1)}" if size else type(exc).__name__
        raise UserError(f"{advice} ({refused})") from exc
