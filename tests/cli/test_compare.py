"""``grpo compare`` and ``grpo plot`` on the tiny model: the table with intervals and tests,
tuning per variant, compute counted in tokens, resuming, real PNG curves, bad input."""

from __future__ import annotations

import glob
import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from helpers import ROOT, gsm8k_or_stand_in, make_config, run_grpo, write_config

COLOURS = {"C0": (0x1F, 0x77, 0xB4), "C1": (0xFF, 0x7F, 0x0E)}  # matplotlib's first two
RECIPE = os.path.join(ROOT, "examples", "recipe_grpo.yaml")


def has_colour(png: str, rgb) -> bool:
    import matplotlib.image as mpimg

    img = (mpimg.imread(png)[..., :3] * 255).round().astype(int)
    return bool((np.abs(img - np.array(rgb)).sum(-1) < 30).sum() > 50)


def tiny(tmp_path, tiny_model, addition_data, **sections) -> str:
    return write_config(
        tmp_path / "c.json",
        make_config(
            tiny_model,
            addition_data,
            str(tmp_path / "unused"),
            # in the trainer's process: one process fewer to start per run (isolation has its
            # own tests, tests/plugins/test_isolation.py)
            reward={
                "name": "format",
                "options": {"tags": [], "patterns": ["[0-9]"]},
                "isolation": "inline",
            },
            train={"steps": 2, "prompts_per_step": 2},
            optimizer={"lr": 1e-2},
            runtime={"device": "cpu", "threads": 1},
            **sections,
        ),
    )


def cells(md: str, first: str) -> list[list[str]]:
    """The table rows of compare.md whose first cell is ``first``."""
    rows = [
        [c.strip() for c in line.strip().strip("|").split("|")]
        for line in md.splitlines()
        if line.startswith("|")
    ]
    return [r for r in rows if r[0] == first]


def interval(cell: str) -> tuple[float, float, float]:
    m = re.fullmatch(r"([-+\d.]+) \[([-+\d.]+), ([-+\d.]+)\]", cell)
    assert m, cell
    return float(m[1]), float(m[2]), float(m[3])


def metrics(run_dir) -> list[dict]:
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


def brute_permutation_p(a, b) -> float:
    pooled, obs = a + b, abs(np.mean(a) - np.mean(b))
    splits = list(itertools.combinations(range(len(pooled)), len(a)))
    hits = sum(
        abs(
            np.mean([pooled[i] for i in s])
            - np.mean([pooled[i] for i in range(len(pooled)) if i not in s])
        )
        >= obs - 1e-12
        for s in splits
    )
    return hits / len(splits)


def test_compare_two_baselines_two_seeds(tiny_model, addition_data, tmp_path):
    cfg = tiny(
        tmp_path,
        tiny_model,
        addition_data,
        eval={"data": addition_data, "split": "train", "every_n_steps": 2, "max_problems": 4},
    )
    out = tmp_path / "cmp"
    p = run_grpo(
        "compare",
        cfg,
        "--baselines",
        "grpo,rloo",
        "--seeds",
        "2",
        "--steps",
        "2",
        "--threshold",
        "0.5",
        "--out",
        str(out),
        cwd=ROOT,
        timeout=900,
    )
    assert p.returncode == 0, p.stderr
    md = (out / "compare.md").read_text()
    for name in ("grpo", "rloo"):
        (row,) = cells(md, name)
        assert len(row) == 13  # with held-out accuracy: the runs validated
        runs = [metrics(out / f"{name}-seed{s}") for s in (0, 1)]
        # seconds a step: the median over the seeds of each run's median step
        per_run = [np.median([r["time/step"] for r in run]) for run in runs]
        assert float(row[11]) == pytest.approx(np.median(per_run), abs=0.006)
        peak = max(r["peak_memory_mb"] for run in runs for r in run)  # MiB, the largest
        assert row[12] == f"{peak:,.0f}" and peak > 100  # a CPU process's resident size
        mean, lo, hi = interval(row[2])  # final reward [95% CI]
        assert lo <= mean <= hi
        held_out = [metrics(out / f"{name}-seed{s}")[-1]["eval/accuracy"] for s in (0, 1)]
        assert interval(row[5]) == (
            round(np.mean(held_out), 3),
            round(min(held_out), 3),
            round(max(held_out), 3),
        )
        assert row[6].endswith("seeds)")  # steps to the threshold, with how many reached
    assert cells(md, "grpo vs rloo")  # the pairwise tests
    assert "done, 2/2 steps" in p.stderr  # a progress line per run
    assert len([d for d in os.listdir(out) if d.endswith("-seed0") or d.endswith("-seed1")]) == 4
    for metric in ("reward", "entropy", "reward_vs_generated_tokens"):
        png = out / f"{metric}.png"
        assert png.exists() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert has_colour(str(png), COLOURS["C0"]) and has_colour(str(png), COLOURS["C1"])
    assert not (out / "kl.png").exists()  # no reference model (KL coefficient 0): no kl curve
    # grpo plot on two of those runs
    runs = sorted(str(out / d) for d in os.listdir(out) if d.endswith("-seed0"))
    plotted = run_grpo(
        "plot", *runs, "--metrics", "reward,entropy", "--out", str(tmp_path / "plots"), cwd=ROOT
    )
    assert plotted.returncode == 0, plotted.stderr
    assert sorted(os.listdir(tmp_path / "plots")) == ["entropy.png", "reward.png"]


