"""The metrics stream: one JSON object per step in ``metrics.jsonl``, a live status line, and
the samples files; what a step's metrics are, summed over ranks where they are per sample."""

from __future__ import annotations

import json
import math
import os
import sys
import time
from typing import TYPE_CHECKING

import torch
from tqdm import tqdm

from grpo_core.config.redact import redact
from grpo_core.data.prompts import Batch
from grpo_core.engine import dist
from grpo_core.errors import UserError
from grpo_core.rollout import Rollout

if TYPE_CHECKING:
    from grpo_core.observe.tracking import Trackers

SHOWN = ("reward", "kl", "entropy", "completion_len", "time/step")
#: a progress line in a log: tqdm's meter without the bar, which only a terminal redraws
LOG_LINE = (
    "{desc}: {n_fmt}/{total_fmt} {percentage:3.0f}% [{elapsed}<{remaining}, {rate_fmt}{postfix}]"
)


class MetricsWriter:
    """``metrics.jsonl`` always (our metric names); each step also goes to the run's
    experiment trackers (logger plugins, grpo_core.observe.tracking), and samples too."""

    def __init__(
        self,
        run_dir: str,
        total_steps: int,
        progress: bool = True,
        trackers: Trackers | None = None,
    ):
        self.path = os.path.join(run_dir, "metrics.jsonl")
        self.total, self.progress, self.start = total_steps, progress, time.time()
        self.tty = sys.stderr.isatty()
        self.first_step: int | None = None  # a resumed run's rate counts its own steps
        self.log_every = max(1, total_steps // 20)
        self.trackers = trackers
        self.bar: tqdm | None = None  # the terminal's progress bar, made at the first step

    def write(self, record: dict) -> None:
        line = redact(json.dumps({k: _clean(v) for k, v in record.items()}))
        try:
            with open(self.path, "a", encoding="utf-8") as f:
                f.write(line + "\n")
        except OSError as exc:
            raise UserError(f"cannot write metrics to {self.path}: {exc.strerror or exc}") from exc
        if self.trackers is not None:
            self.trackers.log(record)
        if self.progress:
            self._show(record)

    def log_samples(self, samples: list[dict], step: int) -> None:
        """A step's samples (from :func:`write_samples`) to the trackers, as a table."""
        if self.trackers is not None:
            self.trackers.log_samples(samples, step)

    def close(self) -> None:
        """Finish the progress bar and the trackers (end of the run)."""
        if self.bar is not None:
            self.bar.close()
            self.bar = None
        if self.trackers is not None:
            self.trackers.close()

    def _show(self, r: dict) -> None:
        """On a terminal a tqdm bar, redrawn each step to the terminal's width; in a log (not
        a terminal) the same meter as a plain line every ``log_every`` steps and at the end,
        so logs stay short and hold no carriage returns."""
        step = r["step"] + 1
        if self.first_step is None:
            self.first_step = r["step"]
        postfix = " ".join(
            f"{k}={r[k]:.3g}"
            for k in SHOWN
            if isinstance(r.get(k), (int, float)) and not isinstance(r.get(k), bool)
        )
        if self.tty:
            if self.bar is None:
                self.bar = tqdm(
                    total=self.total,
                    initial=self.first_step,
                    desc="train",
                    unit="step",
                    file=sys.stderr,
                    mininterval=0,
                    miniters=1,
                    **terminal_width(),
                )
            self.bar.set_postfix_str(postfix, refresh=False)
            self.bar.update(1)
            return
        if step % self.log_every and step < self.total:
            return
        line = tqdm.format_meter(
            step,
            self.total,
            time.time() - self.start,
            prefix="train",
            unit="step",
            postfix=postfix,
            initial=self.first_step,
            bar_format=LOG_LINE,
        )
        print(line, file=sys.stderr, flush=True)


def terminal_width() -> dict:
    """tqdm's size settings: follow the terminal's size as it changes, or 100 x 24 where the
    terminal reports no size (a bare pseudo-terminal), in which tqdm would draw nothing."""
    try:
        size = os.get_terminal_size(sys.__stderr__.fileno())  # type: ignore[union-attr]  # None: caught below
        known = size.columns > 0 and size.lines > 0
    except (AttributeError, OSError, ValueError):
        known = False
    return {"dynamic_ncols": True} if known else {"ncols": 100, "nrows": 24}


def _clean(v):
    if isinstance(v, float) and not math.isfinite(v):
        return None if math.isnan(v) else (1e308 if v > 0 else -1e308)
    return v


def _finite(value):
    """``value`` with every NaN or infinity, however nested, as None (JSON has neither)."""
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def strict_json(value, indent: int | None = None, default=None) -> str:
    """``value`` as JSON that every reader accepts: a NaN or an infinity (a mean over no
    values: the reward of a step whose every reward was missing) is written null."""
    return json.dumps(_finite(value), indent=indent, default=default, allow_nan=False)


def read(run_dir: str) -> list[dict]:
    """A run's metric records. A line cut short (a crash mid-write) is skipped with a warning;
    any other malformed line is an error naming it."""
    path = os.path.join(run_dir, "metrics.jsonl")
    if not os.path.isfile(path):
        raise UserError(f"{run_dir}: no metrics.jsonl (is it a run directory?)")
    try:
        with open(path, encoding="utf-8") as f:
            lines = [line for line in f if line.strip()]
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"{path}: cannot read ({exc})") from exc
    records = []
    for n, line in enumerate(lines, 1):
        try:
            record = json.loads(line)
            if not isinstance(record, dict) or not isinstance(record.get("step"), int):
                raise ValueError("not a metrics record")
        except (ValueError, RecursionError) as exc:
            if n == len(lines) and not line.endswith("\n"):
                print(
                    f"warning: {path}: last line is incomplete (cut off mid-write); skipped",
                    file=sys.stderr,
                )
                break
            raise UserError(f"{path}:{n}: not a metrics record ({exc})") from exc
        records.append(record)
    return records


