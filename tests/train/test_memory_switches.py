"""LoRA, gradient checkpointing, chunked generation, reference placement."""

from __future__ import annotations

import contextlib
import copy
import json
import os

import pytest
import torch
from grpo_core_plugins.objectives import clipped_ratio
from helpers import make_config
from safetensors.torch import load_file

import grpo_core
from grpo_core import config
from grpo_core.loss.losses import Normaliser, objective_loss
from grpo_core.model.casts import stored_as_computed
from grpo_core.model.logprobs import completion_logprobs, reference_logprobs
from grpo_core.rollout import SamplingParams
from grpo_core.store.models import load_model, load_tokenizer
from grpo_core.trainer import train

DIGIT = {"name": "format", "options": {"tags": [], "patterns": ["[0-9]"]}}
CPU = torch.device("cpu")


def model_cfg(path, **kw):
    return config.section("model", {"name_or_path": path, **kw})


def rollout(model, tokenizer, n=4, batch_size=None, seed=11):
    gen = grpo_core.create("generator", "hf")
    gen.setup(model, tokenizer, CPU)
    ids = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in ["1+2=", "7+7=", "30"]]
    return gen.generate(ids, n, SamplingParams(max_new_tokens=6, batch_size=batch_size), seed=seed)


def test_lora_trains_only_adapters_and_reference_is_the_base(tiny_model, addition_data, tmp_path):
    pytest.importorskip("peft", reason="LoRA needs the lora extra (peft)")
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    lora = {"r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]}
    cfg = config.validate(
        make_config(
            tiny_model,
            addition_data,
            str(tmp_path / "run"),
            reward=DIGIT,
            model={"name_or_path": tiny_model, "lora": {**lora, "save_merged": True}},
            kl={"name": "fixed", "options": {"coef": 0.05}},
            sampling={"group_size": 8, "max_new_tokens": 6},
            train={"steps": 3, "prompts_per_step": 4},
            optimizer={"lr": 5e-2},
            output={"dir": str(tmp_path / "run"), "checkpoint_every": 3, "progress": False},
        )
    )
    summary = train(cfg)
    assert summary["reference_model"]
    step = tmp_path / "run" / "checkpoints" / "step-00000003"
    assert (step / "adapter_model.safetensors").exists()  # loadable with PeftModel
    ckpt = load_file(str(step / "master.safetensors"))  # what resume reads
    assert ckpt and all("lora_" in k for k in ckpt)  # only adapters were trainable
    assert any(k.endswith("lora_B.default.weight") and ckpt[k].abs().sum() > 0 for k in ckpt)
    final = str(tmp_path / "run" / "final")
    assert os.path.exists(os.path.join(final, "adapter_model.safetensors"))
    base = AutoModelForCausalLM.from_pretrained(tiny_model)
    base_weights = {k: v.clone() for k, v in base.state_dict().items()}
    peft_model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model), final)
    for k, v in peft_model.get_base_model().state_dict().items():  # base bitwise unchanged
        plain = k.replace(".base_layer", "")
        if "lora_" not in k and plain in base_weights:
            assert torch.equal(v, base_weights[plain]), k
    tok = load_tokenizer(model_cfg(tiny_model))
    ro = rollout(base, tok)
    expected = completion_logprobs(base, ro, 1.0, 64)[0]
    ref = reference_logprobs(peft_model, ro, 1.0, 64, contextlib.nullcontext())
    # the adapter disabled runs the base layers through peft's wrappers: the same float32
    # arithmetic, at most a few ulps of log-probs up to ~10 apart (~1e-6)
    torch.testing.assert_close(ref, expected, rtol=0, atol=1e-6)
    adapted = completion_logprobs(peft_model, ro, 1.0, 64)[0]
    assert (adapted - expected).abs().max() > 1e-4  # the adapter itself does change pi
    merged = AutoModelForCausalLM.from_pretrained(os.path.join(final, "merged"))
    # merging adds B@A*scale into W once (float32 rounding of W, ~1e-7 relative); log-probs
    # are sums over a 64-wide hidden state and a softmax: ~1e-6, with 10x room
    torch.testing.assert_close(
        completion_logprobs(merged, ro, 1.0, 64)[0], adapted, rtol=1e-4, atol=1e-5
    )


