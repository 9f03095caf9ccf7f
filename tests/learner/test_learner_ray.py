"""DeepSpeed learner ranks as Ray actors (real Ray, real DeepSpeed on gloo, 2 CPU ranks)."""

from __future__ import annotations

import dataclasses
import math

import pytest
import ray
import torch

from learner.advantage_stage import AdvantageStage
from learner.config import AlgorithmConfig, LearnerConfig
from learner.group import LearnerGroup
from learner.loss import LossConfig, policy_loss
from learner.tempered_logits import token_logprobs
from learner.trigger import TriggerConfig
from reward.verifiers import Verdict
from rollout.types import Group, Sample
from tests.helpers import train_batch
from tests.metric_names import SECTION5


def _reference_cfg(stage: int) -> LearnerConfig:
    """2 ranks whose one update is compared with a single-process AdamW step (see below for
    why adam_eps = 1e-3)."""
    return LearnerConfig(
        num_ranks=2,
        zero_stage=stage,
        lr=1e-3,
        adam_eps=1e-3,
        micro_batch_size=3,
        grad_clip=1.0,
        timeout_s=600,
    )


def _reference_update(model_dir, batch, cfg: LearnerConfig):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    opt = torch.optim.AdamW(
        model.parameters(),
        lr=cfg.lr,
        betas=tuple(cfg.betas),
        eps=cfg.adam_eps,
        weight_decay=cfg.weight_decay,
    )
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    out = policy_loss(
        token_logprobs(logits, batch.input_ids)[0],
        batch.old_logprobs,
        batch.advantages,
        batch.response_mask,
    )
    out.loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
    opt.step()
    return {k: v.detach() for k, v in model.state_dict().items()}


PROMPT_IDS, RESPONSE_IDS = [1, 10, 5, 15, 6, 11, 17], [7, 8, 2]


def _reference_run(group: LearnerGroup, batch, scorer) -> dict:
    """On a fresh ``group``: one update on ``batch``, its exports (every rank's state dict, the
    object-store sync's buckets, which ``scorer``, an hf engine, loads and scores a sequence
    with), then the batch with a NaN advantage and the export after it."""
    metrics = group.train_on(batch)
    states = group.export_weights(every_rank=True)
    # The object-store sync's export: 64 KiB buckets split the tiny model's ~13 MB (fp32)
    # over many objects (under ZeRO-3 each bucket gathered on its own), and the refs are
    # passed on as they are: the engine that loads them scores a sequence exactly as the
    # reference model with these weights does (test_two_ranks_match_a_single_process_update).
    refs = group.export_bucket_refs(2**16)
    buckets = ray.get(refs, timeout=60)
    scorer.load_weights(refs, version=1)
    scored = torch.tensor(scorer.score(PROMPT_IDS, RESPONSE_IDS))
    # then a NaN advantage: the step is skipped, the weights stay bit-identical (fp32; bf16
    # under ZeRO-3: test_zero3_skips_a_non_finite_step_in_bf16)
    poisoned = batch.select(list(range(len(batch))))
    poisoned.advantages[3] = float("nan")
    skipped = group.train_on(poisoned)["actor/skipped_steps"]
    unchanged = group.export_weights()
    return dict(metrics=metrics, states=states, buckets=buckets, scored=scored,
                skipped=skipped, unchanged=unchanged)  # fmt: skip


@pytest.fixture(scope="module")
def scorer(ray_cluster, tiny_model_dir):
    """One hf rollout worker for every stage of test_two_ranks_match_a_single_process_update:
    each run loads a complete set of weights into it before it scores (~6 core-s a start)."""
    from rollout.config import RolloutConfig
    from rollout.group import RolloutGroup

    rollout = RolloutGroup(RolloutConfig(engine="hf", num_workers=1), tiny_model_dir)
    yield rollout
    rollout.shutdown()


