"""Running an untrusted Python program once, bounded, for the ``code`` reward.

Each run is a fresh interpreter (``python -I -S -B``: no site-packages, no ``PYTHON*``
variables, no user directory), never a fork of the trainer, started in a new session so that
a kill reaches its whole process group. Its working directory is an empty temporary directory,
removed afterwards, which is also its ``HOME`` and ``TMPDIR``; its environment holds only
``PATH``, ``LANG``, ``LC_ALL``, ``HOME`` and ``TMPDIR`` (no token or key of the trainer's).

A small launcher (``LAUNCHER``, run with ``-c``) sets the resource limits in the child itself
before any program code runs: CPU seconds, address space, file size, open files, no core
dumps and no new processes (``RLIMIT_NPROC`` 0, which the kernel does not apply to root). It
then installs an audit hook (``sys.addaudithook``) that refuses opening files outside the
working directory (reading the standard library excepted), links, sockets, new processes
(fork, exec, spawn, subprocess, ``os.system``), signals to other processes and ``ctypes``. The
hook is defence in depth, not a security boundary: Python code can be written to get around
it. Where ``unshare`` can make user, network and PID namespaces as the current user (probed
once, :func:`isolation`), the program also runs with no network but a loopback that is down,
and everything it starts dies with it; where ``setpriv`` can, the run is tied to the thread
that started it (``PR_SET_PDEATHSIG``), so a killed reward worker leaves no program behind.
docs/safety.md says what is and is not isolated.

The parent waits at most ``wall`` seconds, reads stdout and stderr in chunks and kills the
process group once either passes ``max_output_bytes``, so neither a hang nor a flood can hold
the reward.
"""

from __future__ import annotations

import functools
import json
import math
import os
import secrets
import selectors
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

CHUNK = 64 * 1024
TOKEN_BYTES = 32  # hex characters of the completion token (assert-style tests)
PROGRAM = "main.py"  # the program's file name in its working directory

#: runs in the child before the program: limits, the audit hook, then the program itself
LAUNCHER = r"""
import json, os, resource, sys

def limit(spec):
    r = resource
    for name, value in (("RLIMIT_CORE", 0), ("RLIMIT_FSIZE", spec["fsize"]),
                        ("RLIMIT_NOFILE", spec["nofile"]), ("RLIMIT_AS", spec["memory"]),
                        ("RLIMIT_CPU", spec["cpu"]), ("RLIMIT_NPROC", 0)):
        res = getattr(r, name)
        hard = r.getrlimit(res)[1]
        cap = value + 1 if name == "RLIMIT_CPU" else value  # SIGXCPU first, SIGKILL a second on
        if hard != r.RLIM_INFINITY:
            value, cap = min(value, hard), min(cap, hard)
        r.setrlimit(res, (value, cap))

def guard(home, roots):
    real, sep, isdir = os.path.realpath, os.sep, os.path.isdir
    deny = ("socket.", "ctypes.", "subprocess.", "os.exec", "os.spawn", "os.posix_spawn",
            "os.fork", "os.forkpty", "os.system", "os.kill", "os.killpg", "os.link",
            "os.symlink", "signal.pthread_kill", "sys._current_frames", "gc.get_")
    writes = {"os.remove", "os.rename", "os.rmdir", "os.mkdir", "os.chmod", "os.chown",
              "os.truncate", "os.utime", "os.chflags", "os.setxattr", "os.removexattr",
              "os.mkfifo", "os.mknod", "shutil.copyfile", "shutil.copymode", "shutil.copystat",
              "shutil.copytree", "shutil.move", "shutil.rmtree", "shutil.chown"}
    lists = {"os.listdir", "os.scandir", "glob.glob", "os.listxattr", "os.getxattr"}
    modules = {"ctypes", "_ctypes", "_posixsubprocess", "_xxsubinterpreters"}
    flags = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC
    own = {"/dev/stdin", "/dev/stdout", "/dev/stderr"}  # its own pipes

    def inside(path, places):
        if isinstance(path, int):
            return True
        try:
            p = real(os.fsdecode(path))
        except Exception:
            return False
        return any(p == d or p.startswith(d + sep) for d in places)

    def opened(path, mode, flag):
        if path is None or isinstance(path, int) or path in own:
            return True
        writing = any(c in mode for c in "wax+") if isinstance(mode, str) else flag & flags
        if inside(path, [home]):
            return True
        return not writing and inside(path, roots) and not isdir(real(os.fsdecode(path)))

    def hook(event, args):
        if event == "open":
            ok = opened(*args)
        elif event in lists:
            ok = inside(args[0] if args and args[0] is not None else ".", [home, *roots])
        elif event in writes:
            ok = all(inside(a, [home]) for a in args if isinstance(a, (str, bytes)))
        elif event == "import":
            ok = args[0] not in modules
        elif event.startswith(deny):
            ok = False
        else:
            return
        if not ok:
            raise PermissionError(f"sandbox: {event} refused")
    return hook

def main():
    spec = json.loads(sys.argv[1])
    token = b""
    while len(token) < spec["token"]:
        part = os.read(0, spec["token"] - len(token))
        if not part:
            break
        token += part
    home = os.path.realpath(os.getcwd())
    roots = [os.path.realpath(os.path.dirname(os.__file__)), "/dev/null", "/dev/urandom"]
    limit(spec)
    with open("main.py", encoding="utf-8") as f:
        source = f.read()
    if spec["guard"]:
        sys.addaudithook(guard(home, roots))
    code = compile(source, "main.py", "exec")
    exec(code, {"__name__": "__main__", "__builtins__": __builtins__})
    if token:
        sys.stdout.flush()
        os.write(1, b"\n" + token + b"\n")

main()
"""


