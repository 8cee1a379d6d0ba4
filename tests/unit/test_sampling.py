"""The batch-invariant sampler: right distribution, filters, determinism."""

from __future__ import annotations

import torch

from grpo_core.sampling import filter_logits, sample, uniform


def test_frequencies_match_the_distribution():
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    z = probs.log().expand(40_000, 4)
    counts = torch.bincount(sample(z, 123, torch.arange(40_000), 0), minlength=4) / 40_000
    torch.testing.assert_close(counts, probs, atol=0.01, rtol=0)
    one_row = torch.stack([sample(z[:1], s, torch.arange(1), 3) for s in range(5000)]).flatten()
    torch.testing.assert_close(
        torch.bincount(one_row, minlength=4) / 5000, probs, atol=0.025, rtol=0
    )


def test_uniform_is_uniform_and_deterministic():
    u = uniform(7, torch.arange(100_000), 5)
    assert 0 < u.min() and u.max() < 1 and abs(u.mean() - 0.5) < 0.005
    assert torch.equal(u[1000:1010], uniform(7, torch.arange(1000, 1010), 5))
    assert not torch.equal(u[:10], uniform(7, torch.arange(10), 6))
    assert not torch.equal(u[:10], uniform(8, torch.arange(10), 5))


def test_filters_never_sample_outside():
    z = torch.tensor([[3.0, 2.0, 1.0, 0.0, -1.0]]).expand(5000, 5)
    top2 = sample(z, 1, torch.arange(5000), 0, top_k=2)
    assert set(top2.tolist()) == {0, 1}
    probs = torch.softmax(z[0], -1)  # 0.64, 0.23, 0.09, ...: top_p 0.8 keeps the first two
    nucleus = sample(z, 1, torch.arange(5000), 0, top_p=0.8)
    assert set(nucleus.tolist()) == {0, 1} and probs[:2].sum() > 0.8
    assert torch.isinf(filter_logits(z[:1], top_k=1)[0, 1:]).all()
