"""``grpo eval`` and validation during training."""

from __future__ import annotations

import json
import os
from math import comb

import pytest
from helpers import ROOT, make_config, run_grpo, write_config

from grpo_core import config
from grpo_core.observe.evaluate import accuracy_by, pass_at_k
from grpo_core.trainer import train


def test_pass_at_k_by_hand():
    assert pass_at_k(5, 2, 1) == pytest.approx(2 / 5)
    assert pass_at_k(5, 2, 2) == pytest.approx(1 - 3 / 10)  # 1 - C(3,2)/C(5,2)
    assert pass_at_k(4, 1, 4) == 1.0 and pass_at_k(4, 0, 2) == 0.0 and pass_at_k(3, 3, 1) == 1
    assert pass_at_k(10, 3, 4) == pytest.approx(1 - comb(7, 4) / comb(10, 4))
    with pytest.raises(ValueError):
        pass_at_k(2, 1, 4)


def test_accuracy_by_counts_each_completion_under_its_problems_value():
    rows = [{"level": 1}, {"level": 2}, {"level": 1}]
    records = [  # two completions a problem, as an evaluation with n = 2 lists them
        {"problem": 0, "correct": True},
        {"problem": 0, "correct": True},
        {"problem": 1, "correct": False},
        {"problem": 1, "correct": True},
        {"problem": 2, "correct": False},
        {"problem": 2, "correct": True},
    ]
    # level 1: 3 right of 4 completions over 2 problems; level 2: 1 of 2
    assert accuracy_by(rows, records, "level") == {
        "1": {"problems": 2, "accuracy": 0.75},
        "2": {"problems": 1, "accuracy": 0.5},
    }
    assert accuracy_by(rows, [], "level") == {}


def test_grpo_eval_by_a_column(warm_model, tmp_path):
    """``--by COLUMN``: the accuracy per value of a data column, each the share of correct
    completions among that value's problems (read back from completions.jsonl); a column the
    held-out rows lack is one line naming the flag and the column."""
    from grpo_core.tiny import addition_rows, write_jsonl

    rows = [dict(r, size="big" if int(r["answer"]) >= 10 else "small") for r in addition_rows(0)[0]]
    data = str(tmp_path / "test.jsonl")
    write_jsonl(data, rows[:12])
    cfg = write_config(tmp_path / "c.json", make_config(warm_model, data, str(tmp_path / "run")))
    out = tmp_path / "ev"
    p = run_grpo("eval", cfg, "--n", "2", "--temperature", "1", "--by", "size", "--out", str(out))
    assert p.returncode == 0, p.stderr
    report = json.load(open(out / "report.json"))
    by = report["by"]["size"]
    completions = [json.loads(x) for x in open(out / "completions.jsonl")]
    for value, figures in by.items():
        mine = [c for c in completions if rows[c["problem"]]["size"] == value]
        assert figures["problems"] == len(mine) // 2
        assert figures["accuracy"] == sum(c["correct"] for c in mine) / len(mine)
    assert sorted(by) == ["big", "small"] and sum(v["problems"] for v in by.values()) == 12
    assert 0 < report["accuracy"] < 1  # the warm model solves some and misses some
    bad = run_grpo("eval", cfg, "--by", "level", "--out", str(tmp_path / "bad"))
    assert bad.returncode != 0 and "Traceback" not in bad.stderr
    assert bad.stderr.strip().splitlines()[-1].startswith("error: --by level: 12 of 12"), bad.stderr


def test_grpo_eval_writes_report_and_completions(tiny_model, addition_data, tmp_path):
    cfg = write_config(
        tmp_path / "c.json", make_config(tiny_model, addition_data, str(tmp_path / "run"))
    )
    out = tmp_path / "ev"
    p = run_grpo(
        "eval",
        cfg,
        "--data",
        addition_data,
        "--n",
        "4",
        "--temperature",
        "1.0",
        "--max-problems",
        "6",
        "--out",
        str(out),
        cwd=ROOT,
    )
    assert p.returncode == 0, p.stderr
    # stderr is not a terminal here: no progress bar drawn into the log
    assert "eval [" not in p.stderr and "problem/s" not in p.stderr and "%|" not in p.stderr
    report = json.load(open(out / "report.json"))
    assert report["problems"] == 6 and report["samples_per_problem"] == 4
    for key in ("accuracy", "pass@1", "pass@2", "pass@4", "reward", "completion_len"):
        assert 0 <= report[key] <= (1 if key != "completion_len" else 64), key
    assert report["pass@1"] == pytest.approx(report["accuracy"])
    assert report["pass@4"] >= report["pass@2"] >= report["pass@1"]
    rows = [json.loads(x) for x in open(out / "completions.jsonl")]
    assert len(rows) == 24
    assert set(rows[0]) >= {
        "problem",
        "prompt",
        "completion",
        "reward",
        "correct",
        "tokens",
        "answer",
    }
    greedy = run_grpo(
        "eval",
        cfg,
        "--data",
        addition_data,
        "--max-problems",
        "3",
        "--out",
        str(tmp_path / "g"),
        cwd=ROOT,
    )
    assert greedy.returncode == 0
    assert json.load(open(tmp_path / "g" / "report.json"))["temperature"] == 0.0


