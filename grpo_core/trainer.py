"""The GRPO training loop, top to bottom.

Each step: sample G completions for each of P prompts, score them, turn the [P, G] rewards
into advantages with the baseline plugin, then take ``inner_iterations`` optimizer steps on
the clipped surrogate (plus KL to a frozen reference and an entropy bonus), accumulating
gradients over micro-batches of whole groups.
"""

from __future__ import annotations

import copy
import json
import math
import os
import sys
import time
from dataclasses import dataclass

import torch

import grpo_core
from grpo_core import checkpoint, dist
from grpo_core.data import PromptStream, check_fields, read_rows, render_prompt
from grpo_core.errors import UserError
from grpo_core.evaluate import evaluate
from grpo_core.health import HealthMonitor
from grpo_core.losses import Normaliser, kl_penalty, policy_loss, token_logprobs
from grpo_core.metrics import MetricsWriter
from grpo_core.models import is_peft, load_model, load_tokenizer, pick_device
from grpo_core.rewards import score
from grpo_core.rollout import Rollout, SamplingParams, merge
from grpo_core.update import DeepSpeedUpdate, TorchUpdate, deepspeed_config

#: Columns every reward also receives: token count of each completion, and its group.
RESERVED_COLUMNS = ("completion_tokens", "group_ids")


class TrainingError(UserError):
    """The run cannot go on (for example, repeated non-finite losses)."""


@dataclass
class Batch:
    """One step's data: prompts as the dataset gives them (what rewards see), as the model
    sees them (chat template applied) and as token ids; reward columns per prompt."""

    raw: list
    prompts: list[str]
    prompt_ids: list[list[int]]
    columns: dict[str, list]


def completion_logprobs(model, rollout: Rollout, temperature: float, chunk: int,
                        entropy: bool = False):
    """Log-probs (and entropies) of the completion tokens under ``model``: [B, T] each.

    Runs the decoder over prompt + completion and applies the LM head only at completion
    positions, in chunks (see ``token_logprobs``), never over the whole vocabulary at once.
    """
    prompt, pmask = rollout.prompt_ids[rollout.group], rollout.prompt_mask[rollout.group]
    ids = torch.cat([prompt, rollout.completion_ids], 1)
    attn = torch.cat([pmask, rollout.completion_mask], 1)
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    hidden = base.get_decoder()(input_ids=ids, attention_mask=attn,
                                position_ids=(attn.cumsum(-1) - 1).clamp(min=0)).last_hidden_state
    Lp, T = prompt.shape[1], rollout.completion_ids.shape[1]
    h = hidden[:, Lp - 1:Lp - 1 + T]
    sel = rollout.completion_mask.bool()
    lp, ent = token_logprobs(h[sel], base.get_output_embeddings().weight,
                             rollout.completion_ids[sel], temperature, chunk, entropy)
    zeros = torch.zeros(sel.shape, dtype=lp.dtype, device=lp.device)
    return zeros.masked_scatter(sel, lp), (zeros.masked_scatter(sel, ent) if entropy else None)


@torch.no_grad()
def reference_logprobs(reference, ro: Rollout, temperature: float, chunk: int, autocast):
    """Log-probs under the frozen reference: a copy (on its own device), or, for LoRA, the
    policy itself with its adapter disabled."""
    with autocast:
        if is_peft(reference):
            with reference.disable_adapter():
                return completion_logprobs(reference, ro, temperature, chunk)[0]
        where = next(reference.parameters()).device
        out = completion_logprobs(reference, ro.to(where), temperature, chunk)[0]
    return out.to(ro.completion_ids.device)


def make_batch(rows: list[dict], data_cfg: dict, tokenizer) -> Batch:
    prompts = [render_prompt(tokenizer, r[data_cfg["prompt_field"]], data_cfg["chat_template"],
                             data_cfg["system_prompt"]) for r in rows]
    ids = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
    columns = {c: [r[c] for r in rows] for c in data_cfg["columns"]}
    return Batch([r[data_cfg["prompt_field"]] for r in rows], prompts, ids, columns)


