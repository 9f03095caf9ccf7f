"""Fault-injection verifiers for the pool tests, loaded in workers via AVSPO_VERIFIER_MODULES."""

from __future__ import annotations

import os
import time

from reward.verifiers import Verdict, register_verifier


@register_verifier("_test_sleep")
def _sleep(response: str, reference: str) -> Verdict:
    """Sleeps ``response`` seconds; a non-empty ``reference`` is a file created first (so that
    a test can wait until the worker is busy)."""
    if reference:
        open(reference, "w").close()
    time.sleep(float(response))
    return Verdict(1.0, "ok")


@register_verifier("_test_alloc")
def _alloc(response: str, reference: str) -> Verdict:
    blob = bytearray(int(response) * 2**20)  # MiB
    return Verdict(float(len(blob) > 0), "ok")


@register_verifier("_test_crash")
def _crash(response: str, reference: str) -> Verdict:
    os._exit(3)  # as a segfault or an OOM kill would: no reply


@register_verifier("_test_raise")
def _raise(response: str, reference: str) -> Verdict:
    raise RuntimeError("boom")


@register_verifier("_test_score")
def _score(response: str, reference: str) -> Verdict:
    return Verdict(float(response), "ok")  # "nan", "inf": a verifier with a non-finite score


def _slow_warm() -> None:
    time.sleep(float(os.environ.get("AVSPO_TEST_WARM_S", "1.5")))  # as reasoning_gym's import


@register_verifier("_test_slow_warm", warm=_slow_warm)
def _after_warm(response: str, reference: str) -> Verdict:
    return Verdict(1.0, "ok")


@register_verifier("_test_env")
def _env(response: str, reference: str) -> Verdict:
    """Score 1 when the environment variable named by ``response`` reached the worker."""
    return Verdict(float(response in os.environ), "ok")


@register_verifier("_test_spin")
def _spin(response: str, reference: str) -> Verdict:
    """Burn CPU for ``response`` seconds of CPU time (a hostile input in a tight loop)."""
    end = time.process_time() + float(response)
    while time.process_time() < end:
        pass
    return Verdict(1.0, "ok")


@register_verifier("_test_spin_defiant")
def _spin_defiant(response: str, reference: str) -> Verdict:
    """As ``_test_spin``, after ignoring SIGXCPU and lifting its soft CPU limit to the hard one
    (what a worker running hostile code can do): only a hard limit stops it."""
    import resource
    import signal

    signal.signal(signal.SIGXCPU, signal.SIG_IGN)
    _, hard = resource.getrlimit(resource.RLIMIT_CPU)
    resource.setrlimit(resource.RLIMIT_CPU, (hard, hard))
    return _spin(response, reference)
