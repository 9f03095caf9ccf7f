"""ACR statistics and the monitor (docs/ARCHITECTURE.md section 5)."""

from __future__ import annotations

import json
import logging

import pytest
import torch

from diagnostics.acr import ACRMonitor, MonitorConfig, collapse_stats, verifier_metrics
from learner.advantage import avspo_advantages, grpo_advantages
from tests.metric_names import ACR as SECTION5
from tests.reference import ref_collapse


def test_collapse_stats_strata_by_hand():
    # groups: 10 all-correct, 20 all-incorrect, 30 all at partial credit 0.5 (high stratum),
    # 40 mixed, 50 a single sample (collapsed; reward 0 -> low).
    r = torch.tensor([1.0, 1.0, 0.0, 0.0, 0.5, 0.5, 1.0, 0.0, 0.0])
    g = torch.tensor([10, 10, 20, 20, 30, 30, 40, 40, 50])
    s = collapse_stats(r, g)
    assert s.collapsed.tolist() == [True, True, True, False, True]
    assert (s.acr, s.acr_high, s.acr_low) == (0.8, 0.4, 0.4)  # 4/5, {10,30}/5, {20,50}/5
    assert not s.batch_collapsed
    assert collapse_stats(torch.ones(4), torch.tensor([0, 0, 1, 1])).batch_collapsed


def test_tau_and_r_lo():
    r = torch.tensor([0.5, 0.5 + 1e-4, -1.0, -1.0])
    g = torch.tensor([0, 0, 1, 1])
    # group 0: sigma_pop = 5e-5 -> collapsed only with tau > 5e-5
    assert collapse_stats(r, g, tau=1e-6, r_lo=-1.0).collapsed.tolist() == [False, True]
    s = collapse_stats(r, g, tau=1e-3, r_lo=-1.0)
    assert s.collapsed.tolist() == [True, True] and (s.acr_high, s.acr_low) == (0.5, 0.5)


@pytest.mark.parametrize("seed", range(20))
def test_matches_loop_reference(seed):
    gen = torch.Generator().manual_seed(seed)
    n_groups = int(torch.randint(1, 30, (1,), generator=gen))
    sizes = torch.randint(1, 10, (n_groups,), generator=gen)
    g = torch.repeat_interleave(torch.randperm(500, generator=gen)[:n_groups], sizes)
    r = torch.randint(0, 3, (int(sizes.sum()),), generator=gen).double() / 2
    s = collapse_stats(r, g)
    ref = ref_collapse(r.tolist(), g.tolist())
    assert s.collapsed.tolist() == ref["collapsed"]
    assert (s.acr, s.acr_high, s.acr_low) == pytest.approx(
        (ref["acr"], ref["acr_high"], ref["acr_low"])
    )


@pytest.mark.parametrize("seed", range(10))
def test_equals_trl_frac_reward_zero_std(seed):
    # TRL's GRPOTrainer: std over views of G, `torch.isclose(std, 0)`, repeated per sample, mean.
    gen = torch.Generator().manual_seed(seed)
    G, M = 8, 64
    r = (torch.rand(M * G, generator=gen) < torch.rand(1, generator=gen)).float()
    std = r.view(-1, G).std(dim=1)
    trl = torch.isclose(std, torch.zeros_like(std)).repeat_interleave(G).float().mean().item()
    mon = ACRMonitor(MonitorConfig(), tau=1e-8)
    m = mon.update(r, torch.arange(M).repeat_interleave(G), torch.zeros(M * G), torch.ones(M * G))
    assert m["frac_reward_zero_std"] == pytest.approx(trl)
    assert m["acr/raw"] == pytest.approx(trl)


def _step(mon, acr_groups: int, total: int = 4, **kw):
    """A step of `total` groups of 2, the first `acr_groups` collapsed (all 1), rest mixed."""
    r = torch.tensor([1.0, 1.0] * acr_groups + [1.0, 0.0] * (total - acr_groups))
    g = torch.arange(total).repeat_interleave(2)
    return mon.update(r, g, grpo_advantages(r, g).advantages, torch.full((2 * total,), 3), **kw)


def test_acr100_freezes_and_window_ema_volatility():
    mon = ACRMonitor()
    for _ in range(100):
        m = _step(mon, 1)  # ACR 0.25
    assert m["acr/acr100"] == pytest.approx(0.25)
    for _ in range(50):
        m = _step(mon, 4)  # ACR 1.0
    assert m["acr/acr100"] == pytest.approx(0.25)  # frozen after 100 steps
    assert m["acr/window"] == pytest.approx(0.625)  # last 100: 50 * 0.25 + 50 * 1.0
    assert m["acr/volatility"] == 0.0  # last 25 all 1.0
    assert m["acr/ema"] == pytest.approx(1 - 0.75 * 0.9**50)  # from 0.25 towards 1 at beta 0.9
    assert set(m) >= SECTION5


