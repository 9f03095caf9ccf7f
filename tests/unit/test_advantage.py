"""Advantage estimators: hand-computed examples, properties, and loop-vs-vectorised equivalence."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from learner.advantage import avspo_advantages, grpo_advantages, rloo_advantages
from learner.config import AlgorithmConfig
from learner.estimators import ESTIMATORS, get_estimator
from learner.trigger import TriggerConfig
from learner.virtual_samples import STRATEGIES, VirtualSpec, virtual_moments, virtual_rewards
from tests.reference import ref_avspo, ref_grpo, ref_rloo

F64 = torch.float64


def t(x, dtype=F64):
    return torch.tensor(x, dtype=dtype)


def ids(x):
    return torch.tensor(x, dtype=torch.long)


# ----------------------------------------------------------------------------- hand-computed


def test_worked_example_of_design_doc():
    # G = 8 all correct, plus one mixed group so that ACR_t = 1/2 > tau_adapt = 0.3.
    # K = ceil(8 * 0.5 ** 0.5) = ceil(5.657) = 6; v_k = 1 * (1 - k/7) = 6/7 .. 1/7, sum 3.
    # Union: 8 ones + 6 virtuals, mean (8 + 3) / 14 = 11/14; E[x^2] = (8 + 91/49) / 14.
    # var_pop = E[x^2] - (11/14)^2 = 0.0867347, std_pop = 0.294508 -> A = (3/14) / 0.294508 = 0.7276
    # unbiased var = var_pop * 14/13 = 0.0934066, std = 0.305625 -> A = 0.21429 / 0.305625 = 0.7011
    r = t([1.0] * 8 + [0.0, 1.0] * 4)
    g = ids([0] * 8 + [1] * 8)
    pop = avspo_advantages(r, g, tau_adapt=0.3, eps=0.0, unbiased=False)
    unb = avspo_advantages(r, g, tau_adapt=0.3, eps=0.0, unbiased=True)
    assert pop.k.tolist() == [6, 0] and pop.num_virtual == 6 and pop.acr == 0.5
    assert pop.augmented.tolist() == [True, False]
    assert pop.advantages[:8].tolist() == pytest.approx([0.7276] * 8, abs=5e-5)
    assert unb.advantages[:8].tolist() == pytest.approx([0.7011] * 8, abs=5e-5)
    # The mixed group is plain GRPO: mean 0.5, unbiased std sqrt(8 * 0.25 / 7) = 0.534522.
    assert unb.advantages[8:].tolist() == pytest.approx([-0.935414, 0.935414] * 4, abs=1e-6)


def test_grpo_hand_example_unordered_ids_and_variable_sizes():
    # ids 42 (3 samples, rewards 1, 0, 0.5) and -3 (2 samples, 1, 0), interleaved.
    # Group -3 (index 0): mean 0.5, unbiased std sqrt(0.5) = 0.707107 -> +-0.707107.
    # Group 42 (index 1): mean 0.5, unbiased std 0.5 -> (1, -1, 0).
    r = t([1.0, 1.0, 0.0, 0.0, 0.5])
    g = ids([42, -3, 42, -3, 42])
    res = grpo_advantages(r, g, eps=0.0)
    assert res.group_index.tolist() == [1, 0, 1, 0, 1]
    assert res.advantages.tolist() == pytest.approx([1.0, 0.707107, -1.0, -0.707107, 0.0], abs=1e-6)
    # Population std: group -3 std 0.5 -> +-1; group 42 std sqrt(1/6) = 0.408248 -> +-1.224745.
    pop = grpo_advantages(r, g, eps=0.0, unbiased=False)
    assert pop.advantages.tolist() == pytest.approx([1.224745, 1.0, -1.224745, -1.0, 0.0], abs=1e-6)


def test_dr_grpo_and_rloo_hand_examples():
    # One group (1, 0, 0, 1, 1): mean 0.6. Dr. GRPO: r - 0.6.
    # RLOO: G/(G-1) (r - mean) = 1.25 (r - 0.6).
    r = t([1.0, 0.0, 0.0, 1.0, 1.0])
    g = ids([7] * 5)
    dr = grpo_advantages(r, g, scale_by_std=False)
    assert dr.advantages.tolist() == pytest.approx([0.4, -0.6, -0.6, 0.4, 0.4])
    rl = rloo_advantages(r, g)
    # first sample: 1 - mean(0, 0, 1, 1) = 0.5; second: 0 - mean(1, 0, 1, 1) = -0.75
    assert rl.advantages.tolist() == pytest.approx([0.5, -0.75, -0.75, 0.5, 0.5])


def test_collapsed_and_single_sample_groups_get_exact_zero():
    r = t([0.3, 0.3, 0.3, 1.0, 0.0, 1.0])
    g = ids([0, 0, 0, 1, 2, 2])  # group 0 all 0.3, group 1 a single sample, group 2 mixed
    for fn in (grpo_advantages, rloo_advantages):
        res = fn(r, g)
        assert res.collapsed.tolist() == [True, True, False]
        assert res.advantages[:4].tolist() == [0.0, 0.0, 0.0, 0.0]
        assert res.acr == pytest.approx(2 / 3)


def test_stratified_low_group_uses_anchor():
    # All-incorrect group of 4, ACR = 1 (the only group), tau_adapt 0.5 -> K = ceil(4 * 1) = 4.
    # v_k = 0.1 * (4 - k + 1) / 4 = 0.1, 0.075, 0.05, 0.025; union = 4 zeros + those.
    # mean = 0.25 / 8 = 0.03125; sum sq dev = 4 * 0.03125^2 + sum (v - 0.03125)^2
    #   = 0.00390625 + (0.06875^2 + 0.04375^2 + 0.01875^2 + 0.00625^2) = 0.00390625 + 0.00703125
    #   = 0.0109375; unbiased var = /7 = 0.0015625, std = 0.0395285
    # A = -0.03125 / 0.0395285 = -0.790569 (eps = 0)
    res = avspo_advantages(t([0.0] * 4), ids([0] * 4), tau_adapt=0.5, eps=0.0)
    assert res.k.tolist() == [4]
    assert res.advantages.tolist() == pytest.approx([-0.790569] * 4, abs=1e-6)


def test_fixed_strategy_and_fixed_k():
    # All-correct group of 4, k = 2, fixed: v = 0.5, 0.5. Union (1, 1, 1, 1, .5, .5): mean 5/6.
    # Sum sq dev = 4 (1/6)^2 + 2 (1/3)^2 = 4/36 + 8/36 = 1/3; unbiased var 1/15, std 0.258199.
    # A = (1/6) / 0.258199 = 0.645497
    res = avspo_advantages(
        t([1.0] * 4), ids([0] * 4), tau_adapt=0.0, strategy="fixed", k=2, eps=0.0
    )
    assert res.k.tolist() == [2] and res.num_virtual == 2
    assert res.advantages.tolist() == pytest.approx([0.645497] * 4, abs=1e-6)


def test_opposite_strategy():
    # Low group (0, 0, 0) gets one virtual 1: union mean 0.25, unbiased std sqrt(0.75/3) = 0.5
    # -> A = -0.5. High group (1, 1, 1) gets one virtual 0 -> A = +0.5.
    r = t([0.0, 0.0, 0.0, 1.0, 1.0, 1.0])
    res = avspo_advantages(r, ids([0, 0, 0, 1, 1, 1]), tau_adapt=0.5, strategy="opposite", eps=0.0)
    assert res.k.tolist() == [1, 1]
    assert res.advantages.tolist() == pytest.approx([-0.5] * 3 + [0.5] * 3)


def test_mechanism_isolation_augments_one_stratum_only():
    # The paper's mechanism isolation: the same opposite-strategy batch as above (ACR 1 > 0.5).
    # augment="incorrect": only the all-incorrect group (0, 0, 0) gets its virtual 1 (A = -0.5),
    # the all-correct one stays at exactly 0; "correct" the other way round; "both" = default.
    r = t([0.0, 0.0, 0.0, 1.0, 1.0, 1.0])
    g = ids([0, 0, 0, 1, 1, 1])

    def run(augment):
        return avspo_advantages(r, g, tau_adapt=0.5, strategy="opposite", eps=0.0, augment=augment)

    low, high, both = run("incorrect"), run("correct"), run("both")
    assert low.augmented.tolist() == [True, False] and low.num_virtual == 1
    assert low.advantages.tolist() == pytest.approx([-0.5] * 3 + [0.0] * 3)
    assert high.augmented.tolist() == [False, True]
    assert high.advantages.tolist() == pytest.approx([0.0] * 3 + [0.5] * 3)
    assert both.advantages.tolist() == pytest.approx([-0.5] * 3 + [0.5] * 3)
    with pytest.raises(ValueError, match="augment"):
        run("neither")


def test_random_strategy_is_seeded_and_in_range():
    r = t([1.0] * 8 + [0.0] * 8)
    g = ids([0] * 8 + [1] * 8)
    a = avspo_advantages(
        r, g, tau_adapt=0.1, strategy="random", generator=torch.Generator().manual_seed(3)
    )
    b = avspo_advantages(
        r, g, tau_adapt=0.1, strategy="random", generator=torch.Generator().manual_seed(3)
    )
    c = avspo_advantages(
        r, g, tau_adapt=0.1, strategy="random", generator=torch.Generator().manual_seed(4)
    )
    assert torch.equal(a.advantages, b.advantages)
    assert not torch.equal(a.advantages, c.advantages)
    # virtuals in [0, 1): an all-correct group's real samples sit above the union mean, and
    # an all-incorrect group's below it.
    assert (a.advantages[:8] > 0).all() and (a.advantages[8:] < 0).all()


def test_not_triggered_at_or_below_threshold():
    # ACR = 0.5 exactly; the trigger needs ACR > tau_adapt (strict).
    r = t([1.0, 1.0, 0.0, 1.0])
    g = ids([0, 0, 1, 1])
    res = avspo_advantages(r, g, tau_adapt=0.5)
    assert not res.triggered and res.num_virtual == 0 and not res.augmented.any()
    assert res.advantages[:2].tolist() == [0.0, 0.0]
    assert avspo_advantages(r, g, tau_adapt=0.49).triggered


def test_float32_input_keeps_dtype_and_matches_float64():
    r64 = t([1.0] * 8 + [0.0, 1.0] * 4)
    g = ids([0] * 8 + [1] * 8)
    a32 = avspo_advantages(r64.float(), g, tau_adapt=0.3)
    a64 = avspo_advantages(r64, g, tau_adapt=0.3)
    assert a32.advantages.dtype == torch.float32
    assert torch.allclose(a32.advantages.double(), a64.advantages, atol=1e-5)


def test_integer_rewards_are_accepted():
    res = grpo_advantages(torch.tensor([1, 0, 0, 1]), ids([0, 0, 0, 0]))
    assert res.advantages.dtype == torch.float32
    assert res.advantages.tolist() == pytest.approx(
        [0.866025, -0.866025, -0.866025, 0.866025], abs=1e-5
    )


def test_bad_inputs_raise_clear_errors():
    with pytest.raises(ValueError, match="non-finite"):
        grpo_advantages(t([1.0, math.nan]), ids([0, 0]))
    with pytest.raises(ValueError, match="entries"):
        grpo_advantages(t([1.0, 0.0]), ids([0, 0, 0]))
    with pytest.raises(TypeError, match="integer"):
        grpo_advantages(t([1.0, 0.0]), t([0.0, 0.0]))
    with pytest.raises(ValueError, match="strategy"):
        avspo_advantages(t([1.0, 1.0]), ids([0, 0]), tau_adapt=0.0, strategy="nope")
    with pytest.raises(KeyError, match="registered"):
        get_estimator("ppo_gae")


def test_registry_names_and_signature():
    """Every estimator is called as fn(rewards, step, cfg, state): four arguments, the state
    made by the entry's make_state (None where the estimator keeps none)."""
    import inspect

    from learner.estimators import Step

    assert {"grpo", "dr_grpo", "rloo", "avspo", "avspo_release", "dcpo"} <= set(ESTIMATORS)
    cfg = AlgorithmConfig(trigger=TriggerConfig(policy="fixed", tau_adapt_0=0.1))
    r, g = t([1.0, 1.0, 0.0, 1.0]), ids([0, 0, 1, 1])
    step = Step(g, prompt_keys=["a", "b"], reward_range=(0.0, 1.0))
    for name, entry in ESTIMATORS.items():
        assert len(inspect.signature(entry.fn).parameters) <= 4, name
        state = entry.make_state(cfg, 0) if entry.make_state else None
        res = entry.fn(r, step, cfg, state)
        assert set(res.metrics) == set(entry.metrics), name  # what a step without groups zeroes
        assert res.advantages.shape == (4,)
        assert res.acr == 0.5, name
    assert {n for n, e in ESTIMATORS.items() if e.make_state} == {"avspo", "dcpo"}
    entry = get_estimator("avspo")
    avspo = entry.fn(r, step, cfg, entry.make_state(cfg, 0))
    # the state's trigger decides: ACR 0.5 > the fixed tau_adapt 0.1, so group 0 is augmented
    assert avspo.num_virtual > 0 and avspo.metrics["avspo/tau_adapt"] == 0.1
    assert "avspo/tau_adapt" not in get_estimator("grpo").fn(r, step, cfg, None).metrics


