"""Advantage estimators: each a pure function of a [P, G] reward tensor.

NaN marks a missing reward: it is left out of its group's statistics and gets advantage 0.
Statistics are taken in float64 after scaling each group by its largest magnitude, so
rewards near the float limits neither overflow nor lose their advantages.
"""

from __future__ import annotations

import torch

from grpo_core import hookspecs
from grpo_core.hookspecs import hookimpl

GRPO_CORE_API = (2,)


def _valid(rewards: torch.Tensor):
    ok = torch.isfinite(rewards)
    return ok, ok.sum(-1, keepdim=True).double(), torch.where(ok, rewards.double(), 0.0)


def _scaled(rewards: torch.Tensor):
    """(r / s, s, ok, count) with s the per-group max |r| (1 where the group is all zero)."""
    ok, count, r = _valid(rewards)
    s = r.abs().amax(-1, keepdim=True)
    s = torch.where(s > 0, s, torch.ones_like(s))
    return r / s, s, ok, count


def group_mean(rewards: torch.Tensor) -> torch.Tensor:
    """Mean of each group's valid rewards. [P, G] -> [P, 1] float64 (0 for an empty group)."""
    x, s, ok, count = _scaled(rewards)
    return x.sum(-1, keepdim=True) / count.clamp(min=1) * s


def grpo_advantages(rewards: torch.Tensor, eps: float = 1e-6, std: str = "sample") -> torch.Tensor:
    """GRPO (Shao et al. 2024, DeepSeekMath): A_i = (r_i - mean(r)) / (std(r) + eps).

    rewards [P, G] -> [P, G]. ``std`` "sample" divides by G-1 (as torch.std, TRL and verl),
    "population" by G. A group of one or with equal rewards gets 0.
    """
    x, s, ok, count = _scaled(rewards)
    mean = x.sum(-1, keepdim=True) / count.clamp(min=1)
    dev = torch.where(ok, x - mean, 0.0)
    dof = count - 1 if std == "sample" else count
    sd = torch.sqrt(dev.pow(2).sum(-1, keepdim=True) / dof.clamp(min=1))
    adv = dev / (sd + eps / s)  # (r - mean)/(std + eps) with r, mean, std all divided by s
    adv = torch.where(ok & (dof > 0) & (sd > 0), adv, 0.0)
    return adv.to(rewards.dtype)


def rloo_advantages(rewards: torch.Tensor) -> torch.Tensor:
    """RLOO (Kool et al. 2019; Ahmadian et al. 2024): A_i = r_i - mean_{j != i} r_j
    = G/(G-1) (r_i - mean(r)). rewards [P, G] -> [P, G]; 0 for a group of one."""
    x, s, ok, count = _scaled(rewards)
    loo = (x.sum(-1, keepdim=True) - x) / (count - 1).clamp(min=1)
    adv = torch.where(ok & (count > 1), (x - loo) * s, 0.0)
    return adv.to(rewards.dtype)


def remax_advantages(rewards: torch.Tensor, greedy_rewards: torch.Tensor) -> torch.Tensor:
    """ReMax (Li et al. 2023): A_i = r_i - r(greedy completion of the same prompt).
    rewards [P, G], greedy_rewards [P] -> [P, G]."""
    ok = torch.isfinite(rewards) & torch.isfinite(greedy_rewards)[:, None]
    adv = rewards.double() - greedy_rewards.double()[:, None]
    return torch.where(ok, adv, 0.0).to(rewards.dtype)


def dr_grpo_advantages(rewards: torch.Tensor) -> torch.Tensor:
    """Dr. GRPO (Liu et al. 2025): A_i = r_i - mean(r), no division by the std (which
    over-weights easy and hard prompts). rewards [P, G] -> [P, G]."""
    ok, _, r = _valid(rewards)
    return torch.where(ok, r - group_mean(rewards), 0.0).to(rewards.dtype)


