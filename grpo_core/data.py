"""Prompts in, in a reproducible order that a checkpoint can resume exactly; and what a
reward is called with for each completion."""

from __future__ import annotations

import json
import os
import random
from dataclasses import dataclass

from grpo_core.errors import UserError
from grpo_core.rollout import Rollout

#: Columns every reward also receives: token count of each completion, and its group.
RESERVED_COLUMNS = ("completion_tokens", "group_ids")
#: Columns rewards also receive when an environment runs episodes: the whole trajectory as
#: chat messages (see grpo_core.episodes)
EPISODE_COLUMNS = ("messages",)


def read_rows(path: str, split: str = "train") -> list[dict]:
    """Rows of a JSONL, JSON or parquet file, or of a ``datasets`` hub name / local script."""
    if os.path.isdir(path):
        for ext in (".jsonl", ".json", ".parquet"):
            candidate = os.path.join(path, split + ext)
            if os.path.exists(candidate):
                return read_rows(candidate, split)
        raise UserError(f"data.path: directory {path} has no {split}.jsonl/.json/.parquet")
    if path.endswith(".jsonl"):
        return _jsonl(path)
    if path.endswith(".json"):
        data = _json(path)
        data = data.get(split, data) if isinstance(data, dict) else data
        if not isinstance(data, list):
            raise UserError(f"data.path: {path} must hold a list of objects (or {{split: list}})")
        return data
    if path.endswith(".parquet"):
        if not os.path.exists(path):
            raise UserError(f"data.path: file not found: {path}")
        try:
            import pyarrow.parquet as pq
        except ImportError as exc:
            raise UserError("data.path: parquet needs pyarrow (pip install pyarrow)") from exc
        try:
            return pq.read_table(path).to_pylist()
        except Exception as exc:  # pyarrow's errors have many types
            raise UserError(f"data.path: {path} is not a readable parquet file "
                            f"({str(exc).splitlines()[0]})") from exc
    if os.path.exists(path):
        raise UserError(f"data.path: {path} is not a .jsonl, .json or .parquet file")
    if path.count("/") > 1 or path.startswith((".", "/")) or os.path.splitext(path)[1]:
        raise UserError(f"data.path: file not found: {path}")
    try:
        import datasets
    except ImportError as exc:
        raise UserError(f"data.path: {path} is not a file, and loading hub datasets needs "
                        f"`pip install datasets`") from exc
    try:
        return list(datasets.load_dataset(path, split=split))
    except Exception as exc:  # hub errors come in many types
        raise UserError(f"data.path: cannot load dataset {path!r} split {split!r}: {exc}") from exc


def _jsonl(path: str) -> list[dict]:
    if not os.path.exists(path):
        raise UserError(f"data.path: file not found: {path}")
    rows, n = [], 0
    try:
        with open(path, encoding="utf-8") as f:
            for line in f:
                n += 1  # the line an error names
                if line.strip():
                    rows.append(json.loads(line))
    except UnicodeDecodeError as exc:
        raise UserError(f"{path}:{n + 1}: not UTF-8 text") from exc
    except json.JSONDecodeError as exc:
        raise UserError(f"{path}:{n}: invalid JSON line ({exc.msg})") from exc
    except RecursionError as exc:
        raise UserError(f"{path}:{n}: nested too deeply to be a dataset row") from exc
    except OSError as exc:
        raise UserError(f"data.path: cannot read {path} ({exc.strerror or exc})") from exc
    return rows


def _json(path: str):
    if not os.path.exists(path):
        raise UserError(f"data.path: file not found: {path}")
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except json.JSONDecodeError as exc:
        raise UserError(f"{path}: invalid JSON at line {exc.lineno} ({exc.msg})") from exc
    except UnicodeDecodeError as exc:
        raise UserError(f"{path}: not UTF-8 text (byte {exc.start})") from exc
    except RecursionError as exc:
        raise UserError(f"{path}: nested too deeply to be a data set") from exc
    except OSError as exc:
        raise UserError(f"data.path: cannot read {path} ({exc.strerror or exc})") from exc


def check_fields(rows: list[dict], fields: list[str], source: str) -> None:
    """Every row must have every field, and the first field (the prompt) must be text or a
    list of chat messages; name the first row that does not."""
    if not rows:
        raise UserError(f"data.path: {source} has no rows")
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            raise UserError(f"{source}: row {i} is a {type(row).__name__}, expected an object")
        for f in fields:
            if f not in row:
                raise UserError(f"{source}: row {i} has no field {f!r} (has {sorted(row)}); "
                                f"set data.prompt_field / data.columns")
        problem = _prompt_problem(row[fields[0]]) if fields else None
        if problem:
            raise UserError(f"{source}: row {i} field {fields[0]!r}: {problem}")


def _prompt_problem(prompt) -> str | None:
    """Why a value cannot be a prompt (None when it can)."""
    if isinstance(prompt, str):
        return None if prompt.strip() else "empty prompt"
    if isinstance(prompt, list):
        if not prompt:
            return "empty list of messages"
        for m in prompt:
            if not (isinstance(m, dict) and isinstance(m.get("role"), str)
                    and isinstance(m.get("content"), str)):
                return "a list prompt must hold chat messages {role: str, content: str}"
        return None
    return f"found {type(prompt).__name__}, expected text or a list of chat messages"


