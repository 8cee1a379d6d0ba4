"""``grpo compare``: variants x seeds on one task, each variant tuned on its own seeds, the
runs measured against steps, generated tokens and wall time, and the variants compared with
bootstrap intervals and a test per pair (the numbers: grpo_core/cli/stats.py).

A variant is one value of each ``--vary KEY=A,B`` axis (and of ``--baselines``). ``--tune
KEY=A,B`` values are candidates, chosen per variant on the tuning seeds (1000, 1001, ...) by
``--criterion``; the evaluation seeds (0, 1, ...) then run at the chosen value. Each run is a
``grpo train`` subprocess in ``OUT/<variant>-seed<k>``; one that finished with the same config
is reused and a partial one restarted, so an interrupted study resumes where it stopped
(never one that a live ``grpo train`` still holds: its lock is respected). A finished run
whose config differs (a shared setting changed) is never deleted: it moves to
``OUT/earlier/<config digest>/`` and comes back when that config runs again. Each child is
asked to stop (SIGTERM) when compare ends, however it ends: SIGKILL included (the kernel's
parent-death signal).
"""

from __future__ import annotations

import copy
import ctypes
import hashlib
import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait

import yaml

import grpo_core
from grpo_core import config as config_mod
from grpo_core.cli import stats
from grpo_core.cli.plots import build_report, plot_study
from grpo_core.config.file import scalar, unresolved, with_values
from grpo_core.config.redact import redact
from grpo_core.config.schema import CORE_SCHEMA
from grpo_core.config.view import view
from grpo_core.errors import ConfigError, UserError
from grpo_core.observe.metrics import read, strict_json
from grpo_core.registry import registry
from grpo_core.store import rundir

TUNE_SEED0 = 1000
DONE = "compare_run.json"  # written after a run finished; holds its config and wall time
PLUGIN_SECTIONS = tuple(k for k, v in CORE_SCHEMA["properties"].items() if v.get("x-plugin"))

Setting = tuple[str, str, object]  # (key path, value as typed, parsed value)
PR_SET_PDEATHSIG = 1  # prctl(2): the signal a process gets when its parent ends
_SAYING = threading.Lock()


class Stopped(Exception):
    """A run not started, or ended, because another run of the study failed."""


def split_values(text: str) -> list[str]:
    """``a,b,[1,2]`` -> ['a', 'b', '[1,2]']: commas inside brackets do not split."""
    out, depth, cur = [], 0, ""
    for ch in text:
        depth += (ch in "[{") - (ch in "]}")
        if ch == "," and depth == 0:
            out.append(cur.strip())
            cur = ""
        else:
            cur += ch
    return [v for v in [*out, cur.strip()] if v]


def parse_axis(flag: str, item: str) -> tuple[str, list[Setting]]:
    """``KEY=V1,V2`` -> (current key path, settings). KEY is a dotted config path (old names
    such as train.lr are read at their new place) or a plugin section (``kl``: its name)."""
    key, _, raw = item.partition("=")
    key, values = key.strip(), split_values(raw)
    if not values or not re.fullmatch(r"[A-Za-z_][\w]*(\.[\w]+)*", key):
        raise UserError(
            f"{flag} {item!r}: expected KEY=V1,V2,... with KEY a config key path "
            f"(optimizer.lr) or a plugin section ({', '.join(PLUGIN_SECTIONS)})"
        )
    key = config_mod.moved_path(key)
    return key, [(key, v, v if key in PLUGIN_SECTIONS else scalar(v)) for v in values]


def apply(cfg: dict, settings: list[Setting]) -> dict:
    """A copy of ``cfg`` with the settings applied; a plugin section given another plugin's
    name starts from that plugin's default options. A ``--baselines`` name that is a critic
    (``ppo``) sets the critic section, beside the group baseline."""
    cfg = copy.deepcopy(cfg)  # keeps ${env:NAME} values resolvable and unresolvable
    for key, text, value in settings:
        if key == "baseline" and _is_critic(text):
            cfg = with_values(cfg, {"critic": {"name": text, "options": {}}})
            continue
        if key in PLUGIN_SECTIONS:
            section = cfg.get(key) or {}
            if section.get("name") != value:
                cfg[key] = {
                    **{k: v for k, v in section.items() if k not in ("name", "options")},
                    "name": value,
                    "options": {},
                }
            continue
        node, parts = cfg, key.split(".")
        for part in parts[:-1]:
            if not isinstance(node.get(part), dict):
                node[part] = {}
            node = node[part]
        node[parts[-1]] = value
    return cfg


