"""Built-in rewards besides ``math``: format, length, json_schema, reward_model, http,
weighted."""

from __future__ import annotations

from grpo_core_plugins.rewards import code as code_reward
from grpo_core_plugins.rewards import format as fmt
from grpo_core_plugins.rewards import http, json_schema, judge, reward_model, weighted

from grpo_core.hookspecs import hookimpl

GRPO_CORE_API = (2,)


@hookimpl
def reward(register):
    code_reward.register(register)
    register(
        "format",
        fmt.FormatReward,
        schema=fmt.FORMAT_SCHEMA,
        description="tags present once and in order; regex rules; partial credit",
    )
    register(
        "length",
        fmt.LengthReward,
        schema=fmt.LENGTH_SCHEMA,
        description="DAPO overlong penalty (or a pull towards a target length)",
    )
    register(
        "json_schema",
        json_schema.JSONSchemaReward,
        schema=json_schema.SCHEMA,
        description="completion is JSON valid against a schema",
    )
    register(
        "reward_model",
        reward_model.RewardModel,
        schema=reward_model.SCHEMA,
        description="score from a sequence-classification model",
    )
    register(
        "http",
        http.HTTPReward,
        schema=http.SCHEMA,
        description="remote reward service over HTTP (JSON), with retries",
    )
    register("judge", judge.JudgeReward, schema=judge.SCHEMA, description=judge.ABOUT)
    register(
        "weighted",
        weighted.WeightedReward,
        schema=weighted.SCHEMA,
        description="weighted sum of reward dimensions, with gates and normalisation",
    )