def test_validation_during_training(tiny_model, addition_data, tmp_path):
    cfg = config.validate(
        make_config(
            tiny_model,
            addition_data,
            str(tmp_path / "run"),
            train={"steps": 5, "prompts_per_step": 2},
            eval={
                "data": addition_data,
                "every_n_steps": 2,
                "max_problems": 4,
                "n": 2,
                "temperature": 1.0,
                "keep_best": "accuracy",
            },
        )
    )
    train(cfg)
    rows = [json.loads(x) for x in open(tmp_path / "run" / "metrics.jsonl")]
    with_eval = [r["step"] for r in rows if "eval/accuracy" in r]
    assert with_eval == [1, 3, 4]  # every 2 steps, and at the end
    assert all("eval/pass@2" in rows[s] for s in with_eval)
    assert os.path.exists(tmp_path / "run" / "best" / "best.json")


def _spy_evaluations(monkeypatch, module) -> list[tuple[dict, list[dict]]]:
    """Every (report, records) the real ``evaluate_configured`` returns where ``module`` calls
    it: a spy, not a stand-in (validation writes only the report's figures to metrics)."""
    from grpo_core.observe import evaluate as evaluate_mod

    seen, real = [], evaluate_mod.evaluate_configured

    def spy(*args, **kwargs):
        seen.append(real(*args, **kwargs))
        return seen[-1]

    monkeypatch.setattr(module, "evaluate_configured", spy)
    return seen


def _outcomes(records: list[dict]) -> list[tuple]:
    return [(r["problem"], r["completion"], r["reward"], r["correct"]) for r in records]


def test_grpo_eval_of_the_final_model_repeats_the_last_validation(
    warm_model, tmp_path, monkeypatch
):
    """Validation at the last step and ``grpo eval`` of the saved final model (the config
    alone, no flags): the same weights, problems and settings give the same completions,
    outcomes and figures. Sampled (n=2, temperature 1) so the seed and row ids matter, in
    batches of 3 of 8 problems (a ragged last batch), judged at a threshold below 1; on the
    CPU in float32 every completion is the same, token for token."""
    from grpo_core import phases
    from grpo_core.tiny import addition_rows, write_jsonl

    train_rows, _ = addition_rows(0)
    data = str(tmp_path / "data")
    write_jsonl(os.path.join(data, "train.jsonl"), train_rows)
    # problems the warm start taught (held-out ones it mostly misses): outcomes of both kinds
    write_jsonl(os.path.join(data, "test.jsonl"), train_rows[:8])
    cfg = make_config(
        warm_model,
        os.path.join(data, "train.jsonl"),
        str(tmp_path / "run"),
        train={"steps": 2, "prompts_per_step": 2, "micro_batch_groups": 1, "seed": 0},
        optimizer={"lr": 1e-3},
        eval={
            "data": data,
            "every_n_steps": 2,
            "max_problems": 8,
            "n": 2,
            "temperature": 1.0,
            "batch_prompts": 3,
            "pass_threshold": 0.5,
        },
    )
    validations = _spy_evaluations(monkeypatch, phases)
    train(config.validate(cfg))
    assert len(validations) == 1  # at the last step only
    (during, records) = validations[0]
    metrics = [json.loads(x) for x in open(tmp_path / "run" / "metrics.jsonl")]
    assert metrics[-1]["eval/accuracy"] == during["accuracy"]

    out = tmp_path / "ev"
    p = run_grpo(
        "eval",
        write_config(tmp_path / "c.json", cfg),
        "--model",
        str(tmp_path / "run" / "final"),
        "--out",
        str(out),
        cwd=ROOT,
    )
    assert p.returncode == 0, p.stderr
    after = json.load(open(out / "report.json"))
    final = [json.loads(x) for x in open(out / "completions.jsonl")]
    assert after["problems"] == 8 and after["samples_per_problem"] == 2
    assert after["temperature"] == 1.0
    assert _outcomes(final) == _outcomes(records)
    for key in ("accuracy", "reward", "completion_len", "pass@1", "pass@2"):
        assert after[key] == during[key], key
    # a figure that can tell: the trained model solves some problems and misses others
    assert 0 < during["accuracy"] < 1, during
