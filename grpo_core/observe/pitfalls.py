"""The pitfalls whose advice depends on the run's own settings: reward hacking (a part of the
reward farmed at another's expense, length paid for, one part saturated while another never
scores), a KL penalty that holds the policy still, a learning rate that collapses the policy,
and flat groups from a low sampling temperature.

Each check reads the monitor's window of metric records and yields ``(key, message, figure)``:
the message says what was seen (its figures), the likely cause and what to change, naming the
current value of the setting to change; ``figure`` is the number whose material change lets
the warning repeat (grpo_core.observe.health).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterator
from typing import NamedTuple, Protocol, cast

from grpo_core.config.view import Config
from grpo_core.registry import registry


class Release(NamedTuple):
    """When a latched finding's evidence has reversed: the recent mean of ``series`` back at
    or above ``level`` (``above``), or at or below it."""

    series: str
    level: float
    above: bool = True


#: (key, message, figure) or (key, message, figure, release): a finding that latches says what
#: reverses it (grpo_core.observe.health)
Finding = tuple


class HealthMonitor(Protocol):
    """What the checks read of grpo_core.observe.health.HealthMonitor (not imported: it
    imports us)."""

    window: int
    t: dict
    settings: dict
    records: list[dict]

    def series(self, key: str, n: int | None = None) -> list[float]: ...


def span(m: HealthMonitor) -> int:
    """The steps the hacking signatures judge on: the window, at most ``hack_steps``, so that
    a longer window does not hide a part that fell before it filled (the verdict is the same at
    any window from ``hack_steps`` up)."""
    return min(m.window, int(m.t["hack_steps"]))


def run_settings(config: Config) -> dict:
    """What the advice needs from a validated config (sampling settings already resolved):
    lr and gradient clipping, sampling temperature and token budget, the KL coefficient's
    option name, and a weighted reward's components (weight, ``requires``, the best score
    its class declares)."""
    coef_key = {"fixed": "coef", "adaptive": "init_coef", "schedule": "start"}.get(config.kl.name)
    components = {}
    if config.reward.name == "weighted":
        for c in config.reward.options["components"]:
            components[c.get("as") or c["name"]] = {
                "weight": c.get("weight", 1.0),
                "requires": c.get("requires", []),
                "max": _declared_best(c["name"]),
            }
    return {
        "lr": config.optimizer.lr,
        "max_grad_norm": config.optimizer.max_grad_norm,
        "temperature": config.sampling.temperature,
        "max_new_tokens": config.sampling.max_new_tokens,
        "kl_option": f"kl.options.{coef_key}" if coef_key else "the KL coefficient",
        "components": components,
    }


def _declared_best(name: str) -> float | None:
    """A reward plugin's best score as its class declares it (``Reward.max_value``), read
    from the registry: the reward itself may live in a worker process."""
    factory = registry().get("reward", name).factory
    return getattr(factory, "max_value", None) if isinstance(factory, type) else None


def halves(values: list[float]) -> tuple[float, float]:
    """Mean of the first and of the second half of a window (the second the larger when odd)."""
    half = len(values) // 2
    return statistics.fmean(values[:half]), statistics.fmean(values[half:])


def suggest(value: float, factor: float) -> str:
    """``value`` times ``factor`` to one significant figure: a concrete next setting."""
    return f"{float(f'{value * factor:.1g}'):g}"


def reward_hacking(m: HealthMonitor, r: dict) -> Iterator[Finding]:
    """The total reward rises while one of its parts falls; one part at its best while
    another stays at 0; the length rising with the reward; each judged on :func:`span`."""
    if len(m.records) < span(m):
        return
    yield from _part_falls(m, r)
    yield from _saturated(m, r)
    yield from _length_paid(m)


def _dims(m: HealthMonitor, r: dict) -> dict[str, list[float]]:
    n = span(m)
    dims = {k[7:]: m.series(k, n) for k in r if k.startswith("reward/")}
    return {k: v for k, v in dims.items() if len(v) >= n}


def _part_falls(m: HealthMonitor, r: dict) -> Iterator[Finding]:
    t, n = m.t, span(m)
    rw = m.series("reward", n)
    if len(rw) < n:
        return
    r0, r1 = halves(rw)
    for dim, v in _dims(m, r).items():
        d0, d1 = halves(v)
        if r1 - r0 > t["hack_rise"] and d0 - d1 > t["hack_fall"] and d1 < 0.5 * d0:
            yield (
                "reward_hacking",
                (
                    f"the reward rose {r0:.3g} -> {r1:.3g} in {n} steps while reward/{dim} "
                    f"fell {d0:.3g} -> {d1:.3g}: the policy earns the other parts of the reward at "
                    f"{dim}'s expense (reward hacking); {_protect(m.settings, dim)}"
                ),
                d0 - d1,
                Release(f"reward/{dim}", d0),
            )
            return


def _protect(settings: dict, dim: str) -> str:
    """How to stop the other parts paying without ``dim``, given the reward as configured."""
    parts = settings.get("components", {})
    others = [k for k, c in parts.items() if k != dim and dim not in c["requires"]]
    weight = parts.get(dim, {}).get("weight")
    advice = (
        f"make {', '.join(others)} require {dim} (the component's `requires`)"
        if others
        else f"gate the parts that pay without {dim} on it"
    )
    return advice + (
        f", or raise {dim}'s weight (now {weight:g})"
        if weight is not None
        else f", or give {dim} more weight"
    )


def _saturated(m: HealthMonitor, r: dict) -> Iterator[Finding]:
    parts, dims = m.settings.get("components", {}), _dims(m, r)
    for full, v in dims.items():
        best = parts.get(full, {}).get("max")
        if not best or min(v) < m.t["saturated"] * best:
            continue
        for zero, z in dims.items():
            if zero != full and max(z) == 0 == min(z):
                gated = parts.get(zero, {}).get("requires")
                yield (
                    "saturated",
                    (
                        f"reward/{full} is at its best ({v[-1]:.3g} of {best:g}) for {len(v)} "
                        f"steps while reward/{zero}"
                        f"{' (gated on ' + ', '.join(gated) + ')' if gated else ''}"
                        f" stayed at 0: the policy has learned {full} alone (reward hacking), and "
                        f"{full} no longer tells completions apart; lower {full}'s weight (now "
                        f"{parts[full]['weight']:g}) or make it require {zero}, and check that "
                        f"{zero} can be earned at all; a larger sampling.max_new_tokens will not "
                        f"help"
                    ),
                    v[-1],
                    Release(f"reward/{zero}", math.ulp(0.0)),
                )
                return


def _length_paid(m: HealthMonitor) -> Iterator[Finding]:
    n = span(m)
    ln, rw = m.series("completion_len", n), m.series("reward", n)
    if len(ln) < n or len(rw) < n:
        return
    (l0, l1), (r0, r1) = halves(ln), halves(rw)
    if l0 > 0 and l1 > m.t["length_rise"] * l0 and r1 - r0 > m.t["hack_rise"]:
        yield (
            "length_hacking",
            (
                f"completion length rose {l0:.3g} -> {l1:.3g} tokens in {n} steps with the "
                f"reward ({r0:.3g} -> {r1:.3g}): the reward may be paying for length (reward "
                f"hacking); read samples.txt, and add a length penalty (reward `length`) or use "
                f"objective.aggregation: seq_mean_token_sum_norm"
            ),
            l1 / l0,
            Release("completion_len", m.t["length_rise"] * l0, above=False),
        )


def kl_dominates(m: HealthMonitor, converged: bool) -> Iterator[Finding]:
    """The KL term pulling the log-probs harder than the policy term while the reward stays
    flat: the penalty holds the policy at the reference. Judged by the terms' pulls (the
    L1 norms of their gradients in the log-probs, grpo_core.loss.losses.pulls), not their
    values: a policy term's value is near 0 over zero-mean advantages however hard it pulls.
    The advice: the coefficient that brings the KL's pull to a tenth of the policy's (healthy
    runs measured 0.01-0.06 of it; one held by a coefficient of 5, 1.4-7.5)."""
    kl, pol, rw = m.series("pull/kl"), m.series("pull/policy"), m.series("reward")
    if converged or min(len(kl), len(pol), len(rw)) < m.window:
        return
    term, policy = statistics.fmean(kl), statistics.fmean(pol)
    if policy == 0:  # no policy gradient at all: flat groups, not the KL, are the cause
        return
    (r0, r1), coef = halves(rw), m.records[-1].get("kl_coef") or 0.0
    ratio = term / policy
    name = m.settings.get("kl_option", "the KL coefficient")
    if coef > 0 and ratio > m.t["kl_dominance"] and r1 - r0 < m.t["reward_rise"]:
        yield (
            "kl_dominates",
            (
                f"the KL term pulls the log-probs {ratio:.3g}x as hard as the policy term "
                f"(gradient norms {term:.3g} vs {policy:.3g}) and the reward stayed flat "
                f"({r0:.3g} -> {r1:.3g}) for {m.window} steps: the KL penalty holds the policy "
                f"at the reference; lower {name} from {coef:g} (e.g. to "
                f"{suggest(coef, max(0.1 / ratio, 0.01))})"
            ),
            ratio,
        )


def kl_runaway_advice(m: HealthMonitor, r: dict) -> str:
    """What to change when KL runs away: a larger coefficient, unless it is large already
    (then the learning rate is what moves the policy too far)."""
    coef, lr = r.get("kl_coef") or 0.0, m.settings.get("lr")
    now = f" from {lr:g} (e.g. to {suggest(lr, 0.3)})" if lr else ""
    if coef >= m.t["kl_coef_large"]:
        return (
            f"the KL coefficient is already {coef:g}, so lower optimizer.lr{now} rather "
            f"than raising it"
        )
    name = m.settings.get("kl_option", "the KL coefficient")
    return (
        f"raise {name} from {coef:g} (e.g. to {suggest(max(coef, 0.01), 3)}) "
        f"or lower optimizer.lr{now}"
    )


def lr_collapse(m: HealthMonitor, converged: bool) -> Iterator[Finding]:
    """An update that happened (grad norm > 0, not skipped) and was large, after which the
    reward fell below ``collapse`` of what it was, or the entropy stayed collapsed, for
    ``collapse_steps``: the learning rate is too high. Large means either a step of
    ``update_large`` or more (the learning rate times the grad norm as clipped: Adam moves
    every weight by about the learning rate whatever the gradient's size) or an entropy change
    of ``entropy_jump`` times the largest change between the steps before it (a slide is not
    a jump) and larger than any the run showed across steps with no update (at a low
    temperature the entropy estimate alone jumps that much)."""
    n, recent = m.t["collapse_steps"], m.records[-m.window :]
    pairs = [(x.get("reward"), x.get("entropy")) for x in recent]
    if converged or not all(_finite(a) and _finite(b) for a, b in pairs):
        return
    # every value is a finite number here (checked just above)
    rw, ent = cast(list[float], [a for a, _ in pairs]), cast(list[float], [b for _, b in pairs])
    noise = _entropy_noise(m.records)
    for k in range(1, len(recent) - n + 1):
        step, lr = _update(m, recent[k - 1])
        if step is None:
            continue
        jump, trend = _ratio(ent[k - 1], ent[k]), _largest_change(ent[:k])
        moved = jump >= m.t["entropy_jump"] * trend and jump > noise
        if not (moved or step >= m.t["update_large"]):
            continue
        before, cut = statistics.fmean(rw[:k]), m.t["collapse"]
        if rw[k - 1] < cut * before:  # fallen already: not this update's doing
            continue
        if before > 0 and max(rw[k:]) < cut * before:
            what = f"the reward fell {before:.3g} -> {statistics.fmean(rw[k:]):.3g}"
            release = Release("reward", before)
        elif moved and ent[k] < ent[k - 1] and max(ent[k:]) < ent[k - 1] / m.t["entropy_jump"]:
            what = f"the entropy collapsed {ent[k - 1]:.3g} -> {ent[k]:.3g}"
            release = Release("entropy", ent[k - 1] / m.t["entropy_jump"])
        else:
            continue
        norm = recent[k - 1]["grad_norm"]
        yield (
            "lr_high",
            (
                f"{what} right after one update (step {recent[k - 1].get('step', k - 1)}, "
                f"grad norm {norm:.3g}, a step of {step:.3g}) that changed the entropy "
                f"{ent[k - 1]:.3g} -> {ent[k]:.3g}: the learning rate is too high and the "
                f"update overshot; lower optimizer.lr"
                + (f" from {lr:g} (e.g. to {suggest(lr, 0.1)})" if lr else "")
            ),
            jump,
            release,
        )
        return


def _update(m: HealthMonitor, r: dict) -> tuple[float | None, float | None]:
    """The length of the update a record's step made (its learning rate times its grad norm,
    clipped at ``optimizer.max_grad_norm``) and that learning rate; None when no update was
    made (grad norm 0: every group flat; or the update skipped)."""
    norm, lr = r.get("grad_norm"), r.get("lr", m.settings.get("lr"))
    if not isinstance(norm, (int, float)) or not _finite(norm) or norm <= 0:
        return None, lr
    if r.get("skipped_updates"):
        return None, lr
    clip = m.settings.get("max_grad_norm")
    return (lr or 0.0) * (min(norm, clip) if clip else norm), lr


def _largest_change(values: list[float]) -> float:
    """The largest step-to-step ratio in ``values`` (1 for fewer than two)."""
    return max((_ratio(a, b) for a, b in zip(values, values[1:])), default=1.0)


def _entropy_noise(records: list[dict]) -> float:
    """The largest step-to-step change of the entropy (as a ratio) across steps that made no
    update, in the records the monitor keeps: what sampling alone moves it by in this run (1
    when every step updated)."""
    return max(
        (
            _ratio(a["entropy"], b["entropy"])
            for a, b in zip(records, records[1:])
            if _finite(a.get("entropy"))
            and _finite(b.get("entropy"))
            and not (_finite(a.get("grad_norm")) and a["grad_norm"] > 0)
        ),
        default=1.0,
    )


def _finite(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _ratio(a: float, b: float) -> float:
    """How many times larger the larger of two non-negative values is (inf from 0)."""
    lo, hi = min(a, b), max(a, b)
    return hi / lo if lo > 0 else (math.inf if hi > 0 else 1.0)


def low_temperature(m: HealthMonitor) -> str | None:
    """The cause of flat groups when the sampling temperature is low, or None."""
    temp = m.settings.get("temperature")
    if temp is None or temp >= m.t["temperature_low"]:
        return None
    return (
        f"sampling.temperature is {temp:g}: a group's completions are near copies of one "
        f"another, so their rewards are equal; raise sampling.temperature (e.g. to 1.0)"
    )
