"""The roofline's work counts (grpo_core.observe.flops) against counts done by hand on a
model small enough to count: H 4, 2 layers, 2 heads, 1 kv head (kv width 2), MLP 8, V 10."""

from __future__ import annotations

from transformers import Qwen2Config

from grpo_core.observe import flops

SHAPE = flops.Shape(hidden=4, layers=2, heads=2, kv_heads=1, intermediate=8, vocab=10)
# one prompt of 3 tokens, completions of 3 and 1 tokens
PROMPTS, COMPLETIONS = [3], [[3, 1]]


def test_shape_counts():
    # q, o: 16 each; k, v: 4 x 2 each; gate, up, down: 4 x 8 each -> 32 + 16 + 96
    assert SHAPE.kv_width == 2 and SHAPE.layer_params == 144
    assert SHAPE.matrix_params == 2 * 144 + 40
    config = Qwen2Config(
        hidden_size=4,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        intermediate_size=8,
        vocab_size=10,
    )
    assert flops.Shape.of(config) == SHAPE


def test_causal_pairs():
    assert flops.causal_pairs(0, 3) == 1 + 2 + 3
    assert flops.causal_pairs(3, 2) == 4 + 5
    assert flops.causal_pairs(5, 0) == 0


def test_logprob_pass():
    # fed: 3 prompt + 2 + 0 completion tokens; pairs: 6 (prompt) + 4 + 5; head at 3 + 1
    # layers 2 x 144 x 2 x 5 = 2880, attention 4 x 4 x 15 x 2 = 480, head 2 x 4 x 10 x 4 = 320
    assert flops.logprob_pass_flops(SHAPE, PROMPTS, COMPLETIONS) == 3680
    assert flops.logprob_pass_flops(SHAPE, PROMPTS, COMPLETIONS, backward=True) == 3 * 3680
    assert flops.padding_flops(SHAPE, 3) == 2 * 144 * 2 * 3
    assert flops.padding_flops(SHAPE, 3, backward=True) == 3 * 1728


def test_generation():
    # the same 5 positions and 15 pairs; the head at the prompt's last and 2 decode steps
    assert flops.generation_flops(SHAPE, PROMPTS, COMPLETIONS) == 2880 + 480 + 2 * 4 * 10 * 3


def test_decode_bytes():
    # weights (328 x 4 bytes) read by the prefill and 2 decode steps; the 3-token completion
    # reads 3 then 4 cached keys and values, 2 x 2 wide x 2 layers x 4 bytes = 32 bytes each
    assert flops.decode_bytes(SHAPE, PROMPTS, COMPLETIONS) == 3 * 328 * 4 + 7 * 32


def test_decode_products():
    # 3 rows: q and o 4 x 4 and k and v 4 x 2 per layer, gate and up 4 x 8, down 8 x 4, head
    assert flops.decode_products(SHAPE, 3) == {
        (3, 4, 4): 4,
        (3, 4, 2): 4,
        (3, 4, 8): 4,
        (3, 8, 4): 2,
        (3, 4, 10): 1,
    }
    # their multiply-adds per row are every matrix weight once
    per_row = sum(m * k * n * c for (m, k, n), c in flops.decode_products(SHAPE, 1).items())
    assert per_row == SHAPE.matrix_params
    # no GQA: the key and value projections join the query and output ones
    full = flops.Shape(hidden=4, layers=1, heads=2, kv_heads=2, intermediate=8, vocab=10)
    assert flops.decode_products(full, 1)[(1, 4, 4)] == 4


def test_products_rate_is_the_flop_weighted_harmonic_mean():
    products = {(1, 2, 3): 1, (1, 3, 2): 3}  # 12 and 36 FLOPs
    assert flops.products_rate(products, {(1, 2, 3): 5.0, (1, 3, 2): 5.0}) == 5.0
    # 48 FLOPs in 12 / 4 + 36 / 12 = 6 time units
    assert flops.products_rate(products, {(1, 2, 3): 4.0, (1, 3, 2): 12.0}) == 8.0
