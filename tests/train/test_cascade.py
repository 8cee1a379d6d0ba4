"""Cascade decoding (plugins/generators/cascade.py): each prompt's keys and values read once for
all its completions, the decoder layer written out as tensor functions. Against the model's
own forward (the hf generator with ``cascade: false``), on a Qwen2-shaped model (biased
query/key/value projections, two query heads per key) and a Llama-shaped one (no biases,
three query heads per key, a head width that is not hidden / heads): the same completions,
log-probs equal to float32 rounding, with shared system openings, chunked batches whose
chunks split a prompt's completions, rows leaving the batch and the repetition penalty on.
Set up only where it applies, and a wrong layer is caught by the set-up check."""

from __future__ import annotations

import pytest
import torch
from grpo_core_plugins.generators import cascade
from grpo_core_plugins.generators.hf import HFGenerator
from transformers import AutoModelForCausalLM, AutoTokenizer

from grpo_core.rollout import SamplingParams
from grpo_core.tiny import build_tokenizer

CPU = torch.device("cpu")
SYSTEM = "Add the two numbers and give the sum.\n"
QUESTIONS = ["1+2=", "77+7=", "3+40=", "9+9+9="]


@pytest.fixture(scope="module")
def llama_model(tmp_path_factory) -> str:
    """A 2-layer Llama-shaped model: 6 query heads over 2 key heads, heads 16 wide on a
    48-wide residual, no biases."""
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = build_tokenizer()
    torch.manual_seed(1)
    cfg = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=48,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=6,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=256,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        bos_token_id=None,
    )
    path = str(tmp_path_factory.mktemp("llama") / "model")
    LlamaForCausalLM(cfg).save_pretrained(path)
    tok.save_pretrained(path)
    return path


def _generators(path: str, **options) -> tuple[HFGenerator, HFGenerator]:
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path)
    gens = []
    for on in (True, False):
        gen = HFGenerator(cascade=on, **options)
        gen.setup(model, tok, CPU)
        gens.append(gen)
    return gens[0], gens[1]


def _prompts(path: str, system: str) -> list[list[int]]:
    tok = AutoTokenizer.from_pretrained(path)
    return [tok(system + q, add_special_tokens=False)["input_ids"] for q in QUESTIONS]


CASES = {  # name: (generator options, sampling, system opening, EOS ids)
    "plain": ({}, SamplingParams(12, temperature=0.9), "", None),
    "shared opening": ({}, SamplingParams(12, temperature=1.0), SYSTEM, None),
    "chunks split groups": ({}, SamplingParams(10, temperature=0.9, batch_size=5), "", None),
    "rows leave": (
        {"check_every": 2},
        SamplingParams(16, temperature=1.3, repetition_penalty=1.2),
        SYSTEM,
        torch.arange(40),
    ),
    "greedy": ({}, SamplingParams(10, greedy=True), "", None),
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("which", ["qwen2", "llama"])
def test_cascade_gives_the_model_s_own_completions(
    which, case, tiny_model, llama_model, monkeypatch
):
    path = tiny_model if which == "qwen2" else llama_model
    options, sp, system, eos = CASES[case]
    on, off = _generators(path, **options)
    assert on.cascade and not off.cascade
    if eos is not None:  # forty end tokens: rows end early and leave the batch
        on.eos = off.eos = eos
    rows, prompts_left = [], []
    step, select = cascade.CascadeDecode.step, cascade.CascadeDecode.select

    def counted(self, tok, pos):
        rows.append(len(tok))
        return step(self, tok, pos)

    def selected(self, kept):
        select(self, kept)
        prompts_left.append(self.keys[0].shape[0])

    monkeypatch.setattr(cascade.CascadeDecode, "step", counted)
    monkeypatch.setattr(cascade.CascadeDecode, "select", selected)
    prompts = _prompts(path, system)
    mine = on.generate(prompts, 4, sp, seed=3)
    assert rows  # the cascade ran the decode steps
    if case == "rows leave":
        assert min(rows) < max(rows) and prompts_left and min(prompts_left) < len(prompts)
    theirs = off.generate(prompts, 4, sp, seed=3)
    assert torch.equal(mine.completion_ids, theirs.completion_ids)
    assert torch.equal(mine.completion_mask, theirs.completion_mask)
    assert torch.equal(mine.truncated, theirs.truncated)
    # the same attention summed in another order (two matrix products and one softmax
    # against SDPA's blocked kernel): float32 log-softmax of values up to ~10 differs by a
    # few ulps, ~1e-6, with 10x room
    torch.testing.assert_close(mine.logprobs, theirs.logprobs, rtol=0, atol=1e-5)


def test_cascade_is_set_up_only_where_it_applies(tiny_model, tmp_path):
    """Asked off, a model type it does not write out (GPT-2), or adapter-wrapped projections:
    the generator decodes through the model."""
    from transformers import GPT2Config, GPT2LMHeadModel

    tok = AutoTokenizer.from_pretrained(tiny_model)
    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    gen = HFGenerator(cascade=False)
    gen.setup(model, tok, CPU)
    assert not gen.cascade
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=len(tok), n_embd=32, n_layer=1, n_head=2))
    gen = HFGenerator()
    gen.setup(gpt2, tok, CPU)
    assert not gen.cascade
    assert gen.generate([[5, 6, 7]], 2, SamplingParams(4)).completion_ids.shape == (2, 4)
    peft = pytest.importorskip("peft", reason="LoRA needs peft")
    lora = peft.get_peft_model(model, peft.LoraConfig(r=2, target_modules=["q_proj"]))
    gen = HFGenerator()
    gen.setup(lora, tok, CPU)
    assert not gen.cascade


def test_a_wrong_layer_is_caught_by_the_set_up_check(tiny_model, monkeypatch):
    """With the rotary embedding left out of the written-out layer its logits differ from the
    model's: the set-up check refuses it and decoding stays the model's own."""
    monkeypatch.setattr(cascade, "_rotate", lambda x, cos, sin: x)
    on, off = _generators(tiny_model)
    assert not on.cascade
    prompts = _prompts(tiny_model, "")
    sp = SamplingParams(8, temperature=0.9)
    assert torch.equal(
        on.generate(prompts, 2, sp).completion_ids, off.generate(prompts, 2, sp).completion_ids
    )
    monkeypatch.undo()
    on, _ = _generators(tiny_model)
    assert on.cascade  # and the real layer passes it


def test_rows_map_to_their_prompts_slots():
    """Prompts with unequal numbers of rows (a chunk's edge, rows that left): the slot grid
    puts each row under its prompt, empty slots zero, and a round trip through it is exact."""
    keys = [torch.zeros(3, 2, 5, 4)]
    dec = cascade.CascadeDecode.__new__(cascade.CascadeDecode)
    dec.keys, dec.g = keys, 2
    prompt_of = torch.tensor([0, 0, 1, 1, 1, 2])
    dec._layout(prompt_of)
    assert dec.m == 3 and dec.slot.tolist() == [0, 1, 3, 4, 5, 6]
    x = torch.randn(6, 2, 2, 7)
    grid = dec._to_grid(x)
    assert grid.shape == (3, 2, 6, 7)
    assert torch.equal(grid[1, 1, 2:4], x[3, 1])  # row 3 is prompt 1's second row
    assert not grid[0, :, 4:].any()  # prompt 0 has two rows of three slots
    assert torch.equal(dec._from_grid(grid), x)
