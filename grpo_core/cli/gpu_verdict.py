"""The GPU check's verdict: each check a pure function of the figures the check collected
(a dict, also written as JSON), so what passes and what fails is decided — and tested — apart
from the GPU work that measures them (grpo_core.cli.gpu_probes)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass

from grpo_core.cli.gpu_bound import FLOOR_FRACTION

#: the demo task's reward must rise at least this much (mean of the last steps minus the first)
MIN_REWARD_RISE = 0.1
#: steps averaged at each end of the training run
REWARD_WINDOW = 20
#: hf/vLLM log-prob mismatch on the same completions: bounds on mean and max |delta| (nats)
MAX_MEAN_LOGPROB_DELTA = 0.05
MAX_MAX_LOGPROB_DELTA = 1.5
#: measured peak memory may exceed plan-memory's estimate by at most this factor
MAX_MEMORY_OVER_PLAN = 1.25
#: grpo-core's training step on SmolLM2 may take at most this times TRL's (the target: 0.25)
MAX_STEP_OVER_TRL = 1.0


@dataclass
class Check:
    """One row of the table: ``status`` is pass, fail or skip; ``figure`` what was measured,
    ``expected`` the bound it is held to (or why it was skipped)."""

    name: str
    status: str
    figure: str
    expected: str


def _missing(name: str, part: dict | None, expected: str) -> Check | None:
    """A failing row when a figure was not collected (its probe raised), a skipped one when
    the probe said why it could not run; None when the figures are there."""
    if part is None:
        return Check(name, "fail", "not measured", expected)
    if "error" in part:
        return Check(name, "fail", f"error: {part['error']}", expected)
    if "skipped" in part:
        return Check(name, "skip", "-", part["skipped"])
    return None


def gpu_tests(f: dict) -> list[Check]:
    part, want = f.get("gpu_tests"), "pytest -m gpu exits 0"
    bad = _missing("GPU-marked tests", part, want)
    if bad:
        return [bad]
    assert part is not None  # else _missing gave a row
    ok = part["exit_code"] == 0
    return [Check("GPU-marked tests", "pass" if ok else "fail", f"exit {part['exit_code']}", want)]


def training(f: dict) -> list[Check]:
    """Completions are not empty, and the demo task's reward rises."""
    part = f.get("training")
    bad = _missing("demo training", part, "non-empty completions, reward rising")
    if bad:
        return [bad]
    assert part is not None  # else _missing gave a row
    shortest = min(part["completion_len"])
    rewards, k = part["rewards"], REWARD_WINDOW
    start, end = sum(rewards[:k]) / len(rewards[:k]), sum(rewards[-k:]) / len(rewards[-k:])
    return [
        Check(
            "completions not empty",
            "pass" if shortest > 0 else "fail",
            f"shortest step mean {shortest:.2f} tokens",
            "> 0 tokens every step",
        ),
        Check(
            "reward rises (bf16)",
            "pass" if end - start >= MIN_REWARD_RISE else "fail",
            f"{start:.3f} -> {end:.3f} over {len(rewards)} steps",
            f"last {k} steps >= first {k} + {MIN_REWARD_RISE}",
        ),
    ]


def generation(f: dict) -> list[Check]:
    """Tokens/s at each group size for each generator and model; more completions at once
    must give more tokens per second (batching works)."""
    rows = []
    for backend, part in (f.get("generation") or {"hf": None}).items():
        name = f"{backend} generation tokens/s"
        bad = _missing(name, part, "measured, higher at the larger G")
        if bad:
            rows.append(bad)
            continue
        sizes = sorted(part, key=int)
        speeds = ", ".join(f"G={g}: {part[g]:.0f}" for g in sizes)
        ok = all(part[g] > 0 for g in sizes) and part[sizes[-1]] > part[sizes[0]]
        rows.append(
            Check(
                name,
                "pass" if ok else "fail",
                speeds,
                f"> 0, G={sizes[-1]} faster than G={sizes[0]}",
            )
        )
    return rows


def generation_floor(f: dict) -> list[Check]:
    """Each hf speed row's tokens/s at its largest G against the bound computed for this GPU
    (grpo_core/cli/gpu_bound.py): at least FLOOR_FRACTION of it."""
    want = f">= {FLOOR_FRACTION:.0%} of the bound"
    rows = []
    for backend, bound in (f.get("generation_bound") or {"hf": None}).items():
        name = f"{backend} tokens/s vs bound"
        speed = (f.get("generation") or {}).get(backend)
        bad = _missing(name, bound, want) or _missing(name, speed, want)
        if bad:
            rows.append(bad)
            continue
        assert bound is not None and speed is not None  # _missing said so
        g = max(bound, key=int)
        share = speed[g] / bound[g]
        rows.append(
            Check(
                name,
                "pass" if share >= FLOOR_FRACTION else "fail",
                f"G={g}: {speed[g]:.0f} of {bound[g]:.0f} ({share:.1%})",
                want,
            )
        )
    return rows


STEP_VS_TRL = "SmolLM2 step vs TRL"
DECODE_VS_BOUND = "SmolLM2 decode step vs bound"


