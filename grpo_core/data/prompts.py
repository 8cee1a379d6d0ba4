"""Prompts in, in a reproducible order that a checkpoint can resume exactly (from a list,
or streamed from a source too large to hold); and what a reward is called with for each
completion. Where rows are read from is grpo_core.data.sources."""

from __future__ import annotations

import itertools
import random
import weakref
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from grpo_core.config.view import DataSection
from grpo_core.data.sources import read_rows  # noqa: F401  (its home before grpo_core.data.sources)
from grpo_core.errors import UserError
from grpo_core.rollout import Rollout

#: Columns every reward also receives: token count of each completion, and its group.
RESERVED_COLUMNS = ("completion_tokens", "completion_ids", "group_ids", "trainer_state")
#: Columns rewards also receive when an environment runs episodes: the whole trajectory as
#: chat messages (see grpo_core.env.episodes)
EPISODE_COLUMNS = ("messages",)


def column_map(data: DataSection) -> dict[str, str]:
    """``data.columns`` as {dataset field: reward argument}: a list passes each field under its
    own name; a mapping renames (``{solution: answer}`` hands the ``solution`` field to a
    reward that reads ``answer``), so a data set works without editing it."""
    cols = data.columns
    return dict(cols) if isinstance(cols, dict) else {c: c for c in cols}


def column_problems(data: DataSection) -> list[str]:
    """What is wrong with ``data.columns`` whatever the data holds (one line each)."""
    args = list(column_map(data).values())
    problems = []
    twice = sorted({a for a in args if args.count(a) > 1})
    if twice:
        problems.append(
            f"data.columns: several fields are passed as {twice}; a reward argument takes one field"
        )
    reserved = sorted(set(args) & set(RESERVED_COLUMNS))
    if reserved:
        problems.append(
            f"data.columns: {reserved} are reserved names the trainer passes to "
            f"rewards; rename the dataset field (data.columns: {{field: name}})"
        )
    return problems


def check_fields(rows: list[dict], fields: list[str], source: str) -> None:
    """Every row must have every field, and the first field (the prompt) must be text or a
    list of chat messages; name the first row that does not."""
    if not rows:
        raise UserError(f"data.path: {source} has no rows")
    for i, row in enumerate(rows):
        check_row(row, i, fields, source)


def check_row(row, i: int, fields: list[str], source: str) -> None:
    """One row of :func:`check_fields` (a streamed row is checked when it is read)."""
    if not isinstance(row, dict):
        raise UserError(f"{source}: row {i} is a {type(row).__name__}, expected an object")
    for f in fields:
        if f not in row:
            raise UserError(
                f"{source}: row {i} has no field {f!r} (has {sorted(row)}); "
                f"set data.prompt_field / data.columns"
            )
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
            if not (
                isinstance(m, dict)
                and isinstance(m.get("role"), str)
                and isinstance(m.get("content"), str)
            ):
                return "a list prompt must hold chat messages {role: str, content: str}"
        return None
    return f"found {type(prompt).__name__}, expected text or a list of chat messages"


def fit_prompts(
    rows: list[dict], tokenizer, data: DataSection, limit: int
) -> tuple[list[dict], int]:
    """Apply ``data.long_prompts`` to prompts longer than ``limit`` tokens (after the chat
    template): ``drop`` them, ``error`` on the first, or ``truncate_left`` (keep the end,
    where the question usually is). Returns the rows kept and how many were long."""
    kept, long = [], 0
    for i, row in enumerate(rows):
        fitted, was_long = fit_prompt(row, i, tokenizer, data, limit)
        long += was_long
        if fitted is not None:
            kept.append(fitted)
    if not kept:
        raise UserError(f"data: every prompt is longer than {limit} tokens")
    return kept, long


def fit_prompt(
    row: dict, i: int, tokenizer, data: DataSection, limit: int
) -> tuple[dict | None, bool]:
    """One row of :func:`fit_prompts`: (the row as kept or None when dropped, whether it was
    long)."""
    text = render_prompt(
        tokenizer,
        row[data.prompt_field],
        data.chat_template,
        data.system_prompt,
        data.chat_template_kwargs,
    )
    if len(text) <= chars_bound(tokenizer, limit):
        n = len(tokenizer(text, add_special_tokens=False)["input_ids"])
        if n <= limit:
            return row, False
        size = f"{n} tokens"
    else:  # over the limit for certain: never tokenized whole (memory grows with its length)
        size = f"{len(text)} characters (more than {limit} tokens)"
    if data.long_prompts == "error":
        raise UserError(
            f"data: row {i} has a prompt of {size}, over the limit of "
            f"{limit} (data.max_prompt_tokens, or the model's context minus "
            f"sampling.max_new_tokens); set data.long_prompts: drop"
        )
    return ({**row, TRUNCATE: limit} if data.long_prompts == "truncate_left" else None), True


