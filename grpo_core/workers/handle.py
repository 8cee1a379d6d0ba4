"""The parent's handle on one worker process: its channel, the items it holds, killing it."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections import deque
from multiprocessing.connection import Connection


class Handle:
    """One worker process, its channel, and the items it has been handed."""

    def __init__(
        self, conn: Connection, pid: int, pidfd: int = -1, proc: subprocess.Popen | None = None
    ):
        self.conn, self.pid, self.pidfd, self.proc = conn, pid, pidfd, proc
        self.started = time.monotonic()
        self.ready = self.dead = False
        self.pending: deque[int] = deque()  # item indices sent, answered in this order
        self.mark = 0.0  # when the head of ``pending`` started running

    def kill(self) -> None:
        """SIGKILL the worker (by pidfd: never a recycled pid) and drop its channel."""
        if self.dead:
            return
        self.dead = True
        try:
            if self.proc is not None:
                self.proc.kill()
                self.proc.wait(timeout=5)
            elif self.pidfd >= 0:
                signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)
            else:
                os.kill(self.pid, signal.SIGKILL)
        except (OSError, subprocess.TimeoutExpired):
            pass  # already gone
        for close in (self.conn.close, lambda: os.close(self.pidfd) if self.pidfd >= 0 else None):
            try:
                close()
            except OSError:
                pass
