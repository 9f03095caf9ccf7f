"""The verifier pool: real worker processes, timeouts, memory cap, crashes, hostile model text."""

from __future__ import annotations

import os
import threading
import time

import pytest

import reward.pool
from reward import verify
from reward.actor import VerifierActor
from reward.pool import PoolConfig, VerifierPool
from reward.verifiers import Verdict
from tests.helpers import pool_loading

MARGIN_S = 1.0  # allowed past an item's timeout: kill + bookkeeping on a loaded 2-core machine


@pytest.fixture(scope="module")
def pool():
    cfg = PoolConfig(num_workers=2, timeout_s=1.0, memory_mb=768)
    with pool_loading("tests.reward.fault_verifiers", cfg) as p:
        yield p


def test_results_in_order_across_workers(pool):
    responses = [f"{i}+1={i + 1 if i % 3 else i}" for i in range(40)]
    verdicts = pool.verify(responses, [str(i + 1) for i in range(40)], verifier="numeric")
    # i % 3 == 0 answers i instead of i + 1 -> wrong (14 of 40: i = 0, 3, ..., 39)
    assert [v.reason for v in verdicts] == ["wrong" if i % 3 == 0 else "ok" for i in range(40)]


def test_timeout_kills_and_replaces_the_worker(pool):
    before = pool.replaced
    t0 = time.monotonic()
    verdicts = pool.verify(["30", "0", "0"], ["", "", ""], verifier="_test_sleep", timeout_s=0.5)
    elapsed = time.monotonic() - t0
    assert [v.reason for v in verdicts] == ["timeout", "ok", "ok"]
    assert elapsed < 0.5 + MARGIN_S
    assert pool.replaced == before + 1
    assert pool.verify(["1+1=2"], ["2"], verifier="numeric")[0].reason == "ok"  # still answers


def test_memory_cap_gives_error_not_a_dead_parent(pool):
    # 2 GiB > the 768 MiB cap: MemoryError inside the worker -> "error"; 16 MiB is fine.
    verdicts = pool.verify(["2048", "16"], ["", ""], verifier="_test_alloc", timeout_s=5.0)
    assert [v.reason for v in verdicts] == ["error", "ok"]
    assert any("MemoryError" in e for e in pool.last_errors)


def test_crash_and_exception_are_errors(pool):
    before = pool.replaced
    verdicts = pool.verify(["", ""], ["", ""], verifier="_test_crash")
    assert [v.reason for v in verdicts] == ["error", "error"]
    assert pool.replaced == before + 2
    assert pool.verify(["1+1=2"], ["2"], verifier="numeric")[0].reason == "ok"
    assert pool.verify([""], [""], verifier="_test_raise")[0].reason == "error"
    assert pool.last_errors == ["RuntimeError: boom"]


def test_failures_score_the_lowest_reward(pool):
    # docs/ARCHITECTURE.md section 6: a timeout, crash or error gives the task's lowest reward, not
    # 0.
    hang = pool.verify(["30", "0"], ["", ""], verifier="_test_sleep", timeout_s=0.3, lowest=-1.0)
    assert hang == [Verdict(-1.0, "timeout"), Verdict(1.0, "ok")]
    assert pool.verify([""], [""], verifier="_test_raise", lowest=-1.0) == [Verdict(-1.0, "error")]
    assert pool.verify([""], [""], verifier="_test_crash", lowest=-1.0) == [Verdict(-1.0, "error")]
    # the default lowest is 0.0
    assert pool.verify([""], [""], verifier="_test_raise") == [Verdict(0.0, "error")]


def test_non_finite_score_is_an_error_at_the_lowest_reward(pool):
    verdicts = pool.verify(
        ["nan", "inf", "-inf", "0.5"], [""] * 4, verifier="_test_score", lowest=-1.0
    )
    assert verdicts == [Verdict(-1.0, "error")] * 3 + [Verdict(0.5, "ok")]
    assert len(pool.last_errors) == 3 and "outside the reward range" in pool.last_errors[0]


def test_lowest_passes_through_the_entry_points(pool, monkeypatch):
    monkeypatch.setattr(reward.pool, "default_pool", lambda: pool)
    assert verify([""], [""], verifier="_test_raise", lowest=-1.0) == [Verdict(-1.0, "error")]
    actor = VerifierActor.__new__(VerifierActor)  # the fixture's pool, not two more workers
    actor.pool = pool
    replaced = pool.replaced
    got, replaced_after, errors = actor.verify(["30"], [""], "_test_sleep", 0.3, lowest=-2.0)
    assert got == [Verdict(-2.0, "timeout")]
    # with the pool's health: the timed-out worker was replaced; a timeout is no error text
    assert replaced_after == replaced + 1 and errors == []
    with pytest.raises(ValueError, match="lowest"):
        pool.verify([""], [""], verifier="_test_raise", lowest=float("nan"))


def test_unknown_verifier_and_length_mismatch_are_caller_errors(pool):
    with pytest.raises(ValueError, match="unknown verifier"):
        pool.verify(["1"], ["1"], verifier="nope")
    with pytest.raises(ValueError, match="references"):
        pool.verify(["1", "2"], ["1"], verifier="numeric")


