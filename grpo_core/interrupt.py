"""Stopping a run cleanly on SIGINT (Ctrl-C) or SIGTERM (a scheduler's notice, ``kill``).

The first signal only asks: the step in progress finishes, a checkpoint of it is written (as
``output.checkpoint_every`` would write one) and the run exits with ``128 + signal``, naming
the checkpoint, so that ``--resume`` continues it exactly. Every rank of a multi-process run
stops at the same step (they agree on it at each step boundary). A second SIGINT (Ctrl-C
pressed again) stops at once, as a KeyboardInterrupt. A second SIGTERM changes nothing: a
launcher (torchrun) forwards the one its job got to ranks that got it already; SIGKILL is
what stops at once.
"""

from __future__ import annotations

import os
import signal
from types import FrameType
from typing import Any

from grpo_core.errors import UserError

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Stopped(UserError):
    """The run stopped on a signal at a step boundary, with a checkpoint saved."""

    def __init__(self, message: str, signum: int):
        super().__init__(message)
        self.exit_code = 128 + signum


class StopRequests:
    """While active (a ``with`` block), SIGINT and SIGTERM set :attr:`signum` instead of
    stopping the process; the handlers in place before are restored at the end."""

    def __init__(self) -> None:
        self.signum = 0
        self._before: dict[int, Any] = {}  # what signal.signal returned: the earlier handler

    def __enter__(self) -> StopRequests:
        try:
            for s in SIGNALS:
                self._before[s] = signal.signal(s, self._handle)
        except ValueError:  # not the main thread: signals stay as they are
            self._before.clear()
        return self

    def __exit__(self, *exc) -> None:
        for s, handler in self._before.items():
            signal.signal(s, handler)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.signum:
            if signum == signal.SIGINT:  # pressed again: stop now
                raise KeyboardInterrupt
            return
        self.signum = signum
        # straight to the file descriptor: the handler may have interrupted a write to stderr
        os.write(
            2,
            f"\n{signal.Signals(signum).name}: stopping after this step, with a "
            f"checkpoint\n".encode(),
        )
