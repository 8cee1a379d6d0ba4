"""The statistics of ``grpo compare`` against values worked out by hand, closed forms of
Student's t, and brute-force enumeration written independently here."""

from __future__ import annotations

import itertools
import math
from collections import defaultdict

import numpy as np
import pytest

from grpo_core.cli import stats


def brute_bootstrap_ci(values, level=0.95):
    """Every one of the n^n ordered resamples, equally likely; inverse-CDF quantiles."""
    means = sorted(sum(c) / len(c) for c in itertools.product(values, repeat=len(values)))
    tail = (1 - level) / 2

    def q(p):
        return means[max(0, math.ceil(p * len(means) - 1e-9) - 1)]

    return q(tail), q(1 - tail)


def brute_permutation_p(a, b):
    pooled = list(a) + list(b)
    obs = abs(np.mean(a) - np.mean(b))
    hits = total = 0
    for pick in itertools.combinations(range(len(pooled)), len(a)):
        x = [pooled[i] for i in pick]
        y = [pooled[i] for i in range(len(pooled)) if i not in pick]
        hits += abs(np.mean(x) - np.mean(y)) >= obs - 1e-12
        total += 1
    return hits / total


def test_bootstrap_distribution_of_a_tiny_set_by_hand():
    # [0, 0, 3]: the resample mean is the number of 3s drawn, Binomial(3, 1/3):
    # P = 8/27, 12/27, 6/27, 1/27 for means 0, 1, 2, 3
    means, weights = stats.mean_distribution([0, 0, 3])
    got = defaultdict(float)
    for m, w in zip(means, weights):
        got[round(float(m), 9)] += float(w)
    assert got == pytest.approx({0.0: 8 / 27, 1.0: 12 / 27, 2.0: 6 / 27, 3.0: 1 / 27})
    # 95%: CDF(0) = 0.296 >= 0.025; CDF(2) = 0.963 < 0.975 so the upper end is 3
    assert stats.bootstrap_ci([0, 0, 3]) == (0.0, 3.0)
    # 80%: CDF(2) = 0.963 >= 0.9
    assert stats.bootstrap_ci([0, 0, 3], level=0.8) == (0.0, 2.0)
    # two seeds: each end has probability 1/4 > 2.5%, so the interval is [min, max]
    assert stats.bootstrap_ci([0.7, 0.4]) == (0.4, 0.7)


@pytest.mark.parametrize(
    "values", [[0.1, 0.5, 0.2, 0.9, 0.4], [1.0, 1.0, 2.0, 7.0], [0.3, 0.31, 0.35, 0.2, 0.33, 0.4]]
)
def test_exact_bootstrap_matches_enumerating_every_ordered_resample(values):
    for level in (0.95, 0.9, 0.5):
        assert stats.bootstrap_ci(values, level) == pytest.approx(
            brute_bootstrap_ci(values, level), abs=1e-12
        )


def test_monte_carlo_bootstrap_beyond_the_exact_limit():
    rng = np.random.default_rng(3)
    values = rng.normal(0.5, 0.1, size=14)  # C(27, 14) = 20 million resamples: drawn
    assert math.comb(27, 14) > stats.EXACT_LIMIT
    lo, hi = stats.bootstrap_ci(values)
    assert stats.bootstrap_ci(values) == (lo, hi)  # seeded: the same report twice
    half = 1.96 * values.std(ddof=0) / math.sqrt(len(values))
    assert lo == pytest.approx(values.mean() - half, abs=0.25 * half)
    assert hi == pytest.approx(values.mean() + half, abs=0.25 * half)


def test_bootstrap_difference_by_hand():
    # mean of a resample of [0, 1]: 0, 0.5, 1 with 1/4, 1/2, 1/4; b = [0] never moves
    assert stats.bootstrap_diff_ci([0, 1], [0]) == (0.0, 1.0)
    assert stats.bootstrap_diff_ci([0, 1], [0], level=0.4) == (0.5, 0.5)
    # [0, 1] - [0, 1]: -1 (1/16), -0.5 (4/16), 0 (6/16), 0.5 (4/16), 1 (1/16)
    # 80%: 10% quantile -0.5 (CDF 5/16), 90% quantile 0.5 (CDF 15/16)
    assert stats.bootstrap_diff_ci([0, 1], [0, 1], level=0.8) == (-0.5, 0.5)


