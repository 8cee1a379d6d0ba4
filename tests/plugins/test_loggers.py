"""Logger plugins: TensorBoard, W&B, MLflow, trackio read back from what they wrote; TRL's
metric names; completions tables; a third-party logger; a missing package."""

from __future__ import annotations

import glob
import importlib.util
import json
import os
import types

import pytest
from helpers import make_config, write_config

from grpo_core import config
from grpo_core.cli.main import main
from grpo_core.hookspecs import Logger, hookimpl
from grpo_core.observe.tracking import metric_name
from grpo_core.registry import registry
from grpo_core.trainer import train

# "contains a digit", as one dimension of a weighted reward (so a per-dimension name exists)
DIGIT = {
    "name": "weighted",
    "options": {
        "components": [
            {"name": "format", "options": {"tags": [], "patterns": ["[0-9]"]}, "weight": 1.0}
        ]
    },
}


def installed(name: str) -> bool:
    return importlib.util.find_spec(name) is not None


class Recorder(Logger):
    """A third-party logger, as a package would write one: it keeps what it is given."""

    calls: list = []

    def start(self, run_dir, run_id, config, start_step):
        Recorder.calls.append(("start", run_id, config["output"]["dir"], start_step))

    def log(self, metrics, step):
        Recorder.calls.append(("log", step, dict(metrics)))

    def log_samples(self, samples, step):
        Recorder.calls.append(("samples", step, samples))

    def close(self):
        Recorder.calls.append(("close",))


def register_recorder():
    module = types.ModuleType("recorder_logger_for_tests")
    module.logger = hookimpl(lambda register: register("recorder", Recorder), specname="logger")
    registry().add(module, "test-recorder")


def test_trl_names():
    assert [
        metric_name(n, "trl")
        for n in (
            "zero_std_frac",
            "completion_len",
            "truncated_frac",
            "clip_low_frac",
            "clip_high_frac",
            "lr",
            "reward/math",
            "reward",
            "kl",
        )
    ] == [
        "frac_reward_zero_std",
        "completions/mean_length",
        "completions/clipped_ratio",
        "clip_ratio/low_mean",
        "clip_ratio/high_mean",
        "learning_rate",
        "rewards/math/mean",
        "reward",
        "kl",
    ]
    assert metric_name("zero_std_frac", "native") == "zero_std_frac"


def test_every_installed_tracker_gets_metrics_and_tables(
    tiny_model, addition_data, tmp_path, monkeypatch
):
    """One real run logging to every tracker that is installed (TensorBoard always: it is a
    test dependency here), with TRL's names; each is read back from what it wrote."""
    pytest.importorskip("tensorboard")
    register_recorder()
    Recorder.calls.clear()
    monkeypatch.setenv("TRACKIO_DIR", str(tmp_path / "trackio"))
    monkeypatch.setenv("WANDB_SILENT", "true")
    out = str(tmp_path / "run")
    loggers = [{"name": "tensorboard"}, {"name": "recorder"}]
    if installed("wandb"):
        loggers.append({"name": "wandb", "options": {"project": "t", "mode": "offline"}})
    if installed("mlflow"):
        loggers.append({"name": "mlflow"})
    if installed("trackio"):
        loggers.append({"name": "trackio", "options": {"project": "t"}})
    cfg = config.validate(
        make_config(
            tiny_model,
            addition_data,
            out,
            reward=DIGIT,
            train={"steps": 2, "prompts_per_step": 2, "seed": 0},
            output={
                "dir": out,
                "progress": False,
                "samples_every": 1,
                "loggers": loggers,
                "metric_names": "trl",
            },
        )
    )
    train(cfg)
    jsonl = [json.loads(x) for x in open(os.path.join(out, "metrics.jsonl"))]
    assert "zero_std_frac" in jsonl[0] and "frac_reward_zero_std" not in jsonl[0]  # ours

    # the third-party logger: started once, every step, every sample table, closed
    kinds = [c[0] for c in Recorder.calls]
    assert kinds == ["start", "log", "samples", "log", "samples", "close"], kinds
    logged = Recorder.calls[1][2]
    assert {
        "frac_reward_zero_std",
        "completions/mean_length",
        "completions/clipped_ratio",
        "learning_rate",
        "rewards/format/mean",
        "data/long_prompts",
    } <= set(logged)
    assert not {"zero_std_frac", "lr", "step"} & set(logged)
    assert logged["learning_rate"] == jsonl[0]["lr"]
    table = Recorder.calls[2][2]
    assert len(table) == 2 * 4 and {
        "prompt",
        "completion",
        "reward",
        "advantage",
        "reward/format",
        "group",
    } <= set(table[0])

    # TensorBoard: the event file read back
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(os.path.join(out, "tensorboard"), size_guidance={"tensors": 0})
    acc.Reload()
    scalars = set(acc.Tags()["scalars"])
    assert {"frac_reward_zero_std", "learning_rate", "completions/mean_length"} <= scalars
    assert "lr" not in scalars
    assert [e.step for e in acc.Scalars("reward")] == [0, 1]
    text = [t for t in acc.Tags()["tensors"] if t.startswith("completions")]
    assert text, acc.Tags()
    shown = acc.Tensors(text[0])[0].tensor_proto.string_val[0].decode()
    assert "| group | prompt | completion | reward | advantage |" in shown
    assert table[0]["prompt"].splitlines()[0] in shown

    if installed("wandb"):  # an offline run: the history log and the tables' JSON
        (run_dir,) = glob.glob(os.path.join(out, "wandb", "offline-run-*"))
        history = open(glob.glob(os.path.join(run_dir, "*.wandb"))[0], "rb").read()
        assert b"frac_reward_zero_std" in history and b"learning_rate" in history
        tables = sorted(
            glob.glob(os.path.join(run_dir, "files", "media", "table", "completions_*.json"))
        )
        assert len(tables) == 2
        t = json.load(open(tables[0]))
        assert t["columns"][:5] == ["group", "prompt", "completion", "reward", "advantage"]
        assert len(t["data"]) == 8

    if installed("mlflow"):  # the run's own store, in the run directory
        from mlflow.tracking import MlflowClient

        client = MlflowClient(f"sqlite:///{out}/mlflow/mlflow.db")
        (run,) = client.search_runs([client.get_experiment_by_name("grpo-core").experiment_id])
        assert run.data.tags["grpo_run_id"] == Recorder.calls[0][1]
        assert [m.step for m in client.get_metric_history(run.info.run_id, "reward")] == [0, 1]
        assert client.get_metric_history(run.info.run_id, "frac_reward_zero_std")
        files = [f.path for f in client.list_artifacts(run.info.run_id, "completions")]
        assert files == ["completions/step-00000000.json", "completions/step-00000001.json"]

    if installed("trackio"):
        from trackio.sqlite_storage import SQLiteStorage

        logs = SQLiteStorage.get_logs("t", Recorder.calls[0][1])
        assert [r["step"] for r in logs if "reward" in r] == [0, 1]
        tables = [r["completions"] for r in logs if "completions" in r]
        assert len(tables) == 2 and len(tables[0]["_value"]) == 8


