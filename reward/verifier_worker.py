"""Entry point of one verifier worker process:
``python -m reward.verifier_worker R W MEM CPU [SCRATCH UID GID]``.

With SCRATCH (the pool always gives one) it first enters its sandbox (reward/sandbox.py: own
network namespace, user ``nobody`` if started as root (UID GID, ``-`` for none), the scratch
folder as HOME and working directory, then an audit hook after its imports), and says what is in
force in its first message, ``{"ready": {protection: state}}``. Then it reads JSON messages from
file descriptor R and answers on W, until it reads ``null`` or R closes:

- ``{"warm": name}`` -> ``{"warmed": name, "error": text}``: the verifier's one-time warm-up
  (slow imports, reward/verifiers.py WARMUPS), before the pool sends it items of that verifier;
- ``[idx, verifier, response, reference]`` -> ``[idx, score, reason, error_text]``.

Its address space is capped at MEM bytes (RLIMIT_AS); each item may use CPU seconds of CPU time
(RLIMIT_CPU, raised to "used so far + CPU" before each item: the kernel stops a verifier that
spins, SIGXCPU, even if the parent's clock failed). JSON, not pickle, both ways: the parent
never unpickles anything that touched model text.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import resource
import sys
import threading
import time
from multiprocessing.connection import Connection

from reward import sandbox
from reward.sandbox import remove_scratch


def _limit_cpu(seconds: int) -> None:
    """Let the next item use ``seconds`` of CPU time beyond what this process used so far."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    _, hard = resource.getrlimit(resource.RLIMIT_CPU)
    soft = math.ceil(usage.ru_utime + usage.ru_stime) + seconds
    if hard != resource.RLIM_INFINITY:
        soft = min(soft, hard)
    resource.setrlimit(resource.RLIMIT_CPU, (soft, hard))


def _exit_with_parent(scratch: str | None, interval_s: float = 0.5) -> None:
    """A watchdog thread: this worker exits as soon as its parent (the pool's process) is gone
    (it gets re-parented), so a killed actor or driver leaves no verifier process behind.
    (PR_SET_PDEATHSIG would fire when the parent *thread* that spawned us exits, and the pool
    spawns from any thread.)"""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(interval_s)
        remove_scratch(scratch)  # the parent that would have removed it is gone
        os._exit(0)

    threading.Thread(target=watch, daemon=True, name="exit-with-parent").start()


def main(
    read_fd: int,
    write_fd: int,
    memory_bytes: int,
    cpu_seconds: int = 0,
    scratch: str | None = None,
    uid: int | None = None,
    gid: int | None = None,
) -> None:
    # first, while single-threaded (a user namespace needs it) and before any import it guards
    protections = sandbox.enter(scratch, uid, gid) if scratch else {"sandbox": "OFF: no folder"}
    _exit_with_parent(scratch)
    with contextlib.suppress(ValueError, OSError):  # a lower hard limit already set: keep it
        resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    space, size = (resource.getrlimit(r)[0] for r in (resource.RLIMIT_AS, resource.RLIMIT_FSIZE))
    protections["rlimits"] = (
        f"in force: address space {space // 2**20} MiB, {cpu_seconds or 'unlimited'} CPU s per "
        f"item, written files {size // 2**20} MiB, no core dumps"
    )
    logging.getLogger("math_verify").setLevel(logging.ERROR)  # "timeout is disabled" warnings
    from reward.verifiers import VERIFIERS, load_verifier_modules, warm

    load_verifier_modules()
    if scratch:
        protections["audit_hook"] = sandbox.install_hook(scratch)
    inbox, outbox = Connection(read_fd, writable=False), Connection(write_fd, readable=False)
    outbox.send_bytes(json.dumps({"ready": protections}).encode())
    while True:
        try:
            msg = json.loads(inbox.recv_bytes())
        except EOFError:
            msg = None
        if msg is None:
            remove_scratch(scratch)
            return
        if isinstance(msg, dict):  # {"warm": name}
            error = ""
            try:
                warm(msg["warm"])
            except BaseException as exc:  # e.g. not installed: its items will err and say so
                error = f"{type(exc).__name__}: {str(exc)[:200]}"
            outbox.send_bytes(json.dumps({"warmed": msg["warm"], "error": error}).encode())
            continue
        if cpu_seconds:
            _limit_cpu(cpu_seconds)
        idx, verifier, response, reference = msg
        try:
            verdict = VERIFIERS[verifier](response, reference)
            result = [idx, float(verdict.score), verdict.reason, ""]
        except BaseException as exc:  # MemoryError, RecursionError, anything: the item errs
            result = [idx, 0.0, "error", f"{type(exc).__name__}: {str(exc)[:200]}"]
        outbox.send_bytes(json.dumps(result).encode())


if __name__ == "__main__":
    ids = [None if a == "-" else int(a) for a in sys.argv[6:8]]
    main(*map(int, sys.argv[1:5]), *sys.argv[5:6], *ids)
