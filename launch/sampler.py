"""Which training prompts a step generates for (``trainer.prompt_sampler``).

``uniform`` (the default, :class:`PromptSampler`): seeded passes over the train split, reshuffled
each pass; every prompt once per pass. Collapse does not enter.

``collapse_aware`` (:class:`CollapseAwareSampler`): prompts whose groups were *mixed* (not
collapsed) are drawn more often, prompts that were always solved or never solved less often, with
a floor so that none is starved. The idea is GRESO's (Zheng et al., "Act Only When It Pays:
Efficient Reinforcement Learning for LLM Reasoning via Selective Rollouts", arXiv 2506.02177):
prompts that were uninformative (zero reward variance) in one epoch tend to stay so in the next,
so their history predicts collapse before any rollout. GRESO *skips* predicted-uninformative
prompts with a pre-rollout filter; here they are *down-weighted* in a weighted draw instead, and
the step draws exactly ``trainer.prompts_per_step`` prompts per round as the uniform sampler does:
no extra rollouts (DAPO's dynamic sampling, ``algorithm.dynamic_sampling``, still composes: its
extra rounds draw from this sampler too).

The math (ours; every constant is a config key). Prompt i has discounted counts of its mixed and
collapsed groups, m_i and c_i, updated after every step t in which it had groups::

    m_i <- gamma ** (t - t_i) * m_i + (mixed groups of i at step t)
    c_i <- gamma ** (t - t_i) * c_i + (collapsed groups of i at step t),   t_i <- t

(gamma = ``trainer.sampler_decay`` per step: evidence from an older policy counts less, and a
prompt unseen for long drifts back to the prior, so it is tried again). Its estimated chance of a
mixed group is the mean of the Beta(m_i + a, c_i + a) posterior, its weight floored::

    p_i = (m_i' + a) / (m_i' + c_i' + 2 a),   m_i' = gamma ** (t - t_i) * m_i (c_i' likewise)
    w_i = max(f, p_i ** e)

with a = ``trainer.sampler_prior`` (an unseen prompt has p = 1/2: above a prompt seen collapsed,
so unseen prompts are tried early), f = ``trainer.sampler_floor``, e =
``trainer.sampler_exponent`` (e > 1 sharpens the preference, e -> 0 makes it uniform). A
round draws k prompts without replacement with probabilities proportional to w (Efraimidis and
Spirakis: key_i = log(u_i) / w_i, u_i ~ U(0, 1] from the sampler's ``random.Random``, the k
largest keys, in key order = sequential weighted draws). Prompts drawn since the last update
(earlier DAPO rounds of the same step) are left out of later rounds, unless fewer than k remain.
Starvation bound: every weight is in [f, 1], so each draw picks any prompt not yet drawn in its
step with probability >= f / N (N = train prompts). What this changes: the policy gradient is
taken over a prompt distribution tilted towards mixed prompts, with no importance correction
(DAPO's dynamic sampling, too, trains only on the groups it kept).

Collapse is the ACR monitor's (diagnostics/acr.py): population reward std < ``algorithm.tau``,
or one sample; the driver (launch/loop.py) computes it on the rewards the monitor sees and calls
:meth:`CollapseAwareSampler.update` after each step with every group it generated. The sampler
keeps its own statistics (not the monitor's ``prompt_history``) because it discounts them by age;
they are JSON and go into checkpoints, so a resume continues the identical draws.

Shared by both samplers: ``next(k)``, ``update(keys, collapsed)`` (a no-op for uniform),
``state_dict()`` / ``load_state_dict()``.

>>> from reward.tasks import Problem
>>> ps = [Problem(f"u{i}", f"q{i}", f"p{i}", str(i)) for i in range(4)]
>>> s = CollapseAwareSampler(ps, seed=0, prior=1.0, floor=0.05, exponent=1.0, decay=1.0)
>>> s.update(["u0", "u1", "u2"], [True, True, False])  # u0, u1 collapsed once, u2 mixed
>>> [round(s.weight(p.uid), 4) for p in ps]  # (0 + 1) / (1 + 2), (1 + 1) / (1 + 2), unseen 1/2
[0.3333, 0.3333, 0.6667, 0.5]
"""

from __future__ import annotations

import math
import random

from reward.tasks import Problem

SAMPLERS = ("uniform", "collapse_aware")


class PromptSampler:
    """Seeded passes over the train split, reshuffled each epoch; its state is checkpointed."""

    kind = "uniform"

    def __init__(self, problems: list[Problem], seed: int):
        self.problems, self.rng, self.order, self.pos = problems, random.Random(seed), [], 0

    def next(self, k: int) -> list[Problem]:
        out = []
        while len(out) < k:
            if self.pos >= len(self.order):
                self.order, self.pos = list(range(len(self.problems))), 0
                self.rng.shuffle(self.order)
            out.append(self.problems[self.order[self.pos]])
            self.pos += 1
        return out

    def update(self, keys: list[str], collapsed: list[bool]) -> None:
        """Collapse does not change the uniform order."""

    def state_dict(self) -> dict:
        version, internal, gauss = self.rng.getstate()
        return {"order": self.order, "pos": self.pos, "rng": [version, list(internal), gauss]}

    def load_state_dict(self, state: dict) -> None:
        self.order, self.pos = list(state["order"]), int(state["pos"])
        version, internal, gauss = state["rng"]
        self.rng.setstate((version, tuple(internal), gauss))


