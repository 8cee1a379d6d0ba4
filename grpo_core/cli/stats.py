"""The statistics ``grpo compare`` reports, over seeds (one number per run):

- a percentile bootstrap confidence interval of a mean, and of a difference of two means;
- a two-sided permutation test of a difference of means;
- Welch's unequal-variance t-test (Student's t tail from scipy.stats);
- Holm's step-down adjustment for testing several pairs at once.

With the few seeds a study affords, exact answers are cheap, so they are exact where they can
be: the bootstrap enumerates every distinct resample (multiset of seeds) with its multinomial
probability, and the permutation test every split of the pooled values; beyond a size limit
both fall back to a seeded Monte Carlo draw, so a report is reproducible either way.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

EXACT_LIMIT = 200_000  # most resamples / splits / pairs of resamples enumerated
DRAWS = 20_000  # Monte Carlo draws beyond that
_TOL = 1e-12  # values this close count as equal (ties in a test, quantile edges)


def mean_distribution(values, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """The bootstrap distribution of the mean of ``values``: (means, probabilities).

    Exact while the number of distinct resamples, C(2n - 1, n), is at most EXACT_LIMIT
    (n <= 10): each multiset of indices with counts c has probability n! / (prod c_i! n^n).
    Beyond that, DRAWS resamples with equal weight.
    """
    x = np.asarray(values, dtype=float)
    n = len(x)
    if n == 0:
        raise ValueError("no values")
    if math.comb(2 * n - 1, n) <= EXACT_LIMIT:
        idx = np.array(list(itertools.combinations_with_replacement(range(n), n)))
        counts = np.stack([np.bincount(row, minlength=n) for row in idx])
        log_w = (
            math.lgamma(n + 1)
            - n * math.log(n)
            - np.sum([[math.lgamma(c + 1) for c in row] for row in counts], axis=1)
        )
        return x[idx].mean(axis=1), np.exp(log_w)
    rng = np.random.default_rng(seed)
    means = x[rng.integers(0, n, size=(DRAWS, n))].mean(axis=1)
    return means, np.full(DRAWS, 1.0 / DRAWS)


def quantile(values: np.ndarray, weights: np.ndarray, q: float) -> float:
    """The smallest value whose cumulative probability reaches ``q`` (the inverse CDF)."""
    order = np.argsort(values, kind="stable")
    cdf = np.cumsum(weights[order]) / np.sum(weights)
    i = int(np.searchsorted(cdf, q - _TOL, side="left"))
    return float(values[order][min(i, len(order) - 1)])


def bootstrap_ci(values, level: float = 0.95, seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean. With few values it is too narrow (it cannot
    reach beyond the smallest and largest value), which a report should say."""
    means, w = mean_distribution(values, seed)
    tail = (1 - level) / 2
    return quantile(means, w, tail), quantile(means, w, 1 - tail)