# ----------------------------------------------------------------------------- properties

reward_values = st.sampled_from([0.0, 0.25, 0.5, 1.0])


@st.composite
def batches(draw, max_groups=6, max_size=8):
    """Random groups of random sizes, ids shuffled and non-contiguous."""
    m = draw(st.integers(1, max_groups))
    sizes = draw(st.lists(st.integers(1, max_size), min_size=m, max_size=m))
    id_pool = draw(st.lists(st.integers(-50, 10_000), min_size=m, max_size=m, unique=True))
    rewards, gids = [], []
    for gid, size in zip(id_pool, sizes, strict=True):
        if draw(st.booleans()):  # make collapse common
            rewards += [draw(reward_values)] * size
        else:
            rewards += draw(st.lists(reward_values, min_size=size, max_size=size))
        gids += [gid] * size
    perm = draw(st.permutations(list(range(len(rewards)))))
    return [rewards[i] for i in perm], [gids[i] for i in perm]


def run_all(r, g, tau_adapt=0.2, eps=1e-6):
    yield grpo_advantages(r, g, eps=eps)
    yield grpo_advantages(r, g, scale_by_std=False)
    yield rloo_advantages(r, g)
    for s in STRATEGIES:
        yield avspo_advantages(
            r,
            g,
            tau_adapt=tau_adapt,
            strategy=s,
            eps=eps,
            generator=torch.Generator().manual_seed(0),
        )