@dataclass(frozen=True)
class Limits:
    """What one run may use: ``cpu`` seconds (``RLIMIT_CPU``, rounded up: SIGXCPU then, SIGKILL
    a second later),
    ``wall`` seconds of real time, ``memory_mb`` of address space, ``max_output_bytes`` on
    stdout and on stderr each, ``max_file_bytes`` per file written, ``max_files`` open at once
    (the interpreter's own included)."""

    cpu: float = 4.0
    wall: float = 14.0
    memory_mb: int = 512
    max_output_bytes: int = 1 << 20
    max_file_bytes: int = 16 << 20
    max_files: int = 32


@dataclass
class Result:
    """How a run ended: the exit status (negative: killed by that signal; unshare may report
    a killed child as 1), what it printed (at most the output cap each), whether it ran past
    its wall-clock time or printed past the cap (then it was killed), and for a run given a
    token, whether the launcher printed it after the program (it ran to its end)."""

    returncode: int
    stdout: bytes
    stderr: bytes
    timed_out: bool = False
    overflow: bool = False
    completed: bool = False

    @property
    def ok(self) -> bool:
        """Exited 0 by itself, within its time and output."""
        return self.returncode == 0 and not self.timed_out and not self.overflow


@dataclass(frozen=True)
class Isolation:
    """How runs are isolated from the machine beyond rlimits and the audit hook: the command
    put before the interpreter and what it gives (``network``: no network but a loopback that
    is down; ``pids``: a PID namespace whose processes all die with the program; ``tethered``:
    the run is killed when the thread that started it dies, so a reward worker killed past
    ``reward.timeout`` leaves no program behind)."""

    prefix: tuple[str, ...]
    network: bool
    pids: bool
    tethered: bool

    def describe(self) -> str:
        parts = ["rlimits, fresh interpreter, cleared environment, temporary cwd, audit hook"]
        parts += ["no network (namespace)"] if self.network else ["network NOT isolated"]
        parts += ["PID namespace"] if self.pids else []
        parts += ["killed with its parent"] if self.tethered else []
        return ", ".join(parts)


_NAMESPACES = (
    (("unshare", "--user", "--net", "--pid", "--fork", "--kill-child", "--"), True, True),
    (("unshare", "--user", "--net", "--"), True, False),
    ((), False, False),
)
_TETHER = ("setpriv", "--pdeathsig", "KILL", "--")  # PR_SET_PDEATHSIG, kept across exec


@functools.cache
def isolation() -> Isolation:
    """The strongest set-up that works here as the current user (namespaces first, then the
    tether), probed once per process by running ``print('ok')`` under it (30 s allowed: an
    interpreter start on a loaded machine)."""
    for namespaces, network, pids in _NAMESPACES:
        for tether in (_TETHER, ()):
            prefix = tether + namespaces
            if _works(prefix):
                return Isolation(prefix, network, pids, bool(tether))
    return Isolation((), False, False, False)


