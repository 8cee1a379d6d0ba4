"""Data as users have it: saved datasets, configuration names, data_files, sliced splits,
streaming with exact resume, fields renamed for rewards, the long-prompt count."""

from __future__ import annotations

import json
import os
import types

import pytest
import torch
from helpers import make_config, write_config
from safetensors.torch import load_file

from grpo_core import config, preflight
from grpo_core.cli.main import main
from grpo_core.data.prompts import StreamedPrompts, column_map, column_problems
from grpo_core.data.sources import Source, open_stream, read_rows
from grpo_core.errors import ConfigError, UserError
from grpo_core.hookspecs import hookimpl
from grpo_core.registry import registry
from grpo_core.trainer import train

datasets = pytest.importorskip("datasets")


@pytest.fixture(autouse=True)
def offline(monkeypatch, tmp_path):
    """Nothing here may reach the network; datasets' cache stays in the test's directory."""
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf-cache"))


def sums(n: int, start: int = 0, gold: str = "solution") -> list[dict]:
    return [{"question": f"{a}+{a % 7}=", gold: str(a + a % 7)} for a in range(start, start + n)]


def write_jsonl(path, rows) -> str:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    return str(path)


def configured_dataset(root) -> str:
    """A local dataset directory with two configurations (as openai/gsm8k has main and
    socratic), declared in its README the way hub datasets declare them."""
    write_jsonl(root / "main" / "train.jsonl", sums(12))
    write_jsonl(root / "main" / "test.jsonl", sums(4, 100))
    write_jsonl(root / "socratic" / "train.jsonl", sums(6, 50, gold="final_answer"))
    (root / "README.md").write_text(
        "---\nconfigs:\n"
        "- config_name: main\n  data_files:\n"
        "  - {split: train, path: main/train.jsonl}\n  - {split: test, path: main/test.jsonl}\n"
        "- config_name: socratic\n  data_files:\n"
        "  - {split: train, path: socratic/train.jsonl}\n---\n"
    )
    return str(root)


def test_a_dataset_with_a_configuration_name(tmp_path):
    path = configured_dataset(tmp_path / "ds")
    rows = read_rows(path, "train", name="socratic")
    assert [r["question"] for r in rows] == [r["question"] for r in sums(6, 50)]
    assert len(read_rows(path, "test[:2]", name="main")) == 2
    with pytest.raises(
        UserError,
        match=r"^data.path: cannot load dataset .* split 'train': "
        r"Config name is missing.*set data.name$",
    ):
        read_rows(path, "train")
    with pytest.raises(UserError, match=r"configuration 'nope'.*'main', 'socratic'"):
        read_rows(path, "train", name="nope")


def test_a_saved_dataset_directory(tmp_path):
    dd = datasets.DatasetDict(
        {
            "train": datasets.Dataset.from_list(sums(10)),
            "test": datasets.Dataset.from_list(sums(3, 200)),
        }
    )
    dd.save_to_disk(str(tmp_path / "dict"))
    datasets.Dataset.from_list(sums(5)).save_to_disk(str(tmp_path / "one"))
    assert read_rows(str(tmp_path / "dict"), "train") == sums(10)
    assert read_rows(str(tmp_path / "dict"), "test") == sums(3, 200)
    assert read_rows(str(tmp_path / "dict"), "train[2:4]") == sums(10)[2:4]
    assert read_rows(str(tmp_path / "dict"), "train[:20%]") == sums(10)[:2]
    assert read_rows(str(tmp_path / "one"), "train[-2:]") == sums(5)[3:]
    with pytest.raises(
        UserError,
        match=r"^data.split: .* has no split 'validation' \(has "
        r"\['test', 'train'\]\)$",
    ):
        read_rows(str(tmp_path / "dict"), "validation")


