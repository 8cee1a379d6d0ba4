"""Log-prob + loss + backward over a Qwen2.5-0.5B-shaped LM head: naive vs chunked.

    python bench/logprob_memory.py [--tokens 8192] [--hidden 896] [--vocab 151936] [--chunk 1024]

Each variant runs in its own process (so peak memory is its own), on the same random inputs:
the naive path materialises [tokens, vocab] logits and their log-softmax; ours
(``grpo_core.losses.token_logprobs``) never holds more than [chunk, vocab]. Prints peak
resident memory growth, median time of the timed runs after a warm-up, and the difference of
the gradients (hidden states and head weight), with the ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

CHILD = r'''
import json, os, resource, sys, time
import torch
from grpo_core.losses import token_logprobs
variant, out = sys.argv[1], sys.argv[6]
n, h, v, chunk = map(int, sys.argv[2:6])
reps = int(sys.argv[7])
torch.set_num_threads(int(os.environ.get("BENCH_THREADS", "1")))
g = torch.Generator().manual_seed(0)
hidden = (torch.randn(n, h, generator=g) * 0.5).requires_grad_(True)
weight = (torch.randn(v, h, generator=g) * 0.02).requires_grad_(True)
targets = torch.randint(0, v, (n,), generator=g)
adv = torch.randn(n, generator=g)
old = torch.full((n,), -12.0)

def step():
    hidden.grad = weight.grad = None
    if variant == "naive":
        logp_all = torch.log_softmax(hidden @ weight.T, dim=-1)
        logp = logp_all.gather(1, targets[:, None]).squeeze(1)
    else:
        logp, _ = token_logprobs(hidden, weight, targets, 1.0, chunk)
    ratio = torch.exp(logp - old)
    loss = -(torch.minimum(ratio * adv, ratio.clamp(0.8, 1.2) * adv)).mean()
    loss.backward()

base = int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
step()  # warm-up
times = []
for _ in range(reps):
    t = time.perf_counter(); step(); times.append(time.perf_counter() - t)
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
torch.save({"h": hidden.grad, "w": weight.grad}, out)
print(json.dumps({"peak": peak - base, "times": times}))
'''


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--hidden", type=int, default=896)
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--chunk", type=int, default=1024)
    ap.add_argument("--repeats", type=int, default=3, help="timed runs after the warm-up")
    args = ap.parse_args()
    import torch

    work = tempfile.mkdtemp(prefix="lpmem_")
    res = {}
    for variant in ("naive", "chunked"):
        path = os.path.join(work, f"{variant}.pt")
        out = subprocess.run([sys.executable, "-c", CHILD, variant, str(args.tokens),
                              str(args.hidden), str(args.vocab), str(args.chunk), path,
                              str(args.repeats)],
                             capture_output=True, text=True)
        if out.returncode != 0:
            print(f"{variant} failed: {out.stderr.strip().splitlines()[-1:]}")
            return 1
        res[variant] = json.loads(out.stdout.strip().splitlines()[-1])
        res[variant]["grads"] = torch.load(path)
    a, b = res["naive"], res["chunked"]
    rel = {k: float((a["grads"][k] - b["grads"][k]).norm() / a["grads"][k].norm())
           for k in ("h", "w")}
    ta, tb = statistics.median(a["times"]), statistics.median(b["times"])
    print(f"LM head {args.hidden} x {args.vocab}, {args.tokens} tokens, float32, "
          f"{os.environ.get('BENCH_THREADS', '1')} thread(s), chunk {args.chunk}")
    print("| path | peak memory growth (MiB) | median time (s) |")
    print("|---|---|---|")
    print(f"| naive log-softmax | {a['peak'] / 2**20:.0f} | {ta:.2f} |")
    print(f"| grpo-core chunked | {b['peak'] / 2**20:.0f} | {tb:.2f} |")
    print(f"memory ratio (ours / naive): {b['peak'] / a['peak']:.3f}  (goal <= 0.125)")
    print(f"time ratio (ours / naive): {tb / ta:.2f}  (goal <= 1.2)")
    print(f"gradient relative difference: hidden {rel['h']:.1e}, head weight {rel['w']:.1e} "
          f"(goal <= 1e-5)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
