"""Multi-turn episodes on the tiny real model: log-probs, masks, budgets, failures, chat
templates, and the built-in environments."""

from __future__ import annotations

import dataclasses
import math
import string
import threading
import time
import types

import pytest
import torch
from helpers import make_config, run_grpo, write_config

import grpo_core
from grpo_core import config
from grpo_core.config.view import EnvironmentSection, RewardSection
from grpo_core.data.prompts import make_batch
from grpo_core.env.episodes import EpisodeRunner, episode_metrics
from grpo_core.env.observations import EnvironmentFailure, Renderer
from grpo_core.hookspecs import Environment, Observation, hookimpl
from grpo_core.loss.groups import micro_batches
from grpo_core.loss.losses import Normaliser, objective_loss
from grpo_core.model.logprobs import completion_logprobs
from grpo_core.registry import registry
from grpo_core.reward.call import score_rollout
from grpo_core.rollout import Rollout, SamplingParams, merge

ROWS = [
    {"prompt": "12+34=", "answer": "46"},
    {"prompt": "5+7=", "answer": "12"},
    {"prompt": "100+1=", "answer": "101"},
]
DATA = config.section(
    "data",
    {
        "path": "unused.jsonl",
        "prompt_field": "prompt",
        "columns": ["answer"],
        "chat_template": "auto",
        "system_prompt": None,
    },
)
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|endoftext|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
NO_TOOL_ROLE = (
    "{% for m in messages %}{% if m.role == 'tool' %}"
    "{{ raise_exception('no tool role') }}{% endif %}{{ m.role }}: {{ m.content }}\n"
    "{% endfor %}{% if add_generation_prompt %}assistant: {% endif %}"
)


class Script(Environment):
    """Episode k (in reset order) lasts ``turns[k % len(turns)]`` model turns; observations
    of different lengths; forty letters end a turn, so stop strings and budgets both end
    many turns (trajectories of a batch finish their turns at different steps)."""

    stop_strings = tuple(string.ascii_letters[:40])
    delimiters = ("<o>", "</o>")

    def __init__(
        self, turns=(1, 2, 3), fail_on: int | None = None, hang: float = 0.0, long: int = 0
    ):
        self.turns, self.fail_on, self.hang, self.long, self.count = turns, fail_on, hang, long, 0
        self.release = threading.Event()
        self.returned = 0  # hung steps that came back (released, or past ``hang``)

    def reset(self, row):
        self.count += 1
        return {"k": self.count, "left": self.turns[(self.count - 1) % len(self.turns)]}

    def step(self, state, text):
        if self.fail_on is not None and state["k"] % 4 == self.fail_on:
            if self.hang:
                self.release.wait(self.hang)
                self.returned += 1
            else:
                raise ValueError("boom")
        state["left"] -= 1
        if state["left"] <= 0:
            return Observation("bye", done=True)
        return Observation(
            "r" * (self.long or 1 + state["k"] % 5), tool_call=True, tool_error=state["k"] % 2 == 0
        )


def reward_section(name: str) -> RewardSection:
    """A reward section built directly (its name need not be a registered plugin)."""
    return RewardSection(name, {}, "raise", None, "inline", None, None)


def environment_section(**kw) -> EnvironmentSection:
    # built directly: "script" is this file's environment class, not a registered plugin
    return EnvironmentSection(
        **{
            "name": "script",
            "options": {},
            "max_turns": 4,
            "max_total_tokens": 64,
            "timeout": 5.0,
            "failure": "raise",
            **kw,
        }
    )


def setup(model_path, env, dtype=torch.float32, template=None, **ec):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_path)
    if template:
        tok.chat_template = template
    model = AutoModelForCausalLM.from_pretrained(model_path).to(dtype)
    gen = grpo_core.create("generator", "hf")
    gen.setup(model, tok, torch.device("cpu"))
    runner = EpisodeRunner(env, gen, tok, environment_section(**ec), DATA)
    return model, tok, gen, runner