def test_a_reference_stored_in_bf16_gives_the_same_logprobs_under_autocast(tiny_model):
    """stored_as_computed: the frozen reference's linear weights and biases stored in autocast's dtype.
    Autocast would cast each float32 weight to bf16 at every call (round to nearest, as
    ``.to`` does), so the stored copy is the very tensor the matrix product gets: the
    log-probs are bitwise the float32 reference's. The embedding (tied to the output head
    here) and the norms keep float32, as autocast computes them."""
    tok = load_tokenizer(model_cfg(tiny_model))
    policy = load_model(model_cfg(tiny_model), CPU)
    ro = rollout(policy, tok)
    bf16 = torch.autocast("cpu", dtype=torch.bfloat16)
    reference = copy.deepcopy(policy).eval().requires_grad_(False)
    expected = reference_logprobs(reference, ro, 1.0, 64, bf16)
    before = sum(p.nbytes for p in reference.parameters())
    assert stored_as_computed(reference, torch.autocast("cpu", enabled=False)) is reference
    assert {p.dtype for p in reference.parameters()} == {torch.float32}  # no autocast: kept
    stored_as_computed(reference, bf16)
    linear = [m for m in reference.modules() if type(m) is torch.nn.Linear]
    embedding = reference.get_input_embeddings().weight
    assert all(m.weight.dtype == torch.bfloat16 for m in linear if m.weight is not embedding)
    assert embedding.dtype == torch.float32
    assert all(p.dtype == torch.float32 for n, p in reference.named_parameters() if "norm" in n)
    matrices = sum(p.numel() for m in linear for p in m.parameters() if p is not embedding)
    assert sum(p.nbytes for p in reference.parameters()) == before - 2 * matrices
    assert torch.equal(reference_logprobs(reference, ro, 1.0, 64, bf16), expected)


def test_gradient_checkpointing_gives_the_same_gradients(tiny_model):
    tok = load_tokenizer(model_cfg(tiny_model))
    grads = []
    for gc in (False, True):
        model = load_model(model_cfg(tiny_model, gradient_checkpointing=gc), CPU)
        ro = rollout(model, tok)
        model.train()
        logp, ent = completion_logprobs(model, ro, 1.0, 16, entropy=True)
        adv = torch.linspace(-1, 1, ro.size)
        mask = ro.completion_mask.float()
        loss, _ = objective_loss(
            clipped_ratio(logp, ro.logprobs, adv, mask),
            mask,
            "token_mean",
            Normaliser.of(mask, mask.shape[1]),
            entropy=ent,
            entropy_coef=0.01,
        )
        loss.backward()
        on = getattr(model, "is_activation_checkpointing", None)
        assert (on if on is not None else model.is_gradient_checkpointing) == gc
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
    for n in grads[0]:  # recomputation is the same float32 ops; only kernel choice for the
        # recomputed shapes may differ (a few ulps: rtol 1e-5 is ~100 float32 ulps)
        torch.testing.assert_close(grads[0][n], grads[1][n], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("cap", [1, 3, 5])
def test_chunked_generation_matches_one_batch(tiny_model, cap):
    tok = load_tokenizer(model_cfg(tiny_model))
    model = load_model(model_cfg(tiny_model), CPU)
    whole = rollout(model, tok, n=4)
    parts = rollout(model, tok, n=4, batch_size=cap)
    assert torch.equal(whole.completion_ids, parts.completion_ids)
    assert torch.equal(whole.completion_mask, parts.completion_mask)
    assert torch.equal(whole.group, parts.group)
    # same tokens; batch size changes the matmul blocking, so float32 log-softmax differs by a
    # few ulps of values up to ~10 in size: ~1e-6, with 10x room
    torch.testing.assert_close(whole.logprobs, parts.logprobs, rtol=0, atol=1e-5)


def test_reference_on_cpu_trains(tiny_model, addition_data, tmp_path):
    cfg = config.validate(
        make_config(
            tiny_model,
            addition_data,
            str(tmp_path / "run"),
            reward=DIGIT,
            model={"name_or_path": tiny_model, "reference_device": "cpu"},
            kl={"name": "fixed", "options": {"coef": 0.1}},
            sampling={"group_size": 8, "max_new_tokens": 6},
            train={"steps": 2, "prompts_per_step": 4},
            optimizer={"lr": 1e-2},
        )
    )
    train(cfg)
    rows = [json.loads(x) for x in open(tmp_path / "run" / "metrics.jsonl")]
    assert rows[-1]["kl"] > 0


def test_quantization_needs_cuda(tiny_model):
    if torch.cuda.is_available():
        pytest.skip("CUDA present: QLoRA is exercised by the GPU-marked tests")
    with pytest.raises(grpo_core.UserError, match="need CUDA"):
        load_model(model_cfg(tiny_model, quantization="4bit"), CPU)
