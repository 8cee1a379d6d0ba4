"""The GRPO training loop, top to bottom.

Each step: sample G completions for each of P prompts, score them, turn the [P, G] rewards
into advantages with the baseline plugin, then take ``inner_iterations`` optimizer steps on
the objective plugin's policy term (plus KL to a frozen reference and an entropy bonus),
accumulating gradients over micro-batches of whole groups; then observe and save. Each phase
is one call (grpo_core.phases); the run's state is set up once (grpo_core.run).
"""

from __future__ import annotations

import time

from grpo_core import dynamic, phases
from grpo_core.errors import TrainingError
from grpo_core.interrupt import StopRequests
from grpo_core.run import finish, start
from grpo_core.store import persist

__all__ = ["train", "TrainingError"]


def train(
    cfg: dict, resume: str | bool | None = None, force: bool = False, overwrite: bool = False
) -> dict:
    """Run GRPO as configured; returns a summary. ``resume``: True (the newest checkpoint) or
    a checkpoint directory; ``overwrite``: replace an earlier run in ``output.dir``. SIGINT or
    SIGTERM stops it after the current step with a checkpoint (grpo_core.interrupt)."""
    run = start(cfg, resume, force, overwrite)
    with StopRequests() as stops:
        for step in range(run.start_step, run.config.train.steps):
            t0 = time.time()
            if run.config.groups.dynamic_sampling:  # 1-2, until the batch has signal (DAPO)
                sampled, judged = dynamic.sample_with_signal(run, step)
            else:
                sampled = phases.sample(run, step)  # 1. G completions per prompt
                judged = phases.score(run, step, sampled)  # 2. rewards (+ resampling, greedy)
            targets = phases.advantages(run, judged)  # 3. reference, KL placement, baseline
            updated = phases.update(run, step, judged, targets)  # 4. mu passes of the objective
            phases.observe(run, step, sampled, judged, targets, updated, t0)  # 5. metrics, eval
            asked = run.callbacks.step_end(step, run.last, run.device)  # a callback's stop
            last = asked or step + 1 == run.config.train.steps
            signum = 0 if last else persist.stop_signal(run, stops.signum)
            # 6. a checkpoint every output.checkpoint_every steps, and on a signal
            saved = persist.save(run, step, now=bool(signum))
            if saved:
                run.callbacks.saved(step + 1, saved)
            if signum:
                raise persist.stopped(run, step, saved, signum)
            if asked:
                break
    summary = finish(run)
    run.callbacks.end(summary)
    return summary
