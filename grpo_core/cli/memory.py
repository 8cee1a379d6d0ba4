"""``grpo plan-memory``: what one GRPO step needs in accelerator memory, per device, for each
way of spreading the run (``distributed.strategy``), next to PPO.

The estimate follows what this trainer allocates: weights (float32 master weights with
``model.dtype: auto``, computing in bfloat16 on a GPU), a frozen reference (none with LoRA or at
KL 0), gradients and the optimizer's moments for trainable weights (AdamW's two; with a
config, those of ``optimizer.name``), each sharded as the strategy
shards it, the KV cache of G x prompts completions being generated, the chunked LM-head
logits, and the activations kept for backward. Peak = what stays resident from the second step
on (weights, reference, the optimizer's moments) + the largest phase (generation, backward,
optimizer step). A colocated vLLM engine reserves ``gpu_memory_utilization`` x the device's
memory: during generation when it sleeps through the update, all along when it does not.
Measured against real runs in docs/benchmarks.md (tests/memory_probe.py).
"""

from __future__ import annotations

import os
from typing import Any

from grpo_core.config.file import read_file
from grpo_core.config.view import OptimizerSection
from grpo_core.errors import ConfigError, UserError
from grpo_core.model.logprobs import SHARE_MIN_SAVED_TOKENS
from grpo_core.observe.flops import Shape

PRESETS: dict[str, dict[str, Any]] = {
    "qwen2.5-0.5b": dict(
        hidden=896, layers=24, heads=14, kv_heads=2, intermediate=4864, vocab=151936, tied=True
    ),
    "qwen2.5-1.5b": dict(
        hidden=1536, layers=28, heads=12, kv_heads=2, intermediate=8960, vocab=151936, tied=True
    ),
    "qwen2.5-7b": dict(
        hidden=3584, layers=28, heads=28, kv_heads=4, intermediate=18944, vocab=152064, tied=False
    ),
}
BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
#: what each strategy splits across the devices: weights, gradients, optimizer, reference
SHARDED = {
    "none": (False, False, False, False),
    "ddp": (False, False, False, False),
    "fsdp": (True, True, True, True),
    "zero1": (False, False, True, False),
    "zero2": (False, True, True, False),
    "zero3": (True, True, True, True),
}
GiB = 2**30
#: a device's memory when neither given nor found (GiB): an 80 GB H100's
DEFAULT_DEVICE_GIB = 79.6


def load_shape(spec: str, gguf_file: str | None = None) -> Shape:
    """A preset, a hub id naming one (Qwen/Qwen2.5-0.5B-Instruct), a model directory or its
    config.json, or (``gguf_file``, a run config's ``model.gguf_file``) a GGUF file in the
    directory ``spec``."""
    name = spec.lower().rsplit("/", 1)[-1]
    for preset, shape in PRESETS.items():
        if name == preset or (not os.path.exists(spec) and name.startswith(preset + "-")):
            return Shape(**shape)
    path = os.path.join(spec, "config.json") if os.path.isdir(spec) else spec
    if gguf_file:
        path = os.path.join(spec, gguf_file)
        c = _gguf_config(path)
    elif not os.path.exists(path):
        raise UserError(
            f"--model: {spec!r} is neither a preset ({', '.join(PRESETS)}) nor a config.json"
        )
    else:
        try:
            c = read_file(path)  # bounded like a config: /dev/zero, a FIFO, garbage are refused
        except ConfigError as exc:
            raise UserError(f"--model: {exc.problems[0]}") from None
    sizes: dict[str, int] = {}
    for key in (
        "hidden_size",
        "num_hidden_layers",
        "num_attention_heads",
        "intermediate_size",
        "vocab_size",
    ):
        value = c.get(key)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise UserError(f"--model: {path}: {key} is {value!r}, expected a positive integer")
        sizes[key] = value
    kv = c.get("num_key_value_heads", sizes["num_attention_heads"])
    if not isinstance(kv, int) or isinstance(kv, bool) or kv < 1:
        raise UserError(
            f"--model: {path}: num_key_value_heads is {kv!r}, expected a positive integer"
        )
    return Shape(
        sizes["hidden_size"],
        sizes["num_hidden_layers"],
        sizes["num_attention_heads"],
        kv,
        sizes["intermediate_size"],
        sizes["vocab_size"],
        bool(c.get("tie_word_embeddings", False)),
    )


