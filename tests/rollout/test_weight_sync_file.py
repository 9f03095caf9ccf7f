"""The object-store sync when the engines share learner rank 0's node: rank 0 writes the weights
into one file in shared memory and the engines get its path (rollout/weight_sync.py,
learner/export.py ``write_file``), on real Ray actors, DeepSpeed ranks and both engines."""

from __future__ import annotations

import os

import pytest
import torch

from tests.rollout.test_weight_sync_collective import _forward_logprobs


@pytest.mark.slow
def test_engines_load_the_learners_file_rewritten_in_place(ray_cluster, tiny_model_dir):
    """After each update of 2 ZeRO-3 ranks, one sync makes both hf engines score a sequence as
    the learner's exported weights do. The second sync rewrites the same file (same inode and
    size: its pages stay allocated), and the learner's shutdown removes it. 64 KiB buckets
    split the ~3.4 MB (fp32) of FAST_TINY over many gathers, each written as it comes. vLLM's
    side of a file load (its workers map the path and reload in place) is the path its own
    object-store sync takes: tests/rollout/test_engines_ray.py checks it against a pushed
    state dict, tied lm_head included."""
    engine, workers, ranks, stage = "hf", 2, 2, 3
    from transformers import AutoModelForCausalLM

    from learner.config import LearnerConfig
    from learner.group import LearnerGroup
    from learner.loss import LossConfig
    from rollout.config import RolloutConfig
    from rollout.group import RolloutGroup
    from rollout.weight_sync import WeightSync
    from tests.helpers import train_batch

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    _, batch = train_batch(model)
    cfg = LearnerConfig(num_ranks=ranks, zero_stage=stage, lr=1e-2, micro_batch_size=8)
    learner = LearnerGroup(cfg, LossConfig(), tiny_model_dir)
    rollout = RolloutGroup(
        RolloutConfig(engine=engine, num_workers=workers, max_model_len=64, timeout_s=300,
                      weight_sync="object_store", weight_sync_bucket_mb=1 / 16),
        tiny_model_dir,
    )  # fmt: skip
    sync = WeightSync(rollout, learner)
    prompt_ids, response_ids = [1, 10, 5, 15, 6, 11, 17], [7, 8, 2]  # "<s>61-27=" -> "34</s>"
    states, scores, files = [], [], []
    try:
        for version in (1, 2):
            learner.train_on(batch)
            states.append(learner.export_weights())
            sync.sync(version=version)
            assert rollout.policy_versions() == [version] * workers
            assert sync.transport.file is not None and sync.transport.refs == []
            st = os.stat(sync.transport.file)
            files.append((sync.transport.file, st.st_ino, st.st_size))
            scores.append(
                [torch.tensor(rollout.score(prompt_ids, response_ids, w)) for w in range(workers)]
            )
    finally:
        rollout.shutdown()
        learner.shutdown()
    assert files[0] == files[1]  # one file, rewritten in place
    assert not os.path.exists(files[0][0])  # removed with the learner
    folder = os.path.dirname(files[0][0])  # its private folder (comm/weight_file.py) too
    assert os.path.basename(folder).startswith("avspo-weights-") and not os.path.exists(folder)
    n_params = sum(p.numel() for p in model.parameters())  # the tied lm_head once
    assert files[0][2] > 4 * n_params  # every fp32 weight once, plus the header
    old = _forward_logprobs(model, prompt_ids, response_ids)
    for state, got in zip(states, scores, strict=True):
        model.load_state_dict(state)
        expected = _forward_logprobs(model, prompt_ids, response_ids)
        assert (expected - old).abs().max() > 0.05  # each update really moved these log-probs
        old = expected
        for worker, s in enumerate(got):
            assert torch.allclose(s, expected, atol=1e-4), (engine, worker, s, expected)