def sample(runner, tok, n=4, max_new_tokens=6, temperature=1.0, seed=1, batch_size=None, rows=ROWS):
    batch = make_batch(rows, DATA, tok)
    return runner.sample(
        batch,
        rows,
        n,
        SamplingParams(max_new_tokens, temperature, batch_size=batch_size),
        seed=seed,
    )


def record_turns(gen) -> list:
    """Wrap the generator so every turn's raw output (float64 log-probs) is kept."""
    seen, start = [], gen.start_episodes

    def start_episodes(*a, **k):
        sampler = start(*a, **k)
        inner = sampler.turn

        def turn(rows, context, budgets, stop):
            out = inner(rows, context, budgets, stop)
            seen.append((list(rows), out))
            return out

        sampler.turn = turn
        return sampler

    gen.start_episodes = start_episodes
    return seen


def test_model_logprobs_equal_one_forward_over_the_trajectory_in_float64(tiny_model):
    model, tok, gen, runner = setup(tiny_model, Script(), torch.float64)
    turns = record_turns(gen)
    ro, tr = sample(runner, tok, temperature=0.7)
    finishes = {t.finish for _, out in turns for t in out}
    assert finishes >= {"stop", "length"}, finishes  # turns end in more than one way
    lengths = [len(t.ids) for _, out in turns for t in out]
    assert len(set(lengths)) >= 4, lengths  # ... after different numbers of tokens
    assert len({t.turns for t in tr}) == 3 and len(set(ro.completion_mask.sum(-1).tolist())) > 1
    full, _ = completion_logprobs(model, ro, 0.7, 16)
    per_row = {}
    for rows, out in turns:
        for r, t in zip(rows, out):
            per_row.setdefault(r, []).extend(t.logprobs)
    for r, lps in per_row.items():
        model_pos = ro.action_mask[r].bool()
        assert int(model_pos.sum()) == len(lps)
        torch.testing.assert_close(
            full[r][model_pos], torch.tensor(lps, dtype=torch.float64), rtol=0, atol=1e-12
        )
    # the rollout keeps them in float32, like single-turn rollouts (rounding to float32 of
    # values up to ~10: <= 5e-7); 0 off the model's tokens
    torch.testing.assert_close(
        ro.logprobs[ro.action_mask.bool()], full[ro.action_mask.bool()].float(), rtol=0, atol=1e-6
    )
    assert bool((ro.logprobs[ro.action_mask == 0] == 0).all())


def test_environment_tokens_get_zero_gradient_kl_and_entropy(tiny_model):
    model, tok, gen, runner = setup(tiny_model, Script())
    ro, _ = sample(runner, tok)
    env_pos = (ro.completion_mask == 1) & (ro.action_mask == 0)
    assert int(env_pos.sum()) > 10
    mask = ro.action_mask.float()  # what phases.targets / update use
    logp, ent = completion_logprobs(model, ro, 1.0, 16, entropy=True)
    logp.retain_grad()
    ent.retain_grad()
    ref = logp.detach() - 0.3

    def loss_of(ref_logp):
        term = grpo_core.create("objective", "grpo")(
            logp, ro.logprobs, torch.linspace(-1, 1, ro.size), mask
        )
        return objective_loss(
            term,
            mask,
            "token_mean",
            Normaliser.of(mask, 64),
            logp=logp,
            ref_logp=ref_logp,
            kl_coef=0.1,
            entropy=ent,
            entropy_coef=0.01,
        )

    loss, stats = loss_of(ref)
    loss.backward()
    assert bool((logp.grad[env_pos] == 0).all()) and bool((ent.grad[env_pos] == 0).all())
    assert bool((logp.grad[ro.action_mask.bool()] != 0).all())
    # KL and entropy: whatever the reference says on environment tokens changes nothing
    moved, stats_moved = loss_of(torch.where(env_pos, ref + 5.0, ref))
    assert torch.equal(loss.detach(), moved.detach()) and stats == stats_moved
    assert stats["entropy"] == pytest.approx(
        float(ent.detach()[ro.action_mask.bool()].sum()), rel=1e-6
    )
    assert stats["tokens"] == float(ro.action_mask.sum())