def test_a_changed_shared_setting_keeps_the_earlier_runs(tiny_model, addition_data, tmp_path):
    cfg = tiny(tmp_path, tiny_model, addition_data)
    out = tmp_path / "cmp"
    args = [
        "compare",
        cfg,
        "--baselines",
        "grpo,rloo",
        "--seeds",
        "1",
        "--steps",
        "2",
        "--out",
        str(out),
    ]
    assert run_grpo(*args, cwd=ROOT, timeout=900).returncode == 0
    first = (out / "grpo-seed0" / "metrics.jsonl").read_text()
    p = run_grpo(*args, "--set", "optimizer.lr=5e-3", cwd=ROOT, timeout=900)
    assert p.returncode == 0, p.stderr
    assert p.stderr.count("the earlier run there had another config; kept in") == 2
    kept = sorted(
        p.relative_to(out / "earlier").parts[1] for p in (out / "earlier").glob("*/*") if p.is_dir()
    )
    assert kept == ["grpo-seed0", "rloo-seed0"]  # each under its own config's digest
    (grpo,) = (out / "earlier").glob("*/grpo-seed0")
    assert (grpo / "metrics.jsonl").read_text() == first
    assert (grpo.parent / "grpo-seed0.yaml").exists()
    md = (out / "compare.md").read_text()
    assert "All variants ran at one learning rate, optimizer.lr = 0.005, not tuned" in md
    assert "[min-max of seeds]" in md and "95% CI" not in md  # one seed: no interval
    back = run_grpo(*args, cwd=ROOT, timeout=900)  # the first config again: its runs return
    assert back.stderr.count("finished earlier, reused") == 2, back.stderr
    assert (out / "grpo-seed0" / "metrics.jsonl").read_text() == first


