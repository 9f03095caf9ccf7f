"""The advantage estimators by name. Every one is called the same way,

    estimator.fn(rewards, step, cfg, state) -> AdvantageResult

with ``rewards`` ``[N]``, ``step`` a :class:`Step` (the groups and what is known of them), ``cfg``
the AlgorithmConfig and ``state`` the estimator's own state object, made once per run by its
``make_state(cfg, seed)`` (None for the stateless ones). The stage looks the name up, holds the
state (and checkpoints it) and never special-cases one. Stateful estimators: ``avspo`` (its
trigger: threshold, ACR window; the virtual rewards' RNG) and ``dcpo`` (each prompt's history).

Every estimator logs what it did to collapsed groups (:func:`augmentation_metrics`: zeros for
GRPO, Dr. GRPO and RLOO, so runs of every method plot side by side); ``avspo``, the one with a
trigger, also its decision's inputs, ``avspo/tau_adapt`` and ``avspo/acr_trigger``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, NamedTuple

import torch
from torch import Tensor

from learner.advantage import (
    AdvantageResult,
    avspo_advantages,
    avspo_release_advantages,
    grpo_advantages,
    rloo_advantages,
)
from learner.dcpo import PromptHistory, dcpo_advantages, dcpo_sequential
from learner.trigger import AVSPOTrigger


class Step(NamedTuple):
    """What an estimator knows of the step beyond the rewards."""

    group_ids: Tensor  # [N] each sample's group
    prompt_keys: list[str] | None = None  # each group's prompt, in group order
    mean_reward: float | None = None  # J_t over every generated sample; None: mean of rewards
    reward_range: tuple[float, float] = (0.0, 1.0)  # the task's (r_lo, r_hi)


AUGMENTATION_KEYS = (
    "avspo/triggered",
    "avspo/k",
    "avspo/virtual_samples",
    "avspo/augmented_groups",
)
TRIGGER_KEYS = ("avspo/tau_adapt", "avspo/acr_trigger")


@dataclasses.dataclass(frozen=True)
class Estimator:
    fn: Callable[[Tensor, Step, Any, Any], AdvantageResult]
    make_state: Callable[[Any, int], Any] | None = None  # (cfg, seed) -> the run's state
    metrics: tuple[str, ...] = ()  # what it logs every step: 0 in a step with no group to train
    sections: tuple[str, ...] = ()  # the estimator-specific AlgorithmConfig sections it reads


ESTIMATORS: dict[str, Estimator] = {}


def register_estimator(
    name: str,
    make_state: Callable | None = None,
    metrics: tuple[str, ...] = (),
    sections: tuple[str, ...] = (),
) -> Callable:
    def deco(fn):
        if name in ESTIMATORS:
            raise ValueError(f"advantage estimator {name!r} registered twice")
        ESTIMATORS[name] = Estimator(fn, make_state, metrics, sections)
        return fn

    return deco


def get_estimator(name: str) -> Estimator:
    try:
        return ESTIMATORS[name]
    except KeyError:
        raise KeyError(
            f"unknown advantage estimator {name!r}; registered: {sorted(ESTIMATORS)}"
        ) from None


def unread_sections(name: str) -> list[str]:
    """The ``algorithm.<section>`` keys that only other estimators read: changing one cannot
    change a run of ``name`` (a resume lets them differ).

    >>> unread_sections("grpo")
    ['algorithm.avspo', 'algorithm.trigger']
    >>> unread_sections("avspo_release")
    ['algorithm.trigger']
    """
    every = {s for e in ESTIMATORS.values() for s in e.sections}
    return [f"algorithm.{s}" for s in sorted(every - set(get_estimator(name).sections))]


def augmentation_metrics(result: AdvantageResult) -> dict[str, float]:
    """What an estimator did to collapsed groups: its decision (``avspo/triggered``, which may
    find no group to augment), the groups it gave a signal (``avspo/augmented_groups``), the
    virtual samples and their mean K over augmented groups."""
    n_aug = int(result.augmented.sum())
    return {
        "avspo/triggered": float(result.triggered),
        "avspo/k": float(result.k.sum()) / n_aug if n_aug else 0.0,
        "avspo/virtual_samples": float(result.num_virtual),
        "avspo/augmented_groups": float(n_aug),
    }


def _with_metrics(result: AdvantageResult, metrics: dict[str, float]) -> AdvantageResult:
    return dataclasses.replace(result, metrics=result.metrics | metrics)


@register_estimator("grpo", metrics=AUGMENTATION_KEYS)
def _grpo(rewards, step, cfg, state=None):
    result = grpo_advantages(
        rewards, step.group_ids, eps=cfg.eps, unbiased=cfg.unbiased_std, tau=cfg.tau
    )
    return _with_metrics(result, augmentation_metrics(result))  # all 0: nothing augmented


@register_estimator("dr_grpo", metrics=AUGMENTATION_KEYS)
def _dr_grpo(rewards, step, cfg, state=None):
    result = grpo_advantages(rewards, step.group_ids, scale_by_std=False, tau=cfg.tau)
    return _with_metrics(result, augmentation_metrics(result))


@register_estimator("rloo", metrics=AUGMENTATION_KEYS)
def _rloo(rewards, step, cfg, state=None):
    result = rloo_advantages(rewards, step.group_ids, tau=cfg.tau)
    return _with_metrics(result, augmentation_metrics(result))


class AVSPOState:
    """The ``avspo`` estimator's state: its trigger and the RNG of ``random`` virtual rewards."""

    def __init__(self, cfg, seed: int):
        self.trigger = AVSPOTrigger(cfg.trigger, tau=cfg.tau)
        self.generator = torch.Generator().manual_seed(seed)

    def state_dict(self) -> dict:
        return self.trigger.state_dict() | {"generator": self.generator.get_state().tolist()}

    def load_state_dict(self, state: dict) -> None:
        self.trigger.load_state_dict(state)
        self.generator.set_state(torch.tensor(state["generator"], dtype=torch.uint8))


