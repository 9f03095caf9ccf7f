"""Fault-injection verifiers for the pool tests, loaded in workers via AVSPO_VERIFIER_MODULES."""

from __future__ import annotations

import os
import time

from reward.verifiers import Verdict, register_verifier


@register_verifier("_test_sleep")
def _sleep(response: str, reference: str) -> Verdict:
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
