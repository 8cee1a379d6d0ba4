"""Config validation: every problem reported at once, one line each, exit code 2."""

from __future__ import annotations

import json
import os

import pytest
import yaml
from helpers import ROOT, run_grpo, write_config

from grpo_core import config
from grpo_core.cli.main import main
from grpo_core.errors import ConfigError

PROMPTS = os.path.join(ROOT, "tests", "data", "prompts.jsonl")
GOOD = {
    "model": {"name_or_path": "m"},
    "data": {"path": PROMPTS, "columns": ["answer"]},
    "reward": {"name": "math"},
}


def with_(**parts):
    cfg = json.loads(json.dumps(GOOD))
    for dotted, value in parts.items():
        node = cfg
        keys = dotted.split("__")
        for k in keys[:-1]:
            node = node.setdefault(k, {})
        node[keys[-1]] = value
    return cfg


WEIGHTED = {
    "name": "weighted",
    "options": {"components": [{"name": "math"}, {"name": "format", "weight": "heavy"}]},
}
NESTED_BAD = {
    "name": "weighted",
    "options": {"components": [{"name": "math", "options": {"strict": "yes"}}]},
}
NESTED_UNKNOWN = {"name": "weighted", "options": {"components": [{"name": "maths"}]}}

CASES = [
    (
        "wrong type int",
        with_(train__steps="ten"),
        'train.steps: found "ten" (str), expected integer',
    ),
    (
        "wrong type bool",
        with_(model__trust_remote_code="no"),
        'model.trust_remote_code: found "no" (str), expected boolean',
    ),
    (
        "below minimum",
        with_(sampling__group_size=0),
        "sampling.group_size: found 0 (int), expected a number >= 1",
    ),
    (
        "bad enum",
        with_(objective={"name": "grpo", "aggregation": "mean"}),
        'objective.aggregation: found "mean" (str), expected one of',
    ),
    ("unknown top key", with_(trainer={"steps": 3}), "(top level): unknown key(s) ['trainer']"),
    ("unknown nested key", with_(train__lr_rate=0.1), "train: unknown key(s) ['lr_rate']"),
    (
        "missing model",
        {k: v for k, v in GOOD.items() if k != "model"},
        "model.name_or_path: missing, required",
    ),
    ("missing name_or_path", with_(model={}), "model.name_or_path: missing, required"),
    ("missing reward name", with_(reward={"options": {}}), "reward.name: missing, required"),
    ("unknown reward", with_(reward={"name": "maht"}), "did you mean 'math'?"),
    (
        "unknown baseline",
        with_(baseline={"name": "rlo"}),
        "baseline.name: unknown baseline plugin 'rlo'",
    ),
    ("unknown kl", with_(kl={"name": "adaptiv"}), "did you mean 'adaptive'?"),
    ("unknown generator", with_(generator={"name": "sglang"}), "installed: hf, vllm"),
    (
        "bad plugin option type",
        with_(reward={"name": "math", "options": {"timeout": "2s"}}),
        'reward.options.timeout: found "2s" (str), expected number',
    ),
    (
        "unknown plugin option",
        with_(baseline={"name": "grpo", "options": {"center": 1}}),
        "baseline.options: unknown key(s) ['center']",
    ),
    (
        "missing required option",
        with_(reward={"name": "http"}),
        "reward.options.url: missing, required",
    ),
    (
        "nested weight type",
        with_(reward=WEIGHTED),
        'reward.options.components[1].weight: found "heavy" (str), expected number',
    ),
    (
        "nested option",
        with_(reward=NESTED_BAD),
        'reward.options.components[0].options.strict: found "yes" (str), expected boolean',
    ),
    (
        "nested unknown name",
        with_(reward=NESTED_UNKNOWN),
        "reward.options.components[0].name: unknown reward plugin 'maths'",
    ),
    (
        "options not a mapping",
        with_(reward={"name": "math", "options": [1]}),
        "reward.options: found [1] (list), expected object",
    ),
    (
        "kl option",
        with_(kl={"name": "adaptive", "options": {"target": -1}}),
        "kl.options.target: found -1 (int), expected a number > 0",
    ),
    ("section wrong type", with_(sampling=5), "sampling: found 5 (int), expected object"),
]


@pytest.mark.parametrize("name,cfg,expected", CASES, ids=[c[0] for c in CASES])
def test_malformed_config_gives_one_line_error(tmp_path, capsys, name, cfg, expected):
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg))
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert expected in err, err
    assert "Traceback" not in err
    assert all(line.startswith("error: ") for line in err.strip().splitlines())


FILE_CASES = [
    ("yaml syntax", "model: {name_or_path: m\n", "invalid YAML at line"),
    ("empty file", "", "config file is empty"),
    ("not a mapping", "- 1\n- 2\n", "expected a mapping at the top level, found list"),
    ("tab indentation", "model:\n\tname_or_path: m\n", "invalid YAML"),
]


