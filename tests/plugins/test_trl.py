"""TRL interop: our rewards as TRL reward functions, and 2 GRPOTrainer steps with one."""

from __future__ import annotations

import json
import os
import tempfile
import threading
import types

import pytest
import torch

from grpo_core.config.view import view
from grpo_core.integrations.trl import trl_reward


def test_wrapper_handles_plain_and_conversational_completions():
    f = trl_reward("math")
    assert f.__name__ == "grpo_core_math"
    plain = f(
        prompts=["1+1="] * 2,
        completions=["\\boxed{2}", "3"],
        answer=["2", "2"],
        completion_ids=[[1, 2], [3]],
        trainer_state=types.SimpleNamespace(global_step=1, max_steps=2),
    )
    assert plain == [1.0, 0.0]
    chat = f(
        prompts=[[{"role": "user", "content": "1+1?"}]] * 2,
        completions=[
            [{"role": "assistant", "content": "It is 2"}],
            [{"role": "assistant", "content": "It is 7"}],
        ],
        answer=["2", "2"],
    )
    assert chat == [1.0, 0.0]
    length = trl_reward("length", {"max_length": 4, "buffer": 2})
    assert length(prompts=["p"], completions=["x"], completion_ids=[[1, 2, 3, 4, 5]]) == [-1.0]


def test_trl_grpo_trainer_two_steps_with_our_math_reward(tiny_model, tmp_path):
    trl = pytest.importorskip("trl", reason="TRL is a test-only dependency (pip install trl)")
    datasets = pytest.importorskip("datasets")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    rows = [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a in range(4) for b in range(4)]
    ds = datasets.Dataset.from_list(rows)
    tok = AutoTokenizer.from_pretrained(tiny_model)
    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    args = trl.GRPOConfig(
        output_dir=str(tmp_path / "trl"),
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=4,
        max_steps=2,
        learning_rate=1e-4,
        logging_steps=1,
        report_to=[],
        use_cpu=True,
        gradient_checkpointing=False,
        save_strategy="no",
        bf16=False,
    )
    trainer = trl.GRPOTrainer(
        model=model,
        processing_class=tok,
        reward_funcs=[trl_reward("math")],
        args=args,
        train_dataset=ds,
    )
    trainer.train()
    logs = [
        h
        for h in trainer.state.log_history
        if "rewards/grpo_core_math/mean" in h or any("grpo_core_math" in k for k in h)
    ]
    assert trainer.state.global_step == 2 and logs, json.dumps(trainer.state.log_history)[:500]


# --- the reward-function contract: the same arguments from grpo-core as from GRPOTrainer ----

TEXTS = ["<think>\nsum\n</think>\n4", "5", "<think>x</think> \\boxed{4}", "4"]
STANDARD = [
    {"prompt": "2+2=", "answer": "4", "level": 1},
    {"prompt": "3+2=", "answer": "5", "level": 2},
]
CHAT = [
    {"prompt": [{"role": "user", "content": "2+2?"}], "answer": "4", "level": 1},
    {"prompt": [{"role": "user", "content": "3+2?"}], "answer": "5", "level": 2},
]


def _seen(kwargs: dict) -> dict:
    """What a reward function received, as comparable data: callables as "callable", the
    trainer state as its global_step."""
    out = {}
    for key, value in kwargs.items():
        if key == "trainer_state":
            out[key] = {"global_step": value.global_step}
        elif callable(value):
            out[key] = "callable"
        else:
            out[key] = value
    return out


def _spy(path):
    """A reward function that writes what it was called with to ``path`` (it may run in the
    reward's worker process), and scores with TRL's think_format_reward (which takes
    message lists: plain text is wrapped for it)."""

    def spy(**kwargs):
        from trl.rewards import think_format_reward

        with open(path, "w", encoding="utf-8") as f:
            json.dump(_seen(kwargs), f)
        chats = [[{"content": c}] if isinstance(c, str) else c for c in kwargs["completions"]]
        return think_format_reward(chats)

    return spy