def test_data_files_and_sliced_files(tmp_path):
    a = write_jsonl(tmp_path / "a.jsonl", sums(8))
    b = write_jsonl(tmp_path / "b.jsonl", sums(4, 30))
    assert read_rows("json", "train", data_files=[a, b]) == sums(8) + sums(4, 30)
    assert read_rows("json", "test", data_files={"train": a, "test": b}) == sums(4, 30)
    assert read_rows(a, "train[:3]") == sums(8)[:3]
    assert read_rows(a, "train[-2:]") == sums(8)[6:]
    assert read_rows(a, "train[25%:50%]") == sums(8)[2:4]
    with pytest.raises(UserError, match=r"^data.split: 'train\[::2\]' is not a split name"):
        read_rows(a, "train[::2]")


def test_preflight_accepts_the_new_forms_and_checks_the_mapping(tmp_path, monkeypatch):
    path = configured_dataset(tmp_path / "ds")
    datasets.Dataset.from_list(sums(5)).save_to_disk(str(tmp_path / "saved"))
    monkeypatch.setattr(preflight, "_model", lambda *a: [])  # no model in these configs

    def problems(**data):
        cfg = config.validate(make_config("m", "x", str(tmp_path / "run"), data=data))
        try:
            preflight.check(cfg)
        except ConfigError as exc:
            return exc.problems
        return []

    ok = {"prompt_field": "question", "columns": {"final_answer": "answer"}}
    assert problems(path=path, name="socratic", **ok) == []
    assert problems(path=path, name="socratic", streaming=True, **ok) == []
    assert (
        problems(
            path=str(tmp_path / "saved"), prompt_field="question", columns={"solution": "answer"}
        )
        == []
    )
    # the hub form is accepted; offline (as here), only when the local cache has it
    assert problems(path="openai/gsm8k", name="main", prompt_field="question") in (
        [],
        [
            "data.path: openai/gsm8k is a hub id that is not in the local Hugging Face cache, and "
            "HF_HUB_OFFLINE is set; download it first or give a local directory"
        ],
    )
    # the math reward reads `answer`: a list without it, or a mapping to another name, fails
    for cols in (["final_answer"], {"final_answer": "gold"}):
        found = problems(path=path, name="socratic", prompt_field="question", columns=cols)
        assert found == [
            "data.columns: the reward reads ['answer']; add them to data.columns (a "
            "field of that name, or {field: answer} to pass another field under "
            "that name)"
        ], found
    found = problems(
        path=path,
        name="socratic",
        prompt_field="question",
        columns={"question": "answer"},
        split="train[:2]",
    )
    assert found == [], found  # any field may be passed under the reward's name
    found = problems(
        path=path, name="main", prompt_field="question", columns={"final_answer": "answer"}
    )
    assert len(found) == 1 and "has no field 'final_answer'" in found[0], found


def test_column_mapping_rules():
    def data(columns):
        return config.section("data", {"path": "d.jsonl", "columns": columns})

    assert column_map(data(["answer"])) == {"answer": "answer"}
    assert column_map(data({"solution": "answer"})) == {"solution": "answer"}
    assert column_problems(data({"solution": "answer", "final": "answer"})) == [
        "data.columns: several fields are passed as ['answer']; a reward argument takes one field"
    ]
    assert "reserved names" in column_problems(data({"n": "group_ids"}))[0]


def stream_of(path: str, seed: int | None, drop=lambda row: False) -> StreamedPrompts:
    ds = open_stream(Source(path, "train"), seed, buffer=4)

    def epoch(e):
        ds.set_epoch(e)
        return ds

    return StreamedPrompts(
        epoch,
        lambda row, i: (None if drop(row) else row, drop(row)),
        ["question", "solution"],
        path,
    )


