"""Bounded verification: plain numbers in-process, everything else in killable workers.

Each non-trivial item runs in a worker process with an address-space limit; the caller waits
at most ``timeout`` seconds for it, from any thread (no signals), then kills and replaces the
worker and scores the item 0. The model's text is only ever parsed, never executed.
"""

from __future__ import annotations

import multiprocessing as mp
import threading
import time
from multiprocessing.connection import wait

from grpo_core_plugins.math_reward.numbers import close, plain_number

MEMORY_LIMIT = 2 * 1024**3
BOOT_TIMEOUT = 60.0


def _serve(conn, memory_limit: int) -> None:
    """Worker loop: receive (pred, gold, rel_tol, max_length), answer with a bool."""
    try:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (memory_limit, memory_limit))
    except (ImportError, ValueError, OSError):
        pass
    from grpo_core_plugins.math_reward.compare import equivalent

    conn.send("ready")  # the time budget starts after imports, not during them
    while True:
        try:
            job = conn.recv()
        except EOFError:
            return
        try:
            verdict = equivalent(*job)
        except MemoryError:
            verdict = False
        except Exception:  # a verifier bug scores 0 rather than ending training
            verdict = False
        conn.send(verdict)


class _Worker:
    def __init__(self, ctx, memory_limit: int):
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_serve, args=(child, memory_limit), daemon=True)
        self.proc.start()
        child.close()
        self.job: int | None = None
        self.deadline = 0.0
        if not self.conn.poll(BOOT_TIMEOUT) or self.conn.recv() != "ready":
            self.kill()
            raise RuntimeError("math verifier worker did not start")

    def kill(self) -> None:
        self.proc.kill()
        self.proc.join(timeout=5)
        self.conn.close()


class Verifier:
    """``verify_many(preds, golds) -> list[bool]``; safe to call from any thread."""

    def __init__(self, rel_tol: float = 0.0, timeout: float = 2.0, workers: int = 2,
                 max_length: int = 2000, memory_limit: int = MEMORY_LIMIT):
        self.rel_tol, self.timeout, self.n, self.max_length = rel_tol, timeout, workers, max_length
        self.memory_limit = memory_limit
        self.ctx = mp.get_context("spawn")
        self.workers: list[_Worker] = []
        self.lock = threading.Lock()
        self.timeouts = 0

    def fast(self, pred: str | None, gold: str) -> bool | None:
        """Decide in-process when both sides are plain numbers; None = needs the parser."""
        if pred is None or not pred.strip():
            return False
        if len(pred) > self.max_length:
            return False
        g, p = plain_number(gold), plain_number(pred)
        if g is not None and p is not None:
            return close(p, g, self.rel_tol)
        return None

    def verify_many(self, preds: list[str | None], golds: list[str]) -> list[bool]:
        out: list[bool | None] = [self.fast(p, g) for p, g in zip(preds, golds)]
        todo = [i for i, v in enumerate(out) if v is None]
        if todo:
            with self.lock:
                self._run(todo, preds, golds, out)
        return [bool(v) for v in out]

    def _run(self, todo: list[int], preds, golds, out) -> None:
        while len(self.workers) < self.n:
            self.workers.append(_Worker(self.ctx, self.memory_limit))
        queue = list(todo)
        busy: dict = {}
        while queue or busy:
            for w in self.workers:
                if w.job is None and queue:
                    i = queue.pop(0)
                    w.job, w.deadline = i, time.monotonic() + self.timeout
                    try:
                        w.conn.send((preds[i], golds[i], self.rel_tol, self.max_length))
                        busy[w.conn] = w
                    except (BrokenPipeError, OSError):
                        out[i] = False
                        self._replace(w, busy)
            if not busy:
                continue
            soonest = min(w.deadline for w in busy.values())
            ready = wait(list(busy), timeout=max(0.0, soonest - time.monotonic()))
            for conn in ready:
                w = busy.pop(conn)
                try:
                    out[w.job] = bool(conn.recv())
                    w.job = None
                except (EOFError, OSError):  # died (e.g. hit its memory limit)
                    out[w.job] = False
                    self._replace(w, busy)
            now = time.monotonic()
            for conn, w in list(busy.items()):
                if now >= w.deadline:  # over budget: kill, replace, score 0
                    busy.pop(conn)
                    out[w.job] = False
                    self.timeouts += 1
                    self._replace(w, busy)

    def _replace(self, w: _Worker, busy: dict) -> None:
        busy.pop(w.conn, None)
        w.kill()
        self.workers[self.workers.index(w)] = _Worker(self.ctx, self.memory_limit)

    def close(self) -> None:
        for w in self.workers:
            w.kill()
        self.workers = []

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass
