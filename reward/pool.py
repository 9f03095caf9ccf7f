"""A pool of killable verifier processes: every item gets a wall-clock timeout and a memory cap.

Model output is untrusted, and verifying it (sympy under math-verify) can hang or eat memory.
So each item runs in a worker *process* (``python -m reward.verifier_worker``); the parent sends
one item at a time to each worker over a pipe and waits with a deadline. A worker that overruns
is killed (SIGKILL) and replaced, and its item gets ``Verdict(lowest, "timeout")``; a worker
that dies (segfault, out of memory) gives ``Verdict(lowest, "error")`` and is replaced; an
exception inside a verifier, or a non-finite score, gives ``Verdict(lowest, "error")``.
``lowest`` is the task's lowest reward (``verify(..., lowest=task.reward_range[0])``, default 0).
The pool never raises for bad model text, and works from any thread (it uses no signals).

Workers are plain subprocesses, not ``multiprocessing`` children: those re-run the parent's
``__main__`` (a Ray worker's, or stdin's) and inherit its threads. Messages are JSON. Each worker
runs in a sandbox (reward/sandbox.py: no network, user ``nobody`` when started as root, its own
scratch folder as HOME and working directory, an audit hook); its first message says what is in
force, kept in ``VerifierPool.protections`` and logged once (``python -m reward.pool`` prints it).
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import json
import logging
import math
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from pathlib import Path

from reward.sandbox import make_scratch, remove_scratch, sweep_scratch
from reward.verifiers import VERIFIERS, Verdict, load_verifier_modules

log = logging.getLogger(__name__)
_PROJECT_ROOT = str(Path(__file__).resolve().parents[1])
_MAX_START_FAILURES = 3  # consecutive workers dying before "ready" -> give up with an error


@dataclass
class PoolConfig:
    """The verifier pool."""

    num_workers: int = field(default=2, metadata={"ge": 1})
    timeout_s: float = field(default=2.0, metadata={"gt": 0.0})
    """Wall-clock limit of one item on a worker."""
    memory_mb: int = field(default=1536, metadata={"ge": 256})
    """Address-space cap of each worker process (RLIMIT_AS)."""
    start_timeout_s: float = field(default=60.0, metadata={"gt": 0.0})
    """How long a (re)started worker may take to report ready, and to warm up a verifier (its
    slow imports: reward/verifiers.py WARMUPS) before its first item of that verifier."""
    cpu_time_s: int | None = field(default=None, metadata={"ge": 1})
    """CPU seconds one item may use (RLIMIT_CPU, enforced by the kernel: a backstop to the
    wall-clock limit); null = 2 x timeout_s, rounded up."""
    step_budget_s: float | None = field(default=300.0, metadata={"gt": 0.0})
    """Wall-clock budget of one ``verify`` call (a step's responses): when it runs out, the
    items not yet scored get ``timeout`` (counted) instead of stalling the step; null = none."""
    call_timeout_s: float = field(default=600.0, metadata={"gt": 0.0})
    """How long the driver waits for the verifier actor's answer to one ``verify`` call before
    the run stops with an error (above ``step_budget_s``: the budget ends a call first)."""
    max_restarts: int = field(default=3, metadata={"ge": 0})
    """How many times a run restarts a verifier actor that died (the batch is verified again)."""
    alert_frac: float = field(default=0.2, metadata={"ge": 0.0, "le": 1.0})
    """An alert line (console, report) when the verifier fails on more than this share of a
    step's samples (errors + timeouts): they score the lowest reward, like a collapsed group."""


@dataclass
class _Worker:
    process: subprocess.Popen
    inbox: Connection  # results from the worker
    outbox: Connection  # items to the worker
    ready: bool = False
    started: float = field(default_factory=time.monotonic)
    item: int | None = None  # index being verified
    deadline: float = 0.0
    warmed: set[str] = field(default_factory=set)  # verifiers whose warm-up ran here
    warming: str | None = None  # the verifier warming up now
    scratch: str | None = None  # its sandbox's folder (HOME, cwd), removed with it


class VerifierPool:
    """``pool.verify(responses, references, verifier=..., timeout_s=..., lowest=0.0)
    -> list[Verdict]``."""

    def __init__(self, cfg: PoolConfig | None = None):
        self.cfg = cfg or PoolConfig()
        self._lock = threading.Lock()
        self.replaced = 0  # workers killed or lost and replaced, over the pool's life
        self.budget_timeouts = 0  # items scored "timeout" because a call's budget ran out
        self.last_errors: list[str] = []  # exception texts of the last call's "error" items
        self.protections: dict[str, str] = {}  # the sandbox's, as the first worker reported
        self._start_failures = 0
        sweep_scratch()  # folders a killed pool left behind
        self._workers = [self._spawn() for _ in range(self.cfg.num_workers)]

    def _spawn(self) -> _Worker:
        to_worker_r, to_worker_w = os.pipe()
        from_worker_r, from_worker_w = os.pipe()
        scratch, uid, gid = make_scratch()
        env = worker_env(os.environ, scratch)
        memory = str(self.cfg.memory_mb * 2**20)
        cpu = self.cfg.cpu_time_s or math.ceil(2 * self.cfg.timeout_s)
        ids = ["-" if i is None else str(i) for i in (uid, gid)]
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "reward.verifier_worker",
                str(to_worker_r),
                str(from_worker_w),
                memory,
                str(cpu),
                scratch,
                *ids,
            ],
            pass_fds=(to_worker_r, from_worker_w),
            env=env,
            cwd=scratch,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
        )
        os.close(to_worker_r)
        os.close(from_worker_w)
        return _Worker(
            process=proc,
            inbox=Connection(from_worker_r, writable=False),
            outbox=Connection(to_worker_w, readable=False),
            scratch=scratch,
        )

    @staticmethod
    def _close_worker(w: _Worker, *, kill: bool) -> None:
        if kill:
            w.process.kill()
        else:
            with contextlib.suppress(OSError):
                w.outbox.send_bytes(b"null")
        try:
            w.process.wait(timeout=2)
        except subprocess.TimeoutExpired:
            w.process.kill()
            w.process.wait(timeout=2)
        w.inbox.close()
        w.outbox.close()
        remove_scratch(w.scratch)

    def _replace(self, w: _Worker) -> None:
        if not w.ready:
            self._start_failures += 1
            if self._start_failures >= _MAX_START_FAILURES:
                raise RuntimeError(
                    f"{self._start_failures} verifier workers died while starting; "
                    "run `python -m reward.verifier_worker 0 1 2000000000` to see why"
                )
        self._close_worker(w, kill=True)
        self.replaced += 1
        self._workers[self._workers.index(w)] = self._spawn()

    def verify(
        self,
        responses: list[str],
        references: list[str],
        *,
        verifier: str = "math",
        timeout_s: float | None = None,
        lowest: float = 0.0,
    ) -> list[Verdict]:
        """One verdict per response, in order; a timeout, a crashed worker, an exception in the
        verifier or a non-finite score gives ``Verdict(lowest, "timeout" | "error")``."""
        if len(responses) != len(references):
            raise ValueError(f"{len(responses)} responses but {len(references)} references")
        if verifier not in VERIFIERS:
            load_verifier_modules()
        if verifier not in VERIFIERS:
            raise ValueError(f"unknown verifier {verifier!r}; expected one of {sorted(VERIFIERS)}")
        lowest = float(lowest)
        if not math.isfinite(lowest):
            raise ValueError(f"lowest must be a finite reward, got {lowest}")
        limit = self.cfg.timeout_s if timeout_s is None else timeout_s
        with self._lock:
            if not self._workers:
                raise RuntimeError("the verifier pool is closed")
            return self._run(list(responses), list(references), verifier, limit, lowest)

    def _run(
        self, responses, references, verifier: str, limit: float, lowest: float
    ) -> list[Verdict]:
        results: list[Verdict | None] = [None] * len(responses)
        pending = collections.deque(range(len(responses)))
        self.last_errors = []
        budget = self.cfg.step_budget_s
        end = time.monotonic() + budget if budget is not None else math.inf
        while pending or any(w.item is not None for w in self._workers):
            if time.monotonic() >= end:
                self._out_of_budget(pending, results, lowest)
                break
            self._dispatch(pending, responses, references, verifier, limit)
            self._collect(results, lowest, end)
        return results  # type: ignore[return-value]

    def _out_of_budget(self, pending, results: list, lowest: float) -> None:
        """The call's budget ran out: what is not scored yet is a timeout; busy workers are
        killed and replaced (their items may never finish)."""
        late = list(pending)
        pending.clear()
        for w in list(self._workers):
            if w.item is not None:
                late.append(w.item)
                w.item = None
                self._replace(w)
        for idx in late:
            results[idx] = Verdict(lowest, "timeout")
        self.budget_timeouts += len(late)

    def _dispatch(self, pending, responses, references, verifier: str, limit: float) -> None:
        for w in list(self._workers):
            if not (w.ready and w.item is None and w.warming is None and pending):
                continue
            if verifier not in w.warmed:  # its slow imports first, off the item's clock
                try:
                    w.outbox.send_bytes(json.dumps({"warm": verifier}).encode())
                except OSError:
                    self._replace(w)
                    continue
                w.warming, w.deadline = verifier, time.monotonic() + self.cfg.start_timeout_s
                continue
            idx = pending.popleft()
            item = [idx, verifier, str(responses[idx]), str(references[idx])]
            try:
                w.outbox.send_bytes(json.dumps(item).encode())
            except OSError:  # died while idle: give the item to another worker
                pending.appendleft(idx)
                self._replace(w)
                continue
            w.item, w.deadline = idx, time.monotonic() + limit

    def _collect(self, results: list, lowest: float, end: float = math.inf) -> None:
        """Wait for the next result, readiness, crash or deadline (or the call's budget end);
        handle what happened."""
        waiting = [w for w in self._workers if w.item is not None or w.warming or not w.ready]
        if not waiting:
            return
        deadlines = [
            w.deadline if w.ready else w.started + self.cfg.start_timeout_s for w in waiting
        ]
        timeout = max(0.0, min(min(deadlines), end) - time.monotonic())
        ready = set(map(id, wait([w.inbox for w in waiting], timeout=timeout)))
        now = time.monotonic()
        for w in waiting:
            if id(w.inbox) in ready:
                try:
                    msg = json.loads(w.inbox.recv_bytes())
                except (EOFError, OSError, ValueError):  # crashed: segfault, OOM kill, ...
                    if w.item is not None:
                        results[w.item] = self._died(w, lowest)
                    w.warming = None
                    self._replace(w)
                    continue
                if isinstance(msg, dict) and "ready" in msg:
                    w.ready, self._start_failures = True, 0
                    if not self.protections:
                        self._report(msg["ready"])
                    continue
                if isinstance(msg, dict):  # {"warmed": name, "error": text}
                    w.warmed.add(msg["warmed"])
                    w.warming = None
                    if msg["error"]:  # its items will err with the same text
                        self.last_errors.append(f"warm-up of {msg['warmed']}: {msg['error']}")
                    continue
                idx, score, reason, error = msg
                if not error and not math.isfinite(score):
                    error = f"non-finite score {score} from verifier (reason {reason!r})"
                if error:
                    self.last_errors.append(error)
                    reason = "error"
                if reason in ("error", "timeout"):  # any failure scores the task's lowest
                    score = lowest
                results[idx] = Verdict(score, reason)
                w.item = None
            elif w.item is not None and now >= w.deadline:
                results[w.item] = Verdict(lowest, "timeout")
                self._replace(w)
            elif w.warming is not None and now >= w.deadline:
                raise RuntimeError(
                    f"a verifier worker did not warm up {w.warming!r} within "
                    f"{self.cfg.start_timeout_s} s (verifier.start_timeout_s)"
                )
            elif not w.ready and now >= w.started + self.cfg.start_timeout_s:
                raise RuntimeError(
                    f"a verifier worker did not start within {self.cfg.start_timeout_s} s"
                )

    def _report(self, protections: dict[str, str]) -> None:
        """Keep and log (once per pool) what the workers' sandbox holds; a warning names what
        this machine does not allow."""
        self.protections = dict(protections)
        off = {k: v for k, v in protections.items() if not v.startswith("in force")}
        log.info("verifier sandbox: %s", "; ".join(f"{k} {v}" for k, v in protections.items()))
        if off:
            log.warning(
                "verifier sandbox: not in force here: %s",
                "; ".join(f"{k}: {v}" for k, v in off.items()),
            )

    def _died(self, w: _Worker, lowest: float) -> Verdict:
        """The verdict of the item a worker was on when it died: a timeout if the kernel
        stopped it for CPU time (SIGXCPU), else an error."""
        with contextlib.suppress(subprocess.TimeoutExpired):
            w.process.wait(timeout=2)
        if w.process.returncode == -signal.SIGXCPU:
            return Verdict(lowest, "timeout")
        self.last_errors.append(f"worker process died (exit {w.process.returncode})")
        return Verdict(lowest, "error")

    def close(self) -> None:
        with self._lock:
            for w in self._workers:
                self._close_worker(w, kill=False)
            self._workers = []

    def __enter__(self) -> VerifierPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


