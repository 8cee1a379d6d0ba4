"""The ``vllm`` generator: a colocated vLLM engine for fast rollouts (needs CUDA and vllm).

The engine runs in the training process (V1 multiprocessing off) and shares the GPU
(``gpu_memory_utilization``); it sleeps during the update and wakes for generation when
``sleep`` is on. After every ``sync_every`` optimizer steps the trained weights are loaded
into it. vLLM's sampling log-probs differ slightly from the trainer's (other kernels), so
the trainer recomputes the old log-probs and corrects with a truncated importance weight
min(pi_trainer / pi_vllm, ``tis_cap``) (``recompute_old_logprobs`` below).
"""

from __future__ import annotations

import os

import torch
from torch.distributed.tensor import DTensor

from grpo_core.errors import UserError
from grpo_core.hookspecs import Generator, Turn, TurnSampler, hookimpl
from grpo_core.rollout import Rollout, SamplingParams, pad_left, pad_right

GRPO_CORE_API = (2,)


def settings(sp: SamplingParams, stop: tuple[str, ...]) -> dict:
    """Our sampling settings as vllm.SamplingParams arguments: greedy is temperature 0, top-k
    off is -1 (accepted by every vLLM version; newer ones also take 0), and a stop string is
    kept in the output, as the hf generator keeps the token completing it."""
    return dict(temperature=0.0 if sp.greedy else sp.temperature, top_p=sp.top_p,
                top_k=sp.top_k if sp.top_k > 0 else -1, min_p=sp.min_p,
                repetition_penalty=sp.repetition_penalty, stop=list(stop) or None,
                include_stop_str_in_output=True)


def _whole(t: torch.Tensor) -> torch.Tensor:
    """A parameter whole: gathered from its shards under ddp/fsdp (every rank calls this)."""
    return t.full_tensor() if isinstance(t, DTensor) else t


class VLLMGenerator(Generator):
    recompute_old_logprobs = True
    supports_episodes = True

    def __init__(self, gpu_memory_utilization: float = 0.3, tensor_parallel_size: int = 1,
                 sleep: bool = True, sync_every: int = 1, tis_cap: float = 2.0,
                 max_model_len: int | None = None, enforce_eager: bool = False):
        self.opts = dict(gpu_memory_utilization=gpu_memory_utilization,
                         tensor_parallel_size=tensor_parallel_size, max_model_len=max_model_len,
                         enforce_eager=enforce_eager)
        self.sleep, self.sync_every, self.tis_cap = sleep, sync_every, tis_cap
        self.llm, self.updates = None, 0

    def setup(self, model, tokenizer, device) -> None:
        if device.type != "cuda":
            raise UserError("generator vllm: needs a CUDA device (train.device); use the hf "
                            "generator on CPU")
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # engine in this process
        try:
            import vllm
        except ImportError as exc:
            raise UserError("generator vllm: vllm is not installed (pip install "
                            "'grpo-core[vllm]')") from exc
        self.vllm = vllm
        self.tokenizer = tokenizer
        path = model.config._name_or_path
        kw = dict(model=path, tokenizer=path, dtype="bfloat16", enable_sleep_mode=self.sleep,
                  **{k: v for k, v in self.opts.items() if v is not None})
        try:
            self.llm = vllm.LLM(logprobs_mode="processed_logprobs", **kw)
        except TypeError:  # vLLM before 0.10.2 has no logprobs_mode
            self.llm = vllm.LLM(**kw)
        self.sync_weights(model, force=True)
        if self.sleep:
            self.llm.sleep(level=1)

    def _engine_model(self):
        engine = self.llm.llm_engine
        executor = getattr(engine, "model_executor", None)
        worker = executor.driver_worker
        worker = getattr(worker, "worker", worker)
        return worker.model_runner.model

    def sync_weights(self, model, force: bool = False) -> None:
        """Load the trained weights into the engine (every ``sync_every`` updates)."""
        self.updates += 1
        if not force and self.updates % self.sync_every:
            return
        base = model.get_base_model() if hasattr(model, "merge_and_unload") else model
        weights = ((k, _whole(v).detach().to(torch.bfloat16)) for k, v in base.state_dict().items())
        if self.sleep and not force:
            self.llm.wake_up()
        self._engine_model().load_weights(weights=weights)
        if hasattr(self.llm, "reset_prefix_cache"):
            self.llm.reset_prefix_cache()
        if self.sleep and not force:
            self.llm.sleep(level=1)

    @torch.no_grad()
    def generate(self, prompt_ids: list[list[int]], n: int, sampling: SamplingParams,
                 seed: int = 0, row_offset: int = 0) -> Rollout:
        sp = self.vllm.SamplingParams(n=n, max_tokens=sampling.max_new_tokens, logprobs=0,
                                      seed=seed, **settings(sampling, sampling.stop))
        if self.sleep:
            self.llm.wake_up()
        outputs = self.llm.generate([{"prompt_token_ids": p} for p in prompt_ids],
                                    sampling_params=sp, use_tqdm=False)
        if self.sleep:
            self.llm.sleep(level=1)
        pad = self.tokenizer.pad_token_id
        ids, masks, logps, trunc, group = [], [], [], [], []
        for p, out in enumerate(outputs):
            for c in out.outputs:
                toks = list(c.token_ids) or [pad]
                ids.append(torch.tensor([toks]))
                masks.append(torch.ones(1, len(toks), dtype=torch.long) * bool(c.token_ids))
                lp = [next(iter(d.values())).logprob if d else 0.0 for d in (c.logprobs or [])]
                logps.append(torch.tensor([lp + [0.0] * (len(toks) - len(lp))]))
                trunc.append(c.finish_reason == "length")
                group.append(p)
        pids, pmask = pad_left(prompt_ids, pad)
        return Rollout(pids, pmask, pad_right(ids, pad), pad_right(masks, 0),
                       pad_right(logps, 0.0).float(), torch.tensor(trunc), torch.tensor(group))


    def start_episodes(self, prompt_ids: list[list[int]], n: int, sampling: SamplingParams,
                       seed: int = 0, row_offset: int = 0) -> TurnSampler:
        return VLLMTurns(self, prompt_ids, n, sampling, seed, row_offset)