@pytest.mark.parametrize("name,text,expected", FILE_CASES, ids=[c[0] for c in FILE_CASES])
def test_unreadable_config_files(tmp_path, capsys, name, text, expected):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    assert main(["validate", str(path)]) == 2
    assert expected in capsys.readouterr().err


def test_missing_file_and_bad_json(tmp_path, capsys):
    assert main(["validate", str(tmp_path / "nope.yaml")]) == 2
    assert "config file not found" in capsys.readouterr().err
    bad = tmp_path / "c.json"
    bad.write_text('{"model": }')
    assert main(["validate", str(bad)]) == 2
    assert "invalid JSON at line 1" in capsys.readouterr().err


def test_all_errors_reported_at_once(tmp_path, capsys):
    cfg = with_(train__steps="x", sampling__group_size=-1, baseline={"name": "nope"})
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg))
    assert main(["validate", str(path)]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 3, lines


def test_defaults_filled_and_overrides(tmp_path, capsys):
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(GOOD))
    assert (
        main(
            [
                "validate",
                str(path),
                "--set",
                "optimizer.lr=3e-4",
                "--set",
                "baseline.name=rloo",
                "--set",
                "reward.options.strict=true",
            ]
        )
        == 0
    )
    eff = yaml.safe_load(capsys.readouterr().out)
    assert eff["optimizer"]["lr"] == 3e-4 and eff["baseline"] == {"name": "rloo", "options": {}}
    assert eff["reward"]["options"]["strict"] is True
    assert eff["reward"]["options"]["timeout"] == 2.0  # plugin default filled
    assert eff["sampling"]["group_size"] == 8 and eff["kl"]["name"] == "fixed"


def test_a_plugin_section_without_its_name_takes_the_default_plugin(tmp_path, capsys):
    """``--set objective.entropy_coef=...`` on a config without an ``objective`` section
    means the default objective with a bonus; ``reward`` has no default, so its name stays
    required."""
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(GOOD))
    assert main(["validate", str(path), "--set", "objective.entropy_coef=0.01"]) == 0
    eff = yaml.safe_load(capsys.readouterr().out)["objective"]
    assert eff["name"] == "grpo" and eff["entropy_coef"] == 0.01
    assert eff["options"]["clip_low"] == 0.2  # the default plugin's options filled
    with pytest.raises(ConfigError, match=r"reward\.name: missing, required"):
        config.validate({**GOOD, "reward": {"options": {}}})


def test_bad_override_syntax(tmp_path, capsys):
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(GOOD))
    assert main(["validate", str(path), "--set", "train.lr"]) == 2
    assert "expected key.path=value" in capsys.readouterr().err


def test_schema_command_includes_plugin_schemas():
    out = run_grpo("schema")
    assert out.returncode == 0
    schema = json.loads(out.stdout)
    assert "reward.math" in schema["$defs"] and "train" in schema["properties"]


def test_subprocess_user_error_has_no_traceback(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(with_(reward={"name": "maht"})))
    out = run_grpo("validate", str(path))
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.strip().count("\n") == 0


def test_validate_is_pure_function():
    cfg = config.validate(GOOD)
    assert cfg["output"]["dir"] == "runs/latest" and GOOD["data"] == {
        "path": PROMPTS,
        "columns": ["answer"],
    }


OLD_LAYOUT = {
    "model": {"name_or_path": "m"},
    "data": {"path": PROMPTS, "columns": ["answer"]},
    "reward": {"name": "math"},
    "train": {
        "steps": 7,
        "lr": 3e-4,
        "lr_schedule": "cosine",
        "clip_high": 0.28,
        "aggregation": "seq_mean_token_sum_norm",
        "kl_placement": "reward",
        "kl_estimator": "k1",
        "reward_failure": "zero",
        "reward_timeout": 5,
        "drop_zero_std_groups": True,
        "device": "cpu",
        "logprob_chunk": 64,
    },
}