#: a row field set by ``fit_prompts``: keep only this many tokens from the prompt's end
TRUNCATE = "__grpo_truncate_left"
#: how many characters a normaliser (Unicode NFC and the like) may merge into one at most
NORMALISER_SLACK = 4
_longest: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def chars_bound(tokenizer, tokens: int) -> int:
    """The most characters ``tokens`` tokens can cover: the vocabulary's longest token
    (counted in its own characters, which for byte-level vocabularies are bytes, never fewer
    than the text's characters), with room for normalisers. A longer text has more than
    ``tokens`` tokens, so it is known to be too long without tokenizing it."""
    try:
        longest = _longest[tokenizer]
    except (KeyError, TypeError):
        longest = max((len(t) for t in tokenizer.get_vocab()), default=1)
        try:
            _longest[tokenizer] = longest
        except TypeError:  # not weakly referable: computed each time
            pass
    return tokens * max(longest, 1) * NORMALISER_SLACK


def prompt_ids(tokenizer, text: str, keep: int | None = None) -> list[int]:
    """``text``'s token ids; with ``keep``, its last ``keep`` only, tokenizing no more of the
    text's end than :func:`chars_bound` says can hold them."""
    if keep is None:
        return tokenizer(text, add_special_tokens=False)["input_ids"]
    tail = text[-chars_bound(tokenizer, keep) :]
    return tokenizer(tail, add_special_tokens=False)["input_ids"][-keep:]


def render_prompt(
    tokenizer,
    prompt,
    mode: str = "auto",
    system: str | None = None,
    template_kwargs: dict | None = None,
) -> str:
    """The text the model sees: the chat template when it has one (and mode allows), given
    ``template_kwargs`` (``data.chat_template_kwargs``: ``enable_thinking`` and the like)."""
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
    return tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=False, **(template_kwargs or {})
    )


class PromptStream:
    """Rows held in memory, served in an epoch-wise shuffled order fixed by the seed;
    ``position`` counts prompts served, which is all a checkpoint needs to resume exactly.
    ``long_prompts``: rows found longer than the prompt limit (data.long_prompts)."""

    def __init__(self, rows: list[dict], seed: int, shuffle: bool = True, long_prompts: int = 0):
        self.rows, self.n, self.seed, self.shuffle = rows, len(rows), seed, shuffle
        self.position, self.long_prompts = 0, long_prompts
        self._epoch = -1
        self._order: list[int] = []

    def _index(self, k: int) -> int:
        epoch, offset = divmod(k, self.n)
        if epoch != self._epoch:
            self._order = list(range(self.n))
            if self.shuffle:
                random.Random(self.seed * 1000003 + epoch).shuffle(self._order)
            self._epoch = epoch
        return self._order[offset]

    def take(self, count: int) -> list[dict]:
        """The next ``count`` rows."""
        out = [self.rows[self._index(self.position + i)] for i in range(count)]
        self.position += count
        return out

    def state_dict(self) -> dict:
        return {"position": self.position}

    def load_state_dict(self, state: dict) -> None:
        self.position = state["position"]