class CollapseAwareSampler:
    """Weighted draws by each prompt's discounted collapse history (module docstring)."""

    kind = "collapse_aware"

    def __init__(
        self,
        problems: list[Problem],
        seed: int,
        *,
        prior: float,
        floor: float,
        exponent: float,
        decay: float,
    ):
        self.problems, self.rng = problems, random.Random(seed)
        self.prior, self.floor, self.exponent, self.decay = prior, floor, exponent, decay
        self.step = 0  # updates so far
        self.stats: dict[str, list[float]] = {}  # uid -> [m, c, step of the last update]
        self.drawn: list[int] = []  # indices drawn since the last update (this step's rounds)

    def estimate(self, uid: str) -> float:
        """p = posterior mean chance of a mixed group, with the counts discounted to now."""
        m, c, last = self.stats.get(uid, (0.0, 0.0, self.step))
        age = self.decay ** (self.step - last)
        return (age * m + self.prior) / (age * (m + c) + 2 * self.prior)

    def weight(self, uid: str) -> float:
        """w = max(floor, p ** exponent), in [floor, 1]."""
        return max(self.floor, self.estimate(uid) ** self.exponent)

    def next(self, k: int) -> list[Problem]:
        if not self.problems:
            raise ValueError("no training prompts to draw from")
        taken = set(self.drawn)
        pool = [i for i in range(len(self.problems)) if i not in taken]
        if len(pool) < k:  # the step has drawn (almost) everything: a new pass
            self.drawn, pool = [], list(range(len(self.problems)))
        out: list[int] = []
        while len(out) < k:  # k > N: whole passes, as the uniform sampler repeats epochs
            keys = [
                (math.log(1.0 - self.rng.random()) / self.weight(self.problems[i].uid), i)
                for i in pool
            ]
            keys.sort(reverse=True)
            out += [i for _, i in keys[: k - len(out)]]
            pool = list(range(len(self.problems)))
        self.drawn += out
        return [self.problems[i] for i in out]

    def update(self, keys: list[str], collapsed: list[bool]) -> None:
        """One step's groups: each group's prompt uid and whether it collapsed (a prompt may
        have several groups: DAPO rounds, or k > N)."""
        if len(keys) != len(collapsed):
            raise ValueError(f"{len(keys)} prompt keys for {len(collapsed)} groups")
        self.step += 1
        seen: dict[str, list[float]] = {}
        for uid, was in zip(keys, collapsed, strict=True):
            if uid not in seen:
                m, c, last = self.stats.get(uid, (0.0, 0.0, self.step))
                age = self.decay ** (self.step - last)
                seen[uid] = [age * m, age * c, self.step]
            seen[uid][1 if was else 0] += 1.0
        self.stats |= seen
        self.drawn = []

    def state_dict(self) -> dict:
        version, internal, gauss = self.rng.getstate()
        return {
            "sampler": self.kind,
            "step": self.step,
            "stats": {k: list(v) for k, v in self.stats.items()},
            "drawn": list(self.drawn),
            "rng": [version, list(internal), gauss],
        }

    def load_state_dict(self, state: dict) -> None:
        if state.get("sampler") != self.kind:
            raise ValueError(
                f"the checkpoint's sampler state is not a {self.kind} sampler's "
                f"(it is {state.get('sampler', 'uniform')}'s)"
            )
        self.step = int(state["step"])
        self.stats = {k: [float(m), float(c), int(t)] for k, (m, c, t) in state["stats"].items()}
        self.drawn = [int(i) for i in state["drawn"]]
        version, internal, gauss = state["rng"]
        self.rng.setstate((version, tuple(internal), gauss))


def make_sampler(problems: list[Problem], trainer) -> PromptSampler | CollapseAwareSampler:
    """The sampler ``trainer.prompt_sampler`` names (``trainer``: launch.config.TrainerConfig),
    seeded with ``trainer.seed``."""
    if trainer.prompt_sampler == "uniform":
        return PromptSampler(problems, trainer.seed)
    if trainer.prompt_sampler == "collapse_aware":
        return CollapseAwareSampler(
            problems,
            trainer.seed,
            prior=trainer.sampler_prior,
            floor=trainer.sampler_floor,
            exponent=trainer.sampler_exponent,
            decay=trainer.sampler_decay,
        )
    raise ValueError(f"trainer.prompt_sampler: {trainer.prompt_sampler!r} is not one of {SAMPLERS}")


def mixed_token_share(lengths: list[int], collapsed: list[bool]) -> float:
    """``rollout/mixed_token_share``: response tokens of non-collapsed groups / all response
    tokens of the step (``lengths``: each group's response tokens; 0.0 when there are none).

    >>> mixed_token_share([10, 30, 60], [True, False, True])
    0.3
    """
    total = sum(lengths)
    mixed = sum(n for n, c in zip(lengths, collapsed, strict=True) if not c)
    return mixed / total if total else 0.0