def whiten(adv: torch.Tensor, ok: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """(a - batch mean) / (batch std + eps) over the valid entries of the whole batch."""
    a = adv.double()
    n = ok.sum().clamp(min=1)
    scale = torch.where(ok, a, 0.0).abs().max().clamp(min=1e-300)
    x = torch.where(ok, a / scale, 0.0)
    mean = x.sum() / n
    sd = torch.sqrt((torch.where(ok, x - mean, 0.0) ** 2).sum() / (n - 1).clamp(min=1))
    if n < 2 or sd == 0:
        return torch.zeros_like(adv)
    return torch.where(ok, (x - mean) / (sd + eps / scale), 0.0).to(adv.dtype)


def reinforce_pp_advantages(rewards: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """REINFORCE++ with baseline (Hu et al. 2025): subtract the group mean, then whiten
    over the whole batch (global, not per-group, normalisation). [P, G] -> [P, G]."""
    return whiten(dr_grpo_advantages(rewards), torch.isfinite(rewards), eps)


class Estimator(hookspecs.Baseline):
    """A pure estimator ``fn(rewards, **options)`` as a plugin object."""

    def __init__(self, fn, **kw):
        self.fn, self.kw = fn, kw

    def advantages(self, rewards: torch.Tensor, greedy_rewards=None) -> torch.Tensor:
        return self.fn(rewards, **self.kw)


class ReMax(hookspecs.Baseline):
    needs_greedy = True

    def advantages(self, rewards, greedy_rewards=None):
        if greedy_rewards is None:
            raise ValueError("remax needs greedy_rewards [prompts]")
        return remax_advantages(rewards, greedy_rewards)


class Mixed(hookspecs.Baseline):
    """Shrinkage baseline for small groups.

    b_i = w * mean_{j != i} r_j + (1 - w) * m,  w = (G - 1) / (G - 1 + k),
    A_i = r_i - b_i, with ``m`` an EMA of past batches' mean reward
    (m <- decay * m + (1 - decay) * batch mean, updated after the advantages are taken) and
    ``k`` the weight of ``m`` counted in pseudo-samples. Both terms exclude r_i, so the
    baseline stays independent of the sample it is subtracted from (unbiased). With G = 1 it
    is a pure running baseline; with large G it tends to RLOO. Before any EMA exists, w = 1.
    """

    def __init__(self, prior_weight: float = 2.0, decay: float = 0.9):
        self.k, self.decay, self.ema = prior_weight, decay, None

    def advantages(self, rewards: torch.Tensor, greedy_rewards=None) -> torch.Tensor:
        ok, count, r = _valid(rewards)
        loo = (r.sum(-1, keepdim=True) - r) / (count - 1).clamp(min=1)
        if self.ema is None:
            w, m = torch.ones_like(count), 0.0
            w = torch.where(count > 1, w, 0.0)
            usable = count > 1
        else:
            w, m = (count - 1) / (count - 1 + self.k), self.ema
            usable = count > 0
        adv = torch.where(ok & usable, r - (w * loo + (1 - w) * m), 0.0)
        if ok.any():
            batch = float(r[ok].mean())
            self.ema = (
                batch if self.ema is None else (self.decay * self.ema + (1 - self.decay) * batch)
            )
        return adv.to(rewards.dtype)

    def state_dict(self) -> dict:
        return {"ema": self.ema}

    def load_state_dict(self, state: dict) -> None:
        self.ema = state["ema"]


EPS = {"type": "number", "exclusiveMinimum": 0, "default": 1e-6}
NO_OPTIONS = {"type": "object", "properties": {}, "additionalProperties": False}


@hookimpl
def baseline(register):
    register(
        "grpo",
        lambda eps, std: Estimator(grpo_advantages, eps=eps, std=std),
        schema={
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "eps": EPS,
                "std": {"enum": ["sample", "population"], "default": "sample"},
            },
        },
        description="(r - group mean) / (group std + eps)",
    )
    register(
        "rloo",
        lambda: Estimator(rloo_advantages),
        schema=NO_OPTIONS,
        description="r - mean of the other G-1 rewards",
    )
    register(
        "remax",
        ReMax,
        schema=NO_OPTIONS,
        description="r - reward of a greedy completion of the same prompt",
    )
    register(
        "dr_grpo",
        lambda: Estimator(dr_grpo_advantages),
        schema=NO_OPTIONS,
        description="r - group mean, no std division",
    )
    register(
        "reinforce_pp",
        lambda eps: Estimator(reinforce_pp_advantages, eps=eps),
        schema={
            "type": "object",
            "additionalProperties": False,
            "properties": {"eps": EPS},
        },
        description="r - group mean, whitened over the batch",
    )
    register(
        "mixed",
        Mixed,
        schema={
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "prior_weight": {"type": "number", "minimum": 0, "default": 2.0},
                "decay": {"type": "number", "minimum": 0, "maximum": 1, "default": 0.9},
            },
        },
        description="leave-one-out group mean shrunk towards a running batch mean",
    )