def _trl_call(tiny_model, tmp_path, rows: list[dict], step: int) -> tuple[dict, list, list]:
    """The kwargs GRPOTrainer hands a reward function for ``rows`` x 2 completions of TEXTS.
    Its reward computation (``_calculate_rewards``, what a training step calls after
    generating) is driven directly with these completions: a full step would sample other
    text than grpo-core's sampler does, and the contract is about the call, not sampling.
    The completions are decoded as TRL's ``_generate`` decodes them (skip_special_tokens,
    one assistant message each for conversational prompts)."""
    trl = pytest.importorskip("trl", reason="TRL is a test-only dependency (pip install trl)")
    datasets = pytest.importorskip("datasets")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model)
    path = tmp_path / "trl_seen.json"
    args = trl.GRPOConfig(
        output_dir=str(tmp_path / "trl"),
        per_device_train_batch_size=4,
        num_generations=2,
        max_completion_length=8,
        report_to=[],
        use_cpu=True,
        save_strategy="no",
        bf16=False,
    )
    trainer = trl.GRPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(tiny_model),
        processing_class=tok,
        reward_funcs=[_spy(path)],
        args=args,
        train_dataset=datasets.Dataset.from_list(rows),
    )
    trainer.state.global_step = step
    inputs = [row for row in rows for _ in range(2)]
    ids = [tok(t).input_ids + [tok.eos_token_id] for t in TEXTS]
    texts = tok.batch_decode(ids, skip_special_tokens=True)
    chat = isinstance(rows[0]["prompt"], list)
    completions = [[{"role": "assistant", "content": t}] for t in texts] if chat else texts
    rewards = trainer._calculate_rewards(inputs, [x["prompt"] for x in inputs], completions, ids)
    return json.loads(path.read_text()), rewards[:, 0].tolist(), ids


def _ours(tiny_model, tmp_path, rows: list[dict], ids: list, step: int, isolation: str):
    """The kwargs grpo-core hands the same function for the same rows and token ids: the
    reward built as a run builds it (``isolation: process``: in its worker process) and
    called through the loop's own scoring path (score_rollout)."""
    from helpers import make_config

    from grpo_core import config
    from grpo_core.data.prompts import make_batch
    from grpo_core.reward import functions
    from grpo_core.reward.call import score_rollout
    from grpo_core.reward.isolation import build_reward
    from grpo_core.rollout import Rollout
    from grpo_core.store.models import load_tokenizer

    path = tmp_path / "ours_seen.json"
    functions.register("contract_spy", _spy(path))
    cfg = config.validate(
        make_config(
            tiny_model,
            str(tmp_path / "unused.jsonl"),
            str(tmp_path / "out"),
            data={"columns": ["answer", "level"]},
            reward={"name": "contract_spy", "isolation": isolation},
        )
    )
    tok = load_tokenizer(view(cfg).model)
    batch = make_batch(rows, view(cfg).data, tok)
    width = max(len(x) for x in ids)
    completion = torch.tensor([x + [tok.pad_token_id] * (width - len(x)) for x in ids])
    mask = torch.tensor([[1] * len(x) + [0] * (width - len(x)) for x in ids])
    prompt = torch.tensor([[1, 2]] * len(rows))
    ro = Rollout(
        prompt,
        torch.ones_like(prompt),
        completion,
        mask,
        torch.zeros(completion.shape),
        torch.zeros(len(ids), dtype=torch.bool),
        torch.tensor([0, 0, 1, 1]),
    )
    section = view(cfg).reward
    reward = build_reward(section)
    try:
        scored = score_rollout(reward, section, tok, batch, ro, None, (step, 10))
    finally:
        reward.close()
    return json.loads(path.read_text()), scored.rewards.tolist()


@pytest.mark.parametrize("rows", [STANDARD, CHAT], ids=["standard", "conversational"])
def test_a_reward_function_gets_what_trl_gives_it(tiny_model, tmp_path, rows):
    theirs, trl_rewards, ids = _trl_call(tiny_model, tmp_path, rows, step=3)
    ours, our_rewards = _ours(tiny_model, tmp_path, rows, ids, step=3, isolation="process")
    assert set(ours) - set(theirs) == {"completion_tokens", "group_ids"}  # our own extras
    assert set(theirs) - set(ours) == set(), theirs.keys()
    for key in theirs:
        assert ours[key] == theirs[key], key
    assert theirs["completion_ids"] == ids and theirs["trainer_state"] == {"global_step": 3}
    assert trl_rewards == our_rewards == [1.0, 0.0, 1.0, 0.0]  # think_format_reward, both


