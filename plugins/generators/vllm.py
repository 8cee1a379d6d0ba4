"""The ``vllm`` generator: a colocated vLLM engine for fast rollouts (needs CUDA and vllm).

The engine runs in each training process, on that rank's GPU, sharing it
(``gpu_memory_utilization``); it sleeps during the update and wakes for generation when
``sleep`` is on. Under torchrun the engines use vLLM's ``external_launcher``: the training
ranks are its workers, ``tensor_parallel_size`` consecutive ranks sharing one engine (each
holding a shard, all submitting the same requests). After every ``sync_every`` optimizer
steps the trained weights are loaded through vLLM's RPC for RL trainers: ``collective_rpc``
calls a worker extension (grpo_core_plugins.generators.vllm_worker) on every worker.

The engine returns the log-probs of the distribution it sampled from (``logprobs_mode:
processed_logprobs``: after the repetition penalty, temperature, top-k, top-p and min-p).
The trainer recomputes the old log-probs under its own policy and weights the objective by
min(pi_trainer / pi_vllm, ``tis_cap``), which corrects both the two engines' numeric mismatch
and the filters' departure from the policy (``recompute_old_logprobs`` below).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator

import torch
import torch.distributed as td
from grpo_core_plugins.generators.vllm_worker import EXTENSION
from torch.distributed.tensor import DTensor

from grpo_core.engine import dist
from grpo_core.errors import UserError
from grpo_core.hookspecs import Generator, Turn, TurnSampler, hookimpl
from grpo_core.rollout import Rollout, SamplingParams, pad_left, pad_right

GRPO_CORE_API = (2,)
#: weights handed to the workers per RPC call (bytes): bounds the extra memory of a sync
SYNC_BATCH_BYTES = 2**29


def settings(sp: SamplingParams, stop: tuple[str, ...]) -> dict:
    """Our sampling settings as vllm.SamplingParams arguments: greedy is temperature 0, top-k
    off is -1 (accepted by every vLLM version; newer ones also take 0), and a stop string is
    kept in the output, as the hf generator keeps the token completing it."""
    return dict(
        temperature=0.0 if sp.greedy else sp.temperature,
        top_p=sp.top_p,
        top_k=sp.top_k if sp.top_k > 0 else -1,
        min_p=sp.min_p,
        repetition_penalty=sp.repetition_penalty,
        stop=list(stop) or None,
        include_stop_str_in_output=True,
    )


def engine_args(opts: dict, path: str, sleep: bool, world: int) -> dict:
    """vllm.LLM's arguments: the engine in this process (one worker per rank under torchrun:
    external_launcher), log-probs of the processed distribution, the weight-loading worker
    extension, and one seed everywhere (the ranks sharing an engine must sample alike)."""
    kw = dict(
        model=path,
        tokenizer=path,
        dtype="bfloat16",
        enable_sleep_mode=sleep,
        seed=0,
        logprobs_mode="processed_logprobs",
        worker_extension_cls=EXTENSION,
        **{k: v for k, v in opts.items() if v is not None},
    )
    if world > 1:
        kw["distributed_executor_backend"] = "external_launcher"
    return kw


def tensor_parallel_groups(world: int, size: int) -> list[list[int]]:
    """The ranks sharing each engine: ``size`` consecutive ones (vLLM lays tensor
    parallelism innermost over the launched ranks)."""
    return [list(range(start, start + size)) for start in range(0, world, size)]


def sampled_logprobs(completion) -> list[float]:
    """Each sampled token's log-prob from a vLLM CompletionOutput (its ``logprobs``: one
    {token id: Logprob} per token), 0.0 where the engine gave none."""
    steps = completion.logprobs or [None] * len(completion.token_ids)
    return [d[t].logprob if d and t in d else 0.0 for t, d in zip(completion.token_ids, steps)]


def tensor_parallel_group(size: int):
    """This rank's gloo group among those sharing its engine (None without tensor
    parallelism); every rank must call this, as torch.distributed creates every group on
    every rank."""
    if size == 1:
        return None
    group, _ = td.new_subgroups_by_enumeration(
        tensor_parallel_groups(dist.world_size(), size), backend="gloo"
    )
    return group


def _whole(t: torch.Tensor) -> torch.Tensor:
    """A parameter whole: gathered from its shards under ddp/fsdp (every rank calls this)."""
    return t.full_tensor() if isinstance(t, DTensor) else t


def weight_batches(
    named: Iterable[tuple[str, torch.Tensor]], limit: int = SYNC_BATCH_BYTES
) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """``named`` in consecutive lists of at most ``limit`` bytes each (a larger tensor alone),
    so a sync never holds more than one list of bfloat16 copies at once."""
    batch, size = [], 0
    for name, t in named:
        if batch and size + t.numel() * t.element_size() > limit:
            yield batch
            batch, size = [], 0
        batch.append((name, t))
        size += t.numel() * t.element_size()
    if batch:
        yield batch


class VLLMGenerator(Generator):
    recompute_old_logprobs = True
    supports_episodes = True

    def __init__(
        self,
        gpu_memory_utilization: float = 0.3,
        tensor_parallel_size: int = 1,
        sleep: bool = True,
        sync_every: int = 1,
        tis_cap: float = 2.0,
        max_model_len: int | None = None,
        enforce_eager: bool = False,
    ):
        self.opts = dict(
            gpu_memory_utilization=gpu_memory_utilization,
            tensor_parallel_size=tensor_parallel_size,
            max_model_len=max_model_len,
            enforce_eager=enforce_eager,
        )
        self.sleep, self.sync_every, self.tis_cap = sleep, sync_every, tis_cap
        self.tp = tensor_parallel_size
        self.llm, self.updates, self.group = None, 0, None

    def setup(self, model, tokenizer, device) -> None:
        if device.type != "cuda":
            raise UserError(
                "generator vllm: needs a CUDA device (train.device); use the hf generator on CPU"
            )
        # the engine in this process: collective_rpc then hands the workers our tensors as
        # they are, on this rank's GPU, rather than serialising them to another process
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        try:
            import vllm
        except ImportError as exc:
            raise UserError(
                "generator vllm: vllm is not installed (pip install 'grpo-core[vllm]')"
            ) from exc
        self.vllm = vllm
        self.tokenizer = tokenizer
        self.group = tensor_parallel_group(self.tp)
        self.llm = vllm.LLM(
            **engine_args(self.opts, model.config._name_or_path, self.sleep, dist.world_size())
        )
        self.sync_weights(model, force=True)
        if self.sleep:
            self.llm.sleep(level=1)

    def sync_weights(self, model, force: bool = False) -> None:
        """Load the trained weights into the engine (every ``sync_every`` updates), a batch
        of bfloat16 tensors per collective_rpc call."""
        self.updates += 1
        if not force and self.updates % self.sync_every:
            return
        if self.sleep and not force:
            self.llm.wake_up()
        named = ((k, _whole(v).detach().to(torch.bfloat16)) for k, v in model.state_dict().items())
        for batch in weight_batches(named):
            self.llm.collective_rpc("load_trained_weights", args=(batch,))
        self.llm.reset_prefix_cache()
        if self.sleep and not force:
            self.llm.sleep(level=1)

    def _shared(self, prompt_ids: list[list[int]]) -> tuple[list[list[int]], int]:
        """The requests this rank submits, and where its own prompts start among them: its
        prompts alone, or with tensor parallelism every prompt of the ranks sharing its
        engine, in rank order (those ranks must submit the same requests)."""
        if self.group is None:
            return prompt_ids, 0
        everyone: list = [None] * self.tp
        td.all_gather_object(everyone, prompt_ids, group=self.group)
        mine = td.get_rank(self.group)
        return [p for part in everyone for p in part], sum(len(p) for p in everyone[:mine])

    @torch.no_grad()
    def generate(
        self,
        prompt_ids: list[list[int]],
        n: int,
        sampling: SamplingParams,
        seed: int = 0,
        row_offset: int = 0,
    ) -> Rollout:
        sp = self.vllm.SamplingParams(
            n=n,
            max_tokens=sampling.max_new_tokens,
            logprobs=0,
            seed=seed,
            **settings(sampling, sampling.stop),
        )
        if self.sleep:
            self.llm.wake_up()
        requests, start = self._shared(prompt_ids)
        outputs = self.llm.generate(
            [{"prompt_token_ids": p} for p in requests], sampling_params=sp, use_tqdm=False
        )
        outputs = outputs[start : start + len(prompt_ids)]
        if self.sleep:
            self.llm.sleep(level=1)
        pad = self.tokenizer.pad_token_id
        ids, masks, logps, trunc, group = [], [], [], [], []
        for p, out in enumerate(outputs):
            for c in out.outputs:
                toks = list(c.token_ids) or [pad]
                ids.append(torch.tensor([toks]))
                masks.append(torch.ones(1, len(toks), dtype=torch.long) * bool(c.token_ids))
                logps.append(torch.tensor([sampled_logprobs(c) or [0.0]]))
                trunc.append(c.finish_reason == "length")
                group.append(p)
        pids, pmask = pad_left(prompt_ids, pad)
        return Rollout(
            pids,
            pmask,
            pad_right(ids, pad),
            pad_right(masks, 0),
            pad_right(logps, 0.0).float(),
            torch.tensor(trunc),
            torch.tensor(group),
        )

    def start_episodes(
        self,
        prompt_ids: list[list[int]],
        n: int,
        sampling: SamplingParams,
        seed: int = 0,
        row_offset: int = 0,
    ) -> TurnSampler:
        return VLLMTurns(self, prompt_ids, n, sampling, seed, row_offset)


class VLLMTurns(TurnSampler):
    """Environment episodes on the engine: each turn is one ``generate`` call over every
    trajectory still in its episode, each prompted with its whole prefix (prompt, earlier
    turns, the environment's tokens, as token ids: nothing is re-tokenized). vLLM's
    automatic prefix caching (on by default in its V1 engine) finds the KV blocks of the
    prefix it has already seen, so a turn prefills only the tokens added since the last one.
    Each request draws its own seed from (seed, row, turn)."""

    def __init__(
        self,
        gen: VLLMGenerator,
        prompt_ids: list[list[int]],
        n: int,
        sampling: SamplingParams,
        seed: int,
        row_offset: int,
    ):
        self.gen, self.sp, self.seed, self.row_offset = gen, sampling, seed, row_offset
        self.prefix = [list(prompt_ids[r // n]) for r in range(len(prompt_ids) * n)]
        self.turns = 0
        if gen.sleep:
            gen.llm.wake_up()

    def _params(self, row: int, budget: int, stop: tuple[str, ...]):
        return self.gen.vllm.SamplingParams(
            n=1,
            max_tokens=budget,
            logprobs=0,
            seed=(self.seed * 1_000_003 + (self.row_offset + row) * 7919 + self.turns) & 0x7FFFFFFF,
            **settings(self.sp, stop),
        )

    @torch.no_grad()
    def turn(
        self, rows: list[int], context: list[list[int]], budgets: list[int], stop: tuple[str, ...]
    ) -> list[Turn]:
        for r, c in zip(rows, context):
            self.prefix[r] += list(c)
        outputs = self.gen.llm.generate(
            [{"prompt_token_ids": self.prefix[r]} for r in rows],
            sampling_params=[self._params(r, b, stop) for r, b in zip(rows, budgets)],
            use_tqdm=False,
        )
        turns = []
        for r, out in zip(rows, outputs):
            c = out.outputs[0]
            ids = list(c.token_ids)
            lp = sampled_logprobs(c)
            finish = (
                "length"
                if c.finish_reason == "length"
                else "stop"
                if isinstance(c.stop_reason, str)
                else "eos"
            )
            self.prefix[r] += ids
            turns.append(Turn(ids, lp, finish))
        self.turns += 1
        return turns

    def close(self) -> None:
        if self.gen.sleep:
            self.gen.llm.sleep(level=1)


@hookimpl
def generator(register):
    register(
        "vllm",
        VLLMGenerator,
        schema={
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "gpu_memory_utilization": {
                    "type": "number",
                    "exclusiveMinimum": 0,
                    "maximum": 1,
                    "default": 0.3,
                },
                "tensor_parallel_size": {
                    "type": "integer",
                    "minimum": 1,
                    "default": 1,
                    "description": "training ranks sharing one engine, each "
                    "a shard (torchrun: a divisor of the "
                    "process count)",
                },
                "sleep": {
                    "type": "boolean",
                    "default": True,
                    "description": "free the engine's memory during the update",
                },
                "sync_every": {
                    "type": "integer",
                    "minimum": 1,
                    "default": 1,
                    "description": "optimizer steps between weight syncs",
                },
                "tis_cap": {
                    "type": "number",
                    "exclusiveMinimum": 0,
                    "default": 2.0,
                    "description": "cap of the truncated importance weight",
                },
                "max_model_len": {"type": ["integer", "null"], "minimum": 1, "default": None},
                "enforce_eager": {"type": "boolean", "default": False},
            },
        },
        description="colocated vLLM engine (CUDA), weights synced after updates",
    )