def test_permutation_p_by_hand():
    # [1, 2] vs [3, 4]: the six splits give differences -2, -1, 0, 0, 1, 2; |d| >= 2 twice
    assert stats.permutation_p([1, 2], [3, 4]) == pytest.approx(1 / 3)
    # [1, 2, 3] vs [4, 5, 6]: only the observed split and its mirror reach |d| = 3, of 20
    assert stats.permutation_p([1, 2, 3], [4, 5, 6]) == pytest.approx(0.1)
    assert stats.permutation_p([1, 1], [1, 1]) == 1.0
    assert stats.permutation_floor(3, 3) == pytest.approx(0.1)
    assert stats.permutation_floor(5, 5) == pytest.approx(2 / 252)
    assert stats.permutation_floor(2, 3) == pytest.approx(1 / 10)


def test_permutation_p_matches_brute_force():
    rng = np.random.default_rng(0)
    for na, nb in ((5, 5), (3, 6), (4, 4)):
        a, b = rng.normal(0, 1, na).round(1), rng.normal(0.8, 1, nb).round(1)
        assert stats.permutation_p(a, b) == pytest.approx(brute_permutation_p(a, b))


def test_permutation_monte_carlo_for_large_groups():
    a, b = list(np.arange(12.0)), list(np.arange(12.0) + 100)  # C(24, 12) > limit
    assert stats.permutation_p(a, b) == pytest.approx(1 / (1 + stats.DRAWS))
    assert stats.permutation_p(a, a) == 1.0


@pytest.mark.parametrize("t", [0.1, 0.7, 1.5, 3.0, 12.0])
def test_student_t_tail_against_closed_forms(t):
    assert stats.t_two_sided(t, 1) == pytest.approx(1 - 2 * math.atan(t) / math.pi, abs=1e-12)
    assert stats.t_two_sided(t, 2) == pytest.approx(1 - t / math.sqrt(t * t + 2), abs=1e-12)
    x = t / math.sqrt(4 + t * t)  # nu = 4: F(t) = 1/2 + (3/4) x (1 - x^2 / 3)
    assert stats.t_two_sided(t, 4) == pytest.approx(1 - 1.5 * x * (1 - x * x / 3), abs=1e-12)
    # many degrees of freedom: the normal tail
    assert stats.t_two_sided(t, 1e7) == pytest.approx(math.erfc(t / math.sqrt(2)), abs=1e-6)
    assert stats.t_two_sided(-t, 3) == stats.t_two_sided(t, 3)


def test_student_t_far_tail_keeps_its_relative_precision():
    # nu = 1: P(|T| >= t) = (2 / pi) atan(1 / t), ~6.4e-9 at t = 1e8 (1 - cdf would be 0)
    for t in (1e4, 1e8):
        assert stats.t_two_sided(t, 1) == pytest.approx(2 / math.pi * math.atan(1 / t), rel=1e-9)
    assert stats.t_two_sided(math.inf, 5) == 0.0


def test_student_t_tail_against_numerical_integration():
    for df in (3.0, 4.6, 9.5):
        grid = np.linspace(0, 2.2, 200_001)
        dens = (
            math.gamma((df + 1) / 2)
            / (math.sqrt(df * math.pi) * math.gamma(df / 2))
            * (1 + grid**2 / df) ** (-(df + 1) / 2)
        )
        inside = np.sum((dens[1:] + dens[:-1]) / 2 * np.diff(grid))
        assert stats.t_two_sided(2.2, df) == pytest.approx(1 - 2 * inside, abs=1e-9)


def test_welch_by_hand():
    # means 2 and 5, variances 1 and 1, n = 3: se^2 = 2/3, t = -3 / sqrt(2/3),
    # df = (2/3)^2 / ((1/3)^2 / 2 * 2) = 4
    t, df, p = stats.welch([1, 2, 3], [4, 5, 6])
    assert t == pytest.approx(-3 / math.sqrt(2 / 3))
    assert df == pytest.approx(4.0)
    x = abs(t) / math.sqrt(4 + t * t)
    assert p == pytest.approx(1 - 1.5 * x * (1 - x * x / 3))
    assert p == pytest.approx(0.021312, abs=1e-6)  # as R's t.test gives
    assert stats.welch([1, 1], [1, 1])[2] == 1.0
    assert stats.welch([1, 1], [2, 2])[2] == 0.0
    assert math.isnan(stats.welch([1], [2, 3])[2])


def test_holm_by_hand():
    # sorted 0.01, 0.03, 0.04 times 3, 2, 1 = 0.03, 0.06, 0.04 -> running max 0.03, 0.06, 0.06
    assert stats.holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    adj = stats.holm([0.2, math.nan, 0.7])
    assert adj[0] == pytest.approx(0.4) and math.isnan(adj[1]) and adj[2] == pytest.approx(0.7)
    assert stats.holm([0.5, 0.9]) == [1.0, 1.0]  # 2 x 0.5 capped at 1; the max carries on


