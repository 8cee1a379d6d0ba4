"""Atomic, verifiable checkpoints that other tools can load.

A checkpoint ``step-NNNNNNNN/`` is a model directory (``save_pretrained``: config, weights
in the save dtype, tokenizer; a LoRA run's adapter) plus the trainer's state: ``trainer.pt``
(optimizer, scheduler, torch RNG), ``baseline.pt`` when the source of targets keeps state (a
baseline's running mean, PPO's critic; the file keeps the name it had before critics),
``state.json`` (step, data position, plugin state, RNGs, the run's id and config, and the
size and SHA-256 of every file), and, when the saved weights are not the trained ones bit
for bit (a lower save dtype, or an adapter), ``master.safetensors`` with the trainable
parameters as trained. It is written into a temporary directory, fsynced, then renamed, so a
crash leaves the previous checkpoints or the new one, never half of one; and a damaged one
(truncated, bit-flipped, missing a file) is detected before it is loaded.
"""

from __future__ import annotations

import ast
import copy
import hashlib
import json
import os
import random
import shutil
from typing import Any

import numpy as np
import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file

from grpo_core.config import fill_defaults
from grpo_core.config.schema import CORE_SCHEMA
from grpo_core.errors import UserError, write_failure
from grpo_core.store.models import is_peft, save_model

PREFIX = "step-"
FAULT_PAUSE_ENV = "GRPO_CORE_FAULT_CHECKPOINT_PAUSE"
MASTER = "master.safetensors"
TARGETS = "baseline.pt"  # the source of targets' state, when it has any
INFLIGHT = "inflight.pt"  # an asynchronous run's rollouts sampled for steps not yet trained
#: Config keys that may change when a run is resumed (how long, what is logged or evaluated,
#: how many threads, how the run is spread over processes); any other difference is refused
#: unless forced.
MAY_CHANGE = (
    "train.steps",
    "train.max_nonfinite_steps",
    "output.",
    "eval.",
    "health.",
    "runtime.threads",
    "reward.timeout",
    "sampling.generation_timeout",
    "reward.failure",
    "reward.isolation",
    "distributed.",
    "optimizer.fused",
    "model.attn_implementation",  # the same attention, another kernel (rounding apart)
    "callbacks",  # they watch the run; what they stop is the number of steps
)
#: What checkpoints written before the full config was stored are compared on.
COMPATIBILITY_KEYS = (
    ("model", "name_or_path"),
    ("sampling", "group_size"),
    ("baseline", "name"),
    ("train", "prompts_per_step"),
    ("train", "seed"),
)


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


