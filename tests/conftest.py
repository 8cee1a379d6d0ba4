"""Shared fixtures: a tiny real model and tokenizer built offline, saved and loaded back."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> str:
    """A 2-layer, 32-wide Qwen2-shaped model with a byte-level tokenizer."""
    from grpo_core.tiny import build_model

    path = str(tmp_path_factory.mktemp("tiny") / "model")
    return build_model(path, hidden=32, layers=2, seed=0)


@pytest.fixture(scope="session")
def warm_model(tmp_path_factory) -> str:
    """The tiny model after a short supervised warm start on a+b: it answers with digits and
    ends its completions, so RL on it behaves like RL on a real instruction-tuned model."""
    from grpo_core.cli.demo import warm_start
    from grpo_core.tiny import addition_rows, build_model

    path = build_model(str(tmp_path_factory.mktemp("warm") / "model"), hidden=32, layers=2, seed=0)
    warm_start(path, addition_rows(0)[0], steps=80)
    return path


@pytest.fixture(scope="session")
def addition_data(tmp_path_factory) -> str:
    from grpo_core.tiny import addition_rows, write_jsonl

    path = str(tmp_path_factory.mktemp("data") / "train.jsonl")
    write_jsonl(path, addition_rows(0)[0])
    return path


_pristine: set | None = None


@pytest.fixture(autouse=True)
def _forget_test_plugins():
    """Plugins a test registers in-process (``register(...)``, ``registry().add(...)``) are
    forgotten after it, so no later test on the same worker sees them."""
    yield
    import sys

    module = sys.modules.get("grpo_core.registry")
    if module is None or module._registry is None:
        return
    global _pristine
    if _pristine is None:
        _pristine = set(module.Registry().plugins)
    if set(module._registry.plugins) != _pristine:
        module._registry = None
