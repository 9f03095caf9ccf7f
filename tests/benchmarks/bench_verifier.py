"""Benchmark: verifier pool throughput (items/s) with 1 and 2 workers, normal and 10% hostile.

    make bench      # or: .venv/bin/python tests/benchmarks/bench_verifier.py [--items 2000]

Normal items: arithmetic answers under the ``numeric`` verifier and LaTeX answers under ``math``
(half equivalent forms that need math-verify, half exact numbers). Hostile items (10%): cycled
from the pool tests' list (towers of powers, 5,000 unclosed boxes, deep fractions, Python in a
box, 100k characters, NUL bytes); the ones that hang cost a full timeout each, on one worker.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from reward.pool import PoolConfig, VerifierPool  # noqa: E402
from tests.reward.test_pool import HOSTILE  # noqa: E402


def items(kind: str, n: int, hostile_share: float, seed: int = 0):
    rng = random.Random(seed)
    hostile = list(HOSTILE.values())
    responses, references = [], []
    for i in range(n):
        a, b = rng.randint(10, 99), rng.randint(10, 99)
        if rng.random() < hostile_share:
            responses.append(hostile[i % len(hostile)])
        elif kind == "numeric":
            responses.append(f"{a}+{b}={a + b + rng.choice([0, 0, 1])}")
        elif i % 2:
            responses.append(f"The answer is \\boxed{{\\frac{{{a}}}{{{2 * a}}}}}")  # 1/2
        else:
            responses.append(f"so \\boxed{{\\sqrt{{{a * a}}}}}")  # math-verify path
        references.append(
            str(a + b) if kind == "numeric" else ("\\frac{1}{2}" if i % 2 else str(a))
        )
    return responses, references


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--items", type=int, default=1000)
    parser.add_argument("--timeout", type=float, default=1.0)
    parser.add_argument("--max-items-per-worker", type=int, default=None,
                        help="verifier.max_items_per_worker (default: the pool's)")  # fmt: skip
    args = parser.parse_args()
    extra = {}
    if args.max_items_per_worker:
        extra["max_items_per_worker"] = args.max_items_per_worker
    header = ("verifier", "workers", "hostile", "items/s", "timeouts", "errors")
    print(" ".join(f"{h:>9}" for h in header))
    for kind in ("numeric", "math"):
        for workers in (1, 2):
            cfg = PoolConfig(num_workers=workers, timeout_s=args.timeout, **extra)
            with VerifierPool(cfg) as pool:
                pool.verify(*items(kind, 20, 0.0), verifier=kind)  # workers up and warm
                for share in (0.0, 0.1):
                    responses, references = items(kind, args.items, share)
                    t0 = time.perf_counter()
                    verdicts = pool.verify(responses, references, verifier=kind)
                    rate = len(verdicts) / (time.perf_counter() - t0)
                    timeouts = sum(v.reason == "timeout" for v in verdicts)
                    errors = sum(v.reason == "error" for v in verdicts)
                    row = (kind, workers, f"{share:.0%}", f"{rate:.1f}", timeouts, errors)
                    print(" ".join(f"{v:>9}" for v in row))


if __name__ == "__main__":
    main()
