"""The trainer-generator channel: small pickled messages over a socket pair, every receive
with a timeout. Plain pickle, not multiprocessing's (which would try to share tensors'
storage through file descriptors); weights never travel here (grpo_core.overlap.weights)."""

from __future__ import annotations

import pickle
from multiprocessing.connection import Connection
from typing import Any


class Timeout(Exception):
    """Nothing arrived within the time allowed."""


class Closed(Exception):
    """The other side closed the channel (it exited or was killed)."""


def send(conn: Connection, *message: Any) -> None:
    """Send one message (a tuple whose first item names it); raises Closed when the other
    side is gone."""
    try:
        conn.send_bytes(pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL))
    except (BrokenPipeError, ConnectionResetError, OSError) as exc:
        raise Closed(str(exc)) from exc


def receive(conn: Connection, timeout: float | None) -> tuple:
    """The next message; raises Timeout after ``timeout`` seconds (None: wait forever) and
    Closed when the other side is gone."""
    try:
        if not conn.poll(timeout):
            raise Timeout()
        return pickle.loads(conn.recv_bytes())
    except (EOFError, ConnectionResetError, OSError) as exc:
        raise Closed(str(exc)) from exc
