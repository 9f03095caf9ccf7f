"""The verifier workers' sandbox (reward/sandbox.py, reward/kernel.py), each protection tried
from inside a worker (tests/reward/sandbox_probes.py): through the whole sandbox, and against
the kernel's walls alone (``verifier.audit_hook=false``: what code that gets past the Python
hook meets). A protection this machine does not allow is reported as OFF with its reason, and
its test is skipped with that reason."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import pytest

from reward.pool import PoolConfig, VerifierPool
from tests.helpers import pool_loading

PROTECTIONS = ("network", "user", "scratch", "rlimits", "landlock", "seccomp", "audit_hook")
KERNEL = ("network", "user", "rlimits", "landlock", "seccomp")


@pytest.fixture(scope="module")
def open_dir():
    """A folder any user may enter and write (pytest's tmp_path sits in a 0700 folder, which
    would stop an unprivileged worker by itself): what stops the worker there is the sandbox.
    Made before the pools, so that the probes hold a descriptor of it (PREOPENED)."""
    import shutil

    folder = Path("/tmp") / f"avspo-sandbox-test-{os.getpid()}"
    folder.mkdir(mode=0o777)
    folder.chmod(0o777)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def _probing(hook: bool, workers: int = 1):
    cfg = PoolConfig(num_workers=workers, timeout_s=5.0, audit_hook=hook)
    return pool_loading("tests.reward.sandbox_probes", cfg)


@pytest.fixture(scope="module")
def pool(open_dir):
    with _probing(hook=True) as p:
        yield p


@pytest.fixture(scope="module")
def bare(open_dir):
    """Two workers with the kernel's protections only (no audit hook)."""
    with _probing(hook=False, workers=2) as p:
        yield p


@pytest.fixture(params=["whole", "kernel"])
def either(request, pool, bare):
    """Each attempt through the whole sandbox and against the kernel's walls alone."""
    return pool if request.param == "whole" else bare


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
    in_force(pool, "scratch")
    scratch = pool._workers[0].scratch
    pool_dir = os.path.dirname(scratch)  # the worker makes it in the pool's folder
    assert os.path.basename(pool_dir).startswith("avspo-verifier-")
    assert os.environ.get("HOME") != scratch
    probe(pool, "_probe_state", "home", f"{scratch}|{scratch}|{scratch}")
    probe(pool, "_probe_scratch", "")
    assert os.path.exists(os.path.join(scratch, "note.txt"))
    if os.geteuid() == 0:  # root's: workers reach their folder by name, cannot list or add
        assert os.stat(pool_dir).st_uid == 0 and os.stat(pool_dir).st_mode & 0o777 == 0o711


def test_the_scratch_folder_goes_with_its_worker(monkeypatch):
    monkeypatch.setenv("AVSPO_VERIFIER_MODULES", "tests.reward.sandbox_probes")
    with VerifierPool(PoolConfig(num_workers=1)) as p:
        probe(p, "_probe_scratch", "")
        scratch = p._workers[0].scratch
        assert os.path.isdir(scratch)
    assert not os.path.exists(os.path.dirname(scratch))


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
    "attempt",
    ["os.system", "subprocess", "unaudited_subprocess", "exec", "fork", "socket", "unix_socket"],
)
def test_no_program_process_or_socket(either, attempt, tmp_path):
    """Refused by the hook, and by seccomp where the hook is not (``unaudited_subprocess``
    raises no audit event; the bare pool has no hook): nothing runs, nothing outlives the
    worker, no socket of any family, not even to a Unix socket by path."""
    in_force(either, "seccomp")
    path = str(tmp_path / "s")
    with socket.socket(socket.AF_UNIX) as server:  # a socket the worker could reach by path
        server.bind(path)
        server.listen()
        probe(either, "_probe_refused", attempt, path)


def test_no_native_code(pool):
    in_force(pool, "audit_hook")
    probe(pool, "_probe_refused", "ctypes")


def test_no_write_delete_or_link_outside_the_scratch(either, open_dir):
    """Landlock refuses what the hook refuses, without it: the folder is writable by anyone."""
    in_force(either, "landlock")
    kept = open_dir / "kept"
    kept.write_text("keep")
    kept.chmod(0o666)
    probe(either, "_probe_refused", "write_outside", str(open_dir / "new"))
    probe(either, "_probe_refused", "write_outside", str(kept))
    probe(either, "_probe_refused", "remove_outside", str(kept))
    probe(either, "_probe_refused", "symlink", str(kept))
    probe(either, "_probe_refused", "dir_fd_write", str(open_dir))  # a held descriptor
    assert sorted(p.name for p in open_dir.iterdir()) == ["kept"] and kept.read_text() == "keep"


def test_no_read_or_listing_of_secrets_outside_the_allowed_folders(either, open_dir):
    """A file anyone may read (0644: the kernel's permissions would let ``nobody`` or the
    user read it, as a non-root user's own ~/.cache/huggingface/token) stays shut."""
    in_force(either, "landlock")
    secret = open_dir / "token"
    secret.write_text("hf_secret")
    secret.chmod(0o644)
    probe(either, "_probe_refused", "read_outside", str(secret))
    probe(either, "_probe_refused", "list_outside", str(open_dir))


def test_the_hook_cannot_be_patched(pool, open_dir):
    """Replacing the hook's helper's code (so that every path is "inside") is refused."""
    in_force(pool, "audit_hook")
    secret = open_dir / "token2"
    secret.write_text("hf_secret")
    secret.chmod(0o644)
    probe(pool, "_probe_refused", "patch_hook_helper", str(secret))


def test_a_worker_cannot_read_a_siblings_memory(bare):
    """Both workers run as ``nobody`` and are dumpable (their import folders are read through
    /proc/self/fd where only root could enter them); Landlock puts each in its own domain."""
    in_force(bare, "landlock")
    pids = []
    for _ in range(2):  # each worker says its pid (two items at once: one per worker)
        bare.verify(["pid", "pid"], ["", ""], verifier="_probe_state")
        pids += [int(e.split("pid ")[-1]) for e in bare.last_errors if "pid " in e]
    assert len(set(pids)) >= 2, pids  # both workers answered
    for w in bare._workers:  # each worker is asked about a pid not its own
        if w.ready:
            other = next(p for p in pids if p != w.process.pid)
            probe(bare, "_probe_refused", "sibling_memory", str(other))


def test_the_pools_environment_stays_shut(either):
    """The pool's process (the verifier actor, with Ray's environment) is outside every
    worker's Landlock domain: its /proc/<pid>/environ cannot be read (the workers' own
    environment is an allow-list without keys or tokens: reward/worker_io.py)."""
    in_force(either, "landlock")
    probe(either, "_probe_refused", "parent_environ")


def test_the_parent_cannot_be_signalled(either):
    in_force(either, "seccomp")
    probe(either, "_probe_refused", "kill_parent")  # signal 0: a check, even if it got through


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


def test_the_sweep_looks_wherever_a_pool_may_have_put_its_folder():
    """Root's pool folder goes to /tmp, /var/tmp or /dev/shm when TMPDIR is shut to others
    (make_pool_dir): a dead pool's folder there is swept too."""
    import subprocess
    import sys
    import tempfile

    from reward.sandbox import SCRATCH_PREFIX, SHARED_TEMP, sweep_scratch

    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()  # a pid that is gone
    where = next(d for d in SHARED_TEMP[1:] if os.path.isdir(d) and os.access(d, os.W_OK))
    dead = tempfile.mkdtemp(prefix=f"{SCRATCH_PREFIX}{child.pid}-", dir=where)
    sweep_scratch()
    assert not os.path.exists(dead)