def test_none_means_no_reward_alone_and_inside_weighted(tmp_path):
    """None (or NaN) from a function: that completion has no reward from it; weighted sums the
    rest with their weights (TRL's nansum over reward_weights); none at all: no reward."""
    import grpo_core
    from grpo_core.reward import functions
    from grpo_core.reward.call import score

    def only_first(completions, **kwargs):
        return [1.0, None, None, float("nan")]

    def others(completions, **kwargs):
        return [None, 2.0, None, None]

    functions.register("only_first", only_first)
    functions.register("others", others)
    alone = score(
        grpo_core.create("reward", "only_first"),
        "f",
        ["p"] * 4,
        ["c"] * 4,
        {},
        torch.tensor([0, 0, 1, 1]),
    )
    assert alone.problem is None and alone.rewards[0] == 1.0 and alone.rewards[1:].isnan().all()
    both = grpo_core.create(
        "reward",
        "weighted",
        {"components": [{"name": "only_first", "weight": 0.5}, {"name": "others", "weight": 2.0}]},
    )
    out = both(["p"] * 4, ["c"] * 4, group_ids=[0, 0, 1, 1])
    assert list(out) == [0.5, 4.0, None, None]
    scored = score(
        both,
        "weighted",
        ["p"] * 4,
        ["c"] * 4,
        {"group_ids": [0, 0, 1, 1]},
        torch.tensor([0, 0, 1, 1]),
    )
    assert scored.problem is None and scored.rewards[:2].tolist() == [0.5, 4.0]
    assert scored.rewards[2:].isnan().all()


def test_async_functions_are_awaited_concurrently_in_the_worker(tmp_path):
    """Two ``async def`` rewards inside weighted, in the reward's worker process: each waits
    at a two-party barrier, which only opens when both are running at once (the 60 s barrier
    timeout can only mean they ran one after the other). The barrier is made in the worker:
    both functions are pickled together, so they share the ``shared`` dict there."""
    from grpo_core import config
    from grpo_core.reward import functions
    from grpo_core.reward.isolation import build_reward

    shared: dict = {}

    async def meet() -> None:
        import asyncio

        barrier = shared.setdefault("barrier", threading.Barrier(2, timeout=60))
        await asyncio.to_thread(barrier.wait)

    async def fmt(completions, log_metric, log_extra, **kwargs):
        await meet()
        log_metric("seen", float(len(completions)))
        log_extra("pid", [os.getpid()] * len(completions))
        return [1.0 if "<think>" in c else 0.0 for c in completions]

    async def right(completions, answer, **kwargs):
        await meet()
        return [1.0 if a in c else 0.0 for c, a in zip(completions, answer)]

    functions.register("fmt", fmt)
    functions.register("right", right)
    reward_cfg = view(
        config.validate(
            {
                "model": {"name_or_path": "m"},
                "data": {"path": "d.jsonl", "columns": ["answer"]},
                "reward": {
                    "name": "weighted",
                    "options": {"components": [{"name": "fmt"}, {"name": "right"}]},
                },
            }
        )
    ).reward
    reward = build_reward(reward_cfg)
    try:
        out = reward(["p", "p"], ["<think>4", "5"], answer=["4", "4"], group_ids=[0, 0])
    finally:
        reward.close()
    assert list(out) == [2.0, 0.0]
    assert out.dimensions["seen"] == [2.0, 2.0]
    assert out.extras["pid"][0] != os.getpid()  # scored in the worker process