@register_estimator(
    "avspo",
    make_state=AVSPOState,
    metrics=AUGMENTATION_KEYS + TRIGGER_KEYS,
    sections=("avspo", "trigger"),
)
def _avspo(rewards, step, cfg, state: AVSPOState):
    a = cfg.avspo

    def estimate(tau_adapt: float, trigger_acr: float | None) -> AdvantageResult:
        return avspo_advantages(
            rewards,
            step.group_ids,
            tau_adapt=tau_adapt,
            alpha=a.alpha,
            tau=cfg.tau,
            eps=cfg.eps,
            strategy=a.strategy,
            r_anchor=a.r_anchor,
            reward_range=step.reward_range,
            k=a.k,
            unbiased=cfg.unbiased_std,
            generator=state.generator,
            augment=a.augment,
            trigger_acr=trigger_acr,
        )

    j_t = float(rewards.double().mean()) if step.mean_reward is None else step.mean_reward
    result = state.trigger.step(rewards, step.group_ids, j_t, estimate)
    return _with_metrics(result, augmentation_metrics(result) | state.trigger.last)


@register_estimator("avspo_release", metrics=AUGMENTATION_KEYS, sections=("avspo",))
def _avspo_release(rewards, step, cfg, state=None):
    # no threshold and no trigger state: the rule fires on single-label groups (or steps)
    result = avspo_release_advantages(
        rewards,
        step.group_ids,
        eps=cfg.eps,
        tau=cfg.tau,
        reward_range=step.reward_range,
        unbiased=cfg.unbiased_std,
        scope=cfg.avspo.release_scope,
    )
    return _with_metrics(result, augmentation_metrics(result))


@register_estimator(
    "dcpo",
    make_state=lambda cfg, seed: PromptHistory(),
    metrics=(*AUGMENTATION_KEYS, "dcpo/history_groups"),
)
def _dcpo(rewards, step, cfg, history: PromptHistory):
    keys = step.prompt_keys
    if keys is None:
        raise ValueError("the dcpo estimator needs each group's prompt key (its history)")
    prior = [history.stats.get(k) for k in keys]
    # groups whose advantage used history (the prompt's earlier visits, this step's included)
    used = sum(
        p is not None or k in keys[:i] for i, (k, p) in enumerate(zip(keys, prior, strict=True))
    )
    if len(set(keys)) == len(keys):
        result, updated = dcpo_advantages(
            rewards, step.group_ids, prior, eps=cfg.eps, unbiased=cfg.unbiased_std, tau=cfg.tau
        )
        for key, saved in zip(keys, updated, strict=True):
            history.stats[key] = list(saved)
    else:  # a prompt twice in one step: its second group sees the first one's update
        result = dcpo_sequential(rewards, step.group_ids, keys, cfg, history)
    return _with_metrics(
        result, augmentation_metrics(result) | {"dcpo/history_groups": float(used)}
    )
