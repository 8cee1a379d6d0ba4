"""TRL interop: our rewards as TRL reward functions, and 2 GRPOTrainer steps with one."""

from __future__ import annotations

import json

import pytest

from grpo_core.integrations.trl import trl_reward


def test_wrapper_handles_plain_and_conversational_completions():
    f = trl_reward("math")
    assert f.__name__ == "grpo_core_math"
    plain = f(
        prompts=["1+1="] * 2,
        completions=["\\boxed{2}", "3"],
        answer=["2", "2"],
        completion_ids=[[1, 2], [3]],
        trainer_state=object(),
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
