"""What the vllm generator cannot run is refused before training, one line each, without vLLM
installed (grpo_core.config.vllm_limits, through ``grpo validate``); and the parts of the generator
that are plain functions: engine arguments, tensor-parallel groups, weight batches."""

from __future__ import annotations

import json
import socket

import pytest
import torch
import torch.distributed as td
import torch.multiprocessing as mp
from grpo_core_plugins.generators.vllm import (
    VLLMGenerator,
    engine_args,
    tensor_parallel_group,
    tensor_parallel_groups,
    weight_batches,
)
from grpo_core_plugins.generators.vllm_worker import EXTENSION
from helpers import make_config
from test_validate import problems

from grpo_core import config
from grpo_core.config import vllm_limits
from grpo_core.config.view import view


def vllm_config(tiny_model, addition_data, tmp_path, **options) -> dict:
    return make_config(
        tiny_model,
        addition_data,
        str(tmp_path / "run"),
        generator={"name": "vllm", "options": options},
    )


def test_vllm_is_not_importable_here():
    """These tests show the checks need no vLLM; were it installed they would prove less."""
    assert vllm_limits.installed_version() is None


@pytest.mark.parametrize(
    "world,change,needle",
    [
        (
            1,
            lambda c: c["model"].update(lora={"r": 8}),
            "model.lora: not supported with generator vllm (the adapter's weight names",
        ),
        (
            3,
            lambda c: c["generator"]["options"].update(tensor_parallel_size=2),
            "generator.options.tensor_parallel_size: 2 needs the training processes in groups of 2",
        ),
        (
            1,
            lambda c: c["generator"]["options"].update(tensor_parallel_size=2),
            "this launch starts 1",
        ),
        (
            2,
            lambda c: (
                c["generator"]["options"].update(tensor_parallel_size=2),
                c.update(environment={"name": "calculator"}),
            ),
            "tensor_parallel_size: 2 with an environment is not supported",
        ),
        (
            2,
            lambda c: (
                c["generator"]["options"].update(tensor_parallel_size=2),
                c.update(eval={"data": c["data"]["path"], "every_n_steps": 1}),
            ),
            "tensor_parallel_size: 2 with validation (eval.every_n_steps) is not supported",
        ),
    ],
)
def test_each_unsupported_combination_is_one_line(
    tiny_model, addition_data, tmp_path, capsys, monkeypatch, world, change, needle
):
    monkeypatch.setenv("WORLD_SIZE", str(world))  # what torchrun would start
    cfg = vllm_config(tiny_model, addition_data, tmp_path)
    change(cfg)
    found = problems(capsys, cfg, tmp_path)
    assert sum(needle in p for p in found) == 1, found


def test_tensor_parallel_ranks_in_whole_groups_pass(
    tiny_model, addition_data, tmp_path, capsys, monkeypatch
):
    monkeypatch.setenv("WORLD_SIZE", "4")
    cfg = vllm_config(tiny_model, addition_data, tmp_path, tensor_parallel_size=2)
    found = problems(capsys, cfg, tmp_path)
    assert not any("tensor_parallel_size" in p for p in found), found


@pytest.mark.parametrize(
    "version,refused",
    [
        ("0.9.2", True),
        ("0.10.1.post1", True),
        ("0.10.2", False),
        ("0.11.0rc2+cu128", False),
        (None, False),
    ],
)
def test_a_vllm_without_processed_logprobs_is_refused(
    tiny_model, addition_data, tmp_path, version, refused
):
    cfg = config.validate(vllm_config(tiny_model, addition_data, tmp_path))
    found = vllm_limits.problems(view(cfg), 1, version)
    assert [p for p in found if "unprocessed distribution" in p] == (
        [
            f"generator.name: vllm {version} returns log-probs of the unprocessed distribution "
            f"(no logprobs_mode before 0.10.2), which would bias the importance weights; install "
            f"vllm >= 0.10.2"
        ]
        if refused
        else []
    )


def test_the_hf_generator_is_never_refused_for_vllms_limits(tiny_model, addition_data, tmp_path):
    cfg = make_config(tiny_model, addition_data, str(tmp_path / "run"))
    cfg["model"]["lora"] = {"r": 8}
    assert vllm_limits.problems(view(config.validate(cfg)), 3, "0.1.0") == []


def test_engine_arguments():
    opts = {
        "gpu_memory_utilization": 0.3,
        "tensor_parallel_size": 2,
        "max_model_len": None,
        "enforce_eager": False,
    }
    one = engine_args(opts, "/m", True, 1)
    assert one["logprobs_mode"] == "processed_logprobs" and one["worker_extension_cls"] == EXTENSION
    assert "distributed_executor_backend" not in one and "max_model_len" not in one
    assert engine_args(opts, "/m", True, 4)["distributed_executor_backend"] == "external_launcher"
    module, cls = EXTENSION.rsplit(".", 1)
    assert hasattr(__import__(module, fromlist=[cls]), cls)  # what vLLM will import


def test_tensor_parallel_groups_are_consecutive_ranks():
    assert tensor_parallel_groups(8, 2) == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert tensor_parallel_groups(4, 4) == [[0, 1, 2, 3]]


def test_weight_batches_bound_the_bytes_and_keep_every_tensor_in_order():
    named = [
        (f"w{i}", torch.zeros(n, dtype=torch.bfloat16))
        for i, n in enumerate([100, 200, 300, 1000, 50])
    ]  # 2 bytes each
    batches = list(weight_batches(named, limit=700))
    assert [[n for n, _ in b] for b in batches] == [["w0", "w1"], ["w2"], ["w3"], ["w4"]]
    assert all(sum(t.numel() * 2 for _, t in b) <= 700 for b in batches if len(b) > 1)


def _share(rank: int, world: int, port: int, out: str) -> None:
    """One of ``world`` gloo ranks: its prompts (rank r has r + 1 of them), shared with the
    ranks of its engine."""
    td.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    gen = VLLMGenerator(tensor_parallel_size=2)
    gen.group = tensor_parallel_group(2)
    mine = [[rank, i] for i in range(rank + 1)]
    requests, start = gen._shared(mine)
    with open(f"{out}/{rank}.json", "w", encoding="utf-8") as f:
        json.dump({"requests": requests, "start": start, "mine": mine}, f)
    td.destroy_process_group()


def test_ranks_sharing_an_engine_submit_the_same_requests(tmp_path):
    """Four real gloo processes, engines of two: each pair submits both ranks' prompts in
    rank order, and each rank finds its own where they start."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_share, args=(4, port, str(tmp_path)), nprocs=4)
    got = [json.loads((tmp_path / f"{r}.json").read_text()) for r in range(4)]
    for a, b in ((0, 1), (2, 3)):
        assert got[a]["requests"] == got[b]["requests"] == got[a]["mine"] + got[b]["mine"]
    for g in got:
        assert g["requests"][g["start"] : g["start"] + len(g["mine"])] == g["mine"]
