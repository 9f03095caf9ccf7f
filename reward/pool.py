"""A pool of killable verifier processes: every item gets a wall-clock timeout and a memory cap.

Model output is untrusted, and verifying it (sympy under math-verify) can hang or eat memory.
So each item runs in a worker *process* (reward/verifier_worker.py), one item at a time over a
pipe, with a deadline. A worker that overruns is killed and replaced: ``Verdict(lowest,
"timeout")``; one that dies, or whose verifier raises: ``Verdict(lowest, "error")``. Every
answer is checked (reward/worker_io.py): only ``[the item sent, a float in the task's reward
range [lowest, highest], a known reason, a string]`` is taken; anything else (another item's
verdict, a message unasked, a score out of range, over 64 KiB) kills the worker, its item
``error``. A worker is replaced after any error or timeout and after ``max_items_per_worker``
items. The pool never raises for bad model text, and works from any thread (no signals).

Workers are plain subprocesses, not ``multiprocessing`` children (those re-run the parent's
``__main__`` and inherit its threads). Each runs in a sandbox (reward/sandbox.py); its first
message says what is in force, kept in ``VerifierPool.protections`` and logged once (``python
-m reward.pool`` prints it). The pool waits for it when it starts: a worker that cannot start
says why in one line.
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
from dataclasses import dataclass, field
from multiprocessing.connection import wait

from reward.custom import register_from_env
from reward.sandbox import make_pool_dir, remove_scratch, sweep_scratch, worker_ids
from reward.verifiers import VERIFIERS, Verdict, load_verifier_modules
from reward.worker_io import MAX_MESSAGE, Worker, checked, start_worker, worker_limits

log = logging.getLogger(__name__)
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
    """CPU seconds one item may use (the soft RLIMIT_CPU a worker sets before each item: the
    kernel stops a verifier that spins, SIGXCPU, a backstop to the wall-clock limit); null = 2
    x timeout_s, rounded up. A worker's hard limit, which it cannot raise (SIGKILL), is
    start_timeout_s + max_items_per_worker x this."""
    max_items_per_worker: int = field(default=512, metadata={"ge": 1})
    """Items a worker verifies before it is replaced by a fresh one (also replaced after any
    error or timeout): code that ran in a worker lives at most this many items."""
    audit_hook: bool = True
    """The workers' Python audit hook, a second line behind the kernel's protections; false
    leaves it out (reported OFF), to try the kernel's walls alone (tests/reward/test_sandbox.py)."""
    sandbox: str = field(default="warn", metadata={"choices": ("warn", "require")})
    """``warn``: a protection this machine does not allow is named in one warning line;
    ``require``: the pool refuses to start while any is OFF (reward/sandbox.py)."""
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


