"""Which device each process computes on (grpo_core.engine.dist.own_device), on a stand-in for a
machine with 8 GPUs: torch.cuda's device count and set_device replaced (the ``eight_gpus``
fixture) — the one stand-in this project allows, since CUDA cannot exist where these run."""

from __future__ import annotations

import pytest
import torch

from grpo_core.engine import dist
from grpo_core.errors import UserError


@pytest.fixture
def eight_gpus(monkeypatch):
    """Stands in for a machine with 8 GPUs: CUDA cannot exist on the machines these tests run
    on, so torch.cuda's device count and set_device are replaced here — the one stand-in the
    project allows, in this test only. Returns the devices set_device was called with."""
    current: list[torch.device] = []
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    monkeypatch.setattr(torch.cuda, "set_device", current.append)
    return current


@pytest.mark.parametrize("local_rank", [0, 3, 7])
def test_each_launched_rank_takes_the_gpu_of_its_local_rank(eight_gpus, monkeypatch, local_rank):
    monkeypatch.setenv("WORLD_SIZE", "16")  # two machines of 8
    monkeypatch.setenv("LOCAL_RANK", str(local_rank))
    chosen = dist.own_device(torch.device("cuda"))
    assert chosen == torch.device("cuda", local_rank)
    assert eight_gpus == [chosen]  # made current, before any process group exists


def test_one_process_keeps_the_configured_gpu(eight_gpus, monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.setenv("LOCAL_RANK", "5")  # no launcher: not a rank's number
    assert dist.own_device(torch.device("cuda")) == torch.device("cuda", 0)
    assert dist.own_device(torch.device("cuda", 2)) == torch.device("cuda", 2)
    assert eight_gpus == [torch.device("cuda", 0), torch.device("cuda", 2)]


def test_more_ranks_than_gpus_is_one_line_naming_the_field(eight_gpus, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "9")
    monkeypatch.setenv("LOCAL_RANK", "8")
    with pytest.raises(UserError) as err:
        dist.own_device(torch.device("cuda"))
    assert str(err.value).startswith("runtime.device:") and "8 are visible" in str(err.value)
    assert "\n" not in str(err.value) and eight_gpus == []


def test_a_cpu_run_never_asks_cuda(eight_gpus, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert dist.own_device(torch.device("cpu")) == torch.device("cpu")
    assert eight_gpus == []


def test_init_in_one_process_returns_the_device_and_rank_zero(eight_gpus, monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert dist.init(torch.device("cuda")) == (torch.device("cuda", 0), 0, 1)
