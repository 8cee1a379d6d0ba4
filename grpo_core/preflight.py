"""What ``grpo validate`` (and ``grpo train``, first) checks beyond the schema: the things a
run would otherwise trip on only after the model has loaded and generated. All of it is
cheap: files are looked at, the data's first rows read, nothing heavy is loaded."""

from __future__ import annotations

import itertools
import json
import os
import sys

import torch

from grpo_core import trl_checks
from grpo_core.config import vllm_limits
from grpo_core.config.view import Config, ModelSection, RewardSection, view
from grpo_core.data.prompts import check_fields, column_map, column_problems, fit_prompt
from grpo_core.data.sources import Source, check_local, looks_like_hub_id, open_stream, read_rows
from grpo_core.engine import dist, schedules
from grpo_core.env.episodes import problems as episode_problems
from grpo_core.errors import ConfigError, UserError
from grpo_core.hookspecs import Environment
from grpo_core.observe import tracking
from grpo_core.registry import registry
from grpo_core.store import hub, rundir
from grpo_core.store.gguf import cache_problem, gguf_path
from grpo_core.store.models import attention_problem, load_tokenizer

#: rows of each data set looked at
SAMPLE_ROWS = 50


def check(cfg: dict) -> None:
    """Raise ConfigError listing every problem found in a (schema-valid) config."""
    config = view(cfg)
    problems = _model(config.model, config.data.chat_template) + _runtime(config)
    problems += [f"output.dir: {p}" for p in rundir.problems(config.output.dir)]
    problems += tracking.problems(config.output) + column_problems(config.data)
    problems += hub.problems(config.output) + trl_checks.problems(config)
    problems += episode_problems(config) + _plan(config)
    problems += schedules.problems(config.optimizer, schedules.total_updates(config.train))
    passed = column_map(config.data)  # dataset field -> the name the reward gets
    missing = [c for c in reward_columns(config.reward) if c not in passed.values()]
    if missing:
        problems.append(
            f"data.columns: the reward reads {missing}; add them to data.columns "
            f"(a field of that name, or {{field: {missing[0]}}} to pass another "
            f"field under that name)"
        )
    fields = [config.data.prompt_field, *passed, *environment_columns(config)]
    problems += _rows(config, config.data.path, config.data.split, "data.path", fields)
    ev = config.eval
    if ev.data and ev.every_n_steps:
        problems += _rows(config, ev.data, ev.split, "eval.data", fields)
    if problems:
        raise ConfigError(problems)


def reward_columns(reward: RewardSection) -> tuple[str, ...]:
    """The dataset columns the configured reward declares it reads."""
    from grpo_core.reward.functions import declared_columns

    factory = registry().get("reward", reward.name).factory
    return declared_columns(factory, reward.options)


def _plan(config: Config) -> list[str]:
    """What the strategies the run would take refuse (grpo_core.plan), for the processes
    this launch starts, spread as configured."""
    from grpo_core import plan

    strategy = config.distributed.strategy
    how = "none" if strategy in ("auto", "none") else strategy
    return plan.make(config, dist.launched_world(), how).problems


def environment_columns(config: Config) -> tuple[str, ...]:
    """The dataset fields the configured environment declares it reads (none without one)."""
    env = config.environment
    factory = registry().get("environment", env.name).factory if env else None
    if env and isinstance(factory, type) and issubclass(factory, Environment):
        return tuple(factory.columns_for(env.options))
    return ()


def _model(model: ModelSection, chat_template: str) -> list[str]:
    gguf = gguf_path(model)
    if gguf is not None:  # converted (and its chat template read) when the run loads it
        if not os.path.isfile(gguf):
            return [
                f"model.gguf_file: {gguf} not found (expected a .gguf file, by name inside "
                f"model.name_or_path or as a path)"
            ]
        problem = cache_problem()
        return [problem] if problem else []
    path = model.name_or_path
    if os.path.isdir(path):
        if not os.path.isfile(os.path.join(path, "config.json")):
            return [f"model.name_or_path: {path} has no config.json (not a model directory)"]
        return _template(path) if chat_template == "always" else []
    if os.path.exists(path) or path.startswith((".", "/", "~")) or path.count("/") > 1:
        return [f"model.name_or_path: {path} is not a model directory (nor a hub id like org/name)"]
    return _offline_hub(path, "model", "model.name_or_path")


