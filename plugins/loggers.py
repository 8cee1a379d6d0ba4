"""Built-in experiment trackers (``logger`` plugins): TensorBoard, Weights & Biases, MLflow,
trackio. Each imports its package only when a run starts it, so none is a dependency; a run
that selects one without its package stops before the model loads, naming the package
(``Logger.packages``). ``metrics.jsonl`` is written by the core whatever is selected here.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
import time

from grpo_core.hookspecs import Logger, hookimpl

SAMPLE_TEXT = 2000  # characters of a prompt or completion shown in a TensorBoard table
#: the samples table's name in every tracker (as TRL names its own; not "samples", which is
#: already the metric counting a step's completions)
TABLE = "completions"


def _columns(samples: list[dict]) -> list[str]:
    """The columns of a samples table: the fixed ones, then reward dimensions as met."""
    cols: list[str] = []
    for s in samples:
        cols += [k for k in s if k not in cols]
    return cols


class TensorBoard(Logger):
    """Scalars under their names, samples as a markdown table in the TEXT tab, the config
    (as written) once. A resumed run purges the steps it will log again."""

    packages = ("tensorboard",)

    def __init__(self, log_dir: str | None = None):
        self.log_dir, self.writer = log_dir, None

    def start(self, run_dir, run_id, config, start_step):
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(
            self.log_dir or os.path.join(run_dir, "tensorboard"), purge_step=start_step or None
        )
        if not start_step:
            self.writer.add_text("config", "```\n" + json.dumps(config, indent=2) + "\n```", 0)

    def log(self, metrics, step):
        for k, v in metrics.items():
            self.writer.add_scalar(k, v, step)
        self.writer.flush()

    def log_samples(self, samples, step):
        cols = _columns(samples)
        lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
        lines += ["| " + " | ".join(_cell(s.get(c, "")) for c in cols) + " |" for s in samples]
        self.writer.add_text(TABLE, "\n".join(lines), step)
        self.writer.flush()

    def close(self):
        if self.writer is not None:
            self.writer.close()


def _cell(value) -> str:
    """A value as one markdown table cell (pipes escaped, line breaks kept as <br>)."""
    if isinstance(value, float):
        return f"{value:.4g}"
    text = str(value)
    text = text if len(text) <= SAMPLE_TEXT else text[:SAMPLE_TEXT] + " ..."
    return text.replace("\\", "\\\\").replace("|", "\\|").replace("\n", "<br>")


class WandB(Logger):
    """A Weights & Biases run whose id is the run's id (a resumed run continues it), the
    config as written, scalars each step, samples as a ``wandb.Table``."""

    packages = ("wandb",)

    def __init__(
        self,
        project: str | None = None,
        entity: str | None = None,
        name: str | None = None,
        group: str | None = None,
        tags: list | None = None,
        mode: str | None = None,
    ):
        self.settings = {
            "project": project,
            "entity": entity,
            "name": name,
            "group": group,
            "tags": tags or None,
            "mode": mode,
        }
        self.run = None

    def start(self, run_dir, run_id, config, start_step):
        import wandb

        self.wandb = wandb
        self.run = wandb.init(
            **self.settings, config=config, dir=run_dir, id=run_id, resume="allow"
        )

    def log(self, metrics, step):
        self.run.log(metrics, step=step)

    def log_samples(self, samples, step):
        cols = _columns(samples)
        table = self.wandb.Table(columns=cols, data=[[s.get(c) for c in cols] for s in samples])
        self.run.log({TABLE: table}, step=step)

    def close(self):
        if self.run is not None:
            self.run.finish()


_MLFLOW_BAD = re.compile(r"[^A-Za-z0-9_\-. :/]")


class MLflow(Logger):
    """An MLflow run tagged with the run's id (a resumed run continues it). Without a
    tracking URI (option or MLFLOW_TRACKING_URI) it writes to ``<run dir>/mlflow``, where a
    resumed run continues a copy cut back to the resumed step (nothing logged twice). Metric
    names lose the characters MLflow refuses (``eval/pass@4`` -> ``eval/pass_4``)."""

    packages = ("mlflow",)

    def __init__(
        self,
        tracking_uri: str | None = None,
        experiment: str = "grpo-core",
        run_name: str | None = None,
    ):
        self.uri, self.experiment, self.run_name = tracking_uri, experiment, run_name
        self.client = self.run_id = None

    def start(self, run_dir, run_id, config, start_step):
        from mlflow.tracking import MlflowClient

        uri, artifacts = self.uri or os.environ.get("MLFLOW_TRACKING_URI"), None
        own = not uri  # the run's own store, in its directory
        if own:
            root = os.path.abspath(os.path.join(run_dir, "mlflow"))
            os.makedirs(root, exist_ok=True)
            uri, artifacts = f"sqlite:///{root}/mlflow.db", f"file://{root}/artifacts"
        self.client = MlflowClient(uri)
        exp = self.client.get_experiment_by_name(self.experiment)
        exp_id = (
            exp.experiment_id
            if exp
            else self.client.create_experiment(self.experiment, artifact_location=artifacts)
        )
        earlier = (
            self.client.search_runs([exp_id], f"tags.grpo_run_id = '{run_id}'")
            if start_step
            else []
        )
        if earlier and own:
            self.run_id = self._before(earlier[0], start_step, exp_id)
        elif earlier:
            self.run_id = earlier[0].info.run_id
            self.client.update_run(self.run_id, status="RUNNING")
        else:
            self.run_id = self.client.create_run(
                exp_id, run_name=self.run_name or run_id, tags={"grpo_run_id": run_id}
            ).info.run_id
            self.client.log_dict(self.run_id, config, "config.json")

    def _before(self, old, start_step: int, exp_id: str) -> str:
        """A resumed run in its own store repeats no step: MLflow cannot delete a metric's
        points, so the earlier MLflow run is copied into a new one up to ``start_step`` (its
        tags, params, metric points and tables before that step, the config) and deleted."""
        from mlflow.entities import Param

        c, was = self.client, old.info.run_id
        tags = {k: v for k, v in old.data.tags.items() if not k.startswith("mlflow.")}
        run_id = c.create_run(exp_id, run_name=old.info.run_name, tags=tags).info.run_id
        points = [
            m
            for key in old.data.metrics
            for m in c.get_metric_history(was, key)
            if m.step < start_step
        ]
        params = [Param(k, v) for k, v in old.data.params.items()]
        for i in range(0, max(len(points), len(params)), 1000):  # MLflow's batch limit
            c.log_batch(run_id, metrics=points[i : i + 1000], params=params[i : i + 1000])
        kept = ["config.json"] + [
            f.path
            for f in c.list_artifacts(was, TABLE)
            if int(f.path.rsplit("step-", 1)[1].split(".")[0]) < start_step
        ]
        with tempfile.TemporaryDirectory() as tmp:
            for path in kept:
                local = c.download_artifacts(was, path, tmp)
                c.log_artifact(run_id, local, os.path.dirname(path) or None)
        c.delete_run(was)
        return run_id

    def log(self, metrics, step):
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.client.log_batch(
            self.run_id,
            metrics=[Metric(_MLFLOW_BAD.sub("_", k), v, now, step) for k, v in metrics.items()],
        )

    def log_samples(self, samples, step):
        cols = _columns(samples)
        self.client.log_table(
            self.run_id,
            {c: [s.get(c) for s in samples] for c in cols},
            f"{TABLE}/step-{step:08d}.json",
        )

    def close(self):
        if self.run_id is not None:
            self.client.set_terminated(self.run_id)


class Trackio(Logger):
    """A trackio run (local by default, or a Hugging Face Space) named after the run's id,
    resumed with it; samples as a ``trackio.Table``."""

    packages = ("trackio",)

    def __init__(
        self, project: str = "grpo-core", name: str | None = None, space_id: str | None = None
    ):
        self.project, self.name, self.space_id = project, name, space_id
        self.run = None

    def start(self, run_dir, run_id, config, start_step):
        import trackio

        self.trackio = trackio
        self.run = trackio.init(
            project=self.project,
            name=self.name or run_id,
            space_id=self.space_id,
            config=config,
            resume="allow",
        )

    def log(self, metrics, step):
        self.run.log(metrics, step=step)

    def log_samples(self, samples, step):
        cols = _columns(samples)
        table = self.trackio.Table(columns=cols, data=[[s.get(c) for c in cols] for s in samples])
        self.run.log({TABLE: table}, step=step)

    def close(self):
        if self.run is not None:
            self.run.finish()


_STR = {"type": ["string", "null"], "default": None}


@hookimpl
def logger(register):
    register(
        "tensorboard",
        TensorBoard,
        schema={
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "log_dir": {
                    **_STR,
                    "description": "event file directory (null: <dir>/tensorboard)",
                },
            },
        },
        description="TensorBoard: scalars, samples as a text table",
    )
    register(
        "wandb",
        WandB,
        schema={
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "project": {**_STR, "description": "null: WANDB_PROJECT or wandb's default"},
                "entity": _STR,
                "name": _STR,
                "group": _STR,
                "tags": {"type": "array", "items": {"type": "string"}, "default": []},
                "mode": {
                    "enum": [None, "online", "offline", "disabled"],
                    "default": None,
                    "description": "null: WANDB_MODE or online",
                },
            },
        },
        description="Weights & Biases: scalars, config, samples as a wandb.Table",
    )
    register(
        "mlflow",
        MLflow,
        schema={
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "tracking_uri": {
                    **_STR,
                    "description": "null: MLFLOW_TRACKING_URI, else <dir>/mlflow",
                },
                "experiment": {"type": "string", "default": "grpo-core"},
                "run_name": {**_STR, "description": "null: the run's id"},
            },
        },
        description="MLflow: metrics, config and samples tables as artifacts",
    )
    register(
        "trackio",
        Trackio,
        schema={
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "project": {"type": "string", "default": "grpo-core"},
                "name": {**_STR, "description": "null: the run's id"},
                "space_id": {**_STR, "description": "a Hugging Face Space to log to (null: local)"},
            },
        },
        description="trackio: scalars, config, samples as a trackio.Table",
    )