def _is_critic(name: str) -> bool:
    """A critic plugin's name that no baseline plugin also has."""
    found = registry().find
    return found("critic", name) is not None and found("baseline", name) is None


def label(settings: list[Setting]) -> str:
    """``rloo,optimizer.lr=1e-3``: a baseline by its name, anything else as key=value."""
    return ",".join(text if key == "baseline" else f"{key}={text}" for key, text, _ in settings)


def slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", text.replace("=", "-").replace(",", "_")) or "base"


def plan(args, base: dict) -> tuple[list[list[Setting]], list[list[Setting]]]:
    """(variants, tuning candidates); every value is validated before anything runs, and a
    bad one is reported with the flag that gave it."""
    axes: dict[str, list[Setting]] = {}
    flags: dict[str, str] = {}
    if args.baselines:
        axes["baseline"] = [("baseline", b, b) for b in split_values(args.baselines)]
        flags["baseline"] = f"--baselines {args.baselines!r}"
    for flag, items in (("--vary", args.vary), ("--tune", args.tune)):
        for item in items:
            key, values = parse_axis(flag, item)
            if key in flags:
                raise UserError(f"{flag} {item!r}: {key} is already given by {flags[key]}")
            axes[key], flags[key] = values, f"{flag} {item!r}"
    if not axes:
        raise UserError("grpo compare: give --baselines A,B, --vary KEY=A,B and/or --tune KEY=A,B")
    for key, values in axes.items():
        typed = [text for _, text, _ in values]
        twice = sorted({t for t in typed if typed.count(t) > 1})
        if twice:
            raise UserError(f"{flags[key]}: {', '.join(twice)} given more than once")
        for setting in values:
            try:
                config_mod.validate(apply(base, [setting]))
            except ConfigError as exc:
                raise UserError(f"{flags[key]}: {exc.problems[0]}") from exc
    tuned = [k for k in axes if flags[k].startswith("--tune")]
    variants = [list(c) for c in itertools.product(*(v for k, v in axes.items() if k not in tuned))]
    candidates = [list(c) for c in itertools.product(*(axes[k] for k in tuned))]
    for v, c in itertools.product(variants, candidates):
        try:
            config_mod.validate(apply(base, v + c))
        except ConfigError as exc:
            raise UserError(f"variant {label(v + c)}: {exc.problems[0]}") from exc
    return variants, candidates


class Progress:
    """Follows a child run's metrics.jsonl and prints a compact line: each quarter of the run
    on a log or beside other runs, in place about once a second on a terminal."""

    def __init__(self, run_dir: str, steps: int, tag: str, in_place: bool):
        self.path, self.steps, self.tag = os.path.join(run_dir, "metrics.jsonl"), steps, tag
        self.offset, self.step, self.t0 = 0, 0, time.time()
        self.rewards: list[float | None] = []  # the last 20 steps' mean rewards
        self.tty, self.shown, self.last = in_place and sys.stderr.isatty(), 0, 0.0

    def update(self, final: str | None = None) -> None:
        """Read the new records and show where the run is; ``final``: how it ended."""
        if os.path.exists(self.path):
            with open(self.path, encoding="utf-8") as f:
                f.seek(self.offset)
                chunk = f.read()
            lines = chunk.split("\n")
            self.offset += len(chunk) - len(lines[-1])  # keep a partly written line for later
            for line in lines[:-1]:
                if line.strip():
                    rec = json.loads(line)
                    self.step = rec["step"] + 1
                    self.rewards = [*self.rewards[-19:], rec.get("reward")]
        quarter = 4 * self.step // max(self.steps, 1)
        due = (time.time() - self.last > 1.0) if self.tty else quarter > self.shown
        r = [x for x in self.rewards if x is not None]
        mean = f", reward {sum(r) / len(r):.3f} (last {len(r)} steps)" if r else ""
        if final:
            say(
                f"{self.tag}: {final}, {self.step}/{self.steps} steps{mean}, "
                f"{time.time() - self.t0:.0f} s"
            )
        elif due and 0 < self.step < self.steps:
            say(
                f"{self.tag}: step {self.step}/{self.steps}{mean}, {time.time() - self.t0:.0f} s",
                "\r" if self.tty else "\n",
            )
            self.shown, self.last = quarter, time.time()