def rollout_metrics(
    rewards: torch.Tensor,
    grid: torch.Tensor,
    flat: torch.Tensor,
    ro: Rollout,
    dimensions: dict,
    extra: int,
    max_reward: float | None,
    device: torch.device,
) -> dict:
    """Reward, group and length statistics of a step's rollout; ``step_tokens``: the tokens
    of every completion with its prompt (padding left out), over all ranks, as TRL counts
    them for ``num_tokens``.

    rewards [B] (NaN = missing), grid [P, Gmax] the same by group, flat [P] groups whose
    rewards are all equal. A group is *solved* when all its completions reach ``max_reward``
    (the reward's known best); with no known best, none is.
    """
    ok = torch.isfinite(rewards)
    r = torch.where(ok, rewards, 0.0).double()
    gok = torch.isfinite(grid)
    within = torch.tensor(
        [float(g[k].double().std(unbiased=False)) if k.any() else 0.0 for g, k in zip(grid, gok)]
    )
    scale = torch.tensor(
        [float(g[k].double().abs().mean()) if k.any() else 0.0 for g, k in zip(grid, gok)]
    ).clamp(min=1.0)
    tiny = (within > 0) & (within < TINY_STD * scale)  # differences that are only noise
    lengths = ro.completion_mask.sum(-1).double().cpu()
    prompt_lengths = ro.prompt_mask.sum(-1).double().cpu()[ro.group.cpu()]
    solved = (
        torch.zeros_like(flat)
        if max_reward is None
        else flat & (torch.where(gok, grid, -torch.inf).amax(-1) >= max_reward)
    )
    s = dist.sum_named(
        {
            "r": r.sum(),
            "r2": (r * r).sum(),
            "valid": ok.sum(),
            "n": len(rewards),
            "within": within.sum(),
            "groups": len(grid),
            "flat": flat.sum(),
            "length": lengths.sum(),
            "tokens": lengths.sum() + prompt_lengths.sum(),
            "truncated": ro.truncated.sum().cpu(),
            "extra": extra,
            "solved": solved.sum(),
            "tiny": tiny.sum(),
        },
        device,
    )
    longest = dist.all_max(lengths.max().to(device)) if lengths.numel() else 0.0
    n, valid, groups = max(s["n"], 1.0), max(s["valid"], 1.0), max(s["groups"], 1.0)
    mean = s["r"] / valid
    record = {
        "samples": int(s["n"]),
        "reward": mean if s["valid"] else math.nan,
        "reward_std": math.sqrt(max(s["r2"] / valid - mean * mean, 0.0))
        if s["valid"]
        else math.nan,
        "reward_within_group_std": s["within"] / groups,
        "zero_std_frac": s["flat"] / groups,
        "solved_frac": s["solved"] / groups,
        "tiny_std_frac": s["tiny"] / groups,
        "dropped_rewards": int(s["n"] - s["valid"]),
        "extra_completions": int(s["extra"]),
        "completion_len": s["length"] / n,
        "completion_len_max": float(longest),
        "truncated_frac": s["truncated"] / n,
        "step_tokens": int(s["tokens"]),
    }
    for name, values in dimensions.items():  # this rank's completions
        v = torch.tensor([float(x) for x in values])
        v = v[torch.isfinite(v)]
        record[f"reward/{name}"] = float(v.mean()) if v.numel() else math.nan
        record[f"reward_std/{name}"] = float(v.std(unbiased=False)) if v.numel() else math.nan
    return record