def test_a_logger_without_its_package_stops_before_the_model_loads(
    tiny_model, addition_data, tmp_path, capsys
):
    class NeedsPackage(Logger):
        packages = ("grpo_core_no_such_package",)

        def log(self, metrics, step):
            pass

    module = types.ModuleType("needs_package_logger_for_tests")
    module.logger = hookimpl(lambda register: register("needy", NeedsPackage), specname="logger")
    registry().add(module, "test-needy")
    cfg = make_config(
        tiny_model,
        addition_data,
        str(tmp_path / "r"),
        output={"dir": str(tmp_path / "r"), "loggers": [{"name": "needy"}]},
    )
    code = main(["train", write_config(tmp_path / "c.json", cfg)])
    err = capsys.readouterr().err
    errors = [x for x in err.splitlines() if x.startswith("error:")]
    assert code == 2 and errors == [
        "error: output.loggers[0]: the needy logger needs "
        "grpo_core_no_such_package (pip install "
        "grpo_core_no_such_package)"
    ], err
    assert not os.path.exists(tmp_path / "r")  # stopped before anything was set up


def test_older_keys_still_choose_the_loggers(tmp_path, capsys):
    from dataclasses import replace

    from grpo_core.config.view import view
    from grpo_core.observe.tracking import logger_refs

    base = view(config.validate(make_config("m", "d.jsonl", str(tmp_path)))).output
    names = [r["name"] for _, r in logger_refs(replace(base, wandb_project="p"))]
    assert names == (["tensorboard"] if installed("tensorboard") else []) + ["wandb"]
    assert logger_refs(replace(base, tensorboard="off")) == []
    assert logger_refs(replace(base, loggers=[{"name": "mlflow", "options": {}}])) == [
        ("output.loggers[0]", {"name": "mlflow", "options": {}})
    ]
    cfg = make_config(
        "m",
        "d.jsonl",
        str(tmp_path / "r"),
        output={"wandb_project": "p", "loggers": [{"name": "tensorboard"}]},
    )
    assert main(["validate", write_config(tmp_path / "c.json", cfg)]) == 2
    assert "output.wandb_project: not read when output.loggers is set" in capsys.readouterr().err


def test_an_unknown_logger_is_named_at_load(tmp_path):
    with pytest.raises(
        config.ConfigError,
        match=r"output.loggers\[0\].name: unknown logger "
        r"plugin 'tensorbord'.*did you mean",
    ):
        config.validate(
            make_config("m", "d.jsonl", str(tmp_path), output={"loggers": [{"name": "tensorbord"}]})
        )


@pytest.mark.skipif(not installed("tensorboard"), reason="tensorboard not installed")
def test_plugins_check_runs_a_logger(capsys):
    from grpo_core.cli.plugin_tools import check

    assert check("logger", "tensorboard") == 0
    assert "0 failed" in capsys.readouterr().out
