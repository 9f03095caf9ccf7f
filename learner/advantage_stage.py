"""The advantage stage: the driver's own stage between reward collection and the update.

docs/ARCHITECTURE.md section 2: one pure-torch object (no Ray) that sees every generated group of a
step, before any filtering, and hands the learner a finished batch. :meth:`AdvantageStage.process`
takes the step's groups and verdicts and

1. turns verdict scores into rewards (plus DAPO's overlong penalty when
   ``algorithm.overlong.shaping``: r + penalty(|y|), :func:`overlong_penalty`);
2. runs the configured estimator (by name; learner/estimators.py) on the groups that are
   trained (all of them, or DAPO's selection), with its own state (AVSPO's trigger, DCPO's
   prompt history), which the stage holds and checkpoints but never reads (:meth:`__call__`);
3. feeds the ACR monitor with *every* generated group whose rewards are known (``acr/raw`` is
   before any intervention; groups left out of training count as zero-advantage), with the same
   ``algorithm.tau``;
4. builds the :class:`~learner.batch.TrainBatch` of the trained groups (DAPO's overlong filter
   masks truncated responses out of the loss, and a verifier fault's group is masked out).

Verifier faults are not collapse: a group with a sample whose verification timed out or failed
(reason ``timeout`` or ``error``; the pool scored it r_lo, its true reward unknown) is left out
of the estimator, the trigger and the ACR monitor, so it is neither augmented nor counted as
collapsed, and a right answer in it is never pushed down; its rewards leave the trigger's J_t;
it stays in the batch (batch sizes unchanged) at zero advantage with its tokens masked out of
the loss, so none counts in the loss's denominator; and it is counted on its own:
``verifier/faulted_groups`` and ``verifier/faulted_group_frac`` (of generated groups), beside
``reward/verifier_*_frac``. (With
``algorithm.reward.verifier`` 0, rewards purely intrinsic, a verifier fault changes no reward.)

It returns the batch, the step's ``acr/*``, ``avspo/*``, ``reward/*``, ``response_length/*``,
``prompt_length/*`` and ``advantage/*`` metrics, and every generated sample's reward and
advantage (the driver logs a few of them whole: diagnostics/samples.py). ``reward/mean``,
``response_length/{mean,max,min}`` and ``prompt_length/{mean,max,min}`` (each sample's prompt
tokens, as verl's) cover every generated sample (comparable across methods; the trigger's J_t is
``reward/mean``); their ``*_trained`` variants and ``acr/trained`` cover the trained groups
(DAPO's selection; the same otherwise). ``advantage/{mean,max,min}`` are over samples, one value
each (not token-weighted, unlike verl's ``critic/advantages/*``), of the samples whose tokens
enter the loss (trained groups, less verifier faults and DAPO's overlong filter; null when
none): GRPO's mean is 0 per group, so a non-zero mean is what AVSPO's virtual samples or DCPO's
history added.

>>> from learner.config import AlgorithmConfig
>>> stage = AdvantageStage(AlgorithmConfig(), reward_range=(0.0, 1.0), seed=0)
>>> res, m = stage(torch.tensor([1.0, 1.0, 0.0, 1.0]), torch.tensor([0, 0, 1, 1]))
>>> m["avspo/triggered"], m["avspo/tau_adapt"]   # ACR 0.5 is not > tau_adapt_0 = 0.5
(0.0, 0.5)
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from comm.collapse import collapse_stats
from diagnostics.acr import ACRMonitor, MonitorConfig, extra_metrics, verifier_metrics
from learner.advantage import AdvantageResult
from learner.batch import TrainBatch, build_batch
from learner.config import AlgorithmConfig
from learner.estimators import Step, get_estimator
from rollout.types import Group


def overlong_penalty(lengths: Tensor, *, max_len: int, buffer_len: int, factor: float) -> Tensor:
    """DAPO's soft overlong punishment: 0 up to L_max - L_cache tokens, then linearly down to
    -factor at L_max (and below past it).

    >>> overlong_penalty(torch.tensor([4, 6, 7, 8]), max_len=8, buffer_len=4, factor=1.0).tolist()
    [0.0, -0.5, -0.75, -1.0]
    """
    over = (lengths.to(torch.float32) - (max_len - buffer_len)).clamp(min=0)
    return 0.0 - factor * over / buffer_len  # 0.0 - 0.0 = +0.0 (no -0.0 in the metrics)


FAULTS = ("timeout", "error")
"""Verdict reasons of a failed verification: the sample's true reward is unknown."""


