"""Log-probs through the model's own LM head module (what DeepSpeed ZeRO-3 runs, its weights
whole only inside each module's call) equal the chunked head's: values, entropies, gradients."""

from __future__ import annotations

import torch
from test_prompt_sharing import make_rollout, model64  # noqa: F401 (a fixture)

from grpo_core.model.logprobs import completion_logprobs


def test_head_module_equals_the_chunked_head(model64):  # noqa: F811
    ro = make_rollout(model64.config.vocab_size, pad=0)
    out = {}
    for chunk in (4, None):
        model64.zero_grad()
        lp, ent = completion_logprobs(model64, ro, 0.7, chunk, entropy=True)
        ((lp * 1.3).sum() + (ent * 0.2).sum()).backward()
        out[chunk] = lp, ent, {n: p.grad.clone() for n, p in model64.named_parameters()}
    (lp_c, ent_c, g_c), (lp_m, ent_m, g_m) = out[4], out[None]
    mask = ro.completion_mask.bool()
    assert lp_c.shape == lp_m.shape and (lp_m[~mask] == 0).all() and (ent_m[~mask] == 0).all()
    assert lp_m[mask].abs().min() > 0  # real values, not zeros
    # float64 model: the head as a module vs chunked differ in summation order only (~1e-15
    # relative per op); gradients sum over every position and layer, hence 1e-8 there
    torch.testing.assert_close(lp_m, lp_c, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(ent_m, ent_c, rtol=1e-10, atol=1e-10)
    for name in g_c:
        torch.testing.assert_close(g_m[name], g_c[name], rtol=1e-8, atol=1e-10)