def _offline_hub(repo: str, kind: str, key: str) -> list[str]:
    """With HF_HUB_OFFLINE set, a hub id must be in the local cache: say so now, rather than
    after the trainer's download retries."""
    if os.environ.get("HF_HUB_OFFLINE", "").lower() not in ("1", "true", "yes", "on"):
        return []
    from huggingface_hub import try_to_load_from_cache

    probe = "config.json" if kind == "model" else "README.md"
    try:
        cached = try_to_load_from_cache(repo, probe, repo_type=kind)
    except ValueError:  # not a valid repository id
        cached = None
    if isinstance(cached, str):
        return []
    return [
        f"{key}: {repo} is a hub id that is not in the local Hugging Face cache, and "
        f"HF_HUB_OFFLINE is set; download it first or give a local directory"
    ]


def _template(path: str) -> list[str]:
    try:
        with open(os.path.join(path, "tokenizer_config.json"), encoding="utf-8") as f:
            has = bool(json.load(f).get("chat_template"))
    except (OSError, ValueError):
        has = False
    has = has or os.path.isfile(os.path.join(path, "chat_template.jinja"))
    return (
        []
        if has
        else [f"data.chat_template: 'always', but the tokenizer in {path} has no chat template"]
    )


def _runtime(config: Config) -> list[str]:
    """The machine can run this config: its CPU threads, device, quantization, generator, vLLM
    limits and DeepSpeed settings."""
    problems = _threads(config.runtime.threads)
    cuda = torch.cuda.is_available()
    device = config.runtime.device
    if device == "cuda" and not cuda:
        problems.append("runtime.device: 'cuda', but CUDA is not available")
    on_gpu = cuda and device != "cpu"
    if config.model.quantization and not on_gpu:
        problems.append(
            f"model.quantization: {config.model.quantization} base weights need a CUDA device"
        )
    attention = config.model.attn_implementation
    problem = attention and attention_problem(attention, "cuda" if on_gpu else "cpu")
    if problem:
        problems.append(problem)
    if config.generator.name == "vllm" and not on_gpu:
        problems.append("generator.name: vllm needs a CUDA device; use the hf generator")
    world = dist.launched_world()
    problems += vllm_limits.problems(config, world, vllm_limits.installed_version())
    ds = _deepspeed_config(config.deepspeed, problems)
    if isinstance(ds, dict):
        problems += _deepspeed(ds, config.generator.name)
    return problems