@settings(max_examples=150, deadline=None)
@given(batches(), st.sampled_from([0.0, 1e-6]))
def test_never_nan_and_collapsed_zero_under_grpo(batch, eps):
    r, g = t(batch[0]), ids(batch[1])
    for res in run_all(r, g, eps=eps):
        assert torch.isfinite(res.advantages).all()
    base = grpo_advantages(r, g, eps=eps)
    collapsed_samples = base.collapsed[base.group_index]
    assert (base.advantages[collapsed_samples] == 0).all()


@settings(max_examples=100, deadline=None)
@given(batches(), st.randoms(use_true_random=False))
def test_permuting_samples_permutes_advantages(batch, rnd):
    r, g = t(batch[0]), ids(batch[1])
    perm = list(range(len(r)))
    rnd.shuffle(perm)
    p = torch.tensor(perm)
    for a, b in zip(run_all(r, g), run_all(r[p], g[p]), strict=True):
        assert torch.allclose(a.advantages[p], b.advantages, atol=1e-12)


@settings(max_examples=100, deadline=None)
@given(batches(), st.sampled_from([-3.0, 0.5, 2.0, 100.0]))
def test_shift_invariance_grpo_and_rloo(batch, c):
    r, g = t(batch[0]), ids(batch[1])
    for fn in (grpo_advantages, rloo_advantages):
        assert torch.allclose(fn(r, g).advantages, fn(r + c, g).advantages, atol=1e-9)


