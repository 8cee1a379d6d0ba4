"""Truncated importance weights against values worked out by hand, and the shared-memory
weight ring's versions."""

from __future__ import annotations

import math

import pytest
import torch

from grpo_core.loss.losses import truncated_is_weights
from grpo_core.overlap.weights import WeightRing, layout
from grpo_core.tiny import build_model


def _logs(*p: float) -> torch.Tensor:
    return torch.tensor([math.log(x) for x in p], dtype=torch.float64)


# completion 0: ratios 0.5/0.25 = 2, 0.2/0.4 = 0.5, then padding with a huge ratio (masked);
# completion 1: ratios 2 and 2 (product 4)
LOGP = torch.stack([_logs(0.5, 0.2, 0.9), _logs(0.6, 0.4, 0.5)])
MU = torch.stack([_logs(0.25, 0.4, 1e-6), _logs(0.3, 0.2, 0.5)])
MASK = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0]], dtype=torch.float64)


def test_token_level_cuts_each_ratio_at_the_cap():
    w = truncated_is_weights(LOGP, MU, MASK, cap=1.5, level="token")
    assert torch.allclose(w, torch.tensor([[1.5, 0.5, 0.0], [1.5, 1.5, 0.0]], dtype=w.dtype))


def test_sequence_level_cuts_the_product_of_the_masked_ratios():
    # completion 0: 2 * 0.5 = 1 (the padded token's ratio of 900000 is left out); 1: 2 * 2 = 4
    w = truncated_is_weights(LOGP, MU, MASK, cap=3.0, level="sequence")
    assert torch.allclose(w, torch.tensor([[1.0, 1.0, 0.0], [3.0, 3.0, 0.0]], dtype=w.dtype))
    w = truncated_is_weights(LOGP, MU, MASK, cap=0.8, level="sequence")
    assert torch.allclose(w, torch.tensor([[0.8, 0.8, 0.0], [0.8, 0.8, 0.0]], dtype=w.dtype))


def test_sequence_level_cannot_overflow():
    logp, mu = torch.zeros(1, 400), torch.full((1, 400), -5.0)  # ratio e^2000 in float32
    w = truncated_is_weights(logp, mu, torch.ones(1, 400), cap=2.0, level="sequence")
    assert torch.isfinite(w).all() and torch.allclose(w, torch.full_like(w, 2.0))


def test_unknown_level_is_refused():
    with pytest.raises(ValueError, match="TIS level"):
        truncated_is_weights(LOGP, MU, MASK, cap=2.0, level="tokens")


def test_weight_ring_hands_over_each_version_and_catches_an_overwritten_slot(tmp_path):
    from transformers import AutoModelForCausalLM

    path = build_model(str(tmp_path / "m"), hidden=16, layers=1, seed=0)
    trainer, generator = (AutoModelForCausalLM.from_pretrained(path) for _ in range(2))
    entries, size = layout(trainer)
    ring = WeightRing(entries, size, slots=2)
    mapped = WeightRing(entries, size, 2, ring.path)  # what the other process maps
    ring.unlink()
    for version in range(3):
        with torch.no_grad():
            for p in trainer.parameters():
                p.add_(0.5)
        ring.write(trainer, version)
        mapped.read(generator, version)
        for (name, a), b in zip(trainer.state_dict().items(), generator.state_dict().values()):
            assert torch.equal(a, b), name
    with pytest.raises(RuntimeError, match="holds version 2, expected 0"):
        mapped.read(generator, 0)  # slot 0 now holds version 2
