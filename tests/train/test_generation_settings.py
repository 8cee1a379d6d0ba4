"""Generation settings (issue #23): repetition penalty, min-p, stop strings, several EOS ids,
and the model's generation_config as the default of the sampling settings a config leaves
null. Formulas against values worked out by hand; the rest on the real tiny model."""

from __future__ import annotations

import glob
import json
import math
import os
from dataclasses import replace

import pytest
import torch
from grpo_core_plugins.generators.hf import HFGenerator, eos_ids
from grpo_core_plugins.generators.vllm import settings
from helpers import ROOT, make_config, run_grpo, write_config
from transformers import AutoModelForCausalLM, AutoTokenizer

from grpo_core.config import validate
from grpo_core.config.view import Config, view
from grpo_core.rollout import SamplingParams
from grpo_core.sampling import apply_repetition_penalty, filter_logits, sample
from grpo_core.store.models import load_model, resolve_sampling

CPU = torch.device("cpu")
TEXTS = ["1+2=", "hello", "7*8=", "abc"]


def test_repetition_penalty_by_hand():
    """Seen tokens: a positive logit is divided by the penalty, a negative one multiplied;
    unseen tokens and penalty 1 leave the logits as they are."""
    z = torch.tensor([[2.0, -1.0, 0.5, -0.5], [2.0, -1.0, 0.5, -0.5]])
    seen = torch.tensor([[True, True, False, False], [False, False, True, True]])
    out = apply_repetition_penalty(z, seen, 2.0)
    assert out.tolist() == [[1.0, -2.0, 0.5, -0.5], [2.0, -1.0, 0.25, -1.0]]
    assert apply_repetition_penalty(z, seen, 1.0) is z


def test_min_p_by_hand():
    """Probabilities 0.5, 0.3, 0.15, 0.05: min_p 0.5 keeps p >= 0.25 (two tokens), min_p 0.2
    keeps p >= 0.1 (three), min_p 1 only the likeliest; the kept logits are unchanged."""
    z = torch.tensor([[0.5, 0.3, 0.15, 0.05]]).log()
    for min_p, kept in ((0.5, 2), (0.2, 3), (1.0, 1), (0.0, 4)):
        out = filter_logits(z, min_p=min_p)
        assert torch.isfinite(out).sum() == kept and torch.equal(out[0, :kept], z[0, :kept])
    # top-p first, then min-p: nucleus 0.7 keeps 0.5 and 0.3; min-p 0.7 of 0.5 drops 0.3
    assert torch.isfinite(filter_logits(z, top_p=0.7, min_p=0.7)).sum() == 1


def test_min_p_samples_only_kept_tokens_in_their_proportions():
    z = torch.tensor([0.5, 0.3, 0.15, 0.05]).log().expand(20_000, 4)
    counts = torch.bincount(sample(z, 5, torch.arange(20_000), 0, min_p=0.5), minlength=4)
    torch.testing.assert_close(
        counts / 20_000, torch.tensor([0.625, 0.375, 0.0, 0.0]), atol=0.015, rtol=0
    )


@pytest.fixture(scope="module")
def tiny(tiny_model):
    tok = AutoTokenizer.from_pretrained(tiny_model)
    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    gen = HFGenerator()
    gen.setup(model, tok, CPU)
    return gen, tok, model, [tok(t)["input_ids"] for t in TEXTS]


def _completions(ro) -> list[list[int]]:
    return [ro.completion_ids[i][ro.completion_mask[i].bool()].tolist() for i in range(ro.size)]


def test_a_huge_penalty_never_repeats_a_token(tiny):
    """Greedy decoding of the tiny model repeats one token; with a huge penalty no token of
    the prompt or of the completion so far comes again."""
    gen, tok, _, prompts = tiny
    plain = gen.generate(prompts, 1, SamplingParams(12, greedy=True))
    assert any(len(set(c)) < len(c) for c in _completions(plain))
    ro = gen.generate(prompts, 1, SamplingParams(12, greedy=True, repetition_penalty=1e6))
    for p, c in zip(prompts, _completions(ro)):
        assert len(set(c)) == len(c) and not set(c) & set(p)


