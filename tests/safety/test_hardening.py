"""Hostile inputs and damaged state (issue #19): run directories, locks, damaged
checkpoints, full disks, config bombs, bad data, misbehaving rewards. Each case must end in a
one-line error (exit 2) or be handled, and lose nothing."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import tracemalloc
import types

import pytest
import torch
from helpers import ROOT, make_config, run_grpo, write_config
from safetensors.torch import load_file

from grpo_core import config
from grpo_core.cli.main import main
from grpo_core.hookspecs import hookimpl
from grpo_core.registry import registry
from grpo_core.trainer import train

HANG = 600  # seconds: a guard against a hang only, never a bound on speed (load cannot reach it)
DIGIT = {"name": "format", "options": {"tags": [], "patterns": ["[0-9]"]}}


def cfg_for(tiny_model, data, out, steps=2, **sections):
    return make_config(
        tiny_model,
        data,
        str(out),
        reward=DIGIT,
        train={"steps": steps, "prompts_per_step": 2, "micro_batch_groups": 2, "seed": 1},
        sampling={"group_size": 2, "max_new_tokens": 3},
        output={
            "dir": str(out),
            "progress": False,
            "samples_every": 1,
            "checkpoint_every": 1,
            "keep_last": 3,
        },
        **sections,
    )


def cli(args, capsys) -> tuple[int, str]:
    code = main(args)
    err = capsys.readouterr().err
    return code, err


def one_line_error(code: int, err: str, *needles: str) -> None:
    lines = [x for x in err.strip().splitlines() if x.startswith("error:")]
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    for n in needles:
        assert n in lines[0], lines[0]


# --- run directories ----------------------------------------------------------------------


def test_a_model_directory_is_never_used_as_a_run_directory(
    tiny_model, addition_data, tmp_path, capsys
):
    model = tmp_path / "model"
    shutil.copytree(tiny_model, model)
    before = (model / "config.json").read_bytes()
    path = write_config(tmp_path / "c.json", cfg_for(str(model), addition_data, model))
    code, err = cli(["train", path], capsys)
    one_line_error(code, err, "is not empty", "not a grpo run directory")
    assert (model / "config.json").read_bytes() == before
    assert not (model / "metrics.jsonl").exists()


def test_a_users_files_are_never_overwritten(tiny_model, addition_data, tmp_path, capsys):
    out = tmp_path / "mine"
    out.mkdir()
    for name in ("config.json", "metrics.jsonl", "samples.txt"):
        (out / name).write_text(f"my {name}\n")
    path = write_config(tmp_path / "c.json", cfg_for(tiny_model, addition_data, out))
    for extra in ([], ["--overwrite"]):
        code, err = cli(["train", path, *extra], capsys)
        one_line_error(code, err, "not a grpo run directory")
    assert sorted(os.listdir(out)) == ["config.json", "metrics.jsonl", "samples.txt"]
    assert all((out / n).read_text() == f"my {n}\n" for n in os.listdir(out))


@pytest.mark.parametrize("target", ["file", "/dev/null", "/proc/grpo-test/run", ""])
def test_output_dir_must_be_a_directory_we_can_create(
    tiny_model, addition_data, tmp_path, capsys, target
):
    if target == "file":
        target = str(tmp_path / "a_file")
        open(target, "w").close()
    cfg = cfg_for(tiny_model, addition_data, target or "x")
    cfg["output"]["dir"] = target
    code, err = cli(["train", write_config(tmp_path / "c.json", cfg)], capsys)
    one_line_error(code, err, "output.dir")


def test_fresh_run_never_continues_an_old_one(tiny_model, addition_data, tmp_path, capsys):
    out = tmp_path / "run"
    old = cfg_for(tiny_model, addition_data, out, steps=6)
    train(config.validate(old))
    new = write_config(tmp_path / "new.json", cfg_for(tiny_model, addition_data, out, steps=3))
    code, err = cli(["train", new], capsys)
    one_line_error(code, err, "holds an earlier run", "--resume", "--overwrite")
    assert len(os.listdir(out / "checkpoints")) == 3  # the old run is untouched
    assert cli(["train", new, "--overwrite"], capsys)[0] == 0
    ckpts = sorted(os.listdir(out / "checkpoints"))
    assert ckpts == ["step-00000001", "step-00000002", "step-00000003"]  # only the new run's
    steps = [json.loads(x)["step"] for x in open(out / "metrics.jsonl")]
    assert steps == [0, 1, 2]
    more = cfg_for(tiny_model, addition_data, out, steps=4)
    assert cli(["train", write_config(tmp_path / "m.json", more), "--resume"], capsys)[0] == 0
    assert [json.loads(x)["step"] for x in open(out / "metrics.jsonl")] == [0, 1, 2, 3]


def test_checkpoints_of_another_run_are_neither_loaded_nor_counted(
    tiny_model, addition_data, tmp_path, capsys
):
    out = tmp_path / "run"
    train(config.validate(cfg_for(tiny_model, addition_data, out, steps=2)))
    foreign = out / "checkpoints" / "step-00000009"
    shutil.copytree(out / "checkpoints" / "step-00000002", foreign)
    state = json.loads((foreign / "state.json").read_text())
    (foreign / "state.json").write_text(json.dumps({**state, "run_id": "someone-else"}))
    more = write_config(tmp_path / "m.json", cfg_for(tiny_model, addition_data, out, steps=3))
    assert cli(["train", more, "--resume"], capsys)[0] == 0
    assert [json.loads(x)["step"] for x in open(out / "metrics.jsonl")] == [0, 1, 2]
    assert foreign.exists()  # keep_last never deletes what is not this run's


def test_one_writer_per_run_directory(tiny_model, addition_data, tmp_path):
    out = tmp_path / "run"
    path = write_config(tmp_path / "c.json", cfg_for(tiny_model, addition_data, out, steps=400))
    first = subprocess.Popen(
        [sys.executable, "-m", "grpo_core.cli", "train", path],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        cwd=ROOT,
    )
    try:
        t0 = time.monotonic()
        while not (out / "metrics.jsonl").exists():
            assert time.monotonic() - t0 < HANG and first.poll() is None
            time.sleep(0.05)
        second = run_grpo("train", path, "--resume", cwd=ROOT)
        assert second.returncode == 2 and f"PID {first.pid}" in second.stderr, second.stderr
        assert first.poll() is None  # the first run goes on
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    # the dead writer's lock is gone with it: resuming works at once
    shorter = write_config(tmp_path / "s.json", cfg_for(tiny_model, addition_data, out, steps=400))
    p = subprocess.Popen(
        [sys.executable, "-m", "grpo_core.cli", "train", shorter, "--resume"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        cwd=ROOT,
        text=True,
    )
    try:
        t0 = time.monotonic()
        n = sum(1 for _ in open(out / "metrics.jsonl"))
        while sum(1 for _ in open(out / "metrics.jsonl")) <= n:
            assert p.poll() is None, p.stderr.read()
            assert time.monotonic() - t0 < HANG
            time.sleep(0.05)
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait()


# --- damaged checkpoints -------------------------------------------------------------------


def _damage(path, how: str) -> None:
    if how == "truncate weights":
        f = path / "model.safetensors"
        f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    elif how == "flip a bit of trainer.pt":
        f = path / "trainer.pt"
        data = bytearray(f.read_bytes())
        data[len(data) // 2] ^= 0x10
        f.write_bytes(bytes(data))
    elif how == "break state.json":
        (path / "state.json").write_text('{"step": 3, "rng"')
    elif how == "remove the optimizer state":
        (path / "trainer.pt").unlink()
    elif how == "remove the tokenizer":
        (path / "tokenizer.json").unlink()


@pytest.mark.parametrize(
    "how",
    [
        "truncate weights",
        "flip a bit of trainer.pt",
        "break state.json",
        "remove the optimizer state",
        "remove the tokenizer",
    ],
)
def test_a_damaged_checkpoint_falls_back_to_the_newest_intact_one(
    tiny_model, addition_data, tmp_path, capsys, how
):
    out = tmp_path / "run"
    train(config.validate(cfg_for(tiny_model, addition_data, out, steps=3)))
    _damage(out / "checkpoints" / "step-00000003", how)
    more = write_config(tmp_path / "m.json", cfg_for(tiny_model, addition_data, out, steps=4))
    code, err = cli(["train", more, "--resume"], capsys)
    assert code == 0, err
    assert "step-00000003 is damaged" in err and "Traceback" not in err
    assert [json.loads(x)["step"] for x in open(out / "metrics.jsonl")] == [0, 1, 2, 3]


def test_resume_path_that_is_missing_damaged_or_a_file(tiny_model, addition_data, tmp_path, capsys):
    out = tmp_path / "run"
    train(config.validate(cfg_for(tiny_model, addition_data, out, steps=1)))
    path = write_config(tmp_path / "c.json", cfg_for(tiny_model, addition_data, out, steps=2))
    for target in (str(tmp_path / "nowhere"), path):
        one_line_error(*cli(["train", path, "--resume", target], capsys), "--resume")
    ckpt = out / "checkpoints" / "step-00000001"
    _damage(ckpt, "truncate weights")
    one_line_error(*cli(["train", path, "--resume", str(ckpt)], capsys), "is damaged")


def test_a_changed_model_is_refused_before_its_weights_load(
    tiny_model, addition_data, tmp_path, capsys
):
    from grpo_core.tiny import build_model

    out = tmp_path / "run"
    train(config.validate(cfg_for(tiny_model, addition_data, out, steps=1)))
    wider = build_model(str(tmp_path / "wider"), hidden=48, layers=2, seed=0)
    cfg = cfg_for(wider, addition_data, out, steps=2)
    path = write_config(tmp_path / "c.json", cfg)
    one_line_error(*cli(["train", path, "--resume"], capsys), "model.name_or_path")
    one_line_error(*cli(["train", path, "--resume", "--force"], capsys), "has shape")


def test_a_new_learning_rate_is_refused_or_applied_never_ignored(
    tiny_model, addition_data, tmp_path, capsys
):
    out = tmp_path / "run"
    train(config.validate(cfg_for(tiny_model, addition_data, out, steps=2)))
    cfg = cfg_for(tiny_model, addition_data, out, steps=3, optimizer={"lr": 0.02})
    path = write_config(tmp_path / "c.json", cfg)
    one_line_error(
        *cli(["train", path, "--resume"], capsys), "optimizer.lr: checkpoint 0.001, config 0.02"
    )
    assert cli(["train", path, "--resume", "--force"], capsys)[0] == 0
    rows = [json.loads(x) for x in open(out / "metrics.jsonl")]
    assert rows[1]["lr"] == pytest.approx(0.001) and rows[2]["lr"] == pytest.approx(0.02)


def test_checkpoints_are_model_directories_other_tools_load(tiny_model, addition_data, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = tmp_path / "run"
    train(config.validate(cfg_for(tiny_model, addition_data, out, steps=2)))
    ckpt = out / "checkpoints" / "step-00000002"
    model = AutoModelForCausalLM.from_pretrained(ckpt)
    AutoTokenizer.from_pretrained(ckpt)
    final = load_file(os.path.join(out, "final", "model.safetensors"))
    for name, value in model.state_dict().items():
        if name in final:
            assert torch.equal(value, final[name]), name
    assert not (ckpt / "master.safetensors").exists()  # float32 base: weights saved once


def test_a_bfloat16_base_model_is_saved_in_bfloat16(tiny_model, addition_data, tmp_path):
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM

    base = tmp_path / "bf16"
    AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.bfloat16).save_pretrained(base)
    for f in os.listdir(tiny_model):
        if not f.endswith(".safetensors") and f != "config.json":
            shutil.copy(os.path.join(tiny_model, f), base)
    out = tmp_path / "run"
    train(config.validate(cfg_for(str(base), addition_data, out, steps=2)))
    for where in (out / "final", out / "checkpoints" / "step-00000002"):
        with safe_open(str(where / "model.safetensors"), "pt") as f:
            assert {f.get_slice(k).get_dtype() for k in f.keys()} == {"BF16"}
        assert json.loads((where / "config.json").read_text())["dtype"] == "bfloat16"
    assert (out / "checkpoints" / "step-00000002" / "master.safetensors").exists()
    out32 = tmp_path / "run32"
    cfg = cfg_for(str(base), addition_data, out32, steps=1)
    cfg["output"]["save_dtype"] = "float32"
    train(config.validate(cfg))
    with safe_open(str(out32 / "final" / "model.safetensors"), "pt") as f:
        assert {f.get_slice(k).get_dtype() for k in f.keys()} == {"F32"}


# --- full disk: a real small tmpfs in a private mount namespace ---------------------------


def in_small_fs(mount: str, kib: int, *cmd: str, timeout: int = 300):
    """Run ``cmd`` with a ``kib``-KiB tmpfs mounted at ``mount`` (a user and mount namespace
    of its own, so no root is needed); skips where namespaces are not allowed."""
    if shutil.which("unshare") is None:
        pytest.skip("needs unshare(1) for a private tmpfs")
    probe = subprocess.run(["unshare", "-rm", "true"], capture_output=True)
    if probe.returncode:
        pytest.skip(f"user namespaces are not allowed here: {probe.stderr.decode().strip()}")
    script = 'mount -t tmpfs -o size="$1"k tmpfs "$2" && shift 2 && exec "$@"'
    return subprocess.run(
        ["unshare", "-rm", "sh", "-c", script, "sh", str(kib), mount, *cmd],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
    )


def test_full_disk_while_writing_the_optimizer_state(tiny_model, addition_data, tmp_path):
    disk = tmp_path / "disk"
    disk.mkdir()
    out = disk / "run"
    path = write_config(tmp_path / "c.json", cfg_for(tiny_model, addition_data, out, steps=2))
    # room for the weights and tokenizer (~150 KiB), not for the optimizer state (~230 KiB)
    p = in_small_fs(
        str(disk),
        300,
        "sh",
        "-c",
        f"{sys.executable} -m grpo_core.cli train {path}; echo rc=$?; ls -A {out / 'checkpoints'}",
    )
    assert "rc=2" in p.stdout, p.stdout + p.stderr
    assert "cannot write checkpoint" in p.stderr and "No space left on device" in p.stderr
    assert "Traceback" not in p.stderr
    assert p.stdout.strip().endswith("rc=2")  # no checkpoint, and no temporary one left


def test_resume_and_metrics_on_a_full_disk(tiny_model, addition_data, tmp_path):
    disk = tmp_path / "disk"
    disk.mkdir()
    out = disk / "run"
    first = write_config(tmp_path / "a.json", cfg_for(tiny_model, addition_data, out, steps=2))
    more = write_config(tmp_path / "b.json", cfg_for(tiny_model, addition_data, out, steps=4))
    fill = f"head -c 100000000 /dev/zero > {disk}/filler 2>/dev/null;"
    py = f"{sys.executable} -m grpo_core.cli train"
    # a run, the disk filled up, then a resume: one line, nothing half-written left behind
    p = in_small_fs(
        str(disk),
        2048,
        "sh",
        "-c",
        f"{py} {first} > /dev/null 2>&1 || exit 9; {fill}"
        f"{py} {more} --resume; echo rc=$?; ls -a {out}",
    )
    assert "rc=2" in p.stdout, p.stdout + p.stderr
    assert "No space left on device" in p.stderr and "Traceback" not in p.stderr
    assert "metrics.jsonl.tmp" not in p.stdout


def test_a_metrics_line_cut_mid_write_is_skipped_with_a_warning(
    tiny_model, addition_data, tmp_path, capsys
):
    out = tmp_path / "run"
    train(config.validate(cfg_for(tiny_model, addition_data, out, steps=2)))
    with open(out / "metrics.jsonl", "a") as f:
        f.write('{"step": 2, "reward": 0.')  # the process died here
    more = write_config(tmp_path / "m.json", cfg_for(tiny_model, addition_data, out, steps=3))
    code, err = cli(["train", more, "--resume"], capsys)
    assert code == 0 and "last line is incomplete" in err
    assert [json.loads(x)["step"] for x in open(out / "metrics.jsonl")] == [0, 1, 2]


# --- config files ---------------------------------------------------------------------------


def _bomb(levels: int) -> str:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


GOOD = (
    f"model: {{name_or_path: m}}\ndata: {{path: {ROOT}/tests/data/prompts.jsonl, columns: "
    f"[answer]}}\nreward: {{name: math}}\n"
)


@pytest.mark.parametrize(
    "text,needle",
    [
        (_bomb(9), "once YAML aliases are expanded"),
        ("a: &a [*a]\n", "refers to itself"),
        ("a: " + "[" * 3000 + "]" * 3000 + "\n", "nesting deeper"),
        (GOOD + "train: {steps: " + "9" * 5000 + "}\n", "integer"),
        (GOOD + "optimizer: {lr: .inf}\n", "optimizer.lr: found inf, expected a finite number"),
        (GOOD + "optimizer: {lr: .nan}\n", "optimizer.lr: found nan"),
        (GOOD + "train: {steps: 2.0}\n", "train.steps: found 2.0 (float), expected integer"),
        (GOOD + "model: {name_or_path: n}\n", "duplicate key 'model'"),
        (
            GOOD.replace(
                "reward: {name: math}",
                "reward: {name: format, options: {patterns: ['(a+)+(?=b)']}}",
            ),
            "not supported by the linear-time regex engine",
        ),
        (
            GOOD.replace(
                "reward: {name: math}",
                "reward: {name: json_schema, options: {schema: {type: nonsense}}}",
            ),
            "reward.options.schema",
        ),
        ("\xff\xfe", "not UTF-8"),
    ],
)
def test_hostile_config_files(tmp_path, capsys, text, needle):
    path = tmp_path / "c.yaml"
    path.write_bytes(text.encode("latin-1") if text.startswith("\xff") else text.encode())
    good = tmp_path / "good.yaml"
    good.write_text(GOOD)
    cli(["validate", str(good)], capsys)  # imports done once, outside the measure
    # the work, in bytes: refused without expanding the bomb (9**9 values, gigabytes), with
    # no runaway recursion or copying; a limit on memory, which load does not change
    tracemalloc.start()
    try:
        one_line_error(*cli(["validate", str(path)], capsys), needle)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 64 * 2**20, peak


def test_a_config_that_never_ends_is_refused(capsys):
    one_line_error(*cli(["validate", "/dev/zero"], capsys), "not a regular file")


def test_set_accepts_the_paths_errors_print(tmp_path, capsys):
    path = tmp_path / "c.yaml"
    path.write_text(
        GOOD.replace(
            "reward: {name: math}",
            "reward: {name: weighted, options: {components: [{name: math}, {name: length}]}}",
        )
    )
    assert main(["validate", str(path), "--set", "reward.options.components[1].weight=0.5"]) == 0
    eff = __import__("yaml").safe_load(capsys.readouterr().out)
    assert eff["reward"]["options"]["components"][1]["weight"] == 0.5
    one_line_error(
        *cli(["validate", str(path), "--set", "reward.options.components[7].w=1"], capsys),
        "not an index",
    )


# --- data and models -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "content,needle",
    [
        (
            b'{"prompt": "1+1=", "answer": "2"}\n{"prompt": "\xff\xfe", "answer": "3"}\n',
            "not UTF-8",
        ),
        (b'{"prompt": "", "answer": "2"}\n', "empty prompt"),
        (b'{"prompt": ["1+1="], "answer": "2"}\n', "chat messages"),
        (b'{"prompt": 7, "answer": "2"}\n', "expected text or a list of chat messages"),
        (b'{"prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b', "answer": "2"}\n', "nested"),
    ],
)
def test_bad_data_rows(tiny_model, tmp_path, capsys, content, needle):
    data = tmp_path / "d.jsonl"
    data.write_bytes(content)
    path = write_config(tmp_path / "c.json", cfg_for(tiny_model, str(data), tmp_path / "r"))
    one_line_error(*cli(["train", path], capsys), needle)


def test_garbage_parquet(tiny_model, tmp_path, capsys):
    data = tmp_path / "d.parquet"
    data.write_bytes(b"PAR1 this is not parquet at all" * 10)
    path = write_config(tmp_path / "c.json", cfg_for(tiny_model, str(data), tmp_path / "r"))
    one_line_error(*cli(["train", path], capsys), "not a readable parquet file")


def test_prompts_longer_than_the_context(tiny_model, tmp_path, capsys):
    data = tmp_path / "d.jsonl"
    rows = [{"prompt": "1+1=", "answer": "2"}, {"prompt": "x" * 200_000, "answer": "3"}]
    data.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    cfg = cfg_for(tiny_model, str(data), tmp_path / "r", steps=1)
    cfg["data"]["long_prompts"] = "error"
    one_line_error(
        *cli(["train", write_config(tmp_path / "e.json", cfg)], capsys),
        "row 1 has a prompt of 200000 characters (more than 253 tokens)",
    )
    cfg["data"]["long_prompts"] = "drop"
    code, err = cli(["train", write_config(tmp_path / "d.json", cfg)], capsys)
    assert code == 0 and "1 of 2 prompts are longer than 253 tokens" in err, err
    cfg["data"]["long_prompts"], cfg["output"]["dir"] = "truncate_left", str(tmp_path / "t")
    assert cli(["train", write_config(tmp_path / "t.json", cfg)], capsys)[0] == 0


def test_corrupt_model_weights(tiny_model, addition_data, tmp_path, capsys):
    model = tmp_path / "model"
    shutil.copytree(tiny_model, model)
    weights = model / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    path = write_config(tmp_path / "c.json", cfg_for(str(model), addition_data, tmp_path / "r"))
    one_line_error(*cli(["train", path], capsys), "cannot load a model")


# --- rewards that misbehave ---------------------------------------------------------------


def _register(name, fn):
    module = types.ModuleType(f"hardening_{name}")
    module.reward = hookimpl(lambda register: register(name, lambda: fn), specname="reward")
    registry().add(module, f"test-{name}")


@pytest.mark.parametrize(
    "name,fn",
    [
        ("exits", lambda p, c, **k: sys.exit(0)),
        ("huge", lambda p, c, **k: [10**400] * len(c)),
        (
            "bad_dims",
            lambda p, c, **k: __import__("grpo_core").Scores(
                [1.0] * len(c), dimensions={"short": [1.0], "words": ["a"] * len(c)}
            ),
        ),
    ],
)
def test_rewards_that_misbehave_never_end_the_run_silently(
    tiny_model, addition_data, tmp_path, capsys, name, fn
):
    _register(name, fn)
    cfg = cfg_for(tiny_model, addition_data, tmp_path / name, steps=2)
    cfg["reward"] = {"name": name, "failure": "raise"}
    code, err = cli(["train", write_config(tmp_path / "c.json", cfg)], capsys)
    if name == "bad_dims":  # the scores are fine; the malformed dimension is left out
        assert code == 0 and "dimension 'short' is not a list of 4; left out" in err
        rows = [json.loads(x) for x in open(tmp_path / name / "metrics.jsonl")]
        assert "reward/short" not in rows[0] and "reward/words" not in rows[0]
    else:
        one_line_error(code, err, f"reward {name!r}", "reward.failure: raise")
        cfg["reward"]["failure"], cfg["output"]["dir"] = "zero", str(tmp_path / "z")
        assert cli(["train", write_config(tmp_path / "z.json", cfg)], capsys)[0] == 0


# --- plugins and small commands ------------------------------------------------------------


def test_plugins_are_never_loaded_from_the_working_directory(tmp_path):
    planted = tmp_path / "planted"
    (planted / "evil_plugin-1.0.dist-info").mkdir(parents=True)
    (planted / "evil_plugin-1.0.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: evil-plugin\nVersion: 1.0\n"
    )
    (planted / "evil_plugin-1.0.dist-info" / "entry_points.txt").write_text(
        "[grpo_core]\nevil = evil_plugin\n"
    )
    (planted / "evil_plugin.py").write_text(f"open({str(tmp_path / 'pwned')!r}, 'w').close()\n")
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p
        ),
    }
    p = subprocess.run(
        [sys.executable, "-m", "grpo_core.cli", "plugins", "--json"],
        capture_output=True,
        text=True,
        cwd=planted,
        env=env,
    )
    assert p.returncode == 0, p.stderr
    assert "evil" not in p.stdout and not (tmp_path / "pwned").exists()
    assert '"grpo"' in p.stdout  # the installed ones are all there


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--temperature", "-1"], "--temperature"),
        (["--max-problems", "0"], "--max-problems"),
    ],
)
def test_eval_refuses_meaningless_arguments(
    tiny_model, addition_data, tmp_path, capsys, args, needle
):
    path = write_config(tmp_path / "c.json", cfg_for(tiny_model, addition_data, tmp_path / "r"))
    one_line_error(*cli(["eval", path, *args], capsys), needle)


def test_plugins_new_into_an_unwritable_place(tmp_path, capsys):
    target = tmp_path / "a_file"
    target.write_text("")
    one_line_error(*cli(["plugins", "new", "thing", "--out", str(target)], capsys), "--out")