@pytest.mark.slow  # eleven tiny runs, each a process: about a minute on 2 free cores
def test_vary_a_config_key_tune_per_variant_then_resume(tiny_model, addition_data, tmp_path):
    """The issue's acceptance test: --vary on a config key, --tune with 2 values on 1 tuning
    seed, 2 evaluation seeds; ReMax, so greedy completions count as generated tokens."""
    cfg = tiny(tmp_path, tiny_model, addition_data, baseline={"name": "remax"})
    out = tmp_path / "cmp"
    args = [
        "compare",
        cfg,
        "--vary",
        "objective.entropy_coef=0,0.01",
        "--tune",
        "train.lr=1e-3,3e-2",
        "--tune-seeds",
        "1",
        "--seeds",
        "2",
        "--steps",
        "2",
        "--out",
        str(out),
    ]
    p = run_grpo(*args, cwd=ROOT, timeout=900)
    assert p.returncode == 0, p.stderr
    md = (out / "compare.md").read_text()
    data = json.loads((out / "compare.json").read_text())
    variants = ["objective.entropy_coef=0", "objective.entropy_coef=0.01"]
    for v in variants:  # tuning: each candidate's AUC on seed 1000, the best one chosen
        slug = v.replace("=", "-")
        auc = {
            lr: np.mean([r["reward"] for r in metrics(out / f"{slug}_optimizer.lr-{lr}-seed1000")])
            for lr in ("1e-3", "3e-2")
        }
        best = max(auc, key=lambda k: (auc[k], k == "1e-3"))  # ties: the first listed
        rows = cells(md, v)
        tuning = [r for r in rows if len(r) == 5]
        assert [r[1] for r in tuning] == ["optimizer.lr=1e-3", "optimizer.lr=3e-2"]
        assert [float(r[3]) for r in tuning] == [round(auc["1e-3"], 3), round(auc["3e-2"], 3)]
        assert [r[1] for r in tuning if r[4] == "**chosen**"] == [f"optimizer.lr={best}"]
        assert data["tuning"][v]["chosen"] == f"optimizer.lr={best}"
        # evaluation: seeds 0 and 1 at the chosen value, final reward and AUC with intervals;
        # two seeds: every resample has probability >= 1/4, so the 95% interval is [min, max]
        (result,) = [r for r in rows if len(r) == 12]
        assert result[1] == f"{v},optimizer.lr={best}"
        runs = [metrics(out / f"{slug}_optimizer.lr-{best}-seed{s}") for s in (0, 1)]
        finals = [r[-1]["reward"] for r in runs]  # last 10% of 2 steps: the last one
        aucs = [np.mean([x["reward"] for x in r]) for r in runs]
        for cell, vals in ((result[2], finals), (result[3], aucs)):
            assert interval(cell) == (
                round(np.mean(vals), 3),
                round(min(vals), 3),
                round(max(vals), 3),
            )
        # generated tokens: sampled completions plus one greedy completion per prompt (2)
        tokens = [
            sum(x["samples"] * x["completion_len"] + 2 * x["completion_len"] for x in r)
            for r in runs
        ]
        assert np.allclose([run["tokens"] for run in data["variants"][v]["runs"]], tokens)
        assert np.allclose([run["auc"] for run in data["variants"][v]["runs"]], aucs)
    # the pairwise test, p-values as exhaustive enumeration gives them
    pair = cells(md, f"{variants[0]} vs {variants[1]}")[0]  # the first metric: AUC
    a, b = ([run["auc"] for run in data["variants"][v]["runs"]] for v in variants)
    assert float(pair[2]) == float(f"{brute_permutation_p(a, b):.3g}")
    assert re.search(r"not distinguishable|higher", pair[5])
    assert (
        "smallest possible permutation p is 0.333, so after adjusting for 1 pair(s) no "
        "permutation verdict can reach 0.05" in md
    )
    assert "Holm's adjustment of the welch p" in md  # the default test
    # resume: everything finished is reused, nothing is trained again
    stamps = {
        d: os.path.getmtime(out / d / "metrics.jsonl")
        for d in os.listdir(out)
        if (out / d).is_dir()
    }
    assert len(stamps) == 8  # 2 variants x (2 candidates x 1 tuning seed + 2 seeds)
    again = run_grpo(*args, cwd=ROOT, timeout=900)
    assert again.returncode == 0, again.stderr
    assert again.stderr.count("finished earlier, reused") == 8
    assert {d: os.path.getmtime(out / d / "metrics.jsonl") for d in stamps} == stamps
    # an interrupted run (no completion marker, part of its metrics) is run again
    partial = out / "objective.entropy_coef-0.01_optimizer.lr-1e-3-seed1000"
    os.remove(partial / "compare_run.json")
    lines = (partial / "metrics.jsonl").read_text().splitlines()
    (partial / "metrics.jsonl").write_text(lines[0] + "\n")
    third = run_grpo(*args, cwd=ROOT, timeout=900)
    assert third.returncode == 0, third.stderr
    assert third.stderr.count("finished earlier, reused") == 7
    assert len(metrics(partial)) == 2 and (partial / "compare_run.json").exists()


