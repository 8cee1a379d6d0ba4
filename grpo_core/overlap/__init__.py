"""Asynchronous rollouts: generation in its own process, beside training, with bounded
staleness (``sampling.max_staleness: k``).

The trainer keeps the data order: it takes each step's prompts from its stream and hands
them to the generator process up to k steps ahead. The generator samples step s from the
policy of exactly version ``max(s - k, start)`` (version v: the weights after v updates), so
a run is deterministic whatever the timing, and the staleness of every rollout is k (fewer
in the first k steps). After each update the trainer writes the new weights into a ring of
k + 1 slots in shared memory (grpo_core.overlap.weights) and sends only the version number.
At k = 0 the two processes take turns and the run equals the synchronous loop's.

A checkpoint waits for the rollouts already asked for (steps t+1 .. t+k) and keeps them
(``inflight.pt``, inside the atomic checkpoint), so a resumed run trains every prompt of
the data order once, on the same rollouts an uninterrupted run would have used. Every wait
on either side has a timeout (``sampling.generation_timeout``); see docs/async.md.
"""

from __future__ import annotations

from grpo_core.overlap.remote import RemoteGenerator

__all__ = ["RemoteGenerator"]