def test_episodes_of_different_lengths_and_their_masks(tiny_model):
    _, tok, _, runner = setup(tiny_model, Script(turns=(1, 3)))
    ro, tr = sample(runner, tok, n=4)
    assert [t.turns for t in tr[:4]] == [1, 3, 1, 3]
    for b, t in enumerate(tr):
        ids, act = ro.completion_ids[b], ro.action_mask[b]
        n = int(ro.completion_mask[b].sum())
        assert t.model_tokens + t.env_tokens == n and int(act.sum()) == t.model_tokens
        # environment stretches are exactly the delimited observations, in order
        env_texts = [m["content"] for m in t.messages[:-1] if m["role"] == "tool"]
        stretches, cur = [], []
        for i in range(n):
            if act[i] == 0:
                cur.append(int(ids[i]))
            elif cur:
                stretches.append(cur)
                cur = []
        assert [tok.decode(s) for s in stretches] == [f"<o>{x}</o>" for x in env_texts]
        assert t.cut is None and t.messages[-1] == {
            "role": "tool",
            "content": "bye",
            "tool_call": False,
            "tool_error": False,
        }
    m = episode_metrics(tr, 0.0, torch.device("cpu"))
    assert m["env/turns"] == 2.0 and m["env/tool_calls"] == 1.0
    assert m["env/model_tokens"] + m["env/env_tokens"] == pytest.approx(
        float(ro.completion_mask.sum()) / 12
    )


def test_trajectories_do_not_depend_on_how_the_batch_is_split(tiny_model):
    _, tok, _, runner = setup(tiny_model, Script(turns=(2,)), torch.float64)
    whole, _ = sample(runner, tok, seed=7)
    runner.env.count = 0  # the script numbers its episodes
    parts, _ = sample(runner, tok, seed=7, batch_size=4)  # one prompt per chunk
    assert torch.equal(whole.completion_ids, parts.completion_ids)
    assert torch.equal(whole.action_mask, parts.action_mask)


def test_budget_and_max_turns_cut_episodes(tiny_model):
    _, tok, _, runner = setup(tiny_model, Script(turns=(9,), long=40), max_total_tokens=40)
    ro, tr = sample(runner, tok)
    assert all(t.cut == "tokens" for t in tr) and bool(ro.truncated.all())
    assert int(ro.completion_mask.sum(-1).max()) <= 40
    assert all(m["role"] != "tool" for t in tr for m in t.messages)  # never entered the context
    assert episode_metrics(tr, 0.0, torch.device("cpu"))["env/cut_budget_frac"] == 1.0
    _, tok, _, runner = setup(tiny_model, Script(turns=(9,)), max_turns=2)
    ro, tr = sample(runner, tok)
    assert all(t.cut == "turns" and t.turns == 2 for t in tr) and bool(ro.truncated.all())


def test_an_environment_that_raises_follows_the_failure_policy(tiny_model):
    _, tok, _, runner = setup(tiny_model, Script(fail_on=1))
    with pytest.raises(
        EnvironmentFailure,
        match=r"environment 'script' step ValueError: boom "
        r"\(environment.failure: raise\)",
    ):
        sample(runner, tok)
    for policy in ("end", "drop"):
        _, tok, _, runner = setup(tiny_model, Script(fail_on=1), failure=policy)
        ro, tr = sample(runner, tok)
        failed = [t.cut == "failed" for t in tr]
        assert failed == [(k + 1) % 4 == 1 for k in range(len(tr))]
        assert "ValueError: boom" in runner.problem
        reward = grpo_core.create("reward", "math")
        scored = score_rollout(
            reward,
            reward_section("math"),
            tok,
            make_batch(ROWS, DATA, tok),
            ro,
            tr,
        )
        dropped = [math.isnan(v) for v in scored.rewards.tolist()]
        assert dropped == [f and policy == "drop" for f in failed]