ENV_ALLOWED = (
    "PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "VIRTUAL_ENV", "PYTHONHASHSEED",
    "AVSPO_VERIFIER_MODULES",
)  # fmt: skip
"""Environment variables a verifier worker gets (plus PYTHONPATH with the project first, and
its scratch folder as HOME and TMPDIR): model output runs there, so no key, token or password
of the parent's environment does, nor the user's home."""


def worker_env(parent: Mapping[str, str], scratch: str) -> dict[str, str]:
    """The allow-listed environment of a verifier worker.

    >>> " ".join(sorted(worker_env({"PATH": "/b", "WANDB_API_KEY": "k", "HOME": "/root"}, "/s")))
    'HOME MPLCONFIGDIR OMP_NUM_THREADS PATH PYTHONDONTWRITEBYTECODE PYTHONPATH TMPDIR'
    >>> worker_env({"HOME": "/root"}, "/tmp/s")["HOME"]
    '/tmp/s'
    """
    env = {k: parent[k] for k in ENV_ALLOWED if k in parent}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [_PROJECT_ROOT, parent.get("PYTHONPATH")]))
    env["OMP_NUM_THREADS"] = "1"  # a verifier is single-threaded; CPU time is per process
    env["HOME"] = env["TMPDIR"] = env["MPLCONFIGDIR"] = scratch  # reasoning_gym loads matplotlib
    env["PYTHONDONTWRITEBYTECODE"] = "1"  # no .pyc writes outside the scratch folder
    return env


_DEFAULT: VerifierPool | None = None
_DEFAULT_LOCK = threading.Lock()


def default_pool() -> VerifierPool:
    """The process-wide pool behind :func:`reward.verify` (workers: ``AVSPO_VERIFIER_WORKERS``,
    default min(2, CPUs)); created on first use, closed at exit."""
    global _DEFAULT
    with _DEFAULT_LOCK:
        if _DEFAULT is None:
            workers = int(os.environ.get("AVSPO_VERIFIER_WORKERS", min(2, os.cpu_count() or 1)))
            _DEFAULT = VerifierPool(PoolConfig(num_workers=workers))
            atexit.register(_DEFAULT.close)
        return _DEFAULT


def _main() -> None:
    """``python -m reward.pool``: start one verifier worker and print what its sandbox holds
    (exit 1 when a protection is not in force here)."""
    with VerifierPool(PoolConfig(num_workers=1)) as pool:
        pool.verify(["1+1=2"], ["2"], verifier="numeric")
        print(json.dumps(pool.protections, indent=2))
    sys.exit(0 if all(v.startswith("in force") for v in pool.protections.values()) else 1)


if __name__ == "__main__":
    _main()