def fit_prompts(rows: list[dict], tokenizer, data_cfg: dict, limit: int) -> tuple[list[dict], int]:
    """Apply ``data.long_prompts`` to prompts longer than ``limit`` tokens (after the chat
    template): ``drop`` them, ``error`` on the first, or ``truncate_left`` (keep the end,
    where the question usually is). Returns the rows kept and how many were long."""
    kept, long = [], 0
    policy = data_cfg["long_prompts"]
    for i, row in enumerate(rows):
        text = render_prompt(tokenizer, row[data_cfg["prompt_field"]],
                             data_cfg["chat_template"], data_cfg["system_prompt"])
        n = len(tokenizer(text, add_special_tokens=False)["input_ids"])
        if n <= limit:
            kept.append(row)
            continue
        long += 1
        if policy == "error":
            raise UserError(f"data: row {i} has a prompt of {n} tokens, over the limit of "
                            f"{limit} (data.max_prompt_tokens, or the model's context minus "
                            f"sampling.max_new_tokens); set data.long_prompts: drop")
        if policy == "truncate_left":
            kept.append({**row, TRUNCATE: limit})
    if not kept:
        raise UserError(f"data: every prompt is longer than {limit} tokens")
    return kept, long


#: a row field set by ``fit_prompts``: keep only this many tokens from the prompt's end
TRUNCATE = "__grpo_truncate_left"


def render_prompt(tokenizer, prompt, mode: str = "auto", system: str | None = None) -> str:
    """The text the model sees: the chat template when it has one (and mode allows)."""
    has_template = bool(getattr(tokenizer, "chat_template", None))
    if isinstance(prompt, list):  # already a conversation
        messages = prompt
    else:
        messages = [{"role": "user", "content": str(prompt)}]
    if mode == "never" or (mode == "auto" and not has_template):
        if isinstance(prompt, list):
            return "\n".join(m.get("content", "") for m in prompt)
        return (system + "\n" if system else "") + str(prompt)
    if mode == "always" and not has_template:
        raise UserError("data.chat_template: 'always' but the tokenizer has no chat template")
    if system and messages[0].get("role") != "system":
        messages = [{"role": "system", "content": system}] + messages
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)


class PromptStream:
    """Epoch-wise shuffled order fixed by the seed; ``position`` counts prompts served."""

    def __init__(self, n_rows: int, seed: int, shuffle: bool = True):
        self.n, self.seed, self.shuffle, self.position = n_rows, seed, shuffle, 0
        self._epoch, self._order = -1, []

    def _index(self, k: int) -> int:
        epoch, offset = divmod(k, self.n)
        if epoch != self._epoch:
            self._order = list(range(self.n))
            if self.shuffle:
                random.Random(self.seed * 1000003 + epoch).shuffle(self._order)
            self._epoch = epoch
        return self._order[offset]

    def take(self, count: int) -> list[int]:
        """The next ``count`` row indices."""
        out = [self._index(self.position + i) for i in range(count)]
        self.position += count
        return out


@dataclass
class Batch:
    """One step's prompts: as the dataset gives them (what rewards see), as the model sees
    them (chat template applied) and as token ids; reward columns per prompt."""

    raw: list
    prompts: list[str]
    prompt_ids: list[list[int]]
    columns: dict[str, list]

    def select(self, idx: list[int]) -> Batch:
        """The prompts at ``idx``, in that order."""
        return Batch([self.raw[i] for i in idx], [self.prompts[i] for i in idx],
                     [self.prompt_ids[i] for i in idx],
                     {k: [v[i] for i in idx] for k, v in self.columns.items()})


def make_batch(rows: list[dict], data_cfg: dict, tokenizer) -> Batch:
    """Render and tokenize dataset rows (``data`` config section) into a :class:`Batch`."""
    field = data_cfg["prompt_field"]
    prompts = [render_prompt(tokenizer, r[field], data_cfg["chat_template"],
                             data_cfg["system_prompt"]) for r in rows]
    ids = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
    ids = [i[-r[TRUNCATE]:] if TRUNCATE in r else i for i, r in zip(ids, rows)]
    columns = {c: [r[c] for r in rows] for c in data_cfg["columns"]}
    return Batch([r[field] for r in rows], prompts, ids, columns)


def reward_inputs(tokenizer, batch: Batch, ro: Rollout,
                  transcripts: list | None = None) -> tuple[list, list[str], dict]:
    """What a reward is called with, one entry per completion: the dataset prompts, the
    decoded completions, and the columns (dataset fields plus the reserved ones). For
    environment episodes (``transcripts``, grpo_core.episodes) the completion is the last
    model turn's text, ``messages`` the whole trajectory, and ``completion_tokens`` counts
    the model's tokens only."""
    if transcripts is None:
        texts = tokenizer.batch_decode(ro.completion_ids * ro.completion_mask
                                       + tokenizer.pad_token_id * (1 - ro.completion_mask),
                                       skip_special_tokens=True)
    else:
        texts = [t.final for t in transcripts]
    g = ro.group.cpu().tolist()
    columns = {k: [v[i] for i in g] for k, v in batch.columns.items()}
    columns["completion_tokens"] = ro.action_mask.sum(-1).tolist()
    columns["group_ids"] = g
    if transcripts is not None:
        columns["messages"] = [t.messages for t in transcripts]
    return [batch.raw[i] for i in g], texts, columns