def group_faults(groups: list[Group], verdicts: list) -> list[bool]:
    """Which groups hold a sample whose verification failed (reason in :data:`FAULTS`).

    >>> from dataclasses import dataclass
    >>> from rollout.types import Sample
    >>> @dataclass
    ... class V:
    ...     reason: str
    >>> s = Sample([5], [0.0], "", "stop", 0)
    >>> two, one = Group("a", [1], [s, s]), Group("b", [1], [s])
    >>> group_faults([two, one], [V("ok"), V("timeout"), V("ok")])
    [True, False]
    """
    out, start = [], 0
    for g in groups:
        out.append(any(v.reason in FAULTS for v in verdicts[start : start + len(g.samples)]))
        start += len(g.samples)
    return out


def informative_groups(
    groups: list[Group], scores: list[float], *, tau: float, faulted: list[bool] | None = None
) -> list[bool]:
    """DAPO's dynamic-sampling test: which groups are *not* collapsed (their rewards' population
    std >= ``tau`` and G > 1) and not ``faulted`` (:func:`group_faults`: their rewards are
    unknown, they are not trained). ``scores``: every sample's reward, group order; groups may
    differ in size (failed samples).

    >>> from rollout.types import Sample
    >>> s = Sample([5], [0.0], "", "stop", 0)
    >>> informative_groups([Group("a", [1], [s, s]), Group("b", [1], [s])], [1, 0, 1], tau=1e-6)
    [True, False]
    """
    sizes = torch.tensor([len(g.samples) for g in groups])
    ids = torch.arange(len(groups)).repeat_interleave(sizes)  # [N]
    rewards = torch.tensor(scores, dtype=torch.float64)
    collapsed = collapse_stats(rewards, ids, tau=tau).collapsed.tolist()
    faulted = faulted or [False] * len(groups)
    return [not (c or f) for c, f in zip(collapsed, faulted, strict=True)]


def dapo_selection(informative: list[bool], want: int) -> list[bool]:
    """Which groups DAPO trains: the first ``want`` informative ones in generation order,
    topped up with collapsed ones (in order) when the rounds ran out.

    >>> dapo_selection([False, True, False, True, True], 2)
    [False, True, False, True, False]
    >>> dapo_selection([False, True, False], 2)  # one informative: the first collapsed joins
    [True, True, False]
    """
    order = sorted(range(len(informative)), key=lambda i: not informative[i])  # stable
    chosen = set(order[:want])
    return [i in chosen for i in range(len(informative))]


def _pick(keys: list[str] | None, mask: Tensor) -> list[str] | None:
    return None if keys is None else [k for k, m in zip(keys, mask.tolist(), strict=True) if m]


def spread(name: str, values: Tensor, stats=("mean", "max", "min")) -> dict[str, float]:
    """``name/mean``, ``name/max``, ``name/min`` of ``values`` (NaN, logged as null, when empty).

    >>> spread("prompt_length", torch.tensor([3, 5, 4]))
    {'prompt_length/mean': 4.0, 'prompt_length/max': 5.0, 'prompt_length/min': 3.0}
    """
    v = values.double()
    got = {"mean": v.mean, "max": v.max, "min": v.min}
    return {f"{name}/{s}": float(got[s]()) if len(v) else float("nan") for s in stats}


def length_metrics(
    groups: list[Group], lengths: Tensor, truncated: Tensor, trained: Tensor
) -> dict:
    """``response_length/{mean,max,min,clip_ratio}`` and ``prompt_length/{mean,max,min}`` (each
    sample's prompt tokens) over every generated sample; ``response_length/mean_trained`` over
    the ``trained`` ones (``[N]`` bools)."""
    sizes = torch.tensor([len(g.samples) for g in groups])
    prompt_lengths = torch.tensor([len(g.prompt_ids) for g in groups]).repeat_interleave(sizes)
    return (
        {
            "response_length/mean_trained": float(lengths[trained].double().mean()),
            "response_length/clip_ratio": float(truncated.double().mean()),
        }
        | spread("response_length", lengths)
        | spread("prompt_length", prompt_lengths)
    )


