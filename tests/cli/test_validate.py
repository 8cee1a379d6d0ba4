"""``grpo validate`` checks what ``grpo train`` would trip on, before anything heavy loads, and
``grpo train`` runs the same checks first; progress output in terminals and in logs."""

from __future__ import annotations

import os
import re
import shutil

import pytest
import torch
from helpers import ROOT, make_config, run_grpo, write_config

from grpo_core.cli.main import main


def problems(capsys, cfg, tmp_path, command="validate") -> list[str]:
    code = main([command, write_config(tmp_path / "c.json", cfg)])
    err = capsys.readouterr().err
    lines = [x[len("error: ") :] for x in err.splitlines() if x.startswith("error: ")]
    assert (code == 2) == bool(lines) and "Traceback" not in err, err
    return lines


def base(tiny_model, addition_data, tmp_path, **sections):
    return make_config(tiny_model, addition_data, str(tmp_path / "run"), **sections)


def test_a_good_config_passes(tiny_model, addition_data, tmp_path, capsys):
    assert problems(capsys, base(tiny_model, addition_data, tmp_path), tmp_path) == []


@pytest.mark.parametrize(
    "change,needle",
    [
        (lambda c, t: c["data"].update(path=str(t / "missing.jsonl")), "data.path: file not found"),
        (
            lambda c, t: c["model"].update(name_or_path=str(t / "no_model")),
            "is not a model directory",
        ),
        (lambda c, t: c["model"].update(name_or_path=str(t)), "has no config.json"),
        (lambda c, t: c["data"].update(prompt_field="question"), "row 0 has no field 'question'"),
        (lambda c, t: c["data"].update(columns=[]), "the reward reads ['answer']"),
        (lambda c, t: c["data"].update(chat_template="always"), "has no chat template"),
        (
            lambda c, t: c.setdefault("eval", {}).update(
                data=str(t / "held_out.jsonl"), every_n_steps=5
            ),
            "eval.data: file not found",
        ),
        (lambda c, t: c.update(deepspeed=str(t / "ds.json")), "deepspeed: config file not found"),
        (
            lambda c, t: c.update(deepspeed={"zero_optimization": {"stage": 4}}),
            "deepspeed.zero_optimization.stage: 4; expected 0 to 3",
        ),
        (
            lambda c, t: c.update(
                deepspeed={"zero_optimization": {"stage": 3}}, generator={"name": "vllm"}
            ),
            "vllm is not supported with deepspeed ZeRO-3",
        ),
        (
            lambda c, t: c.update(
                deepspeed={"zero_optimization": {"stage": 3, "offload_param": {"device": "nvme"}}}
            ),
            "deepspeed.zero_optimization.offload_param.device: nvme is not supported",
        ),
    ],
)
def test_each_problem_is_found_before_training(
    tiny_model, addition_data, tmp_path, capsys, change, needle
):
    cfg = base(tiny_model, addition_data, tmp_path)
    change(cfg, tmp_path)
    found = problems(capsys, cfg, tmp_path)
    assert any(needle in p for p in found), found


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks what a CPU-only machine refuses")
def test_what_needs_a_gpu_is_refused_on_a_cpu(tiny_model, addition_data, tmp_path, capsys):
    cfg = base(tiny_model, addition_data, tmp_path, generator={"name": "vllm"})
    cfg["model"]["quantization"] = "4bit"
    cfg["runtime"]["device"] = "cuda"
    found = problems(capsys, cfg, tmp_path)
    assert len(found) == 3, found  # every problem at once, one line each
    assert any("quantization" in p for p in found) and any("vllm" in p for p in found)


def test_a_users_folder_as_output_dir(tiny_model, addition_data, tmp_path, capsys):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("mine")
    cfg = base(tiny_model, addition_data, tmp_path)
    cfg["output"]["dir"] = str(tmp_path / "mine")
    assert any("not a grpo run directory" in p for p in problems(capsys, cfg, tmp_path))


def test_train_runs_the_checks_first(tiny_model, addition_data, tmp_path):
    cfg = base(tiny_model, addition_data, tmp_path)
    cfg["data"]["columns"] = []
    p = run_grpo("train", write_config(tmp_path / "c.json", cfg), cwd=ROOT)
    assert p.returncode == 2 and "the reward reads ['answer']" in p.stderr, p.stderr
    # refused before any work (the bound here is the work, not the time): no run directory
    assert not os.path.exists(tmp_path / "run")


def test_progress_in_a_log_is_a_line_every_twentieth_of_the_run(
    tiny_model, addition_data, tmp_path
):
    cfg = base(
        tiny_model,
        addition_data,
        tmp_path,
        train={"steps": 40, "prompts_per_step": 2},
        sampling={"group_size": 2, "max_new_tokens": 2},
    )
    cfg["output"]["progress"] = True
    p = run_grpo("train", write_config(tmp_path / "c.json", cfg), cwd=ROOT)
    assert p.returncode == 0, p.stderr
    lines = [x for x in p.stderr.splitlines() if x.startswith("train: ")]
    assert [x.split()[1] for x in lines] == [f"{s}/40" for s in range(2, 41, 2)]
    # tqdm's meter: elapsed<remaining and the rate, then the shown metrics; no carriage return
    assert all(
        re.search(r"\[\d+:\d\d<\d+:\d\d,\s+[\d.]+(s/step|step/s), reward=", x) for x in lines
    )
    assert "\r" not in p.stderr


def test_progress_on_a_terminal_is_one_updating_bar(tiny_model, addition_data, tmp_path):
    if shutil.which("script") is None:
        pytest.skip("needs script(1) to give the run a terminal")
    cfg = base(
        tiny_model,
        addition_data,
        tmp_path,
        train={"steps": 6, "prompts_per_step": 2},
        sampling={"group_size": 2, "max_new_tokens": 2},
    )
    cfg["output"]["progress"] = True
    path = write_config(tmp_path / "c.json", cfg)
    import subprocess
    import sys

    cmd = f"{sys.executable} -m grpo_core.cli train {path}"
    out = subprocess.run(
        ["script", "-qec", cmd, "/dev/null"], capture_output=True, text=True, cwd=ROOT, timeout=300
    ).stdout
    # a tqdm bar drawn at the start and redrawn at every step, not only every twentieth
    # (text mode reads each carriage return as a line end)
    assert out.count("train:") >= 7 and "6/6" in out and "reward=" in out
