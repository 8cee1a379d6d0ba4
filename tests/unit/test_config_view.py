"""The typed view of the config (grpo_core.config.view) and the schema stay equal: the section
classes are generated from the schema (one dataclass per section, one field per key, typed
from it), and a validated config reads the same through both."""

from __future__ import annotations

import dataclasses
import functools
import operator
import typing

import pytest
from helpers import make_config

from grpo_core import config
from grpo_core.config import codegen
from grpo_core.config.schema import CORE_SCHEMA
from grpo_core.config.view import Config, section_type, view


def test_every_section_and_key_of_the_schema_has_a_field():
    hints = typing.get_type_hints(Config)
    assert [f.name for f in dataclasses.fields(Config)] == list(CORE_SCHEMA["properties"])
    for name, schema in CORE_SCHEMA["properties"].items():
        cls = section_type(hints[name])
        if "properties" not in schema:
            assert cls is None, name
            continue
        assert [f.name for f in dataclasses.fields(cls)] == list(schema["properties"]), name


PYTHON = {"str": str, "int": int, "float": float, "bool": bool, "dict": dict, "list": list}
PYTHON["None"] = type(None)


def test_the_sections_are_generated_from_the_schema():
    with open(codegen.PATH, encoding="utf-8") as f:
        written = f.read()
    assert written == codegen.render(), "run: python -m grpo_core.config.codegen"


def test_each_field_has_the_type_the_schema_gives():
    assert codegen.annotation({"type": ["string", "null"]}) == "str | None"
    assert codegen.annotation({"enum": [None, "4bit", "8bit"]}) == "str | None"
    assert codegen.annotation({"type": ["null", "array", "object"]}) == "list | dict | None"
    nested = []
    for name, cls in ((n, config.view.section_class(n)) for n in codegen.sections()):
        hints = typing.get_type_hints(cls)
        for key, sub in CORE_SCHEMA["properties"][name]["properties"].items():
            if "properties" in sub:  # a mapping with keys of its own: a section of its own
                inner = section_type(hints[key])
                assert inner is not None and hints[key] == inner | None, f"{name}.{key}"
                assert [f.name for f in dataclasses.fields(inner)] == list(sub["properties"])
                nested.append(f"{name}.{key}")
                continue
            kinds = [PYTHON[k] for k in codegen.annotation(sub).split(" | ")]
            assert hints[key] == functools.reduce(operator.or_, kinds), f"{name}.{key}"
    assert nested == ["model.lora", "reward.overlong", "objective.tis"]


def test_a_validated_config_reads_the_same_through_the_view():
    cfg = config.validate(
        make_config(
            "m",
            "d.jsonl",
            "out",
            kl={"name": "fixed"},
            sampling={"group_size": 6, "temperature": 0.7},
        )
    )
    v = view(cfg)
    for name, section in cfg.items():
        sub = getattr(v, name)
        if not dataclasses.is_dataclass(sub):
            assert sub == section, name
            continue
        for key, value in section.items():
            assert getattr(sub, key) == value, f"{name}.{key}"
    assert v.sampling.group_size == 6 and v.kl.name == "fixed" and v.environment is None


def test_the_view_is_frozen():
    v = view(config.validate(make_config("m", "d.jsonl", "out")))
    with pytest.raises(dataclasses.FrozenInstanceError):
        v.train.steps = 5  # type: ignore[misc]


def test_a_nested_mapping_reads_by_attribute_and_round_trips():
    cfg = config.validate(
        make_config(
            "m",
            "d.jsonl",
            "out",
            model={"name_or_path": "m", "lora": {"r": 4}},
            reward={"name": "math", "overlong": {"buffer": 2}},
            objective={"name": "grpo", "tis": {"cap": 3.0}},
        )
    )
    v = view(cfg)
    assert (v.model.lora.r, v.model.lora.alpha) == (4, cfg["model"]["lora"]["alpha"])
    assert (v.reward.overlong.buffer, v.reward.overlong.max_tokens) == (2, None)
    assert (v.objective.tis.cap, v.objective.tis.level) == (3.0, "token")
    assert v.as_dict() == cfg  # what a checkpoint and the trackers get back
