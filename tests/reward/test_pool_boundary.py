"""The verifier pool as a boundary: what a worker sends is checked, a worker lives a bounded
number of items, nothing planted where a worker starts runs before its sandbox, and a worker
that ignores its soft CPU limit meets a hard one (issue: the verifier is a boundary)."""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

import pytest

from reward.pool import PoolConfig, VerifierPool
from reward.verifiers import Verdict
from tests.helpers import pool_loading


@pytest.fixture
def one_worker(monkeypatch):
    def make(**cfg) -> VerifierPool:
        monkeypatch.setenv("AVSPO_VERIFIER_MODULES", "tests.reward.sandbox_probes")
        return VerifierPool(PoolConfig(num_workers=1, timeout_s=5.0, **cfg))

    return make


def test_a_forged_verdict_for_another_item_kills_the_worker(one_worker):
    """Item 0 writes item 1's verdict (ok) on the pool's pipe, then answers its own. Before, the
    pool took the forged frame as item 1's verdict and the stale answer broke the next call;
    now item 0 is an error, item 1 gets its honest verdict, and the next call works."""
    with one_worker() as pool:
        got = pool.verify(["forge_next", "no"], ["", "yes"], verifier="_probe_lie")
        assert got == [Verdict(0.0, "error"), Verdict(0.0, "wrong")], pool.last_errors
        assert "while verifying item 0" in pool.last_errors[0]
        assert pool.replaced == 1
        assert pool.verify(["a", "b"], ["a", "c"], verifier="_probe_lie") == [
            Verdict(1.0, "ok"),
            Verdict(0.0, "wrong"),
        ]


def test_a_score_outside_the_reward_range_is_an_error(one_worker):
    """1e39 is finite in float64 (it passed the old isfinite check) and inf in float32."""
    with one_worker() as pool:
        (got,) = pool.verify(["huge"], [""], verifier="_probe_lie")
        assert got == Verdict(0.0, "error") and "outside the reward range" in pool.last_errors[0]
        # a task whose range is [-1, 2]: 1.5 would be a fair score there, 1e39 is not
        (got,) = pool.verify(["huge"], [""], verifier="_probe_lie", lowest=-1.0, highest=2.0)
        assert got == Verdict(-1.0, "error")


def test_an_overlong_message_kills_the_worker(one_worker):
    """1 MiB on the pipe (MAX_MESSAGE is 64 KiB): the pool reads no more of it."""
    with one_worker() as pool:
        (got,) = pool.verify(["flood"], [""], verifier="_probe_lie")
        assert got.reason == "error" and pool.replaced == 1
        assert pool.verify(["a"], ["a"], verifier="_probe_lie") == [Verdict(1.0, "ok")]


def test_a_worker_that_erred_is_replaced_with_what_it_changed(one_worker):
    """An item replaces the numeric verifier of its worker with one that always says ok, then
    fails: the worker is recycled, so the next items are scored by a fresh one."""
    with one_worker() as pool:
        (got,) = pool.verify(["patch_numeric_and_fail"], [""], verifier="_probe_lie")
        assert got.reason == "error"
        assert pool.verify(["so 20"], ["19"], verifier="numeric") == [Verdict(0.0, "wrong")]


def test_a_silent_change_lives_at_most_max_items_per_worker(one_worker):
    """The same change with no error: it holds for the rest of its worker's items, here 3 in
    all (the patching item, then two numeric ones), and not after."""
    with one_worker(max_items_per_worker=3) as pool:
        pool.verify(["patch_numeric"], [""], verifier="_probe_lie")
        lied = pool.verify(["so 20", "so 20"], ["19", "19"], verifier="numeric")
        assert [v.reason for v in lied] == ["ok", "ok"]  # what recycling cannot stop
        honest = pool.verify(["so 20"] * 4, ["19"] * 4, verifier="numeric")
        assert [v.reason for v in honest] == ["wrong"] * 4