def update_metrics(iterations: list[dict[str, float]]) -> dict[str, float]:
    """The update's metrics from each inner iteration's sums (over micro-batches and ranks):
    per-token KL (absent without a reference) and entropy, the loss and its terms (and, with
    a KL term, each term's pull on the log-probs), the clip fractions. Each is the mean over
    the inner iterations, so a clip that only bites
    after the first update (where the ratio is 1) shows; with more than one iteration the
    last one's values also go under ``<name>_last``."""
    each = [_iteration_metrics(s) for s in iterations]
    out = {k: sum(e[k] for e in each) / len(each) for k in each[0]}
    if len(each) > 1:
        out.update({f"{k}_last": v for k, v in each[-1].items()})
    return out


def _iteration_metrics(s: dict[str, float]) -> dict[str, float]:
    tokens = max(s["tokens"], 1.0)
    terms = {k: v for k, v in s.items() if k.startswith("loss/")}
    out = {"kl": s["kl"] / tokens} if "kl" in s else {}
    out.update({"entropy": s["entropy"] / tokens, "loss": sum(terms.values()), **terms})
    counts = {k.removeprefix("count/"): v for k, v in s.items() if k.startswith("count/")}
    out.update({f"{k}_frac": v / tokens for k, v in counts.items()})  # the objective's counts
    if "clip_low" in counts and "clip_high" in counts:  # TRL's region: either bound, not both
        out["clip_region_frac"] = (counts["clip_low"] + counts["clip_high"]) / tokens
    out.update({k: v for k, v in s.items() if k.startswith("critic/")})  # PPO: already means
    out.update({k: v for k, v in s.items() if k.startswith("pull/")})  # what each term pulls
    if "positions" in s:  # the policy pass's decoder positions that were padding
        out["padding_frac"] = s["padding"] / max(s["positions"], 1.0)
    return out


#: a group whose rewards' std is under this (relative to their size) differs by noise only
TINY_STD = 1e-4


