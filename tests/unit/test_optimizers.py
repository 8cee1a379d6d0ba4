"""optimizer.name: each optimizer's first updates against hand-computed values."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from grpo_core import config
from grpo_core.config.view import OptimizerSection, view
from grpo_core.engine.update import build_optimizer
from grpo_core.errors import ConfigError


def _section(**options) -> OptimizerSection:
    cfg = config.validate(
        {"model": {"name_or_path": "m"}, "data": {"path": "d"}, "reward": {"name": "math"}}
    )
    return replace(view(cfg).optimizer, **options)


def _steps(
    oc: OptimizerSection, grads: list[list[float]]
) -> tuple[torch.optim.Optimizer, list[float]]:
    p = torch.nn.Parameter(torch.tensor([1.0, 2.0]))
    opt = build_optimizer([p], oc)
    for g in grads:
        p.grad = torch.tensor(g)
        opt.step()
    return opt, p.detach().tolist()


def test_sgd_with_momentum_by_hand():
    opt, p = _steps(_section(name="sgd", lr=0.1, momentum=0.9), [[0.5, -1.0], [0.5, -1.0]])
    assert type(opt) is torch.optim.SGD
    # v1 = g, p1 = p - 0.1 g; v2 = 0.9 v1 + g = 1.9 g, p2 = p1 - 0.1 x 1.9 g = p - 0.29 g
    assert p == pytest.approx([1.0 - 0.29 * 0.5, 2.0 + 0.29])


def test_adamw_first_step_moves_each_weight_by_lr():
    # bias-corrected m / sqrt(v) is g / |g| on the first step: p - lr sign(g), no decay
    for fused in (True, False):
        opt, p = _steps(_section(lr=0.01, fused=fused), [[0.5, -3.0]])
        assert type(opt) is torch.optim.AdamW
        assert p == pytest.approx([0.99, 2.01], abs=1e-6)


def test_adafactor_first_step_by_hand():
    opt, p = _steps(_section(name="adafactor", lr=0.01), [[0.5, -3.0]])
    assert type(opt).__name__ == "Adafactor"
    # a 1-d weight: unfactored second moment; the first step's update is g / sqrt(g^2 + 1e-30)
    # = sign(g), its RMS 1 is under the clip threshold 1, so p - lr sign(g)
    assert p == pytest.approx([0.99, 2.01], abs=1e-6)


def test_an_unknown_optimizer_is_one_line_naming_the_field():
    with pytest.raises(ConfigError) as err:
        config.validate(
            {
                "model": {"name_or_path": "m"},
                "data": {"path": "d"},
                "reward": {"name": "math"},
                "optimizer": {"name": "lion"},
            }
        )
    assert str(err.value).startswith("optimizer.name: ")
    assert "adamw" in str(err.value) and "\n" not in str(err.value)