def side_by_side(f: dict) -> list[Check]:
    """bench/gpu_step.py's SmolLM2 figures: grpo-core's step against TRL's in the same run,
    and its decode step against the bound."""
    part = f.get("side_by_side")
    bad = _missing(STEP_VS_TRL, part, "bench/gpu_step.py ran")
    if bad:
        return [bad]
    assert part is not None  # _missing said so
    return [_step_vs_trl(part), _decode_vs_bound(part)]


def _step_vs_trl(part: dict) -> Check:
    want = f"ours <= {MAX_STEP_OVER_TRL} x TRL's step (target 0.25)"
    ours, trl = part["ours"], part["trl"]
    bad = _missing(STEP_VS_TRL, ours, want) or _missing(STEP_VS_TRL, trl, want)
    if bad:
        return bad
    return Check(
        STEP_VS_TRL,
        "pass" if part["ratio"] <= MAX_STEP_OVER_TRL else "fail",
        f"{ours['step_s']:.2f} / {trl['step_s']:.2f} s ({part['ratio']:.2f}x)",
        want,
    )


def _decode_vs_bound(part: dict) -> Check:
    want = f"bound >= {FLOOR_FRACTION:.0%} of the step"
    ours, bound = part["ours"], part.get("bound")
    bad = _missing(DECODE_VS_BOUND, ours, want) or _missing(DECODE_VS_BOUND, bound, want)
    if bad:
        return bad
    assert bound is not None  # _missing said so
    share = bound["bound_ms"] / ours["decode_step_ms"]
    return Check(
        DECODE_VS_BOUND,
        "pass" if share >= FLOOR_FRACTION else "fail",
        f"{ours['decode_step_ms']:.2f} ms, bound {bound['bound_ms']:.2f} ms ({1 / share:.1f}x)",
        want,
    )


def logprob_mismatch(f: dict) -> list[Check]:
    """vLLM's log-probs against the trainer's on the same completions, for each model."""
    want = f"mean |d| <= {MAX_MEAN_LOGPROB_DELTA}, max |d| <= {MAX_MAX_LOGPROB_DELTA}"
    rows = []
    for model, part in (f.get("logprob_mismatch") or {"": None}).items():
        name = f"hf/vLLM log-prob mismatch {model}".strip()
        bad = _missing(name, part, want)
        if bad:
            rows.append(bad)
            continue
        ok = part["mean_abs"] <= MAX_MEAN_LOGPROB_DELTA and part["max_abs"] <= MAX_MAX_LOGPROB_DELTA
        rows.append(
            Check(
                name,
                "pass" if ok else "fail",
                f"mean {part['mean_abs']:.4f}, max {part['max_abs']:.3f}",
                want,
            )
        )
    return rows


def memory(f: dict) -> list[Check]:
    part = f.get("memory")
    want = f"measured <= {MAX_MEMORY_OVER_PLAN} x plan-memory"
    bad = _missing("peak memory vs plan-memory", part, want)
    if bad:
        return [bad]
    assert part is not None  # else _missing gave a row
    ratio = part["measured_mib"] / part["planned_mib"]
    return [
        Check(
            "peak memory vs plan-memory",
            "pass" if ratio <= MAX_MEMORY_OVER_PLAN else "fail",
            f"{part['measured_mib']:.0f} / {part['planned_mib']:.0f} MiB ({ratio:.2f}x)",
            want,
        )
    ]


def distributed(f: dict) -> list[Check]:
    rows = []
    for strategy, part in (f.get("distributed") or {"fsdp": None, "zero3": None}).items():
        name = f"{strategy} over the GPUs"
        bad = _missing(name, part, "exit 0, ranks in sync")
        if bad:
            rows.append(bad)
            continue
        ok = part["exit_code"] == 0 and part.get("ranks_in_sync") is True
        rows.append(
            Check(
                name,
                "pass" if ok else "fail",
                f"{part['world']} ranks, exit {part['exit_code']}, in sync: "
                f"{part.get('ranks_in_sync')}",
                "exit 0, ranks in sync",
            )
        )
    return rows


CHECKS: tuple[Callable[[dict], list[Check]], ...] = (
    gpu_tests,
    training,
    generation,
    generation_floor,
    side_by_side,
    logprob_mismatch,
    memory,
    distributed,
)


def judge(figures: dict) -> list[Check]:
    """Every check's row, in the table's order."""
    return [row for check in CHECKS for row in check(figures)]


def exit_code(checks: list[Check]) -> int:
    """1 when any check failed, else 0 (skipped ones say why in the table)."""
    return 1 if any(c.status == "fail" for c in checks) else 0


def table(checks: list[Check]) -> str:
    """The checks as one plain-text table."""
    head = ("check", "status", "measured", "expected")
    rows = [head] + [(c.name, c.status.upper(), c.figure, c.expected) for c in checks]
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    lines = [" | ".join([*(r[i].ljust(widths[i]) for i in range(3)), r[3]]) for r in rows]
    lines.insert(1, "-" * len(lines[0]))
    return "\n".join(lines)


def as_json(checks: list[Check]) -> list[dict]:
    return [asdict(c) for c in checks]
