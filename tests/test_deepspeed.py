"""DeepSpeed ZeRO-1 and ZeRO-2 on 2 CPU processes against plain data parallel.

Kept out of CI: DeepSpeed is an optional extra (not in `dev`), and its first start on CPU
JIT-compiles a communication op (about 100 s here). Run it with
`pip install -e '.[deepspeed]' && pytest tests/test_deepspeed.py`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import ROOT, write_config
from test_distributed import cfg_for

pytest.importorskip("deepspeed", reason="the deepspeed extra is not installed (kept out of CI: "
                                        "~100 s op compile on first start)")


def torchrun(cfg_path):
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           "--nproc_per_node=2", "-m", "grpo_core.cli", "train", cfg_path],
                          capture_output=True, text=True, cwd=ROOT, timeout=1200, env=env)


def losses(run_dir):
    return [json.loads(x)["loss"] for x in open(os.path.join(run_dir, "metrics.jsonl"))]


@pytest.mark.slow
def test_zero1_and_zero2_match_plain_data_parallel(tiny_model, addition_data, tmp_path):
    plain = str(tmp_path / "plain")
    p = torchrun(write_config(tmp_path / "plain.json", cfg_for(tiny_model, addition_data, plain)))
    assert p.returncode == 0, p.stderr[-3000:]
    for stage in (1, 2):
        out = str(tmp_path / f"zero{stage}")
        cfg = cfg_for(tiny_model, addition_data, out)
        cfg["deepspeed"] = {"zero_optimization": {"stage": stage}}
        p = torchrun(write_config(tmp_path / f"z{stage}.json", cfg))
        assert p.returncode == 0, p.stderr[-3000:]
        assert losses(out) == pytest.approx(losses(plain), rel=1e-3, abs=1e-5), stage
        assert json.load(open(os.path.join(out, "summary.json")))["ranks_in_sync"]