def test_a_hung_environment_is_bounded_by_the_timeout(tiny_model):
    env = Script(fail_on=2, hang=600.0)  # stuck until released (ten minutes: a hang guard)
    _, tok, _, runner = setup(tiny_model, env, timeout=0.3, failure="end")
    try:
        _, tr = sample(runner, tok, n=2)
        assert env.returned == 0  # sampling ended while every hung step was still stuck
    finally:
        env.release.set()  # let the abandoned threads finish
    assert [t.cut == "failed" for t in tr] == [k % 4 == 2 for k in range(1, 7)]  # they hang
    assert "did not return within 0.3 s (environment.timeout)" in runner.problem


def test_chat_template_turns_are_messages_in_the_tool_role(tiny_model):
    _, tok, _, runner = setup(tiny_model, Script(turns=(2,)), template=CHATML)
    r = runner.renderer
    assert r.chat and r.role == "tool"
    eos = tok.eos_token_id
    assert (
        tok.decode(r.tokens("5", eos)) == "\n<|im_start|>tool\n5<|endoftext|>\n"
        "<|im_start|>assistant\n"
    )
    assert tok.decode(r.tokens("5", None)).startswith("<|endoftext|>\n<|im_start|>tool\n5")
    ro, tr = sample(runner, tok, n=2)
    assert [m["role"] for m in tr[0].messages] == ["user", "assistant", "tool", "assistant", "tool"]
    env_text = tok.decode(
        ro.completion_ids[0][(ro.action_mask[0] == 0) & (ro.completion_mask[0] == 1)]
    )
    assert "<|im_start|>tool\nr" in env_text and env_text.endswith("<|im_start|>assistant\n")
    # a template without a tool role: observations come as the user's
    _, tok, _, runner = setup(tiny_model, Script(), template=NO_TOOL_ROLE)
    assert runner.renderer.role == "user"
    assert tok.decode(runner.renderer.tokens("5", None)) == "\nuser: 5\nassistant: "
    # no chat template: the environment's delimiters
    assert Renderer(tok, Script(), "never").tokens("5", None) == tok("<o>5</o>")["input_ids"]


def test_rewards_get_the_final_turn_and_the_trajectory(tiny_model):
    _, tok, _, runner = setup(tiny_model, Script(turns=(2,)))
    ro, tr = sample(runner, tok, n=2)
    seen = {}

    def spy(prompts, completions, **columns):
        seen.update(columns, completions=completions)
        return [0.0] * len(completions)

    score_rollout(
        grpo_core.FunctionReward(spy),
        reward_section("spy"),
        tok,
        make_batch(ROWS, DATA, tok),
        ro,
        tr,
    )
    assert seen["completions"] == [t.final for t in tr]
    assert seen["completions"][0] == tr[0].messages[-2]["content"]  # the last assistant turn
    assert seen["messages"] == [t.messages for t in tr]
    assert seen["completion_tokens"] == [t.model_tokens for t in tr]


def test_single_turn_rollouts_are_all_model_tokens():
    ids = torch.tensor([[5, 6, 0]])
    mask = torch.tensor([[1, 1, 0]])
    ro = Rollout(ids, mask, ids, mask, torch.zeros(1, 3), torch.tensor([False]), torch.tensor([0]))
    assert ro.action_mask is ro.completion_mask
    both = merge(ro, ro.rows(torch.tensor([0])))
    assert torch.equal(both.action_mask, both.completion_mask)


def test_calculator_uses_the_safe_parser_and_reports_errors():
    calc = grpo_core.create("environment", "calculator")
    assert calc.stop_strings == ("</calc>",)
    step = calc.step(calc.reset({}), "let me see <calc>347 + 512</calc>")
    assert step == Observation("859", tool_call=True)
    assert calc.step(None, "<calc>1/4</calc>").text == "0.25"
    assert calc.step(None, "<calc>2^0.5</calc>").text == "1.41421356237"
    for bad in ("__import__('os').system('true')", "1/0", "x+1", "9" * 500, "(" * 300 + "1"):
        out = calc.step(None, f"<calc>{bad}</calc>")
        assert out.tool_error and out.text.startswith("error: ") and not out.done, bad
    assert calc.step(None, "<calc>1+").tool_error
    assert calc.step(None, "the answer is 859") == Observation(done=True)


