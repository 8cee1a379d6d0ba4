"""Cascade decoding: a Llama-family decoder's decode steps as plain tensor functions over its
own weights, each prompt's keys and values kept once for all of its completions.

Why. A GRPO batch decodes G completions of each prompt. transformers' cache holds a prompt's
keys and values once per completion, and at every step each of the P x G rows reads its own
copy: at 150-token prompts and 64 new tokens that read is most of the cache, and SDPA over it
was a third of decoding on the CPU. Here a prompt's keys and values are read once per step by
the queries of all its completions together (one matrix product of G x heads-per-key queries
against them), the completions' own tokens per row, and one softmax over both parts, which is
the same attention: scores of the two parts side by side, one normalisation. The layer is
written out (RMSNorm, rotary embedding, grouped-query attention, gated MLP), so a step is a
few dozen tensor calls with no module dispatch, output records or mask construction.

Only for the structure written here (``supports``: the model type, plain ``nn.Linear``
projections, every layer full attention), and only after its logits on a few decode steps
equal the model's own forward (``agrees``, once at set-up); otherwise the generator decodes
through the model. CPU only: on a GPU the model's fused attention kernels were not measured
against it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

#: model types whose decoder layer is the one written out below
MODEL_TYPES = ("llama", "mistral", "qwen2")
_PROJECTIONS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj")
_MLP = ("mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")


def supports(model, decoder, head, device: torch.device) -> bool:
    """Whether cascade decoding applies: the written-out layer (:func:`written_out`), with
    float32 weights, not FSDP-sharded, on the CPU."""
    from torch.distributed.fsdp import FSDPModule

    if device.type != "cpu" or not written_out(model, decoder, head):
        return False
    if head.weight.dtype != torch.float32 or any(
        isinstance(m, FSDPModule) for m in model.modules()
    ):
        return False  # half types: scores formed before the float softmax; sharded weights
    return True


def written_out(model, decoder, head) -> bool:
    """Whether ``decoder``'s layers are the Llama-family layer written out here: its model
    type, full attention in every layer, plain (not adapter- or quantization-wrapped) linear
    projections and embedding (also what static-shape decoding, static.py, runs)."""
    cfg = model.config
    if decoder is None or head is None:
        return False
    if cfg.model_type not in MODEL_TYPES or getattr(cfg, "pretraining_tp", 1) != 1:
        return False
    if len(decoder.layers) != cfg.num_hidden_layers:
        return False
    if any(t != "full_attention" for t in getattr(cfg, "layer_types", None) or ()):
        return False
    if getattr(cfg, "sliding_window", None) and cfg.model_type == "mistral":
        return False
    if type(getattr(decoder, "embed_tokens", None)) is not nn.Embedding:
        return False
    if type(head) is not nn.Linear or not hasattr(decoder, "rotary_emb"):
        return False
    if not hasattr(getattr(decoder, "norm", None), "variance_epsilon"):
        return False
    return all(_plain_layer(layer) for layer in decoder.layers)


def _plain_layer(layer) -> bool:
    mods = dict(layer.named_modules())
    linear = all(type(mods.get(n)) is nn.Linear for n in _PROJECTIONS + _MLP)
    norms = all(
        hasattr(mods.get(n), "variance_epsilon")
        for n in ("input_layernorm", "post_attention_layernorm")
    )
    return linear and norms and hasattr(mods.get("mlp"), "act_fn")


def _rms(x: torch.Tensor, norm) -> torch.Tensor:
    """RMSNorm as transformers computes it: in float32, scaled in the input's dtype."""
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon)
    return norm.weight * xf.to(x.dtype)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """The rotary embedding of ``x`` [..., d] at its row's position (``cos``/``sin`` broadcast)."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], -1) * sin


def _linear(x: torch.Tensor, proj: nn.Linear) -> torch.Tensor:
    return F.linear(x, proj.weight, proj.bias)


class CascadeDecode:
    """The decode steps of one batch of rows after the prefill.

    ``keys``/``values``: per layer, the prompts' cached keys and values [P, kv, Lc, d] (rotary
    embedding applied, as transformers caches them); ``prefix_mask`` [P, Lc]: 1 on real
    tokens; ``prompt_of`` [R]: each row's prompt, ascending; ``room``: decode steps to come.
    """

    def __init__(self, decoder, head, keys, values, prefix_mask, prompt_of, room: int):
        self.decoder, self.head, self.layers = decoder, head, list(decoder.layers)
        attn = self.layers[0].self_attn
        self.d, self.scale = attn.head_dim, attn.scaling
        self.kv, self.g = keys[0].shape[1], decoder.config.num_attention_heads // keys[0].shape[1]
        self.keys, self.values = keys, values
        neg = torch.finfo(keys[0].dtype).min
        self.bias = keys[0].new_zeros(prefix_mask.shape)
        self.bias = self.bias.masked_fill_(prefix_mask == 0, neg)[:, None, None, :]
        R = prompt_of.shape[0]
        shape = (R, self.kv, room, self.d)
        self.own_k = [keys[0].new_empty(shape) for _ in self.layers]
        self.own_v = [keys[0].new_empty(shape) for _ in self.layers]
        self.t, self.prompt_of = 0, prompt_of
        self._layout(prompt_of)

    def _layout(self, prompt_of: torch.Tensor) -> None:
        """The grid of rows by prompt: [P, m] slots, m the most rows any prompt has; ``slot``
        maps rows to slots (None when every prompt has m rows in order: a reshape)."""
        counts = torch.bincount(prompt_of, minlength=self.keys[0].shape[0])
        self.m, R = int(counts.max()), prompt_of.shape[0]
        self.P = counts.shape[0]
        first = torch.cumsum(counts, 0) - counts
        slot = prompt_of * self.m + torch.arange(R, device=prompt_of.device) - first[prompt_of]
        self.slot = None if R == self.P * self.m else slot

    def _to_grid(self, x: torch.Tensor) -> torch.Tensor:
        """[R, kv, g, X] by row -> [P, kv, m * g, X] by prompt (empty slots zero)."""
        if self.slot is not None:
            full = x.new_zeros((self.P * self.m, *x.shape[1:]))
            x = full.index_copy_(0, self.slot, x)
        P, m, kv, g, X = self.P, self.m, *x.shape[1:]
        return x.view(P, m, kv, g, X).transpose(1, 2).reshape(P, kv, m * g, X)

    def _from_grid(self, y: torch.Tensor) -> torch.Tensor:
        """[P, kv, m * g, X] by prompt -> [R, kv, g, X] by row."""
        P, kv, _, X = y.shape
        y = y.view(P, kv, self.m, self.g, X).transpose(1, 2).reshape(P * self.m, kv, self.g, X)
        return y if self.slot is None else y.index_select(0, self.slot)

    def select(self, kept: torch.Tensor) -> None:
        """Keep only rows ``kept`` (ascending); prompts left with no row leave the prefix
        cache."""
        prompt_of = self.prompt_of[kept]
        self.own_k = [k[kept] for k in self.own_k]
        self.own_v = [v[kept] for v in self.own_v]
        alive = torch.bincount(prompt_of, minlength=self.P) > 0
        if not bool(alive.all()):
            self.keys = [k[alive] for k in self.keys]
            self.values = [v[alive] for v in self.values]
            self.bias = self.bias[alive]
            prompt_of = (torch.cumsum(alive, 0) - 1)[prompt_of]
        self.prompt_of = prompt_of
        self._layout(prompt_of)

    def _attend(self, i: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Layer ``i``'s attention of queries ``q`` [R, kv, g, d] over the prompt's keys
        and the row's own, the new ``k``/``v`` [R, kv, d] stored first; [R, kv * g * d]."""
        t = self.t + 1
        self.own_k[i][:, :, self.t], self.own_v[i][:, :, self.t] = k, v
        own_k, own_v = self.own_k[i][:, :, :t], self.own_v[i][:, :, :t]
        q = q * self.scale
        prefix = self._to_grid(q) @ self.keys[i].transpose(-1, -2) + self.bias
        scores = torch.cat([self._from_grid(prefix), q @ own_k.transpose(-1, -2)], -1)
        w = torch.softmax(scores.float(), -1).to(q.dtype)
        Lc = prefix.shape[-1]
        out = self._from_grid(self._to_grid(w[..., :Lc]) @ self.values[i])
        return (out + w[..., Lc:] @ own_v).reshape(q.shape[0], -1)

    def step(self, tok: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """Logits [R, V] after feeding token ``tok`` [R] at positions ``pos`` [R, 1]."""
        x = self.decoder.embed_tokens(tok)
        cos, sin = self.decoder.rotary_emb(x, pos)  # [R, 1, d]
        cos, sin = cos[:, :, None], sin[:, :, None]  # over [R, kv, g, d]
        R = tok.shape[0]
        for i, layer in enumerate(self.layers):
            a, h = layer.self_attn, _rms(x, layer.input_layernorm)
            q = _rotate(_linear(h, a.q_proj).view(R, self.kv, self.g, self.d), cos, sin)
            k = _rotate(_linear(h, a.k_proj).view(R, self.kv, self.d), cos[:, 0], sin[:, 0])
            v = _linear(h, a.v_proj).view(R, self.kv, self.d)
            x = x + _linear(self._attend(i, q, k, v), a.o_proj)
            mlp, h = layer.mlp, _rms(x, layer.post_attention_layernorm)
            gated = mlp.act_fn(_linear(h, mlp.gate_proj)) * _linear(h, mlp.up_proj)
            x = x + _linear(gated, mlp.down_proj)
        self.t += 1
        return self.head(_rms(x, self.decoder.norm))
