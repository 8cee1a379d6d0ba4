"""Bounded verification: plain numbers in-process, everything else in killable workers.

Each non-trivial item runs in a worker process of a :class:`grpo_core.workers.WorkerPool`
with an address-space limit; the caller waits at most ``timeout`` seconds for it, from any
thread (no signals), then the worker is killed and replaced and the item scores 0. The
workers are fresh interpreters (``python -m grpo_core.workers``), so they never import the
caller's ``__main__``: an unguarded script, a script on stdin and a notebook all work. They
start in the background when the reward is built. The model's text is only ever parsed,
never executed.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

from grpo_core_plugins.rewards.math.numbers import close, plain_number

from grpo_core.workers import WorkerTimeout, shared_pool

MEMORY_LIMIT = 2 * 1024**3
CACHE_SIZE = 16_384  # verdicts remembered: a group repeats the same answers


def warm() -> None:
    """Fork-server preload: import the parser and comparison, and run each path once."""
    from grpo_core_plugins.rewards.math.compare import equivalent

    for pred, gold in (
        ("\\frac{x}{2}+\\sin(\\pi/6)", "(x+1)/2"),
        ("x > 2", "(2,\\infty)"),
        ("\\begin{pmatrix}1\\\\2\\end{pmatrix}", "(1,2)"),
        ("5 cm", "5"),
    ):
        equivalent(pred, gold)


def make_state(rel_tol: float, max_length: int) -> tuple[float, int]:
    """Worker set-up (after the fork): the comparison options."""
    from grpo_core_plugins.rewards.math import compare  # noqa: F401  (already loaded: cheap)

    return rel_tol, max_length


def check(state: tuple[float, int], pair: tuple[str | None, str]) -> bool:
    """Worker job: is ``pair[0]`` equivalent to the gold ``pair[1]``?"""
    from grpo_core_plugins.rewards.math.compare import equivalent

    rel_tol, max_length = state
    try:
        return equivalent(pair[0], pair[1], rel_tol, max_length)
    except MemoryError:
        return False


class Verifier:
    """``verify_many(preds, golds) -> list[bool]``; safe to call from any thread."""

    def __init__(
        self,
        rel_tol: float = 0.0,
        timeout: float = 2.0,
        workers: int = 2,
        max_length: int = 2000,
        memory_limit: int = MEMORY_LIMIT,
    ):
        self.rel_tol, self.timeout, self.n, self.max_length = rel_tol, timeout, workers, max_length
        self.pool = shared_pool(
            "grpo_core_plugins.rewards.math.verify:check",
            setup="grpo_core_plugins.rewards.math.verify:make_state",
            setup_args=(rel_tol, max_length),
            size=workers,
            memory_mb=max(64, memory_limit // 2**20),
            preload=("grpo_core_plugins.rewards.math.verify:warm",),
        )
        self.cache: OrderedDict[tuple[str, str], bool] = OrderedDict()
        self.cache_lock = threading.Lock()
        self.timeouts = 0

    def fast(self, pred: str | None, gold: str) -> bool | None:
        """Decide in-process when both sides are plain numbers; None = needs the parser."""
        if pred is None or not pred.strip():
            return False
        if len(pred) > self.max_length:
            return False
        if pred.strip() == gold.strip():
            return True
        g, p = plain_number(gold), plain_number(pred)
        if g is not None and p is not None:
            return close(p, g, self.rel_tol)
        with self.cache_lock:
            return self.cache.get((pred, gold))

    def verify_many(self, preds: list[str | None], golds: list[str]) -> list[bool]:
        out: list[bool | None] = [self.fast(p, g) for p, g in zip(preds, golds)]
        todo: dict[tuple[str, str], list[int]] = {}
        for i, v in enumerate(out):
            if v is None:
                todo.setdefault((preds[i], golds[i]), []).append(i)
        if todo:
            pairs = list(todo)
            results = self.pool.map(pairs, timeout=self.timeout)
            for pair, r in zip(pairs, results):
                verdict = r is True
                if isinstance(r, WorkerTimeout):
                    self.timeouts += 1
                elif isinstance(r, bool):
                    self._remember(pair, verdict)
                for i in todo[pair]:
                    out[i] = verdict
        return [bool(v) for v in out]

    def _remember(self, pair: tuple[str, str], verdict: bool) -> None:
        with self.cache_lock:
            self.cache[pair] = verdict
            if len(self.cache) > CACHE_SIZE:
                self.cache.popitem(last=False)

    def close(self) -> None:
        self.pool.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass
