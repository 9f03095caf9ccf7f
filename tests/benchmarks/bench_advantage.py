"""Benchmark: avspo_advantages + collapse_stats on CPU, 1e3..1e6 rewards, groups of 8 and 16.

    make bench            # or: .venv/bin/python tests/benchmarks/bench_advantage.py [--threads 1]

Prints median times per call (AVSPO triggered, about half of the groups collapsed, so that the
virtual-sample path runs): ``collapse_stats`` alone, ``avspo_advantages`` (which computes its own
collapse statistics), both called separately, the latter per million rewards, and AVSPO's cost
relative to plain GRPO. In the training step the ACR monitor reuses the estimator's statistics
(``AdvantageResult.stats``), so a step pays the ``avspo`` column, not the ``separate`` one.
Target (issue 2): 1M rewards in well under 20 ms on one core.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from diagnostics.acr import collapse_stats
from learner.advantage import avspo_advantages, grpo_advantages


def make_batch(n: int, group_size: int, shuffle: bool, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    m = n // group_size
    p = torch.rand(m, generator=gen)  # per-prompt solve rate; ~half the groups end up collapsed
    p = torch.where(p < 0.25, 0.0, torch.where(p > 0.75, 1.0, p))
    rewards = (torch.rand(m, group_size, generator=gen) < p[:, None]).float().reshape(-1)
    group_ids = torch.arange(m).repeat_interleave(group_size) * 7 + 3  # sparse ids
    if shuffle:
        perm = torch.randperm(rewards.numel(), generator=gen)
        rewards, group_ids = rewards[perm], group_ids[perm]
    return rewards, group_ids


def timed(fn, reps: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--shuffle", action="store_true", help="samples of a group not adjacent")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {args.threads} thread(s), shuffled={args.shuffle}")
    print(
        f"{'rewards':>9} {'G':>3} {'ACR':>5} {'stats ms':>9} {'avspo ms':>9} {'separate':>9} "
        f"{'sep/1M':>8} {'avspo/grpo':>10}"
    )
    for n in (1_000, 10_000, 100_000, 1_000_000):
        for g in (8, 16):
            rewards, group_ids = make_batch(n, g, args.shuffle)
            reps = 50 if n <= 100_000 else 15

            def avspo(rewards=rewards, group_ids=group_ids):
                return avspo_advantages(rewards, group_ids, tau_adapt=0.1)

            def separate(rewards=rewards, group_ids=group_ids):
                collapse_stats(rewards, group_ids)
                return avspo_advantages(rewards, group_ids, tau_adapt=0.1)

            res = avspo()
            assert res.triggered and res.num_virtual > 0
            t_stats = timed(lambda r=rewards, i=group_ids: collapse_stats(r, i), reps)
            t_avspo = timed(avspo, reps)
            t_sep = timed(separate, reps)
            t_grpo = timed(lambda r=rewards, i=group_ids: grpo_advantages(r, i), reps)
            print(
                f"{n:>9} {g:>3} {res.acr:>5.2f} {t_stats * 1e3:>9.3f} {t_avspo * 1e3:>9.3f} "
                f"{t_sep * 1e3:>9.3f} {t_sep * 1e9 / n:>8.2f} {t_avspo / t_grpo:>9.2f}x"
            )


if __name__ == "__main__":
    main()