@settings(max_examples=150, deadline=None)
@given(
    batches(), st.floats(0.0, 1.0), st.sampled_from(STRATEGIES), st.sampled_from([None, 1, 3, 20])
)
def test_avspo_touches_only_collapsed_groups_when_triggered(batch, tau_adapt, strategy, k):
    r, g = t(batch[0]), ids(batch[1])
    base = grpo_advantages(r, g)
    res = avspo_advantages(
        r,
        g,
        tau_adapt=tau_adapt,
        strategy=strategy,
        k=k,
        generator=torch.Generator().manual_seed(1),
    )
    untouched = ~res.augmented[res.group_index]
    # Non-augmented groups (incl. every non-collapsed one) are bit-identical to GRPO.
    assert torch.equal(res.advantages[untouched], base.advantages[untouched])
    assert res.triggered == (res.acr > tau_adapt)
    assert torch.equal(res.augmented, res.collapsed & res.triggered)
    sizes = torch.bincount(res.group_index)
    assert ((res.k[res.augmented] >= 1) & (res.k[res.augmented] <= sizes[res.augmented])).all()
    assert (res.k[~res.augmented] == 0).all()
    assert res.num_virtual == int(res.k.sum())
    if strategy == "opposite" and k is None:
        assert (res.k[res.augmented] == 1).all()


# ----------------------------------------------------------------------------- loop reference


