"""The ``grpo_core`` logger: warnings a run gives while it goes (a reward that failed, an update
skipped), written to the stderr of the moment as ``warning (step N): ...`` lines. Route them
elsewhere by attaching handlers to ``logging.getLogger("grpo_core")``."""

from __future__ import annotations

import logging
import sys


class _Stderr(logging.StreamHandler):
    """Writes to ``sys.stderr`` as it is when a line is written (a redirect, a test's capture)."""

    def __init__(self) -> None:
        super().__init__()
        self.setFormatter(logging.Formatter("%(message)s"))

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:  # StreamHandler sets it; the moment's stderr wins
        pass


log = logging.getLogger("grpo_core")
if not log.handlers:
    log.addHandler(_Stderr())
    log.setLevel(logging.INFO)
    log.propagate = False