class VerifierPool:
    """``pool.verify(responses, references, verifier=..., timeout_s=..., lowest=0.0,
    highest=1.0) -> list[Verdict]``."""

    def __init__(self, cfg: PoolConfig | None = None):
        self.cfg = cfg or PoolConfig()
        self._lock = threading.Lock()
        self.replaced = 0  # workers killed or lost and replaced, over the pool's life
        self.budget_timeouts = 0  # items scored "timeout" because a call's budget ran out
        self.last_errors: list[str] = []  # exception texts of the last call's "error" items
        self.protections: dict[str, str] = {}  # the sandbox's, as the first worker reported
        self._start_failures = 0
        self._spawned = 0
        sweep_scratch()  # folders a killed pool left behind
        self._dir = make_pool_dir()
        self._ids = worker_ids()
        self._workers = [self._spawn() for _ in range(self.cfg.num_workers)]
        self._spare = self._spawn()  # started and warmed ahead: replacing a worker costs no wait
        try:
            self._await_report()
        except BaseException:
            self.close()
            raise

    def _spawn(self) -> Worker:
        self._spawned += 1
        name = f"w{self._spawned}"
        limits = worker_limits(self.cfg)
        proc, inbox, outbox = start_worker(self._dir, name, limits, self._ids, self.cfg.audit_hook)
        return Worker(proc, inbox, outbox, scratch=os.path.join(self._dir, name))

    def _await_report(self) -> None:
        """Wait for a first worker's report (or a one-line error: why none could start)."""
        while not self.protections:
            self._collect([], 0.0, 0.0)

    @staticmethod
    def _close_worker(w: Worker, *, kill: bool) -> None:
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

    def _replace(self, w: Worker, why: str = "") -> None:
        if not w.ready:
            self._start_failures += 1
            if self._start_failures >= _MAX_START_FAILURES:
                raise RuntimeError(
                    f"{self._start_failures} verifier workers died while starting"
                    f"{f': {why}' if why else ''}; `python -m reward.pool` (as this user, "
                    "from this folder) starts one the same way and prints its sandbox"
                )
        self._close_worker(w, kill=True)
        self.replaced += 1
        self._succeed(w)

    def _recycle(self, w: Worker) -> None:  # its share done, or its verifier raised
        self._close_worker(w, kill=False)
        self._succeed(w)

    def _succeed(self, w: Worker) -> None:
        """The spare takes closed ``w``'s place; a new spare starts."""
        if w is not self._spare:
            self._workers[self._workers.index(w)] = self._spare
        self._spare = self._spawn()

    def verify(
        self,
        responses: list[str],
        references: list[str],
        *,
        verifier: str = "math",
        timeout_s: float | None = None,
        lowest: float = 0.0,
        highest: float = 1.0,
    ) -> list[Verdict]:
        """One verdict per response, in order; a timeout, a crashed worker, an exception in the
        verifier or an answer that is not a score in ``[lowest, highest]`` with a known reason
        gives ``Verdict(lowest, "timeout" | "error")``."""
        if len(responses) != len(references):
            raise ValueError(f"{len(responses)} responses but {len(references)} references")
        if verifier not in VERIFIERS:
            load_verifier_modules()
            register_from_env()
        if verifier not in VERIFIERS:
            raise ValueError(f"unknown verifier {verifier!r}; expected one of {sorted(VERIFIERS)}")
        lowest, highest = float(lowest), float(highest)
        if not (math.isfinite(lowest) and math.isfinite(highest) and lowest <= highest):
            raise ValueError(f"lowest, highest: finite, lowest <= highest; got {lowest, highest}")
        limit = self.cfg.timeout_s if timeout_s is None else timeout_s
        with self._lock:
            if not self._workers:
                raise RuntimeError("the verifier pool is closed")
            return self._run(list(responses), list(references), verifier, limit, (lowest, highest))

    def _run(self, responses, references, verifier: str, limit: float, bounds) -> list[Verdict]:
        results: list[Verdict | None] = [None] * len(responses)
        pending = collections.deque(range(len(responses)))
        self.last_errors = []
        budget = self.cfg.step_budget_s
        end = time.monotonic() + budget if budget is not None else math.inf
        while pending or any(w.item is not None for w in self._workers):
            if time.monotonic() >= end:
                self._out_of_budget(pending, results, bounds[0])
                break
            self._dispatch(pending, responses, references, verifier, limit)
            self._collect(results, *bounds, end)
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
        spare = self._spare
        if spare.ready and spare.warming is None and verifier not in spare.warmed:
            self._warm(spare, verifier)
        for w in list(self._workers):
            if not (w.ready and w.item is None and w.warming is None and pending):
                continue
            if w.inbox.poll():  # an idle worker spoke unasked: it is not ours any more
                self.last_errors.append("a verifier worker sent a message unasked: replaced")
                self._replace(w)
                continue
            if verifier not in w.warmed:  # its slow imports first, off the item's clock
                self._warm(w, verifier)
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

    def _warm(self, w: Worker, verifier: str) -> None:
        try:
            w.outbox.send_bytes(json.dumps({"warm": verifier}).encode())
        except OSError:
            self._replace(w)
            return
        w.warming, w.deadline = verifier, time.monotonic() + self.cfg.start_timeout_s

    def _collect(self, results: list, lowest: float, highest: float, end=math.inf) -> None:
        """Wait for the next result, readiness, crash or deadline (or the call's budget end);
        handle what happened."""
        everyone = [*self._workers, self._spare]
        waiting = [w for w in everyone if w.item is not None or w.warming or not w.ready]
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
                self._receive(w, results, lowest, highest)
            elif w.item is not None and now >= w.deadline:
                results[w.item] = Verdict(lowest, "timeout")
                w.item = None
                self._replace(w)
            elif w.warming is not None and now >= w.deadline:
                raise RuntimeError(
                    f"a verifier worker did not warm up {w.warming!r} within "
                    f"{self.cfg.start_timeout_s} s (verifier.start_timeout_s)"
                )
            elif not w.ready and now >= w.started + self.cfg.start_timeout_s:
                raise RuntimeError(
                    f"a verifier worker did not start within {self.cfg.start_timeout_s} s "
                    "(verifier.start_timeout_s)"
                )

    def _receive(self, w: Worker, results: list, lowest: float, highest: float) -> None:
        """One message from ``w``, checked: anything but what the pool asked for, in its exact
        form, kills the worker (and its item scores ``error``)."""
        try:
            msg = json.loads(w.inbox.recv_bytes(MAX_MESSAGE))
        except (EOFError, OSError, ValueError):  # crashed (segfault, OOM kill), or too long
            if w.item is not None:
                results[w.item] = self._died(w, lowest)
            w.item = w.warming = None
            self._replace(w)
            return
        if not w.ready:
            self._started(w, msg)
        elif w.warming is not None:
            if isinstance(msg, dict) and msg.get("warmed") == w.warming:  # {"warmed", "error"}
                w.warmed.add(w.warming)
                if msg.get("error"):  # its items will err with the same text
                    self.last_errors.append(f"warm-up of {w.warming}: {str(msg['error'])[:300]}")
            else:
                self._replace(w, "a malformed warm-up answer")
            w.warming = None
        elif w.item is not None:
            idx, w.item = w.item, None
            verdict, error = checked(msg, idx, lowest, highest)
            w.done += 1
            if verdict is None:
                self.last_errors.append(f"worker sent {error}: replaced")
                results[idx] = Verdict(lowest, "error")
                self._replace(w)
                return
            if error:  # the verifier raised: scored the lowest reward, the worker recycled
                self.last_errors.append(error)
            results[idx] = Verdict(lowest, "error") if error else verdict
            if error or w.done >= self.cfg.max_items_per_worker:
                self._recycle(w)

    def _started(self, w: Worker, msg) -> None:
        if isinstance(msg, dict) and isinstance(msg.get("failed"), str):
            self._replace(w, msg["failed"][:500])
            return
        report = msg.get("ready") if isinstance(msg, dict) else None
        if not (isinstance(report, dict) and all(isinstance(v, str) for v in report.values())):
            self._replace(w, "its first message was not a report")
            return
        w.ready, self._start_failures = True, 0
        if not self.protections:
            self._report({str(k): v[:500] for k, v in report.items()})

    def _report(self, protections: dict[str, str]) -> None:
        """Keep and log (once per pool) what the workers' sandbox holds; one warning line
        names what this machine does not allow (``sandbox=require``: an error instead)."""
        self.protections = dict(protections)
        off = sorted(k for k, v in protections.items() if not v.startswith("in force"))
        log.info("verifier sandbox: %s", "; ".join(f"{k} {v}" for k, v in protections.items()))
        if off and self.cfg.sandbox == "require":
            raise RuntimeError(
                "verifier.sandbox=require, but OFF here: "
                + "; ".join(f"{k}: {protections[k][5:]}" for k in off)
            )
        if off:
            log.warning("verifier sandbox: OFF here: %s (python -m reward.pool says why)",
                        ", ".join(off))  # fmt: skip

    def _died(self, w: Worker, lowest: float) -> Verdict:
        """The verdict of the item a worker was on when it died: a timeout if the kernel
        stopped it for CPU time (SIGXCPU at its soft limit), else an error."""
        with contextlib.suppress(subprocess.TimeoutExpired):
            w.process.wait(timeout=2)
        if w.process.returncode == -signal.SIGXCPU:
            return Verdict(lowest, "timeout")
        self.last_errors.append(f"worker process died (exit {w.process.returncode})")
        return Verdict(lowest, "error")

    def close(self) -> None:
        with self._lock:
            for w in [*self._workers, self._spare] if self._workers else []:
                self._close_worker(w, kill=False)
            self._workers = []
            remove_scratch(self._dir)

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


def _main() -> None:
    """``python -m reward.pool``: start one verifier worker as a run would (this user, this
    folder) and print each protection of its sandbox with its mechanism, or why it could not
    start (exit 1 when it could not, or a protection is OFF here)."""
    try:
        with VerifierPool(PoolConfig(num_workers=1)) as pool:
            (verdict,) = pool.verify(["1+1=2"], ["2"], verifier="numeric")
    except RuntimeError as exc:
        print(f"verifier worker could not start: {exc}", file=sys.stderr)
        sys.exit(1)
    for name, state in [*sorted(pool.protections.items()), ("verifies", verdict.reason)]:
        print(f"{name:<10}  {state}")
    sys.exit(0 if all(v.startswith("in force") for v in pool.protections.values()) else 1)


if __name__ == "__main__":
    _main()