@pytest.fixture(scope="module")
def learner(ray_cluster, tiny_model_dir, scorer):
    """The module's shared 2-rank ZeRO-2 group (_reference_cfg(2)): fresh, it makes the ZeRO-2
    case of test_two_ranks_match_a_single_process_update (:func:`_reference_run`, kept in
    ``learner.reference``; a 2-rank group is ~11 core-s to start), then serves the tests below,
    which depend on no particular state of it (they compare with what they find)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    _, batch = train_batch(model)
    group = LearnerGroup(_reference_cfg(2), LossConfig(), tiny_model_dir)
    try:
        group.reference = _reference_run(group, batch, scorer)
        yield group
    finally:
        group.shutdown()


@pytest.mark.slow
@pytest.mark.parametrize("stage", [1, 2, 3])  # 1: experiment=smollm2_cpu's (one reduction a step)
def test_two_ranks_match_a_single_process_update(request, scorer, tiny_model_dir, stage):
    """Two ranks' update equals a single-process AdamW step; the NaN step after it is skipped;
    the object-store buckets hold the same weights, which an engine scores with. ZeRO-2's run
    is the shared ``learner`` fixture's, made when it was fresh."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    _, batch = train_batch(model)
    # Adam's first step is ~lr * g / (|g| + eps): with eps = 1e-8 a gradient that differs by
    # float reduction order (1e-10) can move a weight by lr * 1e-2. eps = 1e-3 keeps that
    # amplification at most lr / eps = 1, so the comparison below can be tight.
    cfg = _reference_cfg(stage)
    if stage == 2:
        run = request.getfixturevalue("learner").reference
    else:
        group = LearnerGroup(cfg, LossConfig(), tiny_model_dir)
        try:
            run = _reference_run(group, batch, scorer)
        finally:
            group.shutdown()
    metrics, states, buckets = run["metrics"], run["states"], run["buckets"]
    got, skipped, unchanged = run["scored"], run["skipped"], run["unchanged"]
    expected = _reference_update(tiny_model_dir, batch, cfg)
    assert metrics["actor/skipped_steps"] == 0 and metrics["actor/optimizer_steps"] == 1
    before = model.state_dict()
    moved = max((expected[k] - before[k]).abs().max().item() for k in expected)
    assert moved > 1e-4  # the update really moves the weights
    # Equal up to float summation order: the tied embedding's gradient sums the softmax over
    # the vocabulary at every position, ~1e-7 relative error at |g| ~ 1, which Adam's first step
    # (slope lr / eps = 1 in g) passes on. Measured 2.7e-7 (ZeRO-2) and 2.8e-7 (ZeRO-3) on the
    # pinned FAST_TINY, on an AMD EPYC; the bound lr * 1e-3 = 1e-6 is 100x below the update
    # and far below a real error: a rank's gradient not averaged in (g doubled) moves a weight
    # with |g| ~ eps by lr * (2/3 - 1/2) ~ 1.7e-4.
    for state in states:  # both ranks hold the same, reference-equal weights
        for k, v in expected.items():
            assert torch.allclose(state[k], v, atol=1e-3 * 1e-3, rtol=0), (
                stage,
                k,
                (state[k] - v).abs().max(),
            )
    for k in expected:
        assert torch.equal(states[0][k], states[1][k])
    assert skipped == 1.0 and all(torch.equal(unchanged[k], states[0][k]) for k in expected)
    # Buckets: at most 64 KiB unless one tensor alone is larger; every parameter once (the tied
    # lm_head is the embedding), bit-equal to the full export.
    params = dict(model.named_parameters())
    assert len(buckets) > 10
    for bucket in buckets:
        size = sum(t.numel() * t.element_size() for t in bucket.values())
        assert size <= 2**16 or len(bucket) == 1, (len(bucket), size)
    merged = {k: v for bucket in buckets for k, v in bucket.items()}
    assert list(merged) == list(params)
    assert all(torch.equal(merged[k], states[0][k]) for k in merged)
    group_state = states[0]
    model.load_state_dict(group_state)
    with torch.no_grad():
        ids = torch.tensor([PROMPT_IDS + RESPONSE_IDS])
        want = token_logprobs(model(input_ids=ids).logits, ids)[0][0, len(PROMPT_IDS) :]
    assert torch.allclose(got, want, atol=1e-5)