def test_compare_streams_child_warnings(tiny_model, addition_data, tmp_path):
    cfg = tiny(tmp_path, tiny_model, addition_data)
    p = run_grpo(
        "compare",
        cfg,
        "--set",
        "reward={name: http, options: {url: 'http://127.0.0.1:9/score'}, failure: zero}",
        "--baselines",
        "grpo",
        "--seeds",
        "1",
        "--steps",
        "1",
        "--out",
        str(tmp_path / "w"),
        cwd=ROOT,
    )
    assert p.returncode == 0, p.stderr
    assert "[1/1] grpo seed 0: warning (step 0): reward 'http' raised" in p.stderr, p.stderr


def test_compare_rejects_bad_input_before_running(tiny_model, addition_data, tmp_path, capsys):
    from grpo_core.cli.main import main

    cfg = write_config(
        tmp_path / "c.json", make_config(tiny_model, addition_data, str(tmp_path / "r"))
    )
    out = str(tmp_path / "x")
    cases = [
        (["--baselines", "grpo,rlooo"], "did you mean 'rloo'"),
        (
            ["--vary", "kl=fixed,adaptive", "--vary", "colour=red"],
            "--vary 'colour=red': (top level): unknown key(s) ['colour']",
        ),
        (["--vary", "optimizer.lr=fast"], "--vary 'optimizer.lr=fast': optimizer.lr: found"),
        (["--vary", "optimizer.lr"], "--vary 'optimizer.lr': expected KEY=V1,V2"),
        (
            ["--baselines", "grpo", "--tune", "optimizer.lr=-1"],
            "--tune 'optimizer.lr=-1': optimizer.lr: found -1 (int), expected a number > 0",
        ),
        (
            ["--vary", "optimizer.lr=1e-3", "--tune", "train.lr=1e-2"],
            "optimizer.lr is already given by --vary 'optimizer.lr=1e-3'",
        ),
        (["--baselines", "grpo", "--seeds", "0"], "--seeds: expected a number >= 1, got 0"),
        (["--baselines", "grpo", "--jobs", "0"], "--jobs: expected a number >= 1, got 0"),
        # the same value twice would be one run directory, two runs side by side in it
        (["--baselines", "grpo,rloo,grpo"], "--baselines 'grpo,rloo,grpo': grpo given more"),
        (["--tune", "optimizer.lr=1e-3,1e-3"], "optimizer.lr=1e-3,1e-3': 1e-3 given more"),
        (["--seeds", "2"], "give --baselines A,B, --vary KEY=A,B and/or --tune KEY=A,B"),
    ]
    for extra, message in cases:
        assert main(["compare", cfg, *extra, "--out", out]) == 2, extra
        err = capsys.readouterr().err
        assert message in err and err.strip().splitlines()[-1].startswith("error: "), err
    assert not os.path.exists(out)
    # and through the real entry point: exit 2, one line, no traceback
    p = run_grpo("compare", cfg, "--vary", "colour=red", "--out", out, cwd=ROOT)
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert p.stderr.strip().splitlines()[-1].startswith("error: --vary 'colour=red'")


def test_ppo_in_baselines_sets_the_critic_section(tiny_model, addition_data, tmp_path, capsys):
    """``--baselines grpo,ppo``: PPO is a critic beside the group baseline, so its variant
    carries a ``critic`` section (not the deprecated ``baseline.name: ppo``, no notice)."""
    from grpo_core import config
    from grpo_core.cli.compare import apply
    from grpo_core.config.view import view

    base = make_config(tiny_model, addition_data, str(tmp_path / "r"))
    ppo = apply(base, [("baseline", "ppo", "ppo")])
    assert ppo["critic"] == {"name": "ppo", "options": {}}
    assert ppo.get("baseline") == base.get("baseline") and "critic" not in base
    checked = view(config.validate(ppo))
    assert checked.critic is not None and checked.critic.name == "ppo"
    rloo = apply(base, [("baseline", "rloo", "rloo")])
    assert rloo["baseline"]["name"] == "rloo" and "critic" not in rloo
    assert "deprecated" not in capsys.readouterr().err


