"""Fuzzing with a fixed example budget: config loading and the math reward's parsing."""

from __future__ import annotations

import time

import yaml
from grpo_core_plugins.rewards.math.compare import equivalent
from grpo_core_plugins.rewards.math.extract import extract_answer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from grpo_core import config
from grpo_core.errors import ConfigError

KEYS = st.sampled_from(
    [
        "model",
        "data",
        "reward",
        "baseline",
        "kl",
        "train",
        "sampling",
        "name",
        "options",
        "path",
        "name_or_path",
        "components",
        "weight",
        "steps",
        "lr",
        "group_size",
        "math",
        "grpo",
        "x",
        "",
    ]
)
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**6), 10**6),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
)
TREES = st.recursive(
    SCALARS,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(KEYS, inner, max_size=5)),
    max_leaves=25,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(TREES)
def test_random_trees_give_a_config_or_a_clean_error(tree):
    try:
        cfg = config.validate(tree) if isinstance(tree, dict) else None
    except ConfigError as exc:
        assert exc.problems and all(isinstance(p, str) and "\n" not in p for p in exc.problems)
        return
    if cfg is not None:
        assert {"model", "data", "reward"} <= set(cfg)


@settings(max_examples=200, deadline=None)
@given(TREES)
def test_random_yaml_files(tmp_path_factory, tree):
    path = tmp_path_factory.mktemp("fz") / "c.yaml"
    path.write_text(yaml.safe_dump(tree) if not isinstance(tree, float) else "x: .nan")
    try:
        config.load(str(path))
    except ConfigError as exc:
        assert all("\n" not in p for p in exc.problems)


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=300))
def test_random_bytes_as_yaml(tmp_path_factory, text):
    path = tmp_path_factory.mktemp("fz") / "c.yaml"
    path.write_text(text)
    try:
        config.load(str(path))
    except ConfigError:
        pass


PIECES = list("0123456789+-*/^_{}()[]\\,.=!%$ xyπ√½²") + [
    "\\frac",
    "\\sqrt",
    "\\boxed{",
    "\\pi",
    "\\infty",
    "\\pm",
    "\\cup",
    "\\begin{pmatrix}",
    "&",
    "\\\\",
    "\\end{pmatrix}",
    "\\text{",
    "^{",
    "#### ",
    "the answer is ",
]
MATHY = st.lists(st.sampled_from(PIECES), max_size=40).map("".join)


@settings(max_examples=400, deadline=None)
@given(
    st.one_of(MATHY, st.text(max_size=200)),
    st.one_of(MATHY, st.sampled_from(["1", "\\frac12", "x+1", "(1,2]", "\\{1,2\\}"])),
)
def test_math_extraction_and_comparison_never_raise(text, gold):
    t0 = time.process_time()  # CPU time, the work done: waiting for a core is not counted
    pred = extract_answer(text)
    assert pred is None or isinstance(pred, str)
    assert isinstance(equivalent(pred, gold), bool)
    assert isinstance(equivalent(gold, gold), bool)
    assert time.process_time() - t0 < 2.0  # CPU seconds: the reward's default per-item budget
