"""Padding-free log-prob passes (grpo_core.model.packing): the packed layouts give the same
log-probs, entropies, losses and gradients as the padded ones, for every loss aggregation,
with KL and entropy terms, for the policy (with gradients) and for the reference and
old-log-prob passes (without); their layouts and padding counts match a hand count."""

from __future__ import annotations

import contextlib
import json

import pytest
import torch
from grpo_core_plugins.objectives import clipped_ratio
from test_prompt_sharing import AGGREGATIONS, make_rollout, model64  # noqa: F401 (a fixture)
from transformers import AutoModelForCausalLM

from grpo_core.loss.losses import Normaliser, objective_loss
from grpo_core.model import logprobs, packing

#: the longest reduction (terms summed into one value) anywhere in the passes: the
#: vocabulary (258: log-sum-exp, and the head's gradient), the MLP width (64), a packed row
#: (at most 21 keys here), the 44 completion tokens whose gradients sum into each weight
LONGEST_SUM = 258
#: operations a value passes through between the input and the compared output, counted
#: loosely: 2 layers x (norm, attention, MLP, residual), forward and backward, the head
DEPTH = 32


def tolerance(dtype: torch.dtype) -> float:
    """Relative bound on the difference between two orders of the same arithmetic.

    The packed and padded passes compute the same sums with different kernels and shapes
    (SDPA over rows of up to 21 keys with masked ones contributing exact zeros, against rows
    of 13; GEMMs of other sizes, so other blockings): only the order of additions differs. A
    sum of K terms in another order differs by at most K * u relative to the sum of the
    terms' magnitudes (u: the unit roundoff, 2^-53 for float64, 2^-24 for float32; Higham's
    gamma_K), and errors add up along the DEPTH operations a value passes through. The bound
    is taken relative to the largest magnitude of the compared tensor (``close``), since a
    gradient entry that cancels to near zero has no relative accuracy of its own. float32:
    258 * 32 * 6e-8 = 4.9e-4, a worst-case bound about 600x above what is seen (8e-7 of the
    largest gradient, 8e-8 on log-probs, with SDPA and eager alike: rounding errors of a
    sum grow like sqrt(K) u in practice, not K u), so the test does not fail on a machine
    whose BLAS blocks its sums differently (a fixed 1e-5 once failed on a fresh machine at
    1.9e-5), yet a wrong mask fails it (test_a_wrong_mask_is_caught, in both dtypes)."""
    return LONGEST_SUM * DEPTH * torch.finfo(dtype).eps / 2


def close(a: torch.Tensor, b: torch.Tensor, msg: str = "", scale: float | None = None) -> None:
    """a equals b up to ``tolerance`` of ``scale``: by default b's largest magnitude; for a
    value that is a sum of larger terms cancelling (the loss: advantages of both signs), the
    terms' largest magnitude, since rounding errors scale with the terms, not with the sum."""
    tol = tolerance(b.dtype)
    if scale is None:
        scale = float(b.abs().max()) if b.numel() else 0.0
    torch.testing.assert_close(a, b, rtol=tol, atol=tol * max(scale, 1e-30), msg=msg)


def loss_and_grads(model, ro, packed: bool, aggregation: str, kl_coef: float, seed: int = 1):
    """Log-probs, entropies, the clipped-ratio loss with KL and entropy terms, and every
    parameter's gradient, along the packed or the padded path (the padded one sharing
    prompts or not as it chooses)."""
    g = torch.Generator().manual_seed(seed)
    mask = ro.completion_mask.to(torch.get_default_dtype())
    dtype = next(model.parameters()).dtype
    with torch.no_grad():
        base, _ = logprobs.completion_logprobs(model, ro, 1.0, 4)
    noise = 0.3 * torch.randn(mask.shape, generator=g, dtype=dtype)
    old, ref = (base + noise) * mask, (base - noise.flip(0)) * mask  # ratios away from 1
    adv = torch.randn(ro.size, generator=g, dtype=dtype)
    model.zero_grad(set_to_none=True)
    logp, ent = logprobs.completion_logprobs(
        model, ro, 1.0, 4, entropy=True, packing="on" if packed else "off"
    )
    term = clipped_ratio(logp, old, adv, mask.to(dtype), 0.2, 0.28)
    loss, _ = objective_loss(
        term,
        mask.to(dtype),
        aggregation,
        Normaliser.of(mask.to(dtype), mask.shape[1]),
        logp=logp,
        ref_logp=ref if kl_coef else None,
        kl_coef=kl_coef,
        entropy=ent,
        entropy_coef=0.01,
    )
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    terms = float((term.loss.detach().abs() * mask).max())  # the loss's summands: at most this
    return logp.detach(), ent.detach(), loss.detach(), grads, terms


