"""The metrics stream: one JSON object per step in ``metrics.jsonl``, and a live status line."""

from __future__ import annotations

import json
import math
import os
import sys
import time

from grpo_core.errors import UserError

SHOWN = ("reward", "kl", "entropy", "completion_len", "time/step")


class MetricsWriter:
    def __init__(self, run_dir: str, total_steps: int, progress: bool = True):
        self.path = os.path.join(run_dir, "metrics.jsonl")
        self.total, self.progress, self.start = total_steps, progress, time.time()
        self.tty = sys.stderr.isatty()

    def write(self, record: dict) -> None:
        line = json.dumps({k: _clean(v) for k, v in record.items()})
        try:
            with open(self.path, "a", encoding="utf-8") as f:
                f.write(line + "\n")
        except OSError as exc:
            raise UserError(f"cannot write metrics to {self.path}: {exc.strerror or exc}") from exc
        if self.progress:
            self._show(record)

    def _show(self, r: dict) -> None:
        step = r["step"] + 1
        done = int(20 * step / self.total)
        parts = " ".join(f"{k}={r[k]:.3g}" for k in SHOWN if isinstance(r.get(k), (int, float)))
        text = f"[{'#' * done}{'.' * (20 - done)}] {step}/{self.total} {parts}"
        end = "\r" if self.tty and step < self.total else "\n"
        print(text, end=end, file=sys.stderr, flush=True)


def _clean(v):
    if isinstance(v, float) and not math.isfinite(v):
        return None if math.isnan(v) else (1e308 if v > 0 else -1e308)
    return v


def read(run_dir: str) -> list[dict]:
    path = os.path.join(run_dir, "metrics.jsonl")
    if not os.path.exists(path):
        raise UserError(f"{run_dir}: no metrics.jsonl (is it a run directory?)")
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]
