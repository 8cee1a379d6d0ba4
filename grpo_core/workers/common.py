"""What both sides of the worker pool share: failure types, naming functions by string, and
starting the worker interpreter."""

from __future__ import annotations

import importlib
import os
import socket
import subprocess
import sys
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

#: seconds a worker (or the fork server) may take to start before it is given up
BOOT_TIMEOUT = 60.0
#: items handed to one worker per message; results still come back (and are timed) one by one
CHUNK = 8


class WorkerFailure(Exception):
    """Base class of the markers :meth:`WorkerPool.map` puts in a failed item's slot."""


class WorkerTimeout(WorkerFailure):
    """The item ran past its time budget; its worker was killed and replaced."""


class WorkerCrashed(WorkerFailure):
    """The worker died while running the item (memory limit, crash, ``os._exit``)."""


class WorkerError(WorkerFailure):
    """The target raised; ``type_name`` and the message say what, ``trace`` shows where."""

    def __init__(self, type_name: str, message: str, trace: str = ""):
        super().__init__(f"{type_name}: {message}")
        self.type_name, self.message, self.trace = type_name, message, trace


def resolve(spec: str) -> Callable[..., Any]:
    """``"package.module:attribute"`` -> the object (imported in the worker, not the caller)."""
    module, sep, attr = spec.partition(":")
    if not sep or not module or not attr:
        raise ValueError(f"expected 'package.module:function', got {spec!r}")
    obj: Any = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def _start_interpreter(mode: str, config: dict) -> tuple[subprocess.Popen, Connection]:
    """``python -m grpo_core.workers MODE FD`` with a private channel on FD."""
    ours, theirs = socket.socketpair()
    env = dict(os.environ)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "grpo_core.workers", mode, str(theirs.fileno())],
            pass_fds=(theirs.fileno(),),
            stdin=subprocess.DEVNULL,
            env=env,
            close_fds=True,
        )
    finally:
        theirs.close()
    conn = Connection(ours.detach())
    conn.send(config)
    return proc, conn
