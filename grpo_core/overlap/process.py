"""The generator process (``python -m grpo_core.overlap FD``): the ``hf`` generator on its
own copy of the policy, sampling each step's prompts from the weights version the staleness
bound names, and sending the rollouts back. It exits when the trainer says stop, when the
trainer is gone (its channel closes; on Linux also the kernel's parent-death signal), and
after ``sampling.generation_timeout`` seconds without what it waits for, with one line
naming the step and what it waited for."""

from __future__ import annotations

import ctypes
import signal
import sys
import time
from collections import deque
from dataclasses import fields
from multiprocessing.connection import Connection

import torch

from grpo_core.overlap import channel
from grpo_core.overlap.weights import WeightRing

#: seconds the process waits for its set-up message
BOOT_TIMEOUT = 120.0


def _die_with_parent() -> None:
    """Linux: have the kernel SIGKILL this process when the trainer dies, even mid-decode."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass  # elsewhere the closed channel ends it at its next wait


class GeneratorProcess:
    """The generator's side: pending prompt jobs, the newest weights version announced,
    the version loaded into its model."""

    def __init__(self, conn: Connection, spec: dict):
        from grpo_core.building import create
        from grpo_core.store.models import load_model, load_tokenizer, pick_device

        config = spec["config"]
        if config.runtime.threads:
            torch.set_num_threads(config.runtime.threads)
        device = pick_device(config.runtime.device)
        self.model = load_model(config.model, device).requires_grad_(False)
        self.generator = create("generator", config.generator.name, config.generator.options)
        self.generator.setup(self.model, load_tokenizer(config.model), device)
        self.ring = WeightRing(spec["entries"], spec["slot_bytes"], spec["k"] + 1, spec["path"])
        self.conn, self.sampling, self.group = conn, spec["sampling"], spec["group_size"]
        self.k, self.base, self.timeout = spec["k"], spec["base"], spec["timeout"]
        self.next_step = spec["first_step"]  # the step whose prompts come next
        self.jobs: deque[tuple[int, list[list[int]], int]] = deque()
        self.announced, self.loaded = -1, -1

    def needed(self, step: int) -> int:
        """The weights version step ``step`` is sampled from: k updates before it, never
        before the version the run (or its resumption) started from."""
        return max(step - self.k, self.base)

    def serve(self) -> int:
        """Answer jobs until told to stop (0), the trainer is gone (0) or a wait times out
        or generation fails (1, with one line on stderr)."""
        while True:
            if self.jobs and self.announced >= self.needed(self.jobs[0][0]):
                if not self._run(*self.jobs.popleft()):
                    return 1
                continue
            try:
                message = channel.receive(self.conn, self.timeout)
            except channel.Timeout:
                print(f"grpo generator process: {self._waiting()}; exiting", file=sys.stderr)
                return 1
            except channel.Closed:
                return 0
            if message[0] == "stop":
                return 0
            if message[0] == "prompts":
                self.jobs.append(message[1:])
                self.next_step = message[1] + 1
            elif message[0] == "weights":
                self.announced = message[1]

    def _waiting(self) -> str:
        """What the process waited for, in words, for its timeout line."""
        if self.jobs:
            step = self.jobs[0][0]
            return (
                f"at step {step}, waited {self.timeout:g} s for weights version "
                f"{self.needed(step)} from the trainer (sampling.generation_timeout)"
            )
        return (
            f"at step {self.next_step}, waited {self.timeout:g} s for its prompts from the "
            f"trainer (sampling.generation_timeout)"
        )

    def _run(self, step: int, prompt_ids: list[list[int]], seed: int) -> bool:
        """Sample one step's rollout and send it; False when it failed (reported)."""
        version, t0 = self.needed(step), time.time()
        try:
            if self.loaded != version:
                self.ring.read(self.model, version)
                self.loaded = version
            ro = self.generator.generate(prompt_ids, self.group, self.sampling, seed=seed)
            parts = {f.name: getattr(ro, f.name).cpu() for f in fields(ro)}
            channel.send(self.conn, "rollout", step, version, parts, time.time() - t0)
        except channel.Closed:
            return False
        except Exception as exc:  # the trainer ends the run with this line
            line = f"generator process failed at step {step}: {type(exc).__name__}: {exc}"
            try:
                channel.send(self.conn, "error", line.splitlines()[0])
            except channel.Closed:
                pass
            return False
        return True


def main(argv: list[str]) -> int:
    """Entry point: the channel's file descriptor is ``argv[0]``."""
    _die_with_parent()
    conn = Connection(int(argv[0]))
    try:
        spec = channel.receive(conn, BOOT_TIMEOUT)[1]
    except (channel.Timeout, channel.Closed):
        return 1
    try:
        proc = GeneratorProcess(conn, spec)
        channel.send(conn, "ready")
    except channel.Closed:
        return 0
    except Exception as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        try:
            channel.send(conn, "error", f"generator process could not start: {first}")
        except channel.Closed:
            pass
        return 1
    return proc.serve()
