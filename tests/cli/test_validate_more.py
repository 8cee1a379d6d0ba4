"""`grpo validate` checks more of what `grpo train` would trip on: prompts training would drop
as too long, hub ids that cannot be found offline."""

from __future__ import annotations

from helpers import make_config, run_grpo, write_config


def test_validate_counts_long_prompts(tiny_model, addition_data, tmp_path):
    cfg = make_config(
        tiny_model,
        addition_data,
        str(tmp_path / "run"),
        data={"path": addition_data, "columns": ["answer"], "max_prompt_tokens": 3},
    )
    p = run_grpo("validate", write_config(tmp_path / "c.json", cfg))
    assert p.returncode == 0, p.stderr
    assert (
        "notice: data.path: 50 of the first 50 rows have prompts longer than 3 tokens "
        "(data.max_prompt_tokens); train will leave them out (data.long_prompts: drop)"
    ) in p.stderr


def test_validate_counts_against_the_models_context(tiny_model, addition_data, tmp_path):
    cfg = make_config(tiny_model, addition_data, str(tmp_path / "run"))
    cfg["sampling"]["max_new_tokens"] = 254  # the tiny model's context is 256
    p = run_grpo("validate", write_config(tmp_path / "c.json", cfg))
    assert p.returncode == 0, p.stderr
    assert (
        "have prompts longer than 2 tokens (the model's context 256 minus "
        "sampling.max_new_tokens 254)" in p.stderr
    )


def test_validate_refuses_what_long_prompts_error_would(tiny_model, addition_data, tmp_path):
    cfg = make_config(
        tiny_model,
        addition_data,
        str(tmp_path / "run"),
        data={
            "path": addition_data,
            "columns": ["answer"],
            "max_prompt_tokens": 3,
            "long_prompts": "error",
        },
    )
    p = run_grpo("validate", write_config(tmp_path / "c.json", cfg))
    assert p.returncode == 2
    assert "error: data.path: data: row 0 has a prompt of" in p.stderr
    assert "Traceback" not in p.stderr


def test_offline_hub_ids_not_in_the_cache_are_refused_at_once(tiny_model, addition_data, tmp_path):
    cfg = make_config(
        "someone/not-a-cached-model", "someone/not-a-cached-dataset", str(tmp_path / "run")
    )
    env = {"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    p = run_grpo("validate", write_config(tmp_path / "c.json", cfg), env=env)
    assert p.returncode == 2
    for key, repo in (
        ("model.name_or_path", "someone/not-a-cached-model"),
        ("data.path", "someone/not-a-cached-dataset"),
    ):
        assert (
            f"error: {key}: {repo} is a hub id that is not in the local Hugging Face "
            "cache, and HF_HUB_OFFLINE is set" in p.stderr
        ), p.stderr
    assert "its columns are checked then, not here" in p.stderr


def test_eval_applies_long_prompts_as_training_does(tiny_model, addition_data, tmp_path):
    cfg = make_config(
        tiny_model,
        addition_data,
        str(tmp_path / "run"),
        data={"path": addition_data, "columns": ["answer"], "max_prompt_tokens": 3},
    )
    path = write_config(tmp_path / "c.json", cfg)
    dropped = run_grpo("eval", path, "--model", tiny_model, "--split", "train")
    assert dropped.returncode == 2, dropped.stderr  # training would drop every prompt too
    assert "error: data: every prompt is longer than 3 tokens" in dropped.stderr
    refused = run_grpo(
        "eval", path, "--model", tiny_model, "--split", "train", "--set", "data.long_prompts=error"
    )
    assert refused.returncode == 2 and "error: data: row 0 has a prompt of" in refused.stderr
