"""Prompt sharing: in the training forwards each prompt run once with its KV cache expanded to
its completions gives the same log-probs, losses and gradients as the prompt repeated G times
(policy with gradients, reference and old-log-prob recompute without); in the hf generator
the shared prompt cache's fast paths give the same completions as the plain loop."""

from __future__ import annotations

import contextlib
import os

import pytest
import torch
from grpo_core_plugins.generators import hf as hf_generator
from grpo_core_plugins.objectives import clipped_ratio
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers.models.qwen2 import modeling_qwen2

import grpo_core
from grpo_core.loss.losses import Normaliser, objective_loss
from grpo_core.model import logprobs
from grpo_core.rollout import Rollout, SamplingParams

SHARE, REPEAT = 0, 10**9  # SHARE_MIN_SAVED_TOKENS that force each path
AGGREGATIONS = ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"]
PROMPTS = [[12, 40, 41, 99, 7], [55, 3], [8, 9, 10, 11, 12, 13, 14]]  # left-padded to 7
LENGTHS = [7, 3, 5, 1, 7, 2, 6, 4, 7]  # completions right-padded to 7; 3 per prompt


def _rms_norm_f64(self, x):
    v = x.pow(2).mean(-1, keepdim=True)
    return self.weight * (x * torch.rsqrt(v + self.variance_epsilon))


@pytest.fixture
def model64(tiny_model, monkeypatch):
    """The tiny model in float64. Qwen2's RMSNorm casts to float32 whatever the input dtype
    (and its backward rounds gradients to float32); it is patched to stay in float64 so the
    two paths are compared at float64 precision, not float32's."""
    monkeypatch.setattr(modeling_qwen2.Qwen2RMSNorm, "forward", _rms_norm_f64)
    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float64)
    model.train()
    return model


def make_rollout(vocab: int, pad: int, seed: int = 0) -> Rollout:
    """3 prompts of different lengths (left padding) x 3 completions of different lengths
    (right padding, one of a single token)."""
    g = torch.Generator().manual_seed(seed)
    width = max(map(len, PROMPTS))
    pids = torch.full((3, width), pad)
    pmask = torch.zeros((3, width), dtype=torch.long)
    for i, p in enumerate(PROMPTS):
        pids[i, width - len(p) :], pmask[i, width - len(p) :] = torch.tensor(p), 1
    T = max(LENGTHS)
    cmask = (torch.arange(T)[None, :] < torch.tensor(LENGTHS)[:, None]).long()
    cids = torch.randint(0, vocab, (len(LENGTHS), T), generator=g).masked_fill(cmask == 0, pad)
    B = len(LENGTHS)
    return Rollout(
        pids,
        pmask,
        cids,
        cmask,
        torch.zeros(B, T),
        torch.zeros(B, dtype=torch.bool),
        torch.arange(B) // 3,
    )


class Calls:
    """Counts decoder calls, to show which path ran."""

    def __init__(self, model):
        self.n = 0
        model.get_decoder().register_forward_hook(lambda *_: setattr(self, "n", self.n + 1))


def run_path(monkeypatch, model, ro, threshold, temperature=1.0, **loss_kw):
    """Log-probs, entropies, loss and every parameter's gradient along one path."""
    monkeypatch.setattr(logprobs, "SHARE_MIN_SAVED_TOKENS", threshold)
    model.zero_grad(set_to_none=True)
    logp, ent = logprobs.completion_logprobs(model, ro, temperature, 4, entropy=True)
    loss = None
    if loss_kw:
        mask = ro.completion_mask.to(logp.dtype)
        term = clipped_ratio(logp, loss_kw["old"], loss_kw["adv"], mask, 0.2, 0.28)
        loss, _ = objective_loss(
            term,
            mask,
            loss_kw["aggregation"],
            loss_kw["norm"],
            logp=logp,
            ref_logp=loss_kw["ref"],
            kl_coef=loss_kw["kl_coef"],
            entropy=ent,
            entropy_coef=0.01,
        )
        loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return logp.detach(), ent.detach(), loss, grads


