"""What the ``vllm`` generator cannot do, found from the config alone (vLLM need not be
importable: ``grpo validate`` runs anywhere), one line each. grpo_core.preflight
reports them; plugins/generators/vllm.py is written on the assumption that none of them holds."""

from __future__ import annotations

import re
from importlib import metadata

from grpo_core.config.view import Config

#: the first vLLM whose engine returns log-probs of the processed distribution (logprobs_mode)
PROCESSED_LOGPROBS_SINCE = (0, 10, 2)


def _version(text: str) -> tuple[int, ...]:
    """The leading numbers of a version string: '0.10.2rc1+cu128' -> (0, 10, 2)."""
    lead = re.match(r"[\d.]*", text)  # matches every text, if only with ""
    return tuple(int(n) for n in re.findall(r"\d+", lead.group() if lead else "")[:3])


def installed_version() -> str | None:
    """vLLM's installed version, read from its package metadata (nothing is imported)."""
    try:
        return metadata.version("vllm")
    except metadata.PackageNotFoundError:
        return None


def problems(config: Config, world: int, installed: str | None) -> list[str]:
    """The combinations a colocated vLLM engine cannot run. ``world``: the processes this
    launch starts (WORLD_SIZE); ``installed``: vLLM's version, None when it is not there."""
    if config.generator.name != "vllm":
        return []
    found = []
    if config.model.lora:
        found.append(
            "model.lora: not supported with generator vllm (the adapter's weight "
            "names do not map onto the engine's, so its weights could not be synced); "
            "use the hf generator, or train without LoRA"
        )
    if installed is not None and _version(installed) < PROCESSED_LOGPROBS_SINCE:
        found.append(
            f"generator.name: vllm {installed} returns log-probs of the unprocessed "
            f"distribution (no logprobs_mode before 0.10.2), which would bias the "
            f"importance weights; install vllm >= 0.10.2"
        )
    return found + _tensor_parallel(config, world)


def _tensor_parallel(config: Config, world: int) -> list[str]:
    """An engine of tensor_parallel_size t spans t training processes (vLLM's
    external_launcher): each rank holds a shard and all t submit the same requests."""
    tp = config.generator.options.get("tensor_parallel_size", 1)
    if tp == 1:
        return []
    key = "generator.options.tensor_parallel_size"
    found = []
    if world % tp:
        found.append(
            f"{key}: {tp} needs the training processes in groups of {tp} (the "
            f"engine's shards are the ranks'); this launch starts {world}: launch a "
            f"multiple of {tp} with torchrun"
        )
    if config.environment:
        found.append(
            f"{key}: {tp} with an environment is not supported (a turn's requests "
            f"differ between the ranks that share an engine); use 1"
        )
    if config.eval.data and config.eval.every_n_steps:
        found.append(
            f"{key}: {tp} with validation (eval.every_n_steps) is not supported "
            f"(validation generates on rank 0 alone, an engine needs all its {tp} "
            f"ranks); use 1, or eval.every_n_steps: 0"
        )
    return found