def test_a_streamed_source_resumes_exactly_across_epochs(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", sums(10))
    drop = lambda row: row["question"].startswith("3+")  # noqa: E731  one long prompt, dropped
    whole = stream_of(path, seed=5, drop=drop)
    served = [r["question"] for _ in range(7) for r in whole.take(4)]  # 28 rows: 3+ epochs
    epochs = [served[i : i + 9] for i in range(0, 27, 9)]
    assert all(
        sorted(e) == sorted(r["question"] for r in sums(10) if not drop(r)) for e in epochs
    )  # every kept row once per epoch
    assert epochs[0] != epochs[1]  # each epoch in its own order
    assert whole.long_prompts == 1  # counted once, not once per epoch
    for cut in (1, 2, 3, 5):  # resume from a checkpoint taken after `cut` takes
        first = stream_of(path, seed=5, drop=drop)
        before = [r["question"] for _ in range(cut) for r in first.take(4)]
        state = json.loads(json.dumps(first.state_dict()))  # as a checkpoint stores it
        again = stream_of(path, seed=5, drop=drop)
        again.load_state_dict(state)
        after = [r["question"] for _ in range(7 - cut) for r in again.take(4)]
        assert before + after == served, cut
        assert again.long_prompts == 1


def test_a_streamed_slice_and_its_errors(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", sums(10))
    assert list(open_stream(Source(path, "train[2:5]"), None)) == sums(10)[2:5]
    with pytest.raises(UserError, match=r"a streamed split takes row ranges like train\[:1000\]"):
        open_stream(Source(path, "train[:10%]"), None)
    write_jsonl(tmp_path / "e.jsonl", [{"question": "1+1="}])
    s = stream_of(str(tmp_path / "e.jsonl"), None)
    with pytest.raises(UserError, match=r"row 0 has no field 'solution'"):
        s.take(1)
    every = stream_of(path, None, drop=lambda row: True)
    with pytest.raises(UserError, match="every prompt of .* is over the prompt limit"):
        every.take(1)


def weights(run_dir: str) -> dict:
    return load_file(os.path.join(run_dir, "final", "model.safetensors"))


def test_streamed_training_from_a_configured_dataset_resumes_bitwise(tiny_model, tmp_path):
    """The real loop: a dataset with a configuration name, streamed, gold under another
    name; interrupted after 2 of 4 steps and resumed, it ends bitwise where an uninterrupted
    run ends. Long prompts are dropped and counted in every metrics record."""
    path = configured_dataset(tmp_path / "ds")
    data = {
        "path": path,
        "name": "main",
        "streaming": True,
        "shuffle_buffer": 5,
        "prompt_field": "question",
        "columns": {"solution": "answer"},
        "max_prompt_tokens": 4,
    }  # drops "10+3=" and "11+4=": one token per character

    def cfg(out, steps, ckpt=0):
        return config.validate(
            make_config(
                tiny_model,
                "x",
                str(out),
                data=data,
                sampling={"group_size": 2, "max_new_tokens": 3},
                train={"steps": steps, "prompts_per_step": 4, "micro_batch_groups": 2, "seed": 1},
                runtime={"device": "cpu", "threads": 1},
                output={
                    "dir": str(out),
                    "progress": False,
                    "samples_every": 0,
                    "checkpoint_every": ckpt,
                    "tensorboard": "off",
                },
            )
        )

    train(cfg(tmp_path / "whole", 4))
    train(cfg(tmp_path / "cut", 2, ckpt=1))
    train(cfg(tmp_path / "cut", 4, ckpt=1), resume=True)
    a, b = weights(str(tmp_path / "whole")), weights(str(tmp_path / "cut"))
    assert all(torch.equal(a[k], b[k]) for k in a)
    rows = [json.loads(x) for x in open(tmp_path / "cut" / "metrics.jsonl")]
    whole = [json.loads(x) for x in open(tmp_path / "whole" / "metrics.jsonl")]
    assert [r["reward"] for r in rows] == [r["reward"] for r in whole]
    long = [r["data/long_prompts"] for r in whole]  # as met: 10+3= and 11+4=, once each
    assert long == sorted(long) and long[2:] == [2, 2], long  # epoch 0 read by step 2's end
    assert rows[-1]["data/long_prompts"] == 2  # restored from the checkpoint
    state = json.load(open(tmp_path / "cut" / "checkpoints" / "step-00000004" / "state.json"))
    assert state["data"] == {
        "position": state["data_position"],
        "long_prompts": 2,
        "epoch_rows": 12,
    }


def gold_check(prompts, completions, answer, **columns):
    """1 when the reward got the gold of its own prompt under the name ``answer``."""
    return [
        float(int(p[:-1].split("+")[0]) + int(p[:-1].split("+")[1]) == int(a))
        for p, a in zip(prompts, answer)
    ]


def test_training_from_a_saved_dataset_with_renamed_gold(tiny_model, tmp_path, capsys):
    """load_from_disk + a sliced split + {solution: answer}: the reward gets each prompt's
    gold under the name it reads."""
    module = types.ModuleType("gold_check_reward_for_tests")
    module.reward = hookimpl(
        lambda register: register("gold_check", lambda: gold_check), specname="reward"
    )
    registry().add(module, "test-gold-check")
    dd = datasets.DatasetDict({"train": datasets.Dataset.from_list(sums(30))})
    dd.save_to_disk(str(tmp_path / "saved"))
    out = tmp_path / "run"
    cfg = make_config(
        tiny_model,
        str(tmp_path / "saved"),
        str(out),
        data={
            "path": str(tmp_path / "saved"),
            "split": "train[:8]",
            "prompt_field": "question",
            "columns": {"solution": "answer"},
        },
        reward={"name": "gold_check", "isolation": "inline"},
        train={"steps": 2, "prompts_per_step": 2, "seed": 0},
        output={"dir": str(out), "progress": False, "samples_every": 1, "tensorboard": "off"},
    )
    assert main(["train", write_config(tmp_path / "c.json", cfg)]) == 0, capsys.readouterr().err
    assert [json.loads(x)["reward"] for x in open(out / "metrics.jsonl")] == [1.0, 1.0]
    prompts = {json.loads(x)["prompt"] for x in open(out / "samples.jsonl")}
    assert prompts <= {r["question"] for r in sums(8)}  # the slice, nothing past it


def test_a_checkpoint_written_before_these_keys_still_resumes(tmp_path):
    """A checkpoint's stored config lacks keys added since; they read as their defaults, so
    resuming is not refused for a difference nobody made."""
    from grpo_core.store import checkpoint

    cfg = config.validate(make_config("m", "d.jsonl", str(tmp_path)))
    saved = json.loads(json.dumps(cfg))
    for section, key in (
        ("data", "name"),
        ("data", "data_files"),
        ("data", "streaming"),
        ("data", "shuffle_buffer"),
        ("optimizer", "scheduler_options"),
        ("output", "loggers"),
        ("output", "metric_names"),
    ):
        del saved[section][key]
    assert checkpoint.config_differences({"config": saved}, cfg) == []
    saved["data"]["split"] = "test"
    assert checkpoint.config_differences({"config": saved}, cfg) == [
        "data.split: checkpoint 'test', config 'train'"
    ]


@pytest.mark.parametrize(
    "builder,files,needles",
    [
        ("json", {"sub*": None}, ["'sub*' matches only directories", "expected files"]),
        ("json", {"empty.json": ""}, ["expected json rows, found none", "empty.json"]),
        ("json", {"t.json": "a,b\n1,2\n"}, ["expected json data, found files", "parse"]),
        ("parquet", {"t.parquet": "a,b\n"}, ["expected parquet data, found files", "Parquet"]),
    ],
)
def test_a_dataset_library_failure_is_explained(tmp_path, monkeypatch, builder, files, needles):
    """Each of these surfaced a library's internal exception (StopIteration, ArrowInvalid
    inside DatasetGenerationError) as the whole reason."""
    monkeypatch.chdir(tmp_path)
    for name, text in files.items():
        if text is None:
            (tmp_path / name.rstrip("*")).mkdir()
            (tmp_path / name.rstrip("*") / "rows.jsonl").write_text('{"prompt": "1+1="}\n')
        else:
            (tmp_path / name).write_text(text)
    with pytest.raises(UserError) as info:
        read_rows(builder, data_files=next(iter(files)))
    text = str(info.value)
    assert "\n" not in text and "StopIteration" not in text, text
    for needle in needles:
        assert needle in text, text