def records(rewards, samples=4, lengths=None, seconds=None, **extra):
    lengths = lengths or [2.0] * len(rewards)
    seconds = seconds or [1.0] * len(rewards)
    return [
        {
            "step": i,
            "reward": r,
            "samples": samples,
            "completion_len": n,
            "time/step": s,
            **{k: v[i] for k, v in extra.items()},
        }
        for i, (r, n, s) in enumerate(zip(rewards, lengths, seconds))
    ]


def test_run_figures_count_greedy_tokens_and_find_the_threshold():
    recs = records([0.0, 1.0, 1.0, 0.5], lengths=[2.0, 3.0, 1.0, 2.0], seconds=[1.0, 2.0, 0.5, 1.0])
    f = stats.run_figures(recs, prompts_per_step=2, greedy=False, threshold=0.5, window=2)
    assert f["tokens"] == [8, 20, 24, 32]  # 4 samples x length, summed
    assert f["seconds"] == [1.0, 3.0, 3.5, 4.5]
    assert f["auc"] == pytest.approx(0.625) and f["final"] == pytest.approx(0.5)
    # trailing 2-step means: 0, 0.5 -> reached after the second step
    assert f["reach"] == {"step": 2, "tokens": 20.0, "seconds": 3.0}
    g = stats.run_figures(recs, prompts_per_step=2, greedy=True, threshold=2.0)
    assert g["tokens"] == [12, 30, 36, 48]  # + 2 greedy completions of the mean length
    assert g["reach"] is None
    h = stats.run_figures(records([0.0, 1.0], greedy_tokens=[5, 7]), 2, True, 0.9)
    assert h["tokens"] == [13, 28]  # the trainer's own count when it records one
    with pytest.raises(ValueError):
        stats.run_figures(records([None, None]), 2, False, 0.5)


def test_area_until_a_token_budget():
    # rewards 0 over tokens (0, 8], 1 over (8, 20]: up to 14 tokens the area is 6
    assert stats.area_until([0.0, 1.0], [8.0, 20.0], 14.0) == pytest.approx(6 / 14)
    assert stats.area_until([0.0, 1.0], [8.0, 20.0], 20.0) == pytest.approx(12 / 20)
    assert stats.area_until([0.5, float("nan"), 1.0], [1, 2, 3], 3) == pytest.approx(0.75)


def test_pairwise_verdicts():
    hi, lo = [0.9, 0.91, 0.92, 0.93, 0.94], [0.5, 0.51, 0.52, 0.53, 0.54]
    rows = stats.pairwise({"a": hi, "b": lo}, test="permutation")
    assert rows[0]["p_permutation"] == pytest.approx(2 / 252)
    assert rows[0]["diff"] == pytest.approx(0.4) and rows[0]["verdict"] == "a higher"
    # both groups are the same spread shifted: the interval is symmetric around 0.4, and
    # within +-0.04 (the largest possible gap of two resample means of the spread)
    assert rows[0]["lo"] + rows[0]["hi"] == pytest.approx(0.8)
    assert 0.36 <= rows[0]["lo"] < 0.4 < rows[0]["hi"] <= 0.44
    # three groups: Holm multiplies the smallest p by 3 -> 0.024, still below 0.05;
    # a vs c are the same numbers shifted by 0.001: not distinguishable
    rows = stats.pairwise({"a": hi, "b": lo, "c": [x + 0.001 for x in hi]}, test="permutation")
    by = {(r["a"], r["b"]): r for r in rows}
    assert by[("a", "b")]["p_holm"] == pytest.approx(3 * 2 / 252)
    assert by[("a", "c")]["verdict"].startswith("not distinguishable")
    assert by[("b", "c")]["verdict"] == "c higher"
    # four groups with the same floor: 6 pairs x 2/252 = 0.048 -> still just below
    rows = stats.pairwise(
        {"a": hi, "b": lo, "c": [x - 1 for x in lo], "d": [x + 1 for x in hi]}, test="permutation"
    )
    assert all(r["verdict"].endswith("higher") for r in rows)
    rows = stats.pairwise({"a": [0.9, 0.5, 0.7], "b": [0.6, 0.5, 0.4]}, test="welch")
    assert rows[0]["p_holm"] == pytest.approx(rows[0]["p_welch"])
    assert rows[0]["verdict"] == "not distinguishable"
