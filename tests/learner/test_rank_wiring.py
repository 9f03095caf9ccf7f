"""The ``learner`` and ``algorithm.loss`` keys a learner rank reads itself, inside DeepSpeed's
start or the update (learner/rank.py ``LearnerRank.init``, learner/rank_update.py): ``seed``
seeds torch before the policy is built and draws the bf16 dither, ``bf16_masters`` picks the
dither, ``kl_coef`` > 0 loads the frozen reference and hands it to the update, ``tis_cap``
truncates the importance weights of recomputed old log-probs. Each key is set to a value other
than its default and must change what the rank does. No Ray, no DeepSpeed, no process group:
the rank's collaborators are stand-ins that record what they get. (The same paths in real
DeepSpeed ranks, marked slow: the dither in tests/learner/test_bf16_masters.py and
test_checkpoint.py, the reference in test_learner_ray.py ``test_kl_to_the_reference_model``,
tis_cap in its ``test_recompute_mode_logs_the_mismatch_and_weights_tokens``.)"""

from __future__ import annotations

import dataclasses
import sys
import types

import pytest
import torch

import learner.rank as rank_module
from learner.batch import plan_microbatches
from learner.config import LearnerConfig
from learner.loss import LossConfig
from learner.rank_update import RankUpdate
from learner.update import RankMetrics
from tests.helpers import random_lm, train_batch


@pytest.fixture
def started(monkeypatch):
    """``started(cfg, loss, dtype)``: a rank through ``init`` with every collaborator a stand-in;
    returns (the rank, what the stand-ins were given)."""
    seen: dict = {}
    # built before the stand-in DeepSpeed module (transformers asks for deepspeed's spec)
    model, frozen = random_lm("Llama", 1, 16, 32, 2, 2, 50), random_lm("Llama", 1, 16, 32, 2, 2, 50)
    monkeypatch.setitem(sys.modules, "deepspeed", types.SimpleNamespace(init_distributed=dict))
    monkeypatch.setattr("comm.rendezvous.tcp_store", lambda *a, **k: None)
    monkeypatch.setattr(rank_module, "skip_shm_all_reduce", lambda: None)
    monkeypatch.setattr(torch.distributed, "init_process_group", lambda *a, **k: None)
    engine = types.SimpleNamespace(module=model, device=torch.device("cpu"))

    def deepspeed_engine(self):
        seen["seed"] = torch.initial_seed()  # what torch was seeded with before the build
        return engine, None, None

    def load_reference(path, cfg, dtype, trainable=True):
        seen["reference"] = (path, dtype, trainable)
        return frozen.train().requires_grad_(True)

    def dither(module, seed):
        seen["dither"] = (module, seed)

    monkeypatch.setattr(rank_module.LearnerRank, "_deepspeed_engine", deepspeed_engine)
    monkeypatch.setattr(rank_module, "load_policy", load_reference)
    monkeypatch.setattr(rank_module, "dither_masters", dither)
    monkeypatch.setattr(rank_module, "WeightExport", lambda *a: None)
    given = lambda *a, **k: seen.setdefault("update", {"args": a, **k})  # noqa: E731
    monkeypatch.setattr(rank_module, "RankUpdate", given)
    monkeypatch.setattr(rank_module, "logits_problem", lambda engine: None)
    monkeypatch.setattr(rank_module.LearnerRank, "_on_any_rank", lambda self, problem, d: problem)
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")  # what the rank sets, restored after
    monkeypatch.setenv("TORCHDYNAMO_DISABLE", "1")
    threads = torch.get_num_threads()

    def start(cfg: LearnerConfig, loss: LossConfig | None = None, dtype: str = "float32"):
        seen.clear()
        loss = loss or LossConfig()
        cfg = dataclasses.replace(cfg, shared_prefix=False)  # its own check: test_learner_wiring
        rank = rank_module.LearnerRank(0, 1, cfg, loss, "/models/m", dtype, threads=threads)
        monkeypatch.setattr(rank, "_listener", lambda port: None)
        rank.init("127.0.0.1", 1)
        return rank, dict(seen)

    yield start
    torch.set_num_threads(threads)


def test_learner_seed_seeds_torch_before_the_policy_is_built(started):
    assert started(LearnerConfig(seed=7))[1]["seed"] == 7
    assert started(LearnerConfig())[1]["seed"] == 0  # null: 0


def test_bf16_masters_and_seed_reach_the_dither(started):
    rank, seen = started(LearnerConfig(seed=7, bf16_masters="dither"), dtype="bfloat16")
    assert seen["dither"] == (rank.engine.module, 7)
    assert "dither" not in started(LearnerConfig(bf16_masters="grid"), dtype="bfloat16")[1]
    assert "dither" not in started(LearnerConfig(bf16_masters="dither"))[1]  # fp32: no masters


def test_kl_coef_loads_the_frozen_reference_and_hands_it_to_the_update(started):
    rank, seen = started(LearnerConfig(), LossConfig(kl_coef=0.1))
    assert seen["reference"] == ("/models/m", "float32", False)
    reference = seen["update"]["reference"]
    assert reference is rank.reference and not reference.training
    assert not any(p.requires_grad for p in reference.parameters())
    rank, seen = started(LearnerConfig(), LossConfig())  # kl_coef 0: none loaded
    assert "reference" not in seen and seen["update"]["reference"] is None


def test_the_rank_hands_its_settings_to_the_update(started):
    cfg, loss = LearnerConfig(old_logprobs="recompute", tis_cap=3.0), LossConfig(clip_high=0.3)
    rank, seen = started(cfg, loss)
    update = seen["update"]
    assert update["world_size"] == 1 and update["device"] == "cpu"
    engine, _, cfg_given, loss_given = update["args"]
    assert engine is rank.engine and loss_given is loss
    assert (cfg_given.tis_cap, cfg_given.old_logprobs) == (3.0, "recompute")


# ---- tis_cap in the update (learner/rank_update.py ``_recompute_old``) ------------------------


def recomputed(tis_cap: float | None):
    model = random_lm("Llama", 1, 16, 32, 2, 2, 50)
    _, batch = train_batch(model, seed=3)
    batch.old_logprobs = batch.old_logprobs - 1.0 * batch.response_mask  # the engine 1 nat lower
    cfg = LearnerConfig(old_logprobs="recompute", tis_cap=tis_cap)
    update = RankUpdate(
        model, None, cfg, LossConfig(), temperature=1.0, logits="chunked", shared_prefix=False,
        pack="off", reference=None, world_size=1, device="cpu",
    )  # fmt: skip
    (plan,) = plan_microbatches(
        [batch], micro_batch_size=16, micro_batch_tokens=None, chunk_tokens=64
    )
    return batch, update._recompute_old(batch, RankMetrics(), plan)


def test_tis_cap_truncates_the_importance_weights():
    # the learner's log-probs are the engine's + 1 nat - noise (|noise| ~ 0.05): the weights are
    # ~ e = 2.72 on response tokens; a cap of 2 takes them to 2, no cap leaves none
    batch, out = recomputed(2.0)
    mask = batch.response_mask.bool()
    ratio = torch.exp(out.old_logprobs - batch.old_logprobs)
    assert torch.equal(out.is_weights[mask], torch.clamp(ratio, max=2.0)[mask])
    assert out.is_weights[mask].max() == 2.0 and (out.is_weights[~mask] == 0).all()
    wider = recomputed(4.0)[1].is_weights[mask]
    assert wider.max() > 2.5 and torch.allclose(wider, ratio[mask])
    assert recomputed(None)[1].is_weights is None
