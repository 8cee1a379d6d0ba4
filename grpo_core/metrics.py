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
    """JSONL always; TensorBoard when installed (``tensorboard``: auto/off); Weights & Biases
    when a project is named."""

    def __init__(self, run_dir: str, total_steps: int, progress: bool = True,
                 tensorboard: str = "auto", wandb_project: str | None = None,
                 config: dict | None = None):
        self.path = os.path.join(run_dir, "metrics.jsonl")
        self.total, self.progress, self.start = total_steps, progress, time.time()
        self.tty = sys.stderr.isatty()
        self.tb = self.wandb = None
        if tensorboard == "auto":
            try:
                from torch.utils.tensorboard import SummaryWriter

                self.tb = SummaryWriter(os.path.join(run_dir, "tensorboard"))
            except ImportError:
                pass
        if wandb_project:
            try:
                import wandb
            except ImportError as exc:
                raise UserError("output.wandb_project is set but wandb is not installed "
                                "(pip install wandb)") from exc
            self.wandb = wandb.init(project=wandb_project, config=config, dir=run_dir)

    def write(self, record: dict) -> None:
        line = json.dumps({k: _clean(v) for k, v in record.items()})
        try:
            with open(self.path, "a", encoding="utf-8") as f:
                f.write(line + "\n")
        except OSError as exc:
            raise UserError(f"cannot write metrics to {self.path}: {exc.strerror or exc}") from exc
        scalars = {k: v for k, v in record.items()
                   if isinstance(v, (int, float)) and not isinstance(v, bool) and k != "step"}
        if self.tb is not None:
            for k, v in scalars.items():
                self.tb.add_scalar(k, v, record["step"])
            self.tb.flush()
        if self.wandb is not None:
            self.wandb.log(scalars, step=record["step"])
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
