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
``__main__`` (a Ray worker's, or stdin's) and inherit its threads. Messages are JSON.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import json
import math
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from pathlib import Path

from reward.verifiers import VERIFIERS, Verdict, load_verifier_modules

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
    """How long a (re)started worker may take to report ready."""


@dataclass
class _Worker:
    process: subprocess.Popen
    inbox: Connection  # results from the worker
    outbox: Connection  # items to the worker
    ready: bool = False
    started: float = field(default_factory=time.monotonic)
    item: int | None = None  # index being verified
    deadline: float = 0.0


class VerifierPool:
    """``pool.verify(responses, references, verifier=..., timeout_s=..., lowest=0.0)
    -> list[Verdict]``."""

    def __init__(self, cfg: PoolConfig | None = None):
        self.cfg = cfg or PoolConfig()
        self._lock = threading.Lock()
        self.replaced = 0  # workers killed or lost and replaced, over the pool's life
        self.last_errors: list[str] = []  # exception texts of the last call's "error" items
        self._start_failures = 0
        self._workers = [self._spawn() for _ in range(self.cfg.num_workers)]

    def _spawn(self) -> _Worker:
        to_worker_r, to_worker_w = os.pipe()
        from_worker_r, from_worker_w = os.pipe()
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [_PROJECT_ROOT, env.get("PYTHONPATH")]))
        memory = str(self.cfg.memory_mb * 2**20)
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "reward.verifier_worker",
                str(to_worker_r),
                str(from_worker_w),
                memory,
            ],
            pass_fds=(to_worker_r, from_worker_w),
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
        )
        os.close(to_worker_r)
        os.close(from_worker_w)
        return _Worker(
            process=proc,
            inbox=Connection(from_worker_r, writable=False),
            outbox=Connection(to_worker_w, readable=False),
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
        while pending or any(w.item is not None for w in self._workers):
            self._dispatch(pending, responses, references, verifier, limit)
            self._collect(results, lowest)
        return results  # type: ignore[return-value]

    def _dispatch(self, pending, responses, references, verifier: str, limit: float) -> None:
        for w in list(self._workers):
            if not (w.ready and w.item is None and pending):
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

    def _collect(self, results: list, lowest: float) -> None:
        """Wait for the next result, readiness, crash or deadline; handle what happened."""
        waiting = [w for w in self._workers if w.item is not None or not w.ready]
        if not waiting:
            return
        deadlines = [
            w.deadline if w.ready else w.started + self.cfg.start_timeout_s for w in waiting
        ]
        timeout = max(0.0, min(deadlines) - time.monotonic())
        ready = set(map(id, wait([w.inbox for w in waiting], timeout=timeout)))
        now = time.monotonic()
        for w in waiting:
            if id(w.inbox) in ready:
                try:
                    msg = json.loads(w.inbox.recv_bytes())
                except (EOFError, OSError, ValueError):  # crashed: segfault, OOM kill, ...
                    if w.item is not None:
                        results[w.item] = Verdict(lowest, "error")
                        self.last_errors.append("worker process died")
                    self._replace(w)
                    continue
                if msg == "ready":
                    w.ready, self._start_failures = True, 0
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
            elif not w.ready and now >= w.started + self.cfg.start_timeout_s:
                raise RuntimeError(
                    f"a verifier worker did not start within {self.cfg.start_timeout_s} s"
                )

    def close(self) -> None:
        with self._lock:
            for w in self._workers:
                self._close_worker(w, kill=False)
            self._workers = []

    def __enter__(self) -> VerifierPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


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