def _gguf_config(path: str) -> dict:
    """The model config that transformers reads from a GGUF file's metadata."""
    if not os.path.isfile(path):
        raise UserError(f"model.gguf_file: {path} is not a file")
    try:
        from transformers import AutoConfig

        folder, name = os.path.split(path)
        return AutoConfig.from_pretrained(folder, gguf_file=name).to_dict()
    except ImportError as exc:
        raise UserError(f"model.gguf_file: reading {path} needs 'grpo-core[gguf]': {exc}") from None
    except (OSError, ValueError) as exc:
        raise UserError(f"model.gguf_file: {path} is not a GGUF model file: {exc}") from None


def plan(
    shape: Shape,
    group_size: int,
    prompts: int,
    prompt_tokens: int,
    new_tokens: int,
    micro_batch: int | None = None,
    dtype: str = "auto",
    strategy: str = "none",
    gpus: int = 1,
    lora_rank: int = 0,
    gradient_checkpointing: bool = False,
    reference: bool = True,
    generation_batch: int | None = None,
    logprob_chunk: int = 1024,
    engine_bytes: float = 0.0,
    engine_sleeps: bool = True,
    moments: float = 2.0,
) -> dict[str, float]:
    """Bytes per component for one device; ``total`` is the estimated peak. ``prompts`` is
    the whole step's; each of the ``gpus`` processes handles its share. ``dtype`` as
    ``model.dtype`` (auto: float32 weights, bfloat16 compute). ``engine_bytes``: what a
    colocated vLLM engine reserves on each device (0: the hf generator); ``engine_sleeps``:
    it frees that during the update (``sleep``). ``moments``: optimizer state tensors per
    trainable weight (optimizer_moments)."""
    wb = 4 if dtype == "auto" else BYTES[dtype]  # stored weights, gradients, moments
    ab = 2 if dtype == "auto" else BYTES[dtype]  # activations and KV cache
    P = shape.params()
    trainable = shape.lora_params(lora_rank) if lora_rank else P
    completions = max(1, prompts // gpus) * group_size
    mb = min(micro_batch or completions, completions)
    seq = prompt_tokens + new_tokens
    H, kv = shape.hidden, shape.kv_width
    w_s, g_s, o_s, r_s = (gpus if x else 1 for x in SHARDED[strategy])
    layer = (P - shape.vocab * H * (1 if shape.tied else 2)) / shape.layers
    gathered = 2 * layer * wb if strategy in ("fsdp", "zero3") and gpus > 1 else 0.0
    out = {"weights": P * wb / w_s + gathered}
    # one unsharded process under autocast stores the reference's matrices in bf16
    # (grpo_core.model.casts.stored_as_computed); the embedding keeps the weights' dtype
    ref_b = ab + (wb - ab) * shape.vocab * H / P if strategy == "none" else wb
    out["reference"] = P * ref_b / r_s if reference and not lora_rank else 0.0
    out["gradients"] = trainable * wb / g_s
    deepspeed = strategy.startswith("zero")
    # DeepSpeed: an fp32 master copy and fp32 moments; torch: the moments, as the weights
    opt_bytes = 4 + 4 * moments if deepspeed else moments * wb
    out["optimizer"] = trainable * opt_bytes / o_s
    gen = min(generation_batch or completions, completions)
    out["kv_cache"] = 2 * shape.layers * kv * seq * gen * ab
    # ZeRO-3 runs the head as a module: the micro-batch's completion logits all at once
    chunk = mb * new_tokens if strategy == "zero3" else min(logprob_chunk, mb * new_tokens)
    out["logits"] = 4 * chunk * shape.vocab * 4 + gen * shape.vocab * 4 * 2
    out["activations"] = activations(
        shape,
        trained_tokens(mb, group_size, prompt_tokens, new_tokens, gradient_checkpointing),
        gradient_checkpointing,
        ab,
    )
    generation = out["kv_cache"] + gen * shape.vocab * 4 * 2
    gathering = P * wb * (1 - 1 / w_s) if strategy in ("fsdp", "zero3") and gpus > 1 else 0.0
    out["vllm"] = float(engine_bytes)
    awake = 0.0 if engine_sleeps else out["vllm"]  # held through the update as well
    if engine_bytes:  # the engine's reservation replaces the hf generator's cache
        out["kv_cache"], generation = 0.0, out["vllm"] - awake
    generation += gathering  # generation (or a sync) holds the whole model
    backward = out["gradients"] + out["activations"] + out["logits"]
    step = out["gradients"] + trainable * 4 / o_s  # foreach temporaries
    resident = out["weights"] + out["reference"] + out["optimizer"] + awake
    out["total"] = resident + max(generation, backward, step)
    # PPO's critic: a second model with its gradients (kept between steps: set to None only
    # at its next fit) and optimizer state; its forward and backward run after the policy's,
    # over the same tokens (grpo_core.model.value shares prompts as the policy does), so its
    # activations fit inside the policy's backward phase, whose logits it does not have
    critic = P * wb / w_s + P * wb / g_s + P * opt_bytes / o_s
    out["ppo_total"] = out["total"] + critic
    return out


def trained_tokens(
    completions: int, group_size: int, prompt_tokens: int, new_tokens: int, checkpointing: bool
) -> int:
    """Tokens one micro-batch's forward runs through the decoder: each prompt once when the
    trainer shares prompts (grpo_core.model.logprobs.share_prompts: enough prompt tokens saved, no
    checkpointing), else every completion with its own prompt."""
    groups = max(1, completions // group_size)
    if not checkpointing and (completions - groups) * prompt_tokens >= SHARE_MIN_SAVED_TOKENS:
        return groups * prompt_tokens + completions * new_tokens
    return completions * (prompt_tokens + new_tokens)


def activations(shape: Shape, tokens: int, checkpointing: bool, nbytes: int) -> float:
    """Bytes the backward pass needs for ``tokens`` tokens of one micro-batch. Without
    checkpointing every decoder layer keeps its tensors (``per_layer`` numbers a token).
    With it, each layer keeps only its input (H a token), and the layer being recomputed
    holds its tensors and their gradients at once (2 x ``per_layer``): the measured peak
    (docs/benchmarks.md) that one layer's worth alone underestimated by half."""
    H = shape.hidden
    per_layer = 8 * H + 4 * shape.intermediate + 4 * shape.kv_width
    if checkpointing:
        return tokens * (shape.layers * H + 2 * per_layer) * nbytes
    return tokens * shape.layers * per_layer * nbytes


STRATEGIES = tuple(SHARDED)


def _settings(args) -> dict:
    """The planner's inputs: a run config's values, then any flag given, then defaults."""
    got = {
        "model": None,
        "gguf_file": None,
        "group_size": 8,
        "prompts": 8,
        "prompt_tokens": 256,
        "max_new_tokens": 512,
        "micro_batch": None,
        "dtype": "auto",
        "strategy": None,
        "gpus": 1,
        "lora_rank": 0,
        "gradient_checkpointing": False,
        "reference": True,
        "generation_batch_size": None,
        "logprob_chunk": 1024,
        "vllm_memory_utilization": None,
        "vllm_sleep": True,
        "device_memory": None,
        "moments": 2.0,
    }
    if args.config:
        got.update(_from_config(args.config))
    _apply_flags(got, args)
    _check_settings(got)
    return got


def optimizer_moments(oc: OptimizerSection) -> float:
    """State tensors the configured optimizer keeps per trainable weight: AdamW 2 (m, v),
    SGD 1 with momentum and 0 without, Adafactor 0 (its factored second moment holds a row
    and a column per matrix, negligible beside the matrix)."""
    if oc.name == "sgd":
        return 1.0 if oc.momentum else 0.0
    return 0.0 if oc.name == "adafactor" else 2.0


def _from_config(path: str) -> dict:
    """The planner's inputs that the run config at ``path`` sets, so that a plan matches
    the run it is for: its model, batch shape, strategy, reference and vLLM engine."""
    from grpo_core import config as config_mod
    from grpo_core.config.view import view
    from grpo_core.registry import registry

    config = view(config_mod.load(path, []))
    kl = registry().get("kl", config.kl.name).factory(**config.kl.options)
    strategy = config.distributed.strategy
    ds = config.deepspeed
    zero = (ds.get("zero_optimization") or {}).get("stage", 0) if isinstance(ds, dict) else 0
    mc, sc = config.model, config.sampling
    got = dict(
        model=mc.name_or_path,
        gguf_file=mc.gguf_file,
        group_size=sc.group_size,
        prompts=config.train.prompts_per_step,
        max_new_tokens=sc.max_new_tokens,
        micro_batch=config.train.micro_batch_groups * sc.group_size,
        dtype=mc.dtype,
        strategy=(f"zero{zero}" if ds else None) if strategy in ("auto", "deepspeed") else strategy,
        lora_rank=mc.lora.r if mc.lora else 0,
        gradient_checkpointing=mc.gradient_checkpointing,
        reference=kl.needs_reference() and mc.reference_device != "cpu",
        generation_batch_size=sc.generation_batch_size,
        logprob_chunk=config.runtime.logprob_chunk,
        moments=optimizer_moments(config.optimizer),
    )
    if config.generator.name == "vllm":
        engine = config.generator.options
        got.update(
            vllm_memory_utilization=engine["gpu_memory_utilization"], vllm_sleep=engine["sleep"]
        )
    return got


def _apply_flags(got: dict, args) -> None:
    """Overrides ``got`` in place with each flag given on the command line (a flag left
    unset, None or False, keeps the config's value or the default)."""
    if args.model is not None:  # another model: the config's GGUF file is not its
        got["gguf_file"] = None
    for key in got:
        value = getattr(args, key, None)
        if value is not None and value is not False:
            got[key] = value
    if args.no_reference or args.reference_on_cpu:
        got["reference"] = False
    if args.zero_stage is not None:
        got["strategy"] = f"zero{args.zero_stage}" if args.zero_stage else "ddp"
    if args.vllm_awake:
        got["vllm_sleep"] = False


def _check_settings(got: dict) -> None:
    """Raises UserError (one line, naming the flag) for a planner input out of range,
    before any planning is done with it."""
    if got["model"] is None:
        raise UserError("plan-memory: give a run config or --model")
    fraction = got["vllm_memory_utilization"]
    if fraction is not None and not 0 < fraction <= 1:
        raise UserError(
            f"--vllm-memory-utilization: found {fraction}, expected a fraction in (0, 1]"
        )
    if got["device_memory"] is not None and got["device_memory"] <= 0:
        raise UserError(f"--device-memory: found {got['device_memory']}, expected GiB > 0")
    for key in ("group_size", "prompts", "prompt_tokens", "max_new_tokens", "gpus"):
        if got[key] < 1:
            raise UserError(f"--{key.replace('_', '-')}: found {got[key]}, expected >= 1")
    if got["dtype"] not in ("auto", *BYTES):
        raise UserError(f"--dtype: found {got['dtype']!r}, expected auto or one of {sorted(BYTES)}")


def device_memory_gib(given: float | None) -> float:
    """The memory of each device in GiB: as given, else this machine's first GPU's, else
    DEFAULT_DEVICE_GIB (an 80 GB H100)."""
    if given is not None:
        return given
    import torch

    if torch.cuda.is_available():
        return torch.cuda.get_device_properties(0).total_memory / GiB
    return DEFAULT_DEVICE_GIB


def count(n: float) -> str:
    """A parameter count people read: 7.62 B, 494 M, 19.3 k (never 0.00 B)."""
    for scale, unit in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n:.0f}"


def plan_cli(args) -> int:
    s = _settings(args)
    shape = load_shape(s["model"], s["gguf_file"])
    engine = 0.0
    if s["vllm_memory_utilization"]:
        device = device_memory_gib(s["device_memory"])
        engine = s["vllm_memory_utilization"] * device * GiB
        print(
            f"vLLM: {s['vllm_memory_utilization']} x {device:.1f} GiB reserved on each "
            f"device, {'freed during the update (sleep)' if s['vllm_sleep'] else 'kept'}"
        )
    names = (
        [s["strategy"]]
        if s["strategy"]
        else ([n for n in STRATEGIES if n != "none"] if s["gpus"] > 1 else ["none"])
    )
    print(
        f"model: {s['model']} ({count(shape.params())} parameters), dtype {s['dtype']}, "
        f"{s['prompts']} prompts x G={s['group_size']} on {s['gpus']} device(s), "
        f"{s['prompt_tokens']}+{s['max_new_tokens']} tokens"
        + (f", LoRA r={s['lora_rank']}" if s["lora_rank"] else "")
        + (", gradient checkpointing" if s["gradient_checkpointing"] else "")
        + ("" if s["reference"] else ", no reference on the device")
    )
    keys = (
        "weights",
        "reference",
        "gradients",
        "optimizer",
        "kv_cache",
        "logits",
        "activations",
        "vllm",
        "total",
        "ppo_total",
    )
    print(
        "GiB per device | "
        + " | ".join(k if k != "total" else "GRPO peak" for k in keys).replace(
            "ppo_total", "PPO peak"
        )
    )
    for name in names:
        est = plan(
            shape,
            s["group_size"],
            s["prompts"],
            s["prompt_tokens"],
            s["max_new_tokens"],
            s["micro_batch"],
            s["dtype"],
            name,
            s["gpus"],
            s["lora_rank"],
            s["gradient_checkpointing"],
            s["reference"],
            s["generation_batch_size"],
            s["logprob_chunk"],
            engine,
            s["vllm_sleep"],
            s["moments"],
        )
        print(f"{name:14} | " + " | ".join(f"{est[k] / GiB:.2f}" for k in keys))
    print(
        "PPO peak: the same plus a critic of the same size with its gradients and optimizer "
        "state (its activations come after the policy's backward, within that phase's peak)."
    )
    return 0
