"""``reward_model``: a Hugging Face sequence-classification model scores prompt + completion."""

from __future__ import annotations

import torch

from grpo_core.errors import UserError
from grpo_core.hookspecs import Reward
from grpo_core.scores import Scores


class RewardModel(Reward):
    """Batched scoring on the training device; the chat template joins prompt and completion
    when the tokenizer has one. Safetensors only and no remote code unless opted in."""

    inline = True  # one copy of the model, on the training device: not in a worker process

    def __init__(
        self,
        model: str,
        batch_size: int = 16,
        max_length: int = 1024,
        normalize: str = "none",
        label: int = 0,
        device: str = "auto",
        trust_remote_code: bool = False,
        allow_unsafe_weights: bool = False,
    ):
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        try:
            self.tokenizer = AutoTokenizer.from_pretrained(
                model, trust_remote_code=trust_remote_code
            )
            self.model = AutoModelForSequenceClassification.from_pretrained(
                model,
                trust_remote_code=trust_remote_code,
                use_safetensors=None if allow_unsafe_weights else True,
            ).eval()
        except (OSError, ValueError) as exc:
            raise UserError(
                f"reward_model: cannot load {model!r}: {str(exc).splitlines()[0]}"
            ) from exc
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        if self.model.config.pad_token_id is None:
            self.model.config.pad_token_id = self.tokenizer.pad_token_id
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self.device = torch.device(device)
        self.model.to(self.device)
        self.batch_size, self.max_length = batch_size, max_length
        self.normalize, self.label = normalize, label

    def text(self, prompt, completion: str) -> str:
        if getattr(self.tokenizer, "chat_template", None):
            messages = (
                prompt if isinstance(prompt, list) else [{"role": "user", "content": str(prompt)}]
            )
            return self.tokenizer.apply_chat_template(
                messages + [{"role": "assistant", "content": completion}], tokenize=False
            )
        return (prompt if isinstance(prompt, str) else str(prompt)) + completion

    @torch.no_grad()
    def __call__(self, prompts, completions, **columns) -> Scores:
        texts = [self.text(p, c) for p, c in zip(prompts, completions)]
        scores = []
        for s in range(0, len(texts), self.batch_size):
            enc = self.tokenizer(
                texts[s : s + self.batch_size],
                return_tensors="pt",
                padding=True,
                truncation=True,
                max_length=self.max_length,
            ).to(self.device)
            logits = self.model(**enc).logits.float()
            scores += logits[:, self.label].tolist()
        if self.normalize == "batch" and len(scores) > 1:
            t = torch.tensor(scores)
            scores = ((t - t.mean()) / (t.std() + 1e-6)).tolist()
        return Scores(scores)


SCHEMA = {
    "type": "object",
    "additionalProperties": False,
    "required": ["model"],
    "properties": {
        "model": {"type": "string", "description": "hub id or local directory"},
        "batch_size": {"type": "integer", "minimum": 1, "default": 16},
        "max_length": {"type": "integer", "minimum": 1, "default": 1024},
        "normalize": {"enum": ["none", "batch"], "default": "none"},
        "label": {
            "type": "integer",
            "minimum": 0,
            "default": 0,
            "description": "which output logit is the reward",
        },
        "device": {"type": "string", "default": "auto"},
        "trust_remote_code": {"type": "boolean", "default": False},
        "allow_unsafe_weights": {"type": "boolean", "default": False},
    },
}