def test_guess_number_gives_feedback_until_right():
    game = grpo_core.create("environment", "guess_number", {"target_column": "secret"})
    state = game.reset({"secret": "42"})
    assert [game.step(state, t).text for t in ("50", "I say 10", "hmm")] == [
        "lower",
        "higher",
        "say a number from 1 to 100",
    ]
    assert game.step(state, "42") == Observation("correct", done=True)
    assert type(game).columns_for({"target_column": "secret"}) == ("secret",)


def script_plugin() -> None:
    module = types.ModuleType("script_env_for_tests")

    @hookimpl
    def environment(register):
        register("script", lambda: Script(turns=(1, 2, 3)), schema={"type": "object"})

    module.environment = environment
    registry().add(module, "test-script-env")


def test_training_masks_environment_tokens_and_logs_episodes(tiny_model, addition_data, tmp_path):
    from grpo_core import phases
    from grpo_core.run import finish, start

    script_plugin()
    cfg = config.validate(
        make_config(
            tiny_model,
            addition_data,
            str(tmp_path / "run"),
            environment=dataclasses.asdict(environment_section()),
            sampling={"group_size": 4, "max_new_tokens": 6},
            reward={"name": "format", "options": {"tags": [], "patterns": ["[0-9]"]}},
            kl={"name": "fixed", "options": {"coef": 0.1}},
            train={"steps": 1, "prompts_per_step": 4, "micro_batch_groups": 2},
        )
    )
    run = start(cfg)
    masks = []
    objective = run.objective

    def spy(logp, old_logp, adv, mask):
        masks.append(mask)
        return objective(logp, old_logp, adv, mask)

    spy.aggregation = objective.aggregation
    run.objective = spy
    t0 = time.time()
    s, j = run.sampler.next(run, 0)
    a = run.targets.compute(run, j)
    u = phases.update(run, 0, j, a)
    record = phases.observe(run, 0, s, j, a, u, t0)
    finish(run)
    ro = j.rollout
    assert int(ro.completion_mask.sum()) > int(ro.action_mask.sum()) > 0
    assert torch.equal(
        torch.cat(masks),
        (ro.action_mask.float() * a.keep[:, None])[
            torch.cat(list(micro_batches(ro.group, run.prompts, 2)))
        ],
    )
    assert u.iterations[0]["tokens"] == float((ro.action_mask.float() * a.keep[:, None]).sum())
    for k in (
        "env/turns",
        "env/tool_calls",
        "env/tool_call_frac",
        "env/tool_errors",
        "env/model_tokens",
        "env/env_tokens",
        "env/cut_budget_frac",
        "time/environment",
    ):
        assert math.isfinite(record[k]), k
    assert record["env/turns"] == 31 / 16  # episodes of 1, 2, 3, 1, 2, ... turns


def test_evaluation_runs_episodes_scored_on_the_last_turn(tiny_model):
    from grpo_core.observe.evaluate import evaluate

    model, tok, gen, runner = setup(tiny_model, Script(turns=(1, 2, 3)))
    seen = []

    def reward(prompts, completions, **kw):
        seen.extend(kw["messages"])
        return [float(len(c)) for c in completions]

    report, records = evaluate(
        model, tok, gen, ROWS, DATA, reward, n=2, temperature=1.0, max_new_tokens=6, episodes=runner
    )
    assert len(records) == 6 and report["problems"] == 3
    turns = [sum(m["role"] == "assistant" for m in r["messages"]) for r in records]
    assert sorted(set(turns)) == [1, 2, 3]  # episodes of every scripted length were played
    for r, msgs in zip(records, seen):  # the reward saw the last model turn, the record too
        assert r["messages"] == msgs and r["reward"] == len(r["completion"])
        assert r["completion"] == [m for m in msgs if m["role"] == "assistant"][-1]["content"]