@pytest.mark.parametrize("seed", range(30))
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_vectorised_equals_loop_reference(seed, dtype):
    gen = torch.Generator().manual_seed(seed)
    m = int(torch.randint(1, 40, (1,), generator=gen))
    sizes = torch.randint(1, 17, (m,), generator=gen)
    gids = torch.randperm(1000, generator=gen)[:m] * (1 + seed % 3) - 300  # sparse, negative too
    group_ids = torch.repeat_interleave(gids, sizes)
    n = int(sizes.sum())
    kind = seed % 3
    if kind == 0:  # binary
        rewards = (torch.rand(n, generator=gen) < 0.5).double()
    elif kind == 1:  # partial credit
        rewards = torch.randint(0, 5, (n,), generator=gen).double() / 4
    else:  # continuous
        rewards = torch.rand(n, generator=gen, dtype=torch.float64)
    collapse = torch.rand(m, generator=gen) < 0.5  # force some groups to collapse
    first = torch.cumsum(sizes, 0) - sizes
    for j in collapse.nonzero().squeeze(1).tolist():
        rewards[first[j] : first[j] + sizes[j]] = rewards[first[j]]
    perm = torch.randperm(n, generator=gen)
    rewards, group_ids = rewards[perm].to(dtype), group_ids[perm]
    rl, gl = rewards.double().tolist(), group_ids.tolist()
    tol = dict(atol=1e-9) if dtype == torch.float64 else dict(atol=2e-4, rtol=1e-4)

    def close(vec, ref):
        assert torch.allclose(vec.double(), torch.tensor(ref, dtype=F64), **tol)

    close(grpo_advantages(rewards, group_ids).advantages, ref_grpo(rl, gl))
    close(
        grpo_advantages(rewards, group_ids, unbiased=False).advantages,
        ref_grpo(rl, gl, unbiased=False),
    )
    close(
        grpo_advantages(rewards, group_ids, scale_by_std=False).advantages,
        ref_grpo(rl, gl, scale_by_std=False),
    )
    close(rloo_advantages(rewards, group_ids).advantages, ref_rloo(rl, gl))
    tau_adapt = float(torch.rand(1, generator=gen)) * 0.6
    for strategy in STRATEGIES:
        for k in (None, 3):
            # Same draws as the estimator: K does not depend on the strategy (except opposite).
            _, ks_fixed, _ = ref_avspo(rl, gl, tau_adapt=tau_adapt, strategy="fixed", k=k)
            draws = torch.rand(
                sum(ks_fixed), generator=torch.Generator().manual_seed(seed), dtype=dtype
            )
            res = avspo_advantages(
                rewards,
                group_ids,
                tau_adapt=tau_adapt,
                strategy=strategy,
                k=k,
                generator=torch.Generator().manual_seed(seed),
            )
            ref, ks, acr = ref_avspo(
                rl,
                gl,
                tau_adapt=tau_adapt,
                strategy=strategy,
                k=k,
                random_values=iter(draws.double().tolist()),
            )
            assert res.acr == pytest.approx(acr)
            assert res.k.tolist() == ks
            close(res.advantages, ref)


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_closed_form_virtual_moments_match_explicit_values(strategy, dtype):
    # Groups with K = 1..7 and observed max rewards at the floor, partial credit and the top.
    k = torch.tensor([1, 2, 3, 4, 5, 6, 7] * 3)
    r_obs = torch.tensor([0.0] * 7 + [0.4] * 7 + [1.0] * 7, dtype=dtype)
    if strategy == "opposite":
        k = torch.ones_like(k)
    spec = VirtualSpec(strategy, reward_range=(0.0, 1.0), r_anchor=0.1)
    values = virtual_rewards(spec, k, r_obs, torch.Generator().manual_seed(0))
    mean, var = virtual_moments(spec, k, r_obs, torch.Generator().manual_seed(0))
    for j, kj in enumerate(k.tolist()):
        row = values[j, :kj].double()
        assert (values[j, kj:] == 0).all()
        assert mean[j].item() == pytest.approx(row.mean().item(), abs=1e-6)
        assert var[j].item() == pytest.approx(row.var(unbiased=False).item(), abs=1e-6)


def test_opposite_honours_a_fixed_k():
    # strategy opposite with k = 3 (issue 24: K was forced to 1). G = 4 all correct, v = 0 x 3:
    # {1, 1, 1, 1, 0, 0, 0}: mean 4/7, M2 = 4 (3/7)^2 + 3 (4/7)^2 = 84/49 = 12/7, unbiased
    # var (12/7) / 6 = 2/7, std 0.534522 -> A = (3/7) / 0.534522 = 0.801784 (eps 0).
    r = torch.tensor([1.0] * 4 + [1.0, 0.0, 1.0, 0.0], dtype=torch.float64)
    g = torch.tensor([0] * 4 + [1] * 4)
    res = avspo_advantages(r, g, tau_adapt=0.0, strategy="opposite", k=3, eps=0.0)
    assert res.k.tolist() == [3, 0] and res.num_virtual == 3
    assert res.advantages[:4].tolist() == pytest.approx([0.801784] * 4, abs=1e-6)
    # without k it stays the authors' single sample
    one = avspo_advantages(r, g, tau_adapt=0.0, strategy="opposite", eps=0.0)
    assert one.k.tolist() == [1, 0]
