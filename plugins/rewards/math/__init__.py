"""The ``math`` reward: 1.0 when the completion's final answer equals the gold answer."""

from __future__ import annotations

from grpo_core_plugins.rewards.math.extract import extract_answer, gold_answer
from grpo_core_plugins.rewards.math.verify import Verifier

from grpo_core.hookspecs import Reward, hookimpl
from grpo_core.scores import Scores

GRPO_CORE_API = (2,)


class MathReward(Reward):
    """Scores each completion 1.0 (equivalent answer) or 0.0; extracted answers go to extras."""

    max_value = 1.0

    @classmethod
    def columns_for(cls, options: dict) -> tuple[str, ...]:
        return (options["answer_column"],)

    def __init__(
        self,
        answer_column: str = "answer",
        strict: bool = False,
        rel_tol: float = 0.0,
        timeout: float = 2.0,
        workers: int = 2,
        max_length: int = 2000,
    ):
        self.column, self.strict = answer_column, strict
        self.verifier = Verifier(
            rel_tol=rel_tol, timeout=timeout, workers=workers, max_length=max_length
        )

    def __call__(self, prompts, completions, **columns) -> Scores:
        if self.column not in columns:
            raise KeyError(
                f"math reward needs the dataset column {self.column!r}; add it to "
                f"data.columns or set reward options answer_column"
            )
        golds = [gold_answer(g) for g in columns[self.column]]
        preds = [extract_answer(c, self.strict) for c in completions]
        verdicts = self.verifier.verify_many(preds, golds)
        return Scores(
            [1.0 if v else 0.0 for v in verdicts], extras={"extracted": preds, "gold": golds}
        )

    def close(self) -> None:
        self.verifier.close()


SCHEMA = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "answer_column": {"type": "string", "default": "answer"},
        "strict": {
            "type": "boolean",
            "default": False,
            "description": "no last-number fallback: an answer must be marked",
        },
        "rel_tol": {
            "type": "number",
            "minimum": 0,
            "default": 0.0,
            "description": "relative tolerance for decimals; 0: must equal exactly",
        },
        "timeout": {
            "type": "number",
            "exclusiveMinimum": 0,
            "maximum": 60,
            "default": 2.0,
            "description": "seconds per item before it scores 0",
        },
        "workers": {"type": "integer", "minimum": 1, "default": 2},
        "max_length": {
            "type": "integer",
            "minimum": 1,
            "default": 2000,
            "description": "longest answer string parsed",
        },
    },
}


@hookimpl
def reward(register):
    register(
        "math",
        MathReward,
        schema=SCHEMA,
        description="final answer equals the gold answer (safe parser, bounded time)",
    )