def _weights(group):
    return group.export_weights(every_rank=False)


@pytest.mark.slow
def test_ranks_skip_deepspeeds_shared_memory_all_reduce(learner):
    """DeepSpeed's CPU shared-memory all-reduce serves only ``inference_all_reduce``
    (tensor-parallel inference); a training all-reduce goes through torch.distributed. The
    ranks skip it: no JIT build of its op (~35 s on a fresh machine), no /dev/shm buffers that a
    killed rank would leave behind. (Before the skip every rank held the loaded op.)"""

    def op_loaded(rank) -> bool:
        import deepspeed.comm.comm as ds_comm

        return ds_comm.cdb.shm_comm_op is not None

    got = ray.get([r.__ray_call__.remote(op_loaded) for r in learner.ranks], timeout=60)
    assert got == [False, False]


@pytest.mark.slow
@pytest.mark.parametrize("poison", ["nan_advantage", "nan_old_logprob"])
def test_non_finite_step_is_skipped_and_weights_unchanged(learner, tiny_model_dir, poison):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    _, batch = train_batch(model, seed=5)
    if poison == "nan_advantage":
        batch.advantages[3] = float("nan")
    else:
        row = 6
        col = int(batch.response_mask[row].nonzero()[0])
        # NaN survives the log-ratio clamp (an -inf old log-prob no longer does: clamped to a
        # ratio of e^20, then clipped; tests/unit/test_loss.py)
        batch.old_logprobs[row, col] = float("nan")
    before = _weights(learner)
    metrics = learner.train_on(batch)
    after = _weights(learner)
    assert metrics["actor/skipped_steps"] == 1.0
    assert all(torch.equal(before[k], after[k]) for k in before)  # bit-identical


@pytest.mark.slow
def test_zero3_skips_a_non_finite_step_in_bf16(ray_cluster, tiny_model_dir):
    """issue 26: ZeRO-3 decides by the global grad norm (DeepSpeed >= 0.19.8, the floor in
    pyproject.toml; 0.19.7 and earlier check overflow in fp16 only, so in bf16 the NaN step was
    applied and every weight became NaN). A NaN advantage: skipped, weights bit-identical (fp32:
    test_two_ranks_match_a_single_process_update[3])."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    _, batch = train_batch(model, seed=5)
    batch.advantages[3] = float("nan")
    cfg = LearnerConfig(
        num_ranks=2, zero_stage=3, lr=1e-3, micro_batch_size=4, dtype="bfloat16", timeout_s=600
    )
    group = LearnerGroup(cfg, LossConfig(), tiny_model_dir)
    try:
        before = _weights(group)
        metrics = group.train_on(batch)
        after = _weights(group)
    finally:
        group.shutdown()
    assert metrics["actor/skipped_steps"] == 1.0
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert all(bool(torch.isfinite(v).all()) for v in after.values())


def _engine_groups(groups, batch, logprob=None):
    """The synthetic groups with per-token log-probs as an engine reports them (batch's old
    log-probs, or a constant)."""
    rows = [(g, s) for g in groups for s in g.samples]
    return [
        Group(
            g.prompt,
            g.prompt_ids,
            [
                Sample(
                    s.response_ids,
                    batch.old_logprobs[i, batch.response_mask[i] > 0].tolist()
                    if logprob is None
                    else [logprob] * len(s.response_ids),
                    "",
                    "stop",
                    0,
                )
                for i, (gg, s) in enumerate(rows)
                if gg is g
            ],
        )
        for g in groups
    ]


# every group collapsed: all correct, all wrong, all correct, all wrong
_COLLAPSED = [Verdict(1.0, "ok")] * 4 + [Verdict(0.0, "wrong")] * 4
_COLLAPSED = _COLLAPSED + _COLLAPSED


@pytest.mark.slow
def test_advantage_stage_batch_trains_on_the_learner(learner, tiny_model_dir):
    """The driver's flow: AdvantageStage.process (AVSPO, trigger always) -> LearnerGroup."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    groups, batch = train_batch(model, seed=7)
    groups = _engine_groups(groups, batch)
    stage = AdvantageStage(
        AlgorithmConfig(trigger=TriggerConfig(policy="always")), reward_range=(0.0, 1.0), seed=0
    )
    before = _weights(learner)
    train, metrics, *_ = stage.process(groups, _COLLAPSED, prompt_keys=["a", "b", "c", "d"])
    metrics |= learner.train_on(train)
    after = _weights(learner)
    names = SECTION5 | {"actor/pg_loss", "actor/grad_norm", "actor/lr", "timing_s/update"}
    for name in sorted(names):
        assert name in metrics, name
    assert metrics["acr/raw"] == 1.0 and metrics["acr/effective"] == 0.0
    assert metrics["avspo/triggered"] == 1.0 and metrics["avspo/augmented_groups"] == 4.0
    assert metrics["actor/grad_norm"] > 0
    assert any(not torch.equal(before[k], after[k]) for k in before)  # AVSPO gave a gradient