def test_deprecated_keys_load_at_their_new_place_with_a_notice(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(config, "_noticed", set())  # once per process: start afresh
    path = tmp_path / "old.yaml"
    path.write_text(yaml.safe_dump(OLD_LAYOUT))
    assert main(["validate", str(path), "--set", "train.entropy_coef=0.01"]) == 0
    captured = capsys.readouterr()
    eff = yaml.safe_load(captured.out)
    assert eff["train"] == {
        "steps": 7,
        "prompts_per_step": 8,
        "inner_iterations": 1,
        "mini_batches": 1,
        "micro_batch_groups": 8,
        "max_nonfinite_steps": 3,
        "seed": 0,
    }
    assert eff["optimizer"]["lr"] == 3e-4 and eff["optimizer"]["lr_schedule"] == "cosine"
    assert eff["objective"] == {
        "name": "grpo",
        "aggregation": "seq_mean_token_sum_norm",
        "entropy_coef": 0.01,
        "top_entropy_quantile": 1.0,
        "mask_truncated_completions": False,
        "tis": None,
        "options": {"clip_low": 0.2, "clip_high": 0.28, "dual_clip": None, "log_ratio_clamp": 20.0},
    }
    assert eff["kl"]["placement"] == "reward" and eff["kl"]["estimator"] == "k1"
    assert eff["reward"]["failure"] == "zero" and eff["reward"]["timeout"] == 5
    assert eff["groups"]["drop_zero_std"] is True
    assert eff["runtime"]["device"] == "cpu" and eff["runtime"]["logprob_chunk"] == 64
    notices = [line for line in captured.err.splitlines() if line.startswith("notice:")]
    assert "notice: config key train.lr is deprecated; use optimizer.lr" in captured.err
    assert "use objective.entropy_coef" in captured.err  # the --set path moved too
    assert all(len(line) < 120 for line in notices) and "error" not in captured.err


def test_deprecated_and_new_key_together_is_an_error(tmp_path, capsys):
    cfg = {**OLD_LAYOUT, "optimizer": {"lr": 1e-5}}
    path = tmp_path / "both.yaml"
    path.write_text(yaml.safe_dump(cfg))
    assert main(["validate", str(path)]) == 2
    assert (
        "error: train.lr: deprecated and also set as optimizer.lr; keep only optimizer.lr"
        in capsys.readouterr().err
    )


def test_a_ppo_baseline_is_read_as_the_ppo_critic(capsys, monkeypatch):
    monkeypatch.setattr(config, "_noticed", set())  # once per process: start afresh
    base = {"model": {"name_or_path": "m"}, "data": {"path": "d"}, "reward": {"name": "math"}}
    cfg = config.validate({**base, "baseline": {"name": "ppo", "options": {}}})
    assert cfg["baseline"]["name"] == "grpo" and cfg["critic"]["name"] == "ppo"
    assert "config key baseline.name: ppo is deprecated; use critic.name: ppo" in (
        capsys.readouterr().err
    )
    assert config.validate(base)["critic"] is None
    with pytest.raises(ConfigError, match="baseline.name: ppo is now critic.name: ppo"):
        config.validate({**base, "baseline": {"name": "ppo"}, "critic": {"name": "ppo"}})


def test_old_layout_trains_and_resumes_as_the_new_one(tiny_model, addition_data, tmp_path):
    """A run configured with the old keys writes its config in the new layout, and a
    checkpoint it wrote resumes under the new-layout config."""
    out = str(tmp_path / "run")
    old = {
        "model": {"name_or_path": tiny_model},
        "reward": {"name": "math"},
        "data": {"path": addition_data, "columns": ["answer"]},
        "sampling": {"group_size": 2, "max_new_tokens": 3},
        "train": {"steps": 2, "prompts_per_step": 2, "lr": 1e-3, "device": "cpu"},
        "output": {"dir": out, "checkpoint_every": 1, "progress": False},
    }
    p = run_grpo("train", write_config(tmp_path / "old.json", old), cwd=ROOT)
    assert p.returncode == 0, p.stderr
    assert "train.lr is deprecated" in p.stderr
    written = json.load(open(os.path.join(out, "config.json")))
    assert written["optimizer"]["lr"] == 1e-3 and "lr" not in written["train"]
    written["train"]["steps"] = 3
    p = run_grpo("train", write_config(tmp_path / "new.json", written), "--resume", cwd=ROOT)
    assert p.returncode == 0, p.stderr
    steps = [json.loads(x)["step"] for x in open(os.path.join(out, "metrics.jsonl"))]
    assert steps == [0, 1, 2]


def test_config_reference_is_generated_from_the_schema():
    """docs/config.md is `grpo schema --markdown`: regenerate it when the schema changes."""
    from grpo_core.cli.docs import config_reference

    with open(os.path.join(ROOT, "docs", "config.md"), encoding="utf-8") as f:
        assert f.read() == config_reference(), "run: grpo schema --markdown > docs/config.md"


def test_yaml_11_booleans_are_read_as_the_words_the_schema_expects(tmp_path):
    """`packing: on` unquoted is a boolean to YAML 1.1; where the schema wants one of its
    strings (and no boolean) it is read back as the word; where a boolean is wanted it stays."""
    path = tmp_path / "run.yaml"
    path.write_text(
        "model: {name_or_path: m}\n"
        "data: {path: d.jsonl}\n"
        "reward: {name: format}\n"
        "runtime: {packing: on}\n"
        "output: {progress: off}\n"
    )
    cfg = config.load(str(path))
    assert cfg["runtime"]["packing"] == "on"
    assert cfg["output"]["progress"] is False  # a boolean setting stays a boolean
    off = config.load(str(path), ["runtime.packing=off"])
    assert off["runtime"]["packing"] == "off"
    with pytest.raises(ConfigError, match="runtime.packing"):
        config.validate({**cfg, "runtime": {**cfg["runtime"], "packing": 3}})