def test_recipe_example_validates(tmp_path):
    p = run_grpo("validate", RECIPE, *gsm8k_or_stand_in(tmp_path), cwd=ROOT)
    assert p.returncode == 0, p.stderr
    import yaml

    eff = yaml.safe_load(p.stdout)
    assert eff["sampling"]["group_size"] == 16 and eff["baseline"]["options"]["eps"] == 1e-8
    assert 1e-6 <= eff["optimizer"]["lr"] <= 5e-6
    assert 0.01 <= eff["kl"]["options"]["coef"] <= 0.04


HANG = 600  # seconds: a guard against a hang only, never a bound on speed


def _wait(check, what: str):
    t0 = time.monotonic()
    while not check():
        assert time.monotonic() - t0 < HANG, f"no {what} after {HANG} s"
        time.sleep(0.05)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_a_killed_compare_ends_its_run_and_a_rerun_respects_a_live_one(
    tiny_model, addition_data, tmp_path, sig
):
    cfg, out = tiny(tmp_path, tiny_model, addition_data), tmp_path / "cmp"
    args = ["compare", cfg, "--baselines", "grpo", "--seeds", "1", "--steps", "5000"]
    first = subprocess.Popen(
        [sys.executable, "-m", "grpo_core.cli", *args, "--out", str(out)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=ROOT,
    )
    try:
        _wait(lambda: glob.glob(str(out / "*" / "metrics.jsonl")), "run under way")
        run_dir = os.path.dirname(glob.glob(str(out / "*" / "metrics.jsonl"))[0])
        child = int(open(os.path.join(run_dir, ".grpo-lock")).read())
        assert child != first.pid and _alive(child)
        # a second compare on the same --out: the live run is not deleted nor joined
        second = run_grpo(*args, "--out", str(out), cwd=ROOT)
        lines = [x for x in second.stderr.splitlines() if x.startswith("error:")]
        assert second.returncode == 2 and len(lines) == 1, second.stderr
        assert f"in use by another grpo process (PID {child})" in lines[0], lines[0]
        assert "Traceback" not in second.stderr
        assert os.path.isfile(os.path.join(run_dir, "metrics.jsonl")) and _alive(child)
        first.send_signal(sig)
        first.wait()
        _wait(lambda: not _alive(child), "end of the child grpo train with its compare")
    finally:
        first.kill()
        first.wait()


def test_a_cut_finished_run_record_is_one_line(tiny_model, addition_data, tmp_path):
    cfg, out = tiny(tmp_path, tiny_model, addition_data), tmp_path / "cmp"
    args = ["compare", cfg, "--baselines", "grpo", "--seeds", "1", "--steps", "1"]
    p = run_grpo(*args, "--out", str(out), cwd=ROOT)
    assert p.returncode == 0, p.stderr
    (marker,) = glob.glob(str(out / "*" / "compare_run.json"))
    with open(marker, "r+") as f:
        f.truncate(10)
    p = run_grpo(*args, "--out", str(out), cwd=ROOT)
    lines = [x for x in p.stderr.splitlines() if x.startswith("error:")]
    assert p.returncode == 2 and len(lines) == 1 and "Traceback" not in p.stderr, p.stderr
    assert "compare_run.json: cannot read it" in lines[0] and "delete it" in lines[0]
    assert os.path.isfile(os.path.join(os.path.dirname(marker), "metrics.jsonl"))  # kept


def test_a_study_kept_without_its_weights_resumes_in_another_checkout(
    tiny_model, addition_data, tmp_path
):
    """What bench/smollm2_compare relies on: a study whose paths are relative and whose model
    is ``${env:NAME}``, its runs kept without what .gitignore leaves out of them (weights,
    samples, events, locks), is reused in full from another directory with the model
    elsewhere."""
    here, there = tmp_path / "here", tmp_path / "there"
    here.mkdir()
    shutil.copy(addition_data, here / "train.jsonl")
    cfg = json.loads(open(tiny(tmp_path, tiny_model, addition_data)).read())
    cfg["model"]["name_or_path"] = "${env:STUDY_MODEL}"
    cfg["data"]["path"] = "train.jsonl"
    write_config(here / "c.json", cfg)
    args = ["compare", "c.json", "--baselines", "grpo,rloo", "--seeds", "1", "--out", "runs"]
    first = run_grpo(*args, cwd=here, env={"STUDY_MODEL": tiny_model}, timeout=900)
    assert first.returncode == 0, first.stderr
    shutil.copytree(here, there)
    left_out = [
        line.strip().removeprefix("/bench/smollm2_compare/runs/*/").rstrip("/")
        for line in open(os.path.join(ROOT, ".gitignore"), encoding="utf-8")
        if line.startswith("/bench/smollm2_compare/runs/*/")
    ]
    assert "final" in left_out
    for pattern in left_out:
        for path in glob.glob(str(there / "runs" / "*" / pattern)):
            shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)
    assert not glob.glob(str(there / "runs" / "*" / "final"))
    moved = shutil.copytree(tiny_model, tmp_path / "elsewhere")
    again = run_grpo(*args, cwd=there, env={"STUDY_MODEL": str(moved)}, timeout=900)
    assert again.returncode == 0, again.stderr
    assert again.stderr.count("finished earlier, reused") == 2
    before, after = ((d / "runs" / "compare.md").read_text() for d in (here, there))
    for variant in ("grpo", "rloo"):  # the same figures, from the same records
        assert cells(after, variant) == cells(before, variant) != []