def lr_lambda(schedule: str, warmup: int, total: int):
    def f(i: int) -> float:
        if i < warmup:
            return (i + 1) / warmup
        if schedule == "cosine":
            return 0.5 * (1 + math.cos(math.pi * min(1.0, (i - warmup) / max(1, total - warmup))))
        return 1.0

    return f


def step_seed(seed: int, step: int, salt: int = 0) -> int:
    return (seed * 1_000_003 + step * 7919 + salt * 104_729) & 0xFFFFFFFF


def group_std_zero(rewards: torch.Tensor) -> torch.Tensor:
    """[P, G] -> [P] bool: the group's valid rewards are all equal (no learning signal)."""
    ok = torch.isfinite(rewards)
    hi = torch.where(ok, rewards, -torch.inf).amax(-1)
    lo = torch.where(ok, rewards, torch.inf).amin(-1)
    return ~(hi > lo)


def to_grid(values: torch.Tensor, group: torch.Tensor, P: int):
    """Rows [B] -> [P, Gmax] with NaN where a group has fewer rows; also each row's slot."""
    slot = torch.zeros_like(group)
    counts = torch.zeros(P, dtype=torch.long)
    for i, g in enumerate(group.tolist()):
        slot[i] = counts[g]
        counts[g] += 1
    grid = torch.full((P, int(counts.max())), torch.nan)
    grid[group, slot] = values
    return grid, slot


