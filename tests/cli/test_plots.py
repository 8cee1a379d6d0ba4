"""``grpo plot`` on hand-written run directories: what each line holds (x from ``step``, raw
points for sparse series), labels, the default figure set, and a bad metric name."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from helpers import ROOT, run_grpo
from test_compare import COLOURS, has_colour

from grpo_core.cli import plots
from grpo_core.errors import UserError


def write_run(path, steps=range(100, 200), eval_every=25, offset=0.0) -> str:
    """A run directory whose steps start at 100 (as a resumed run's can), with a format
    dimension, and eval points every ``eval_every`` steps."""
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "metrics.jsonl"), "w") as f:
        for i, s in enumerate(steps):
            rec = {
                "step": s,
                "reward": offset + i / 100,
                "reward/format": 1.0,
                "kl": 0.01,
                "entropy": 1.0 - i / 200,
                "completion_len": 3.0,
                "health": [],
            }
            if (s + 1) % eval_every == 0:
                rec["eval/accuracy"] = offset + s / 1000
            f.write(json.dumps(rec) + "\n")
    return str(path)


def test_lines_use_the_step_field_and_keep_sparse_points_raw(tmp_path):
    run = plots.read(write_run(tmp_path / "a"))
    drawn, window = plots.lines({"a": [run]}, "reward")
    assert window == 2  # 100 points / 50
    assert list(drawn[0]["x"]) == list(range(100, 200))  # not the row index 0..99
    assert drawn[0]["mean"][1] == pytest.approx((0.0 + 0.01) / 2)  # trailing mean of 2
    drawn, _ = plots.lines({"a": [run]}, "eval/accuracy")
    assert drawn[0]["sparse"] and list(drawn[0]["x"]) == [124, 149, 174, 199]
    assert list(drawn[0]["mean"]) == pytest.approx([0.124, 0.149, 0.174, 0.199])  # unsmoothed


def test_bands_over_seeds_and_interpolation_on_other_axes(tmp_path):
    a = plots.read(write_run(tmp_path / "s0"))
    b = plots.read(write_run(tmp_path / "s1", offset=0.2))
    drawn, _ = plots.lines({"v": [a, b]}, "reward", smooth_window=1)
    assert drawn[0]["n"] == 2
    assert drawn[0]["lo"][0] == pytest.approx(0.0) and drawn[0]["hi"][0] == pytest.approx(0.2)
    assert drawn[0]["mean"][0] == pytest.approx(0.1)
    # against another field with different x per run: both interpolated on the overlap
    a2 = [{**r, "generated_tokens": 10.0 * (i + 1)} for i, r in enumerate(a)]
    b2 = [{**r, "generated_tokens": 20.0 * (i + 1)} for i, r in enumerate(b)]
    drawn, _ = plots.lines({"v": [a2, b2]}, "reward", x="generated_tokens", smooth_window=1)
    x = drawn[0]["x"]
    assert x[0] == pytest.approx(20.0) and x[-1] == pytest.approx(1000.0)
    # at 20 tokens run a is at its 2nd step (0.01), run b at its 1st (0.2)
    assert drawn[0]["lo"][0] == pytest.approx(0.01) and drawn[0]["hi"][0] == pytest.approx(0.2)


def test_unique_labels():
    assert plots.unique_labels(["/x/a/run", "/x/b/run"]) == ["a/run", "b/run"]
    assert plots.unique_labels(["/x/run1", "/y/run2"]) == ["run1", "run2"]
    assert plots.unique_labels(["/x/a/run", "/x/a/run/"]) == ["/x/a/run", "/x/a/run (2)"]


def test_default_metrics_include_dimensions_length_and_eval(tmp_path):
    run = plots.read(write_run(tmp_path / "a"))
    assert plots.default_metrics([run]) == [
        "reward",
        "reward/format",
        "kl",
        "entropy",
        "completion_len",
        "eval/accuracy",
    ]
    assert "health" not in plots.available([run])


def test_unknown_metric_names_what_is_there(tmp_path):
    d = write_run(tmp_path / "a")
    with pytest.raises(UserError, match=r"no run has 'rewrd'; available: completion_len, "):
        plots.plot_runs([d], ["reward", "rewrd"])
    p = run_grpo("plot", d, "--metrics", "reward,rewrd", cwd=ROOT)
    assert p.returncode == 2
    assert p.stderr.strip().count("\n") == 0 and "Traceback" not in p.stderr
    assert "'rewrd'" in p.stderr and "eval/accuracy" in p.stderr


def test_plot_cli_two_runs_same_folder_name_default_set(tmp_path):
    a = write_run(tmp_path / "exp1" / "run")
    b = write_run(tmp_path / "exp2" / "run", offset=0.5)
    out = tmp_path / "plots"
    p = run_grpo("plot", a, b, "--out", str(out), cwd=ROOT)
    assert p.returncode == 0, p.stderr
    assert sorted(os.listdir(out)) == sorted(
        [
            "reward.png",
            "reward_format.png",
            "kl.png",
            "entropy.png",
            "completion_len.png",
            "eval_accuracy.png",
        ]
    )
    for name in ("reward.png", "eval_accuracy.png"):  # both runs drawn, in two colours
        assert has_colour(str(out / name), COLOURS["C0"])
        assert has_colour(str(out / name), COLOURS["C1"])
    assert np.array_equal(plots.smooth([1.0, 3.0, 5.0], 2), [1.0, 2.0, 4.0])
