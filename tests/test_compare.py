"""``grpo compare`` and ``grpo plot`` on the tiny model: the table and real PNG curves."""

from __future__ import annotations

import os

import numpy as np
from conftest import ROOT, make_config, run_grpo, write_config

COLOURS = {"C0": (0x1F, 0x77, 0xB4), "C1": (0xFF, 0x7F, 0x0E)}  # matplotlib's first two


def has_colour(png: str, rgb) -> bool:
    import matplotlib.image as mpimg

    img = (mpimg.imread(png)[..., :3] * 255).round().astype(int)
    return bool((np.abs(img - np.array(rgb)).sum(-1) < 30).sum() > 50)


def test_compare_two_baselines_two_seeds(tiny_model, addition_data, tmp_path):
    cfg = write_config(tmp_path / "c.json", make_config(
        tiny_model, addition_data, str(tmp_path / "unused"),
        reward={"name": "format", "options": {"tags": [], "patterns": ["[0-9]"]}},
        train={"steps": 3, "prompts_per_step": 2}, optimizer={"lr": 1e-2}))
    out = tmp_path / "cmp"
    p = run_grpo("compare", cfg, "--baselines", "grpo,rloo", "--seeds", "2", "--steps", "3",
                 "--threshold", "0.5", "--out", str(out), cwd=ROOT, timeout=900)
    assert p.returncode == 0, p.stderr
    md = (out / "compare.md").read_text()
    rows = [line for line in md.splitlines() if line.startswith("| grpo") or
            line.startswith("| rloo")]
    assert len(rows) == 2
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert len(cells) == 6 and "±" in cells[1]
        assert "seeds)" in cells[2] or cells[2] == "not reached (0/2)"
    assert len([d for d in os.listdir(out) if d.endswith("-seed0") or d.endswith("-seed1")]) == 4
    for metric in ("reward", "kl", "entropy"):
        png = out / f"{metric}.png"
        assert png.exists() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert has_colour(str(png), COLOURS["C0"]) and has_colour(str(png), COLOURS["C1"])
    # grpo plot on two of those runs
    runs = sorted(str(out / d) for d in os.listdir(out) if d.endswith("-seed0"))
    plotted = run_grpo("plot", *runs, "--metrics", "reward,entropy", "--out",
                       str(tmp_path / "plots"), cwd=ROOT)
    assert plotted.returncode == 0, plotted.stderr
    assert sorted(os.listdir(tmp_path / "plots")) == ["entropy.png", "reward.png"]


def test_compare_rejects_unknown_names_before_running(tiny_model, addition_data, tmp_path):
    cfg = write_config(tmp_path / "c.json", make_config(tiny_model, addition_data,
                                                        str(tmp_path / "r")))
    p = run_grpo("compare", cfg, "--baselines", "grpo,rlooo", "--out", str(tmp_path / "x"),
                 cwd=ROOT)
    assert p.returncode == 2 and "did you mean 'rloo'" in p.stderr
    p = run_grpo("compare", cfg, "--vary", "kl=fixed,adaptive", "--vary", "colour=red",
                 "--out", str(tmp_path / "x"), cwd=ROOT)
    assert p.returncode == 2 and "--vary 'colour=red'" in p.stderr
