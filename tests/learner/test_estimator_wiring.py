"""Every ``algorithm`` key an advantage estimator forwards reaches its pure function
(learner/estimators.py -> learner/advantage.py, learner/dcpo.py, learner/trigger.py).

Each case sets one key to a value other than its default and checks that the registered
estimator gives what the pure function gives when called directly with that value, *and*
something else than the estimator gives with the default: a forwarding line that is dropped (the
pure function's default then applies) or that passes the default fails the case. The references
below call the pure functions with every argument written out (the schema's defaults as
literals, ``test_the_reference_defaults_are_the_schemas`` pins them), never through the
estimators' code.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from comm.collapse import collapse_stats
from learner.advantage import (
    avspo_advantages,
    avspo_release_advantages,
    grpo_advantages,
    rloo_advantages,
)
from learner.config import AlgorithmConfig
from learner.dcpo import dcpo_advantages
from learner.estimators import ESTIMATORS, Step

SEED = 7  # make_state's seed: the random strategy's generator

# Five groups of G = 4 (float64): all correct | all incorrect | all correct | mixed | partial
# credit with population std 0.01 (collapsed only when tau > 0.01). With the default tau
# 3 of 5 groups are collapsed: ACR = 0.6 > tau_adapt_0 = 0.5, so AVSPO's default (adaptive)
# trigger fires on the first step; with tau = 0.05, ACR = 0.8.
REWARDS = torch.tensor(
    [1.0] * 4 + [0.0] * 4 + [1.0] * 4 + [1.0, 0.0, 0.0, 0.0] + [0.5, 0.52, 0.5, 0.52],
    dtype=torch.float64,
)
GROUP_IDS = torch.arange(5).repeat_interleave(4)
UNIQUE_KEYS = ["a", "b", "c", "d", "e"]
REPEATED_KEYS = ["a", "b", "a", "c", "b"]  # dcpo: a prompt twice in a step (its sequential path)

# The schema's defaults as the pure functions' keywords (pinned by the first test).
DEFAULTS = dict(
    eps=1e-6,
    tau=1e-6,
    unbiased=True,
    alpha=0.5,
    strategy="stratified",
    r_anchor=0.1,
    k=None,
    augment="both",
    scope="group",
    reward_range=(0.0, 1.0),  # Step's default
    tau_adapt=0.5,  # the adaptive trigger's tau_adapt_0, the first step's threshold
    trigger_acr=None,
)
# config key (or "step.<field>") -> the pure functions' keyword; None: read by the trigger only
KEYWORD = {
    "eps": "eps",
    "tau": "tau",
    "unbiased_std": "unbiased",
    "avspo.alpha": "alpha",
    "avspo.strategy": "strategy",
    "avspo.r_anchor": "r_anchor",
    "avspo.k": "k",
    "avspo.augment": "augment",
    "avspo.release_scope": "scope",
    "step.reward_range": "reward_range",
    "trigger.acr_window": None,
}


def configured(settings: dict) -> AlgorithmConfig:
    """AlgorithmConfig with ``{"section.key": value}`` set (``step.*`` entries skipped)."""
    cfg = AlgorithmConfig()
    for path, value in settings.items():
        *sections, key = path.split(".")
        if sections[:1] == ["step"]:
            continue
        parents = [cfg]
        for s in sections:
            parents.append(getattr(parents[-1], s))
        new = dataclasses.replace(parents[-1], **{key: value})
        for parent, s in zip(reversed(parents[:-1]), reversed(sections), strict=True):
            new = dataclasses.replace(parent, **{s: new})
        cfg = new
    return cfg


def summary(res) -> dict:
    """What an estimator decides, comparable with ``==``."""
    return dict(
        advantages=res.advantages.tolist(),
        collapsed=res.collapsed.tolist(),
        augmented=res.augmented.tolist(),
        k=res.k.tolist(),
        num_virtual=res.num_virtual,
        acr=res.acr,
        triggered=bool(res.triggered),
    )


def run_estimator(name: str, settings: dict, keys=UNIQUE_KEYS, rewards=REWARDS, ids=GROUP_IDS):
    cfg = configured(settings)
    est = ESTIMATORS[name]
    state = est.make_state(cfg, SEED) if est.make_state else None
    given = {k[5:]: v for k, v in settings.items() if k.startswith("step.")}
    step = Step(ids, prompt_keys=list(keys), **given)
    return est.fn(rewards, step, cfg, state)


def reference(name: str, kw: dict, keys=UNIQUE_KEYS, rewards=REWARDS, ids=GROUP_IDS) -> dict:
    """The pure function of estimator ``name`` called with ``kw`` (every keyword written out)."""
    r, g, eps, tau, unbiased = rewards, ids, kw["eps"], kw["tau"], kw["unbiased"]
    if name == "grpo":
        return summary(grpo_advantages(r, g, eps=eps, unbiased=unbiased, tau=tau))
    if name == "dr_grpo":
        return summary(grpo_advantages(r, g, scale_by_std=False, tau=tau))
    if name == "rloo":
        return summary(rloo_advantages(r, g, tau=tau))
    if name == "avspo":
        res = avspo_advantages(
            r, g, tau_adapt=kw["tau_adapt"], alpha=kw["alpha"], tau=tau, eps=eps,
            strategy=kw["strategy"], r_anchor=kw["r_anchor"], reward_range=kw["reward_range"],
            k=kw["k"], unbiased=unbiased, generator=torch.Generator().manual_seed(SEED),
            augment=kw["augment"], trigger_acr=kw["trigger_acr"],
        )  # fmt: skip
        return summary(res)
    if name == "avspo_release":
        res = avspo_release_advantages(r, g, eps=eps, tau=tau, reward_range=kw["reward_range"],
                                       unbiased=unbiased, scope=kw["scope"])  # fmt: skip
        return summary(res)
    assert name == "dcpo"
    if len(set(keys)) == len(keys):
        res, _ = dcpo_advantages(r, g, [None] * len(keys), eps=eps, unbiased=unbiased, tau=tau)
        return summary(res)
    # one group at a time, each seeing the history its prompt's earlier groups left
    history, advantages, augmented = {}, [], []
    for j, key in enumerate(keys):
        rows = g == j
        one = torch.zeros(int(rows.sum()), dtype=torch.long)
        res, (saved,) = dcpo_advantages(
            r[rows], one, [history.get(key)], eps=eps, unbiased=unbiased, tau=tau
        )
        history[key] = saved
        advantages += res.advantages.tolist()
        augmented += res.augmented.tolist()
    stats = collapse_stats(r, g, tau=tau)
    return dict(
        advantages=advantages,
        collapsed=stats.collapsed.tolist(),
        augmented=augmented,
        k=[0] * len(keys),
        num_virtual=0,
        acr=stats.acr,
        triggered=any(augmented),
    )


def keywords(settings: dict, extra: dict) -> dict:
    kw = dict(DEFAULTS)
    kw.update({KEYWORD[p]: v for p, v in settings.items() if KEYWORD[p] is not None})
    return kw | extra


@pytest.mark.parametrize("name", sorted(ESTIMATORS))
@pytest.mark.parametrize("keys", [UNIQUE_KEYS, REPEATED_KEYS], ids=["unique", "repeated"])
def test_the_reference_defaults_are_the_schemas(name, keys):
    assert summary(run_estimator(name, {}, keys)) == reference(name, DEFAULTS, keys)


# (estimator, the non-default settings, the base they are set on, extra reference keywords):
# one key per case, checked against the same estimator on the base alone.
CASES = [
    ("grpo", {"eps": 0.5}, {}, {}),
    ("grpo", {"unbiased_std": False}, {}, {}),
    ("grpo", {"tau": 0.05}, {}, {}),  # the partial-credit group collapses: 0
    ("dr_grpo", {"tau": 0.05}, {}, {}),
    ("rloo", {"tau": 0.05}, {}, {}),
    ("avspo", {"eps": 0.5}, {}, {}),
    ("avspo", {"unbiased_std": False}, {}, {}),
    ("avspo", {"tau": 0.05}, {}, {}),
    # K_j = ceil(4 * 0.6 ** alpha): alpha 0.5 -> ceil(3.10) = 4; alpha 2 -> ceil(1.44) = 2
    ("avspo", {"avspo.alpha": 2.0}, {}, {}),
    ("avspo", {"avspo.strategy": "fixed"}, {}, {}),
    ("avspo", {"avspo.strategy": "opposite"}, {}, {}),
    ("avspo", {"avspo.strategy": "random"}, {}, {}),  # the state's generator
    # the all-incorrect group's virtual values scale with r_anchor, and so do their mean and
    # std: the advantage -mean / (std + eps) moves with r_anchor only through eps
    ("avspo", {"avspo.r_anchor": 0.5}, {"eps": 0.1}, {}),
    ("avspo", {"avspo.k": 1}, {}, {}),
    ("avspo", {"avspo.augment": "incorrect"}, {}, {}),
    ("avspo", {"avspo.augment": "correct"}, {}, {}),
    # r_lo = -1: the all-0 group is no longer at r_lo (stratified from r_obs = 0)
    ("avspo", {"step.reward_range": (-1.0, 1.0)}, {}, {}),
    # the trigger's own collapse test takes tau too: with a window of 2 it hands the estimator
    # this step's ACR as it counts it, 4/5 = 0.8 (3/5 with tau 1e-6); alpha 2: K = ceil(4 *
    # 0.64) = 3 (ceil(4 * 0.36) = 2 at 0.6)
    ("avspo", {"tau": 0.05}, {"trigger.acr_window": 2, "avspo.alpha": 2.0}, {"trigger_acr": 0.8}),
    ("avspo_release", {"eps": 0.5}, {}, {}),
    ("avspo_release", {"unbiased_std": False}, {}, {}),
    ("avspo_release", {"tau": 0.05}, {}, {}),
    ("avspo_release", {"avspo.release_scope": "step"}, {}, {}),  # both labels: nothing fires
    ("avspo_release", {"step.reward_range": (-1.0, 1.0)}, {}, {}),  # v = -1 for the all-1 groups
    ("dcpo", {"eps": 0.5}, {}, {}),
    ("dcpo", {"unbiased_std": False}, {}, {}),
    ("dcpo", {"tau": 0.05}, {}, {}),
]
# each case on the step's prompts; dcpo's also with a prompt twice in the step (sequential)
CASES = [(*c, UNIQUE_KEYS) for c in CASES]
CASES += [(*c[:4], REPEATED_KEYS) for c in CASES if c[0] == "dcpo"]


@pytest.mark.parametrize(
    "name, settings, base, extra, keys",
    CASES,
    ids=[
        f"{c[0]}-{','.join(f'{k}={v}' for k, v in c[1].items())}"
        + ("-repeated" if c[4] is REPEATED_KEYS else "")
        for c in CASES
    ],
)
def test_a_non_default_key_reaches_the_pure_function(name, settings, base, extra, keys):
    got = summary(run_estimator(name, base | settings, keys))
    assert got == reference(name, keywords(base | settings, extra), keys)
    assert got != summary(run_estimator(name, base, keys)), "the key changed nothing here"


def test_every_estimator_and_every_key_it_reads_has_a_case():
    keys = {(c[0], key) for c in CASES for key in c[1]}
    read = {"eps", "tau", "unbiased_std"}
    want = {(n, k) for n in ("grpo", "avspo", "avspo_release", "dcpo") for k in read}
    want |= {("dr_grpo", "tau"), ("rloo", "tau"), ("avspo_release", "avspo.release_scope")}
    want |= {("avspo", f"avspo.{k}") for k in ("alpha", "strategy", "r_anchor", "k", "augment")}
    assert want <= keys
    assert set(ESTIMATORS) == {"grpo", "dr_grpo", "rloo", "avspo", "avspo_release", "dcpo"}


# ---- the trigger: tau_adapt over three steps ----------------------------------------------
# Four groups of G = 2. RISE: step 1 has 3 of 4 groups collapsed (ACR 0.75, J = 5/8), step 2
# all 4 (ACR 1, J = 6/8: J rose), step 3 is step 1 again. FALL: step 2 is all 4 collapsed with
# J = 2/8 (J fell). The adaptive threshold moves once, after step 2:
# tau_3 = clip(tau_2 + eta * sign(J_2 - J_1) * (ACR_2 - tau_2), tau_min, tau_max).
IDS2 = torch.arange(4).repeat_interleave(2)
S1 = [1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 1.0, 0.0]
RISE = [S1, [1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.0, 0.0], S1]
FALL = [S1, [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 1.0], S1]

# (settings, base, steps, step means (None: of the rewards), tau_adapt per step, the trigger's
# ACR per step (None: the step's own))
TRIGGER_CASES = [
    ({}, {}, RISE, None, [0.5, 0.5, 0.505], None),  # 0.5 + 0.01 * (1 - 0.5)
    ({"trigger.policy": "fixed"}, {}, RISE, None, [0.5, 0.5, 0.5], None),
    ({"trigger.policy": "always"}, {}, RISE, None, [0.0, 0.0, 0.0], None),
    ({"trigger.policy": "never"}, {}, RISE, None, [1.0, 1.0, 1.0], None),
    ({"trigger.tau_adapt_0": 0.3}, {}, RISE, None, [0.3, 0.3, 0.307], None),  # 0.3 + 0.01 * 0.7
    ({"trigger.eta": 0.5}, {}, RISE, None, [0.5, 0.5, 0.75], None),  # 0.5 + 0.5 * 0.5
    # eta 1: 0.5 + 1 * (1 - 0.5) = 1.0, clipped to tau_max (0.9 by default)
    ({"trigger.tau_max": 0.6}, {"trigger.eta": 1.0}, RISE, None, [0.5, 0.5, 0.6], None),
    # eta 1, J fell: 0.5 - 1 * (1 - 0.5) = 0.0, clipped to tau_min (0.1 by default)
    ({"trigger.tau_min": 0.3}, {"trigger.eta": 1.0}, FALL, None, [0.5, 0.5, 0.3], None),
    ({"trigger.tau_adapt_0": 0.3}, {"trigger.policy": "fixed"}, RISE, None, [0.3] * 3, None),
    # a window of 2 steps: ACR (3 + 4) / 8 = 0.875 at steps 2 and 3 (4 + 3); 0.5 + 0.01 * 0.375.
    # alpha 4 makes K see it: step 3, K = ceil(2 * 0.875 ** 4) = ceil(1.17) = 2 where this
    # step's own ACR gives ceil(2 * 0.75 ** 4) = ceil(0.63) = 1
    (
        {"trigger.acr_window": 2},
        {"avspo.alpha": 4.0},
        RISE,
        None,
        [0.5, 0.5, 0.50375],
        [0.75, 0.875, 0.875],
    ),
    # J_t is the step's mean_reward when given: 0.9 -> 0.1 is a fall: 0.5 - 0.01 * 0.5
    ({}, {}, RISE, [0.9, 0.1, 0.9], [0.5, 0.5, 0.495], None),
]
TRIGGER_IDS = ["default", "fixed", "always", "never", "tau_adapt_0", "eta", "tau_max", "tau_min",
               "fixed-tau_adapt_0", "acr_window", "step.mean_reward"]  # fmt: skip


def run_trigger(settings: dict, steps, means) -> list:
    cfg = configured(settings)
    est = ESTIMATORS["avspo"]
    state = est.make_state(cfg, SEED)
    out = []
    for t, rewards in enumerate(steps):
        step = Step(IDS2, mean_reward=None if means is None else means[t])
        res = est.fn(torch.tensor(rewards, dtype=torch.float64), step, cfg, state)
        out.append((summary(res), res.metrics["avspo/tau_adapt"], res.metrics["avspo/acr_trigger"]))
    return out


@pytest.mark.parametrize(
    "settings, base, steps, means, taus, windows",
    TRIGGER_CASES,
    ids=TRIGGER_IDS,
)
def test_a_non_default_trigger_key_moves_the_threshold(settings, base, steps, means, taus, windows):
    got = run_trigger(base | settings, steps, means)
    alpha = base.get("avspo.alpha", 0.5)
    want = []
    for t, rewards in enumerate(steps):
        r = torch.tensor(rewards, dtype=torch.float64)
        acr = None if windows is None else windows[t]
        res = avspo_advantages(r, IDS2, tau_adapt=taus[t], trigger_acr=acr, eps=1e-6, tau=1e-6,
                               alpha=alpha, strategy="stratified", unbiased=True)  # fmt: skip
        want.append((summary(res), pytest.approx(taus[t]), acr or res.acr))
    assert got == want
    if settings or means:
        assert got != run_trigger(base, steps, None), "the key changed nothing here"
