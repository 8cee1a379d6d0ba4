"""The trainer's side of asynchronous rollouts: starting the generator process, handing it
prompts and weight versions, taking its rollouts, and turning every failure or silence of
the other side into one line that ends the run (see grpo_core.overlap)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import weakref
from dataclasses import dataclass, replace
from multiprocessing.connection import Connection
from socket import socketpair
from typing import Any

import torch

from grpo_core.config.view import Config
from grpo_core.errors import TrainingError
from grpo_core.overlap import channel
from grpo_core.overlap.weights import WeightRing, layout
from grpo_core.rollout import Rollout, SamplingParams

#: seconds the generator process may take to load its model and say it is ready
BOOT_TIMEOUT = 300.0


@dataclass(frozen=True)
class Arrived:
    """One step's rollout from the generator process, with the rows it was sampled for."""

    rows: list[dict]
    rollout: Rollout
    version: int  # the weights version that sampled it (updates applied)
    seconds: float  # generation time in the generator process
    waited: float = 0.0  # how long the trainer waited for it


def _spawn(ring: WeightRing) -> tuple[subprocess.Popen, Connection]:
    """``python -m grpo_core.overlap FD`` with a private channel on FD, and the descriptor
    of the weights file where there is one (see grpo_core.overlap.weights)."""
    ours, theirs = socketpair()
    env = dict(os.environ)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "grpo_core.overlap", str(theirs.fileno())],
            pass_fds=(theirs.fileno(), *([ring.fd] if ring.fd >= 0 else [])),
            stdin=subprocess.DEVNULL,
            env=env,
        )
    finally:
        theirs.close()
    return proc, Connection(ours.detach())


def _end(proc: subprocess.Popen, conn: Connection, ring: WeightRing) -> None:
    """Stop the generator process (asked, then killed) and release the channel and file."""
    try:
        channel.send(conn, "stop")
    except channel.Closed:
        pass
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    conn.close()
    ring.close()


class RemoteGenerator:
    """The generator process as the trainer sees it: ``submit`` a step's prompts, ``publish``
    weights after each update, ``receive`` a step's rollout; ``inflight`` and the
    ``restored`` argument carry the rollouts asked for but not yet trained through a
    checkpoint."""

    def __init__(
        self,
        config: Config,
        sampling: SamplingParams,
        model: torch.nn.Module,
        base: int,
        restored: dict | None = None,
    ):
        sc = config.sampling
        self.k, self.timeout = sc.max_staleness, sc.generation_timeout
        entries, slot_bytes = layout(model)
        self.ring = WeightRing(entries, slot_bytes, self.k + 1)
        self.rows: dict[int, list[dict]] = {}  # submitted, not arrived
        self.arrived: dict[int, Arrived] = {}
        self.next_step = base  # the next step whose prompts are to be submitted
        if restored:
            self._restore(restored)
        self.proc, self.conn = _spawn(self.ring)
        self._finalizer = weakref.finalize(self, _end, self.proc, self.conn, self.ring)
        spec = {
            "config": config,
            "sampling": sampling,
            "group_size": sc.group_size,
            "k": self.k,
            "base": base,
            "timeout": self.timeout,
            "first_step": self.next_step,
            "entries": entries,
            "slot_bytes": slot_bytes,
            "path": self.ring.path,
        }
        self._send(base, "setup", spec)
        self._take(base, "the generator process to start", BOOT_TIMEOUT)
        self.ring.close()  # both sides have it mapped
        self.publish(model, base)

    def close(self) -> None:
        """End the generator process (also done when this object is collected)."""
        self._finalizer()

    def publish(self, model: torch.nn.Module, version: int) -> None:
        """The weights after ``version`` updates, for the steps that are to sample from them."""
        self.ring.write(model, version)
        self._send(version, "weights", version)

    def submit(self, step: int, rows: list[dict], prompt_ids: list[list[int]], seed: int) -> None:
        """Step ``step``'s prompts (in the data order), sampled with noise seed ``seed``."""
        self.rows[step] = rows
        self._send(step, "prompts", step, prompt_ids, seed)
        self.next_step = step + 1

    def receive(self, step: int) -> Arrived:
        """Step ``step``'s rollout, waiting for it (never longer than the timeout at once)."""
        t0 = time.time()
        while step not in self.arrived:
            self._take(step, f"the rollout of step {step}")
        return replace(self.arrived.pop(step), waited=time.time() - t0)

    def inflight(self, step: int) -> dict:
        """The rollouts submitted beyond step ``step`` (waiting for those still being
        sampled), as a checkpoint keeps them: tensors, and the rows as JSON."""
        for s in sorted(self.rows):
            while s not in self.arrived:
                self._take(step, f"the rollout of step {s} (to checkpoint it)")
        kept = [self.arrived[s] for s in sorted(self.arrived)]
        return {
            "steps": sorted(self.arrived),
            "versions": [a.version for a in kept],
            "seconds": [a.seconds for a in kept],
            "rows": json.dumps([a.rows for a in kept]),
            "rollouts": [vars(a.rollout) for a in kept],
        }

    def _restore(self, state: dict) -> None:
        rows = json.loads(state["rows"])
        for i, s in enumerate(state["steps"]):
            ro = Rollout(**state["rollouts"][i])
            self.arrived[s] = Arrived(rows[i], ro, state["versions"][i], state["seconds"][i])
            self.next_step = s + 1

    def _send(self, step: int, *message: Any) -> None:
        try:
            channel.send(self.conn, *message)
        except channel.Closed:
            raise self._died(step, f"to hand it {message[0]}") from None

    def _died(self, step: int, what: str) -> TrainingError:
        try:
            code = self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            code = None
        return TrainingError(
            f"generator process died (exit code {code}) at step {step}, while the trainer "
            f"waited {what}"
        )

    def _take(self, step: int, what: str, timeout: float | None = None) -> None:
        """Handle the next message from the generator process; a silence longer than the
        timeout, its death or its error ends the run with one line."""
        wait = self.timeout if timeout is None else timeout
        try:
            message = channel.receive(self.conn, wait)
        except channel.Timeout:
            raise TrainingError(
                f"generator process stalled: at step {step} the trainer waited {wait:g} s for "
                f"{what} (sampling.generation_timeout)"
            ) from None
        except channel.Closed:
            raise self._died(step, f"for {what}") from None
        if message[0] == "error":
            raise TrainingError(f"{message[1]} (the trainer was at step {step})")
        if message[0] == "rollout":
            _, s, version, parts, seconds = message
            self.arrived[s] = Arrived(self.rows.pop(s), Rollout(**parts), version, seconds)
