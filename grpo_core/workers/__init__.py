"""A killable pool of worker processes with a hard per-item time budget.

Why not ``multiprocessing``: its ``spawn`` start method re-imports the caller's ``__main__``
in every worker. A plain script without ``if __name__ == "__main__":`` then runs its top level
again in each child (and dies), a script piped on standard input cannot be re-imported at
all, and a heavy main module makes the first call slow. Here the workers descend from a fresh
interpreter started as ``[sys.executable, "-m", "grpo_core.workers"]``; they never see the
caller's main module, so the pool works the same from an unguarded script, a script on stdin,
a notebook, or any thread.

That interpreter is a small fork server: it imports the target's modules (and ``preload``)
once, then forks each worker, so N workers cost one interpreter start, and a worker killed
for running over its budget is replaced in milliseconds. The server only imports and forks;
it never runs a job. (``fork_server=False`` starts every worker as its own interpreter.)

Protocol: pickled messages over private socket pairs (file descriptors handed over with
``pass_fds`` / ``SCM_RIGHTS``), never over a worker's stdout, which plugin code is free to
print to. Functions are named as ``"package.module:function"`` strings, so nothing from the
caller is pickled but the payloads and ``setup_args``.

Usage::

    pool = WorkerPool("pkg.mod:check", setup="pkg.mod:load", setup_args=(path,),
                      size=2, memory_mb=2048)
    results = pool.map(payloads, timeout=2.0)   # one entry per payload, in order
    failed = [r for r in results if isinstance(r, WorkerFailure)]
    pool.close()

Each worker calls ``state = setup(*setup_args)`` once, then ``target(state, payload)`` per
item (``target(payload)`` when there is no setup). A result slot holds the target's return
value, or an instance of :class:`WorkerTimeout` (over budget: the worker was killed and
replaced), :class:`WorkerCrashed` (the worker died: memory limit, segfault, ``os._exit``) or
:class:`WorkerError` (the target raised; its type, message and traceback text are kept).
Workers start in the background when the pool is made. POSIX only.
"""

from __future__ import annotations

from grpo_core.workers.common import (
    WorkerCrashed,
    WorkerError,
    WorkerFailure,
    WorkerTimeout,
    resolve,
)
from grpo_core.workers.pool import SharedPool, WorkerPool, shared_pool

__all__ = [
    "WorkerPool",
    "SharedPool",
    "shared_pool",
    "WorkerFailure",
    "WorkerTimeout",
    "WorkerCrashed",
    "WorkerError",
    "resolve",
]
