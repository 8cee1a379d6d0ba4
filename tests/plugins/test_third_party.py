"""A real third-party package, pip-installed into a fresh environment, used by name."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig

import pytest
from helpers import ROOT, make_config, write_config

EXAMPLE = os.path.join(ROOT, "examples", "third_party_plugin")


@pytest.fixture(scope="module")
def venv(tmp_path_factory):
    """A new virtual environment that sees this one's packages (torch, grpo-core) through a
    site directory, so pip install/uninstall there are real and leave this one alone."""
    root = tmp_path_factory.mktemp("venv")
    # no pip or setuptools of its own: this environment's pip installs into it (--python)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True)
    py = str(root / "bin" / "python")
    site = subprocess.run(
        [py, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    parent = sysconfig.get_path("purelib")
    with open(os.path.join(site, "_parent_env.pth"), "w") as f:
        f.write(f"import site; site.addsitedir({parent!r})\n")
    return py


def run(py, *args, **kw):
    return subprocess.run([py, *args], capture_output=True, text=True, timeout=600, **kw)


def pip(py, *args):
    out = run(sys.executable, "-m", "pip", "--python", py, "--disable-pip-version-check", *args)
    assert out.returncode == 0, out.stderr
    return out


def plugins(py) -> list[dict]:
    out = run(py, "-m", "grpo_core.cli", "plugins", "--json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_install_list_train_uninstall(venv, tiny_model, addition_data, tmp_path):
    pip(venv, "install", "--no-deps", "--no-build-isolation", EXAMPLE)
    mine = [p for p in plugins(venv) if p["distribution"] == "grpo-reward-pack"]
    assert {(p["kind"], p["name"], p["version"]) for p in mine} == {
        ("reward", "no_repetition", "0.2.0"),
        ("baseline", "grpo_median", "0.2.0"),
    }
    for kind, name in (("reward", "no_repetition"), ("baseline", "grpo_median")):
        check = run(venv, "-m", "grpo_core.cli", "plugins", "check", kind, name)
        assert check.returncode == 0, check.stdout
    cfg = write_config(
        tmp_path / "c.json",
        make_config(
            tiny_model,
            addition_data,
            str(tmp_path / "run"),
            reward={
                "name": "weighted",
                "options": {
                    "components": [
                        {"name": "no_repetition", "options": {"n": 1, "min_words": 1}},
                        {"name": "math"},
                    ]
                },
            },
            baseline={"name": "grpo_median"},
            train={"steps": 2, "prompts_per_step": 2},
        ),
    )
    trained = run(venv, "-m", "grpo_core.cli", "train", cfg)
    assert trained.returncode == 0, trained.stderr
    rows = [json.loads(x) for x in open(tmp_path / "run" / "metrics.jsonl")]
    assert len(rows) == 2 and "reward/no_repetition" in rows[0]
    tests = run(
        venv,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        os.path.join(EXAMPLE, "tests"),
        cwd=str(tmp_path),
    )
    assert tests.returncode == 0, tests.stdout
    pip(venv, "uninstall", "-y", "grpo-reward-pack")
    assert not [p for p in plugins(venv) if p["distribution"] == "grpo-reward-pack"]
    gone = run(venv, "-m", "grpo_core.cli", "train", cfg)
    assert gone.returncode == 2 and "unknown baseline plugin 'grpo_median'" in gone.stderr


@pytest.mark.parametrize(
    "kind", ["reward", "baseline", "kl", "objective", "environment", "callback"]
)
def test_new_skeleton_passes_check_as_written(venv, tmp_path, kind):
    name = f"my_{kind}_thing"
    made = run(
        venv, "-m", "grpo_core.cli", "plugins", "new", name, "--kind", kind, "--out", str(tmp_path)
    )
    assert made.returncode == 0, made.stderr
    pkg = tmp_path / f"grpo-{name.replace('_', '-')}"
    assert (pkg / "pyproject.toml").exists() and (pkg / "tests" / f"test_{name}.py").exists()
    pip(venv, "install", "--no-deps", "--no-build-isolation", str(pkg))
    try:
        check = run(venv, "-m", "grpo_core.cli", "plugins", "check", kind, name)
        assert check.returncode == 0, check.stdout
        assert "0 failed" in check.stdout
        own = run(
            venv,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            str(pkg / "tests"),
            cwd=str(tmp_path),
        )
        assert own.returncode == 0, own.stdout
    finally:
        pip(venv, "uninstall", "-y", f"grpo-{name.replace('_', '-')}")


def test_check_reports_a_broken_plugin(tmp_path):
    from test_registry import make_dist

    body = """
        from grpo_core.hookspecs import hookimpl

        @hookimpl
        def reward(register):
            register("broken", lambda: (lambda p, c, **k: [1.0]),
                     schema={"type": "object", "properties": {"x": {"type": "nope"}}})
    """
    site = make_dist(tmp_path / "site", "broken-dist", "broken_mod", body)
    out = subprocess.run(
        [sys.executable, "-m", "grpo_core.cli", "plugins", "check", "reward", "broken"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(site)},
    )
    assert out.returncode == 2
    assert "FAIL  schema is valid JSON Schema" in out.stdout
    assert "FAIL  sample call returns the right shape and types" in out.stdout


def test_third_party_environment_installs_checks_and_trains(venv, tiny_model, tmp_path):
    example = os.path.join(ROOT, "examples", "third_party_environment")
    pip(venv, "install", "--no-deps", "--no-build-isolation", example)
    try:
        for kind, name in (("environment", "lookup"), ("reward", "lookup_errors")):
            check = run(venv, "-m", "grpo_core.cli", "plugins", "check", kind, name)
            assert check.returncode == 0, check.stdout
        data = tmp_path / "facts.jsonl"
        data.write_text(
            "".join(
                json.dumps(
                    {"prompt": f"Capital of {c}?", "answer": a, "facts": {f"capital of {c}": a}}
                )
                + "\n"
                for c, a in (("France", "Paris"), ("Peru", "Lima"))
            )
        )
        cfg = write_config(
            tmp_path / "c.json",
            make_config(
                tiny_model,
                str(data),
                str(tmp_path / "run"),
                environment={"name": "lookup", "max_total_tokens": 48},
                reward={"name": "lookup_errors"},
                data={"path": str(data), "columns": []},
                train={"steps": 2, "prompts_per_step": 2},
            ),
        )
        trained = run(venv, "-m", "grpo_core.cli", "train", cfg)
        assert trained.returncode == 0, trained.stderr
        rows = [json.loads(x) for x in open(tmp_path / "run" / "metrics.jsonl")]
        assert len(rows) == 2 and all(r["env/turns"] >= 1 for r in rows)
        tests = run(
            venv,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            os.path.join(example, "tests"),
            cwd=str(tmp_path),
        )
        assert tests.returncode == 0, tests.stdout
    finally:
        pip(venv, "uninstall", "-y", "grpo-lookup-env")
