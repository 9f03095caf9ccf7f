"""A stale JIT build lock of DeepSpeed's CPU shm op is cleared before the ranks start: a process
killed while building it (a first run interrupted) leaves ``lock`` in torch's extensions folder,
and every later run's DeepSpeed init then waits on it forever (torch's FileBaton has no owner to
check). A lock younger than any build is a build in progress and stays."""

from __future__ import annotations

import os
import time

from learner.policy import clear_stale_build_lock


def test_an_old_lock_is_removed_and_a_fresh_one_kept(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    lock = tmp_path / "deepspeed_shm_comm" / "lock"
    lock.parent.mkdir()
    lock.touch()
    assert clear_stale_build_lock(older_than_s=600) is None  # being built now
    assert lock.exists()
    hour_ago = time.time() - 3600
    os.utime(lock, (hour_ago, hour_ago))
    assert clear_stale_build_lock(older_than_s=600) == str(lock)
    assert not lock.exists()
    assert clear_stale_build_lock(older_than_s=600) is None  # nothing to do