def assert_same(a, b) -> None:
    close(a[0], b[0], "logp")
    close(a[1], b[1], "entropy")
    close(a[2], b[2], "loss", scale=max(b[4], float(b[2].abs())))
    assert a[3].keys() == b[3].keys() and a[3]
    for n in a[3]:
        close(a[3][n], b[3][n], n)


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
@pytest.mark.parametrize("kl_coef", [0.0, 0.1])
def test_packed_equals_padded_float64(model64, aggregation, kl_coef):  # noqa: F811
    ro = make_rollout(model64.config.vocab_size, model64.config.pad_token_id)
    packed = loss_and_grads(model64, ro, True, aggregation, kl_coef)
    padded = loss_and_grads(model64, ro, False, aggregation, kl_coef)
    assert_same(packed, padded)
    assert max(g.abs().max() for g in packed[3].values()) > 1e-3  # gradients are not all zero


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_packed_equals_padded_float32(tiny_model, attention):
    """The model as it trains (float32, RMSNorm as shipped), both mask kinds: boolean for
    SDPA, additive for eager attention."""
    model = AutoModelForCausalLM.from_pretrained(tiny_model, attn_implementation=attention)
    model.train()
    ro = make_rollout(model.config.vocab_size, model.config.pad_token_id, seed=2)
    assert_same(
        loss_and_grads(model, ro, True, "seq_mean_token_mean", 0.1),
        loss_and_grads(model, ro, False, "seq_mean_token_mean", 0.1),
    )


def test_rows_of_a_small_capacity(model64, monkeypatch):  # noqa: F811
    """Rows that hold a prompt and only some of its completions (the prompt repeated per
    row) give the same numbers too."""
    monkeypatch.setattr(logprobs, "choose_capacity", lambda ro, pair_cost: 12)
    ro = make_rollout(model64.config.vocab_size, model64.config.pad_token_id, seed=8)
    assert len(packing.row_plan(ro, 12)) > 3
    assert_same(
        loss_and_grads(model64, ro, True, "seq_mean_token_sum_norm", 0.1),
        loss_and_grads(model64, ro, False, "seq_mean_token_sum_norm", 0.1),
    )


def _leaky(packed, dtype):
    """A wrong tree mask: every completion also sees the earlier completions of its row."""
    p = packed
    return packing.tree_mask(
        packing.Packed(p.input_ids, p.position_ids, p.base, p.base, p.picks, 0), dtype
    )


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_a_wrong_mask_is_caught(model64, monkeypatch, dtype):  # noqa: F811
    """The tolerance is tight enough to see a mask that lets completions see each other."""
    model = model64.to(dtype)
    ro = make_rollout(model.config.vocab_size, model.config.pad_token_id)
    padded = loss_and_grads(model, ro, False, "token_mean", 0.1)
    monkeypatch.setattr(logprobs, "tree_mask", _leaky)
    with pytest.raises(AssertionError):
        assert_same(loss_and_grads(model, ro, True, "token_mean", 0.1), padded)


def test_reference_and_old_logprobs_packed(model64):  # noqa: F811
    ro = make_rollout(model64.config.vocab_size, model64.config.pad_token_id, seed=5)
    out = []
    for packed in (True, False):
        mode = "on" if packed else "off"
        ref = logprobs.reference_logprobs(model64, ro, 0.7, 3, contextlib.nullcontext(), mode)
        with torch.no_grad():
            old, ent = logprobs.completion_logprobs(model64, ro, 0.7, 3, entropy=True, packing=mode)
        assert not ref.requires_grad and not old.requires_grad
        out.append((ref, old, ent))
    for a, b in zip(*out):
        close(a, b)
    assert (out[0][0] * ro.completion_mask == out[0][0]).all()  # padding stays 0


