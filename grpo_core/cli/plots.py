"""PNG curves of runs' metrics: one line per run or variant, the mean with a min-max band over
seeds, against the records' ``step`` (or, for ``grpo compare``, generated tokens and wall
time). Dense series are smoothed with a moving average; sparse ones (eval points, written
every N steps) are drawn as their raw points."""

from __future__ import annotations

import math
import os

import numpy as np

from grpo_core.cli import stats
from grpo_core.errors import UserError
from grpo_core.observe.metrics import read

X_LABELS = {
    "step": "step",
    "generated_tokens": "generated tokens (sampled + greedy)",
    "wall_seconds": "wall time of the steps (s)",
}
DEFAULT_METRICS = ("reward", "kl", "entropy", "completion_len")


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


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def series(records: list[dict], metric: str, x: str = "step") -> tuple[list[float], list[float]]:
    """(x values, metric values) of the records where both are finite numbers."""
    pts = [
        (float(r[x]), float(r[metric]))
        for r in records
        if _number(r.get(x)) and _number(r.get(metric))
    ]
    return [p[0] for p in pts], [p[1] for p in pts]


def is_sparse(records: list[dict], metric: str) -> bool:
    """Written in fewer than half the records (eval metrics, every N steps)."""
    return 2 * sum(_number(r.get(metric)) for r in records) < len(records)


def available(runs: list[list[dict]]) -> list[str]:
    """Every numeric metric in any of the runs, sorted."""
    return sorted(
        {k for run in runs for r in run for k, v in r.items() if k != "step" and _number(v)}
    )


def default_metrics(runs: list[list[dict]]) -> list[str]:
    """reward, per-dimension rewards, kl, entropy, completion length and eval metrics: those
    the runs have."""
    have = available(runs)
    wanted = [
        "reward",
        *[m for m in have if m.startswith("reward/")],
        *DEFAULT_METRICS[1:],
        *[m for m in have if m.startswith("eval/")],
    ]
    return [m for m in wanted if m in have]


def _align(curves: list[tuple[list[float], list[float]]]) -> tuple[np.ndarray, np.ndarray]:
    """Curves on one x grid: their own when they share it, else the overlap of their ranges
    with each curve linearly interpolated. -> (grid [K], values [runs, K])."""
    xs0 = curves[0][0]
    if all(c[0] == xs0 for c in curves):
        return np.array(xs0), np.array([c[1] for c in curves])
    lo, hi = max(c[0][0] for c in curves), min(c[0][-1] for c in curves)
    grid = np.linspace(lo, hi, 300) if hi > lo else np.array([lo])
    return grid, np.array([np.interp(grid, c[0], c[1]) for c in curves])


