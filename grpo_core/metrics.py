"""The metrics stream: one JSON object per step in ``metrics.jsonl``, a live status line, and
the samples files; what a step's metrics are, summed over ranks where they are per sample."""

from __future__ import annotations

import json
import math
import os
import sys
import time

import torch

from grpo_core import dist
from grpo_core.data import Batch
from grpo_core.errors import UserError
from grpo_core.rollout import Rollout

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


def rollout_metrics(rewards: torch.Tensor, grid: torch.Tensor, flat: torch.Tensor, ro: Rollout,
                    dimensions: dict, extra: int, max_reward: float | None,
                    device: torch.device) -> dict:
    """Reward, group and length statistics of a step's rollout.

    rewards [B] (NaN = missing), grid [P, Gmax] the same by group, flat [P] groups whose
    rewards are all equal. A group is *solved* when all its completions reach ``max_reward``
    (the reward's known best); with no known best, none is.
    """
    ok = torch.isfinite(rewards)
    r = torch.where(ok, rewards, 0.0).double()
    gok = torch.isfinite(grid)
    within = torch.tensor([float(g[k].std(unbiased=False)) if k.any() else 0.0
                           for g, k in zip(grid, gok)])
    lengths = ro.completion_mask.sum(-1).double().cpu()
    solved = torch.zeros_like(flat) if max_reward is None else \
        flat & (torch.where(gok, grid, -torch.inf).amax(-1) >= max_reward)
    s = dist.sum_named({"r": r.sum(), "r2": (r * r).sum(), "valid": ok.sum(), "n": len(rewards),
                        "within": within.sum(), "groups": len(grid), "flat": flat.sum(),
                        "length": lengths.sum(), "truncated": ro.truncated.sum().cpu(),
                        "extra": extra, "solved": solved.sum()}, device)
    longest = dist.all_max(lengths.max().to(device)) if lengths.numel() else 0.0
    n, valid, groups = max(s["n"], 1.0), max(s["valid"], 1.0), max(s["groups"], 1.0)
    mean = s["r"] / valid
    record = {
        "samples": int(s["n"]),
        "reward": mean if s["valid"] else math.nan,
        "reward_std": math.sqrt(max(s["r2"] / valid - mean * mean, 0.0)) if s["valid"]
        else math.nan,
        "reward_within_group_std": s["within"] / groups,
        "zero_std_frac": s["flat"] / groups,
        "solved_frac": s["solved"] / groups,
        "dropped_rewards": int(s["n"] - s["valid"]),
        "extra_completions": int(s["extra"]),
        "completion_len": s["length"] / n,
        "completion_len_max": float(longest),
        "truncated_frac": s["truncated"] / n,
    }
    for name, values in dimensions.items():  # this rank's completions
        v = torch.tensor([float(x) for x in values])
        v = v[torch.isfinite(v)]
        record[f"reward/{name}"] = float(v.mean()) if v.numel() else math.nan
    return record


def write_samples(run_dir: str, step: int, batch: Batch, ro: Rollout, dimensions: dict,
                  extras: dict, rewards: torch.Tensor, adv: torch.Tensor, tokenizer,
                  k: int = 2) -> None:
    """The first ``k`` groups of a step, as JSONL and as readable text."""
    lines, text = [], []
    for p in range(min(k, len(batch.prompts))):
        for i in torch.nonzero(ro.group == p).squeeze(1).tolist():
            comp = tokenizer.decode(ro.completion_ids[i][ro.completion_mask[i].bool()],
                                    skip_special_tokens=True)
            rec = {"step": step, "group": p, "prompt": batch.prompts[p], "completion": comp,
                   "reward": float(rewards[i]), "advantage": float(adv[i]),
                   "dimensions": {n: float(v[i]) for n, v in dimensions.items()},
                   "extras": {n: str(v[i]) for n, v in extras.items()}}
            lines.append(json.dumps(rec))
            text.append(f"--- step {step} group {p} reward {rec['reward']:.3f} "
                        f"advantage {rec['advantage']:+.3f} {rec['dimensions'] or ''}\n"
                        f"PROMPT: {batch.prompts[p]}\nCOMPLETION: {comp}\n")
    try:
        with open(os.path.join(run_dir, "samples.jsonl"), "a", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")
        with open(os.path.join(run_dir, "samples.txt"), "a", encoding="utf-8") as f:
            f.write("\n".join(text) + "\n")
    except OSError as exc:
        raise UserError(f"cannot write samples to {run_dir}: {exc.strerror or exc}") from exc


def truncate_metrics(run_dir: str, step: int) -> None:
    """Forget metric lines from steps that will be run again (all of them for a fresh run)."""
    path = os.path.join(run_dir, "metrics.jsonl")
    if not os.path.isfile(path):  # absent, or a device or pipe: nothing to read back
        return
    if step == 0:
        open(path, "w", encoding="utf-8").close()
        return
    with open(path, encoding="utf-8") as f:
        kept = [line for line in f if line.strip() and json.loads(line)["step"] < step]
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.writelines(kept)
    os.replace(tmp, path)


def peak_memory_mb(device: torch.device) -> float:
    """Peak accelerator memory allocated (CUDA) or the process's peak resident size (CPU)."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