def test_varlen_layout_through_position_ids(model64, monkeypatch):  # noqa: F811
    """The flash-attention layout (one row, no mask): on the CPU, transformers finds the
    sequences from where ``position_ids`` restart and builds the block-diagonal mask for
    SDPA, so the layout is checked here; the varlen kernel itself only runs on a GPU."""
    monkeypatch.setattr(logprobs, "_varlen", lambda decoder: True)
    ro = make_rollout(model64.config.vocab_size, model64.config.pad_token_id, seed=4)
    for aggregation in AGGREGATIONS:
        assert_same(
            loss_and_grads(model64, ro, True, aggregation, 0.1),
            loss_and_grads(model64, ro, False, aggregation, 0.1),
        )


def test_packed_under_gradient_checkpointing(model64):  # noqa: F811
    """One decoder call and no cache: the tree layout shares prompts even where the KV-cache
    sharing falls back to repeating them (checkpointed layers)."""
    ro = make_rollout(model64.config.vocab_size, model64.config.pad_token_id, seed=6)
    plain = loss_and_grads(model64, ro, False, "token_mean", 0.1)
    model64.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model64.train()
    assert_same(loss_and_grads(model64, ro, True, "token_mean", 0.1), plain)


def test_layouts_by_hand():
    """Prompts [5, 2, 7] tokens, completions [7, 3, 5 | 1, 7, 2 | 6, 4, 7] (T = 7)."""
    ro = make_rollout(258, 257)
    tree = packing.pack_tree(ro, 0)
    # rows: prompt + (n - 1) per completion: 5 + 6 + 2 + 4 = 17, 2 + 0 + 6 + 1 = 9, 21
    assert tree.input_ids.shape == (3, 21) and tree.padding == 4 + 12 + 0
    # row 0: the prompt, then its completions longest first: 0 (6 fed), 2 (4), 1 (2)
    assert tree.position_ids[0, :17].tolist() == [*range(11), 5, 6, 7, 8, 5, 6]
    assert tree.input_ids[0, :5].tolist() == [12, 40, 41, 99, 7]
    assert tree.input_ids[0, 5:11].tolist() == ro.completion_ids[0, :6].tolist()
    # completion 1 (3 tokens, at 15): token 0 from the prompt's last position, then its own
    assert tree.picks[7:10].tolist() == [4, 15, 16]
    mask = packing.tree_mask(tree, None)[0, 0]
    assert mask[16, :5].all() and not mask[16, 5:15].any() and mask[16, 15:17].all()
    assert not mask[16, 17:].any()
    varlen = packing.pack_varlen(ro, 0)
    # each completion after its prompt: 3 x (5 + 2 + 7) + (6 + 2 + 4 + 0 + 6 + 1 + 5 + 3 + 6)
    assert varlen.input_ids.shape == (1, 42 + 33) and varlen.padding == 0
    assert varlen.position_ids[0, 11:16].tolist() == [0, 1, 2, 3, 4]  # completion 1 restarts


def test_row_plan_and_capacity_by_hand():
    ro = make_rollout(258, 257)
    # fed (n - 1) per completion: [6, 2, 4 | 0, 6, 1 | 5, 3, 6]; prompts 5, 2, 7 tokens
    one_each = [(0, [0, 2, 1]), (1, [4, 5, 3]), (2, [8, 6, 7])]
    assert packing.row_plan(ro, None) == one_each
    # capacity 12: 5 + 6; 5 + 4 + 2 | 2 + 6 + 1 + 0 | 7 + 6 (alone: a row takes one);
    # 7 + 5; 7 + 3: rows of 11, 11, 9, 13, 12, 10
    assert packing.row_plan(ro, 12) == [
        (0, [0]),
        (0, [2, 1]),
        (1, [4, 5, 3]),
        (2, [8]),
        (2, [6]),
        (2, [7]),
    ]
    assert packing.packed_counts(ro, False, 12) == (6 * 13, 6 * 13 - 66)
    # no attention cost: the fewest positions win: one row per prompt (3 x 21 = 63), first
    # reached at twice the longest sequence (13); a high one: rows of 13 (6 x 13^2 against
    # 4 x 18^2 at 19 and 3 x 21^2 at 26)
    assert packing.row_plan(ro, packing.choose_capacity(ro, 0.0)) == one_each
    assert packing.choose_capacity(ro, 10.0) == 13


