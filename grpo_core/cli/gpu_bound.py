"""What a decode step could cost on the GPU at hand: the bound that ``gpu_check`` and
``bench/gpu_step.py`` hold generation to.

A decode step of B rows reads every weight once (the LM head's too; the embedding only by
row), reads each row's keys and values so far, and does 2 x weights x B flops of matrix work
plus the attention's. It cannot take less than the larger of those bytes over the memory
bandwidth and those flops over the bf16 matrix rate; and a small model's step, replayed as one
CUDA graph, cannot take less than its kernels' launches inside the graph (about
KERNELS_PER_LAYER per layer). The bound is the largest of the three, from ceilings measured on
this GPU (:func:`ceilings`: a large copy, a large bf16 matrix product, a graph of tiny kernels),
so it is the GPU's own, not a datasheet's.
"""

from __future__ import annotations

import time

#: kernels of one decoder layer's decode step once fused (two norms, four projections and
#: the gated MLP's three, attention, rotary and residual work): "a dozen"
KERNELS_PER_LAYER = 12
#: generation slower than this fraction of the bound fails gpu_check (the target, decode steps
#: within 3x of the bound, is a third; eager decoding without graphs measured about 1%)
FLOOR_FRACTION = 0.05


def model_shape(config) -> dict:
    """The figures of a transformers decoder config that the bound needs."""
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    return {
        "layers": config.num_hidden_layers,
        "hidden": config.hidden_size,
        "intermediate": config.intermediate_size,
        "heads": heads,
        "kv_heads": getattr(config, "num_key_value_heads", None) or heads,
        "head_dim": head_dim,
        "vocab": config.vocab_size,
    }


def decode_step_bound(shape: dict, rows: int, context: int, ceil: dict) -> dict:
    """Milliseconds one decode step of ``rows`` rows over ``context`` cached tokens cannot beat
    in bf16 on a GPU with ceilings ``ceil`` (bytes read / bandwidth, flops / matrix rate,
    kernels x launch), and the bound, the largest."""
    h, d, L = shape["hidden"], shape["head_dim"], shape["layers"]
    per_layer = h * d * (2 * shape["heads"] + 2 * shape["kv_heads"]) + 3 * h * shape["intermediate"]
    weights = L * per_layer + shape["vocab"] * h  # read once a step, the LM head included
    kv_bytes = 2 * rows * context * L * 2 * shape["kv_heads"] * d
    flops = 2 * weights * rows + 4 * rows * context * L * shape["heads"] * d
    parts = {
        "memory_ms": (2 * weights + kv_bytes) / (ceil["bandwidth_gbs"] * 1e9) * 1e3,
        "compute_ms": flops / (ceil["bf16_tflops"] * 1e12) * 1e3,
        "launch_ms": L * KERNELS_PER_LAYER * ceil["graph_kernel_us"] / 1e3,
    }
    return {**parts, "bound_ms": max(parts.values())}


def _timed(fn, repeats: int, device: str) -> float:
    """Seconds one call of ``fn`` takes on the device (after one untimed call)."""
    import torch

    fn()
    torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    for _ in range(repeats):
        fn()
    torch.cuda.synchronize(device)
    return (time.perf_counter() - t0) / repeats


def _bandwidth(device: str) -> float:
    """GB/s of a 1 GiB bf16 copy (read and written)."""
    import torch

    src = torch.empty(2**29, dtype=torch.bfloat16, device=device)
    dst = torch.empty_like(src)
    return 2 * 2**30 / _timed(lambda: dst.copy_(src), 10, device) / 1e9


def _matrix_rate(device: str, n: int = 8192) -> float:
    """TFLOP/s of an n x n x n bf16 matrix product."""
    import torch

    a = torch.randn(n, n, dtype=torch.bfloat16, device=device)
    return 2 * n**3 / _timed(lambda: a @ a, 10, device) / 1e12


def _graph_kernel(device: str, kernels: int = 500) -> float:
    """Microseconds a tiny kernel takes inside a replayed CUDA graph of ``kernels``."""
    import torch

    x, graph = torch.zeros(16, device=device), torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(kernels):
            x.add_(1)
    return _timed(graph.replay, 20, device) / kernels * 1e6


def tokens_per_second_bound(shape: dict, rows: int, context: int, ceil: dict) -> float:
    """Generated tokens per second that ``rows`` rows decoding at the bound would give."""
    return rows / (decode_step_bound(shape, rows, context, ceil)["bound_ms"] / 1e3)


def ceilings(device: str = "cuda") -> dict:
    """This GPU's memory bandwidth (GB/s), bf16 matrix rate (TFLOP/s) and the time of one
    tiny kernel inside a replayed CUDA graph (microseconds), measured."""
    return {
        "bandwidth_gbs": _bandwidth(device),
        "bf16_tflops": _matrix_rate(device),
        "graph_kernel_us": _graph_kernel(device),
    }


def phase_bounds(work: dict, seconds: dict, ceil: dict, decode_steps: int, layers: int) -> dict:
    """Each phase of a step judged against this GPU's ceilings ``ceil`` (bench/roofline.py's
    GPU mode): the least seconds its work could take, what sets that least, and the fraction
    of it the measured ``seconds`` reach (bound / measured: 1.0 is at the limit).

    ``work``: the phases' FLOPs (``generate``, ``reference``, ``train``) and ``decode_bytes``
    (what a batched decode must read in bf16). Generation cannot beat the largest of its
    reads over the bandwidth, its FLOPs over the bf16 matrix rate, and its ``decode_steps``
    steps' kernel launches replayed as CUDA graphs (``layers`` x KERNELS_PER_LAYER each); the
    log-prob passes (thousands of tokens a product) cannot beat their FLOPs over the rate."""
    rate, bandwidth = ceil["bf16_tflops"] * 1e12, ceil["bandwidth_gbs"] * 1e9
    limits = {
        "generate": {
            "memory": work["decode_bytes"] / bandwidth,
            "compute": work["generate"] / rate,
            "launch": decode_steps * layers * KERNELS_PER_LAYER * ceil["graph_kernel_us"] / 1e6,
        },
        "reference": {"compute": work["reference"] / rate},
        "train": {"compute": work["train"] / rate},
    }
    out = {}
    for phase, parts in limits.items():
        by = max(parts, key=lambda k: parts[k])
        bound, took = parts[by], seconds[phase]
        out[phase] = {"bound_s": bound, "by": by, "fraction": bound / took if took > 0 else 0.0}
    return out