class VLLMTurns(TurnSampler):
    """Environment episodes on the engine: each turn is one ``generate`` call over every
    trajectory still in its episode, each prompted with its whole prefix (prompt, earlier
    turns, the environment's tokens, as token ids: nothing is re-tokenized). vLLM's
    automatic prefix caching (on by default in its V1 engine) finds the KV blocks of the
    prefix it has already seen, so a turn prefills only the tokens added since the last one.
    Each request draws its own seed from (seed, row, turn)."""

    def __init__(self, gen: VLLMGenerator, prompt_ids: list[list[int]], n: int,
                 sampling: SamplingParams, seed: int, row_offset: int):
        self.gen, self.sp, self.seed, self.row_offset = gen, sampling, seed, row_offset
        self.prefix = [list(prompt_ids[r // n]) for r in range(len(prompt_ids) * n)]
        self.turns = 0
        if gen.sleep:
            gen.llm.wake_up()

    def _params(self, row: int, budget: int, stop: tuple[str, ...]):
        return self.gen.vllm.SamplingParams(
            n=1, max_tokens=budget, logprobs=0,
            seed=(self.seed * 1_000_003 + (self.row_offset + row) * 7919 + self.turns)
            & 0x7FFFFFFF, **settings(self.sp, stop))

    @torch.no_grad()
    def turn(self, rows: list[int], context: list[list[int]], budgets: list[int],
             stop: tuple[str, ...]) -> list[Turn]:
        for r, c in zip(rows, context):
            self.prefix[r] += list(c)
        outputs = self.gen.llm.generate([{"prompt_token_ids": self.prefix[r]} for r in rows],
                                        sampling_params=[self._params(r, b, stop)
                                                         for r, b in zip(rows, budgets)],
                                        use_tqdm=False)
        turns = []
        for r, out in zip(rows, outputs):
            c = out.outputs[0]
            ids = list(c.token_ids)
            lp = [next(iter(d.values())).logprob if d else 0.0 for d in (c.logprobs or [])]
            finish = "length" if c.finish_reason == "length" else \
                "stop" if isinstance(c.stop_reason, str) else "eos"
            self.prefix[r] += ids
            turns.append(Turn(ids, lp[:len(ids)] + [0.0] * (len(ids) - len(lp)), finish))
        self.turns += 1
        return turns

    def close(self) -> None:
        if self.gen.sleep:
            self.gen.llm.sleep(level=1)


@hookimpl
def generator(register):
    register("vllm", VLLMGenerator, schema={
        "type": "object", "additionalProperties": False,
        "properties": {
            "gpu_memory_utilization": {"type": "number", "exclusiveMinimum": 0, "maximum": 1,
                                       "default": 0.3},
            "tensor_parallel_size": {"type": "integer", "minimum": 1, "default": 1},
            "sleep": {"type": "boolean", "default": True,
                      "description": "free the engine's memory during the update"},
            "sync_every": {"type": "integer", "minimum": 1, "default": 1,
                           "description": "optimizer steps between weight syncs"},
            "tis_cap": {"type": "number", "exclusiveMinimum": 0, "default": 2.0,
                        "description": "cap of the truncated importance weight"},
            "max_model_len": {"type": ["integer", "null"], "minimum": 1, "default": None},
            "enforce_eager": {"type": "boolean", "default": False},
        },
    }, description="colocated vLLM engine (CUDA), weights synced after updates")
