"""The run directory: ours to write, one writer at a time, never a user's folder.

A run directory carries a marker (``.grpo-run``: the run's id and start time). A fresh run
takes a directory that does not exist or is empty; it refuses a non-empty directory without
the marker (a model's directory, a user's files), and refuses an earlier run's directory
unless told to resume it or to overwrite it (which clears it, checkpoints included). The
process that writes holds an exclusive lock (``.grpo-lock``, with its PID); the operating
system releases it when the process ends, however it ends, so a dead writer leaves no stale
lock behind.
"""

from __future__ import annotations

import fcntl
import glob
import json
import os
import shutil
import time
import uuid
from collections.abc import Sequence

from grpo_core.errors import UserError

MARKER = ".grpo-run"
LOCK = ".grpo-lock"
_held: dict[str, int] = {}  # directory -> fd of its lock, kept open while this process runs


def _marker(path: str) -> dict | None:
    try:
        with open(os.path.join(path, MARKER), encoding="utf-8") as f:
            value = json.load(f)
        return value if isinstance(value, dict) else None
    except (OSError, ValueError):
        return None


def _lock(path: str) -> None:
    """Take the directory's lock or refuse, naming the process that holds it."""
    if path in _held:
        return
    fd = os.open(os.path.join(path, LOCK), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        raise _in_use(path, fd) from None
    os.ftruncate(fd, 0)
    os.write(fd, str(os.getpid()).encode())
    _held[path] = fd


def _in_use(path: str, fd: int) -> UserError:
    """The refusal naming the process that holds the lock open on ``fd`` (closed here)."""
    holder = _holder(fd)
    os.close(fd)
    return UserError(
        f"output.dir: {path} is in use by another grpo process (PID {holder}); "
        f"wait for it to finish or choose another directory"
    )


def _holder(fd: int) -> str:
    """The PID the lock's holder wrote (it writes it just after taking the lock: a moment's
    wait covers a start that is that far behind)."""
    deadline = time.monotonic() + 2.0
    while True:
        text = os.pread(fd, 32, 0).decode(errors="replace").strip()
        if text or time.monotonic() > deadline:
            return text or "unknown"
        time.sleep(0.01)


def refuse_if_in_use(path: str) -> None:
    """Another grpo process that holds ``path``'s lock is what a directory that is filling up
    as we look at it means: name it (its PID) instead of calling the directory foreign."""
    if path in _held or not os.path.exists(os.path.join(path, LOCK)):
        return
    try:
        fd = os.open(os.path.join(path, LOCK), os.O_RDWR)
    except OSError:
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        raise _in_use(path, fd) from None
    os.close(fd)  # closing lets go of the lock again


def problems(path: str) -> list[str]:
    """Why ``path`` can never be a run directory, whatever the flags (for ``grpo validate``)."""
    if "\0" in path:
        return [f"{path!r} contains a NUL character, which no file name can hold"]
    try:
        path.encode("utf-8")  # what the run's files (config.json, trackers' logs) record
    except UnicodeEncodeError as exc:
        return [
            f"{path!r} holds {exc.object[exc.start]!r}, a lone surrogate (a byte that is not "
            "UTF-8); expected a UTF-8 path"
        ]
    path = os.path.abspath(path)
    if os.path.exists(path) and not os.path.isdir(path):
        return [f"{path} exists and is not a directory"]
    if (
        os.path.isdir(path)
        and _marker(path) is None
        and set(os.listdir(path)) - {LOCK}
        and not _has_checkpoints(path)
    ):
        return [f"{path} is not empty and is not a grpo run directory"]
    return []


def claim(
    path: str, resume: bool = False, overwrite: bool = False, inputs: Sequence[tuple[str, str]] = ()
) -> str:
    """Make ``path`` this run's directory (locked); returns the run's id.

    Fresh: ``path`` absent or empty. ``resume``: an earlier run's directory, kept. ``overwrite``:
    an earlier run's directory, emptied first, unless one of the run's ``inputs`` (config key,
    path: see :func:`input_paths`) lies inside it. Anything else is refused with the reason.
    """
    path = _make_dir(path)
    marker = _marker(path)
    others = sorted(set(os.listdir(path)) - {LOCK})
    if marker is None and resume and _has_checkpoints(path):
        marker = {}  # a run directory from before markers: adopt it
    if others and marker is None:
        refuse_if_in_use(path)
        shown = ", ".join(others[:4]) + (", ..." if len(others) > 4 else "")
        raise UserError(
            f"output.dir: {path} is not empty ({shown}) and is not a grpo run "
            f"directory; choose a new or empty directory"
        )
    try:
        _lock(path)
    except OSError as exc:
        raise UserError(f"output.dir: cannot lock {path}: {exc.strerror or exc}") from exc
    if marker is not None and resume:
        if "run_id" not in marker:
            marker = _write_marker(path)
        return str(marker["run_id"])
    if marker is not None and not overwrite and _has_results(path):
        raise UserError(
            f"output.dir: {path} holds an earlier run (started "
            f"{marker.get('started', '?')}); use --resume to continue it or "
            f"--overwrite to replace it"
        )
    _empty(path, others, inputs)
    return str(_write_marker(path)["run_id"])


def _make_dir(path: str) -> str:
    """``path`` made absolute and created if absent; a UserError unless it is then a
    directory this process can write in (checked before anything is locked or deleted)."""
    if not path or not path.strip():
        raise UserError("output.dir: empty; expected a directory path")
    path = os.path.abspath(path)
    if os.path.exists(path) and not os.path.isdir(path):
        raise UserError(f"output.dir: {path} exists and is not a directory")
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as exc:
        raise UserError(f"output.dir: cannot create {path}: {exc.strerror or exc}") from exc
    if not os.access(path, os.W_OK | os.X_OK):
        raise UserError(f"output.dir: {path} is not writable")
    return path


def _empty(path: str, others: list[str], inputs: Sequence[tuple[str, str]]) -> None:
    """Deletes ``others`` (the entries of the run directory ``path`` but its lock), unless one
    of the run's ``inputs`` lies inside it: then a UserError, and nothing is deleted."""
    inside = [(key, p) for key, p in inputs if _within(p, path)]
    if others and inside:
        key, p = inside[0]
        raise UserError(
            f"--overwrite: {key} ({p}) lies inside {path}, which --overwrite would "
            f"empty; nothing was deleted: copy it out or choose another "
            f"output.dir"
        )
    for name in others:  # overwrite: ours to clear (the marker says so)
        target = os.path.join(path, name)
        if os.path.isdir(target) and not os.path.islink(target):
            shutil.rmtree(target)
        else:
            os.remove(target)


def input_paths(cfg: dict) -> list[tuple[str, str]]:
    """(config key, path) of every existing file or directory a run reads: each string of the
    config outside ``output`` that names one (the model and its tokenizer, data, eval data,
    plugin options such as a reward model's directory), and the files a ``data.data_files``
    glob matches. Relative paths are taken from the working directory, as the run takes them."""
    found: list[tuple[str, str]] = []

    def walk(value, where: str) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                walk(v, f"{where}.{k}" if where else str(k))
        elif isinstance(value, list):
            for i, v in enumerate(value):
                walk(v, f"{where}[{i}]")
        elif isinstance(value, str) and value.strip() and len(value) < 4096:
            pattern = where.startswith("data.data_files") and glob.has_magic(value)
            matches = glob.glob(value) if pattern else [value]
            found.extend((where, m) for m in matches if os.path.lexists(m))

    walk({k: v for k, v in cfg.items() if k != "output"}, "")
    return found


def _within(inner: str, outer: str) -> bool:
    """Whether ``inner`` is ``outer`` or lies below it, links followed."""
    inner, outer = os.path.realpath(inner), os.path.realpath(outer)
    return inner == outer or inner.startswith(outer.rstrip(os.sep) + os.sep)


def _write_marker(path: str) -> dict:
    marker = {"run_id": uuid.uuid4().hex[:12], "started": time.strftime("%Y-%m-%d %H:%M:%S")}
    with open(os.path.join(path, MARKER), "w", encoding="utf-8") as f:
        json.dump(marker, f)
    return marker


def _has_results(path: str) -> bool:
    """Whether an earlier run left anything worth keeping (a run that stopped during set-up
    left only its config: rerunning it after the fix needs no --overwrite)."""
    for name in os.listdir(path):
        full = os.path.join(path, name)
        if name in (MARKER, LOCK, "config.json"):
            continue
        if os.path.isfile(full) and os.path.getsize(full) == 0:
            continue
        if os.path.isdir(full) and not os.listdir(full):
            continue
        return True
    return False


def _has_checkpoints(path: str) -> bool:
    root = os.path.join(path, "checkpoints")
    return os.path.isdir(root) and any(
        d.startswith("step-") and os.path.isfile(os.path.join(root, d, "state.json"))
        for d in os.listdir(root)
    )


def run_id(path: str) -> str:
    """The id of the run whose directory ``path`` is (other ranks read it after rank 0
    claimed the directory)."""
    return str((_marker(os.path.abspath(path)) or {}).get("run_id", ""))


def release(path: str) -> None:
    """Let go of the directory's lock (at the end of a run in a long-lived process)."""
    fd = _held.pop(os.path.abspath(path), None)
    if fd is not None:
        os.close(fd)
