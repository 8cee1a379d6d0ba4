"""What a step's phases cost in model arithmetic and memory traffic, from the model's shape
and the token counts alone: the work a roofline divides by the machine's peak
(bench/roofline.py). Pure functions; a decoder-only transformer with grouped-query attention
and a gated MLP (Llama, Qwen2, SmolLM2).

Conventions (those of the usual model-FLOPs counts): a multiply-add is 2 FLOPs; a
backward costs twice its forward; norms, activations, softmax and rotary embeddings are
left out (elementwise, a few per cent at these widths); attention counts the causal part
only (the keys a query may see), as an ideal kernel would compute.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Shape:
    """A decoder's sizes: hidden H, layers, query heads, key/value heads, MLP width I,
    vocabulary V; ``tied``: the LM head shares the embedding; ``bytes_per_param``: 4 for
    float32 weights. The roofline counts its work and ``grpo plan-memory`` its memory."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    tied: bool = False
    bytes_per_param: int = 4

    @classmethod
    def of(cls, config) -> Shape:
        """From a transformers model config."""
        return cls(
            config.hidden_size,
            config.num_hidden_layers,
            config.num_attention_heads,
            getattr(config, "num_key_value_heads", None) or config.num_attention_heads,
            config.intermediate_size,
            config.vocab_size,
            bool(getattr(config, "tie_word_embeddings", False)),
        )

    @property
    def kv_width(self) -> int:
        """Width of the keys (and of the values): kv heads x head size."""
        return self.kv_heads * (self.hidden // self.heads)

    @property
    def layer_params(self) -> int:
        """Weights of one layer's matrices: q and o (H x H), k and v (H x kv), gate, up and
        down (H x I)."""
        H = self.hidden
        return 2 * H * H + 2 * H * self.kv_width + 3 * H * self.intermediate

    @property
    def matrix_params(self) -> int:
        """Matrix weights of the decoder and the LM head (tied or not, read once): what a
        token's forward pass multiplies by."""
        return self.layers * self.layer_params + self.hidden * self.vocab

    def params(self) -> int:
        """Every parameter (Qwen2's layout: q, k, v biases, two norms a layer, the final
        norm; the LM head counted again unless tied): what a model's memory holds."""
        H, kv = self.hidden, self.kv_width
        layer = self.layer_params + H + 2 * kv + 2 * H
        return self.vocab * H * (1 if self.tied else 2) + self.layers * layer + H

    def lora_params(self, rank: int) -> int:
        """Adapters on q, k, v, o: r * (in + out) each, per layer."""
        H, kv = self.hidden, self.kv_width
        return self.layers * rank * ((H + H) + 2 * (H + kv) + (H + H))


def causal_pairs(context: int, length: int) -> int:
    """Query-key pairs of ``length`` new tokens that follow ``context`` earlier ones, each
    seeing every earlier token and itself: sum over t = 1..length of (context + t)."""
    return length * context + length * (length + 1) // 2


def forward_flops(shape: Shape, tokens: int, pairs: int, head_tokens: int) -> float:
    """FLOPs of one forward pass over ``tokens`` positions whose attention covers ``pairs``
    query-key pairs, with the LM head at ``head_tokens`` positions: the layers' matrices
    (2 x params per token and layer), attention (QK^T and AV: 2 x 2 x H per pair per layer) and the
    head (2 x H x V per position)."""
    layers = (2.0 * shape.layer_params * tokens + 4.0 * shape.hidden * pairs) * shape.layers
    return layers + 2.0 * shape.hidden * shape.vocab * head_tokens


def logprob_pass_flops(
    shape: Shape,
    prompts: Sequence[int],
    completions: Sequence[Sequence[int]],
    backward: bool = False,
) -> float:
    """Useful FLOPs of a log-prob pass (reference, old log-probs; ``backward``: the policy's
    training pass, three times its forward) over P prompts of ``prompts[p]`` tokens and the
    completions ``completions[p]`` of each: each prompt run once (prompt sharing), each
    completion's tokens but the last fed after it, the head at every completion token.
    Padding is not in it (``padding_flops``)."""
    tokens = pairs = head = 0
    for lp, lengths in zip(prompts, completions):
        tokens += lp
        pairs += causal_pairs(0, lp)
        for n in lengths:
            fed = max(n - 1, 0)
            tokens, head = tokens + fed, head + n
            pairs += causal_pairs(lp, fed)
    return forward_flops(shape, tokens, pairs, head) * (3.0 if backward else 1.0)


def padding_flops(shape: Shape, positions: int, backward: bool = False) -> float:
    """FLOPs spent on ``positions`` padding positions by the layers' matrices (attention
    to and from them left out: a lower bound)."""
    return 2.0 * shape.layer_params * positions * shape.layers * (3.0 if backward else 1.0)


def generation_flops(shape: Shape, prompts: Sequence[int], completions: Sequence[Sequence[int]]):
    """FLOPs of sampling: each prompt's prefill once (its last position through the head),
    then each completion token but the last decoded on the prompt's and its own keys, with
    the head at every step."""
    tokens = pairs = head = 0
    for lp, lengths in zip(prompts, completions):
        tokens, pairs, head = tokens + lp, pairs + causal_pairs(0, lp), head + 1
        for n in lengths:
            fed = max(n - 1, 0)
            tokens, head = tokens + fed, head + fed
            pairs += causal_pairs(lp, fed)
    return forward_flops(shape, tokens, pairs, head)


def decode_bytes(shape: Shape, prompts: Sequence[int], completions: Sequence[Sequence[int]]):
    """Bytes a batched decode must read from memory at least: every weight once per forward
    (the prefill and each decode step: as many as the longest completion has tokens; all
    completions are decoded together), and
    each live completion's keys and values (its prompt's and its own so far) at each of its
    steps. The memory-bandwidth bound of generation is this over the bandwidth."""
    steps = max((max(c, default=0) for c in completions), default=0)
    kv_per_token = 2 * shape.kv_width * shape.layers * shape.bytes_per_param
    kv = 0
    for lp, lengths in zip(prompts, completions):
        for n in lengths:
            kv += causal_pairs(lp, max(n - 1, 0)) - max(n - 1, 0)  # keys before each step
    return steps * shape.matrix_params * shape.bytes_per_param + kv * kv_per_token


def decode_products(shape: Shape, rows: int) -> dict[tuple[int, int, int], int]:
    """One decode step's matrix products, ``(m, k, n)`` -> how many of that shape: each
    layer's query and output projections ([rows, H] x [H, H]), key and value ones
    ([rows, H] x [H, kv width]), the MLP's gate and up ([rows, H] x [H, M]) and down
    ([rows, M] x [M, H]); the head once ([rows, H] x [H, V])."""
    H, kv, M, L = shape.hidden, shape.kv_width, shape.intermediate, shape.layers
    out: dict[tuple[int, int, int], int] = {}
    for mkn, count in (
        ((rows, H, H), 2 * L),
        ((rows, H, kv), 2 * L),
        ((rows, H, M), 2 * L),
        ((rows, M, H), L),
        ((rows, H, shape.vocab), 1),
    ):
        out[mkn] = out.get(mkn, 0) + count  # kv width H (no GQA): one shape with q and o
    return out


def products_rate(products: dict[tuple[int, int, int], int], gflops: dict) -> float:
    """GFLOP/s of a set of matrix products if each ran at the rate measured for its shape
    (``gflops`` maps ``(m, k, n)`` to GFLOP/s): their FLOPs over the sum of their times, a
    FLOP-weighted harmonic mean of the rates."""
    work = {mkn: 2 * mkn[0] * mkn[1] * mkn[2] * count for mkn, count in products.items()}
    return sum(work.values()) / sum(w / gflops[mkn] for mkn, w in work.items())
