"""A roofline for every phase of a GRPO step: the machine's measured limits, each phase's
work from the model's shape and the step's token counts (grpo_core.observe.flops), and the
share of the limit each phase reaches.

    python bench/roofline.py [--case tiny,gsm8k,smollm2] [--steps 3] [--packing off|on|auto]
                             [--profile] [--data ../shared/data] [--device cpu|cuda]

The machine: GEMM GFLOP/s at the model's own shapes (the training pass's tokens x hidden
against hidden x hidden, hidden x MLP, MLP x hidden, and a 1,024-row LM-head chunk against
the vocabulary), and at 1,024 cubed, with 1 and 2 threads (best of 10 timings each); memory
bandwidth: reading a 256 MB float32 tensor (a sum), 1 and 2 threads. The run: grpo-core's
trainer on the case (bench/step_vs_trl.py's CASES: same model, prompts, ``math`` reward,
KL 0.04 with a reference, one micro-batch) with one thread, 1 warm-up step then ``--steps``
measured; each phase's wall time per step, summed over the measured steps.

Work per phase: generation, model FLOPs (prefill once per prompt, then each completion's
tokens) and the bytes a batched decode must read (every weight per forward, each live
completion's keys and values); reference and old-log-prob passes, forward FLOPs (prompts
once, completions' real tokens, the head at completion tokens); training, 3x forward (per
inner iteration); padding, the layers' FLOPs on the padding positions the passes ran, apart.
Decode is judged against memory bandwidth (time the bytes need / time taken) and against its
roofline bound: the larger of that memory time and its arithmetic time (the prefill at the
GEMM peak, the decode steps at the GEMM rate of their own shapes: as many rows as
completions), since with R rows a float32 weight read
once serves 2R FLOPs, and past the machine's balance (GEMM GFLOP/s over GB/s) the arithmetic,
not the reads, is the limit. The log-prob passes are judged against the GEMM peak at the
model's shapes (achieved GFLOP/s / peak).

``--device cuda`` (GPU mode): the run on the GPU (bf16 autocast, the static decode path) and
each phase judged against the ceilings grpo_core/cli/gpu_bound.py measures on it (a 1 GiB
copy, an 8192^3 bf16 product, a CUDA graph of tiny kernels): generation against the largest
of its bf16 reads over the bandwidth, its FLOPs over the bf16 rate and its decode steps'
graph launches; the reference and training passes against their FLOPs over the bf16 rate
(``phase_bounds``). Without a CUDA device it refuses (exit 3).

``--profile``: where each phase's time goes, one more step under torch.profiler: operator
self time in GEMMs, attention, softmax, the autograd engine and other operators, and the
rest of the phase's wall time (Python and framework work between operators).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(__file__))
from step_vs_trl import CASES, ours_config, real_model, rows_for  # noqa: E402

NO_GPU = "bench/roofline.py: --device cuda needs a CUDA device; none is visible to torch"


def best_seconds(fn, tries: int = 10) -> float:
    """The fastest of ``tries`` timings after one warm-up (the least disturbed by load: on a
    shared machine a timing is only ever slowed, so the minimum is the machine's own)."""
    fn()
    out = []
    for _ in range(tries):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return min(out)


def gemm_gflops(m: int, k: int, n: int, threads: int) -> float:
    """GFLOP/s of a float32 [m, k] x [k, n] product with ``threads`` threads, laid out as an
    ``nn.Linear`` computes it (the weight stored [n, k]): the layout decides the kernel, and
    at the decode head's shape (32 x 576 x 49,152) the [k, n] layout ran 17% slower."""
    torch.set_num_threads(threads)
    a, w = torch.randn(m, k), torch.randn(n, k)
    reps = max(1, int(1e9 // (2 * m * k * n)))  # ~10 ms or more per timing

    def run():
        for _ in range(reps):
            torch.nn.functional.linear(a, w)

    return 2.0 * m * k * n * reps / best_seconds(run) / 1e9


def bandwidth_gbs(threads: int, megabytes: int = 256) -> float:
    """GB/s reading a float32 tensor of ``megabytes`` once (a sum: one read per element)."""
    torch.set_num_threads(threads)
    x = torch.ones(megabytes * 2**20 // 4)
    return x.numel() * 4 / best_seconds(lambda: x.sum()) / 1e9


def machine(shape, tokens: int, rows: int) -> dict:
    """The limits: GEMM GFLOP/s at the model's shapes (best over them) and at 1,024 cubed;
    the GEMM rate of one decode step's products with ``rows`` completions, each product at
    its own shape's measured rate; memory bandwidth; each for 1 and 2 threads."""
    from grpo_core.observe.flops import decode_products, products_rate

    H, mlp, V = shape.hidden, shape.intermediate, shape.vocab
    shapes = [(tokens, H, H), (tokens, H, mlp), (tokens, mlp, H), (1024, H, V)]
    decode = decode_products(shape, rows)
    out = {}
    for threads in (1, 2):
        at_model = {s: gemm_gflops(*s, threads) for s in shapes}
        at_decode = {s: gemm_gflops(*s, threads) for s in decode}
        out[threads] = {
            "model": max(at_model.values()),
            "shapes": at_model | at_decode,
            "decode": products_rate(decode, at_decode),
            "square": gemm_gflops(1024, 1024, 1024, threads),
            "bandwidth": bandwidth_gbs(threads),
        }
    torch.set_num_threads(1)
    return out


class Recorder:
    """Wall seconds of the phases of each step, and each step's rollout."""

    def __init__(self):
        self.steps: list[dict] = []

    def wrap(self, name: str, fn):
        def timed(*args, **kw):
            t = time.perf_counter()
            try:
                return fn(*args, **kw)
            finally:
                self.steps[-1][name] = time.perf_counter() - t

        return timed

    def install(self, phases) -> dict:
        saved = {n: getattr(phases, n) for n in ("generate", "targets", "update")}
        sample = self.wrap("generate", saved["generate"])

        def first(*a, **kw):
            self.steps.append({})
            return sample(*a, **kw)

        update = self.wrap("train", saved["update"])

        def last(run, step, scored, targets):
            self.steps[-1]["rollout"] = scored.rollout
            self.steps[-1]["run"] = run
            return update(run, step, scored, targets)

        phases.generate, phases.targets, phases.update = (
            first,
            self.wrap("reference", saved["targets"]),
            last,
        )
        return saved


def run_case(
    case: str,
    model_dir: str,
    rows: list[dict],
    steps: int,
    packing: str,
    rec: Recorder | None = None,
    device: str = "cpu",
) -> list:
    """The trainer on the case (on ``device``), one warm-up step then ``steps``; the measured
    steps' records (times, rollout, run) as ``rec`` (a Recorder by default) keeps them."""
    from grpo_core import config, phases
    from grpo_core.tiny import write_jsonl
    from grpo_core.trainer import train

    out = tempfile.mkdtemp(prefix=f"roofline_{case}_")
    data = os.path.join(out, "data.jsonl")
    write_jsonl(data, rows)
    cfg = ours_config(model_dir, data, case, 1 + steps, out, packing)
    cfg["runtime"]["device"] = device
    cfg = config.validate(cfg)
    rec = rec or Recorder()
    saved = rec.install(phases)
    try:
        train(cfg)
    finally:
        for n, fn in saved.items():
            setattr(phases, n, fn)
    return rec.steps[1:]


#: op categories of the profile, the first whose name test matches wins; the rest is "other ops"
CATEGORIES = (
    ("GEMM", lambda n: n in {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm"}),
    ("attention", lambda n: "scaled_dot_product" in n or "flash_attention" in n),
    ("softmax", lambda n: "softmax" in n or "logsumexp" in n),
    ("autograd engine", lambda n: n.startswith("autograd::")),
)


class Profiler(Recorder):
    """Each phase of the last step under torch.profiler: seconds of operator self time per
    category (CATEGORIES), and the phase's wall time, whose part outside every operator is
    Python and framework work between calls."""

    def __init__(self, steps: int):
        super().__init__()
        self.last = steps

    def wrap(self, name: str, fn):
        from torch.profiler import ProfilerActivity, profile

        def profiled(*args, **kw):
            if len(self.steps) < self.last:
                return fn(*args, **kw)
            t = time.perf_counter()
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                out = fn(*args, **kw)
            wall = time.perf_counter() - t
            shares = {c: 0.0 for c, _ in CATEGORIES} | {"other ops": 0.0}
            others = []
            for e in prof.key_averages():
                cat = next((c for c, test in CATEGORIES if test(e.key)), "other ops")
                shares[cat] += e.self_cpu_time_total / 1e6
                if cat == "other ops":
                    others.append((e.self_cpu_time_total / 1e6, e.key))
            shares["outside ops"] = wall - sum(shares.values())
            top = ", ".join(f"{k} {s / wall:.2f}" for s, k in sorted(others)[::-1][:4])
            self.steps[-1][name] = {"wall": wall, **shares, "top": top}
            return out

        return profiled


def profile_case(case: str, model_dir: str, rows: list[dict], packing: str) -> None:
    """One warm-up step, one profiled: each phase's wall time split by operator category."""
    step = run_case(case, model_dir, rows, 1, packing, Profiler(steps=2))[-1]
    cats = [c for c, _ in CATEGORIES] + ["other ops", "outside ops"]
    print(f"\n{case}: one step under torch.profiler (its overhead included), share of wall")
    print("| phase | wall s | " + " | ".join(cats) + " | largest other ops |")
    print("|---" * (len(cats) + 3) + "|")
    for p in ("generate", "reference", "train"):
        w, cells = step[p]["wall"], " | ".join(f"{step[p][c] / step[p]['wall']:.2f}" for c in cats)
        print(f"| {p} | {w:.3f} | {cells} | {step[p]['top']} |")


def lengths(ro) -> tuple[list[int], list[list[int]]]:
    """Each prompt's real tokens and its completions' real tokens."""
    plen = ro.prompt_mask.sum(-1).tolist()
    n = ro.completion_mask.sum(-1)
    prompts = sorted(set(ro.group.tolist()))
    return [plen[p] for p in prompts], [n[ro.group == p].tolist() for p in prompts]


def step_work(shape, step: dict, packing: str) -> dict:
    """FLOPs (and decode bytes) of one step's phases, and the padding FLOPs apart."""
    from grpo_core.model.logprobs import decoder_counts
    from grpo_core.observe import flops

    run, ro = step["run"], step["rollout"]
    prompts, comps = lengths(ro)
    forward = flops.logprob_pass_flops(shape, prompts, comps)
    recompute = run.generator.recompute_old_logprobs
    iterations = run.config.train.inner_iterations
    positions, padding = decoder_counts(run.policy, ro, packing)
    passes = int(run.reference is not None) + int(recompute)
    return {
        "generate": flops.generation_flops(shape, prompts, comps),
        "prefill": flops.generation_flops(shape, prompts, [[] for _ in prompts]),
        "decode_bytes": flops.decode_bytes(shape, prompts, comps),
        "reference": forward * passes,
        "train": 3 * forward * iterations,
        "padding/reference": flops.padding_flops(shape, padding) * passes,
        "padding/train": flops.padding_flops(shape, padding, backward=True) * iterations,
        "padding_frac": padding / max(positions, 1),
    }


def report(case: str, shape, limits: dict, steps: list, packing: str) -> None:
    """One table row per phase: seconds, GFLOP, GFLOP/s and the share of the limit."""
    work = [step_work(shape, s, packing) for s in steps]
    total = {k: sum(w[k] for w in work) for k in work[0]}
    secs = {p: sum(s[p] for s in steps) for p in ("generate", "reference", "train")}
    peak, bw, decode_peak = (limits[1][k] for k in ("model", "bandwidth", "decode"))
    frac = statistics.mean(w["padding_frac"] for w in work)
    decode = total["generate"] - total["prefill"]
    memory = total["decode_bytes"] / bw / 1e9
    arithmetic = (total["prefill"] / peak + decode / decode_peak) / 1e9
    print(
        f"\n{case}, packing {packing}; padding {frac:.2f} of the policy "
        f"pass's positions; limits (1 thread): GEMM {peak:.1f} GFLOP/s at the model's "
        f"shapes, bandwidth {bw:.1f} GB/s"
    )
    print(
        "| phase | s | useful GFLOP | padding GFLOP | GFLOP/s | of GEMM peak "
        "| of bandwidth bound | of roofline bound |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for p in ("generate", "reference", "train"):
        rate = total[p] / secs[p] / 1e9
        bounds = "- | -"
        if p == "generate":  # the slower of its two limits is the roof it can reach
            bounds = f"{memory / secs[p]:.2f} | {max(memory, arithmetic) / secs[p]:.2f}"
        pad = total.get(f"padding/{p}", 0.0) / 1e9
        print(
            f"| {p} | {secs[p]:.3f} | {total[p] / 1e9:.3f} | {pad:.3f} | {rate:.2f} | "
            f"{rate / peak:.2f} | {bounds} |"
        )
    print(
        f"generate: memory time {memory:.3f} s; arithmetic time {arithmetic:.3f} s (the "
        f"prefill at the GEMM peak, decode steps at their shapes' {decode_peak:.1f} GFLOP/s)"
    )


def report_gpu(case: str, shape, ceil: dict, steps: list, packing: str) -> None:
    """GPU mode: one table row per phase, its seconds against the bound at the GPU's
    ceilings (bf16 weights and keys/values: two bytes each)."""
    from dataclasses import replace

    from grpo_core.cli.gpu_bound import phase_bounds

    bf16 = replace(shape, bytes_per_param=2)
    work = [step_work(bf16, s, packing) for s in steps]
    total = {k: sum(w[k] for w in work) for k in ("generate", "reference", "train", "decode_bytes")}
    secs = {p: sum(s[p] for s in steps) for p in ("generate", "reference", "train")}
    decode_steps = sum(int(s["rollout"].completion_mask.sum(-1).max()) for s in steps)
    judged = phase_bounds(total, secs, ceil, decode_steps, shape.layers)
    print(
        f"\n{case} on the GPU, packing {packing}; ceilings: {ceil['bandwidth_gbs']:.0f} GB/s, "
        f"{ceil['bf16_tflops']:.0f} bf16 TFLOP/s, {ceil['graph_kernel_us']:.2f} us a graph kernel"
    )
    print("| phase | s | GFLOP | bound ms | bound by | of the bound |")
    print("|---|---|---|---|---|---|")
    for p, j in judged.items():
        print(
            f"| {p} | {secs[p]:.3f} | {total[p] / 1e9:.1f} | {j['bound_s'] * 1e3:.3f} "
            f"| {j['by']} | {j['fraction']:.3f} |"
        )


def model_for(case: str, work: str) -> str:
    from grpo_core.tiny import build_model

    if case == "smollm2":
        return real_model()
    hidden, layers, _, _, new_tokens, length = CASES[case]
    return build_model(
        os.path.join(work, case),
        hidden=hidden,
        layers=layers,
        max_positions=max(512, (length or 0) + new_tokens),
    )


def print_limits(limits: dict) -> None:
    print(
        "| threads | GEMM at 1024^3 GFLOP/s | GEMM at the model's shapes (m x k x n: GFLOP/s) "
        "| read bandwidth GB/s |"
    )
    print("|---|---|---|---|")
    for t, lim in limits.items():
        shapes = ", ".join(f"{m}x{k}x{n}: {g:.1f}" for (m, k, n), g in lim["shapes"].items())
        print(f"| {t} | {lim['square']:.1f} | {shapes} | {lim['bandwidth']:.1f} |")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--case", default="tiny,gsm8k", help="comma-separated: tiny, gsm8k, smollm2")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--packing", default="auto", choices=["off", "on", "auto"])
    ap.add_argument(
        "--profile", action="store_true", help="also one step under torch.profiler, per phase"
    )
    ap.add_argument(
        "--data", default=os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data")
    )
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="cuda: GPU mode")
    args = ap.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        print(NO_GPU, file=sys.stderr)
        return 3
    import transformers
    from transformers import AutoConfig

    from grpo_core.observe.flops import Shape

    transformers.utils.logging.set_verbosity_error()
    work = tempfile.mkdtemp(prefix="roofline_")
    packing = args.packing
    for case in args.case.split(","):
        folder = model_for(case, work)
        shape = Shape.of(AutoConfig.from_pretrained(folder))
        _, _, P, G, new_tokens, length = CASES[case]
        tokens = P * (length if isinstance(length, int) else 32) + P * G * new_tokens
        if args.device == "cuda":
            from grpo_core.cli.gpu_bound import ceilings

            ceil = ceilings()
            steps = run_case(
                case, folder, rows_for(case, args.data), args.steps, packing, None, "cuda"
            )
            report_gpu(case, shape, ceil, steps, packing)
            continue
        limits = machine(shape, tokens, P * G)
        print(f"\n{case}: machine, measured at this model's shapes")
        print_limits(limits)
        steps = run_case(case, folder, rows_for(case, args.data), args.steps, packing)
        report(case, shape, limits, steps, packing)
        if args.profile:
            profile_case(case, folder, rows_for(case, args.data), packing)
    return 0


if __name__ == "__main__":
    sys.exit(main())