def train(cfg: dict, resume: str | bool | None = None, force: bool = False) -> dict:
    """Run GRPO as configured; returns a summary. ``resume``: True (newest) or a directory."""
    tc, sc, oc = cfg["train"], cfg["sampling"], cfg["output"]
    if tc["threads"]:
        torch.set_num_threads(tc["threads"])
    device = pick_device(tc["device"])
    if device.type == "cuda" and dist.active():
        device = torch.device("cuda", dist.local_rank())
    rank, world = dist.init(device)
    main = rank == 0
    torch.manual_seed(tc["seed"])
    run_dir = oc["dir"]
    if main:
        os.makedirs(run_dir, exist_ok=True)
        with open(os.path.join(run_dir, "config.json"), "w", encoding="utf-8") as f:
            json.dump(cfg, f, indent=2)

    # --- model, reference, plugins, data --------------------------------------------------
    tokenizer = load_tokenizer(cfg["model"])
    policy = load_model(cfg["model"], device)
    reward_fn = grpo_core.create("reward", cfg["reward"]["name"], cfg["reward"]["options"])
    baseline = grpo_core.create("baseline", cfg["baseline"]["name"], cfg["baseline"]["options"])
    kl_ctl = grpo_core.create("kl", cfg["kl"]["name"], cfg["kl"]["options"])
    gen = grpo_core.create("generator", cfg["generator"]["name"], cfg["generator"]["options"])
    gen.setup(policy, tokenizer, device)
    uses_kl = not (getattr(kl_ctl, "constant", False) and kl_ctl.value == 0)
    reference = None
    if uses_kl:  # no reference model at all when the KL coefficient is fixed at 0
        if is_peft(policy):  # LoRA: the base model with the adapter disabled, no second copy
            reference = policy
        else:
            where = "cpu" if cfg["model"]["reference_device"] == "cpu" else device
            reference = copy.deepcopy(policy).to(where).eval().requires_grad_(False)
    reserved = set(cfg["data"]["columns"]) & set(RESERVED_COLUMNS)
    if reserved:
        raise UserError(f"data.columns: {sorted(reserved)} are reserved names the trainer "
                        f"passes to rewards; rename the dataset field")
    rows = read_rows(cfg["data"]["path"], cfg["data"]["split"])
    check_fields(rows, [cfg["data"]["prompt_field"], *cfg["data"]["columns"]], cfg["data"]["path"])
    stream = PromptStream(len(rows), tc["seed"], cfg["data"]["shuffle"])

    params = [p for p in policy.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=tc["lr"], betas=tuple(tc["betas"]),
                            weight_decay=tc["weight_decay"])
    total_updates = tc["steps"] * tc["inner_iterations"]
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lr_lambda(tc["lr_schedule"], tc["warmup_steps"], total_updates))
    start_step = 0
    ckpt_root = os.path.join(run_dir, "checkpoints")
    if resume:
        path = checkpoint.latest(ckpt_root) if resume is True else resume
        if path is None:
            raise UserError(f"--resume: no complete checkpoint under {ckpt_root}")
        meta = checkpoint.load(path, policy, opt, sched)
        checkpoint.check_compatible(meta["fingerprint"], cfg, force)
        kl_ctl.load_state_dict(meta["kl"])
        if meta.get("baseline") is not None and hasattr(baseline, "load_state_dict"):
            baseline.load_state_dict(meta["baseline"])
        stream.position, start_step = meta["data_position"], meta["step"]
    if main:  # a fresh run starts its metrics over; a resumed one drops steps it will redo
        _truncate_metrics(run_dir, start_step)
        if not resume:
            for name in ("samples.jsonl", "samples.txt"):
                if os.path.exists(os.path.join(run_dir, name)):
                    os.remove(os.path.join(run_dir, name))
    metrics_out = MetricsWriter(run_dir, tc["steps"], oc["progress"] and main, oc["tensorboard"],
                                oc["wandb_project"], cfg) if main else None
    health = HealthMonitor(window=cfg["health"]["window"]) if cfg["health"]["enabled"] else None
    ec = cfg["eval"]
    eval_rows = None
    if ec["data"] and ec["every_n_steps"]:
        eval_rows = read_rows(ec["data"], ec["split"])
        check_fields(eval_rows, [cfg["data"]["prompt_field"], *cfg["data"]["columns"]],
                     ec["data"])
        eval_rows = eval_rows[:ec["max_problems"]] if ec["max_problems"] else eval_rows
    best = None
    P, G = tc["prompts_per_step"], sc["group_size"]
    if P % world:
        raise UserError(f"train.prompts_per_step: {P} is not divisible by the {world} processes")
    P_local = P // world
    ds_cfg = deepspeed_config(cfg["deepspeed"])
    if ds_cfg is not None:
        if oc["checkpoint_every"]:
            raise UserError("output.checkpoint_every: checkpoints are not yet supported with "
                            "deepspeed; set it to 0")
        n_micro = -(-P_local // tc["micro_batch_groups"])
        update = DeepSpeedUpdate(policy, params, opt, sched, ds_cfg, n_micro,
                                 tc["micro_batch_groups"] * G, tc["max_grad_norm"])
    else:
        update = TorchUpdate(params, opt, sched, tc["max_grad_norm"])
    sampling = SamplingParams(sc["max_new_tokens"], sc["temperature"], sc["top_p"], sc["top_k"],
                              batch_size=sc["generation_batch_size"])
    autocast = torch.autocast("cuda", dtype=torch.bfloat16,
                              enabled=device.type == "cuda" and cfg["model"]["dtype"] == "auto")
    nonfinite_run, history, t_start = 0, [], time.time()

    for step in range(start_step, tc["steps"]):
        t0 = time.time()
        # --- 1. sample a group of G completions per prompt (this rank's share of prompts) ---
        order = stream.take(P)
        batch = make_batch([rows[i] for i in order[rank * P_local:(rank + 1) * P_local]],
                           cfg["data"], tokenizer)
        seed = step_seed(tc["seed"], step)
        with autocast:
            ro = gen.generate(batch.prompt_ids, G, sampling, seed=seed,
                              row_offset=rank * P_local * G).to(device)
        t_gen = time.time() - t0

        # --- 2. score every completion (groups travel with the rows via ro.group) --------
        t1 = time.time()
        scored = _score(reward_fn, cfg, tokenizer, batch, ro)
        if scored.problem and main:
            print(f"\nwarning (step {step}): {scored.problem}; applied train.reward_failure: "
                  f"{tc['reward_failure']}", file=sys.stderr)
        extra_completions = 0
        zero = group_std_zero(to_grid(scored.rewards, ro.group.cpu(), P_local)[0])
        if tc["resample_zero_std_max"] and zero.any():  # dynamic sampling for flat groups
            ro, scored, extra_completions = _resample(gen, reward_fn, cfg, tokenizer, batch, ro,
                                                      scored, zero, sampling, seed, rank, device)
        greedy_rewards, t_greedy = None, 0.0
        if getattr(baseline, "needs_greedy", False):  # ReMax: one greedy completion per prompt
            tg = time.time()
            greedy = gen.generate(batch.prompt_ids, 1, SamplingParams(
                sc["max_new_tokens"], greedy=True, batch_size=sc["generation_batch_size"]))
            greedy_rewards = _score(reward_fn, cfg, tokenizer, batch, greedy.to(device)).rewards
            t_greedy = time.time() - tg
        t_reward = time.time() - t1 - t_greedy

        # --- 3. reference log-probs; KL as a reward penalty if so placed ------------------
        t2 = time.time()
        mask = ro.completion_mask.float()
        ref_logp = None
        if reference is not None:
            ref_logp = reference_logprobs(reference, ro, sc["temperature"], tc["logprob_chunk"],
                                          autocast)
        is_weights = None
        if getattr(gen, "recompute_old_logprobs", False):  # sampler != trainer numerics
            with torch.no_grad(), autocast:
                old = completion_logprobs(policy, ro, sc["temperature"], tc["logprob_chunk"])[0]
            is_weights = torch.exp(old - ro.logprobs).clamp(max=gen.tis_cap) * mask
            ro.logprobs = old
        rewards = scored.rewards.clone()
        if reference is not None and tc["kl_placement"] == "reward":
            kl_seq = (kl_penalty(ro.logprobs, ref_logp, "k1") * mask).sum(-1).cpu()
            rewards = rewards - kl_ctl.value * kl_seq

        # --- 4. advantages from the baseline, on the [P, G] grid --------------------------
        grid, slot = to_grid(rewards, ro.group.cpu(), P_local)
        adv_grid = baseline.advantages(grid, greedy_rewards)
        adv = torch.nan_to_num(adv_grid[ro.group.cpu(), slot], nan=0.0).to(device)
        keep = torch.isfinite(rewards).to(device)  # dropped (missing) rewards leave the loss
        zero_groups = group_std_zero(grid)
        if tc["drop_zero_std_groups"]:
            keep &= ~zero_groups.to(device)[ro.group]
        loss_mask = mask * keep[:, None]

        # --- 5. policy update: mu passes over the rollout, micro-batches of whole groups ---
        norm = Normaliser(float(dist.all_sum(loss_mask.sum().double()).clamp(min=1)),
                          float(dist.all_sum(keep.sum().double()).clamp(min=1)),
                          float(sc["max_new_tokens"]))
        kl_coef = kl_ctl.value if tc["kl_placement"] == "loss" else 0.0
        stats = {"loss": 0.0, "clip_low_frac": 0.0, "clip_high_frac": 0.0, "kl": 0.0,
                 "entropy": 0.0, "tokens": 0.0, "grad_norm": 0.0, "skipped": 0}
        policy.train()
        for it in range(tc["inner_iterations"]):
            update.zero_grad()
            loss_sum = 0.0
            for mb in _micro_batches(ro.group, P_local, tc["micro_batch_groups"]):
                sub = ro.rows(mb)
                with autocast:
                    logp, ent = completion_logprobs(policy, sub, sc["temperature"],
                                                    tc["logprob_chunk"], entropy=True)
                loss, s = policy_loss(
                    logp, sub.logprobs, adv[mb], loss_mask[mb], clip_low=tc["clip_low"],
                    clip_high=tc["clip_high"], ref_logp=None if ref_logp is None else ref_logp[mb],
                    kl_coef=kl_coef, kl_estimator=tc["kl_estimator"], entropy=ent,
                    entropy_coef=tc["entropy_coef"], aggregation=tc["aggregation"], norm=norm,
                    is_weights=None if is_weights is None else is_weights[mb])
                update.backward(loss)
                loss_sum += float(loss.detach())
                if it == 0:
                    for k in ("clip_low_frac", "clip_high_frac", "kl", "entropy", "tokens"):
                        stats[k] += s[k]
            if it == 0:
                stats["loss"] = loss_sum
            gnorm, applied = update.step(math.isfinite(loss_sum))
            if not applied:  # NaN guard: this update was skipped
                stats["skipped"] += 1
                if main:
                    print(f"\nwarning (step {step}): non-finite loss or gradient; update "
                          f"skipped", file=sys.stderr)
                continue
            stats["grad_norm"] = gnorm
        gen.sync_weights(policy)
        nonfinite_run = nonfinite_run + 1 if stats["skipped"] else 0
        if nonfinite_run >= tc["max_nonfinite_steps"]:
            raise TrainingError(f"non-finite loss or gradient in {nonfinite_run} steps in a row "
                                f"(step {step}); lower train.lr or check the reward")
        t_train = time.time() - t2

        # --- 6. KL controller, metrics, samples, checkpoint ---------------------------------
        tok = dist.all_sum(torch.tensor([stats["tokens"], stats["kl"], stats["entropy"],
                                         stats["clip_low_frac"], stats["clip_high_frac"],
                                         stats["loss"]], dtype=torch.float64)).tolist()
        stats["loss"] = tok[5]  # each rank's part of the global loss, summed
        ntok = max(tok[0], 1.0)
        kl_mean = tok[1] / ntok
        kl_ctl.update(kl_mean, P * G)
        record = _metrics(step, scored.rewards, grid, zero_groups, scored, ro, stats, kl_mean,
                          tok, ntok, kl_ctl.value, extra_completions, device)
        record.update({"lr": sched.get_last_lr()[0], "time/generate": t_gen,
                       "time/reward": t_reward, "time/greedy": t_greedy, "time/train": t_train,
                       "time/step": time.time() - t0})
        if eval_rows is not None and ((step + 1) % ec["every_n_steps"] == 0
                                      or step + 1 == tc["steps"]):
            if main:  # validation on held-out problems, into the same metrics stream
                with torch.no_grad(), autocast:
                    report, _ = evaluate(policy, tokenizer, gen, eval_rows, cfg["data"],
                                         reward_fn, n=ec["n"], temperature=ec["temperature"],
                                         max_new_tokens=sc["max_new_tokens"],
                                         pass_threshold=ec["pass_threshold"],
                                         correct_dimension=ec["correct_dimension"])
                record.update({f"eval/{k}": v for k, v in report.items()
                               if isinstance(v, float) and k != "temperature"})
                metric = ec["keep_best"]
                if metric and record.get(f"eval/{metric}") is not None and (
                        best is None or record[f"eval/{metric}"] > best):
                    best = record[f"eval/{metric}"]
                    policy.save_pretrained(os.path.join(run_dir, "best"))
                    tokenizer.save_pretrained(os.path.join(run_dir, "best"))
                    with open(os.path.join(run_dir, "best", "best.json"), "w") as f:
                        json.dump({"step": step, metric: best}, f)
            dist.barrier()
        if health:
            warnings = health.observe(record)
            record["health"] = warnings
            for w in warnings:
                if main:
                    print(f"\nwarning (step {step}): {w}", file=sys.stderr)
        history.append(record)
        if main:
            metrics_out.write(record)
            if oc["samples_every"] and step % oc["samples_every"] == 0:
                _write_samples(run_dir, step, batch, ro, scored, rewards, adv, tokenizer)
        if oc["checkpoint_every"] and (step + 1) % oc["checkpoint_every"] == 0:
            if main:
                checkpoint.save(ckpt_root, step + 1, policy, opt, sched, {
                    "fingerprint": checkpoint.config_fingerprint(cfg),
                    "config_hash": checkpoint.config_hash(cfg), "kl": kl_ctl.state_dict(),
                    "baseline": baseline.state_dict() if hasattr(baseline, "state_dict") else None,
                    "data_position": stream.position}, oc["keep_last"])
            dist.barrier()

    in_sync = dist.weights_in_sync([p.to(device) for p in policy.parameters()])
    if not in_sync and main:
        print("\nwarning: ranks ended with different weights", file=sys.stderr)
    summary = {"run_dir": run_dir, "steps": len(history), "seconds": time.time() - t_start,
               "world_size": world, "ranks_in_sync": in_sync,
               "first_reward": history[0]["reward"] if history else None,
               "final_reward": history[-1]["reward"] if history else None,
               "reference_model": reference is not None,
               "peak_memory_mb": peak_memory_mb(device),
               "health": health.summary() if health else []}
    if main and oc["save_model"]:
        final = os.path.join(run_dir, "final")
        policy.save_pretrained(final)  # a LoRA run writes the adapter
        tokenizer.save_pretrained(final)
        if is_peft(policy) and cfg["model"]["lora"]["save_merged"]:
            merged = os.path.join(run_dir, "final", "merged")
            policy.merge_and_unload().save_pretrained(merged)
            tokenizer.save_pretrained(merged)
        with open(os.path.join(run_dir, "summary.json"), "w", encoding="utf-8") as f:
            json.dump(summary, f, indent=2)
    dist.barrier()
    return summary


def peak_memory_mb(device: torch.device) -> float:
    """Peak accelerator memory allocated (CUDA) or the process's peak resident size (CPU)."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def reward_inputs(tokenizer, batch: Batch, ro: Rollout) -> tuple[list, list[str], dict]:
    """What a reward is called with, one entry per completion: the dataset prompts, the
    decoded completions, and the columns (dataset fields plus the reserved ones)."""
    texts = tokenizer.batch_decode(ro.completion_ids * ro.completion_mask
                                   + tokenizer.pad_token_id * (1 - ro.completion_mask),
                                   skip_special_tokens=True)
    g = ro.group.cpu().tolist()
    columns = {k: [v[i] for i in g] for k, v in batch.columns.items()}
    columns["completion_tokens"] = ro.completion_mask.sum(-1).tolist()
    columns["group_ids"] = g
    return [batch.raw[i] for i in g], texts, columns


def _score(reward_fn, cfg: dict, tokenizer, batch: Batch, ro: Rollout):
    prompts, texts, columns = reward_inputs(tokenizer, batch, ro)
    return score(reward_fn, cfg["reward"]["name"], prompts, texts, columns, ro.group.cpu(),
                 cfg["train"]["reward_failure"], cfg["train"]["reward_timeout"])


def _resample(gen, reward_fn, cfg, tokenizer, batch, ro, scored, zero, sampling, seed, rank,
              device):
    """Draw extra completions for zero-std groups (up to the cap) and merge them in."""
    from grpo_core.rewards import Scored

    idx = torch.nonzero(zero).squeeze(1).tolist()
    n = cfg["train"]["resample_zero_std_max"]
    sub = Batch([batch.raw[i] for i in idx], [batch.prompts[i] for i in idx],
                [batch.prompt_ids[i] for i in idx],
                {k: [v[i] for i in idx] for k, v in batch.columns.items()})
    extra = gen.generate(sub.prompt_ids, n, sampling, seed=seed ^ 0x5BD1E995,
                         row_offset=rank * 1_000_000).to(device)
    extra_scored = _score(reward_fn, cfg, tokenizer, sub, extra)
    extra.group = torch.tensor(idx, device=device)[extra.group]
    extra.prompt_ids, extra.prompt_mask = ro.prompt_ids, ro.prompt_mask
    merged = merge(ro, extra)
    def cat(a: dict, b: dict, fill) -> dict:
        return {k: list(v) + list(b.get(k, [fill] * extra.size)) for k, v in a.items()}

    return merged, Scored(torch.cat([scored.rewards, extra_scored.rewards]),
                          cat(scored.dimensions, extra_scored.dimensions, math.nan),
                          cat(scored.extras, extra_scored.extras, None),
                          scored.problem or extra_scored.problem), extra.size


def _micro_batches(group: torch.Tensor, P: int, per: int):
    """Row indices of each micro-batch; a micro-batch holds whole groups, never part of one."""
    for s in range(0, P, per):
        rows = torch.nonzero((group >= s) & (group < s + per)).squeeze(1)
        if rows.numel():
            yield rows


def _metrics(step, rewards, grid, zero_groups, scored, ro, stats, kl_mean, tok, ntok, coef,
             extra, device) -> dict:
    """One step's metrics, summed over ranks where they are per-sample."""
    ok = torch.isfinite(rewards)
    r = torch.where(ok, rewards, 0.0).double()
    within = torch.tensor([float(g[torch.isfinite(g)].std(unbiased=False))
                           if torch.isfinite(g).sum() > 0 else 0.0 for g in grid])
    lengths = ro.completion_mask.sum(-1).double().cpu()
    top = float(r[ok].max()) if ok.any() else 0.0
    solved = zero_groups & (torch.where(torch.isfinite(grid), grid, -torch.inf).amax(-1) >= top)
    sums = dist.all_sum(torch.tensor(
        [r.sum(), (r * r).sum(), ok.sum(), len(rewards), within.sum(), len(grid),
         zero_groups.sum(), lengths.sum(), ro.truncated.sum().cpu(), extra, solved.sum()],
        dtype=torch.float64, device=device)).tolist()
    longest = dist.all_max(lengths.max().to(device)) if lengths.numel() else 0.0
    n = max(sums[2], 1.0)
    mean = sums[0] / n
    record = {
        "step": step,
        "samples": int(sums[3]),
        "reward": mean if sums[2] else math.nan,
        "reward_std": math.sqrt(max(sums[1] / n - mean * mean, 0.0)) if sums[2] else math.nan,
        "reward_within_group_std": sums[4] / max(sums[5], 1.0),
        "zero_std_frac": sums[6] / max(sums[5], 1.0),
        "solved_frac": sums[10] / max(sums[5], 1.0),
        "dropped_rewards": int(sums[3] - sums[2]),
        "extra_completions": int(sums[9]),
        "kl": kl_mean,
        "kl_coef": coef,
        "entropy": tok[2] / ntok,
        "policy_loss": stats["loss"],
        "clip_low_frac": tok[3] / ntok,
        "clip_high_frac": tok[4] / ntok,
        "grad_norm": stats["grad_norm"],
        "skipped_updates": stats["skipped"],
        "completion_len": sums[7] / max(sums[3], 1.0),
        "completion_len_max": float(longest),
        "truncated_frac": sums[8] / max(sums[3], 1.0),
    }
    for name, values in scored.dimensions.items():
        v = torch.tensor([float(x) for x in values])
        v = v[torch.isfinite(v)]
        record[f"reward/{name}"] = float(v.mean()) if v.numel() else math.nan
    return record


def _write_samples(run_dir, step, batch, ro, scored, rewards, adv, tokenizer, k: int = 2):
    lines, text = [], []
    for p in range(min(k, len(batch.prompts))):
        rows = torch.nonzero(ro.group == p).squeeze(1).tolist()
        for i in rows:
            comp = tokenizer.decode(ro.completion_ids[i][ro.completion_mask[i].bool()],
                                    skip_special_tokens=True)
            rec = {"step": step, "group": p, "prompt": batch.prompts[p], "completion": comp,
                   "reward": float(rewards[i]), "advantage": float(adv[i]),
                   "dimensions": {n: float(v[i]) for n, v in scored.dimensions.items()},
                   "extras": {n: str(v[i]) for n, v in scored.extras.items()}}
            lines.append(json.dumps(rec))
            text.append(f"--- step {step} group {p} reward {rec['reward']:.3f} "
                        f"advantage {rec['advantage']:+.3f} {rec['dimensions'] or ''}\n"
                        f"PROMPT: {batch.prompts[p]}\nCOMPLETION: {comp}\n")
    try:
        with open(os.path.join(run_dir, "samples.jsonl"), "a", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")
        with open(os.path.join(run_dir, "samples.txt"), "a", encoding="utf-8") as f:
            f.write("\n".join(text) + "\n")
    except OSError as exc:
        raise UserError(f"cannot write samples to {run_dir}: {exc.strerror or exc}") from exc


def _truncate_metrics(run_dir: str, step: int) -> None:
    """Forget metric lines from steps that will be run again (all of them for a fresh run)."""
    path = os.path.join(run_dir, "metrics.jsonl")
    if not os.path.isfile(path):  # absent, or a device or pipe: nothing to read back
        return
    if step == 0:
        open(path, "w", encoding="utf-8").close()
        return
    with open(path, encoding="utf-8") as f:
        kept = [line for line in f if line.strip() and json.loads(line)["step"] < step]
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.writelines(kept)
    os.replace(tmp, path)