def assert_same(a, b):
    """float64 runs of the same arithmetic in another order (a shared prompt's cache vs the
    whole sequence): ~1e-15 relative per op; gradients, summed over positions and layers,
    get 1e-10."""
    torch.testing.assert_close(a[0], b[0], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(a[1], b[1], rtol=1e-12, atol=1e-12)
    if a[2] is not None:
        torch.testing.assert_close(a[2], b[2], rtol=1e-12, atol=1e-14)
    assert a[3].keys() == b[3].keys()
    for n in a[3]:
        torch.testing.assert_close(a[3][n], b[3][n], rtol=1e-10, atol=1e-12, msg=n)


def loss_inputs(ro, aggregation, kl_coef, seed=1):
    g = torch.Generator().manual_seed(seed)
    mask = ro.completion_mask.double()
    noise = 0.3 * torch.randn(mask.shape, generator=g, dtype=torch.float64)
    return {
        "adv": torch.randn(ro.size, generator=g, dtype=torch.float64),
        "noise": noise,
        "aggregation": aggregation,
        "kl_coef": kl_coef,
        "norm": Normaliser.of(mask, mask.shape[1]),
    }


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
@pytest.mark.parametrize("kl_coef", [0.0, 0.1])
def test_shared_prompt_equals_repeated_prompt(model64, monkeypatch, aggregation, kl_coef):
    ro = make_rollout(model64.config.vocab_size, model64.config.pad_token_id)
    calls = Calls(model64)
    with torch.no_grad():  # old and reference log-probs: the policy before an update
        base, _ = logprobs.completion_logprobs(model64, ro, 1.0, 4)
    kw = loss_inputs(ro, aggregation, kl_coef)
    mask = ro.completion_mask.double()
    kw["old"] = (base + kw["noise"]) * mask  # ratios away from 1: some tokens clip
    kw["ref"] = (base - kw["noise"].flip(0)) * mask if kl_coef else None
    calls.n = 0
    shared = run_path(monkeypatch, model64, ro, SHARE, **kw)
    assert calls.n == 2  # the prompts' pass, then the completions' on their cache
    calls.n = 0
    repeated = run_path(monkeypatch, model64, ro, REPEAT, **kw)
    assert calls.n == 1
    assert_same(shared, repeated)
    assert max(g.abs().max() for g in shared[3].values()) > 1e-3  # gradients are not all zero


@pytest.mark.parametrize("threshold", [SHARE, REPEAT], ids=["shared", "repeated"])
def test_grouped_query_sdpa_is_the_same_attention_without_copies(model64, monkeypatch, threshold):
    """On the CPU the log-prob passes run SDPA's grouped-query path (no key/value head
    repeated per query head) except where backward replays the layers or the user set the
    switch; the same log-probs, loss and gradients as transformers' repeated heads."""
    import inspect

    from transformers.integrations import sdpa_attention

    if "TRANSFORMERS_SDPA_FORCE_GQA" not in inspect.getsource(sdpa_attention.use_gqa_in_sdpa):
        pytest.skip("this transformers has no TRANSFORMERS_SDPA_FORCE_GQA switch")
    monkeypatch.delenv("TRANSFORMERS_SDPA_FORCE_GQA", raising=False)
    ro = make_rollout(model64.config.vocab_size, model64.config.pad_token_id, seed=2)
    kw = loss_inputs(ro, "token_mean", 0.1)
    kw["old"], kw["ref"] = kw["noise"] * ro.completion_mask, -kw["noise"] * ro.completion_mask
    repeats = []
    real = sdpa_attention.repeat_kv
    monkeypatch.setattr(sdpa_attention, "repeat_kv", lambda *a: repeats.append(1) or real(*a))
    grouped = run_path(monkeypatch, model64, ro, threshold, **kw)
    assert not repeats
    assert "TRANSFORMERS_SDPA_FORCE_GQA" not in os.environ  # unset again after the pass
    with monkeypatch.context() as m:
        m.setenv("TRANSFORMERS_SDPA_FORCE_GQA", "0")  # the user's choice stands
        assert_same(grouped, run_path(monkeypatch, model64, ro, threshold, **kw))
    assert repeats  # the model's own path repeats them
    repeats.clear()
    model64.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model64.train()
    # checkpointed: the repeated layout, forward on the model's own path (backward replays it
    # outside the switch; had the forward taken the grouped path, checkpoint would raise)
    assert_same(run_path(monkeypatch, model64, ro, threshold, **kw), grouped)
    assert repeats


def test_critic_values_share_the_prompt_as_the_policy_does(model64, monkeypatch):
    """PPO's value model runs its decoder as the policy's log-probs do: each prompt once
    under its completions gives the values and gradients of the prompt repeated, 0 on
    padding, with two decoder calls instead of one over three times the prompt tokens."""
    from grpo_core.model.value import ValueModel

    ro = make_rollout(model64.config.vocab_size, model64.config.pad_token_id, seed=4)
    critic = ValueModel(model64)
    torch.nn.init.normal_(critic.head.weight, generator=torch.Generator().manual_seed(5))
    calls = Calls(model64)
    critic.decoder.register_forward_hook(lambda *_: setattr(calls, "n", calls.n + 1))
    target = torch.randn(ro.completion_mask.shape, dtype=torch.float64)

    def path(threshold):
        monkeypatch.setattr(logprobs, "SHARE_MIN_SAVED_TOKENS", threshold)
        critic.zero_grad(set_to_none=True)
        calls.n = 0
        values = critic(ro)
        ((values - target) ** 2 * ro.completion_mask).sum().backward()
        grads = {n: p.grad.clone() for n, p in critic.named_parameters() if p.grad is not None}
        return values.detach(), calls.n, grads

    (shared, n_shared, g_shared), (repeated, n_repeated, g_repeated) = path(SHARE), path(REPEAT)
    assert (n_shared, n_repeated) == (2, 1)
    assert shared.dtype == torch.float64 and shared.abs().max() > 1e-3
    assert (shared[ro.completion_mask == 0] == 0).all()
    torch.testing.assert_close(shared, repeated, rtol=1e-12, atol=1e-12)
    assert g_shared.keys() == g_repeated.keys() and len(g_shared) > 2
    for n in g_shared:
        torch.testing.assert_close(g_shared[n], g_repeated[n], rtol=1e-10, atol=1e-12, msg=n)


def test_micro_batches_of_some_prompts_at_temperature(model64, monkeypatch):
    """A micro-batch holds some groups; ``group`` indexes the whole prompt tensor."""
    ro = make_rollout(model64.config.vocab_size, model64.config.pad_token_id, seed=3)
    kw = loss_inputs(ro, "token_mean", 0.05)
    for rows in (torch.arange(3, 9), torch.tensor([0, 1, 2, 6, 7, 8])):
        sub = ro.rows(rows)
        sub_kw = {**kw, "adv": kw["adv"][rows], "norm": kw["norm"]}
        with torch.no_grad():
            base, _ = logprobs.completion_logprobs(model64, sub, 0.7, 4)
        mask = sub.completion_mask.double()
        sub_kw["old"] = (base + kw["noise"][rows]) * mask
        sub_kw["ref"] = (base - kw["noise"][rows].flip(0)) * mask
        assert_same(
            run_path(monkeypatch, model64, sub, SHARE, 0.7, **sub_kw),
            run_path(monkeypatch, model64, sub, REPEAT, 0.7, **sub_kw),
        )


def test_reference_and_recompute_without_gradients(model64, monkeypatch):
    ro = make_rollout(model64.config.vocab_size, model64.config.pad_token_id, seed=5)
    out = []
    for threshold in (SHARE, REPEAT):
        monkeypatch.setattr(logprobs, "SHARE_MIN_SAVED_TOKENS", threshold)
        ref = logprobs.reference_logprobs(model64, ro, 1.0, 3, contextlib.nullcontext())
        with torch.no_grad():
            old, ent = logprobs.completion_logprobs(model64, ro, 1.0, 3, entropy=True)
        assert not ref.requires_grad and not old.requires_grad
        out.append((ref, old, ent))
    for a, b in zip(*out):  # float64, bounds as in assert_same
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    assert (out[0][0] * ro.completion_mask == out[0][0]).all()  # padding stays 0


def test_single_token_completions(model64, monkeypatch):
    ro = make_rollout(model64.config.vocab_size, model64.config.pad_token_id)
    ro = Rollout(
        ro.prompt_ids,
        ro.prompt_mask,
        ro.completion_ids[:, :1],
        ro.completion_mask[:, :1],
        ro.logprobs[:, :1],
        ro.truncated,
        ro.group,
    )
    kw = loss_inputs(ro, "seq_mean_token_mean", 0.0)
    kw["old"], kw["ref"] = kw["noise"][:, :1], None
    assert_same(
        run_path(monkeypatch, model64, ro, SHARE, **kw),
        run_path(monkeypatch, model64, ro, REPEAT, **kw),
    )


def test_empty_completions_keep_a_graph(model64, monkeypatch):
    """No completion tokens at all: [B, 0] log-probs whose loss still backpropagates."""
    ro = make_rollout(model64.config.vocab_size, model64.config.pad_token_id)
    ro = Rollout(
        ro.prompt_ids,
        ro.prompt_mask,
        ro.completion_ids[:, :0],
        ro.completion_mask[:, :0],
        ro.logprobs[:, :0],
        ro.truncated,
        ro.group,
    )
    for threshold in (SHARE, REPEAT):
        monkeypatch.setattr(logprobs, "SHARE_MIN_SAVED_TOKENS", threshold)
        logp, ent = logprobs.completion_logprobs(model64, ro, 1.0, 4, entropy=True)
        assert logp.shape == ent.shape == (ro.size, 0)
        (logp.sum() + ent.sum()).backward()


def test_when_prompts_are_shared(model64, monkeypatch):
    ro = make_rollout(model64.config.vocab_size, model64.config.pad_token_id)
    decoder = model64.get_decoder()
    saved = (ro.size - 3) * ro.prompt_ids.shape[1]  # 6 completions x 7 prompt tokens
    monkeypatch.setattr(logprobs, "SHARE_MIN_SAVED_TOKENS", saved)
    assert logprobs.share_prompts(decoder, ro)
    monkeypatch.setattr(logprobs, "SHARE_MIN_SAVED_TOKENS", saved + 1)
    assert not logprobs.share_prompts(decoder, ro)
    one_each = ro.rows(torch.tensor([0, 3, 6]))  # G = 1: nothing to share
    monkeypatch.setattr(logprobs, "SHARE_MIN_SAVED_TOKENS", 1)
    assert not logprobs.share_prompts(decoder, one_each)


def test_gradient_checkpointing_falls_back_to_repeating(model64, monkeypatch):
    ro = make_rollout(model64.config.vocab_size, model64.config.pad_token_id)
    kw = loss_inputs(ro, "token_mean", 0.1)
    kw["old"], kw["ref"] = kw["noise"] * ro.completion_mask, -kw["noise"] * ro.completion_mask
    plain = run_path(monkeypatch, model64, ro, SHARE, **kw)
    model64.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model64.train()
    decoder = model64.get_decoder()
    monkeypatch.setattr(logprobs, "SHARE_MIN_SAVED_TOKENS", SHARE)
    assert not logprobs.share_prompts(decoder, ro)  # the checkpointed layers drop the cache
    with torch.no_grad():
        assert logprobs.share_prompts(decoder, ro)  # nothing is checkpointed without grads
    assert_same(run_path(monkeypatch, model64, ro, SHARE, **kw), plain)


def test_lora_adapters_get_the_same_gradients(model64, monkeypatch):
    pytest.importorskip("peft", reason="LoRA needs peft")
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(0)
    model = get_peft_model(
        model64,
        LoraConfig(r=4, lora_alpha=8, init_lora_weights=False, target_modules=["q_proj", "v_proj"]),
    )
    ro = make_rollout(model64.config.vocab_size, model64.config.pad_token_id, seed=7)
    kw = loss_inputs(ro, "seq_mean_token_sum_norm", 0.1)
    kw["old"], kw["ref"] = kw["noise"] * ro.completion_mask, -kw["noise"] * ro.completion_mask
    shared = run_path(monkeypatch, model, ro, SHARE, **kw)
    repeated = run_path(monkeypatch, model, ro, REPEAT, **kw)
    assert shared[3] and all("lora_" in n for n in shared[3])  # only adapters train
    assert_same(shared, repeated)


def test_generator_fast_paths_give_the_same_completions(tiny_model, monkeypatch):
    """The hf generator's prompt cache with room made once, the decoder and head called
    directly and the ready-made decode mask change nothing: the same tokens and log-probs
    as growing the cache by concatenation through the whole model."""
    tok = AutoTokenizer.from_pretrained(tiny_model)
    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    prompts = [tok(p, add_special_tokens=False)["input_ids"] for p in ["1+2=", "77+7=", "3"]]
    sp = SamplingParams(max_new_tokens=9, temperature=0.9)

    def rollout():
        gen = grpo_core.create("generator", "hf")
        gen.setup(model, tok, torch.device("cpu"))
        return gen, gen.generate(prompts, 4, sp, seed=5)

    fast_gen, fast = rollout()
    assert fast_gen.decoder is not None and fast_gen.mask_key == "full_attention"
    monkeypatch.setattr(hf_generator, "_make_room", lambda cache, room: None)
    monkeypatch.setattr(hf_generator, "_direct_parts", lambda m: (None, None))
    monkeypatch.setattr(hf_generator, "_prepared_mask_key", lambda m: None)
    _, plain = rollout()
    assert torch.equal(fast.completion_ids, plain.completion_ids)
    assert torch.equal(fast.completion_mask, plain.completion_mask)
    # the same arithmetic in another order (SDPA's prepared mask, the cache grown in place):
    # float32 log-softmax of values up to ~10 differs by a few ulps, ~1e-6, with 10x room
    torch.testing.assert_close(fast.logprobs, plain.logprobs, rtol=0, atol=1e-5)
    assert not fast.logprobs.is_inference()  # usable in a training graph
    monkeypatch.undo()
    small = hf_generator._InPlace  # room for fewer tokens than asked: it makes more

    def stingy(cache, room):
        for layer in cache.layers:
            layer.update = small(layer, 1)

    monkeypatch.setattr(hf_generator, "_make_room", stingy)
    assert torch.equal(rollout()[1].completion_ids, fast.completion_ids)


def test_shared_head_counts_the_common_opening():
    """Left-padded prompts: the count of opening tokens all share, each keeping one of its
    own; a prompt that is another's opening caps it."""
    pad = 0
    rows = [[5, 6, 7, 8, 9], [5, 6, 7, 1], [5, 6, 7, 8, 2, 3]]
    ids, mask = _left_pad(rows, pad)
    assert hf_generator._shared_head(ids, mask) == 3
    ids, mask = _left_pad([[5, 6, 7], [5, 6, 7, 8, 9]], pad)
    assert hf_generator._shared_head(ids, mask) == 2  # [5, 6, 7] keeps its 7
    ids, mask = _left_pad([[4, 6], [5, 6]], pad)
    assert hf_generator._shared_head(ids, mask) == 0
    ids, mask = _left_pad([[5, 6], [5, 6]], pad)
    assert hf_generator._shared_head(ids, mask) == 1


def _left_pad(rows, pad):
    width = max(map(len, rows))
    ids = torch.full((len(rows), width), pad)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, width - len(r) :], mask[i, width - len(r) :] = torch.tensor(r), 1
    return ids, mask


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_shared_opening_prefilled_once_gives_the_same_completions(tiny_model, temperature):
    """Prompts opening with the same system text (head prefilled once, tails after it, padding
    between) give the same tokens and log-probs as the plain batched prefill; the shared path
    is shown to run by its two prefill calls' shapes."""
    tok = AutoTokenizer.from_pretrained(tiny_model)
    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    system = "Add the two numbers and give the sum.\n"
    questions = ["1+2=", "77+7=", "3+40=", "9+9+9="]
    prompts = [tok(system + q, add_special_tokens=False)["input_ids"] for q in questions]
    sp = SamplingParams(max_new_tokens=9, temperature=temperature or 1.0, greedy=temperature == 0)
    widths = []
    model.get_decoder().register_forward_hook(
        lambda m, args, kw, out: widths.append(kw["input_ids"].shape), with_kwargs=True
    )

    def rollout(share_min):
        gen = grpo_core.create("generator", "hf", {"share_min": share_min})
        gen.setup(model, tok, torch.device("cpu"))
        widths.clear()  # setup's own check of the decoder left out
        return gen.generate(prompts, 3, sp, seed=5), list(widths[:2])

    shared, calls = rollout(16)
    assert calls[0] == (1, len(system))  # the head, once (byte tokens: one per character)
    assert calls[1][0] == len(questions)
    plain, calls = rollout(10**9)
    assert calls[0] == (len(questions), max(map(len, prompts)))
    assert torch.equal(shared.completion_ids, plain.completion_ids)
    assert torch.equal(shared.completion_mask, plain.completion_mask)
    # the same sums in other GEMM shapes (one row, then the tails): float32 log-softmax of
    # values up to ~10 differs by a few ulps, ~1e-6, with 10x room
    torch.testing.assert_close(shared.logprobs, plain.logprobs, rtol=0, atol=1e-5)
