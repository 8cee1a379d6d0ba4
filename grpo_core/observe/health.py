"""Watching a run for the well-known signatures of GRPO training going wrong.

Each check looks at the last ``window`` metric records and, when it fires, says once what it
saw (its figures), the likely cause and what to change, taking the run's settings into account
(grpo_core.observe.pitfalls). A warning repeats only when its figure has changed materially since it
was last shown, at most once a window; the end-of-run summary lists each signature with the
step it first fired.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

from grpo_core.observe import pitfalls

DEFAULTS = {
    "zero_std_frac": 0.5,  # share of groups with identical, unsolved rewards
    "tiny_std_frac": 0.1,  # share of groups whose rewards differ by noise only
    "kl_low": 1e-3,  # KL this small for a whole window
    "kl_high": 1.0,  # per-token KL above this: far from the reference
    "kl_growth": 2.5,  # mean KL of a window's second half over its first half ...
    "kl_floor": 0.1,  # ... once KL is this large (KL rising from 0 early on is expected) ...
    "kl_baseline": 0.01,  # ... from a first half at least this large, after the first window
    "kl_coef_large": 1.0,  # a KL coefficient this large: advise the lr, not a larger one
    "kl_dominance": 1.0,  # the KL term's pull on the log-probs over the policy term's ...
    "reward_rise": 0.02,  # ... rising less than this (second half of a window over first)
    "coef_growth": 4.0,  # KL coefficient multiplied by this over a window
    "oscillation": 0.85,  # share of steps whose change reverses the previous one
    "entropy_low": 0.05,  # mean token entropy (nats)
    "grad_spike": 10.0,  # grad norm over this many times the window's median
    "reward_flat": 0.01,  # reward range over a window below this
    "dimension_rise": 0.2,  # a reward dimension rising this much over a window ...
    "length_growth": 1.5,  # mean completion length multiplied by this over a window
    "truncated": 0.2,  # ... with this share of truncated completions
    "truncated_high": 0.5,  # most completions cut at the token budget
    "memory_frac": 0.9,  # peak memory over this share of what the device has
    "hack_rise": 0.1,  # the total reward rising this much (second half of a window over first)
    "hack_fall": 0.05,  # ... while a part of it falls this much, to under half
    "hack_steps": 8,  # hacking is judged on the window, at most this many steps
    "saturated": 0.95,  # a part at this share of its best all window, another at 0
    "length_rise": 1.3,  # length multiplied by this with the reward rising
    "entropy_jump": 2.0,  # one update changing the entropy this many times (up or down) ...
    "update_large": 0.01,  # ... or an update this long (lr x clipped grad norm) ...
    "collapse": 0.5,  # ... then the reward below this share of what it was ...
    "collapse_steps": 2,  # ... for this many steps at least
    "temperature_low": 0.5,  # flat groups at a sampling temperature below this: its fault
    "repeat_change": 0.5,  # a warning repeats when its figure moved by this share
}

ADVICE = {
    "nan": "non-finite values: {what}. Lower optimizer.lr, check the reward for NaN/inf, "
    "keep optimizer.max_grad_norm set",
    "no_signal": "every completion got the same reward ({value:g}) for {window} steps, so "
    "every advantage is 0 and nothing is learned: check that the reward can be "
    "earned (data.columns and the reward's answer column, the expected format, "
    "a task the model can sometimes solve) before tuning anything else",
    "no_signal_temperature": "every completion got the same reward ({value:g}) for {window} "
    "steps, so every advantage is 0 and nothing is learned: {cause}",
    "zero_std": "{value:.0%} of groups have identical, unsolved rewards (no signal): raise "
    "sampling.temperature or sampling.group_size, or use prompts of mixed difficulty "
    "(or groups.resample_zero_std_max)",
    "zero_std_temperature": "{value:.0%} of groups have identical, unsolved rewards (no "
    "signal): {cause}",
    "tiny_std": "{value:.0%} of groups have rewards that differ only by noise (std > 0 but "
    "under {eps:g}): dividing by that std turns noise into full-size advantages; "
    "round the reward, raise the baseline's eps, or use a baseline without the std "
    "division (dr_grpo, rloo)",
    "kl_low": "KL stayed below {value:g} for {window} steps: the KL coefficient is too large "
    "for the policy to move; lower kl.options.coef or use kl: adaptive",
    "kl_high": "KL is {value:.3g}: the policy is running away from the reference; {advice}",
    "kl_growth": "KL grew {value:.1f}x ({early:.3g} -> {late:.3g}) in {window} steps: {advice}",
    "kl_oscillation": "KL swings up and down ({lo:.3g} to {hi:.3g}) from step to step: the "
    "updates overshoot; lower optimizer.lr or objective clip bounds, or use "
    "a steadier KL controller",
    "kl_coef": "the KL coefficient grew {value:.1f}x in {window} steps to {coef:.3g} while KL "
    "stays at {kl:.3g}: the controller cannot reach its target and the KL term is "
    "taking over the loss; raise kl.options.target or lower optimizer.lr",
    "loss_oscillation": "the loss flips sign with growing swings ({value:.3g} at most): the "
    "updates overshoot; lower optimizer.lr, train.inner_iterations or train.mini_batches",
    "entropy_temperature": "entropy is {value:.3g} at the sampling temperature: {cause}",
    "entropy": "entropy fell to {value:.3g}: the policy is collapsing to deterministic outputs; "
    "raise sampling.temperature or objective.entropy_coef, lower optimizer.lr, or "
    "raise objective.options.clip_high (DAPO clip-higher)",
    "entropy_lr": "entropy fell to {value:.3g} after an update that overshot (lr_high): lower "
    "optimizer.lr; a higher sampling.temperature or entropy bonus will not undo it",
    "grad_spike": "grad norm {value:.3g} is over {factor:g}x the recent median: lower "
    "optimizer.lr or optimizer.max_grad_norm",
    "reward_flat": "reward has not moved (range {value:.3g}) for {window} steps: check that "
    "the reward can be earned, raise optimizer.lr, or check zero_std_frac",
    "format_hacking": "reward/{up} rose by {rise:.2f} in {window} steps while reward/{flat} "
    "stayed at {value:.3g}: the policy is learning {up} alone (format hacking "
    "when {flat} is correctness); gate {up} on {flat} (a weighted reward's "
    "`requires`) or give {flat} more weight",
    "truncated": "{value:.0%} of completions hit sampling.max_new_tokens: their answers are "
    "cut off and score as wrong; raise max_new_tokens or add a length reward",
    "truncated_hacking": "{value:.0%} of completions hit sampling.max_new_tokens while the "
    "reward is being gamed ({hack}): fix the reward first; a larger "
    "max_new_tokens only gives the policy more room to game it",
    "length": "completion length grew {value:.1f}x in {window} steps with {trunc:.0%} truncated: "
    "possible reward hacking by length; add a length reward (DAPO overlong penalty) "
    "or use objective.aggregation: seq_mean_token_sum_norm",
    "memory": "peak memory {value:.0f} MiB is {frac:.0%} of the {limit:.0f} MiB available: a "
    "longer batch will run out; lower sampling.generation_batch_size or "
    "train.micro_batch_groups, or turn on model.gradient_checkpointing",
}


#: steps an oscillation is judged on: random noise alternates 2 steps in 3, so a short run
#: of alternations means nothing (all 11 of 12 steps by chance: p < 0.002)
OSCILLATION_STEPS = 12


#: signatures of reward hacking: truncation beside one of them is not a budget problem
HACKING = ("reward_hacking", "saturated", "length_hacking", "format_hacking")
#: what follows a collapse of the policy, whose advice (the data, the token budget) would
#: mislead once lr_high has named the cause
AFTER_COLLAPSE = ("no_signal", "zero_std", "reward_flat", "truncated", "length")
#: findings that stay the finding once made (they name the cause of what follows) until their
#: evidence reverses, long after the steps that showed them have left the window
LATCHING = (*HACKING, "lr_high")
#: what follows a gamed reward (flat, all-alike groups; lengths at the budget), whose advice
#: (a higher lr or temperature, a larger budget) would mislead once a hacking finding stands
AFTER_HACKING = ("no_signal", "zero_std", "reward_flat", "length")


@dataclass
class HealthMonitor:
    """Warnings from a run's metric records, one :meth:`observe` per step. ``settings``
    (pitfalls.run_settings) are the run's own values, named in the advice."""

    window: int = 10
    thresholds: dict = field(default_factory=dict)
    settings: dict = field(default_factory=dict)

    def __post_init__(self):
        self.t = {**DEFAULTS, **self.thresholds}
        self.records: list[dict] = []
        self.shown: dict[str, tuple[int, float]] = {}  # step and figure last shown
        self.first: dict[str, int] = {}
        self.counts: dict[str, int] = {}
        self.messages: dict[str, str] = {}
        self.latched: dict[str, tuple[str, float, pitfalls.Release]] = {}
        self.released: dict[str, int] = {}

    def observe(self, record: dict) -> list[str]:
        """Add one step's metrics; returns the warnings shown now: those firing for the first
        time, and those whose figure moved materially since they were last shown, a window or
        more ago."""
        self.records.append(record)
        self.records = self.records[-2 * max(self.window, OSCILLATION_STEPS) :]
        out = []
        step = record.get("step", len(self.records))
        for key, message, figure in self._checks(record):
            if key not in self.shown or (
                step - self.shown[key][0] >= self.window
                and _moved(self.shown[key][1], figure, self.t["repeat_change"])
            ):
                self.shown[key] = (step, figure)
                out.append(message)
            self.first.setdefault(key, step)
            self.counts[key] = self.counts.get(key, 0) + 1
            self.messages[key] = message
        return out

    def summary(self) -> list[str]:
        """One line per signature seen, in the order they started: first step, how many
        steps it fired (a latching finding: whether it was still in force at the end, or the
        step its evidence reversed), the latest advice."""
        order = sorted(self.counts, key=lambda k: (self.first[k], k))
        return [
            f"{k} from step {self.first[k]} ({self._span(k)}): {self.messages[k]}" for k in order
        ]

    def _span(self, key: str) -> str:
        steps = f"{self.counts[key]} steps"
        if key in self.latched:
            return f"{steps}, in force at the end"
        if key in self.released:
            return f"{steps}, until step {self.released[key]}"
        return steps

    def series(self, key: str, n: int | None = None) -> list[float]:
        """The last ``n`` (default: a window of) finite values of ``key``."""
        recent = self.records[-(n or self.window) :]
        return [
            x[key]
            for x in recent
            if isinstance(x.get(key), (int, float))
            and not isinstance(x.get(key), bool)
            and math.isfinite(x[key])
        ]

    def _checks(self, r: dict):
        found = self._latch(list(self._all_checks(r)), r.get("step", len(self.records)))
        if "lr_high" in self.latched:
            found = [f for f in found if f[0] not in AFTER_COLLAPSE]
        hacking = [k for k, _, _ in found if k in HACKING]
        for key, message, figure in found:
            if key in AFTER_HACKING and hacking:
                continue
            if key == "truncated" and hacking:
                message = ADVICE["truncated_hacking"].format(value=figure, hack=hacking[0])
            if (
                key == "entropy"
                and "lr_high" in self.latched
                and message.startswith("entropy fell")
            ):
                message = ADVICE["entropy_lr"].format(value=figure)
            yield key, message, figure

    def _latch(self, found: list[tuple], step: int) -> list[tuple[str, str, float]]:
        """Findings as ``(key, message, figure)``: a latching finding keeps its first message
        and figure while in force, and stays in force (yielded every step) after its own
        check stops firing, until the recent mean of the series it names is back at its
        level (pitfalls.Release)."""
        keys = {f[0] for f in found}
        for key, message, figure, *rest in found:
            if key in LATCHING and rest and key not in self.latched:
                self.latched[key] = (message, figure, rest[0])
        for key, (_, _, release) in list(self.latched.items()):
            recent = self.series(release.series, max(2, pitfalls.span(self) // 2))
            level = statistics.fmean(recent) if recent else math.nan
            back = level >= release.level if release.above else level <= release.level
            if key not in keys and back:
                del self.latched[key]
                self.released[key] = step
        out = [
            (k, *self.latched[k][:2]) if k in self.latched else (k, m, f) for k, m, f, *_ in found
        ]
        return out + [(k, m, f) for k, (m, f, _) in self.latched.items() if k not in keys]

    def _all_checks(self, r: dict):
        t, w = self.t, self.window
        yield from self._nonfinite(r)
        full = len(self.records) >= w
        solved = self.series("solved_frac")
        converged = bool(solved) and solved[-1] > 0.5  # most groups all at the top reward
        rw = self.series("reward")
        no_signal = (
            full
            and bool(rw)
            and max(rw) == min(rw)
            and min(self.series("zero_std_frac") or [0]) >= 1.0
            and not any(solved)
        )
        if no_signal:
            cause = pitfalls.low_temperature(self)
            yield (
                "no_signal",
                ADVICE["no_signal_temperature" if cause else "no_signal"].format(
                    value=rw[-1], window=w, cause=cause
                ),
                rw[-1],
            )
        else:
            yield from self._signal(r, full, converged, rw, solved)
        yield from pitfalls.reward_hacking(self, r)
        yield from pitfalls.lr_collapse(self, converged)
        yield from self._kl(r, full, no_signal)
        yield from pitfalls.kl_dominates(self, converged)
        yield from self._dynamics(full, converged)
        yield from self._lengths(r, full)
        if isinstance(r.get("memory_frac"), float) and r["memory_frac"] > t["memory_frac"]:
            yield (
                "memory",
                ADVICE["memory"].format(
                    value=r["peak_memory_mb"],
                    frac=r["memory_frac"],
                    limit=r["peak_memory_mb"] / r["memory_frac"],
                ),
                r["peak_memory_mb"],
            )

    def _nonfinite(self, r: dict):
        bad = [
            k
            for k in ("reward", "kl", "entropy", "grad_norm", "loss")
            if isinstance(r.get(k), float) and not math.isfinite(r[k])
        ]
        if r.get("skipped_updates"):
            bad.append("skipped updates")
        if bad:
            yield "nan", ADVICE["nan"].format(what=", ".join(bad)), float(len(bad))

    def _signal(self, r: dict, full: bool, converged: bool, rw: list, solved: list):
        t, w = self.t, self.window
        zs = (
            [z - s for z, s in zip(self.series("zero_std_frac"), solved)]
            if solved
            else self.series("zero_std_frac")
        )
        half = len(rw) // 2
        rising = (
            half and statistics.fmean(rw[half:]) - statistics.fmean(rw[:half]) > t["reward_flat"]
        )
        if full and zs and statistics.fmean(zs) > t["zero_std_frac"] and not rising:
            cause = pitfalls.low_temperature(self)
            share = statistics.fmean(zs)
            yield (
                "zero_std",
                ADVICE["zero_std_temperature" if cause else "zero_std"].format(
                    value=share, cause=cause
                ),
                share,
            )
        tiny = self.series("tiny_std_frac")
        if full and tiny and statistics.fmean(tiny) > t["tiny_std_frac"]:
            share = statistics.fmean(tiny)
            yield "tiny_std", ADVICE["tiny_std"].format(value=share, eps=1e-4), share
        if full and rw and max(rw) - min(rw) < t["reward_flat"] and not converged:
            yield (
                "reward_flat",
                ADVICE["reward_flat"].format(value=max(rw) - min(rw), window=w),
                statistics.fmean(rw),
            )
        n = pitfalls.span(self)
        dims = {k[7:]: self.series(k, n) for k in r if k.startswith("reward/")}
        dims = {k: v for k, v in dims.items() if len(v) >= n}
        for up, a in dims.items():
            rise = statistics.fmean(a[len(a) // 2 :]) - statistics.fmean(a[: len(a) // 2])
            for flat, b in dims.items():
                if flat != up and rise > t["dimension_rise"] and max(b) - min(b) < t["reward_flat"]:
                    yield (
                        "format_hacking",
                        ADVICE["format_hacking"].format(
                            up=up, flat=flat, rise=rise, window=n, value=b[-1]
                        ),
                        rise,
                        pitfalls.Release(f"reward/{flat}", b[-1] + t["reward_flat"]),
                    )
                    return

    def _kl(self, r: dict, full: bool, no_signal: bool):
        t, w = self.t, self.window
        kl = self.series("kl")
        coef = r.get("kl_coef", 0) or 0
        if full and coef > 0 and kl and max(kl) < t["kl_low"] and not no_signal:
            yield "kl_low", ADVICE["kl_low"].format(value=t["kl_low"], window=w), max(kl)
        early, late = pitfalls.halves(kl) if len(kl) >= 2 else (0.0, 0.0)
        long = self.series("kl", 2 * OSCILLATION_STEPS)
        coefs = self.series("kl_coef")
        if full and coefs and coefs[0] > 0 and coefs[-1] > t["coef_growth"] * coefs[0]:
            yield (
                "kl_coef",
                ADVICE["kl_coef"].format(
                    value=coefs[-1] / coefs[0], window=w, coef=coefs[-1], kl=kl[-1] if kl else 0
                ),
                coefs[-1],
            )
        # growth is judged against a baseline: a first half that is not the run's first steps
        # (KL starts at 0 and rises as the policy moves) and is itself measurable
        baseline = len(self.records) >= 2 * w and early >= t["kl_baseline"]
        advice = pitfalls.kl_runaway_advice(self, r)
        if kl and kl[-1] > t["kl_high"]:
            yield "kl_high", ADVICE["kl_high"].format(value=kl[-1], advice=advice), kl[-1]
        elif baseline and late > t["kl_floor"] and late > t["kl_growth"] * early:
            yield (
                "kl_growth",
                ADVICE["kl_growth"].format(
                    value=late / early, early=early, late=late, window=w, advice=advice
                ),
                late / early,
            )
        elif (
            len(long) >= OSCILLATION_STEPS
            and min(long) > 1e-3
            and _alternates(long, t["oscillation"])
            and max(long) > 3 * min(long)
        ):
            yield (
                "kl_oscillation",
                ADVICE["kl_oscillation"].format(lo=min(long), hi=max(long)),
                max(long) / min(long),
            )

    def _dynamics(self, full: bool, converged: bool):
        t = self.t
        ent = self.series("entropy")
        cause = pitfalls.low_temperature(self)
        if ent and ent[-1] < t["entropy_low"] and cause:  # the figure: the temperature's
            yield (
                "entropy",
                ADVICE["entropy_temperature"].format(value=ent[-1], cause=cause),
                self.settings["temperature"],
            )
        elif ent and ent[-1] < t["entropy_low"] and not converged:
            yield "entropy", ADVICE["entropy"].format(value=ent[-1]), ent[-1]
        gn = self.series("grad_norm")
        if len(gn) >= 3 and not converged:  # once solved, the median norm falls towards 0
            med = statistics.median(gn[:-1])
            if med > 0 and gn[-1] > t["grad_spike"] * med:
                yield (
                    "grad_spike",
                    ADVICE["grad_spike"].format(value=gn[-1], factor=t["grad_spike"]),
                    gn[-1],
                )
        loss = self.series("loss", 2 * OSCILLATION_STEPS)
        if len(loss) >= OSCILLATION_STEPS and _alternates(loss, t["oscillation"], signs=True):
            half = len(loss) // 2
            early, late = max(map(abs, loss[:half])), max(map(abs, loss[half:]))
            if late > 2 * early > 0:
                yield "loss_oscillation", ADVICE["loss_oscillation"].format(value=late), late

    def _lengths(self, r: dict, full: bool):
        t, w = self.t, self.window
        ln, tr = self.series("completion_len"), self.series("truncated_frac")
        if full and tr and statistics.fmean(tr) > t["truncated_high"]:
            share = statistics.fmean(tr)
            yield "truncated", ADVICE["truncated"].format(value=share), share
        elif (
            full
            and ln
            and ln[0] > 0
            and ln[-1] > t["length_growth"] * ln[0]
            and tr
            and tr[-1] > t["truncated"]
        ):
            yield (
                "length",
                ADVICE["length"].format(value=ln[-1] / ln[0], window=w, trunc=tr[-1]),
                ln[-1] / ln[0],
            )


def _moved(shown: float, now: float, share: float) -> bool:
    """Whether a warning's figure changed materially since it was shown: by ``share`` of the
    shown value (or from 0 to anything)."""
    return abs(now - shown) > share * abs(shown) if shown else now != shown


def _alternates(values: list[float], share: float, signs: bool = False) -> bool:
    """Whether most consecutive changes reverse the one before (``signs``: the values
    themselves flip sign), the mark of updates that overshoot."""
    if len(values) < 4:
        return False
    if signs:
        flips = [a * b < 0 for a, b in zip(values, values[1:])]
    else:
        d = [b - a for a, b in zip(values, values[1:])]
        flips = [x * y < 0 for x, y in zip(d, d[1:])]
    return sum(flips) >= share * len(flips)