def bootstrap_diff_ci(a, b, level: float = 0.95, seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of mean(a) - mean(b), each resampled on its own."""
    ma, wa = mean_distribution(a, seed)
    mb, wb = mean_distribution(b, seed + 1)
    if len(ma) * len(mb) > EXACT_LIMIT * 20:  # two Monte Carlo sets: pair them instead
        rng = np.random.default_rng(seed)
        da = rng.choice(ma, size=DRAWS, p=wa / wa.sum())
        db = rng.choice(mb, size=DRAWS, p=wb / wb.sum())
        diffs, w = da - db, np.full(DRAWS, 1.0 / DRAWS)
    else:
        diffs, w = (ma[:, None] - mb[None, :]).ravel(), (wa[:, None] * wb[None, :]).ravel()
    tail = (1 - level) / 2
    return quantile(diffs, w, tail), quantile(diffs, w, 1 - tail)


def permutation_p(a, b, seed: int = 0) -> float:
    """Two-sided permutation test of mean(a) = mean(b): the share of relabellings of the
    pooled values whose |difference of means| is at least the observed one. Exact (all
    C(n_a + n_b, n_a) splits) up to EXACT_LIMIT splits; beyond, (1 + hits) / (1 + DRAWS)."""
    x, y = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if len(x) == 0 or len(y) == 0:
        raise ValueError("both groups need values")
    pooled, k, n = np.concatenate([x, y]), len(x), len(x) + len(y)
    observed = abs(x.mean() - y.mean())
    total = pooled.sum()
    if math.comb(n, k) <= EXACT_LIMIT:
        picks = np.array(list(itertools.combinations(range(n), k)))
        sums = pooled[picks].sum(axis=1)
        diffs = np.abs(sums / k - (total - sums) / (n - k))
        return float(np.mean(diffs >= observed - _TOL))
    rng = np.random.default_rng(seed)
    hits = 0
    for _ in range(DRAWS):
        s = rng.permutation(pooled)[:k].sum()
        hits += abs(s / k - (total - s) / (n - k)) >= observed - _TOL
    return (1 + hits) / (1 + DRAWS)


def permutation_floor(n_a: int, n_b: int) -> float:
    """The smallest p-value an exact two-sided permutation test of these sizes can give
    (two splits, the observed one and its mirror, when n_a == n_b)."""
    return (2 if n_a == n_b else 1) / math.comb(n_a + n_b, n_a)


def t_two_sided(t: float, df: float) -> float:
    """P(|T| >= |t|) for Student's t with ``df`` degrees of freedom (scipy.stats: its
    survival function keeps the far tail's precision, where 1 - cdf would round to 0)."""
    from scipy.stats import t as student_t

    return float(2.0 * student_t.sf(abs(t), df))


def welch(a, b) -> tuple[float, float, float]:
    """Welch's t-test of mean(a) = mean(b): (t, degrees of freedom, two-sided p).
    NaN when a group has fewer than two values; with no spread in either group, p is 1 for
    equal means and 0 otherwise."""
    x, y = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if len(x) < 2 or len(y) < 2:
        return math.nan, math.nan, math.nan
    va, vb = x.var(ddof=1) / len(x), y.var(ddof=1) / len(y)
    diff = float(x.mean() - y.mean())
    if va + vb == 0:
        return (0.0, math.nan, 1.0) if diff == 0 else (math.copysign(math.inf, diff), math.nan, 0.0)
    t = diff / math.sqrt(va + vb)
    df = (va + vb) ** 2 / (va**2 / (len(x) - 1) + vb**2 / (len(y) - 1))
    return t, df, t_two_sided(t, df)


def holm(pvalues: list[float]) -> list[float]:
    """Holm's step-down adjustment: sort ascending, multiply the i-th (from 0) by m - i, keep
    the running maximum, cap at 1. NaN stays NaN and does not count towards m."""
    ranked = sorted((p, i) for i, p in enumerate(pvalues) if not math.isnan(p))
    m, out, running = len(ranked), [math.nan] * len(pvalues), 0.0
    for rank, (p, i) in enumerate(ranked):
        running = max(running, min(1.0, (m - rank) * p))
        out[i] = running
    return out


# Per-run figures: one number per run from its metrics records, for the tests above.


def step_tokens(record: dict, prompts_per_step: int, greedy: bool) -> float:
    """Tokens generated in a step: its sampled completions (resampled ones included) and, for
    a baseline that needs them (ReMax), its greedy completions: the trainer's
    ``greedy_tokens`` when it records them, else one completion of the mean sampled length
    per prompt (an estimate)."""
    length = float(record.get("completion_len") or 0.0)
    sampled = float(record.get("samples") or 0) * length
    if not greedy:
        return sampled
    got = record.get("greedy_tokens")
    return sampled + (float(got) if got is not None else prompts_per_step * length)


def run_figures(
    records: list[dict], prompts_per_step: int, greedy: bool, threshold: float, window: int = 20
) -> dict:
    """Final reward (mean of the last 10% of steps), area under the reward curve per step
    (the mean reward over all steps), the last held-out ``eval/accuracy`` (NaN without one),
    cumulative generated tokens and seconds per step, the median seconds of a step and the
    peak memory in MiB (the largest ``peak_memory_mb`` logged: the device's on a GPU, the
    process's resident size on a CPU; NaN when not logged), and the step, tokens and seconds
    at which the trailing ``window``-step mean reward first reaches ``threshold`` (None if
    never)."""
    rewards = np.array([np.nan if r.get("reward") is None else float(r["reward"]) for r in records])
    tokens = np.cumsum([step_tokens(r, prompts_per_step, greedy) for r in records])
    step_seconds = np.array([float(r.get("time/step") or 0.0) for r in records])
    seconds = np.cumsum(step_seconds)
    if len(rewards) == 0 or np.all(np.isnan(rewards)):
        raise ValueError("no reward in the run's metrics")
    reach = None
    for i in range(len(rewards)):
        recent = rewards[max(0, i - window + 1) : i + 1]
        if np.any(~np.isnan(recent)) and np.nanmean(recent) >= threshold:
            reach = {
                "step": int(records[i]["step"]) + 1,
                "tokens": float(tokens[i]),
                "seconds": float(seconds[i]),
            }
            break
    held_out = [r["eval/accuracy"] for r in records if r.get("eval/accuracy") is not None]
    peaks = [float(r["peak_memory_mb"]) for r in records if r.get("peak_memory_mb") is not None]
    return {
        "step_seconds": float(np.median(step_seconds)),
        "peak_mb": max(peaks) if peaks else math.nan,
        "final": float(np.nanmean(rewards[-max(1, len(rewards) // 10) :])),
        "auc": float(np.nanmean(rewards)),
        "reach": reach,
        "eval": float(held_out[-1]) if held_out else math.nan,
        "tokens": tokens.tolist(),
        "seconds": seconds.tolist(),
        "rewards": rewards.tolist(),
    }


def area_until(rewards: list[float], cumulative: list[float], budget: float) -> float:
    """Mean reward over the first ``budget`` units of a cumulative axis (tokens, seconds):
    each step's reward held over the units it used, the area divided by the budget. Steps
    without a reward count at the mean of the others."""
    r = np.asarray(rewards, dtype=float)
    r = np.where(np.isnan(r), np.nanmean(r), r)
    end = np.minimum(np.asarray(cumulative, dtype=float), budget)
    start = np.concatenate([[0.0], end[:-1]])
    return float(np.sum(r * np.clip(end - start, 0, None)) / budget) if budget > 0 else math.nan


def summary(values: list[float], level: float = 0.95) -> dict:
    """Mean and bootstrap interval of per-seed values (NaN values left out)."""
    v = [x for x in values if not math.isnan(x)]
    if not v:
        return {"mean": math.nan, "lo": math.nan, "hi": math.nan, "n": 0}
    lo, hi = bootstrap_ci(v, level)
    return {"mean": float(np.mean(v)), "lo": lo, "hi": hi, "n": len(v)}


def pairwise(groups: dict[str, list[float]], test: str, alpha: float = 0.05) -> list[dict]:
    """Every pair of groups: difference of means with its bootstrap interval, the exact
    permutation and Welch p-values, Holm's adjustment of ``test``'s p (``permutation`` or
    ``welch``) over the pairs, and a verdict: which is higher when the adjusted p is below
    ``alpha``, else not distinguishable (saying when only the unadjusted p is below it)."""
    rows: list[dict] = []
    for a, b in itertools.combinations(groups, 2):
        x, y = groups[a], groups[b]
        lo, hi = bootstrap_diff_ci(x, y)
        rows.append(
            {
                "a": a,
                "b": b,
                "diff": float(np.mean(x) - np.mean(y)),
                "lo": lo,
                "hi": hi,
                "p_permutation": permutation_p(x, y),
                "p_welch": welch(x, y)[2],
            }
        )
    for row, adj in zip(rows, holm([r[f"p_{test}"] for r in rows])):
        p = row[f"p_{test}"]
        higher = row["a"] if row["diff"] > 0 else row["b"]
        row["p_holm"] = adj
        row["verdict"] = (
            f"{higher} higher"
            if adj < alpha
            else f"not distinguishable ({higher} higher before adjustment)"
            if p < alpha
            else "not distinguishable"
        )
    return rows
