"""Log-prob + loss + backward over a Qwen2.5-0.5B-shaped LM head: naive vs chunked.

    python bench/logprob_memory.py [--tokens 8192] [--hidden 896] [--vocab 151936]
                                   [--chunks 256,1024] [--repeats 3] [--frozen-head]
                                   [--allow-load]

Each variant runs in its own process (so peak memory is its own), on the same random inputs:
the naive path materialises [tokens, vocab] logits and their log-softmax; ours
(``grpo_core.model.logprobs.token_logprobs``) never holds more than [chunk, vocab]. Prints peak
resident memory growth, the median wall and CPU time of the timed runs after a warm-up, and
the difference of the gradients (hidden states and head weight), with the ratios.
``--frozen-head``: the head takes no gradient (as under LoRA), so ours computes d logp / dh
in the forward and its backward needs no logits. Like bench/step_vs_trl.py it refuses to
time while another process holds a core, unless ``--allow-load``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

CHILD = r"""
import json, os, sys, time
import torch
from grpo_core.model.logprobs import token_logprobs
from grpo_core.observe.metrics import peak_rss_bytes, reset_peak_rss
variant, out = sys.argv[1], sys.argv[6]
n, h, v, chunk = map(int, sys.argv[2:6])
reps, frozen = int(sys.argv[7]), sys.argv[8] == "1"
torch.set_num_threads(int(os.environ.get("BENCH_THREADS", "1")))
g = torch.Generator().manual_seed(0)
hidden = (torch.randn(n, h, generator=g) * 0.5).requires_grad_(True)
weight = (torch.randn(v, h, generator=g) * 0.02).requires_grad_(not frozen)
targets = torch.randint(0, v, (n,), generator=g)
adv = torch.randn(n, generator=g)
old = torch.full((n,), -12.0)

def step():
    hidden.grad = weight.grad = None
    if variant == "naive":
        logp_all = torch.log_softmax(hidden @ weight.T, dim=-1)
        logp = logp_all.gather(1, targets[:, None]).squeeze(1)
    else:
        logp, _ = token_logprobs(hidden, weight, targets, 1.0, chunk, entropy=False)
    ratio = torch.exp(logp - old)
    loss = -(torch.minimum(ratio * adv, ratio.clamp(0.8, 1.2) * adv)).mean()
    loss.backward()

base = reset_peak_rss()
step()  # warm-up
times, cpu = [], []
for _ in range(reps):
    t, c = time.perf_counter(), time.process_time()
    step()
    times.append(time.perf_counter() - t)
    cpu.append(time.process_time() - c)
peak = peak_rss_bytes()
torch.save({"h": hidden.grad, "w": weight.grad}, out)
print(json.dumps({"peak": peak - base, "times": times, "cpu": cpu}))
"""


def run(variant: str, args, chunk: int, work: str) -> dict:
    import torch
    from step_vs_trl import busy_elsewhere

    busy, who = busy_elsewhere()
    if who and not args.allow_load:
        print(f"refusing to time: {who}; pass --allow-load to time anyway", file=sys.stderr)
        raise SystemExit(3)
    path = os.path.join(work, f"{variant}{chunk}.pt")
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            CHILD,
            variant,
            str(args.tokens),
            str(args.hidden),
            str(args.vocab),
            str(chunk),
            path,
            str(args.repeats),
            "1" if args.frozen_head else "0",
        ],
        capture_output=True,
        text=True,
    )
    if out.returncode != 0:
        raise SystemExit(f"{variant} failed: {out.stderr.strip().splitlines()[-1:]}")
    res = json.loads(out.stdout.strip().splitlines()[-1])
    res["grads"], res["load"] = torch.load(path), busy
    res["loaded"] = bool(who)
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--hidden", type=int, default=896)
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--chunks", default="256,1024", help="comma-separated chunk sizes")
    ap.add_argument("--repeats", type=int, default=3, help="timed runs after the warm-up")
    ap.add_argument("--frozen-head", action="store_true", help="no gradient for the head")
    ap.add_argument("--allow-load", action="store_true")
    args = ap.parse_args()
    chunks = [int(c) for c in args.chunks.split(",")]
    work = tempfile.mkdtemp(prefix="lpmem_")
    naive = run("naive", args, chunks[0], work)
    ours = {c: run("chunked", args, c, work) for c in chunks}
    loaded = naive["loaded"] or any(r["loaded"] for r in ours.values())
    ta, ca = statistics.median(naive["times"]), statistics.median(naive["cpu"])
    loads = ", ".join(f"{r['load']:.2f}" for r in [naive, *ours.values()])
    print(
        f"LM head {args.hidden} x {args.vocab}, {args.tokens} tokens, float32, "
        f"{os.environ.get('BENCH_THREADS', '1')} thread(s), head "
        f"{'frozen' if args.frozen_head else 'trained'}; median of {args.repeats} timed "
        f"runs after a warm-up; load before each variant (cores used by others): "
        f"{loads}"
        f"{' LOADED' if loaded else ''}"
    )
    print(
        "| path | chunk | peak memory growth (MiB) | memory ratio | wall s | time ratio | "
        "CPU s | CPU ratio | gradient rel. diff (hidden / head) |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    print(
        f"| naive log-softmax | - | {naive['peak'] / 2**20:,.0f} | 1 | {ta:.2f} | 1 | "
        f"{ca:.2f} | 1 | - |"
    )
    for c, b in ours.items():
        rel = [
            float((naive["grads"][k] - b["grads"][k]).norm() / naive["grads"][k].norm())
            for k in ("h", "w")
            if naive["grads"][k] is not None
        ]
        tb, cb = statistics.median(b["times"]), statistics.median(b["cpu"])
        print(
            f"| grpo-core chunked | {c} | {b['peak'] / 2**20:,.0f} | "
            f"{b['peak'] / naive['peak']:.3f} | {tb:.2f} | {tb / ta:.2f} | {cb:.2f} | "
            f"{cb / ca:.2f} | {' / '.join(f'{x:.1e}' for x in rel)} |",
            flush=True,
        )
    print("goals: memory ratio <= 0.125, time ratio <= 1.2, gradient difference <= 1e-5")
    return 0


if __name__ == "__main__":
    sys.exit(main())