def memory_limit_mb(device: torch.device) -> float | None:
    """What the device has: a GPU's memory, or on the CPU the machine's memory or the
    container's limit (cgroup), whichever is smaller."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory / 2**20
    limits = []
    try:
        with open("/proc/meminfo", encoding="utf-8") as f:
            limits += [int(line.split()[1]) / 1024 for line in f if line.startswith("MemTotal")]
    except OSError:
        pass
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            with open(path, encoding="utf-8") as f:
                value = f.read().strip()
            if value.isdigit() and int(value) < 2**60:
                limits.append(int(value) / 2**20)
        except OSError:
            pass
    return min(limits) if limits else None


def write_samples(
    run_dir: str,
    step: int,
    batch: Batch,
    ro: Rollout,
    dimensions: dict,
    extras: dict,
    rewards: torch.Tensor,
    adv: torch.Tensor,
    tokenizer,
    k: int = 2,
) -> list[dict]:
    """The first ``k`` groups of a step, as JSONL and as readable text; returns the records
    (for the trackers' tables)."""
    lines, text, records = [], [], []
    for p in range(min(k, len(batch.prompts))):
        for i in torch.nonzero(ro.group == p).squeeze(1).tolist():
            comp = tokenizer.decode(
                ro.completion_ids[i][ro.completion_mask[i].bool()], skip_special_tokens=True
            )
            rec = {
                "step": step,
                "group": p,
                "prompt": batch.prompts[p],
                "completion": comp,
                "reward": float(rewards[i]),
                "advantage": float(adv[i]),
                "dimensions": {n: float(v[i]) for n, v in dimensions.items()},
                "extras": {n: str(v[i]) for n, v in extras.items()},
            }
            records.append(rec)
            lines.append(json.dumps(_finite(rec)))  # valid JSON: null, never a bare NaN
            text.append(_sample_text(rec))
    try:
        with open(os.path.join(run_dir, "samples.jsonl"), "a", encoding="utf-8") as f:
            f.write(redact("\n".join(lines)) + "\n")
        with open(os.path.join(run_dir, "samples.txt"), "a", encoding="utf-8") as f:
            f.write(redact("\n".join(text)) + "\n")
    except OSError as exc:
        raise UserError(f"cannot write samples to {run_dir}: {exc.strerror or exc}") from exc
    return records


def _sample_text(rec: dict) -> str:
    """One sample as ``samples.txt`` shows it (a value JSON kept as null reads nan)."""

    def num(v):
        return math.nan if v is None else v

    dims = {n: num(v) for n, v in rec["dimensions"].items()}
    return (
        f"--- step {rec['step']} group {rec['group']} reward {num(rec['reward']):.3f} "
        f"advantage {num(rec['advantage']):+.3f} {dims or ''}\n"
        f"PROMPT: {rec['prompt']}\nCOMPLETION: {rec['completion']}\n"
    )


def truncate_step_files(run_dir: str, step: int) -> None:
    """Forget what the steps that will be run again wrote to the run's per-step files, so a
    resumed run repeats nothing: the lines of ``metrics.jsonl`` and the rows of
    ``samples.jsonl`` from ``step`` on, a line cut off mid-write (a kill) included, and
    ``samples.txt`` rewritten from the rows kept. (TensorBoard's events are purged from the
    same step by its logger.)"""
    path = os.path.join(run_dir, "metrics.jsonl")
    if os.path.isfile(path):  # absent, or a device or pipe: nothing to read back
        _rewrite(path, [json.dumps(r) + "\n" for r in read(run_dir) if r["step"] < step])
    path = os.path.join(run_dir, "samples.jsonl")
    if os.path.isfile(path):
        rows = [r for r in _sample_rows(path) if r["step"] < step]
        _rewrite(path, [json.dumps(r) + "\n" for r in rows])
        text = [redact(_sample_text(r)) + "\n" for r in rows]  # as write_samples spaces them
        _rewrite(os.path.join(run_dir, "samples.txt"), text)


def _sample_rows(path: str) -> list[dict]:
    """The sample rows of ``samples.jsonl``; a line that is not one (cut off mid-write, or
    edited) is dropped with a warning."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            lines = f.readlines()
    except OSError as exc:
        raise UserError(f"{path}: cannot read ({exc.strerror or exc})") from exc
    rows = []
    for n, line in enumerate(lines, 1):
        try:
            row = json.loads(line) if line.endswith("\n") else None
        except (ValueError, RecursionError):
            row = None
        if isinstance(row, dict) and isinstance(row.get("step"), int):
            rows.append(row)
        elif line.strip():
            print(
                f"warning: {path}:{n}: not a sample row (cut off mid-write?); dropped",
                file=sys.stderr,
            )
    return rows


def _rewrite(path: str, lines: list[str]) -> None:
    """Replace the file at ``path`` by ``lines``, atomically."""
    tmp = path + ".tmp"
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.writelines(lines)
        os.replace(tmp, path)
    except OSError as exc:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise UserError(f"cannot rewrite {path}: {exc.strerror or exc}") from exc


def peak_memory_mb(device: torch.device) -> float:
    """Peak accelerator memory allocated (CUDA) or the process's peak resident size (CPU)."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return peak_rss_bytes() / 2**20


def peak_rss_bytes() -> int:
    """The peak resident size of this process's address space: Linux's ``VmHWM``.

    Not ``getrusage``'s ``ru_maxrss``: that also keeps the peak of the address space the
    process was exec'd from, and a child that Python's ``subprocess`` starts (by ``vfork``)
    execs out of its parent's, so a run started by a process that once held gigabytes (a
    ``grpo compare``, a test worker) would report those gigabytes as its own.
    """
    try:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))
    except (OSError, StopIteration):
        import resource

        unit = 1 if sys.platform == "darwin" else 1024  # bytes on macOS, KiB elsewhere
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * unit


def reset_peak_rss() -> int:
    """Set the peak resident size to the resident size now and return it, in bytes, so a
    later :func:`peak_rss_bytes` measures only what follows (Linux 4.0+: ``5`` written to
    ``/proc/self/clear_refs``)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    return peak_rss_bytes()
