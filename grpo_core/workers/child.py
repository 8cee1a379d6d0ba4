"""The worker side of the pool: the fork server and the worker loop, run as
``python -m grpo_core.workers``."""

from __future__ import annotations

import importlib
import os
import pickle
import signal
import socket
import sys
import traceback
from multiprocessing.connection import Connection
from multiprocessing.reduction import sendfds

from grpo_core.workers.common import resolve


def _limit_memory(limit: int | None) -> None:
    if limit:
        try:
            import resource

            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        except (ImportError, ValueError, OSError):
            pass


def _prepare(config: dict) -> None:
    for p in config["path"]:
        if p not in sys.path:
            sys.path.append(p)


def _work(conn: Connection, config: dict) -> None:
    """A worker: set up, say ready, then answer lists of (index, payload) until None/EOF."""
    _limit_memory(config["memory_bytes"])
    try:
        target = resolve(config["target"])
        state = resolve(config["setup"])(*config["setup_args"]) if config["setup"] else None
    except BaseException as exc:  # report why, then exit: the parent decides what to do
        conn.send(("boot_error", f"{type(exc).__name__}: {exc}"))
        return
    conn.send(("ready",))
    call = (lambda p: target(state, p)) if config["setup"] else target
    while True:
        try:
            jobs = conn.recv()
        except (EOFError, OSError):
            return  # the parent is gone
        if jobs is None:
            return
        for j, payload in jobs:
            try:
                reply = (j, True, call(payload))
            except MemoryError:
                reply = (j, False, ("MemoryError", "out of memory", ""))
            except Exception as exc:
                reply = (
                    j,
                    False,
                    (type(exc).__name__, str(exc)[:2000], traceback.format_exc(limit=8)[-4000:]),
                )
            try:
                conn.send(reply)
            except (pickle.PicklingError, TypeError, AttributeError) as exc:
                conn.send((j, False, (type(exc).__name__, f"result not picklable: {exc}", "")))


def _fork_worker(conn: Connection, config: dict, children: set[int]) -> None:
    """Fork one worker; hand the parent its channel and a pidfd over the server channel."""
    ours, theirs = socket.socketpair()
    pid = os.fork()
    if pid == 0:  # the worker
        code = 0
        try:
            conn.close()
            ours.close()
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            _work(Connection(theirs.detach()), config)
        except BaseException:
            code = 1
        finally:
            os._exit(code)
    children.add(pid)
    theirs.close()
    fds = [ours.fileno()]
    try:
        fds.append(os.pidfd_open(pid))
    except (AttributeError, OSError):
        pass
    conn.send(("spawned", pid))
    with socket.fromfd(conn.fileno(), socket.AF_UNIX, socket.SOCK_STREAM) as s:
        sendfds(s, fds)
    for fd in fds[1:]:
        os.close(fd)
    ours.close()


def _reap(children: set[int]) -> None:
    for pid in list(children):
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            done = pid
        if done:
            children.discard(pid)


def _serve(conn: Connection, config: dict) -> None:
    """The fork server: import once, fork ``spawn`` workers, then fork more on request."""
    if not _boot(conn, config):
        return
    children: set[int] = set()
    for _ in range(config["spawn"]):
        _fork_worker(conn, config, children)
    try:
        _answer(conn, config, children)
    except (EOFError, OSError):
        pass  # the parent is gone
    finally:
        _kill(children)


def _boot(conn: Connection, config: dict) -> bool:
    """Imports the target, setup and preload modules once, so that every forked worker
    shares them; tells the parent ``ready``, or ``boot_error`` with the reason (then False)."""
    try:
        for spec in [config["target"], config["setup"]]:
            if spec:
                importlib.import_module(spec.partition(":")[0])
        for spec in config["preload"]:  # "module", or "module:function" to call (warm caches)
            if ":" in spec:
                resolve(spec)()
            else:
                importlib.import_module(spec)
    except BaseException as exc:
        conn.send(("boot_error", f"{type(exc).__name__}: {exc}"))
        return False
    conn.send(("ready",))
    return True


def _answer(conn: Connection, config: dict, children: set[int]) -> None:
    """Forks workers on the parent's ``spawn`` requests, reaping ended ones meanwhile, until
    it says ``exit`` (a closed channel raises EOFError or OSError)."""
    while True:
        _reap(children)
        if not conn.poll(0.2):
            continue
        msg = conn.recv()
        if msg[0] == "spawn":
            for _ in range(msg[1]):
                _fork_worker(conn, config, children)
        elif msg[0] == "exit":
            break


def _kill(children: set[int]) -> None:
    """Kills and reaps the workers still running, so none outlives its server."""
    for pid in children:
        try:
            os.kill(pid, signal.SIGKILL)  # still our unreaped child: the pid is not reused
            os.waitpid(pid, 0)
        except OSError:
            pass


def main(argv: list[str] | None = None) -> int:
    """``python -m grpo_core.workers {server|worker} FD``: serve the pool on channel FD."""
    mode, fd = (sys.argv[1:] if argv is None else argv)[:2]
    # Ctrl-C reaches the whole process group, a scheduler's SIGTERM often too: the trainer
    # decides when to stop (grpo_core.interrupt: after the step, with a checkpoint), and it
    # needs its workers until then. Its pool ends them by closing the channel, or kills them.
    for s in (signal.SIGINT, signal.SIGTERM):
        signal.signal(s, signal.SIG_IGN)
    conn = Connection(int(fd))
    try:
        config = conn.recv()
        _prepare(config)
        (_serve if mode == "server" else _work)(conn, config)
    except (EOFError, OSError, KeyboardInterrupt):
        pass
    finally:
        conn.close()
    return 0