def lines(
    groups: dict[str, list[list[dict]]],
    metric: str,
    x: str = "step",
    smooth_window: int | None = None,
) -> tuple[list[dict], int]:
    """What a figure of ``metric`` shows: per label that has it, ``{name, colour, x, mean,
    lo, hi, n, sparse}`` (lo/hi: min and max over the runs), and the smoothing window of the
    dense series (None: a fiftieth of the longest). Sparse series keep their raw points, at
    the x values all of the label's runs share (the first run's when they share none)."""
    out, window = [], 1
    for i, (name, runs) in enumerate(groups.items()):
        curves = [c for c in (series(run, metric, x) for run in runs) if c[0]]
        if not curves:
            continue
        line = {"name": name, "colour": f"C{i % 10}", "n": len(curves), "sparse": False}
        if any(is_sparse(run, metric) for run in runs):
            shared = sorted(set.intersection(*(set(c[0]) for c in curves)))
            if not shared:
                curves = curves[:1]
                shared = curves[0][0]
            vals = np.array([[dict(zip(*c))[s] for s in shared] for c in curves])
            line.update(sparse=True, n=len(curves), x=np.array(shared))
        else:
            window = smooth_window or max(1, max(len(c[0]) for c in curves) // 50)
            line["x"], vals = _align([(cx, smooth(cy, window)) for cx, cy in curves])
        out.append({**line, "mean": vals.mean(0), "lo": vals.min(0), "hi": vals.max(0)})
    return out, window


def plot_groups(
    groups: dict[str, list[list[dict]]],
    metrics: list[str],
    out_dir: str,
    smooth_window: int | None = None,
    x: str = "step",
) -> list[str]:
    """``groups``: label -> runs (each a list of metric records). One PNG per metric that
    some run has, a line per label (its colour fixed by the label's place, the same in every
    figure), against the records' ``x`` field."""
    plt = _pyplot()
    try:
        os.makedirs(out_dir, exist_ok=True)
    except OSError as exc:
        raise UserError(f"--out: cannot create {out_dir}: {exc.strerror or exc}") from None
    paths = []
    for metric in metrics:
        drawn, window = lines(groups, metric, x, smooth_window)
        if not drawn:
            continue
        fig, ax = plt.subplots(figsize=(7, 4.2))
        for ln in drawn:
            name = f"{ln['name']} (n={ln['n']})" if ln["n"] > 1 else ln["name"]
            if ln["sparse"]:
                ax.errorbar(
                    ln["x"],
                    ln["mean"],
                    yerr=[ln["mean"] - ln["lo"], ln["hi"] - ln["mean"]],
                    fmt="o-",
                    color=ln["colour"],
                    capsize=3,
                    label=name,
                )
                continue
            ax.plot(ln["x"], ln["mean"], color=ln["colour"], label=name)
            if ln["n"] > 1:
                ax.fill_between(ln["x"], ln["lo"], ln["hi"], color=ln["colour"], alpha=0.2)
        notes = [f"moving average over {window} steps"] if window > 1 else []
        notes += ["band: min-max over seeds"] if any(ln["n"] > 1 for ln in drawn) else []
        title = metric + (f" ({'; '.join(notes)})" if notes else "")
        ax.set(title=title, xlabel=X_LABELS.get(x, x), ylabel=metric)
        ax.grid(alpha=0.3)
        ax.legend()
        suffix = "" if x == "step" else f"_vs_{x}"
        path = os.path.join(out_dir, metric.replace("/", "_") + suffix + ".png")
        fig.tight_layout()
        try:
            fig.savefig(path, dpi=100)
        except OSError as exc:
            raise UserError(f"--out: cannot write {path}: {exc.strerror or exc}") from None
        finally:
            plt.close(fig)
        paths.append(path)
    return paths


def unique_labels(paths: list[str]) -> list[str]:
    """The shortest trailing part of each path that tells it from the others
    (``a/seed0``, ``b/seed0``); the same directory twice gets ``(2)``."""
    parts = [os.path.normpath(os.path.abspath(p)).split(os.sep) for p in paths]
    for k in range(1, max(map(len, parts)) + 1):
        labels = ["/".join(p[-k:]) for p in parts]
        if len(set(labels)) == len(labels):
            return labels
    seen: dict[str, int] = {}
    out = []
    for lab in labels:
        seen[lab] = seen.get(lab, 0) + 1
        out.append(lab if seen[lab] == 1 else f"{lab} ({seen[lab]})")
    return out


def plot_runs(
    run_dirs: list[str], metrics: list[str] | None = None, out: str | None = None
) -> list[str]:
    """``grpo plot``: one line per run directory against its ``step``; ``metrics`` None: the
    default set the runs have. A metric no run has is an error listing those they have."""
    runs = [read(d) for d in run_dirs]
    have = available(runs)
    if metrics is None:
        metrics = default_metrics(runs)
    else:
        missing = [m for m in metrics if m not in have]
        if missing or not metrics:
            raise UserError(
                f"--metrics: no run has {', '.join(map(repr, missing)) or 'none'}; "
                f"available: {', '.join(have)}"
            )
    groups = {lab: [run] for lab, run in zip(unique_labels(run_dirs), runs)}
    return plot_groups(groups, metrics, out or run_dirs[0])


def with_axes(records: list[dict], figures: dict) -> list[dict]:
    """Records with the cumulative ``generated_tokens`` and ``wall_seconds`` of a compare
    run's figures added (what the compute-matched curves are drawn against)."""
    return [
        {**r, "generated_tokens": t, "wall_seconds": s}
        for r, t, s in zip(records, figures["tokens"], figures["seconds"])
    ]


def plot_study(results: dict[str, dict], out: str) -> list[str]:
    """``grpo compare``'s figures: the default metrics against steps, and the reward against
    generated tokens and against wall time."""
    groups = {
        name: [with_axes(r["records"], r["figures"]) for r in v["runs"]]
        for name, v in results.items()
    }
    runs = [run for g in groups.values() for run in g]
    paths = plot_groups(groups, default_metrics(runs), out)
    for x in ("generated_tokens", "wall_seconds"):
        paths += plot_groups(groups, ["reward"], out, x=x)
    return paths


# compare.md: the study's tables, from the runs' figures (grpo_core/cli/stats.py).

CRITERIA = {
    "auc": "area under the reward curve (mean reward over all steps)",
    "final": "final reward (mean over the last 10% of steps)",
}
PAIR_METRICS = {
    "auc": "area under the reward curve per step",
    "auc_tokens": "area under the reward curve, matched generated tokens",
    "final": "final reward",
    "eval": "held-out accuracy (eval/accuracy, last)",
}


#: seeds below which a percentile bootstrap interval of a mean is the range of the seeds'
#: values (with 3, each end is drawn alone in 1/27 > 2.5% of the resamples)
MIN_CI_SEEDS = 4


def _interval(n: int) -> str:
    """What the bracketed interval is, for ``n`` seeds a side: a 95% bootstrap interval, or
    (too few seeds for one) the lowest to highest seed."""
    return "95% CI" if n >= MIN_CI_SEEDS else "min-max of seeds"


def _ci(s: dict) -> str:
    return "n/a" if not s["n"] else f"{s['mean']:.3f} [{s['lo']:.3f}, {s['hi']:.3f}]"


def _p(p: float) -> str:
    return "n/a" if p is None or math.isnan(p) else f"{p:.3g}"


def _reach(values: list, unit: str) -> str:
    """Median over seeds of a 'first reached' figure, a seed that never reached counting as
    later than any; with how many seeds reached."""
    got = sorted(v if v is not None else math.inf for v in values)
    n, k = len(got), sum(v is not None for v in values)
    mid = got[n // 2] if n % 2 else (got[n // 2 - 1] + got[n // 2]) / 2
    text = "not reached" if math.isinf(mid) else f"{mid:,.0f}{unit}"
    return f"{text} ({k}/{n} seeds)"


def _clean(x):
    """JSON without NaN: NaN and infinities as null."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    return x


def _shared_lr(args, results: dict) -> list[str]:
    """A warning when every variant ran at one learning rate nobody tuned for it: the ranking
    may then say which variant suits that rate rather than which is better."""
    rates = {r["config"]["optimizer"]["lr"] for v in results.values() for r in v["runs"]}
    tuned = any(item.split("=", 1)[0].strip() == "optimizer.lr" for item in args.tune)
    if len(results) < 2 or len(rates) != 1 or tuned:
        return []
    return [
        f"All variants ran at one learning rate, optimizer.lr = {rates.pop():g}, not tuned "
        f"per variant: a variant that suits this rate can rank first because of it. "
        f"`--tune optimizer.lr=A,B,C` chooses a rate per variant on tuning seeds.",
        "",
    ]


def _tuning(args, tuned: dict, tune_seeds: list[int]) -> list[str]:
    """The tuning table: every candidate's criterion per tuning seed, the chosen one marked."""
    lines = [
        "## Tuning",
        "",
        f"Per variant, each candidate ran on tuning seeds {', '.join(map(str, tune_seeds))};"
        f" chosen: the highest mean {CRITERIA[args.criterion]} (ties: the first listed); "
        f"evaluation seeds are never tuning seeds.",
        "",
        f"| variant | candidate | {args.criterion} per tuning seed | mean | |",
        "|---|---|---|---|---|",
    ]
    for name, t in tuned.items():
        lines += [
            f"| {name} | {c['value']} | {', '.join(f'{s:.3f}' for s in c['scores'])} | "
            f"{c['mean']:.3f} | {'**chosen**' if c['value'] == t['chosen'] else ''} |"
            for c in t["candidates"]
        ]
    edge = [name for name, t in tuned.items() if t["edge"]]
    if edge:
        lines += [
            "",
            f"Chosen at an end of the candidates (the best may lie beyond): {', '.join(edge)}.",
        ]
    return [*lines, ""]


def _results(args, results: dict, budget: float, metrics: list[str], data: dict) -> list[str]:
    """One row per variant: figures with intervals, thresholds, compute; into ``data`` too.
    The held-out accuracy column is there when the runs validated (``eval`` config)."""
    t = args.threshold
    ci = _interval(min(len(v["runs"]) for v in results.values()))
    held_out = f" held-out accuracy [{ci}] |" if "eval" in metrics else ""
    lines = [
        "## Results on the evaluation seeds",
        "",
        f"| variant | settings | final reward [{ci}] | AUC per step [{ci}] | AUC to "
        f"{budget:,.0f} tokens [{ci}] |{held_out} steps to {t} | tokens to {t} | seconds "
        f"to {t} | tokens per run | wall s per run | s per step | peak MiB |",
        "|---|---|---|---|---|" + "---|" * (7 + bool(held_out)),
    ]
    for name, v in results.items():
        figs = [r["figures"] for r in v["runs"]]
        sums = {m: stats.summary([f[m] for f in figs]) for m in metrics}
        reach = {
            u: [f["reach"][u] if f["reach"] else None for f in figs]
            for u in ("step", "tokens", "seconds")
        }
        toks = sum(f["tokens"][-1] for f in figs) / len(figs)
        secs = sum(r["seconds"] for r in v["runs"]) / len(figs)
        lines.append(
            f"| {name} | {v['settings']} | {_ci(sums['final'])} | {_ci(sums['auc'])} | "
            f"{_ci(sums['auc_tokens'])} |"
            + (f" {_ci(sums['eval'])} |" if held_out else "")
            + f" {_reach(reach['step'], '')} | {_reach(reach['tokens'], '')} | "
            f"{_reach(reach['seconds'], ' s')} | {toks:,.0f} | {secs:.0f} | "
            f"{np.median([f['step_seconds'] for f in figs]):.2f} | "
            f"{_peak([f['peak_mb'] for f in figs])} |"
        )
        data["variants"][name] = {
            "settings": v["settings"],
            **sums,
            "reach": reach,
            "runs": [
                {
                    "seed": r["seed"],
                    "dir": r["dir"],
                    "reused": r["reused"],
                    "seconds": r["seconds"],
                    **{m: r["figures"][m] for m in metrics},
                    "reach": r["figures"]["reach"],
                    "tokens": r["figures"]["tokens"][-1],
                    "step_seconds": r["figures"]["step_seconds"],
                    "peak_mb": r["figures"]["peak_mb"],
                }
                for r in v["runs"]
            ],
        }
    return lines


def _peak(values: list[float]) -> str:
    """The largest peak memory of a variant's runs, in MiB ("n/a" when none was logged)."""
    logged = [v for v in values if not math.isnan(v)]
    return f"{max(logged):,.0f}" if logged else "n/a"


def _pairs(args, results: dict, metrics: list[str], data: dict) -> list[str]:
    """Per metric, every pair of variants: difference, interval, p-values, verdict."""
    n_pairs = len(results) * (len(results) - 1) // 2
    sizes = [len(v["runs"]) for v in results.values()]
    floor = stats.permutation_floor(min(sizes), min(sizes))
    ci = _interval(min(sizes))
    interval = (
        "95% bootstrap interval"
        if ci == "95% CI"
        else "bootstrap range (too few seeds for a 95% interval)"
    )
    lines = [
        "",
        "## Pairwise tests",
        "",
        f"Difference of means (row's first minus second) with its {interval}; "
        f"two-sided exact permutation and Welch p-values; Holm's adjustment of the "
        f"{args.test} p over the {n_pairs} pair(s) of each metric; verdict at 0.05 on the "
        f"adjusted p. With {min(sizes)} seeds a side the smallest possible permutation p "
        f"is {floor:.3g}"
        + (
            f", so after adjusting for {n_pairs} pair(s) no permutation verdict can reach "
            f"0.05 (Welch's, which assumes roughly normal per-seed values, can)."
            if floor * n_pairs >= 0.05
            else "."
        ),
    ]
    for metric in metrics:
        title = PAIR_METRICS[metric]
        groups = {n: [r["figures"][metric] for r in v["runs"]] for n, v in results.items()}
        rows = data["pairwise"][metric] = stats.pairwise(groups, args.test)
        lines += [
            "",
            f"### {title}",
            "",
            f"| pair | difference [{ci}] | p permutation | p Welch | p Holm | verdict |",
            "|---|---|---|---|---|---|",
        ]
        lines += [
            f"| {r['a']} vs {r['b']} | {r['diff']:+.3f} [{r['lo']:+.3f}, {r['hi']:+.3f}] "
            f"| {_p(r['p_permutation'])} | {_p(r['p_welch'])} | {_p(r['p_holm'])} | "
            f"{r['verdict']} |"
            for r in rows
        ]
    return lines


def build_report(
    args, results: dict, tuned: dict, tune_seeds: list[int], wall: float
) -> tuple[str, dict]:
    """compare.md's text and compare.json's data: the settings, the tuning, each variant's
    figures with intervals, the pairwise tests, and what each figure means."""
    runs = [r for v in results.values() for r in v["runs"]]
    budget = min(r["figures"]["tokens"][-1] for r in runs)
    for r in runs:
        f = r["figures"]
        f["auc_tokens"] = stats.area_until(f["rewards"], f["tokens"], budget)
    seeds = sorted({r["seed"] for r in runs})
    data: dict = {
        "config": args.config,
        "overrides": list(args.set),
        "seeds": seeds,
        "tune_seeds": tune_seeds,
        "criterion": args.criterion,
        "test": args.test,
        "threshold": args.threshold,
        "window": args.window,
        "token_budget": budget,
        "wall_seconds": wall,
        "tuning": tuned,
        "variants": {},
        "pairwise": {},
    }
    head = (
        f"config `{args.config}`"
        + (f" with {', '.join(args.set)}" if args.set else "")
        + f"; {runs[0]['config']['train']['steps']} steps per run; evaluation seeds "
        f"{', '.join(map(str, seeds))}; threshold {args.threshold} on the trailing "
        f"{args.window}-step mean reward; {len(runs)} evaluation runs, "
        f"{sum(r['reused'] for r in runs)} of them reused from an earlier invocation; "
        f"wall time of this invocation {wall:.0f} s."
    )
    lines = [
        "# grpo compare",
        "",
        head,
        "",
        *_shared_lr(args, results),
        *(_tuning(args, tuned, tune_seeds) if tuned else []),
    ]
    metrics = [
        m
        for m in PAIR_METRICS
        if m != "eval" or all(not math.isnan(r["figures"]["eval"]) for r in runs)
    ]
    lines += _results(args, results, budget, metrics, data)
    lines += _pairs(args, results, metrics, data) if len(results) > 1 else []
    lines += [
        "",
        "## Definitions",
        "",
        "- Final reward: mean training reward over the last 10% of steps. AUC per step: "
        "mean reward over all steps (area under the reward-vs-step curve / steps).",
        f"- AUC to {budget:,.0f} tokens: area under reward vs cumulative generated "
        "tokens up to the smallest total of any run here, divided by it (compute-matched)."
        " Generated tokens: samples x mean completion length per step (resampled "
        "completions included), plus the greedy completions of a baseline that needs them"
        " (ReMax; the trainer's `greedy_tokens` when recorded, else prompts x mean "
        "sampled length).",
        "- Steps / tokens / seconds to the threshold: median over seeds of the first "
        "point where the trailing mean reward reaches it (a seed that never does counts "
        "as later than all). Seconds: the steps' own time (`time/step`), not start-up.",
        "- Intervals: percentile bootstrap over seeds (every resample enumerated up to 10"
        " seeds per mean; 20,000 drawn beyond). With few seeds they cannot reach past the"
        " lowest and highest seed and are too narrow; read overlapping intervals as no "
        f"evidence of a difference. Below {MIN_CI_SEEDS} seeds they are the lowest to "
        "highest seed's value, and labelled so.",
    ]
    return "\n".join(lines) + "\n", _clean(data)
