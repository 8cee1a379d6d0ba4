"""Atomic checkpoints: written to a temporary directory, fsynced, then renamed into place.

A directory named ``step-NNNNNNNN`` exists only once complete, so a crash at any point leaves
either the previous checkpoints or the new one, never a half-written one that resume loads.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from grpo_core.errors import UserError

PREFIX = "step-"
FAULT_PAUSE_ENV = "GRPO_CORE_FAULT_CHECKPOINT_PAUSE"
#: Config parts that must match for a resume (others, like steps or lr, may change).
COMPATIBILITY_KEYS = (("model", "name_or_path"), ("sampling", "group_size"), ("baseline", "name"),
                      ("train", "prompts_per_step"), ("train", "seed"))


def config_fingerprint(cfg: dict) -> dict:
    return {".".join(k): cfg.get(k[0], {}).get(k[1]) for k in COMPATIBILITY_KEYS}


def config_hash(cfg: dict) -> str:
    return hashlib.sha256(json.dumps(cfg, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _fsync(path: str) -> None:
    """Flush a file's or a directory's entry to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write(path: str, write) -> None:
    with open(path, "wb") as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())


def rng_state() -> dict:
    np_state = np.random.get_state()
    return {"python": repr(random.getstate()),
            "numpy": [np_state[0], np_state[1].tolist(), *np_state[2:]]}


def set_rng_state(state: dict, torch_state: torch.Tensor) -> None:
    import ast

    random.setstate(_tuples(ast.literal_eval(state["python"])))
    n = state["numpy"]
    np.random.set_state((n[0], np.array(n[1], dtype=np.uint32), *n[2:]))
    torch.set_rng_state(torch_state)


def _tuples(x):
    return tuple(_tuples(i) for i in x) if isinstance(x, (list, tuple)) else x


def save(root: str, step: int, model, optimizer, scheduler, meta: dict, keep_last: int) -> str:
    """Write checkpoint ``step`` under ``root``; returns its directory. Keeps the last K."""
    os.makedirs(root, exist_ok=True)
    final = os.path.join(root, f"{PREFIX}{step:08d}")
    tmp = os.path.join(root, f".tmp-{PREFIX}{step:08d}-{os.getpid()}")
    for stale in os.listdir(root):  # left by a crash mid-write; never loaded
        if stale.startswith(".tmp-"):
            shutil.rmtree(os.path.join(root, stale), ignore_errors=True)
    try:
        os.makedirs(tmp)
        # trainable weights only: the whole model, or just the adapter of a LoRA run
        # (named_parameters lists a tied weight once, so no two entries share storage)
        state = {k: v.detach().contiguous().cpu() for k, v in model.named_parameters()
                 if v.requires_grad}
        save_file(state, os.path.join(tmp, "model.safetensors"))
        _fsync(os.path.join(tmp, "model.safetensors"))
        _fault_pause()
        _write(os.path.join(tmp, "trainer.pt"), lambda f: torch.save(
            {"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
             "torch_rng": torch.get_rng_state()}, f))
        _write(os.path.join(tmp, "state.json"),
               lambda f: f.write(json.dumps({**meta, "step": step, "rng": rng_state()}).encode()))
        _fsync(tmp)
        if os.path.exists(final):
            shutil.rmtree(final)
        os.rename(tmp, final)
        _fsync(root)
    except (OSError, SafetensorError) as exc:  # disk full, quota, permissions
        shutil.rmtree(tmp, ignore_errors=True)
        reason = getattr(exc, "strerror", None) or str(exc)
        raise UserError(f"cannot write checkpoint {final}: {reason}; "
                        f"earlier checkpoints are intact") from exc
    for old in sorted(list_checkpoints(root))[:-keep_last]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def _fault_pause() -> None:
    """Fault injection for tests: sleep mid-write when GRPO_CORE_FAULT_CHECKPOINT_PAUSE is set,
    so a test can kill the process while a checkpoint is half written."""
    pause = os.environ.get(FAULT_PAUSE_ENV)
    if pause:
        import time

        time.sleep(float(pause))


def list_checkpoints(root: str) -> list[str]:
    if not os.path.isdir(root):
        return []
    return sorted(os.path.join(root, d) for d in os.listdir(root)
                  if d.startswith(PREFIX) and os.path.isfile(os.path.join(root, d, "state.json")))


def latest(root: str) -> str | None:
    found = list_checkpoints(root)
    return found[-1] if found else None


def load(path: str, model, optimizer, scheduler) -> dict:
    """Restore model, optimizer, scheduler and RNGs from ``path``; returns the meta dict."""
    weights = load_file(os.path.join(path, "model.safetensors"))
    model.load_state_dict(weights, strict=False)
    trainer = torch.load(os.path.join(path, "trainer.pt"), weights_only=True)
    optimizer.load_state_dict(trainer["optimizer"])
    scheduler.load_state_dict(trainer["scheduler"])
    with open(os.path.join(path, "state.json"), encoding="utf-8") as f:
        meta = json.load(f)
    set_rng_state(meta["rng"], trainer["torch_rng"])
    return meta


def check_compatible(saved: dict, cfg: dict, force: bool) -> None:
    now = config_fingerprint(cfg)
    diffs = [f"{k}: checkpoint {saved.get(k)!r}, config {now[k]!r}" for k in now
             if saved.get(k) != now[k]]
    if diffs and not force:
        raise UserError("cannot resume: the config differs from the checkpoint's in "
                        + "; ".join(diffs) + " (use --force to resume anyway)")