def test_ema_and_volatility_by_hand():
    mon = ACRMonitor()
    m1 = _step(mon, 4)  # ACR 1 -> ema starts at 1
    m2 = _step(mon, 0)  # ACR 0 -> ema 0.9; volatility = pstdev(1, 0) = 0.5
    assert (m1["acr/ema"], m2["acr/ema"]) == (1.0, pytest.approx(0.9))
    assert m2["acr/volatility"] == pytest.approx(0.5)
    assert m2["acr/acr100"] == pytest.approx(0.5)  # running mean before step 100


def test_effective_acr_and_wasted_tokens_after_avspo():
    # Groups: 0 all-correct, 1 all-incorrect, 2 mixed. Response lengths 1..6.
    r = torch.tensor([1.0, 1.0, 0.0, 0.0, 1.0, 0.0])
    g = torch.tensor([0, 0, 1, 1, 2, 2])
    lengths = torch.tensor([1, 2, 3, 4, 5, 6])
    mon = ACRMonitor()
    m = mon.update(r, g, grpo_advantages(r, g).advantages, lengths)
    # GRPO: groups 0 and 1 wasted -> effective 2/3, wasted tokens (1+2+3+4) / 21
    assert m["acr/raw"] == pytest.approx(2 / 3) and m["acr/effective"] == pytest.approx(2 / 3)
    assert m["acr/wasted_token_frac"] == pytest.approx(10 / 21)
    adv = avspo_advantages(r, g, tau_adapt=0.5).advantages
    m = mon.update(r, g, adv, lengths)
    # AVSPO augments both collapsed groups: nothing wasted, although raw ACR is unchanged.
    assert m["acr/raw"] == pytest.approx(2 / 3)
    assert m["acr/effective"] == 0.0 and m["acr/wasted_token_frac"] == 0.0


def test_early_warning_fires_once(caplog):
    mon = ACRMonitor(MonitorConfig(alert_level=0.5, alert_min_steps=3))
    with caplog.at_level(logging.WARNING, logger="diagnostics.acr"):
        flags = [_step(mon, 3)["acr/early_warning"] for _ in range(6)]  # ACR 0.75 every step
    assert flags == [0.0, 0.0, 1.0, 1.0, 1.0, 1.0]  # not before min steps, then latched
    assert mon.alert_step == 3
    assert sum("ACR early warning" in rec.message for rec in caplog.records) == 1
    quiet = ACRMonitor(MonitorConfig(alert_level=0.5, alert_min_steps=1))
    assert all(_step(quiet, 2)["acr/early_warning"] == 0.0 for _ in range(5))  # 0.5 is not > 0.5


def test_prompt_history_and_state_round_trip():
    mon = ACRMonitor()
    keys = ["a", "b", "c", "d"]
    _step(mon, 2, prompt_keys=keys)  # a, b all correct; c, d mixed
    _step(mon, 1, prompt_keys=keys)  # a all correct
    assert mon.prompt_summary() == {"prompts_seen": 4, "always_solved": 1, "never_solved": 0}
    clone = ACRMonitor()
    clone.load_state_dict(json.loads(json.dumps(mon.state_dict())))
    assert _step(clone, 3) == _step(mon, 3)
    assert clone.state_dict() == mon.state_dict()


def test_verifier_metrics_passed_through():
    mon = ACRMonitor()
    m = _step(mon, 0, verifier_reasons=["ok"] * 6 + ["timeout", "error"])
    assert m["reward/verifier_timeout_frac"] == 0.125 and m["reward/verifier_error_frac"] == 0.125
    assert verifier_metrics([]) == {
        "reward/verifier_error_frac": 0.0,
        "reward/verifier_timeout_frac": 0.0,
    }


def test_shape_mismatch_is_an_error():
    with pytest.raises(ValueError, match="shape"):
        ACRMonitor().update(
            torch.ones(4), torch.zeros(4, dtype=torch.long), torch.ones(3), torch.ones(4)
        )


def test_monitor_reuses_estimator_stats_only_when_compatible():
    r = torch.tensor([1.0, 1.0, 0.0, 0.0, 1.0, 0.0])
    g = torch.tensor([0, 0, 1, 1, 2, 2])
    res = avspo_advantages(r, g, tau_adapt=0.5)
    lengths = torch.ones(6)
    plain = ACRMonitor().update(r, g, res.advantages, lengths)
    shared = ACRMonitor().update(r, g, res.advantages, lengths, stats=res.stats)
    assert plain == shared
    # Stats computed with another floor (r_lo = -1: nothing is "low") are not reused.
    other = collapse_stats(r, g, r_lo=-1.0)
    m = ACRMonitor().update(r, g, res.advantages, lengths, stats=other)
    assert (m["acr/high"], m["acr/low"]) == (pytest.approx(1 / 3), pytest.approx(1 / 3))