class StreamedPrompts:
    """Rows read from a source as they are needed (a data set too large to hold): each is
    checked and fitted to the prompt limit when read, and a source read to its end starts
    the next epoch (``open_epoch(e)`` gives epoch ``e``'s rows; a seeded shuffle buffer
    orders each epoch differently).

    ``position`` counts rows read from the source over all epochs, dropped ones included.
    Resuming reads the source again from the start of the current epoch and discards the
    rows already used (without tokenizing them), so a resumed run sees exactly the rows an
    uninterrupted one would, provided the source is unchanged (same files, same revision).
    ``long_prompts`` counts long rows met in the first epoch (each row once)."""

    def __init__(
        self,
        open_epoch: Callable[[int], Iterable[dict]],
        fit: Callable[[dict, int], tuple[dict | None, bool]],
        fields: list[str],
        name: str,
    ):
        self.open_epoch, self.fit, self.fields, self.name = open_epoch, fit, fields, name
        self.position, self.long_prompts = 0, 0
        self.epoch_rows: int | None = None  # known once the first epoch has been read
        self._it: Iterator[dict] | None = None
        self._epoch, self._offset, self._dropped = 0, 0, 0

    def _open(self) -> None:
        """Position the source at ``position``: its epoch, then that many rows into it."""
        rows = self.epoch_rows
        self._epoch, offset = divmod(self.position, rows) if rows else (0, self.position)
        self._it = iter(self.open_epoch(self._epoch))
        skipped = sum(1 for _ in itertools.islice(self._it, offset))
        self._offset = skipped
        if skipped < offset:  # the first epoch is shorter than position: now its size is known
            if not skipped:
                raise UserError(f"data.path: {self.name} has no rows")
            self.epoch_rows = skipped
            self._open()

    def _next_row(self) -> dict:
        if self._it is None:
            self._open()
        assert self._it is not None  # _open set it
        row = next(self._it, None)
        if row is None:  # end of the source: the next epoch
            if not self._offset:
                raise UserError(f"data.path: {self.name} has no rows")
            self.epoch_rows = self.epoch_rows or self._offset
            self._epoch, self._offset = self._epoch + 1, 0
            self._it = iter(self.open_epoch(self._epoch))
            row = next(self._it, None)
            if row is None:
                raise UserError(f"data.path: {self.name} has no rows")
        return row

    def take(self, count: int) -> list[dict]:
        """The next ``count`` rows kept by the prompt limit."""
        out: list[dict] = []
        while len(out) < count:
            row = self._next_row()
            check_row(row, self._offset, self.fields, self.name)
            fitted, long = self.fit(row, self._offset)
            self.position, self._offset = self.position + 1, self._offset + 1
            if long and self._epoch == 0:
                self.long_prompts += 1
            self._dropped = 0 if fitted is not None else self._dropped + 1
            if self.epoch_rows and self._dropped >= self.epoch_rows:
                raise UserError(f"data: every prompt of {self.name} is over the prompt limit")
            if fitted is not None:
                out.append(fitted)
        return out

    def state_dict(self) -> dict:
        return {
            "position": self.position,
            "long_prompts": self.long_prompts,
            "epoch_rows": self.epoch_rows,
        }

    def load_state_dict(self, state: dict) -> None:
        self.position = state["position"]
        self.long_prompts = state.get("long_prompts", 0)
        self.epoch_rows = state.get("epoch_rows")
        self._it = None


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
        return Batch(
            [self.raw[i] for i in idx],
            [self.prompts[i] for i in idx],
            [self.prompt_ids[i] for i in idx],
            {k: [v[i] for i in idx] for k, v in self.columns.items()},
        )


def make_batch(rows: list[dict], data: DataSection, tokenizer) -> Batch:
    """Render and tokenize dataset rows (``data`` config section) into a :class:`Batch`."""
    field = data.prompt_field
    prompts = [
        render_prompt(
            tokenizer,
            r[field],
            data.chat_template,
            data.system_prompt,
            data.chat_template_kwargs,
        )
        for r in rows
    ]
    ids = [prompt_ids(tokenizer, p, r.get(TRUNCATE)) for p, r in zip(prompts, rows)]
    columns = {arg: [r[f] for r in rows] for f, arg in column_map(data).items()}
    return Batch([r[field] for r in rows], prompts, ids, columns)


def reward_inputs(
    tokenizer, batch: Batch, ro: Rollout, transcripts: list | None = None
) -> tuple[list, list[str], dict]:
    """What a reward is called with, one entry per completion: the dataset prompts, the
    decoded completions, and the columns (dataset fields plus the reserved ones). For
    environment episodes (``transcripts``, grpo_core.env.episodes) the completion is the last
    model turn's text, ``messages`` the whole trajectory, and ``completion_tokens`` counts
    the model's tokens only."""
    if transcripts is None:
        texts = tokenizer.batch_decode(
            ro.completion_ids * ro.completion_mask
            + tokenizer.pad_token_id * (1 - ro.completion_mask),
            skip_special_tokens=True,
        )
    else:
        texts = [t.final for t in transcripts]
    g = ro.group.cpu().tolist()
    columns = {k: [v[i] for i in g] for k, v in batch.columns.items()}
    columns["completion_tokens"] = ro.action_mask.sum(-1).tolist()
    columns["completion_ids"] = [
        ids[m].tolist() for ids, m in zip(ro.completion_ids.cpu(), ro.completion_mask.bool().cpu())
    ]
    columns["group_ids"] = g
    if transcripts is not None:
        columns["messages"] = [t.messages for t in transcripts]
    return [batch.raw[i] for i in g], texts, columns
