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
import json
import os
import shutil
import time
import uuid

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
        holder = os.read(fd, 32).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        raise UserError(f"output.dir: {path} is in use by another grpo process (PID {holder}); "
                        f"wait for it to finish or choose another directory") from None
    os.ftruncate(fd, 0)
    os.write(fd, str(os.getpid()).encode())
    _held[path] = fd


def problems(path: str) -> list[str]:
    """Why ``path`` can never be a run directory, whatever the flags (for ``grpo validate``)."""
    path = os.path.abspath(path)
    if os.path.exists(path) and not os.path.isdir(path):
        return [f"{path} exists and is not a directory"]
    if os.path.isdir(path) and _marker(path) is None and set(os.listdir(path)) - {LOCK} \
            and not _has_checkpoints(path):
        return [f"{path} is not empty and is not a grpo run directory"]
    return []


def claim(path: str, resume: bool = False, overwrite: bool = False) -> str:
    """Make ``path`` this run's directory (locked); returns the run's id.

    Fresh: ``path`` absent or empty. ``resume``: an earlier run's directory, kept. ``overwrite``:
    an earlier run's directory, emptied first. Anything else is refused with the reason.
    """
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
    marker = _marker(path)
    others = sorted(set(os.listdir(path)) - {LOCK})
    if marker is None and resume and _has_checkpoints(path):
        marker = {}  # a run directory from before markers: adopt it
    if others and marker is None:
        shown = ", ".join(others[:4]) + (", ..." if len(others) > 4 else "")
        raise UserError(f"output.dir: {path} is not empty ({shown}) and is not a grpo run "
                        f"directory; choose a new or empty directory")
    try:
        _lock(path)
    except OSError as exc:
        raise UserError(f"output.dir: cannot lock {path}: {exc.strerror or exc}") from exc
    if marker is not None and resume:
        if "run_id" not in marker:
            marker = _write_marker(path)
        return str(marker["run_id"])
    if marker is not None and not overwrite and _has_results(path):
        raise UserError(f"output.dir: {path} holds an earlier run (started "
                        f"{marker.get('started', '?')}); use --resume to continue it or "
                        f"--overwrite to replace it")
    for name in others:  # overwrite: ours to clear (the marker says so)
        target = os.path.join(path, name)
        if os.path.isdir(target) and not os.path.islink(target):
            shutil.rmtree(target)
        else:
            os.remove(target)
    return str(_write_marker(path)["run_id"])


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
        for d in os.listdir(root))


def run_id(path: str) -> str:
    """The id of the run whose directory ``path`` is (other ranks read it after rank 0
    claimed the directory)."""
    return str((_marker(os.path.abspath(path)) or {}).get("run_id", ""))


def release(path: str) -> None:
    """Let go of the directory's lock (at the end of a run in a long-lived process)."""
    fd = _held.pop(os.path.abspath(path), None)
    if fd is not None:
        os.close(fd)
