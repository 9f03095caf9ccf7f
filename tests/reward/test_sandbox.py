"""The verifier workers' sandbox (reward/sandbox.py), each protection tried from inside a
worker (tests/reward/sandbox_probes.py). A protection this machine does not allow is reported
as OFF with its reason, and its test is skipped with that reason."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import pytest

from reward.pool import PoolConfig, VerifierPool
from tests.helpers import pool_loading

PROTECTIONS = ("network", "user", "home", "rlimits", "audit_hook")


@pytest.fixture(scope="module")
def pool():
    with pool_loading("tests.reward.sandbox_probes", PoolConfig(num_workers=1, timeout_s=5.0)) as p:
        p.verify(["1+1=2"], ["2"], verifier="numeric")  # started: its report is in
        yield p


@pytest.fixture
def open_dir():
    """A folder any user may enter and write (pytest's tmp_path sits in a 0700 folder, which
    would stop an unprivileged worker by itself): what stops the worker there is the hook."""
    import shutil
    import tempfile
    from pathlib import Path

    folder = Path(tempfile.mkdtemp(prefix="avspo-sandbox-test-"))
    folder.chmod(0o777)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def in_force(pool, protection: str) -> None:
    state = pool.protections[protection]
    if not state.startswith("in force"):
        pytest.skip(f"{protection} is not in force on this machine: {state}")


def probe(pool, verifier: str, attempt: str, reference: str = "") -> None:
    (verdict,) = pool.verify([attempt], [reference], verifier=verifier)
    assert verdict.reason == "ok", (attempt, verdict, pool.last_errors)


def test_the_worker_says_what_is_in_force(pool):
    assert set(pool.protections) == set(PROTECTIONS)
    for name, state in pool.protections.items():  # in force, or OFF with the reason why
        assert state.startswith(("in force", "OFF: ")) and len(state) > 10, (name, state)
    # as root (CI), every protection holds here, the uid switch included
    if os.geteuid() == 0 and os.path.exists("/proc/self/ns/net"):
        assert all(s.startswith("in force") for s in pool.protections.values())


def test_own_network_namespace(pool):
    in_force(pool, "network")
    probe(pool, "_probe_state", "netns", os.readlink("/proc/self/ns/net"))


def test_unprivileged_user_when_root(pool):
    in_force(pool, "user")
    import pwd

    expected = pwd.getpwnam("nobody").pw_uid if os.geteuid() == 0 else os.geteuid()
    probe(pool, "_probe_state", "uid", str(expected))
    # a 0600 file of this (root) user is shut to the worker by the kernel, hook or not
    if os.geteuid() == 0:
        assert "nobody" in pool.protections["user"]


def test_scratch_home_and_working_directory(pool):
    in_force(pool, "home")
    scratch = pool._workers[0].scratch
    assert scratch and os.path.basename(scratch).startswith("avspo-verifier-")
    assert os.environ.get("HOME") != scratch
    probe(pool, "_probe_state", "home", f"{scratch}|{scratch}|{scratch}")
    probe(pool, "_probe_scratch", "")
    assert os.path.exists(os.path.join(scratch, "note.txt"))


def test_the_scratch_folder_goes_with_its_worker(monkeypatch):
    monkeypatch.setenv("AVSPO_VERIFIER_MODULES", "tests.reward.sandbox_probes")
    with VerifierPool(PoolConfig(num_workers=1)) as p:
        probe(p, "_probe_scratch", "")
        scratch = p._workers[0].scratch
        assert os.path.isdir(scratch)
    assert not os.path.exists(scratch)


def test_a_killed_pools_scratch_folders_are_swept_by_the_next_pool():
    """A pool's process SIGKILLed with its workers (Ray kills an actor's process tree) leaves
    its folders; the next pool removes them (named by the dead process's pid), not a live one's."""
    import signal
    import subprocess
    import sys
    import tempfile

    from reward.sandbox import SCRATCH_PREFIX, sweep_scratch

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    dead = tempfile.mkdtemp(prefix=f"{SCRATCH_PREFIX}{child.pid}-")
    live = tempfile.mkdtemp(prefix=f"{SCRATCH_PREFIX}{os.getppid()}-")
    (Path(dead) / "left.txt").write_text("x")
    sweep_scratch()
    assert os.path.isdir(dead)  # its process still runs: kept
    child.send_signal(signal.SIGKILL)
    child.wait()
    sweep_scratch()
    assert not os.path.exists(dead) and os.path.isdir(live)
    os.rmdir(live)


def test_resource_limits(pool):
    in_force(pool, "rlimits")
    probe(pool, "_probe_state", "core", "(0, 0)")
    probe(pool, "_probe_state", "fsize", str(64 * 2**20))  # reward/sandbox.py FILE_SIZE_LIMIT


@pytest.mark.parametrize(
    "attempt", ["os.system", "subprocess", "fork", "socket", "unix_socket", "ctypes"]
)
def test_no_process_socket_or_native_code(pool, attempt, tmp_path):
    in_force(pool, "audit_hook")
    path = str(tmp_path / "s")
    with socket.socket(socket.AF_UNIX) as server:  # a socket the worker could reach by path
        server.bind(path)
        server.listen()
        probe(pool, "_probe_refused", attempt, path)


def test_no_write_delete_or_link_outside_the_scratch(pool, open_dir):
    in_force(pool, "audit_hook")
    kept = open_dir / "kept"
    kept.write_text("keep")
    kept.chmod(0o666)
    probe(pool, "_probe_refused", "write_outside", str(open_dir / "new"))
    probe(pool, "_probe_refused", "write_outside", str(kept))
    probe(pool, "_probe_refused", "remove_outside", str(kept))
    probe(pool, "_probe_refused", "symlink", str(kept))
    assert sorted(p.name for p in open_dir.iterdir()) == ["kept"] and kept.read_text() == "keep"


def test_no_read_of_secrets_outside_the_allowed_folders(pool, open_dir):
    in_force(pool, "audit_hook")
    secret = open_dir / "token"
    secret.write_text("hf_secret")
    secret.chmod(0o644)  # readable by anyone to the kernel: the hook shuts it
    probe(pool, "_probe_refused", "read_outside", str(secret))


def test_the_parent_cannot_be_signalled(pool):
    in_force(pool, "audit_hook")
    probe(pool, "_probe_refused", "kill_parent")  # signal 0: a check, even if it got through


def test_sandboxed_workers_still_verify(pool):
    """Every verifier's work goes on inside: math-verify and reasoning_gym (imports after the
    hook, from the interpreter's folders) score right answers."""
    import json

    from reward.tasks import TaskConfig, make_task

    cfg = TaskConfig(name="reasoning_gym", gym_dataset="word_ladder", num_train=2, num_test=2)
    task = make_task(cfg)
    refs = [p.answer for p in task.test]
    answers = [f"Answer: {json.loads(r)['entry']['answer']}" for r in refs]
    got = pool.verify(answers, refs, verifier=task.verifier)
    assert [v.reason for v in got] == ["ok", "ok"], pool.last_errors
    t0 = time.monotonic()
    math = pool.verify([r"\boxed{\frac{1}{2}}"], ["0.5"], verifier="math")
    assert math[0].reason == "ok" and time.monotonic() - t0 < 60