@pytest.mark.slow
def test_all_collapsed_batch_gives_no_gradient_under_grpo(learner, tiny_model_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    groups, batch = train_batch(model, seed=7)
    groups = _engine_groups(groups, batch, logprob=-1.0)
    grpo = AlgorithmConfig(estimator="grpo", trigger=TriggerConfig(policy="never"))
    stage = AdvantageStage(grpo, reward_range=(0.0, 1.0), seed=0)
    train, metrics, *_ = stage.process(groups, _COLLAPSED)
    metrics |= learner.train_on(train)
    assert metrics["acr/raw"] == 1.0 and metrics["acr/effective"] == 1.0
    assert metrics["avspo/triggered"] == 0.0
    assert metrics["actor/grad_norm"] == 0.0  # nothing to learn from: the collapse AVSPO fixes


@pytest.mark.slow
def test_one_rank_gives_the_two_ranks_update(ray_cluster, tiny_model_dir):
    """One rank with other micro-batches (5,5,5,1 of 16 samples, padded to other lengths) makes
    the single-process update that two ranks make (3,3,2 on each: the ZeRO-2 case of
    test_two_ranks_match_a_single_process_update, on the same batch and bound), so one and two
    ranks give the same update."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    _, batch = train_batch(model)
    cfg = dataclasses.replace(_reference_cfg(2), num_ranks=1, micro_batch_size=5)
    group = LearnerGroup(cfg, LossConfig(), tiny_model_dir)
    try:
        group.train_on(batch)
        state = group.export_weights()
    finally:
        group.shutdown()
    expected = _reference_update(tiny_model_dir, batch, cfg)
    # Equal up to float summation order, within the bound of the two-rank test above and for
    # its reasons (lr * 1e-3 = 1e-6; one rank against two measured 2.8e-7 on an Intel Xeon and
    # under 1e-7 on an AMD EPYC before this test compared with the reference). A dropped or
    # repeated micro-batch would change the gradient by a whole per-sample gradient's share.
    before = model.state_dict()
    moved = max((expected[k] - before[k]).abs().max().item() for k in expected)
    assert moved > 1e-4  # the update really moves the weights
    for k, v in expected.items():
        diff = (state[k] - v).abs().max().item()
        assert diff <= 1e-3 * 1e-3, (k, diff)


@pytest.mark.slow
def test_kl_to_the_reference_model(ray_cluster, tiny_model_dir):
    """kl_coef > 0 loads a frozen reference: KL is 0 (and so is its gradient) while the policy
    equals it; after one update the KL is positive and changes the next update."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    _, first = train_batch(model, seed=3)
    _, second = train_batch(model, seed=4)
    results = {}
    for kl in (0.0, 0.5):  # one rank each: each rank holds its own reference; two: tests above
        cfg = LearnerConfig(
            num_ranks=1, zero_stage=2, lr=1e-2, micro_batch_size=4, adam_eps=1e-3, timeout_s=600
        )
        group = LearnerGroup(cfg, LossConfig(kl_coef=kl), tiny_model_dir)
        try:
            m1 = group.train_on(first)
            after_first = group.export_weights()
            m2 = group.train_on(second)
            results[kl] = (m1, after_first, m2, group.export_weights())
        finally:
            group.shutdown()
    (_, w1_0, _, w2_0), (m1_k, w1_k, m2_k, w2_k) = results[0.0], results[0.5]
    assert m1_k["actor/kl_loss"] == pytest.approx(0.0, abs=1e-9)
    for k in w1_0:  # first update: no KL gradient at policy == reference
        assert torch.allclose(w1_0[k], w1_k[k], atol=1e-7, rtol=1e-6), k
    assert m2_k["actor/kl_loss"] > 1e-6
    assert any(not torch.allclose(w2_0[k], w2_k[k], atol=1e-6) for k in w2_0)


@pytest.mark.slow
def test_update_moves_log_probs_in_the_advantages_direction(ray_cluster, tiny_model_dir):
    """A small first step from a fresh optimizer raises sum_i A_i * log p(response_i): the
    policy-gradient objective, to first order (a shared, already-stepped optimizer would add
    its momentum from earlier batches, so this test owns its learner)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    _, batch = train_batch(model, seed=11)
    batch.advantages = torch.tensor([1.0, -1.0] * (len(batch) // 2))

    def seq_logprobs(state):
        model.load_state_dict(state)
        with torch.no_grad():
            logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
        return (token_logprobs(logits, batch.input_ids)[0] * batch.response_mask).sum(1)

    # one rank: what is tested is the update's direction (the rank count is the tests' above)
    cfg = LearnerConfig(num_ranks=1, zero_stage=2, lr=1e-5, micro_batch_size=4, timeout_s=600)
    group = LearnerGroup(cfg, LossConfig(), tiny_model_dir)
    try:
        before = seq_logprobs(group.export_weights())
        group.train_on(batch)
        delta = seq_logprobs(group.export_weights()) - before
    finally:
        group.shutdown()
    assert float((batch.advantages * delta).sum()) > 0
    assert delta[batch.advantages > 0].mean() > delta[batch.advantages < 0].mean()


@pytest.mark.slow
def test_zero_stage_0_matches_and_skips_non_finite_steps(ray_cluster, tiny_model_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    _, batch = train_batch(model, seed=13)
    cfg = _reference_cfg(0)
    group = LearnerGroup(cfg, LossConfig(), tiny_model_dir)
    try:
        assert group.train_on(batch)["actor/skipped_steps"] == 0
        updated = group.export_weights()
        poisoned = batch.select(list(range(len(batch))))
        poisoned.advantages[5] = float("nan")
        assert group.train_on(poisoned)["actor/skipped_steps"] == 1
        after = group.export_weights()
    finally:
        group.shutdown()
    expected = _reference_update(tiny_model_dir, batch, cfg)
    for k, v in expected.items():
        assert torch.allclose(updated[k], v, atol=1e-7, rtol=1e-6), k
        assert torch.equal(after[k], updated[k]), k  # the NaN step changed nothing


def _mismatch_batch(model, row: int = 2):
    """Engine log-probs = the model's own minus noise, one token of ``row`` 3 nats lower (an
    engine that under-rates it: learner/engine ratio e^3 > cap 2)."""
    _, batch = train_batch(model, seed=21)
    with torch.no_grad():
        learner, _ = token_logprobs(
            model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits,
            batch.input_ids,
        )
    col = int(batch.response_mask[row].nonzero()[0])
    batch.old_logprobs[row, col] -= 3.0
    m = batch.response_mask.bool()
    diff = (learner - batch.old_logprobs)[m]  # learner - engine per response token
    return batch, diff


@pytest.mark.slow
def test_recompute_mode_logs_the_mismatch_and_weights_tokens(ray_cluster, tiny_model_dir):
    """learner.old_logprobs=recompute: the old log-probs are the learner's (recomputed once,
    before the first of 2 epochs), each token weighted by min(exp(learner - engine), 2).
    Expected figures are computed here from the same weights (hand formula, not the code's)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    batch, diff = _mismatch_batch(model)
    cfg = LearnerConfig(
        num_ranks=2,
        zero_stage=2,
        lr=1e-4,
        micro_batch_size=4,
        ppo_epochs=2,
        mini_batch_size=None,
        old_logprobs="recompute",
        tis_cap=2.0,
        grad_clip=1e3,  # never binds
        timeout_s=600,
    )
    group = LearnerGroup(cfg, LossConfig(), tiny_model_dir)
    try:
        m = group.train_on(batch)
    finally:
        group.shutdown()
    weights = torch.clamp(torch.exp(diff), max=2.0)
    assert m["rollout/logprob_abs_diff_mean"] == pytest.approx(float(diff.abs().mean()), abs=1e-5)
    assert m["rollout/logprob_abs_diff_max"] == pytest.approx(float(diff.abs().max()), abs=1e-5)
    assert m["rollout/is_weight_mean"] == pytest.approx(float(weights.mean()), abs=1e-5)
    # only the poisoned token: e^(3 + noise) > 2; noise 0.05 keeps the others below ln 2
    assert m["rollout/is_clipped_frac"] == pytest.approx(1 / diff.numel())
    # counts cover every epoch: 2 epochs x 1 mini-batch (the old code reported epoch 1 only)
    assert m["actor/optimizer_steps"] == 2.0 and m["actor/skipped_steps"] == 0.0
    assert m["actor/grad_clip_frac"] == 0.0
    assert m["perf/learner_tokens"] == batch.num_tokens
    assert m["actor/entropy"] > 0 and math.isfinite(m["actor/pg_loss"])


@pytest.mark.slow
def test_bypass_mode_measures_the_mismatch_on_every_minibatch(ray_cluster, tiny_model_dir):
    """bypass (engine old log-probs): no weights (mean 1); the numerical gap is measured on
    every mini-batch before any optimizer step (the first one's forward pass for free, the
    others by a no-grad forward), on samples of the version the learner holds (lag 0). The
    poisoned token sits in the 2nd of 2 mini-batches (issue 24: only the first was measured).
    One row of the first mini-batch is one version old (policy_version 6, the learner at 7):
    its tokens go to rollout/logprob_lag_abs_diff_*, not into the numerical gap."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    batch, _ = _mismatch_batch(model, row=13)
    batch.policy_version[:] = 7
    batch.policy_version[1] = 6
    with torch.no_grad():
        learner, _ = token_logprobs(
            model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits,
            batch.input_ids,
        )
    gap = (learner - batch.old_logprobs).abs()  # [B, T]
    mask = batch.response_mask.bool()
    lagged = torch.zeros_like(mask)
    lagged[1] = mask[1]
    fresh = mask & ~lagged
    cfg = LearnerConfig(
        num_ranks=2,
        zero_stage=2,
        lr=1e-4,
        micro_batch_size=4,
        mini_batch_size=8,
        grad_clip=1e-9,  # binds on every step
        timeout_s=600,
    )
    group = LearnerGroup(cfg, LossConfig(), tiny_model_dir)
    try:
        m = group.train_on(batch, learner_version=7)
    finally:
        group.shutdown()
    assert m["actor/optimizer_steps"] == 2.0  # 16 rows in 2 mini-batches of 8
    assert m["rollout/logprob_abs_diff_mean"] == pytest.approx(float(gap[fresh].mean()), abs=1e-5)
    assert m["rollout/logprob_abs_diff_max"] == pytest.approx(float(gap[fresh].max()), abs=1e-5)
    assert m["rollout/logprob_abs_diff_max"] > 2.9  # the poisoned token of mini-batch 2
    assert m["rollout/logprob_lag_abs_diff_mean"] == pytest.approx(
        float(gap[lagged].mean()), abs=1e-5
    )
    assert m["rollout/lagged_token_frac"] == pytest.approx(float(lagged.sum() / mask.sum()))
    assert m["rollout/is_weight_mean"] == 1.0 and m["rollout/is_clipped_frac"] == 0.0
    assert m["actor/grad_clip_frac"] == 1.0
