"""Entry point of one verifier worker process, started by the pool (reward/pool.py) as
``python -I -c BOOT PATHS R W MEM CPU ITEM_CPU POOL_DIR NAME UID GID HOOK``: isolated mode,
its import path (``PATHS``, JSON) given explicitly, working directory the pool's folder.

It first enters its sandbox (reward/sandbox.py: its own network namespace, its imports, a
scratch folder ``POOL_DIR/NAME`` made now, hard rlimits (address space MEM bytes, CPU seconds
for its whole life; ITEM_CPU more seconds for each item, the soft limit), Landlock, user
``nobody`` if started as root (UID GID, ``-`` for none), seccomp, then an audit hook unless
HOOK is 0), and says what is in force in its first message, ``{"ready": {protection:
state}}``, or why it could not start, ``{"failed": text}`` (one line).
Then it reads JSON messages from file descriptor R and answers on W, until it reads ``null`` or
R closes:

- ``{"warm": name}`` -> ``{"warmed": name, "error": text}``: the verifier's one-time warm-up
  (slow imports, reward/verifiers.py WARMUPS), before the pool sends it items of that verifier;
- ``[idx, verifier, response, reference]`` -> ``[idx, score, reason, error_text]``.

JSON, not pickle, both ways: the parent never unpickles anything that touched model text, and
it checks every answer's form and range (reward/pool.py).
"""

from __future__ import annotations

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

BOOT = (
    "import json, sys; sys.path[:0] = json.loads(sys.argv[1]); "
    "from reward.verifier_worker import cli; cli(sys.argv[2:])"
)
"""What ``python -I -c`` runs: the import path first, then :func:`cli`."""


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


def _limit_cpu(seconds: int) -> None:
    """Let the next item use ``seconds`` of CPU time beyond what this process used so far (the
    soft limit, below the hard one it cannot raise)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    _, hard = resource.getrlimit(resource.RLIMIT_CPU)
    soft = math.ceil(usage.ru_utime + usage.ru_stime) + seconds
    resource.setrlimit(resource.RLIMIT_CPU, (min(soft, hard), hard))


def _start(outbox: Connection, args: list, hook: bool) -> str:
    """Sandbox and imports; returns the scratch folder after sending ``ready`` (or sends
    ``failed`` with the reason in one line and exits 1)."""
    network = sandbox.isolate_network()  # first, while single-threaded
    try:
        logging.getLogger("math_verify").setLevel(logging.ERROR)  # "timeout is disabled"
        from reward.custom import register_from_env
        from reward.verifiers import load_verifier_modules

        load_verifier_modules()
        register_from_env()  # task.verifier=module:function
        protections, scratch, readable = sandbox.enter(*args)
        protections["network"] = network
        _exit_with_parent(scratch)
        protections["audit_hook"] = (
            sandbox.install_hook(scratch, readable) if hook else "OFF: verifier.audit_hook=false"
        )
    except BaseException as exc:  # noqa: BLE001  (anything: said in one line, then exit)
        why = " ".join(f"{type(exc).__name__}: {exc}".split())[:500]
        outbox.send_bytes(json.dumps({"failed": why}).encode())
        sys.exit(1)
    outbox.send_bytes(json.dumps({"ready": protections}).encode())
    return scratch


def main(
    read_fd: int,
    write_fd: int,
    memory_bytes: int,
    cpu_seconds: int,
    item_cpu_seconds: int,
    pool_dir: str,
    name: str,
    uid: int | None = None,
    gid: int | None = None,
    hook: bool = True,
) -> None:
    inbox, outbox = Connection(read_fd, writable=False), Connection(write_fd, readable=False)
    scratch = _start(outbox, [pool_dir, name, uid, gid, memory_bytes, cpu_seconds], hook)
    from reward.verifiers import VERIFIERS, warm

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
        _limit_cpu(item_cpu_seconds)
        idx, verifier, response, reference = msg
        try:
            verdict = VERIFIERS[verifier](response, reference)
            result = [idx, float(verdict.score), verdict.reason, ""]
            if verdict.extra:
                result.append(verdict.extra)
        except BaseException as exc:  # MemoryError, RecursionError, anything: the item errs
            result = [idx, 0.0, "error", f"{type(exc).__name__}: {str(exc)[:200]}"]
        outbox.send_bytes(json.dumps(result).encode())


def cli(argv: list[str]) -> None:
    """``R W MEM CPU ITEM_CPU POOL_DIR NAME UID GID HOOK`` (UID/GID ``-`` for none, HOOK 1
    or 0)."""
    ids = [None if a == "-" else int(a) for a in argv[7:9]]
    main(*map(int, argv[0:5]), argv[5], argv[6], *ids, hook=argv[9] == "1")
