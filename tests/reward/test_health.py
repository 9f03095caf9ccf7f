"""The verifier's health (reward/health.py): counts, texts once, the alert; and the verifier stage
collecting them from a real verifier actor (Ray, its worker processes), restarted once a death."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from launch.stages import Verifier
from reward.health import VerifierHealth, error_class
from reward.tasks import Problem
from rollout.types import Group, Sample
from tests.helpers import kill_and_wait, load


@pytest.mark.parametrize(
    "text, cls",
    [
        ("ValueError: bad", "ValueError"),
        ("json.decoder.JSONDecodeError: Expecting value", "JSONDecodeError"),
        ("worker process died (exit 3)", "WorkerDied"),
        ("non-finite score nan from verifier (reason 'ok')", "NonFiniteScore"),
        ("warm-up of reasoning_gym: ImportError: no module", "WarmUp"),
        ("something else", "Other"),
    ],
)
def test_error_classes(text, cls):
    assert error_class(text) == cls


def test_texts_are_shown_once_at_most_max_texts_a_step_and_the_alert_is_strictly_above():
    h = VerifierHealth(alert_frac=0.25, max_texts=2)
    texts = ["A: 1", "B: 2", "C: 3", "A: 1"]
    m, lines = h.observe(3, {"reward/verifier_error_frac": 0.25}, texts, 0)
    # 3 distinct texts, 2 shown; 0.25 is not above 0.25: no alert
    assert lines == ["verifier error (first seen at step 3): A: 1",
                     "verifier error (first seen at step 3): B: 2"]  # fmt: skip
    assert m == {"reward/verifier_restarts": 0.0, "reward/verifier_errors/A": 2.0,
                 "reward/verifier_errors/B": 1.0, "reward/verifier_errors/C": 1.0}  # fmt: skip
    # C was counted as seen (not shown again); a timeout share pushes the failed share over
    shares = {"reward/verifier_error_frac": 0.125, "reward/verifier_timeout_frac": 0.25}
    m, lines = h.observe(4, shares, ["C: 3"], 2)
    assert len(lines) == 1 and lines[0].startswith("ALERT step 4: the verifier failed on 38%")
    assert m["reward/verifier_restarts"] == 2.0
    s = h.summary()
    assert s["restarts"] == 2 and s["alert_steps"] == [4]
    assert s["errors"] == {"A": 2, "C": 2, "B": 1}
    assert [t["text"] for t in s["first_texts"]] == ["A: 1", "B: 2", "C: 3"]


def test_the_verifier_stage_drains_error_texts_and_restarts_from_its_actor(ray_cluster):
    """The real verifier actor and its worker processes: the reasoning-gym verifier on a
    reference that is not JSON raises in the worker (JSONDecodeError for each of the 2 samples);
    a killed actor is restarted and counted."""
    verifier = Verifier(load(), placement=None, log=lambda *_: None)
    try:
        task = SimpleNamespace(verifier="reasoning_gym", reward_range=(0.0, 1.0), verifiers={})
        group = Group("q", [1], [Sample([2], [0.0], "42", "stop", 0) for _ in range(2)])
        problems = [Problem("u", "q", "q", "not json")]
        verdicts = verifier.verify([group], problems, task, "as_is")
        assert [v.reason for v in verdicts] == ["error", "error"]
        errors, restarts = verifier.drain()
        assert [error_class(e) for e in errors] == ["JSONDecodeError"] * 2 and restarts == 0
        assert verifier.drain() == ([], 0)  # drained

        kill_and_wait(verifier.actor)
        verifier.verify([group], problems, task, "as_is")
        errors, restarts = verifier.drain()
        assert restarts == 1 and len(errors) == 2  # the new actor's pool scored them again
    finally:
        verifier.shutdown()


def test_one_verifier_death_with_calls_in_flight_is_one_restart(ray_cluster):
    """Issue 58 section 6: with verification streaming, several calls are in flight on the
    verifier actor when it dies, and each fails with ActorDied. The first failure restarts the
    actor; the others were sent to the same dead actor, so they go to its replacement without
    another restart (before: each restarted it, killing the healthy replacement, and the run
    stopped with ``verifier.max_restarts reached``)."""
    import ray

    # one restart allowed: the one death; the old code needed one per failed call (5)
    verifier = Verifier(load("verifier.max_restarts=1"), placement=None, log=lambda *_: None)
    try:
        task = SimpleNamespace(verifier="numeric", reward_range=(0.0, 1.0), verifiers={})
        pending, expected = [], []
        for i in range(5):  # 5 calls in flight, as in the run
            # call i: one prompt whose reference is i, a right and a wrong response
            samples = [Sample([2], [0.0], text, "stop", 0) for text in (f"{i}", f"{i + 1}")]
            problems = [Problem(f"u{i}", "q", "q", f"{i}")]
            pending.append(verifier.submit([Group("q", [1], samples)], problems, task))
            expected.append(["ok", "wrong"])
        # the actor is still starting (spawned in Verifier(), not awaited): no call has an
        # answer yet, so all 5 are queued on it when it dies
        assert ray.wait([p.call for p in pending], num_returns=5, timeout=0)[0] == []
        kill_and_wait(verifier.actor)
        got = [[v.reason for v in verifier.result(p, "as_is")] for p in pending]
        assert got == expected
        assert verifier.restarts == 1
        assert verifier.drain()[1] == 1  # the health report counts the one actor replaced
    finally:
        verifier.shutdown()