HOSTILE = {
    "huge_answer": "The answer is " + "9" * 100_000,
    "unclosed_boxes": r"\boxed{" * 5000,
    "deep_frac": r"\boxed{" + r"\frac{1}{" * 3000 + "2" + "}" * 3001,
    "tower_power": r"\boxed{9^{9^{9^9}}}",
    "python_in_box": r"\boxed{__import__('os').system('touch PWNED_FILE')}",
    "python_plain": "__import__('os').system('touch PWNED_FILE')",
    "python_expr": "Answer: (lambda: __import__('os').system('touch PWNED_FILE'))()",
    "nul_and_unicode": "a\x00b\u202e\u0661\u0662 \ufeff\U0001f600 \\boxed{\x00}",
    "huge_power_in_sum": r"\boxed{2^{2^{2^{2^{2^{10}}}}} + 1}",
}


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["math", "numeric"])
def test_hostile_inputs_get_verdicts_in_time(kind, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a "touch" that ran would land here
    timeout_s = 1.5
    names = list(HOSTILE)
    for name in names:  # one at a time, so each is timed on its own
        # a warm worker first: the pool's start (a fresh process importing the verifier) and
        # the restart of a worker an earlier item's timeout killed are not this item's time
        # (under a loaded CI the first item's call took 3.6 s with the pool's start inside it)
        assert verify(["19"], ["19"], verifier=kind)[0].reason == "ok"
        t0 = time.monotonic()
        (verdict,) = verify([HOSTILE[name]], ["31337"], verifier=kind, timeout_s=timeout_s)
        elapsed = time.monotonic() - t0
        assert verdict.score == 0.0, name
        assert verdict.reason in {"wrong", "no_answer", "timeout", "error"}, name
        assert elapsed < timeout_s + MARGIN_S, (name, elapsed)
    assert not list(tmp_path.iterdir()), "a hostile answer created a file"
    assert not os.path.exists(os.path.join(os.getcwd(), "PWNED_FILE"))
    # and the pool still answers normal items, in order
    ok = verify(["12+7=19", r"\boxed{\frac{1}{2}}"], ["19", "0.5"], verifier=kind)
    assert [v.reason for v in ok] == ["ok", "ok"]


@pytest.mark.slow
def test_verify_from_a_worker_thread():
    out: list = []
    errors: list = []

    def run():
        try:
            out.append(verify(["1+1=2", r"\boxed{\frac{1}{2}}"], ["2", "0.5"], verifier="math"))
            out.append(verify([HOSTILE["tower_power"]], ["1"], verifier="math", timeout_s=1.0))
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors
    assert len(out) == 4
    assert sum(v[0].reason == "ok" for v in out) == 2


def test_a_slow_verifier_import_happens_before_the_item_clock_starts(monkeypatch):
    """A verifier with a warm-up (reasoning_gym's import takes ~2 s in a fresh worker) is warmed
    by each worker before it gets an item of that verifier: 1.5 s of warm-up, 0.5 s per item,
    every item ok (old code: the warm-up ran inside the first item's 0.5 s -> timeouts)."""
    monkeypatch.setenv("AVSPO_VERIFIER_MODULES", "tests.reward.fault_verifiers")
    with VerifierPool(PoolConfig(num_workers=2, timeout_s=0.5)) as p:
        verdicts = p.verify(["x"] * 4, [""] * 4, verifier="_test_slow_warm")
        assert [v.reason for v in verdicts] == ["ok"] * 4
        assert p.replaced == 0


@pytest.mark.slow
def test_reasoning_gym_answers_score_right_under_a_cold_pool():
    """The issue's case: correct reasoning_gym answers on a fresh pool with the default 2 s
    per-item timeout (old code: 8/8, then 5/8 scored 0 as timeouts)."""
    from reward.tasks import TaskConfig, make_task

    task = make_task(
        TaskConfig(name="reasoning_gym", gym_dataset="basic_arithmetic", num_train=1, num_test=8)
    )
    refs = [p.answer for p in task.test]
    import json

    answers = [str(json.loads(r)["entry"]["answer"]) for r in refs]
    with VerifierPool(PoolConfig(num_workers=2, timeout_s=2.0)) as p:
        verdicts = p.verify(answers, refs, verifier=task.verifier)
    assert [v.reason for v in verdicts] == ["ok"] * 8, verdicts


def _until_answered(pool, responses, references, verifier: str, tries: int = 30) -> list:
    """Call ``verify`` until every item of a call is "ok" (at most ``tries`` calls); returns each
    call's reasons. With a short step budget, workers that are still starting, or that replace
    ones the budget killed, can use up a call's budget on a loaded machine (seen beside a
    training run): polling, not sleeping, waits for them."""
    calls: list[list[str]] = []
    while len(calls) < tries and (not calls or set(calls[-1]) != {"ok"}):
        calls.append([v.reason for v in pool.verify(responses, references, verifier=verifier)])
    return calls


def test_a_step_budget_scores_the_rest_as_timeouts_instead_of_stalling(monkeypatch):
    """10 items of 0.4 s on 2 workers need ~2 s; a 1 s budget for the call ends it after ~1 s
    with the unfinished items scored as timeouts (counted), and the pool still answers."""
    monkeypatch.setenv("AVSPO_VERIFIER_MODULES", "tests.reward.fault_verifiers")
    with VerifierPool(PoolConfig(num_workers=2, timeout_s=5.0, step_budget_s=1.0)) as p:
        # both workers up and their verifier imported first (items of 0 s): <= 30 calls of 1 s
        warm = _until_answered(p, ["0", "0"], ["", ""], "_test_sleep")
        assert warm[-1] == ["ok", "ok"], warm
        before = p.budget_timeouts
        t0 = time.monotonic()
        verdicts = p.verify(["0.4"] * 10, [""] * 10, verifier="_test_sleep")
        elapsed = time.monotonic() - t0
        reasons = [v.reason for v in verdicts]
        # ~2 rounds of 2 items finish in 0.8 s; the 3rd round is cut at 1.0 s
        assert 2 <= reasons.count("ok") <= 6 and reasons.count("timeout") == 10 - reasons.count(
            "ok"
        )
        assert p.budget_timeouts - before == reasons.count("timeout")
        assert elapsed < 1.0 + MARGIN_S
        # the two workers the budget killed are replaced: the pool answers again
        after = _until_answered(p, ["1+1=2"], ["2"], "numeric")
        assert after[-1] == ["ok"] and all(set(c) <= {"ok", "timeout"} for c in after), after


def test_workers_get_an_allow_listed_environment(monkeypatch):
    monkeypatch.setenv("AVSPO_VERIFIER_MODULES", "tests.reward.fault_verifiers")
    monkeypatch.setenv("WANDB_API_KEY", "secret-value")
    monkeypatch.setenv("SOME_TOKEN", "secret-value")
    with VerifierPool(PoolConfig(num_workers=1)) as p:
        names = ["WANDB_API_KEY", "SOME_TOKEN", "PATH"]
        verdicts = p.verify(names, [""] * 3, verifier="_test_env")
    assert [v.score for v in verdicts] == [0.0, 0.0, 1.0]


def test_a_cpu_time_limit_stops_a_spinning_verifier(monkeypatch):
    """Wall clock 30 s, CPU time 1 s: a verifier burning 5 s of CPU is stopped by the kernel
    (SIGXCPU) after ~1-2 s and scored as a timeout; the next item is fine. A timeout verdict
    well before the 30 s wall limit is the CPU limit's (on a loaded machine the 1 s of CPU can
    take several seconds of wall time: 5 s was exceeded with two test workers beside a grid)."""
    monkeypatch.setenv("AVSPO_VERIFIER_MODULES", "tests.reward.fault_verifiers")
    with VerifierPool(PoolConfig(num_workers=1, timeout_s=30.0, cpu_time_s=1)) as p:
        t0 = time.monotonic()
        verdicts = p.verify(["5", "0.1"], ["", ""], verifier="_test_spin")
        elapsed = time.monotonic() - t0
    assert [v.reason for v in verdicts] == ["timeout", "ok"]
    assert elapsed < 20


def test_workers_exit_when_their_parent_is_killed(tmp_path):
    """A pool's process SIGKILLed (as a killed actor is) while a worker is busy with a 30 s
    item: the busy worker notices within ~0.5 s that it was re-parented and exits (an idle one
    exits on its closed pipe); none is left behind (old code: the busy one ran on)."""
    import signal
    import subprocess
    import sys

    # each worker creates "busy" in its scratch folder (its working directory), then sleeps
    code = (
        "import os, threading, time\n"
        "from reward.pool import PoolConfig, VerifierPool\n"
        "p = VerifierPool(PoolConfig(num_workers=2, step_budget_s=None))\n"
        "p.verify(['1+1=2'], ['2'], verifier='numeric')\n"
        "busy = [os.path.join(w.scratch, 'busy') for w in p._workers]\n"
        "args = (['30', '30'], ['busy', 'busy'])\n"
        "kw = dict(verifier='_test_sleep', timeout_s=60)\n"
        "threading.Thread(target=p.verify, args=args, kwargs=kw, daemon=True).start()\n"
        "while not all(os.path.exists(b) for b in busy):\n"
        "    time.sleep(0.05)\n"
        "print(' '.join(str(w.process.pid) for w in p._workers), flush=True)\n"
        "time.sleep(60)\n"
    )
    env = {**os.environ, "AVSPO_VERIFIER_MODULES": "tests.reward.fault_verifiers"}
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=env
    )
    pids = [int(x) for x in proc.stdout.readline().split()]
    assert len(pids) == 2
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)
    deadline = time.monotonic() + 10
    alive = pids
    while alive and time.monotonic() < deadline:
        time.sleep(0.2)
        alive = [p for p in pids if _not_zombie(p)]
    try:
        assert alive == []
    finally:
        for p in alive:
            os.kill(p, signal.SIGKILL)


def _not_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False