def test_sampled_tokens_follow_the_penalized_filtered_distribution(tiny):
    """Each sampled token is the inverse-CDF pick, for the same (seed, row, step), from the
    penalized (prompt and completion so far), temperature-scaled, min-p filtered logits of a
    plain forward; the log-prob kept is the policy's unpenalized, unfiltered one."""
    gen, _, model, prompts = tiny
    sp = SamplingParams(6, temperature=0.8, min_p=0.3, repetition_penalty=3.0)
    ro = gen.generate(prompts[:2], 2, sp, seed=11)
    for r in range(ro.size):
        prefix = list(prompts[r // 2])
        for t, tok in enumerate(ro.completion_ids[r].tolist()):
            with torch.no_grad():
                raw = model(input_ids=torch.tensor([prefix])).logits[:, -1].float()
            seen = torch.zeros_like(raw, dtype=torch.bool)
            seen[0, prefix] = True
            z = apply_repetition_penalty(raw, seen, 3.0) / 0.8
            assert int(sample(z, 11, torch.tensor([r]), t, min_p=0.3)[0]) == tok
            lp = torch.log_softmax(raw / 0.8, -1)[0, tok]
            assert math.isclose(float(ro.logprobs[r, t]), float(lp), abs_tol=1e-5)
            prefix.append(tok)


def test_min_p_one_is_greedy(tiny):
    gen, _, _, prompts = tiny
    greedy = gen.generate(prompts, 1, SamplingParams(10, greedy=True))
    ro = gen.generate(prompts, 3, SamplingParams(10, min_p=1.0), seed=4)
    assert torch.equal(ro.completion_ids, greedy.completion_ids.repeat_interleave(3, 0))


def _stop_string(tok, completions: list[list[int]]) -> str:
    """A letter or digit the model emits, not as the first token of every completion."""
    for c in completions:
        for t in c[1:]:
            text = tok.decode([t])
            if len(text) == 1 and text.isalnum():
                return text
    raise AssertionError("no printable token sampled")


def test_stop_strings_end_a_completion_at_the_token_completing_them(tiny):
    """With a stop string, each completion is the one sampled without it, cut right after the
    first token whose text completes the stop string (that token kept, masked in, and the
    completion not truncated); completions without it are unchanged."""
    gen, tok, _, prompts = tiny
    sp = SamplingParams(16, top_k=100)
    plain = _completions(gen.generate(prompts, 3, sp, seed=2))
    stop = _stop_string(tok, plain)
    ro = gen.generate(prompts, 3, replace(sp, stop=(stop, "never emitted")), seed=2)
    cut = 0
    for i, (full, got) in enumerate(zip(plain, _completions(ro))):
        ends = [k + 1 for k in range(len(full)) if stop in tok.decode(full[: k + 1])]
        assert got == full[: ends[0]] if ends else got == full
        assert bool(ro.truncated[i]) == (not ends and len(full) == 16)
        cut += bool(ends)
    assert cut >= 1


def test_settings_keep_batch_invariance(tiny):
    """The same seed gives the same completions in one batch or in pieces, with the penalty,
    min-p, top-k and a stop string on."""
    gen, tok, _, prompts = tiny
    sp = SamplingParams(12, temperature=0.9, top_k=50, min_p=0.05, repetition_penalty=1.3)
    stop = _stop_string(tok, _completions(gen.generate(prompts, 2, sp, seed=9)))
    whole = gen.generate(prompts, 2, replace(sp, stop=(stop,)), seed=9)
    pieces = gen.generate(prompts, 2, replace(sp, stop=(stop,), batch_size=3), seed=9)
    assert _completions(whole) == _completions(pieces)
    # float32 defaults (rtol 1.3e-6, atol 1e-5): batch size changes only the matmul blocking,
    # a few ulps in log-probs of size up to ~10
    torch.testing.assert_close(whole.logprobs, pieces.logprobs)


def test_finished_rows_leaving_the_batch_change_nothing(tiny, monkeypatch):
    """Completions that have ended leave the decode batch (fewer rows per forward); the
    completions, masks and truncation flags are those of a batch that keeps them (checked
    only at the end: check_every past the budget), the log-probs equal up to rounding, with
    a stop string and the penalty on. Forty EOS ids make rows end early."""
    _, tok, model, prompts = tiny
    sp = SamplingParams(24, temperature=1.3, repetition_penalty=1.2)
    gens, rows = {}, []
    for every in (2, 100):
        gen = HFGenerator(check_every=every, cascade=False)  # the model's path (cascade's:
        # tests/train/test_cascade.py)
        gen.setup(model, tok, CPU)
        gen.eos = torch.arange(40)
        gens[every] = gen
    step = gens[2]._step
    monkeypatch.setattr(gens[2], "_step", lambda ids, *a: rows.append(len(ids)) or step(ids, *a))
    stop = _stop_string(tok, _completions(gens[100].generate(prompts, 4, sp, seed=3)))
    out = {k: g.generate(prompts, 4, replace(sp, stop=(stop,)), seed=3) for k, g in gens.items()}
    assert min(rows) < len(prompts) * 4  # rows did leave
    kept, left = out[100], out[2]
    w = left.completion_mask.shape[1]  # the batch stops once all rows end (checked earlier)
    assert _completions(kept) == _completions(left) and not kept.completion_mask[:, w:].any()
    assert torch.equal(kept.completion_mask[:, :w], left.completion_mask)
    assert torch.equal(kept.truncated, left.truncated) and not kept.truncated.all()
    # fewer rows per forward: matmul blocking only (float32 defaults, as above)
    torch.testing.assert_close(kept.logprobs[:, :w], left.logprobs)


@pytest.fixture(scope="module")
def configured_model(tiny_model, tmp_path_factory, tiny):
    """The tiny model saved with a generation_config: temperature 0.7, top_k 5, repetition
    penalty 1.3 and two EOS ids (the tokenizer's, and the first token greedy decoding gives)."""
    gen, tok, model, prompts = tiny
    first = gen.generate(prompts[:1], 1, SamplingParams(1, greedy=True)).completion_ids[0, 0]
    path = str(tmp_path_factory.mktemp("gencfg") / "model")
    model.save_pretrained(path)
    tok.save_pretrained(path)
    model.generation_config.update(
        do_sample=True,
        temperature=0.7,
        top_k=5,
        repetition_penalty=1.3,
        eos_token_id=[tok.eos_token_id, int(first)],
    )
    model.generation_config.save_pretrained(path)
    return path, int(first)


def _model_cfg(path: str, **sampling) -> Config:
    return view(validate(make_config(path, "unused.jsonl", "unused", sampling=sampling)))


def test_generation_config_fills_what_the_config_leaves_null(configured_model, capsys):
    path, _ = configured_model
    cfg = _model_cfg(path, top_k=0)
    model = load_model(cfg.model, CPU)
    sc = resolve_sampling(model, cfg.sampling, announce=True)
    assert (sc.temperature, sc.top_p, sc.top_k, sc.min_p, sc.repetition_penalty) == (
        0.7,
        1.0,
        0,
        0.0,
        1.3,
    )  # top_k: the config's 0 wins
    err = capsys.readouterr().err.strip().splitlines()
    assert (
        len(err) == 1
        and err[0].startswith("note:")
        and "temperature=0.7" in err[0]
        and "repetition_penalty=1.3" in err[0]
        and "top_k" not in err[0]
    )
    sp = SamplingParams.from_config(sc)
    assert (sp.temperature, sp.repetition_penalty, sp.stop) == (0.7, 1.3, ())


def test_a_model_without_sampling_defaults_gets_neutral_values_silently(tiny_model, capsys):
    cfg = _model_cfg(tiny_model, stop=["\n"])
    sc = resolve_sampling(load_model(cfg.model, CPU), cfg.sampling, announce=True)
    assert SamplingParams.from_config(sc) == SamplingParams(4, stop=("\n",))
    assert capsys.readouterr().err == ""


def test_every_eos_id_of_the_generation_config_ends_a_completion(configured_model):
    path, first = configured_model
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path)
    assert eos_ids(model, tok) == sorted({tok.eos_token_id, first})
    gen = HFGenerator()
    gen.setup(model, tok, CPU)
    ro = gen.generate([tok(TEXTS[0])["input_ids"]], 1, SamplingParams(8, greedy=True))
    assert ro.completion_mask.sum() == 1 and not bool(ro.truncated[0])


def test_vllm_gets_the_same_settings():
    sp = SamplingParams(8, temperature=0.7, top_k=0, min_p=0.1, repetition_penalty=1.2)
    assert settings(sp, ("</a>",)) == dict(
        temperature=0.7,
        top_p=1.0,
        top_k=-1,
        min_p=0.1,
        repetition_penalty=1.2,
        stop=["</a>"],
        include_stop_str_in_output=True,
    )
    assert settings(replace(sp, greedy=True, top_k=5), ())["temperature"] == 0.0
    assert settings(replace(sp, top_k=5), ())["top_k"] == 5
    assert settings(sp, ())["stop"] is None


def test_a_run_with_model_defaults_writes_them_and_resumes(
    configured_model, addition_data, tmp_path
):
    """config.json keeps the nulls as written, checkpoints hold the resolved values, and the
    run resumes from its own checkpoint (and from one written before min_p existed)."""
    path, _ = configured_model
    out = str(tmp_path / "run")
    cfg = make_config(
        path,
        addition_data,
        out,
        train={"steps": 2, "prompts_per_step": 2, "micro_batch_groups": 1, "seed": 0},
        sampling={"group_size": 2, "max_new_tokens": 3, "stop": ["="]},
        output={"dir": out, "progress": False, "checkpoint_every": 1},
    )
    p = run_grpo("train", write_config(tmp_path / "c.json", cfg), cwd=ROOT)
    assert p.returncode == 0, p.stderr
    assert sum(line.startswith("note:") for line in p.stderr.splitlines()) == 1
    written = json.load(open(os.path.join(out, "config.json")))
    assert written["sampling"]["temperature"] is None
    meta = glob.glob(os.path.join(out, "checkpoints", "*", "state.json"))
    held = [json.load(open(m)).get("config", {}).get("sampling") for m in meta]
    assert {"temperature": 0.7, "top_k": 5, "repetition_penalty": 1.3}.items() <= next(
        h for h in held if h
    ).items()
    for m in meta:  # as a checkpoint written before min_p existed: it read as 0.0 there
        state = json.load(open(m))
        del state["config"]["sampling"]["min_p"]
        json.dump(state, open(m, "w"))
    cfg["train"]["steps"] = 3
    p = run_grpo("train", write_config(tmp_path / "c.json", cfg), "--resume", cwd=ROOT)
    assert p.returncode == 0, p.stderr
    steps = [json.loads(x)["step"] for x in open(os.path.join(out, "metrics.jsonl"))]
    assert steps == [0, 1, 2]


def test_an_episode_turn_samples_as_generate_does(tiny):
    """The multi-turn sampler applies the same settings: a first turn with no environment
    tokens gives the completions ``generate`` gives for the same seed."""
    gen, tok, _, prompts = tiny
    sp = SamplingParams(10, temperature=0.9, min_p=0.05, repetition_penalty=2.0)
    stop = _stop_string(tok, _completions(gen.generate(prompts, 2, sp, seed=6)))
    ro = gen.generate(prompts, 2, replace(sp, stop=(stop,)), seed=6)
    sampler = gen.start_episodes(prompts, 2, sp, seed=6)
    try:
        turns = sampler.turn(
            list(range(ro.size)), [[] for _ in range(ro.size)], [10] * ro.size, (stop,)
        )
    finally:
        sampler.close()
    assert [t.ids for t in turns] == _completions(ro)
    assert [t.finish != "length" for t in turns] == (~ro.truncated).tolist()
