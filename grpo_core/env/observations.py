"""How an environment's observation becomes context tokens: with a chat template, the
template's own rendering of the observation message (in its tool role when it has one);
without one, the text between the environment's delimiters. The model's own tokens are
never re-tokenized: only the observation's text is, so the trajectory the trainer scores is
exactly the one the model sampled from."""

from __future__ import annotations

from grpo_core.errors import UserError
from grpo_core.hookspecs import Environment

#: stands for an assistant message's content when the chat template is rendered around it
SENTINEL = "\u2063GRPO-CORE-TURN\u2063"


class EnvironmentFailure(UserError):
    """An environment raised, hung or answered wrongly under ``environment.failure: raise``."""


class Renderer:
    """The tokens an observation adds to the context. With a chat template: the template's
    own rendering of the observation message and of the next assistant header (the text the
    template puts after an assistant message, found around a sentinel), in the template's
    ``tool`` role when it has one, else ``user``. Without one: the observation between the
    environment's delimiters. The model's tokens are never re-tokenized."""

    def __init__(self, tokenizer, env: Environment, chat_template: str = "auto"):
        self.tok, self.env = tokenizer, env
        has = bool(getattr(tokenizer, "chat_template", None))
        self.chat = chat_template == "always" or (chat_template == "auto" and has)
        self.role = env.role
        if self.chat and self.role != "user" and self._after(self.role, "0") is None:
            self.role = "user"  # the template has no such role

    def _after(self, role: str, content: str) -> str | None:
        messages = [
            {"role": "user", "content": "?"},
            {"role": "assistant", "content": SENTINEL},
            {"role": role, "content": content},
        ]
        try:
            text = self.tok.apply_chat_template(
                messages, add_generation_prompt=True, tokenize=False
            )
        except Exception:  # a template that refuses the role raises its own error type
            return None
        at = text.find(SENTINEL)
        if at < 0 or content not in text[at:]:
            return None
        return text[at + len(SENTINEL) :]

    def tokens(self, text: str, eos: int | None) -> list[int]:
        """The context after a model turn (``eos``: the EOS token it ended with, if any)."""
        out: str | None
        if not self.chat:
            out = self.env.delimiters[0] + text + self.env.delimiters[1]
        else:
            out = self._after(self.role, text)
            if out is None:
                raise EnvironmentFailure(
                    f"the chat template cannot render an observation in role {self.role!r}"
                )
            end = self.tok.decode([eos]) if eos is not None else ""
            if end and out.startswith(end):  # the model already closed its turn
                out = out[len(end) :]
        return self.tok(out, add_special_tokens=False)["input_ids"] if out else []


def first_messages(prompt: str | list, system: str | None = None) -> list[dict]:
    """The conversation an episode starts from: the dataset's prompt as chat messages."""
    if isinstance(prompt, list):
        head = (
            [{"role": "system", "content": system}]
            if system and (not prompt or prompt[0].get("role") != "system")
            else []
        )
        return head + [dict(m) for m in prompt]
    return ([{"role": "system", "content": system}] if system else []) + [
        {"role": "user", "content": str(prompt)}
    ]
