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
from typing import Protocol, cast

from grpo_core.config.view import Config
from grpo_core.registry import registry

Finding = tuple[str, str, float]


class HealthMonitor(Protocol):
    """What the checks read of grpo_core.observe.health.HealthMonitor (not imported: it
    imports us)."""

    window: int
    t: dict
    settings: dict
    records: list[dict]

    def series(self, key: str, n: int | None = None) -> list[float]: ...


def run_settings(config: Config) -> dict:
    """What the advice needs from a validated config (sampling settings already resolved):
    lr, sampling temperature and token budget, the KL coefficient's option name, and a
    weighted reward's components (weight, ``requires``, the best score its class declares)."""
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
    another stays at 0; the length rising with the reward."""
    if len(m.records) < m.window:
        return
    yield from _part_falls(m, r)
    yield from _saturated(m, r)
    yield from _length_paid(m)


def _dims(m: HealthMonitor, r: dict) -> dict[str, list[float]]:
    dims = {k[7:]: m.series(k) for k in r if k.startswith("reward/")}
    return {k: v for k, v in dims.items() if len(v) >= m.window}


def _part_falls(m: HealthMonitor, r: dict) -> Iterator[Finding]:
    t, rw = m.t, m.series("reward")
    if len(rw) < m.window:
        return
    r0, r1 = halves(rw)
    for dim, v in _dims(m, r).items():
        d0, d1 = halves(v)
        if r1 - r0 > t["hack_rise"] and d0 - d1 > t["hack_fall"] and d1 < 0.5 * d0:
            yield (
                "reward_hacking",
                (
                    f"the reward rose {r0:.3g} -> {r1:.3g} in {m.window} steps while reward/{dim} "
                    f"fell {d0:.3g} -> {d1:.3g}: the policy earns the other parts of the reward at "
                    f"{dim}'s expense (reward hacking); {_protect(m.settings, dim)}"
                ),
                d0 - d1,
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
                        f"reward/{full} is at its best ({v[-1]:.3g} of {best:g}) for {m.window} "
                        f"steps while reward/{zero}"
                        f"{' (gated on ' + ', '.join(gated) + ')' if gated else ''}"
                        f" stayed at 0: the policy has learned {full} alone (reward hacking), and "
                        f"{full} no longer tells completions apart; lower {full}'s weight (now "
                        f"{parts[full]['weight']:g}) or make it require {zero}, and check that "
                        f"{zero} can be earned at all; a larger sampling.max_new_tokens will not "
                        f"help"
                    ),
                    v[-1],
                )
                return


def _length_paid(m: HealthMonitor) -> Iterator[Finding]:
    ln, rw = m.series("completion_len"), m.series("reward")
    if len(ln) < m.window or len(rw) < m.window:
        return
    (l0, l1), (r0, r1) = halves(ln), halves(rw)
    if l0 > 0 and l1 > m.t["length_rise"] * l0 and r1 - r0 > m.t["hack_rise"]:
        yield (
            "length_hacking",
            (
                f"completion length rose {l0:.3g} -> {l1:.3g} tokens in {m.window} steps with the "
                f"reward ({r0:.3g} -> {r1:.3g}): the reward may be paying for length (reward "
                f"hacking); read samples.txt, and add a length penalty (reward `length`) or use "
                f"objective.aggregation: seq_mean_token_sum_norm"
            ),
            l1 / l0,
        )


def kl_dominates(m: HealthMonitor, converged: bool) -> Iterator[Finding]:
    """The KL term many times the policy term while the reward stays flat: the penalty holds
    the policy at the reference."""
    kl, pol, rw = m.series("loss/kl"), m.series("loss/policy"), m.series("reward")
    if converged or min(len(kl), len(pol), len(rw)) < m.window:
        return
    term, policy = statistics.fmean(kl), statistics.fmean(abs(x) for x in pol)
    if policy == 0:  # no policy gradient at all: flat groups, not the KL, are the cause
        return
    (r0, r1), coef = halves(rw), m.records[-1].get("kl_coef") or 0.0
    ratio = term / policy
    name = m.settings.get("kl_option", "the KL coefficient")
    if coef > 0 and ratio > m.t["kl_dominance"] and r1 - r0 < m.t["reward_rise"]:
        yield (
            "kl_dominates",
            (
                f"the KL term is {ratio:.0f}x the policy term ({term:.3g} vs {policy:.3g}) and the "
                f"reward stayed flat ({r0:.3g} -> {r1:.3g}) for {m.window} steps: the KL penalty "
                f"holds the policy at the reference; lower {name} from {coef:g} (e.g. to "
                f"{suggest(coef, 1 / min(ratio, 100))})"
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
    """One update that changed the policy's entropy by ``entropy_jump`` times or more (up or
    down), after which the reward fell below ``collapse`` of what it was, or the entropy
    stayed collapsed: the learning rate is too high. Adam moves every weight by about the
    learning rate whatever the gradient's size, so a clipped grad norm does not prevent it."""
    n, recent = m.t["collapse_steps"], m.records[-m.window :]
    pairs = [(x.get("reward"), x.get("entropy"), x.get("grad_norm")) for x in recent]
    if converged or any(not _finite(a) or not _finite(b) for a, b, _ in pairs):
        return
    # every value is a finite number here (checked just above)
    rw = cast(list[float], [a for a, _, _ in pairs])
    ent = cast(list[float], [b for _, b, _ in pairs])
    for k in range(1, len(pairs) - n + 1):
        jump = _ratio(ent[k - 1], ent[k])
        if jump < m.t["entropy_jump"]:
            continue
        before, after = statistics.fmean(rw[:k]), max(rw[k:])
        if before > 0 and after < m.t["collapse"] * before:
            what = f"the reward fell {before:.3g} -> {statistics.fmean(rw[k:]):.3g}"
        elif ent[k] < ent[k - 1] and max(ent[k:]) < ent[k - 1] / m.t["entropy_jump"]:
            what = f"the entropy collapsed {ent[k - 1]:.3g} -> {ent[k]:.3g}"
        else:
            continue
        lr, norm = m.settings.get("lr"), pairs[k - 1][2]
        yield (
            "lr_high",
            (
                f"{what} right after one update (step {recent[k - 1].get('step', k - 1)}, "
                f"grad norm "
                f"{norm:.3g}) that changed the entropy {ent[k - 1]:.3g} -> {ent[k]:.3g}: the "
                f"learning rate is too high and the update overshot; lower optimizer.lr"
                + (f" from {lr:g} (e.g. to {suggest(lr, 0.1)})" if lr else "")
            ),
            jump,
        )
        return


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
