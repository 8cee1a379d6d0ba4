"""PNG plots of metric curves: one line per variant, the mean with a band over seeds."""

from __future__ import annotations

import os

from grpo_core.errors import UserError
from grpo_core.metrics import read


def _pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise UserError("plots need matplotlib: pip install 'grpo-core[plot]'") from exc
    return plt


def smooth(values: list[float], window: int) -> list[float]:
    """Trailing moving average (window 1: unchanged)."""
    out, acc = [], []
    for v in values:
        acc.append(v)
        acc = acc[-window:]
        out.append(sum(acc) / len(acc))
    return out


def plot_groups(groups: dict[str, list[list[dict]]], metrics: list[str], out_dir: str,
                smooth_window: int = 1) -> list[str]:
    """``groups``: label -> runs (each a list of metric records). One PNG per metric."""
    plt = _pyplot()
    os.makedirs(out_dir, exist_ok=True)
    paths = []
    for metric in metrics:
        fig, ax = plt.subplots(figsize=(7, 4.2))
        drawn = 0
        for label, runs in groups.items():
            curves = [smooth([float(r[metric]) for r in run if isinstance(r.get(metric),
                                                                          (int, float))],
                             smooth_window) for run in runs]
            curves = [c for c in curves if c]
            if not curves:
                continue
            n = min(map(len, curves))
            cols = [[c[i] for c in curves] for i in range(n)]
            mean = [sum(c) / len(c) for c in cols]
            ax.plot(range(n), mean, label=f"{label} (n={len(curves)})")
            if len(curves) > 1:
                ax.fill_between(range(n), [min(c) for c in cols], [max(c) for c in cols],
                                alpha=0.2)
            drawn += 1
        if not drawn:
            plt.close(fig)
            continue
        title = metric + (f" (moving average over {smooth_window} steps)"
                          if smooth_window > 1 else "")
        ax.set(title=title, xlabel="step", ylabel=metric)
        ax.grid(alpha=0.3)
        ax.legend()
        path = os.path.join(out_dir, metric.replace("/", "_") + ".png")
        fig.tight_layout()
        fig.savefig(path, dpi=100)
        plt.close(fig)
        paths.append(path)
    return paths


def plot_runs(run_dirs: list[str], metrics: list[str], out: str | None = None) -> list[str]:
    """``grpo plot``: one line per run directory."""
    groups = {os.path.basename(os.path.normpath(d)) or d: [read(d)] for d in run_dirs}
    longest = max(len(runs[0]) for runs in groups.values())
    return plot_groups(groups, metrics, out or run_dirs[0], max(1, longest // 50))
