"""``grpo plan-memory``: what one GRPO step needs in accelerator memory, next to PPO.

The estimate follows what this trainer allocates: weights, a frozen reference (none with
LoRA or at KL 0), gradients and AdamW's two moments for trainable weights (sharded under
ZeRO), the KV cache of G x prompts completions being generated, the chunked LM-head logits,
and the activations kept for backward. Peak = weights + reference + the largest phase
(generation, backward, optimizer step).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

from grpo_core.errors import UserError

PRESETS = {
    "qwen2.5-0.5b": dict(hidden=896, layers=24, heads=14, kv_heads=2, intermediate=4864,
                         vocab=151936, tied=True),
    "qwen2.5-1.5b": dict(hidden=1536, layers=28, heads=12, kv_heads=2, intermediate=8960,
                         vocab=151936, tied=True),
    "qwen2.5-7b": dict(hidden=3584, layers=28, heads=28, kv_heads=4, intermediate=18944,
                       vocab=152064, tied=False),
}
BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
GiB = 2**30


@dataclass
class Shape:
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    tied: bool

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.hidden // self.heads

    def params(self) -> int:
        H, kv, inter = self.hidden, self.kv_dim, self.intermediate
        layer = (H * H + H) + 2 * (H * kv + kv) + H * H + 3 * H * inter + 2 * H
        return self.vocab * H * (1 if self.tied else 2) + self.layers * layer + H

    def lora_params(self, rank: int) -> int:
        """Adapters on q, k, v, o: r * (in + out) each, per layer."""
        H, kv = self.hidden, self.kv_dim
        return self.layers * rank * ((H + H) + 2 * (H + kv) + (H + H))


def load_shape(spec: str) -> Shape:
    if spec.lower() in PRESETS:
        return Shape(**PRESETS[spec.lower()])
    path = os.path.join(spec, "config.json") if os.path.isdir(spec) else spec
    if not os.path.exists(path):
        raise UserError(f"--model: {spec!r} is neither a preset ({', '.join(PRESETS)}) nor a "
                        f"config.json")
    with open(path, encoding="utf-8") as f:
        c = json.load(f)
    try:
        return Shape(c["hidden_size"], c["num_hidden_layers"], c["num_attention_heads"],
                     c.get("num_key_value_heads", c["num_attention_heads"]),
                     c["intermediate_size"], c["vocab_size"], c.get("tie_word_embeddings", False))
    except KeyError as exc:
        raise UserError(f"--model: {path} has no {exc.args[0]!r}") from exc


def plan(shape: Shape, group_size: int, prompts: int, prompt_tokens: int, new_tokens: int,
         micro_batch: int | None = None, dtype: str = "bfloat16", zero_stage: int = 0,
         gpus: int = 1, lora_rank: int = 0, gradient_checkpointing: bool = False,
         reference: bool = True, generation_batch: int | None = None,
         logprob_chunk: int = 1024) -> dict[str, float]:
    """Bytes per component for one device; ``total`` is the estimated peak."""
    wb = BYTES[dtype]
    P = shape.params()
    trainable = shape.lora_params(lora_rank) if lora_rank else P
    completions = prompts * group_size
    mb = min(micro_batch or completions, completions)
    seq = prompt_tokens + new_tokens
    H, inter, kv = shape.hidden, shape.intermediate, shape.kv_dim
    shard = {s: gpus if zero_stage >= s else 1 for s in (1, 2, 3)}
    out = {"weights": P * wb / shard[3]}
    out["reference"] = P * wb if reference and not lora_rank else 0.0
    out["gradients"] = trainable * wb / shard[2]
    opt_bytes = 12 if zero_stage else 2 * wb  # DeepSpeed: fp32 master + m + v; torch: m + v
    out["optimizer"] = trainable * opt_bytes / shard[1]
    gen = min(generation_batch or completions, completions)
    out["kv_cache"] = 2 * shape.layers * kv * seq * gen * wb
    chunk = min(logprob_chunk, mb * new_tokens)
    out["logits"] = 4 * chunk * shape.vocab * 4 + gen * shape.vocab * 4 * 2
    per_token_layer = 8 * H + 4 * inter + 4 * kv  # tensors a decoder layer keeps for backward
    tokens = mb * seq
    if gradient_checkpointing:
        out["activations"] = tokens * (shape.layers * H + per_token_layer) * wb
    else:
        out["activations"] = tokens * shape.layers * per_token_layer * wb
    generation = out["kv_cache"] + gen * shape.vocab * 4 * 2
    backward = out["gradients"] + out["activations"] + out["logits"]
    step = out["gradients"] + out["optimizer"] + trainable * 4 / shard[1]  # foreach temporaries
    out["total"] = out["weights"] + out["reference"] + max(generation, backward, step)
    critic = P * wb / shard[3] + P * wb / shard[2] + P * opt_bytes / shard[1] \
        + out["activations"]
    out["ppo_total"] = out["total"] + critic
    return out


def plan_cli(args) -> int:
    shape = load_shape(args.model)
    est = plan(shape, args.group_size, args.prompts, args.prompt_tokens, args.max_new_tokens,
               args.micro_batch, args.dtype, args.zero_stage, args.gpus, args.lora_rank,
               args.gradient_checkpointing,
               not (args.no_reference or args.reference_on_cpu), args.generation_batch_size)
    print(f"model: {args.model} ({shape.params() / 1e9:.2f} B parameters), {args.dtype}, "
          f"{args.prompts} prompts x G={args.group_size}, {args.prompt_tokens}+"
          f"{args.max_new_tokens} tokens, ZeRO-{args.zero_stage} on {args.gpus} GPU(s)"
          + (f", LoRA r={args.lora_rank}" if args.lora_rank else "")
          + (", gradient checkpointing" if args.gradient_checkpointing else ""))
    for k, v in est.items():
        if k not in ("total", "ppo_total"):
            print(f"  {k:12} {v / GiB:8.2f} GiB")
    print(f"  {'GRPO peak':12} {est['total'] / GiB:8.2f} GiB")
    print(f"  {'PPO peak':12} {est['ppo_total'] / GiB:8.2f} GiB  (same, plus a critic of the "
          f"same size with its gradients, optimizer and activations)")
    return 0