def _works(prefix: tuple[str, ...]) -> bool:
    """Whether a program runs under ``prefix`` here."""
    if prefix and shutil.which(prefix[0]) is None:
        return False
    try:
        done = subprocess.run(
            [*prefix, sys.executable, "-I", "-S", "-c", "print('ok')"],
            capture_output=True,
            env=_environment(tempfile.gettempdir()),
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0 and done.stdout.strip() == b"ok"


def _environment(home: str) -> dict[str, str]:
    """The program's whole environment: nothing of the trainer's but a plain ``PATH``."""
    return {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "HOME": home,
        "TMPDIR": home,
    }


def run(
    source: str,
    stdin: bytes = b"",
    limits: Limits = Limits(),
    token: bool = False,
    guard: bool = True,
) -> Result:
    """Run ``source`` as a program in a fresh sandboxed interpreter, feeding it ``stdin``.

    ``token``: the launcher prints a random token after the program returns, and the result
    says whether it did (``completed``): a program that exits early (``sys.exit(0)``,
    ``os._exit(0)``) never prints it. ``guard=False`` leaves out the audit hook (tests use
    it to check what the operating system's limits alone hold).
    """
    work = tempfile.mkdtemp(prefix="grpo-code-")
    try:
        with open(os.path.join(work, PROGRAM), "w", encoding="utf-8", errors="replace") as f:
            f.write(source)
        secret = secrets.token_hex(TOKEN_BYTES // 2).encode() if token else b""
        config = {
            "token": len(secret),
            "guard": guard,
            "cpu": max(1, math.ceil(limits.cpu)),
            "memory": limits.memory_mb << 20,
            "fsize": limits.max_file_bytes,
            "nofile": limits.max_files,
        }
        argv = [*isolation().prefix, sys.executable, "-I", "-S", "-B", "-c", LAUNCHER]
        proc = subprocess.Popen(
            [*argv, json.dumps(config)],
            cwd=work,
            env=_environment(work),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            close_fds=True,
        )
        result = _communicate(proc, secret + stdin, limits)
        if secret:
            result.completed = result.ok and result.stdout.rstrip().endswith(b"\n" + secret)
        return result
    finally:
        _remove(work)


def _communicate(proc: subprocess.Popen, data: bytes, limits: Limits) -> Result:
    """Feed ``data``, collect stdout and stderr up to the cap, and end the process group:
    at once when the cap or ``limits.wall`` is passed, in any case before it is reaped (so
    nothing the program left behind in its group outlives it)."""
    assert proc.stdin and proc.stdout and proc.stderr  # all three are pipes (see run)
    deadline = time.monotonic() + limits.wall
    out, err = proc.stdout.fileno(), proc.stderr.fileno()
    outs = {out: bytearray(), err: bytearray()}
    sel = selectors.DefaultSelector()
    for fd in outs:
        sel.register(fd, selectors.EVENT_READ)
    stdin, sent = proc.stdin.fileno(), 0
    if data:
        os.set_blocking(stdin, False)
        sel.register(stdin, selectors.EVENT_WRITE)
    else:
        proc.stdin.close()
    timed_out = overflow = False
    while sel.get_map() and not overflow:
        left = deadline - time.monotonic()
        if left <= 0:
            timed_out = True
            break
        for key, _ in sel.select(min(left, 1.0)):
            if key.fd == stdin:
                sent = _feed(stdin, data, sent)
                if sent >= len(data):
                    sel.unregister(stdin)
                    proc.stdin.close()
                continue
            chunk = os.read(key.fd, CHUNK)
            if not chunk:
                sel.unregister(key.fd)
                continue
            buf = outs[key.fd]
            room = limits.max_output_bytes - len(buf)
            buf += chunk[:room]
            overflow = overflow or len(chunk) > room
    sel.close()
    if not (timed_out or overflow):  # both pipes closed: give it until the deadline to exit
        timed_out = not _exited(proc.pid, deadline)
    _kill_group(proc)
    returncode = proc.wait()
    for f in (proc.stdin, proc.stdout, proc.stderr):
        f.close()
    return Result(returncode, bytes(outs[out]), bytes(outs[err]), timed_out, overflow)


def _exited(pid: int, deadline: float) -> bool:
    """Wait until ``pid`` exits (True) or ``deadline`` passes (False), without reaping it: an
    unreaped process keeps its process group's number from being reused before the kill."""
    while time.monotonic() < deadline:
        if os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
            return True
        time.sleep(0.005)
    return False


def _feed(fd: int, data: bytes, sent: int) -> int:
    """Write the next chunk of ``data`` to the child's stdin; a child that closed it takes
    no more (its loss: it did not read its input)."""
    try:
        return sent + os.write(fd, data[sent : sent + CHUNK])
    except BlockingIOError:
        return sent
    except (BrokenPipeError, ConnectionResetError):
        return len(data)


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the run's process group (its session's, as ``start_new_session`` made it)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _remove(work: str) -> None:
    """Delete the working directory whatever the program did to its permissions."""

    def unlock(func, path, _exc):
        try:
            os.chmod(os.path.dirname(path), stat.S_IRWXU)
            os.chmod(path, stat.S_IRWXU)
            func(path)
        except OSError:
            pass

    shutil.rmtree(work, onerror=unlock)
