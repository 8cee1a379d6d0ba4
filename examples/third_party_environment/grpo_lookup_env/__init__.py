"""A fact-lookup tool as a grpo-core environment, and a reward that reads the trajectory.

The model looks facts up with ``<lookup>KEY</lookup>`` (the closing tag ends its turn); the
environment answers from the dataset row's ``facts`` field (a JSON object of key -> text),
or with an error; a turn without a lookup is the final answer. ``lookup_errors`` scores a
trajectory 1 minus 0.25 per failed lookup, from the messages the trainer passes to rewards.
"""

from __future__ import annotations

from grpo_core.hookspecs import Environment, Observation, Reward, hookimpl

GRPO_CORE_API = (2,)

OPEN, CLOSE = "<lookup>", "</lookup>"


class Lookup(Environment):
    """Answers lookups from the row's facts; at most ``max_lookups`` per episode."""

    role = "tool"  # results go into the chat template's tool role (user when it has none)
    stop_strings = (CLOSE,)  # a lookup's closing tag ends the model's turn
    delimiters = ("\n<fact>", "</fact>\n")  # around a result when there is no chat template

    @classmethod
    def columns_for(cls, options):
        return (options["facts_column"],)

    @classmethod
    def example_row(cls, options):  # what `grpo plugins check` starts episodes from
        return {
            "prompt": "What is the capital of France?",
            options["facts_column"]: {"capital of France": "Paris"},
        }

    def __init__(self, facts_column: str = "facts", max_lookups: int = 3):
        self.column, self.max_lookups = facts_column, max_lookups

    def reset(self, row):
        facts = row[self.column]
        return {"facts": {str(k).lower(): str(v) for k, v in dict(facts).items()}, "used": 0}

    def step(self, state, text):
        start = text.rfind(OPEN)
        if start < 0:
            return Observation(done=True)  # no lookup: this turn is the final answer
        state["used"] += 1
        if state["used"] > self.max_lookups:
            return Observation("error: no lookups left", tool_call=True, tool_error=True)
        key = text[start + len(OPEN) :].split(CLOSE, 1)[0].strip().lower()
        if key not in state["facts"]:
            return Observation(
                f"error: no fact named {key[:40]!r}", tool_call=True, tool_error=True
            )
        return Observation(state["facts"][key], tool_call=True)


class LookupErrors(Reward):
    """1.0 minus 0.25 per failed lookup in the trajectory (never below 0)."""

    max_value = 1.0

    def __call__(self, prompts, completions, messages=None, **columns):
        if messages is None:  # single-turn runs have no trajectory: nothing to penalise
            return [1.0] * len(completions)
        return [
            max(0.0, 1.0 - 0.25 * sum(bool(m.get("tool_error")) for m in conversation))
            for conversation in messages
        ]


@hookimpl
def environment(register):
    register(
        "lookup",
        Lookup,
        schema={
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "facts_column": {"type": "string", "default": "facts"},
                "max_lookups": {"type": "integer", "minimum": 1, "default": 3},
            },
        },
        description="look facts up in the row's facts: <lookup>key</lookup>",
    )


@hookimpl
def reward(register):
    register(
        "lookup_errors",
        LookupErrors,
        schema={"type": "object", "additionalProperties": False},
        description="1 - 0.25 per failed lookup in the trajectory",
    )