class StageOutput(NamedTuple):
    batch: TrainBatch
    metrics: dict[str, float]
    collapsed: list[bool]  # per generated group, in order
    rewards: Tensor  # [N] every generated sample's reward as the estimator saw it, sample order
    advantages: Tensor  # [N] every generated sample's advantage (0: not trained, or faulted)


class AdvantageStage:
    def __init__(
        self,
        cfg: AlgorithmConfig,
        *,
        reward_range: tuple[float, float],
        seed: int,
        monitor: MonitorConfig | None = None,
        pad_id: int = 0,
        max_response_len: int | None = None,
    ) -> None:
        """``max_response_len`` (the configured ``max_new_tokens``) is L_max of the overlong
        penalty; ``pad_id`` pads the train batch."""
        self.cfg = cfg
        self.reward_range = (float(reward_range[0]), float(reward_range[1]))
        estimator = get_estimator(cfg.estimator)
        self.estimator, self.estimator_keys = estimator.fn, estimator.metrics
        # the estimator's own state (None: stateless), e.g. AVSPO's trigger and virtual-reward RNG
        self.state = estimator.make_state(cfg, seed) if estimator.make_state else None
        self.monitor = ACRMonitor(
            monitor, tau=cfg.tau, r_lo=self.reward_range[0], strata=not cfg.reward.intrinsic
        )
        self.pad_id, self.max_response_len = pad_id, max_response_len
        if cfg.overlong.shaping and max_response_len is None:
            raise ValueError("overlong shaping needs max_response_len")

    def __call__(
        self,
        rewards: Tensor,
        group_ids: Tensor,
        prompt_keys: list[str] | None = None,
        mean_reward: float | None = None,
    ) -> tuple[AdvantageResult, dict]:
        """Advantages of one step and the estimator's metrics (``avspo/*``, ``dcpo/*``; none for
        GRPO, Dr. GRPO and RLOO). ``prompt_keys``: each group's prompt (estimators with
        per-prompt state need them); ``mean_reward``: J_t (default: the mean of ``rewards``)."""
        step = Step(group_ids, prompt_keys, mean_reward, self.reward_range)
        result = self.estimator(rewards, step, self.cfg, self.state)
        return result, dict(result.metrics)

    def process(
        self,
        groups: list[Group],
        verdicts: list,
        *,
        prompt_keys: list[str] | None = None,
        trained: list[bool] | None = None,
    ) -> StageOutput:
        """One step: every generated group and its verdicts (``.score``, ``.reason``; sample
        order) -> the train batch of the ``trained`` groups (default: all), the metrics, which
        of every generated group collapsed (as the ACR monitor counts them; a group with a
        verifier fault is not counted, the module docstring says why), and every sample's
        reward and advantage."""
        sizes = torch.tensor([len(g.samples) for g in groups])
        group_ids = torch.arange(len(groups)).repeat_interleave(sizes)  # [N]
        rewards, lengths, truncated = self._rewards(groups, verdicts)
        keep = torch.ones(len(groups), dtype=torch.bool)
        if trained is not None:
            keep = torch.tensor(trained, dtype=torch.bool)
        faulted = group_faults(groups, verdicts) if self.cfg.reward.verifier else []
        known = ~torch.tensor(faulted or [False] * len(groups), dtype=torch.bool)  # [M]
        est = keep & known  # the groups the estimator and the trigger see
        rows = est[group_ids]  # [N]
        known_rows = known[group_ids]  # [N]
        # J_t over the samples whose rewards are known (a fault's r_lo is no reward)
        mean_reward = float(rewards[known_rows].double().mean()) if known.any() else 0.0
        advantages = torch.zeros_like(rewards)  # groups left out: no gradient
        result, metrics = None, dict.fromkeys(self.estimator_keys, 0.0)  # kept if none trains
        if est.any():  # (none: every group of the step faulted)
            ids = torch.arange(int(est.sum())).repeat_interleave(sizes[est])
            result, metrics = self(rewards[rows], ids, _pick(prompt_keys, est), mean_reward)
            advantages[rows] = result.advantages.to(rewards.dtype)
        stats = result.stats if result is not None and bool((est == known).all()) else None
        acr, collapsed = self._monitor(
            rewards, advantages, lengths, sizes, known, prompt_keys, stats
        )
        metrics |= acr
        trained_rows = keep[group_ids]
        reasons = [v.reason for v in verdicts]
        metrics |= extra_metrics([v.extra for v in verdicts]) | verifier_metrics(reasons)
        metrics |= length_metrics(groups, lengths, truncated, trained_rows) | {
            "verifier/faulted_groups": float((~known).sum()),
            "verifier/faulted_group_frac": float((~known).double().mean()),
            "acr/trained": result.acr if result is not None else 0.0,
            "reward/mean": float(rewards.double().mean()),
            "reward/mean_trained": float(rewards[trained_rows].double().mean()),
        }
        out = ~known_rows  # a faulted group's tokens stay out of the loss (and its denominator)
        if self.cfg.overlong.filter:
            out |= truncated
        metrics |= spread("advantage", advantages[trained_rows & ~out])
        batch = build_batch(
            [g for g, k in zip(groups, keep.tolist(), strict=True) if k],
            advantages[trained_rows],
            pad_id=self.pad_id,
            masked_out=out[trained_rows],
        )
        return StageOutput(batch, metrics, collapsed, rewards, advantages)

    def _monitor(self, rewards, advantages, lengths, sizes, known, prompt_keys, stats):
        """The ACR monitor's step over the ``known`` groups (no verifier fault): its metrics and
        which of every group collapsed (a faulted group: not counted, False)."""
        collapsed = [False] * len(known)
        if not known.any():  # every group faulted: no ACR this step
            return {}, collapsed
        rows = known.repeat_interleave(sizes)  # [N]
        metrics = self.monitor.update(
            rewards[rows],
            torch.arange(int(known.sum())).repeat_interleave(sizes[known]),
            advantages[rows],
            lengths[rows],
            prompt_keys=_pick(prompt_keys, known),
            stats=stats,
        )
        for i, c in zip(known.nonzero().flatten().tolist(), self.monitor.collapsed, strict=True):
            collapsed[i] = c
        return metrics, collapsed

    def _rewards(self, groups: list[Group], verdicts: list) -> tuple[Tensor, Tensor, Tensor]:
        """``[N]`` rewards (the verdicts' scores, with DAPO's overlong shaping when on),
        response lengths and whether each response was truncated, in sample order."""
        samples = [s for g in groups for s in g.samples]
        if len(verdicts) != len(samples):
            raise ValueError(f"{len(samples)} samples but {len(verdicts)} verdicts")
        lengths = torch.tensor([len(s.response_ids) for s in samples])  # [N]
        truncated = torch.tensor([s.finish_reason == "length" for s in samples])  # [N]
        rewards = torch.tensor([float(v.score) for v in verdicts], dtype=torch.float32)
        ov = self.cfg.overlong
        if ov.shaping:
            rewards = rewards + overlong_penalty(
                lengths,
                max_len=self.max_response_len,
                buffer_len=ov.buffer_len,
                factor=ov.penalty_factor,
            )
        return rewards, lengths, truncated

    def prompt_history(self) -> dict:
        """The ACR monitor's per-prompt collapse history (``prompts``) and its ``summary``: the
        run directory's prompt_history.json."""
        return {"summary": self.monitor.prompt_summary(), "prompts": self.monitor.prompt_history}

    def state_dict(self) -> dict:
        """JSON-serialisable: the ACR monitor and the estimator's state (AVSPO: ``trigger``,
        ``acr_window``, ``generator``; DCPO: ``prompt_history``)."""
        own = self.state.state_dict() if self.state is not None else {}
        return {"monitor": self.monitor.state_dict()} | own

    def load_state_dict(self, state: dict) -> None:
        self.monitor.load_state_dict(state["monitor"])
        if self.state is not None:
            self.state.load_state_dict(state)
