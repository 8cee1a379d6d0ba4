"""Experiment trackers beside ``metrics.jsonl``: which logger plugins a run uses
(``output.loggers``, or the older ``output.tensorboard`` and ``output.wandb_project``), whether
their packages are installed, and the names metrics go out under (``output.metric_names``:
ours, or TRL's so that dashboards built for TRL runs carry over). ``metrics.jsonl`` keeps our
names whatever the trackers get: ``grpo plot``, ``grpo compare`` and resume read it.
"""

from __future__ import annotations

import importlib.util
import sys

from grpo_core.building import create
from grpo_core.config.file import unresolved
from grpo_core.config.view import Config, OutputSection
from grpo_core.errors import UserError
from grpo_core.hookspecs import Logger
from grpo_core.registry import registry

#: our metric names -> TRL's GRPOTrainer (and transformers Trainer) names, where one exists;
#: ``reward/<dimension>`` becomes ``rewards/<dimension>/mean`` and ``reward_std/<dimension>``
#: ``rewards/<dimension>/std``; other names are kept
TRL_NAMES = {
    "zero_std_frac": "frac_reward_zero_std",
    "completion_len": "completions/mean_length",
    "completion_len_max": "completions/max_length",
    "truncated_frac": "completions/clipped_ratio",
    "clip_low_frac": "clip_ratio/low_mean",
    "clip_high_frac": "clip_ratio/high_mean",
    "clip_region_frac": "clip_ratio/region_mean",
    "tokens_seen": "num_tokens",
    "lr": "learning_rate",
    "loss/policy": "policy_loss",
}


def metric_name(name: str, naming: str) -> str:
    """The name a tracker gets for our metric ``name`` (``naming``: native, trl, or trl_train:
    TRL's under ``train/``, the prefix transformers' trackers give a training run's logs)."""
    if naming == "native":
        return name
    if name.startswith(("reward/", "reward_std/")):
        kind, dim = name.split("/", 1)
        trl = f"rewards/{dim}/{'mean' if kind == 'reward' else 'std'}"
    else:
        trl = TRL_NAMES.get(name, name)
    return f"train/{trl}" if naming == "trl_train" else trl


def logger_refs(output: OutputSection) -> list[tuple[str, dict]]:
    """(config key, {name, options}) of each logger the run uses: ``output.loggers`` when
    set; otherwise tensorboard when installed (``output.tensorboard: auto``) and wandb when
    ``output.wandb_project`` names a project, as before loggers were plugins."""
    if output.loggers is not None:
        return [(f"output.loggers[{i}]", ref) for i, ref in enumerate(output.loggers)]
    refs = []
    if output.tensorboard == "auto" and _installed("tensorboard"):
        refs.append(("output.tensorboard", {"name": "tensorboard", "options": {}}))
    if output.wandb_project:
        refs.append(
            (
                "output.wandb_project",
                {"name": "wandb", "options": {"project": output.wandb_project}},
            )
        )
    return refs


def problems(output: OutputSection) -> list[str]:
    """What stops the configured loggers before a model loads: a package not installed (one
    line naming it), the older keys set beside ``output.loggers``."""
    out = []
    if output.loggers is not None and output.wandb_project:
        out.append(
            "output.wandb_project: not read when output.loggers is set; list "
            "{name: wandb, options: {project: ...}} there instead"
        )
    for where, ref in logger_refs(output):
        info = registry().plugins.get(("logger", ref["name"]))
        if info is None or not (
            isinstance(info.factory, type) and issubclass(info.factory, Logger)
        ):
            continue  # an unknown name is the config validator's to report
        missing = [p for p in info.factory.packages if not _installed(p)]
        if missing:
            out.append(
                f"{where}: the {ref['name']} logger needs {', '.join(missing)} "
                f"(pip install {' '.join(missing)})"
            )
    return out


def _installed(package: str) -> bool:
    try:
        return importlib.util.find_spec(package) is not None
    except (ImportError, ValueError):
        return False


class Trackers:
    """The run's loggers, called together; built and started by :meth:`start`."""

    def __init__(self, loggers: list[tuple[str, Logger]], naming: str = "native"):
        self.loggers, self.naming = loggers, naming
        self.failed: set[str] = set()  # loggers that failed once: warned about, still called

    @classmethod
    def start(cls, config: Config, run_id: str, start_step: int) -> Trackers:
        """Build and start each logger of the config's ``output`` section (checked first: a
        missing package is a one-line error naming it)."""
        bad = problems(config.output)
        if bad:
            raise UserError(bad[0])
        written = unresolved(config.as_dict())  # trackers get ${env:NAME}, never a value
        loggers = []
        for where, ref in logger_refs(config.output):
            lg = create("logger", ref["name"], ref.get("options"))
            try:
                lg.start(config.output.dir, run_id, written, start_step)
            except UserError:
                raise
            except Exception as exc:  # a tracker that cannot start (login, server) stops here
                raise UserError(
                    f"{where}: the {ref['name']} logger could not start: "
                    f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"
                ) from exc
            loggers.append((ref["name"], lg))
        return cls(loggers, config.output.metric_names)

    def log(self, record: dict) -> None:
        """A step's scalars (numbers other than ``step``), renamed for the trackers."""
        scalars = {
            metric_name(k, self.naming): float(v)
            for k, v in record.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and k != "step"
        }
        for name, lg in self.loggers:
            self._call(name, lg.log, scalars, record["step"])

    def log_samples(self, samples: list[dict], step: int) -> None:
        """The samples of ``metrics.write_samples`` as flat rows (one per completion)."""
        rows = [
            {
                "group": s["group"],
                "prompt": s["prompt"],
                "completion": s["completion"],
                "reward": s["reward"],
                "advantage": s["advantage"],
                **{f"reward/{k}": v for k, v in s["dimensions"].items()},
            }
            for s in samples
        ]
        for name, lg in self.loggers:
            self._call(name, lg.log_samples, rows, step)

    def close(self) -> None:
        for name, lg in self.loggers:
            self._call(name, lg.close)

    def _call(self, name: str, fn, *args) -> None:
        """A tracker that fails (a network hiccup, a full quota) costs a warning, the first
        time, not the run: metrics.jsonl has everything."""
        try:
            fn(*args)
        except Exception as exc:  # third-party trackers raise anything
            if name not in self.failed:
                self.failed.add(name)
                print(
                    f"\nwarning: logger {name}: {type(exc).__name__}: "
                    f"{' '.join(str(exc).split())[:200]} (further failures not shown)",
                    file=sys.stderr,
                )