def _threads(threads: int | None) -> list[str]:
    """``runtime.threads`` at most one per CPU this process may use: torch's threads beyond
    that only wait on one another, and a count in the tens of thousands exhausts the OS's
    limit on threads, so the next thread anything starts (the model's loader) fails with a
    message that blames the model."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    if threads is None or cpus is None or threads <= cpus:
        return []
    return [
        f"runtime.threads: {threads} is more than the {cpus} CPUs this process may use; "
        f"torch gains nothing from more than one thread per CPU (set at most {cpus}, or null "
        f"for torch's default)"
    ]


def _deepspeed_config(ds, problems: list[str]):
    """The ``deepspeed`` setting with a file path read as its JSON (None, after a problem
    appended, when it cannot be read; the path itself when the file is missing)."""
    if not isinstance(ds, str):
        return ds
    if not os.path.isfile(ds):
        problems.append(f"deepspeed: config file not found: {ds}")
        return ds
    try:
        with open(ds, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError) as exc:
        problems.append(f"deepspeed: {ds} is not valid JSON ({exc})")
        return None


def _deepspeed(ds: dict, generator: str) -> list[str]:
    """The DeepSpeed settings grpo-core cannot honour: a bad ZeRO stage, NVMe offload, a
    checkpoint writer, and ZeRO-3 with the vLLM ``generator``."""
    problems = []
    zero = ds.get("zero_optimization") or {}
    stage = zero.get("stage", 0)
    if stage not in (0, 1, 2, 3):
        problems.append(f"deepspeed.zero_optimization.stage: {stage!r}; expected 0 to 3")
    for part in ("offload_optimizer", "offload_param"):
        if (zero.get(part) or {}).get("device") == "nvme":
            problems.append(
                f"deepspeed.zero_optimization.{part}.device: nvme is not "
                f"supported (its swapping hooks run only in DeepSpeed's own "
                f"forward; grpo-core calls the model); use cpu or none"
            )
    if (ds.get("checkpoint") or {}).get("writer"):
        problems.append(
            "deepspeed.checkpoint.writer: not supported (a checkpoint must be "
            "complete when its checksums are taken); remove it"
        )
    if stage == 3 and generator == "vllm":
        problems.append(
            "generator.name: vllm is not supported with deepspeed ZeRO-3 (its "
            "weight sync would gather the whole model after every update); "
            "use distributed.strategy fsdp"
        )
    return problems


def _rows(config: Config, path: str, split: str, key: str, fields: list[str]) -> list[str]:
    """The data set can be read and its first rows have the fields (a local file, a
    directory, a saved dataset; streamed the way the run will read it)."""
    dc = config.data  # the training set's source keeps its configuration and data_files
    name, files = (dc.name, dc.data_files) if path == dc.path else (None, None)
    if not os.path.exists(path):
        if not looks_like_hub_id(path):
            return [f"{key}: file not found: {path}"]
        if files:  # a builder (json, csv, ...) reading data_files: nothing on the hub
            try:
                check_local(Source(path, split, name, files, key))
            except UserError as exc:
                return [str(exc)]
            return []
        print(
            f"note: {key}: {path} is read from the Hugging Face Hub when training starts; "
            f"its columns are checked then, not here",
            file=sys.stderr,
        )
        return _offline_hub(path, "dataset", key)
    try:
        check_local(Source(path, split, name, files, key))
    except UserError as exc:
        return [str(exc)]
    try:
        if key == "data.path" and dc.streaming:
            stream = open_stream(Source(path, split, name, files, key), None)
            rows = list(itertools.islice(stream, SAMPLE_ROWS))
        else:
            rows = read_rows(path, split, name, files, limit=SAMPLE_ROWS, key=key)
        check_fields(rows, fields, path)
        if key == "data.path":
            long_rows(config, rows)
    except UserError as exc:
        return [str(exc) if str(exc).startswith(key) else f"{key}: {exc}"]
    return []


#: what ``train`` does with a prompt over the limit, by ``data.long_prompts``
_LONG = {"drop": "leave them out", "truncate_left": "keep their last tokens"}


def long_rows(config: Config, rows: list[dict]) -> None:
    """Say what ``train`` will do with the rows (of those read) whose prompts are over the
    prompt limit, as train decides it (raises under ``data.long_prompts: error``). Needs the
    tokenizer: only for a local model whose repository code need not run."""
    mc, dc = config.model, config.data
    if mc.trust_remote_code or not os.path.isfile(os.path.join(mc.name_or_path, "config.json")):
        return
    budget_key, budget = config.completion_budget
    context = _context(mc.name_or_path)
    limit = dc.max_prompt_tokens or context - budget
    if limit < 1:
        return  # train names the setting that leaves no room
    tokenizer = load_tokenizer(mc)
    long = sum(fit_prompt(row, i, tokenizer, dc, limit)[1] for i, row in enumerate(rows))
    if long:
        why = (
            "data.max_prompt_tokens"
            if dc.max_prompt_tokens
            else f"the model's context {context} minus {budget_key} {budget}"
        )
        print(
            f"notice: data.path: {long} of the first {len(rows)} rows have prompts longer "
            f"than {limit} tokens ({why}); train will {_LONG[dc.long_prompts]} "
            f"(data.long_prompts: {dc.long_prompts})",
            file=sys.stderr,
        )


def _context(model_dir: str) -> int:
    """The model's context in tokens, from its config.json (very large when it says none)."""
    try:
        with open(os.path.join(model_dir, "config.json"), encoding="utf-8") as f:
            n = json.load(f).get("max_position_embeddings")
    except (OSError, ValueError, AttributeError, RecursionError):
        n = None
    return n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else 10**9