def test_auto_packs_where_it_counts_less_work(model64, monkeypatch):  # noqa: F811
    """Counted in positions (test_padding_counts_by_hand): with attention free, the tree's
    63 beat the padded 75 or 117; with a pair costing 10 positions, rows of 13 (6 x 13 x 131
    = 10,218) lose to shared prompts (3 x 7 x 71 + 9 x 6 x 131 = 8,565) and beat repeated
    ones (9 x 13 x 131 = 15,327)."""
    ro = make_rollout(model64.config.vocab_size, model64.config.pad_token_id)
    decoder = model64.get_decoder()
    for cost, share, layout in ((0.0, 0, "tree"), (10.0, 0, "shared"), (10.0, 10**9, "tree")):
        monkeypatch.setattr(logprobs, "_pair_cost", lambda decoder, c=cost: c)
        monkeypatch.setattr(logprobs, "SHARE_MIN_SAVED_TOKENS", share)
        assert logprobs.choose_layout(decoder, ro, "auto")[0] == layout
        assert logprobs.choose_layout(decoder, ro, "off")[0] in ("shared", "repeated")
        assert logprobs.choose_layout(decoder, ro, "on")[0] == "tree"
    assert packing.tree_cost(ro, 13, 10.0) == 6 * 13 * 131
    assert packing.padded_cost(ro, True, 10.0) == 3 * 7 * 71 + 9 * 6 * 131
    assert packing.padded_cost(ro, False, 10.0) == 9 * 13 * 131


def test_padding_counts_by_hand():
    ro = make_rollout(258, 257)
    # repeated: 9 rows x (7 + 6); real: 3 x 14 prompt tokens + min(n, 6) = 39 completion tokens
    assert packing.padded_counts(ro, shared=False) == (117, 117 - 42 - 39)
    # shared: 3 x 7 prompt positions + 9 x 6 completion positions; real 14 + 39
    assert packing.padded_counts(ro, shared=True) == (75, 75 - 14 - 39)
    assert packing.packed_counts(ro, varlen=False) == (63, 16)
    assert packing.packed_counts(ro, varlen=True) == (75, 0)
    tree = packing.pack_tree(ro, 0)
    assert (tree.positions, tree.padding) == packing.packed_counts(ro, varlen=False)


def test_completions_not_right_padded(model64):  # noqa: F811
    """``on`` refuses them; ``auto`` runs them padded."""
    ro = make_rollout(258, 257)
    ro.completion_mask[0, 0] = 0
    assert not packing.right_padded(ro)
    with pytest.raises(ValueError, match="right-padded"):
        packing.pack_tree(ro, 0)
    decoder = model64.get_decoder()
    assert logprobs.choose_layout(decoder, ro, "auto")[0] in ("shared", "repeated")


def _run(tiny_model: str, data: str, out: str, packing_on: str) -> list[dict]:
    from helpers import make_config

    from grpo_core import config
    from grpo_core.trainer import train

    cfg = make_config(
        tiny_model,
        data,
        out,
        sampling={"group_size": 4, "max_new_tokens": 8},
        train={"steps": 2, "prompts_per_step": 4, "micro_batch_groups": 2, "seed": 0},
        kl={"name": "fixed", "options": {"coef": 0.1}},
        objective={"name": "grpo", "entropy_coef": 0.01},
        runtime={"device": "cpu", "packing": packing_on},
        output={"dir": out, "progress": False, "samples_every": 0, "save_model": False},
    )
    train(config.validate(cfg))
    with open(f"{out}/metrics.jsonl", encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def test_a_packed_run_learns_the_same_and_reports_its_padding(tiny_model, tmp_path):
    """Two steps with and without packing: the same completions (same seed), so the same
    losses, KL, entropy and gradient norms; the padding fraction is what the layouts' counts
    say (counted by hand in test_padding_counts_by_hand), lower when packed. The prompts all
    differ in length, so every micro-batch has padding to remove."""
    from grpo_core.tiny import write_jsonl

    data = str(tmp_path / "sums.jsonl")
    write_jsonl(data, [{"prompt": f"{10**k}+{k}=", "answer": str(10**k + k)} for k in range(8)])
    padded = _run(tiny_model, data, str(tmp_path / "padded"), "off")
    packed = _run(tiny_model, data, str(tmp_path / "packed"), "on")
    for a, b in zip(packed, padded):
        assert a["completion_len"] == b["completion_len"]  # the same rollouts
        for key in ("loss", "kl", "entropy", "grad_norm"):
            close(torch.tensor(a[key]), torch.tensor(b[key]), key)
        assert 0.0 <= a["padding_frac"] < b["padding_frac"] < 1.0
