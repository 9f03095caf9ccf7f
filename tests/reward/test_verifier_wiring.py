"""Every ``verifier`` key the pool hands down reaches its worker processes: the pool config ->
each worker's resource limits (reward/worker_io.py ``worker_limits``), its audit hook, the
number of workers and an item's wall-clock limit, as a started pool and its workers' own report
of their sandbox say. Each key is set to a value other than its default and must change what
the workers get. (``step_budget_s``, ``max_items_per_worker``'s recycling and ``sandbox`` are
checked by tests/reward/test_pool.py and test_pool_boundary.py.)"""

from __future__ import annotations

import dataclasses
import math

import pytest

from reward.pool import PoolConfig
from reward.worker_io import worker_limits
from tests.helpers import pool_loading

MIB = 2**20
# Non-default settings: 700 MiB; 3 CPU s per item; a 7 s wall limit (the per-item CPU default
# is 2 x timeout_s: 14 s); 4.5 s to start (ceil 5); 6 items per worker. Hard limit 5 + 6 x 3.
SETTINGS = dict(
    memory_mb=700, cpu_time_s=3, timeout_s=7.0, start_timeout_s=4.5, max_items_per_worker=6
)


def test_the_defaults_limits():
    # 1536 MiB; cpu_time_s null: ceil(2 x 2.0) = 4 CPU s per item; hard ceil(60) + 512 x 4
    assert worker_limits(PoolConfig()) == (1536 * MIB, 60 + 512 * 4, 4)


@pytest.mark.parametrize(
    "key, want",
    [
        ("memory_mb", (700 * MIB, 60 + 512 * 4, 4)),
        ("cpu_time_s", (1536 * MIB, 60 + 512 * 3, 3)),
        ("timeout_s", (1536 * MIB, 60 + 512 * 14, 14)),  # cpu_time_s null: 2 x 7 s
        ("start_timeout_s", (1536 * MIB, 5 + 512 * 4, 4)),
        ("max_items_per_worker", (1536 * MIB, 60 + 6 * 4, 4)),
    ],
)
def test_each_pool_key_reaches_the_workers_limits(key, want):
    got = worker_limits(dataclasses.replace(PoolConfig(), **{key: SETTINGS[key]}))
    assert got == want != worker_limits(PoolConfig())


def test_a_set_cpu_time_overrides_the_one_from_the_wall_limit():
    cfg = PoolConfig(**SETTINGS)
    assert worker_limits(cfg) == (700 * MIB, math.ceil(4.5) + 6 * 3, 3)


def test_a_started_pool_holds_what_its_config_says():
    """A started pool: as many workers as ``num_workers`` (1; the default is 2); its workers'
    own report of their sandbox: the address space and the hard CPU limit of the config (700
    MiB, 5 + 6 x 3 = 23 CPU s) and no audit hook when it is turned off; an item with no limit
    of its own gets ``timeout_s`` (0.5 s here: a 1.5 s item times out, under the default 2 s it
    would pass)."""
    cfg = PoolConfig(num_workers=1, audit_hook=False, **SETTINGS | {"timeout_s": 0.5})
    with pool_loading("tests.reward.fault_verifiers", cfg) as pool:
        workers = len(pool._workers)  # the busy ones; a spare waits beside them
        report = pool.protections
        (slept,) = pool.verify(["1.5"], [""], verifier="_test_sleep")
    assert workers == 1
    assert slept.reason == "timeout"
    assert report["audit_hook"].startswith("OFF")
    if not report["rlimits"].startswith("in force"):
        pytest.skip(f"rlimits are not in force on this machine: {report['rlimits']}")
    assert "address space 700 MiB, 23 CPU s in all" in report["rlimits"]


def test_start_timeout_s_is_the_warm_up_deadline(monkeypatch):
    """A verifier whose warm-up (its slow imports, in each worker before its first item) takes
    1.5 s: under ``start_timeout_s`` 0.5 the pool stops with one error naming the key; under the
    default (60 s) the same items pass (test_pool.py)."""
    from reward.pool import VerifierPool

    monkeypatch.setenv("AVSPO_VERIFIER_MODULES", "tests.reward.fault_verifiers")
    with VerifierPool(PoolConfig(num_workers=1, start_timeout_s=4.0)) as pool:
        pool.verify(["x"], [""], verifier="_test_score")
        while not all(w.ready for w in [*pool._workers, pool._spare]):  # the spare too
            pool._collect([], 0.0, 0.0)  # started: the start clock is done
        # 0.5 s from here on (the pool reads its config at each use): too short for a worker's
        # own start on a loaded machine, so the worker starts under 4 s first
        pool.cfg = dataclasses.replace(pool.cfg, start_timeout_s=0.5)
        with pytest.raises(RuntimeError, match=r"within 0\.5 s \(verifier\.start_timeout_s\)"):
            pool.verify(["x"], [""], verifier="_test_slow_warm")