def test_nothing_planted_where_a_worker_starts_runs(monkeypatch, tmp_path):
    """A ``reward/__init__.py`` and a user-site ``.pth`` in the folder a worker starts in, an
    empty PYTHONPATH entry (the working directory) and HOME there: none of it runs. Before, the
    worker started as root with ``-m`` in its (``nobody``-owned) scratch folder, so a planted
    ``reward`` package ran as root before any protection."""
    marker = tmp_path / "ran"
    plant = f"open({str(marker)!r}, 'w').write('ran')\n"
    made = []
    real_mkdtemp = tempfile.mkdtemp

    def planted(*args, **kwargs):
        folder = real_mkdtemp(*args, **kwargs)
        if "avspo-verifier-" in kwargs.get("prefix", ""):
            made.append(folder)
            (Path(folder) / "reward").mkdir()
            (Path(folder) / "reward" / "__init__.py").write_text(plant)
            version = f"python{sys.version_info.major}.{sys.version_info.minor}"
            site = Path(folder) / ".local" / "lib" / version / "site-packages"
            site.mkdir(parents=True)
            (site / "planted.pth").write_text(f"import os; {plant}")
        return folder

    monkeypatch.setattr(tempfile, "mkdtemp", planted)
    monkeypatch.setenv("PYTHONPATH", os.pathsep + os.environ.get("PYTHONPATH", ""))
    with VerifierPool(PoolConfig(num_workers=1)) as pool:
        assert pool.verify(["1+1=2"], ["2"], verifier="numeric") == [Verdict(1.0, "ok")]
    assert made and not marker.exists()


def test_a_worker_that_ignores_its_soft_cpu_limit_meets_the_hard_one(monkeypatch):
    """Wall clock 60 s; CPU 1 s per item, 1 item a worker, 2 s to start: hard limit 2 + 1 x 1 =
    3 CPU s (reward/pool.py _spawn). A verifier that ignores SIGXCPU and lifts its soft limit
    to the hard one, then spins for 30 CPU s, is killed by the kernel (SIGKILL) at 3 s: an
    error well before the wall clock. Before, the hard limit was unlimited: it ran to 60 s."""
    monkeypatch.setenv("AVSPO_VERIFIER_MODULES", "tests.reward.fault_verifiers")
    cfg = PoolConfig(num_workers=1, timeout_s=60.0, cpu_time_s=1, max_items_per_worker=1,
                     start_timeout_s=2.0)  # fmt: skip
    with VerifierPool(cfg) as pool:
        t0 = time.monotonic()
        (got,) = pool.verify(["30"], [""], verifier="_test_spin_defiant")
        elapsed = time.monotonic() - t0
    assert got.reason == "error" and "exit -9" in " ".join(pool.last_errors)
    assert elapsed < 30  # 3 CPU s; the wall limit is 60 s


def test_a_worker_that_cannot_start_says_why_in_one_line(monkeypatch):
    """A verifier module that does not import: the pool's error names it, in one line."""
    monkeypatch.setenv("AVSPO_VERIFIER_MODULES", "tests.reward.no_such_module")
    with pytest.raises(RuntimeError) as err:
        VerifierPool(PoolConfig(num_workers=1))
    text = str(err.value)
    assert "\n" not in text and "No module named 'tests.reward.no_such_module'" in text
    assert "python -m reward.pool" in text


def test_require_refuses_to_start_with_a_protection_off(monkeypatch):
    """``verifier.sandbox=require`` with the audit hook left out (reported OFF)."""
    with pytest.raises(RuntimeError, match="sandbox=require, but OFF here: audit_hook"):
        VerifierPool(PoolConfig(num_workers=1, audit_hook=False, sandbox="require"))
    if os.geteuid() == 0:  # as root on this machine, nothing is OFF: it starts
        with pool_loading("", PoolConfig(num_workers=1, sandbox="require")) as pool:
            assert all(v.startswith("in force") for v in pool.protections.values())
