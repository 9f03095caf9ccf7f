"""The advantage estimators by name: every one has the same signature, so the advantage stage
looks the configured name up and never special-cases one."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from learner.advantage import (
    AdvantageResult,
    avspo_advantages,
    avspo_release_advantages,
    grpo_advantages,
    rloo_advantages,
)
from learner.dcpo import dcpo_advantages, dcpo_sequential

# Registry: every estimator has the signature fn(rewards, group_ids, cfg, *, tau_adapt,
# reward_range, generator, history, trigger_acr) -> AdvantageResult, where cfg is an
# AlgorithmConfig, history a PromptHistory (per-prompt state, for the estimators that keep one)
# or None, and trigger_acr the windowed ACR the trigger uses (None: the step's). The
# caller looks the name up and never special-cases one.

Estimator = Callable[..., AdvantageResult]
ESTIMATORS: dict[str, Estimator] = {}


def register_estimator(name: str) -> Callable[[Estimator], Estimator]:
    def deco(fn: Estimator) -> Estimator:
        if name in ESTIMATORS:
            raise ValueError(f"advantage estimator {name!r} registered twice")
        ESTIMATORS[name] = fn
        return fn

    return deco


def get_estimator(name: str) -> Estimator:
    try:
        return ESTIMATORS[name]
    except KeyError:
        raise KeyError(
            f"unknown advantage estimator {name!r}; registered: {sorted(ESTIMATORS)}"
        ) from None


@register_estimator("grpo")
def _grpo(
    rewards, group_ids, cfg, *, tau_adapt, reward_range, generator, history=None, trigger_acr=None
):
    return grpo_advantages(rewards, group_ids, eps=cfg.eps, unbiased=cfg.unbiased_std, tau=cfg.tau)


@register_estimator("dr_grpo")
def _dr_grpo(
    rewards, group_ids, cfg, *, tau_adapt, reward_range, generator, history=None, trigger_acr=None
):
    return grpo_advantages(rewards, group_ids, scale_by_std=False, tau=cfg.tau)


@register_estimator("rloo")
def _rloo(
    rewards, group_ids, cfg, *, tau_adapt, reward_range, generator, history=None, trigger_acr=None
):
    return rloo_advantages(rewards, group_ids, tau=cfg.tau)


@register_estimator("avspo")
def _avspo(
    rewards, group_ids, cfg, *, tau_adapt, reward_range, generator, history=None, trigger_acr=None
):
    a = cfg.avspo
    return avspo_advantages(
        rewards,
        group_ids,
        tau_adapt=tau_adapt,
        alpha=a.alpha,
        tau=cfg.tau,
        eps=cfg.eps,
        strategy=a.strategy,
        r_anchor=a.r_anchor,
        reward_range=reward_range,
        k=a.k,
        unbiased=cfg.unbiased_std,
        generator=generator,
        augment=a.augment,
        trigger_acr=trigger_acr,
    )


@register_estimator("avspo_release")
def _avspo_release(
    rewards, group_ids, cfg, *, tau_adapt, reward_range, generator, history=None, trigger_acr=None
):
    # tau_adapt and the trigger play no part: the rule fires on single-label groups (or steps).
    return avspo_release_advantages(
        rewards,
        group_ids,
        eps=cfg.eps,
        tau=cfg.tau,
        reward_range=reward_range,
        unbiased=cfg.unbiased_std,
        scope=cfg.avspo.release_scope,
    )


@register_estimator("dcpo")
def _dcpo(
    rewards, group_ids, cfg, *, tau_adapt, reward_range, generator, history=None, trigger_acr=None
):
    if history is None or history.keys is None:
        raise ValueError("the dcpo estimator needs each group's prompt key (its history)")
    # A prompt twice in one step: its second group sees the first one's update.
    keys = history.keys
    prior = [history.stats.get(k) for k in keys]
    used = sum(
        p is not None or k in keys[:i] for i, (k, p) in enumerate(zip(keys, prior, strict=True))
    )
    if len(set(keys)) == len(keys):
        result, updated = dcpo_advantages(
            rewards, group_ids, prior, eps=cfg.eps, unbiased=cfg.unbiased_std, tau=cfg.tau
        )
        for key, state in zip(keys, updated, strict=True):
            history.stats[key] = list(state)
    else:
        result = dcpo_sequential(rewards, group_ids, cfg, history)
    # groups whose advantage used history (the prompt's earlier visits, this step's included)
    return dataclasses.replace(result, metrics={"dcpo/history_groups": float(used)})