def test_validate_names_what_an_environment_run_cannot_do(tiny_model, addition_data, tmp_path):
    cfg = make_config(
        tiny_model,
        addition_data,
        str(tmp_path / "run"),
        environment={"name": "calculator"},
        baseline={"name": "remax"},
        groups={"resample_zero_std_max": 2},
        data={"path": addition_data, "columns": ["answer", "messages"]},
    )
    out = run_grpo("validate", write_config(tmp_path / "c.json", cfg))
    assert out.returncode == 2
    for key in ("baseline.name: remax", "groups.resample_zero_std_max", "data.columns:"):
        assert key in out.stderr, out.stderr
    cfg = make_config(
        tiny_model,
        addition_data,
        str(tmp_path / "run"),
        environment={"name": "guess_number", "options": {"target_column": "nope"}},
    )
    out = run_grpo("validate", write_config(tmp_path / "d.json", cfg))
    assert out.returncode == 2 and "has no field 'nope'" in out.stderr


@pytest.mark.parametrize("name", ["calculator", "guess_number"])
def test_plugins_check_environment(name):
    out = run_grpo("plugins", "check", "environment", name)
    assert out.returncode == 0 and "0 failed" in out.stdout, out.stdout


def test_plugins_check_catches_a_broken_environment():
    from grpo_core.cli.plugin_tools import check

    class Bad(Environment):
        stop_strings = "</x>"  # a string, not a tuple of them

        def reset(self, row):
            return None

        def step(self, state, text):
            return {"text": "no"}

    module = types.ModuleType("bad_env_for_tests")

    @hookimpl
    def environment(register):
        register("bad_env", Bad, schema={"type": "object"})

    module.environment = environment
    registry().add(module, "test-bad-env")
    assert check("environment", "bad_env") == 2


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_vllm_episodes_follow_the_turn_contract(tiny_model):
    pytest.importorskip("vllm", reason="vllm is not installed")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model)
    model = AutoModelForCausalLM.from_pretrained(tiny_model).cuda()
    gen = grpo_core.create(
        "generator", "vllm", {"gpu_memory_utilization": 0.2, "enforce_eager": True}
    )
    gen.setup(model, tok, torch.device("cuda"))
    runner = EpisodeRunner(Script(turns=(1, 2, 3)), gen, tok, environment_section(), DATA)
    ro, tr = sample(runner, tok)
    assert sorted({t.turns for t in tr}) == [1, 2, 3]
    assert int(ro.completion_mask.sum()) > int(ro.action_mask.sum()) > 0
    full, _ = completion_logprobs(model, ro.to("cuda"), 1.0, 64)
    model_pos = ro.action_mask.bool().cuda()
    # the engine samples in bf16: its log-probs agree with the trainer's to bf16 precision
    assert float((full[model_pos] - ro.logprobs.cuda()[model_pos]).abs().mean()) < 0.05


def test_the_calculator_demo_warm_start_lays_out_what_episodes_produce():
    from grpo_core.cli import demo_calculator as dc
    from grpo_core.tiny import build_tokenizer

    tok = build_tokenizer()
    calc = grpo_core.create("environment", "calculator")
    row = {"prompt": "347+512=", "answer": "859"}
    prompt, first, call, result, answer = (
        t for t, _ in dc.trajectory(row, True, tok.eos_token, decide=False)
    )
    assert prompt == "347+512=" and first + call == "<calc>347+512</calc>"
    obs = calc.step(None, first + call)
    assert obs.text == "859" and tok.decode(Renderer(tok, calc).tokens(obs.text, None)) == result
    assert calc.step(None, tok.decode(tok(answer)["input_ids"], skip_special_tokens=True)).done
    assert [m for _, m in dc.trajectory(row, True, "", decide=False)] == [0, 0, 1, 0, 1]
    assert [m for _, m in dc.trajectory(row, False, "")] == [0, 1]
