"""Random streams of a run (rollout/seeding.py): every (step, round, prompt position, sample)
and every evaluation call draws from its own stream, whichever worker generates it."""

from __future__ import annotations

from rollout.seeding import derive_seed, prompt_seed, sample_seed


def test_every_stream_of_a_run_is_distinct():
    # The driver's call seeds (launch/loop.py) and the seed the rollout group gives every
    # worker's call (rollout/group.py; samples are named by their position in the whole call,
    # rollout/shares.py): 30 steps x 3 DAPO rounds x 32 positions x 8 samples, plus 4
    # evaluation calls x 16 positions x 8 samples. The old scheme (call seed + worker, vLLM's
    # seed + j for every prompt of a call) gave 16 prompts the same 8 streams.
    seeds = []
    for step in range(1, 31):
        for rnd in range(3):
            s = derive_seed(derive_seed(0, "train", step, rnd), "worker", 0)
            seeds += [sample_seed(s, p, j) for p in range(32) for j in range(8)]
    for step in (0, 10, 20, 30):
        s = derive_seed(0, "eval", step)
        seeds += [sample_seed(s, p, j) for p in range(16) for j in range(8)]
    assert len(set(seeds)) == len(seeds) == 30 * 3 * 32 * 8 + 4 * 16 * 8
    assert all(0 <= x < 2**63 for x in seeds)  # valid torch / vLLM seeds


def test_seeds_are_stable_and_follow_vllms_child_rule():
    # a fixed value: seeds must not change between Python processes or versions (resume)
    assert derive_seed(0, "train", 1, 0) == 481387903933191406  # blake2b, not Python's hash()
    assert derive_seed(1, "train", 1, 0) != derive_seed(0, "train", 1, 0)
    assert [sample_seed(42, 3, j) - prompt_seed(42, 3) for j in range(4)] == [0, 1, 2, 3]
