"""The parent side of the worker pool: handing out items, enforcing the time budget, killing
and replacing workers (see grpo_core.workers)."""

from __future__ import annotations

import atexit
import pickle
import socket
import subprocess
import sys
import threading
import time
import weakref
from collections import deque
from collections.abc import Sequence
from multiprocessing.connection import Connection, wait
from multiprocessing.reduction import recvfds
from typing import Any

from grpo_core.workers.common import (
    BOOT_TIMEOUT,
    CHUNK,
    WorkerCrashed,
    WorkerError,
    WorkerTimeout,
    _start_interpreter,
)
from grpo_core.workers.handle import Handle

# -- the parent side ------------------------------------------------------------------------


_LIVE: weakref.WeakSet[WorkerPool] = weakref.WeakSet()


@atexit.register
def _close_all() -> None:
    for pool in list(_LIVE):
        pool.close()


class WorkerPool:
    """A fixed number of killable worker processes running ``target`` on payloads.

    Args:
        target: ``"package.module:function"``; called as ``target(state, payload)`` when
            ``setup`` is given, else ``target(payload)``. Must be importable in a fresh
            interpreter (the caller's ``sys.path`` is passed on).
        setup: optional ``"package.module:function"`` run once per worker as
            ``setup(*setup_args)``; its return value is the state handed to every call.
        setup_args: picklable arguments for ``setup``.
        size: number of worker processes.
        memory_mb: address-space limit (``RLIMIT_AS``) per worker; ``None``: no limit. A
            worker that runs out dies or sees ``MemoryError``; either way only its item fails.
        boot_timeout: seconds a worker may take to start (imports and ``setup``).
        preload: what the fork server loads before forking, so every worker starts with it:
            ``"package.module"`` is imported, ``"package.module:function"`` is called with no
            arguments (to warm caches). Ignored without the fork server.
        fork_server: fork workers from one server interpreter (default); False starts each
            worker as its own interpreter (slower start and replacement, no ``fork``).

    ``map`` may be called from any thread; calls are serialised. ``close`` (also run at
    interpreter exit) ends every process; a closed pool starts again on the next ``map``.
    """

    def __init__(
        self,
        target: str,
        setup: str | None = None,
        setup_args: tuple = (),
        size: int = 2,
        memory_mb: int | None = None,
        boot_timeout: float = BOOT_TIMEOUT,
        preload: Sequence[str] = (),
        fork_server: bool = True,
    ):
        if size < 1:
            raise ValueError("size must be at least 1")
        pickle.dumps(setup_args)  # fail here, not in a worker, on unpicklable arguments
        self.size, self.boot_timeout, self.fork_server = size, boot_timeout, fork_server
        self.config = {
            "path": list(sys.path),
            "target": target,
            "setup": setup,
            "setup_args": tuple(setup_args),
            "preload": list(preload),
            "memory_bytes": None if memory_mb is None else int(memory_mb) << 20,
        }
        self.workers: list[Handle] = []
        self.server: tuple[subprocess.Popen, Connection] | None = None
        self.server_ready, self.server_started, self.requested = False, 0.0, 0
        self.lock = threading.Lock()
        self.boot_error, self.boot_failures = "", 0
        #: counters: items timed out, workers crashed, workers started (replacements included)
        self.timeouts = self.crashes = self.started = 0
        _LIVE.add(self)
        with self.lock:
            self._fill()

    # -- public ------------------------------------------------------------------------------
    def map(self, payloads: Sequence[Any], timeout: float) -> list[Any]:
        """Run ``target`` on every payload; at most ``timeout`` seconds of work per item.

        Returns one entry per payload, in order: the target's result, or a
        :class:`WorkerFailure` instance (:class:`WorkerTimeout`, :class:`WorkerCrashed`,
        :class:`WorkerError`). The budget counts from when the worker starts on the item, so
        start-up and queueing are not charged to it. Raises ``RuntimeError`` only when no
        worker can be started at all (a target that cannot be imported, say).
        """
        if timeout <= 0:
            raise ValueError("timeout must be positive")
        out: list[Any] = [None] * len(payloads)
        if payloads:
            with self.lock:
                self._run(payloads, timeout, out)
        return out

    def wait_ready(self, timeout: float = BOOT_TIMEOUT) -> bool:
        """Block until ``size`` workers are up (useful before timing); True when they are."""
        deadline = time.monotonic() + timeout
        with self.lock:
            while time.monotonic() < deadline:
                self._fill()
                if sum(w.ready for w in self.workers) >= self.size:
                    return True
                self._pump(min(0.2, max(0.0, deadline - time.monotonic())), None, 0.0)
            return False

    def close(self) -> None:
        """End every worker and the fork server, and reap them (no zombies are left)."""
        locked = self.lock.acquire(timeout=10)  # a map stuck in a daemon thread must not hang exit
        try:
            workers, self.workers = self.workers, []
            server, self.server = self.server, None
            self.server_ready, self.requested = False, 0
        finally:
            if locked:
                self.lock.release()
        for w in workers:
            w.kill()
        if server is not None:
            proc, conn = server
            try:
                conn.send(("exit",))
                proc.wait(timeout=2)
            except (OSError, ValueError, subprocess.TimeoutExpired):
                proc.kill()
                proc.wait(timeout=5)
            conn.close()

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    # -- starting workers --------------------------------------------------------------------
    def _fill(self) -> None:
        """Start (or ask the server for) workers until ``size`` are alive or on their way."""
        self.workers = [w for w in self.workers if not w.dead]
        missing = self.size - len(self.workers) - self.requested
        if missing <= 0:
            return
        if not self.fork_server:
            for _ in range(missing):
                proc, conn = _start_interpreter("worker", self.config)
                self.workers.append(Handle(conn, proc.pid, proc=proc))
                self.started += 1
            return
        if self.server is None or self.server[0].poll() is not None:
            if self.server is not None:
                self._drop_server()
            self.server = _start_interpreter("server", {**self.config, "spawn": missing})
            self.server_ready, self.server_started = False, time.monotonic()
            self.requested, missing = missing, 0  # the server forks that many once it is up
        if missing > 0 and self.server_ready:
            self.server[1].send(("spawn", missing))
            self.requested += missing

    def _server_message(self) -> None:
        assert self.server is not None
        proc, conn = self.server
        try:
            msg = conn.recv()
            if msg[0] == "spawned":
                with socket.fromfd(conn.fileno(), socket.AF_UNIX, socket.SOCK_STREAM) as s:
                    fds = recvfds(s, 2)
                pidfd = fds[1] if len(fds) > 1 else -1
                self.workers.append(Handle(Connection(fds[0]), msg[1], pidfd))
                self.requested = max(0, self.requested - 1)
                self.started += 1
            elif msg[0] == "ready":
                self.server_ready = True
            elif msg[0] == "boot_error":
                self.boot_error = str(msg[1])
                self._drop_server()
        except (EOFError, OSError, pickle.UnpicklingError, IndexError, TypeError):
            self.boot_error = self.boot_error or f"fork server exited (code {proc.poll()})"
            self._drop_server()

    def _drop_server(self) -> None:
        self.boot_failures += 1
        if self.server is not None:
            proc, conn = self.server
            proc.kill()
            proc.wait(timeout=5)
            conn.close()
        self.server, self.server_ready, self.requested = None, False, 0

    def _boot_message(self, w: Handle) -> None:
        """A booting worker's first message: ready, or why it could not start."""
        try:
            msg = w.conn.recv()
        except (EOFError, OSError):
            msg = ("boot_error", "worker exited during start-up")
        if msg == ("ready",):
            w.ready, w.mark = True, time.monotonic()
            return
        self.boot_error = str(msg[1]) if isinstance(msg, tuple) and len(msg) > 1 else repr(msg)
        self.boot_failures += 1
        w.kill()

    # -- running -----------------------------------------------------------------------------
    def _pump(self, wait_for: float, out: list[Any] | None, timeout: float) -> int:
        """Wait up to ``wait_for`` s for any message, handle it, enforce boot deadlines."""
        watched: dict[Any, Any] = {
            w.conn: w for w in self.workers if not w.dead and (w.pending or not w.ready)
        }
        if self.server is not None:
            watched[self.server[1]] = None
        finished = 0
        if not watched:
            time.sleep(wait_for)
        for conn in wait(list(watched), timeout=wait_for) if watched else ():
            w = watched[conn]
            if w is None:
                self._server_message()
            elif not w.ready:
                self._boot_message(w)
            elif out is not None:
                finished += self._receive(w, out)
        now = time.monotonic()
        for w in self.workers:
            if not w.ready and not w.dead and now - w.started > self.boot_timeout:
                self.boot_error = f"worker did not start within {self.boot_timeout:g} s"
                self.boot_failures += 1
                w.kill()
        if (
            self.server is not None
            and not self.server_ready
            and now - self.server_started > self.boot_timeout
        ):
            self.boot_error = f"fork server did not start within {self.boot_timeout:g} s"
            self._drop_server()
        return finished

    def _run(self, payloads: Sequence[Any], timeout: float, out: list[Any]) -> None:
        queue: deque[int] = deque(range(len(payloads)))
        done, failures = 0, self.boot_failures
        while done < len(payloads):
            for w in self.workers:
                if w.dead:
                    queue.extendleft(reversed(w.pending))  # not started: back to the queue
                    w.pending.clear()
            if self.boot_failures - failures > 2 * self.size + 2:
                raise RuntimeError(
                    f"worker pool for {self.config['target']} could not start: {self.boot_error}"
                )
            self._fill()
            for w in [w for w in self.workers if w.ready and not w.dead and not w.pending]:
                if queue:
                    done += self._hand_out(w, queue, payloads, out)
            now = time.monotonic()
            deadlines = [w.mark + timeout for w in self.workers if w.pending and not w.dead]
            wait_for = min(1.0, max(0.0, min(deadlines) - now)) if deadlines else 0.2
            done += self._pump(wait_for, out, timeout)
            now = time.monotonic()
            for w in self.workers:
                if w.pending and not w.dead and now - w.mark >= timeout:
                    j = w.pending.popleft()  # the item it is stuck on
                    out[j] = WorkerTimeout(f"item {j} ran over its {timeout:g} s budget")
                    done += 1
                    self.timeouts += 1
                    w.kill()
        self._fill()  # ask for replacements now, so the next call finds them up

    def _hand_out(
        self, w: Handle, queue: deque[int], payloads: Sequence[Any], out: list[Any]
    ) -> int:
        """Send the next chunk to an idle worker; returns items that failed to send."""
        n = max(1, min(CHUNK, len(queue) // (2 * self.size)))
        chunk = [queue.popleft() for _ in range(min(n, len(queue)))]
        try:
            w.conn.send([(j, payloads[j]) for j in chunk])
        except (OSError, ValueError):  # died while idle: replace it, charge no item
            queue.extendleft(reversed(chunk))
            self.crashes += 1
            w.kill()
            return 0
        except Exception as exc:  # a payload that cannot be pickled
            for j in chunk:
                out[j] = WorkerError(type(exc).__name__, f"payload not sent: {exc}")
            return len(chunk)
        w.pending.extend(chunk)
        w.mark = time.monotonic()
        return 0

    def _receive(self, w: Handle, out: list[Any]) -> int:
        """Read every result the worker has ready; returns how many items finished."""
        finished = 0
        try:
            while w.pending and w.conn.poll():
                j, ok, value = w.conn.recv()
                if j != w.pending[0]:
                    raise EOFError("out-of-order reply")
                w.pending.popleft()
                out[j] = value if ok else WorkerError(*value)
                w.mark = time.monotonic()
                finished += 1
        except (EOFError, OSError, pickle.UnpicklingError):
            w.kill()
            if w.pending:  # died on its current item: that one fails, the rest go back
                j = w.pending.popleft()
                out[j] = WorkerCrashed(f"worker died on item {j}")
                finished += 1
            self.crashes += 1
        return finished


# -- the child side -------------------------------------------------------------------------


_SHARED: dict[str, list] = {}  # settings -> [pool, number of open handles]
_SHARED_LOCK = threading.Lock()


def shared_pool(target: str, **settings: Any) -> SharedPool:
    """A handle on this process's one pool for ``target`` with these ``settings`` (those of
    :class:`WorkerPool`): the components of one kind in a reward (forty ``math`` components
    of a ``weighted`` one) share one set of workers instead of starting their own. The pool
    ends when its last handle is closed."""
    key = repr((target, sorted(settings.items())))
    with _SHARED_LOCK:
        entry = _SHARED.get(key)
        if entry is None:
            entry = _SHARED[key] = [WorkerPool(target, **settings), 0]
        entry[1] += 1
    return SharedPool(key, entry[0])


class SharedPool:
    """One user's handle on a shared :class:`WorkerPool`: ``map`` and the counters are the
    pool's; ``close`` lets go of it (the last one closes the pool)."""

    def __init__(self, key: str, pool: WorkerPool):
        self.key, self.pool, self.closed = key, pool, False

    def map(self, payloads: Sequence[Any], timeout: float) -> list[Any]:
        return self.pool.map(payloads, timeout)

    def __getattr__(self, name: str) -> Any:  # timeouts, crashes, started, wait_ready ...
        return getattr(self.pool, name)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        with _SHARED_LOCK:
            entry = _SHARED.get(self.key)
            if entry is None or entry[0] is not self.pool:
                return
            entry[1] -= 1
            if entry[1] > 0:
                return
            del _SHARED[self.key]
        self.pool.close()