def say(text: str, end: str = "\n") -> None:
    """One line on stderr, whole: runs side by side print from their own threads."""
    with _SAYING:
        sys.stderr.write(text + end)
        sys.stderr.flush()


def train_child(
    path: str, run_dir: str, steps: int, tag: str, stop: threading.Event, in_place: bool
) -> tuple[int, str]:
    """Run ``grpo train path``: progress from its metrics, its warnings echoed as they come;
    returns (exit code, its whole output). The child is stopped if we are interrupted or
    ``stop`` is set (another run failed)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "grpo_core.cli", "train", path],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_ends_with(os.getpid()) if sys.platform == "linux" else None,
    )
    out: list[str] = []

    def pump(stream, echo: bool) -> None:
        for line in stream:
            out.append(line)
            if echo and line.lstrip().startswith("warning"):
                say(f"  {tag}: {line.strip()}")

    pumps = [
        threading.Thread(target=pump, args=(s, e), daemon=True)
        for s, e in ((proc.stdout, False), (proc.stderr, True))
    ]
    for t in pumps:
        t.start()
    progress = Progress(run_dir, steps, tag, in_place)
    try:
        while proc.poll() is None and not stop.is_set():
            time.sleep(0.5)
            progress.update()
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait()
    for t in pumps:
        t.join()
    progress.update(
        final="stopped" if stop.is_set() else "done" if proc.returncode == 0 else "failed"
    )
    return proc.returncode, "".join(out)


def _ends_with(parent: int):
    """In the child before it runs: SIGTERM when ``parent`` ends (a graceful stop: the
    trainer saves a checkpoint), and an exit if it already has."""

    prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up here: the child only calls it

    def arm() -> None:
        prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        if os.getppid() != parent:  # it ended before the signal was armed
            os._exit(1)

    return arm


def execute(
    cfg: dict, run_dir: str, tag: str, stop: threading.Event, in_place: bool = True
) -> dict:
    """One run: reused when it finished earlier with this config, else run from scratch (and
    ended when ``stop`` is set). Its config is written beside its directory (``<run>.yaml``),
    which is the trainer's own; what is written keeps ``${env:NAME}`` references, never their
    values. ``in_place``: progress rewrites one line on a terminal (one run at a time)."""
    written = unresolved(cfg)
    marker, path = os.path.join(run_dir, DONE), run_dir + ".yaml"
    done = _finished(run_dir)
    if done is not None and _same(done["config"], written):
        print(f"{tag}: finished earlier, reused", file=sys.stderr, flush=True)
        return {"config": cfg, "records": read(run_dir), "seconds": done["seconds"], "reused": True}
    if done is not None:  # another config's finished run: kept, never deleted
        kept = _set_aside(run_dir, done["config"])
        print(
            f"{tag}: the earlier run there had another config; kept in {kept}",
            file=sys.stderr,
            flush=True,
        )
    if os.path.isdir(run_dir):
        if not os.path.exists(path):
            raise UserError(
                f"{run_dir} exists and is not a compare run: move it or choose another --out"
            )
        rundir.refuse_if_in_use(run_dir)  # a live grpo train's, perhaps an earlier compare's
        shutil.rmtree(run_dir)  # an unfinished run: start again
    earlier = _aside(run_dir, written)
    if _finished(earlier) is not None:  # this config ran before, then was set aside
        for suffix in ("", ".yaml", ".log"):
            if os.path.exists(earlier + suffix):
                os.replace(earlier + suffix, run_dir + suffix)
        return execute(cfg, run_dir, tag, stop, in_place)
    with open(path, "w", encoding="utf-8") as f:
        yaml.safe_dump(written, f, sort_keys=False)
    t0 = time.time()
    code, output = train_child(path, run_dir, view(cfg).train.steps, tag, stop, in_place)
    with open(run_dir + ".log", "w", encoding="utf-8") as f:
        f.write(redact(output))  # the child redacts its own output too
    if code != 0:
        last = [ln for ln in output.splitlines() if ln.strip()][-1:] or ["(no output)"]
        raise UserError(f"{tag} failed (exit {code}): {last[0].strip()}; output in {run_dir}.log")
    seconds = time.time() - t0
    with open(marker + ".tmp", "w", encoding="utf-8") as f:
        json.dump({"config": written, "seconds": seconds}, f)
    os.replace(marker + ".tmp", marker)
    return {"config": cfg, "records": read(run_dir), "seconds": seconds, "reused": False}


def _finished(run_dir: str) -> dict | None:
    """The finished-run marker of ``run_dir`` (its config and wall time), if there is one."""
    marker = os.path.join(run_dir, DONE)
    if not os.path.exists(marker):
        return None
    try:
        with open(marker, encoding="utf-8") as f:
            done = json.load(f)
        if not isinstance(done, dict) or not {"config", "seconds"} <= done.keys():
            raise ValueError("not a finished run's record")
    except (OSError, ValueError, RecursionError) as exc:  # written atomically: damaged since
        raise UserError(
            f"{marker}: cannot read it ({exc}); it marks a finished run: delete it (or the "
            "run's directory) to run that run again"
        ) from None
    return done


def _same(a: dict, b: dict) -> bool:
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def _aside(run_dir: str, written: dict) -> str:
    """Where a finished run of config ``written`` is kept once another config needs its
    directory: ``<out>/earlier/<digest of the config>/<run name>``."""
    digest = hashlib.sha256(json.dumps(written, sort_keys=True).encode()).hexdigest()[:12]
    return os.path.join(os.path.dirname(run_dir), "earlier", digest, os.path.basename(run_dir))


def _set_aside(run_dir: str, written: dict) -> str:
    """Move a finished run (directory, config, log) to its :func:`_aside` place."""
    kept = _aside(run_dir, written)
    os.makedirs(os.path.dirname(kept), exist_ok=True)
    for suffix in ("", ".yaml", ".log"):
        if os.path.exists(run_dir + suffix):
            os.replace(run_dir + suffix, kept + suffix)
    return kept


class Study:
    """Every run of a comparison, run or reused, up to ``--jobs`` at once, with its per-run
    figures."""

    def __init__(self, args, base: dict, total: int):
        self.args, self.base, self.count, self.total = args, base, 0, total
        self.dirs: dict[str, str] = {}  # run directory -> the settings it holds
        self.stop = threading.Event()  # set when one run fails: the others' children end

    def runs(self, jobs: list[tuple[list[Setting], int]]) -> list[dict]:
        """The runs of ``jobs`` ((settings, seed) each), in their order; all configs are
        validated before any runs."""
        planned = [self._plan(settings, seed) for settings, seed in jobs]
        futures: list[Future] = []
        with ThreadPoolExecutor(self.args.jobs) as pool:
            try:
                futures += [pool.submit(self._run, *p) for p in planned]
                wait(futures, return_when=FIRST_EXCEPTION)
                if any(f.done() and f.exception() is not None for f in futures):
                    wait(futures)  # the failed run set ``stop``: the others end or never start
                    errors = [e for f in futures if (e := f.exception()) is not None]
                    raise next((e for e in errors if not isinstance(e, Stopped)), errors[0])
                return [f.result() for f in futures]
            except BaseException:  # an interrupt too: no child outlives the study
                self.stop.set()
                for f in futures:
                    f.cancel()
                raise

    def _plan(self, settings: list[Setting], seed: int) -> tuple[dict, str, str]:
        """(config, run directory, progress tag) of one run."""
        run_dir = os.path.join(self.args.out, f"{slug(label(settings))}-seed{seed}")
        if self.dirs.setdefault(run_dir, label(settings)) != label(settings):
            raise UserError(
                f"{self.dirs[run_dir]!r} and {label(settings)!r} would share "
                f"the run directory {run_dir}; write the values differently"
            )
        fixed: list[Setting] = [("train.seed", str(seed), seed)]
        if self.args.steps and "train.steps" not in (k for k, _, _ in settings):
            fixed.append(("train.steps", str(self.args.steps), self.args.steps))
        fixed += [
            ("output.dir", run_dir, run_dir),
            ("output.progress", "false", False),
            ("output.checkpoint_every", "0", 0),
        ]
        cfg = config_mod.validate(apply(self.base, [*settings, *fixed]))
        self.count += 1
        return cfg, run_dir, f"[{self.count}/{self.total}] {label(settings) or 'base'} seed {seed}"

    def _run(self, cfg: dict, run_dir: str, tag: str) -> dict:
        """One run with its figures; a failure sets ``stop`` before this thread takes another
        run (the runs it ends, or that never start, raise Stopped)."""
        if self.stop.is_set():
            raise Stopped(tag)
        try:
            return self._figures(execute(cfg, run_dir, tag, self.stop, self.args.jobs == 1))
        except BaseException:
            if self.stop.is_set():
                raise Stopped(tag) from None
            self.stop.set()
            raise

    def _figures(self, run: dict) -> dict:
        config = view(run["config"])
        b = config.baseline
        greedy = grpo_core.create("baseline", b.name, b.options).needs_greedy
        run["seed"], run["dir"] = config.train.seed, config.output.dir
        try:
            run["figures"] = stats.run_figures(
                run["records"],
                config.train.prompts_per_step,
                bool(greedy),
                self.args.threshold,
                self.args.window,
            )
        except ValueError as exc:
            raise UserError(f"{config.output.dir}: {exc}") from exc
        return run


def choose(
    args, names: list[str], candidates: list[list[Setting]], seeds: int, trials: list[dict]
) -> tuple[dict, dict[str, list[Setting]]]:
    """Each variant's candidate with the best mean ``--criterion`` over its tuning runs
    (``trials``: variant by variant, candidate by candidate, ``seeds`` each; the first
    candidate on a tie): (the tuning record per variant, the chosen settings per variant)."""
    done = iter(trials)
    tuned: dict = {}
    chosen: dict[str, list[Setting]] = {name: [] for name in names}
    for name in names if trials else []:
        scores = []
        for cand in candidates:
            values = [next(done)["figures"][args.criterion] for _ in range(seeds)]
            scores.append(
                {"value": label(cand), "scores": values, "mean": sum(values) / len(values)}
            )
        best = max(range(len(scores)), key=lambda i: (scores[i]["mean"], -i))
        chosen[name] = candidates[best]
        tuned[name] = {
            "candidates": scores,
            "chosen": label(chosen[name]),
            "edge": len(candidates) > 2 and best in (0, len(candidates) - 1),
        }
    return tuned, chosen


def compare_cli(args) -> int:
    """``grpo compare``: plan, tune, evaluate; then compare.md, compare.json and the PNGs."""
    base = config_mod.load(args.config, args.set)
    for flag, value in (
        ("--seeds", args.seeds),
        ("--tune-seeds", args.tune_seeds),
        ("--steps", args.steps),
        ("--window", args.window),
        ("--jobs", args.jobs),
    ):
        if value is not None and value < 1:
            raise UserError(f"{flag}: expected a number >= 1, got {value}")
    variants, candidates = plan(args, base)
    tuning = bool(args.tune)
    if tuning and args.seeds > TUNE_SEED0:
        raise UserError(f"--seeds: at most {TUNE_SEED0} with --tune (tuning seeds start there)")
    tune_seeds = list(range(TUNE_SEED0, TUNE_SEED0 + args.tune_seeds)) if tuning else []
    study = Study(args, base, len(variants) * (args.seeds + len(candidates) * len(tune_seeds)))
    os.makedirs(args.out, exist_ok=True)
    t0 = time.time()
    names = [label(v) or "base" for v in variants]
    trials = [(v + c, s) for v in variants for c in candidates for s in tune_seeds]
    tuned, chosen = choose(args, names, candidates, len(tune_seeds), study.runs(trials))
    finals = [(v + chosen[n], s) for v, n in zip(variants, names) for s in range(args.seeds)]
    runs = iter(study.runs(finals))
    results = {
        n: {"settings": label(v + chosen[n]), "runs": [next(runs) for _ in range(args.seeds)]}
        for v, n in zip(variants, names)
    }
    text, data = build_report(args, results, tuned, tune_seeds, time.time() - t0)
    with open(os.path.join(args.out, "compare.md"), "w", encoding="utf-8") as f:
        f.write(text)
    with open(os.path.join(args.out, "compare.json"), "w", encoding="utf-8") as f:
        f.write(strict_json(data, indent=2))
    print(text)
    for path in plot_study(results, args.out):
        print(path)
    return 0