def test_jobs_run_side_by_side_with_the_same_results(tiny_model, addition_data, tmp_path):
    """--jobs 2: runs start together (each one's start before the other's end), and a run
    gives the same metrics as when it runs alone."""
    cfg, out = tiny(tmp_path, tiny_model, addition_data), tmp_path / "cmp"
    args = ["compare", cfg, "--baselines", "grpo,rloo", "--seeds", "1", "--steps", "2"]
    p = run_grpo(*args, "--jobs", "2", "--out", str(out), cwd=ROOT, timeout=900)
    assert p.returncode == 0, p.stderr
    span = {  # config written just before the child starts; marker once it has finished
        name: (
            os.path.getmtime(out / f"{name}.yaml"),
            os.path.getmtime(out / name / "compare_run.json"),
        )
        for name in ("grpo-seed0", "rloo-seed0")
    }
    assert max(s for s, _ in span.values()) < min(e for _, e in span.values()), span
    assert cells((out / "compare.md").read_text(), "rloo")
    side_by_side = metrics(out / "rloo-seed0")
    os.remove(out / "rloo-seed0" / "compare_run.json")  # run it again, alone
    again = run_grpo(*args, "--out", str(out), cwd=ROOT, timeout=900)
    assert again.returncode == 0, again.stderr
    assert again.stderr.count("finished earlier, reused") == 1
    alone = metrics(out / "rloo-seed0")
    keys = ("reward", "loss", "grad_norm", "completion_len")
    assert [[r[k] for k in keys] for r in alone] == [[r[k] for k in keys] for r in side_by_side]


@pytest.mark.parametrize("jobs", [1, 2])
def test_a_failed_run_ends_the_study(tiny_model, addition_data, tmp_path, jobs):
    """The failed run's error, one line; with --jobs 2 the long run beside it is ended, with
    --jobs 1 the run after it never starts."""
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "1 + 1"}\n')  # no "answer" column
    cfg, out = tiny(tmp_path, tiny_model, addition_data), tmp_path / "cmp"
    p = run_grpo(
        "compare",
        cfg,
        "--vary",
        f"data.path={bad},{addition_data}",
        "--seeds",
        "1",
        "--steps",
        "1000000",
        "--jobs",
        str(jobs),
        "--out",
        str(out),
        cwd=ROOT,
        timeout=HANG,
    )
    lines = [x for x in p.stderr.splitlines() if x.startswith("error:")]
    assert p.returncode == 2 and len(lines) == 1 and "Traceback" not in p.stderr, p.stderr
    assert "bad.jsonl" in lines[0] and "failed" in lines[0], lines[0]
    assert "seed 0: failed, 0/1000000 steps" in p.stderr and ": done," not in p.stderr
    good = [d for d in glob.glob(str(out / "*-seed0")) if "bad" not in d]
    if jobs == 1:
        assert good == [], good
        return
    child = int(open(os.path.join(good[0], ".grpo-lock")).read())
    _wait(lambda: not _alive(child), "end of the long run beside the failed one")
    assert "seed 0: stopped" in p.stderr
    assert not os.path.exists(os.path.join(good[0], "compare_run.json"))
