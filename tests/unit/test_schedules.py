"""Learning-rate schedules by transformers' names: their shapes, their options, a resumed
schedule (bitwise) and a forced new peak learning rate."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch
from helpers import make_config, write_config

from grpo_core import config
from grpo_core.cli.main import main
from grpo_core.config.view import OptimizerSection, view
from grpo_core.engine import schedules
from grpo_core.errors import UserError

LR = 0.1


def opt_cfg(name: str, warmup: int = 0, **options) -> OptimizerSection:
    return view(
        config.validate(
            make_config(
                "m",
                "d.jsonl",
                "out",
                optimizer={
                    "lr": LR,
                    "lr_schedule": name,
                    "warmup_steps": warmup,
                    "scheduler_options": options,
                },
            )
        )
    ).optimizer


def lrs(name: str, total: int = 10, warmup: int = 0, **options) -> list[float]:
    """The learning rate of each of ``total`` updates."""
    opt = torch.optim.AdamW([torch.zeros(1, requires_grad=True)], lr=LR)
    sched = schedules.build(opt, opt_cfg(name, warmup, **options), total)
    out = []
    for _ in range(total):
        out.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return out


def test_every_offered_name_builds():
    options = {
        "cosine_with_min_lr": {"min_lr_rate": 0.1},
        "warmup_stable_decay": {"num_decay_steps": 3},
    }
    for name in schedules.SCHEDULES:
        values = lrs(name, warmup=2, **options.get(name, {}))
        assert len(values) == 10 and all(0 <= v <= LR for v in values), name


def test_the_shapes():
    assert lrs("constant") == [LR] * 10
    assert lrs("constant", warmup=4)[:5] == pytest.approx([0, LR / 4, LR / 2, 3 * LR / 4, LR])
    assert lrs("linear") == pytest.approx([LR * (10 - i) / 10 for i in range(10)])
    # earlier configs' cosine: half a cosine from the peak to 0 after warm-up
    assert lrs("cosine") == pytest.approx(
        [LR * 0.5 * (1 + math.cos(math.pi * i / 10)) for i in range(10)]
    )
    floor = lrs("cosine_with_min_lr", total=10, min_lr_rate=0.2)
    assert floor[0] == pytest.approx(LR) and min(floor) >= 0.2 * LR - 1e-12
    assert floor[-1] < 0.3 * LR
    wsd = lrs("warmup_stable_decay", total=10, warmup=2, num_decay_steps=3)
    assert wsd[:2] == pytest.approx([0, LR / 2])
    assert wsd[2:8] == pytest.approx([LR] * 6)  # stable, then 3 updates of decay from LR
    assert wsd[9] < wsd[8] < LR


def test_a_schedule_missing_its_own_option_is_one_line(tmp_path, capsys):
    with pytest.raises(
        UserError,
        match=r"^optimizer.scheduler_options: lr_schedule "
        r"warmup_stable_decay with no options: .*num_decay_steps",
    ):
        lrs("warmup_stable_decay")
    with pytest.raises(
        UserError,
        match=r"lr_schedule linear with \{'min_lr_rate': 0.1\}: "
        r".*unexpected keyword argument 'min_lr_rate'",
    ):
        lrs("linear", min_lr_rate=0.1)
    with pytest.raises(
        UserError,
        match=r"lr_schedule constant takes no options "
        r"\(found \['num_decay_steps'\]\)",
    ):
        lrs("constant", num_decay_steps=3)
    cfg = make_config(
        "m", "d.jsonl", str(tmp_path / "r"), optimizer={"lr_schedule": "cosine_with_min_lr"}
    )
    assert main(["validate", write_config(tmp_path / "c.json", cfg)]) == 2
    errors = [x for x in capsys.readouterr().err.splitlines() if x.startswith("error: optimizer")]
    assert len(errors) == 1 and "min_lr" in errors[0], errors


def resumed(name: str, lr: float, at: int, total: int = 12, **options):
    """A schedule stepped ``at`` times, saved, loaded into a fresh one built with peak
    ``lr`` (as run._resume does), then stepped to the end; returns both lr sequences."""

    def build(peak):
        opt = torch.optim.AdamW([torch.zeros(1, requires_grad=True)], lr=peak)
        return opt, schedules.build(opt, replace(opt_cfg(name, 2, **options), lr=peak), total)

    opt, sched = build(LR)
    for _ in range(at):
        opt.step()
        sched.step()
    state = (opt.state_dict(), sched.state_dict())
    opt2, sched2 = build(lr)
    opt2.load_state_dict(state[0])
    sched2.load_state_dict(state[1])
    if lr != LR:
        schedules.set_peak_lr(sched2, opt2, lr)
    out = []
    for _ in range(total - at):
        out.append(opt2.param_groups[0]["lr"])
        opt2.step()
        sched2.step()
    return out


@pytest.mark.parametrize(
    "name,options",
    [
        ("cosine", {}),
        ("warmup_stable_decay", {"num_decay_steps": 4}),
        ("cosine_with_min_lr", {"min_lr_rate": 0.1}),
    ],
)
def test_resume_is_exact_and_a_forced_new_peak_scales_the_rest(name, options):
    whole = lrs(name, total=12, warmup=2, **options)
    for at in (1, 5, 9):
        assert resumed(name, LR, at, **options) == whole[at:]  # bitwise: ==, not approx
        assert resumed(name, 2 * LR, at, **options) == pytest.approx([2 * v for v in whole[at:]])
