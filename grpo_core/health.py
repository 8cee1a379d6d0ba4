"""Watching a run for the well-known signatures of RL training going wrong.

Each check looks at the last ``window`` metric records and, when it fires, says the likely
cause and what to change. A warning repeats at most once per window.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

DEFAULTS = {
    "zero_std_frac": 0.5,  # share of groups with identical rewards (not all at the top)
    "kl_low": 1e-3,  # KL this small for a whole window
    "kl_high": 10.0,  # KL above this
    "kl_growth": 4.0,  # KL multiplied by this over a window
    "entropy_low": 0.05,  # mean token entropy (nats)
    "grad_spike": 10.0,  # grad norm over this many times the window's median
    "reward_flat": 0.01,  # reward range over a window below this
    "length_growth": 1.5,  # mean completion length multiplied by this over a window
    "truncated": 0.2,  # with this share of truncated completions
}

ADVICE = {
    "nan": "non-finite values: {what}. Lower train.lr, check the reward for NaN/inf, "
           "keep train.max_grad_norm set",
    "zero_std": "{value:.0%} of groups have identical, unsolved rewards (no signal): raise "
                "sampling.temperature or sampling.group_size, or use prompts of mixed difficulty "
                "(or train.resample_zero_std_max)",
    "kl_low": "KL stayed below {value:g} for {window} steps: the KL coefficient is too large "
              "for the policy to move; lower kl.options.coef or use kl: adaptive",
    "kl_high": "KL is {value:.3g}: the policy is running away from the reference; raise the KL "
               "coefficient or lower train.lr",
    "kl_growth": "KL grew {value:.1f}x in {window} steps: raise the KL coefficient or lower "
                 "train.lr",
    "entropy": "entropy fell to {value:.3g}: the policy is collapsing to deterministic outputs; "
               "raise sampling.temperature or train.entropy_coef, lower train.lr, or raise "
               "train.clip_high (DAPO clip-higher)",
    "grad_spike": "grad norm {value:.3g} is over {factor:g}x the recent median: lower train.lr "
                  "or train.max_grad_norm",
    "reward_flat": "reward has not moved (range {value:.3g}) for {window} steps: check that "
                   "the reward can be earned, raise train.lr, or check zero_std_frac",
    "length": "completion length grew {value:.1f}x in {window} steps with {trunc:.0%} truncated: "
              "possible reward hacking by length; add a length reward (DAPO overlong penalty) "
              "or use train.aggregation: seq_mean_token_sum_norm",
}


@dataclass
class HealthMonitor:
    window: int = 10
    thresholds: dict = field(default_factory=dict)

    def __post_init__(self):
        self.t = {**DEFAULTS, **self.thresholds}
        self.records: list[dict] = []
        self.last_fired: dict[str, int] = {}
        self.counts: dict[str, int] = {}
        self.messages: dict[str, str] = {}

    def observe(self, record: dict) -> list[str]:
        """Add one step's metrics; returns the warnings that fire now."""
        self.records.append(record)
        self.records = self.records[-(2 * self.window):]
        out = []
        for key, message in self._checks(record):
            step = record.get("step", len(self.records))
            if step - self.last_fired.get(key, -10**9) >= self.window:
                self.last_fired[key] = step
                out.append(message)
            self.counts[key] = self.counts.get(key, 0) + 1
            self.messages[key] = message
        return out

    def summary(self) -> list[str]:
        """One line per signature seen during the run, with how many steps it fired."""
        return [f"{k} ({n} steps): {self.messages[k]}" for k, n in sorted(self.counts.items())]

    def _checks(self, r: dict):
        t, w = self.t, self.window
        bad = [k for k in ("reward", "kl", "entropy", "grad_norm", "loss")
               if isinstance(r.get(k), float) and not math.isfinite(r[k])]
        if r.get("skipped_updates"):
            bad.append("skipped updates")
        if bad:
            yield "nan", ADVICE["nan"].format(what=", ".join(bad))
        recent = self.records[-w:]
        full = len(recent) >= w

        def series(key):
            return [x[key] for x in recent if isinstance(x.get(key), (int, float))
                    and math.isfinite(x[key])]

        solved = series("solved_frac")
        converged = bool(solved) and solved[-1] > 0.5  # most groups all at the top reward
        zs = [z - s for z, s in zip(series("zero_std_frac"), solved)] if solved \
            else series("zero_std_frac")
        rw = series("reward")
        half = len(rw) // 2
        rising = half and statistics.fmean(rw[half:]) - statistics.fmean(rw[:half]) \
            > t["reward_flat"]
        if full and zs and statistics.fmean(zs) > t["zero_std_frac"] and not rising:
            yield "zero_std", ADVICE["zero_std"].format(value=statistics.fmean(zs))
        kl = series("kl")
        coef = r.get("kl_coef", 0) or 0
        if full and coef > 0 and kl and max(kl) < t["kl_low"]:
            yield "kl_low", ADVICE["kl_low"].format(value=t["kl_low"], window=w)
        if kl and kl[-1] > t["kl_high"]:
            yield "kl_high", ADVICE["kl_high"].format(value=kl[-1])
        elif full and kl and kl[0] > 1e-3 and kl[-1] > t["kl_growth"] * kl[0]:
            yield "kl_growth", ADVICE["kl_growth"].format(value=kl[-1] / kl[0], window=w)
        ent = series("entropy")
        if ent and ent[-1] < t["entropy_low"] and not converged:
            yield "entropy", ADVICE["entropy"].format(value=ent[-1])
        gn = series("grad_norm")
        if len(gn) >= 3 and not converged:  # once solved, the median norm falls towards 0
            med = statistics.median(gn[:-1])
            if med > 0 and gn[-1] > t["grad_spike"] * med:
                yield "grad_spike", ADVICE["grad_spike"].format(value=gn[-1],
                                                                factor=t["grad_spike"])
        if full and rw and max(rw) - min(rw) < t["reward_flat"] and not converged:
            yield "reward_flat", ADVICE["reward_flat"].format(value=max(rw) - min(rw), window=w)
        ln, tr = series("completion_len"), series("truncated_frac")
        if full and ln and ln[0] > 0 and ln[-1] > t["length_growth"] * ln[0] and tr \
                and tr[-1] > t["truncated"]:
            yield "length", ADVICE["length"].format(value=ln[-1] / ln[0], window=w, trunc=tr[-1])