def _digest(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def rng_state() -> dict:
    np_state: Any = np.random.get_state()  # the legacy tuple (name, keys, pos, ...)
    return {
        "python": repr(random.getstate()),
        "numpy": [np_state[0], np_state[1].tolist(), *np_state[2:]],
    }


def set_rng_state(state: dict, torch_state: torch.Tensor) -> None:
    random.setstate(_python_rng(state))
    np.random.set_state(_numpy_rng(state))
    torch.set_rng_state(torch_state)


def _python_rng(state: dict) -> tuple:
    return _tuples(ast.literal_eval(state["python"]))


def _numpy_rng(state: dict) -> tuple:
    n = state["numpy"]
    return (n[0], np.array(n[1], dtype=np.uint32), *n[2:])


def rng_problem(state) -> str | None:
    """Why a checkpoint's ``rng`` entry cannot be restored (None when it can), found by
    restoring it into throwaway generators, so that a damaged entry is passed over like other
    damage instead of failing the resume."""
    try:
        random.Random().setstate(_python_rng(state))
        np.random.RandomState().set_state(_numpy_rng(state))
    except (
        TypeError,
        ValueError,
        KeyError,
        IndexError,
        AttributeError,
        SyntaxError,
        MemoryError,
        RecursionError,
        OverflowError,
    ) as exc:
        return f"its rng entry is malformed ({type(exc).__name__})"
    return None


def _tuples(x):
    return tuple(_tuples(i) for i in x) if isinstance(x, (list, tuple)) else x


def save(
    root: str,
    step: int,
    run_id: str,
    model,
    tokenizer,
    optimizer_state: dict,
    scheduler,
    meta: dict,
    keep_last: int,
    dtype: torch.dtype,
    targets: dict | None = None,
    inflight: dict | None = None,
) -> str:
    """Write checkpoint ``step`` under ``root``; returns its directory. Keeps this run's last
    ``keep_last``; another run's checkpoints are never counted or removed."""
    os.makedirs(root, exist_ok=True)
    final = os.path.join(root, f"{PREFIX}{step:08d}")
    tmp = os.path.join(root, f".tmp-{PREFIX}{step:08d}-{os.getpid()}")
    clear_leftovers(root)
    try:
        os.makedirs(tmp)
        save_model(model, None, tmp, dtype)
        trainable = {k: v for k, v in model.named_parameters() if v.requires_grad}
        if is_peft(model) or any(v.dtype != dtype for v in trainable.values()):
            save_file(
                {k: v.detach().contiguous().cpu() for k, v in trainable.items()},
                os.path.join(tmp, MASTER),
            )
        _fault_pause()
    except (OSError, SafetensorError, RuntimeError) as exc:  # disk full, quota, permissions
        shutil.rmtree(tmp, ignore_errors=True)
        raise UserError(
            f"cannot write checkpoint {final}: {write_failure(exc, root)}; "
            f"earlier checkpoints are intact"
        ) from exc
    return finish_save(
        root,
        tmp,
        final,
        step,
        run_id,
        tokenizer,
        scheduler,
        meta,
        keep_last,
        optimizer_state,
        targets,
        inflight,
    )


def finish_save(
    root: str,
    tmp: str,
    final: str,
    step: int,
    run_id: str,
    tokenizer,
    scheduler,
    meta: dict,
    keep_last: int,
    optimizer_state: dict | None = None,
    targets: dict | None = None,
    inflight: dict | None = None,
) -> str:
    """The part every checkpoint shares, once its weights are in ``tmp``: trainer state, the
    source of targets' (``baseline.pt``: a running mean, a critic's weights and optimizer), an
    asynchronous run's in-flight rollouts (``inflight.pt``), tokenizer, checksums of every
    file, then the rename that makes it exist."""
    try:
        torch.save(
            {
                "optimizer": optimizer_state,
                "scheduler": scheduler.state_dict(),
                "torch_rng": torch.get_rng_state(),
            },
            os.path.join(tmp, "trainer.pt"),
        )
        if targets:
            torch.save(targets, os.path.join(tmp, TARGETS))
        if inflight and inflight["steps"]:
            torch.save(inflight, os.path.join(tmp, INFLIGHT))
        tokenizer.save_pretrained(tmp)
        files = {}
        for folder, _, names in os.walk(tmp):
            for name in sorted(names):
                path = os.path.join(folder, name)
                _fsync(path)
                files[os.path.relpath(path, tmp)] = {
                    "size": os.path.getsize(path),
                    "sha256": _digest(path),
                }
        state = {**meta, "step": step, "run_id": run_id, "rng": rng_state(), "files": files}
        with open(os.path.join(tmp, "state.json"), "w", encoding="utf-8") as f:
            json.dump(state, f)
            f.flush()
            os.fsync(f.fileno())
        _fsync(tmp)
        if os.path.exists(final):
            shutil.rmtree(final)
        os.rename(tmp, final)
        _fsync(root)
    except (OSError, RuntimeError) as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise UserError(
            f"cannot write checkpoint {final}: {write_failure(exc, root)}; "
            f"earlier checkpoints are intact"
        ) from exc
    for old in list_checkpoints(root, run_id)[:-keep_last]:
        gone = os.path.join(root, ".del-" + os.path.basename(old))
        shutil.rmtree(gone, ignore_errors=True)
        os.replace(old, gone)  # out of sight in one step: a kill cannot leave half of it
        shutil.rmtree(gone, ignore_errors=True)
    return final


def inflight(path: str) -> dict | None:
    """The in-flight rollouts checkpoint ``path`` holds (an asynchronous run), or None."""
    file = os.path.join(path, INFLIGHT)
    return torch.load(file, weights_only=True) if os.path.isfile(file) else None


def clear_leftovers(root: str) -> None:
    """Remove what a crash can leave under ``root``: a half-written checkpoint (``.tmp-``) or
    a half-removed one (``.del-``, or a step directory without its state.json); no resume
    ever loads them, but they take space and would be miscounted."""
    for name in os.listdir(root):
        path = os.path.join(root, name)
        if name.startswith((".tmp-", ".del-")) or (
            name.startswith(PREFIX) and not os.path.isfile(os.path.join(path, "state.json"))
        ):
            shutil.rmtree(path, ignore_errors=True)


def _fault_pause() -> None:
    """Fault injection for tests: sleep mid-write when GRPO_CORE_FAULT_CHECKPOINT_PAUSE is set,
    so a test can kill the process while a checkpoint is half written."""
    pause = os.environ.get(FAULT_PAUSE_ENV)
    if pause:
        import time

        time.sleep(float(pause))


def read_state(path: str) -> dict | None:
    """A checkpoint's state.json, or None when it is missing or unreadable."""
    try:
        with open(os.path.join(path, "state.json"), encoding="utf-8") as f:
            state = json.load(f)
        return state if isinstance(state, dict) else None
    except (OSError, ValueError, RecursionError):
        return None


def list_checkpoints(root: str, run_id: str | None = None) -> list[str]:
    """Complete checkpoints under ``root``, oldest first (only run ``run_id``'s, if given)."""
    if not os.path.isdir(root):
        return []
    found = sorted(
        os.path.join(root, d)
        for d in os.listdir(root)
        if d.startswith(PREFIX) and os.path.isfile(os.path.join(root, d, "state.json"))
    )
    if run_id is None:
        return found
    return [p for p in found if (read_state(p) or {}).get("run_id") in (run_id, None)]


def damage(path: str) -> str | None:
    """Why a checkpoint cannot be loaded as written (None when it is intact)."""
    state = read_state(path)
    if state is None:
        return "state.json is missing or unreadable"
    for key in ("step", "data_position", "rng", "kl"):
        if key not in state:
            return f"state.json has no {key!r}"
    problem = rng_problem(state["rng"])
    if problem:
        return f"state.json: {problem}"
    for name, want in (state.get("files") or {}).items():
        p = os.path.join(path, name)
        if not os.path.isfile(p):
            return f"{name} is missing"
        if os.path.getsize(p) != want["size"]:
            return f"{name} has {os.path.getsize(p)} bytes, {want['size']} were written"
        if _digest(p) != want["sha256"]:
            return f"{name} does not match its checksum"
    if not os.path.isfile(os.path.join(path, "trainer.pt")):
        return "trainer.pt is missing"
    return None


def latest_intact(root: str, run_id: str | None, warn) -> str | None:
    """The newest checkpoint of this run that is intact; each damaged one is reported with
    ``warn(message)`` and passed over."""
    for path in reversed(list_checkpoints(root, run_id)):
        problem = damage(path)
        if problem is None:
            return path
        warn(f"checkpoint {path} is damaged ({problem}); trying the one before it")
    return None


def _weights(path: str) -> list[str]:
    """The files holding the trainable weights as trained."""
    if os.path.isfile(os.path.join(path, MASTER)):
        return [os.path.join(path, MASTER)]
    return sorted(
        os.path.join(path, f)
        for f in os.listdir(path)
        if f.startswith("model") and f.endswith(".safetensors")
    )


def check_fits(path: str, model) -> None:
    """Refuse, before loading anything, weights whose names or shapes differ from the model's
    (another model size, LoRA switched on or off)."""
    params = dict(model.named_parameters())
    state_shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    files = _weights(path)
    if os.path.isdir(os.path.join(path, "dcp")):
        return  # sharded: torch.distributed.checkpoint checks names and shapes as it loads
    if not files:
        raise UserError(f"cannot resume from {path}: it holds no weights")
    for file in files:
        with safe_open(file, "pt") as f:
            for key in f.keys():
                have = state_shapes.get(key) or (
                    tuple(params[key].shape) if key in params else None
                )
                shape = tuple(f.get_slice(key).get_shape())
                if have is None:
                    raise UserError(
                        f"cannot resume from {path}: its weight {key} is not in this "
                        f"model (LoRA switched on or off, or another model?)"
                    )
                if have != shape:
                    raise UserError(
                        f"cannot resume from {path}: weight {key} has shape "
                        f"{list(shape)} there and {list(have)} in this model"
                    )


def read_weights(path: str) -> dict:
    """The trainable weights as trained (master file, or the model files)."""
    weights: dict = {}
    for file in _weights(path):
        weights.update(load_file(file))
    return weights


def targets_state(path: str, state: dict) -> dict:
    """The source of targets' state: ``baseline.pt``, or ``state.json``'s (older checkpoints)."""
    file = os.path.join(path, TARGETS)
    if os.path.isfile(file):
        return torch.load(file, weights_only=True)
    return state.get("baseline") or {}


def trainer_state(path: str) -> dict:
    return torch.load(os.path.join(path, "trainer.pt"), weights_only=True)


def load(path: str, model, optimizer, scheduler) -> None:
    """Restore the model, optimizer and scheduler of a one-process checkpoint."""
    check_fits(path, model)
    try:
        missing = set(model.load_state_dict(read_weights(path), strict=False).missing_keys)
        lost = [n for n, p in model.named_parameters() if p.requires_grad and n in missing]
        if lost:
            raise UserError(
                f"cannot resume from {path}: no saved value for {lost[0]}"
                f"{f' and {len(lost) - 1} more' if len(lost) > 1 else ''}"
            )
        trainer = trainer_state(path)
        optimizer_from_state(model, optimizer, trainer["optimizer"])
        scheduler.load_state_dict(trainer["scheduler"])
    except (OSError, SafetensorError, RuntimeError, ValueError, KeyError, EOFError) as exc:
        raise UserError(f"cannot resume from {path}: {str(exc).splitlines()[0]}") from exc


def optimizer_from_state(model, optimizer, state: dict) -> None:
    """Load an optimizer state stored by parameter name (any sharding), or by position as
    ``optimizer.state_dict()`` gives it (checkpoints from before names were stored)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    if state.get("state") and all(isinstance(k, str) for k in state["state"]):
        set_optimizer_state_dict(
            model, optimizer, state, options=StateDictOptions(full_state_dict=True)
        )
    else:
        optimizer.load_state_dict(state)


def restore_rng(path: str, state: dict) -> None:
    set_rng_state(state["rng"], trainer_state(path)["torch_rng"])


def config_differences(state: dict, cfg: dict) -> list[str]:
    """What differs between the checkpoint's config and ``cfg``, beyond what may change."""
    saved = state.get("config")
    if saved is None:  # written before configs were stored: compare the fingerprint
        now = config_fingerprint(cfg)
        old = state.get("fingerprint", {})
        return [
            f"{k}: checkpoint {old.get(k)!r}, config {now[k]!r}"
            for k in now
            if old.get(k) != now[k]
        ]
    # keys added since the checkpoint was written read as their defaults there
    a, b = _flat(fill_defaults(CORE_SCHEMA, copy.deepcopy(saved))), _flat(cfg)
    return [
        f"{k}: checkpoint {a.get(k)!r}, config {b.get(k)!r}"
        for k in sorted(set(a) | set(b))
        if a.get(k) != b.get(k) and not k.startswith(MAY_CHANGE)
    ]


def _flat(cfg, prefix: str = "") -> dict:
    if isinstance(cfg, dict) and cfg:
        out = {}
        for k, v in cfg.items():
            out.update(_flat(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    return {prefix: cfg}