def test_trls_shipped_rewards_run_unchanged_on_a_conversational_batch(tmp_path):
    """TRL's think_format_reward and accuracy_reward (math_verify) as grpo-core rewards, in a
    weighted sum in the worker process: the same per-function scores as TRL's own call."""
    pytest.importorskip("math_verify", reason="accuracy_reward needs math_verify")
    trl_rewards = pytest.importorskip("trl.rewards")
    from grpo_core import config
    from grpo_core.reward import functions
    from grpo_core.reward.isolation import build_reward

    functions.register("think_format_reward", trl_rewards.think_format_reward)
    functions.register("accuracy_reward", trl_rewards.accuracy_reward)
    prompts = [[{"role": "user", "content": "2+2?"}]] * 4
    texts = ["<think>ok</think> \\boxed{4}", "\\boxed{5}", "<think>a</think>", "\\boxed{4}"]
    solution = ["$4$"] * 4
    chats = [[{"role": "assistant", "content": t}] for t in texts]
    fmt = trl_rewards.think_format_reward(completions=chats)
    acc = trl_rewards.accuracy_reward(completions=chats, solution=solution)
    reward_cfg = view(
        config.validate(
            {
                "model": {"name_or_path": "m"},
                "data": {"path": "d.jsonl", "columns": ["solution"]},
                "reward": {
                    "name": "weighted",
                    "options": {
                        "components": [
                            {"name": "think_format_reward", "weight": 0.5},
                            {"name": "accuracy_reward"},
                        ]
                    },
                },
            }
        )
    ).reward
    reward = build_reward(reward_cfg)
    try:
        out = reward(prompts, texts, solution=solution, group_ids=[0, 0, 0, 0])
    finally:
        reward.close()
    assert out.dimensions["think_format_reward"] == fmt == [1.0, 0.0, 1.0, 0.0]
    assert out.dimensions["accuracy_reward"] == acc and acc[0] == acc[3] == 1.0 and acc[1] == 0.0
    assert list(out) == [0.5 * f + a for f, a in zip(fmt, acc)]


def test_validate_catches_what_a_trl_run_would_trip_on_late(tmp_path, monkeypatch, capsys):
    """One config with four problems, each one line from ``grpo validate``: a function
    parameter no column feeds, a hub id while the hub does not answer (HF_ENDPOINT points at
    a port nothing listens on, so nothing leaves this machine), push_to_hub without a token,
    a group of one."""
    import socket

    from grpo_core.cli.main import main

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))  # an empty cache, no stored token
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "rw.py").write_text(
        "def correct(completions, answer, solution, **kwargs):\n    return [0.0] * len(completions)\n"
    )
    (tmp_path / "d.jsonl").write_text(json.dumps({"prompt": "1+1=", "answer": "2"}) + "\n")
    cfg = {
        "model": {"name_or_path": "someone/some-model"},
        "data": {"path": "d.jsonl", "columns": ["answer"]},
        "reward": {"name": "rw.py:correct"},
        "sampling": {"group_size": 1},
        "output": {"dir": "out", "push_to_hub": True, "hub_model_id": "someone/out"},
    }
    (tmp_path / "c.json").write_text(json.dumps(cfg))
    assert main(["validate", "c.json"]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error: ")]
    found = "\n".join(err)
    assert "reward 'rw.py:correct' (" in found and "reads ['solution']" in found, found
    assert (
        f"model.name_or_path: someone/some-model is a hub id not in the local cache, and "
        f"http://127.0.0.1:{port} does not answer" in found
    ), found
    assert "output.push_to_hub: no Hugging Face token" in found, found
    assert "sampling.group_size: 1 leaves baseline 'grpo' nothing to compare" in found, found


# --- a run started from Python: how to resume it, and its in-memory data -------------------


class _DataWatch:
    """A callback that looks at the in-memory data's file while the run holds it."""

    def __init__(self):
        self.seen = {}

    def on_train_begin(self, run_dir, config, start_step):
        path = config["data"]["path"]
        self.seen = {
            "path": path,
            "file_mode": os.stat(path).st_mode & 0o777,
            "dir_mode": os.stat(os.path.dirname(path)).st_mode & 0o777,
        }


def test_python_run_records_references_and_keeps_its_data_private(
    tiny_model, tmp_path, monkeypatch
):
    """The run's config.json names a module's function by its file, so another process (a
    resumed run) finds it, and a nested function as <python>:name, which a fresh process
    refuses in one line; the in-memory data is 0600 in a fresh 0700 directory while the run
    holds it and gone when train() returns (and when it raises)."""
    import importlib
    import subprocess
    import sys

    from helpers import make_config

    import grpo_core
    from grpo_core.hookspecs import Callback
    from grpo_core.reward.call import RewardFailure

    (tmp_path / "my_rewards.py").write_text(
        "def digits(completions, **kwargs):\n"
        "    return [float(c[:1].isdigit()) for c in completions]\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))  # as a script's folder is on its path
    digits = importlib.import_module("my_rewards").digits

    def nested(completions, answer, **kwargs):
        return [float(a in c) for c, a in zip(completions, answer)]

    watch = type("Watch", (_DataWatch, Callback), {})()
    cfg = make_config(tiny_model, "unused", str(tmp_path / "run"), train={"steps": 1})
    del cfg["data"], cfg["reward"]
    rows = [{"prompt": f"{a}+{a}=", "answer": str(2 * a)} for a in range(4)]
    grpo_core.train(cfg, rewards=[digits, nested], dataset=rows, callbacks=[watch])
    assert watch.seen["file_mode"] == 0o600 and watch.seen["dir_mode"] == 0o700
    assert os.path.dirname(watch.seen["path"]) != tempfile.gettempdir()
    assert not os.path.exists(os.path.dirname(watch.seen["path"]))
    recorded = json.loads((tmp_path / "run" / "config.json").read_text())["reward"]
    names = [c["name"] for c in recorded["options"]["components"]]
    assert names == [f"{tmp_path / 'my_rewards.py'}:digits", "<python>:nested"]
    assert [c["as"] for c in recorded["options"]["components"]] == ["digits", "nested"]

    # a fresh process (what grpo train --resume is) resolves the first, refuses the second
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    for name, expected in ((names[0], None), (names[1], "resume from Python")):
        again = make_config(tiny_model, str(data), str(tmp_path / "again"), reward={"name": name})
        path = tmp_path / "again.json"
        path.write_text(json.dumps(again))
        p = subprocess.run(
            [sys.executable, "-m", "grpo_core.cli.main", "validate", str(path)],
            capture_output=True,
            text=True,
            timeout=600,  # a hang, not a slow machine
        )
        if expected is None:
            assert p.returncode == 0, p.stderr
        else:
            errors = [ln for ln in p.stderr.splitlines() if ln.startswith("error: ")]
            assert p.returncode == 2 and len(errors) == 1 and expected in errors[0], p.stderr

    def broken(completions, **kwargs):
        raise RuntimeError("boom")

    cfg["output"]["dir"] = str(tmp_path / "crash")
    with pytest.raises(RewardFailure):
        grpo_core.train(cfg, rewards=[broken], dataset=rows, callbacks=[watch])
    assert not os.path.exists(os.path.dirname(watch.seen["path"]))  # removed on a crash too


def test_the_trl_example_runs_under_grpo_core(tmp_path):
    """examples/trl_gsm8k.py, TRL's script with its trainer line changed, trains 1 step of a
    tiny model (GSM8K rows from ../shared/data when there, else its own)."""
    import subprocess
    import sys

    from helpers import ROOT

    pytest.importorskip("math_verify", reason="TRL's accuracy_reward needs math_verify")
    out = tmp_path / "run"
    p = subprocess.run(
        [
            sys.executable,
            os.path.join(ROOT, "examples", "trl_gsm8k.py"),
            "--steps",
            "1",
            "--rows",
            "8",
            "--output-dir",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=1200,  # a hang, not a slow machine
    )
    assert p.returncode == 0, p.stderr[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 1, summary
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert {"reward/think_format_reward", "reward/accuracy_reward"} <= set(metrics[0]), metrics[0]


def test_a_run_where_functions_skip_rows_trains(tiny_model, tmp_path):
    """None from TRL-style functions in a real run: rows one function skips get the other's
    reward; rows both skip have no reward (left out) and the run still trains."""
    from helpers import make_config

    import grpo_core

    def even_only(prompts, completions, answer, **kwargs):
        return [1.0 if int(a) % 2 == 0 else None for a in answer]

    def never(completions, **kwargs):
        return [None] * len(completions)

    cfg = make_config(tiny_model, "unused", str(tmp_path / "run"), train={"steps": 1})
    del cfg["data"], cfg["reward"]
    rows = [{"prompt": f"{a}+1=", "answer": str(a + 1)} for a in range(8)]
    summary = grpo_core.train(cfg, rewards=[even_only, never], dataset=rows)
    assert summary["steps"] == 1
    record = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[0])
    assert record["reward/even_only"] == 1.0 and record["reward"] == 1.0, record
