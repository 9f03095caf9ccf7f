"""Model text never reaches code that evaluates it: reasoning_gym's scorers that ``eval`` or
``parse_expr`` an answer get a pre-check (reward/gym_audit.py), every other dataset is audited
safe or refused at validation, and no payload creates a file or a process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from reward.verifiers import REASONS, VERIFIERS

pytest.importorskip("reasoning_gym")

ROOT = Path(__file__).resolve().parents[2]
# the scorers of issue 44 that parse answers with sympy's parse_expr, and those that eval() them
EVALUATING = (
    "countdown", "puzzle24", "polynomial_multiplication", "simple_integration",
    "intermediate_integration", "binary_matrix", "spiral_matrix", "string_insertion", "n_queens",
)  # fmt: skip


def payloads(target: Path) -> list[str]:
    """Responses that create ``target`` if any scorer evaluates them (the issue's, and forms
    each evaluating scorer's extraction would pass on: plain, in a list, behind "Answer:")."""
    code = f"__import__('os').system('touch {target}')"
    return [
        rf"\boxed{{{code}}}",
        code,
        f"Answer: {code}",
        f"Answer: [{code}]",
        rf"\boxed{{(lambda: {code})()}}",
        rf"\boxed{{[c for c in [{code}]]}}",
        rf"\boxed{{open('{target}', 'w')}}",
    ]


def entry_of(name: str, seed: int = 0) -> str:
    import reasoning_gym

    entry = reasoning_gym.create_dataset(name, size=1, seed=seed)[0]
    return json.dumps({"dataset": name, "entry": entry}, default=list)


@pytest.mark.parametrize("name", EVALUATING)
def test_evaluating_scorers_never_run_the_payload(name, tmp_path):
    """In this process (no pool, no sandbox): the pre-check alone stops every payload. Boxed
    answers are the whole code: refused (or no box: no answer). Auto extraction may fall back
    to a number in the text (the path's digits), which is harmless to score."""
    target = tmp_path / "PWNED"
    ref = entry_of(name)
    for verifier in ("reasoning_gym", "reasoning_gym_boxed"):
        for response in payloads(target):
            verdict = VERIFIERS[verifier](response, ref)
            assert not target.exists(), (name, verifier, response)
            assert verdict.reason in REASONS
            if verifier == "reasoning_gym_boxed":
                assert verdict.reason in ("refused", "no_answer"), (name, response)
                assert verdict.score == 0.0


def test_every_dataset_is_classified_once():
    """Every dataset the installed reasoning_gym registers is audited safe, guarded or refused
    (a new version's new dataset fails here until someone reads its scorer)."""
    from importlib.metadata import version

    from reasoning_gym.factory import DATASETS

    from reward import gym_audit

    # the distribution's version (reasoning_gym.__version__ still says 0.1.19 in 0.1.25)
    assert version("reasoning_gym") == gym_audit.AUDITED_VERSION
    kinds = [set(gym_audit.SAFE), set(gym_audit.GUARDED), set(gym_audit.REFUSED)]
    assert set().union(*kinds) == set(DATASETS)
    assert sum(len(k) for k in kinds) == len(DATASETS)  # disjoint
    assert set(EVALUATING) == set(gym_audit.GUARDED)
    # a size check applies only to a safe scorer (admits takes GUARDED's check first)
    assert set(gym_audit.BOUNDED) <= set(gym_audit.SAFE)


@pytest.mark.parametrize(
    "dataset, message",
    [
        ("composite", "refused"),
        ("game_of_life_halting", "any non-empty answer"),
        ("no_such_dataset", "not an audited reasoning_gym dataset"),
    ],
)
def test_unaudited_or_refused_datasets_fail_validation(dataset, message):
    from launch.validation import ConfigError, validate
    from reward.tasks import TaskConfig

    with pytest.raises(ConfigError, match=f"task.gym_dataset: .*{message}"):
        validate(TaskConfig(name="reasoning_gym", gym_dataset=dataset), "task")


def test_an_unaudited_reasoning_gym_version_fails_validation(monkeypatch):
    """The audit read the scorers of one version: another may evaluate answers where this one
    did not, so every dataset is refused until the list is re-read."""
    from launch.validation import ConfigError, validate
    from reward import gym_audit
    from reward.tasks import TaskConfig

    task = TaskConfig(name="reasoning_gym", gym_dataset="basic_arithmetic")
    validate(task, "task")  # the pinned version passes
    monkeypatch.setattr(gym_audit, "installed_version", lambda: "0.2.0")
    with pytest.raises(ConfigError, match=r"reasoning_gym 0\.2\.0 .*audited at 0\.1\.25"):
        validate(task, "task")


@pytest.mark.parametrize("name", EVALUATING)
def test_right_answers_pass_the_pre_check(name):
    """The pre-check admits every form the task's own answers take: 40 entries' reference
    answers score 1.0 through the verifier (the python-list forms the eval fallbacks accept
    too, for the list datasets)."""
    import reasoning_gym

    from reward import gym_audit

    data = reasoning_gym.create_dataset(name, size=40, seed=1)
    for entry in data:
        ref = json.dumps({"dataset": name, "entry": entry}, default=list)
        answer = entry["answer"]
        assert gym_audit.admits(name, answer, entry), (name, answer)
        assert VERIFIERS["reasoning_gym_boxed"](rf"\boxed{{{answer}}}", ref).score == 1.0
    listed = {
        "binary_matrix": str([[0, 1], [1, 0]]),
        "spiral_matrix": str([1, 2, 3]),
        "string_insertion": str(list("ABCDE")),
        "n_queens": str([["_", "Q"], ["Q", "_"]]),
    }
    if name in listed:
        assert gym_audit.admits(name, listed[name], data[0])


AUDIT_SCRIPT = r"""
import json, signal, sys
marker, (payloads, code_only) = sys.argv[1], json.loads(sys.stdin.read())
seen = []

def hook(event, args):
    # compile: source text about to be evaluated (eval, exec, parse_expr); processes; sockets
    if event == "compile" and args and marker in str(args[0]):
        seen.append([event, str(args[0])[:120]])
    if event in ("os.system", "subprocess.Popen", "os.exec", "os.posix_spawn", "os.fork"):
        seen.append([event, str(args)[:120]])

import reasoning_gym
from reasoning_gym.factory import DATASETS
from reward.tasks import TaskConfig
from reward.verifiers import VERIFIERS
sys.addaudithook(hook)

class Timeout(Exception):
    pass

def alarm(signum, frame):
    raise Timeout

signal.signal(signal.SIGALRM, alarm)

def score(verifier, reference, texts):
    out = []
    for p in texts:
        signal.alarm(5)  # the pool's timeout, here (math-verify on 9^{9^{9^9}} never ends)
        try:
            out.append(VERIFIERS[verifier](p, reference).reason)
        except Timeout:
            out.append("timeout")
        except Exception as exc:  # the pool turns this into an "error" verdict
            out.append("error:" + type(exc).__name__)
        signal.alarm(0)
    return out

verdicts = {}
accepted = [n for n in sorted(DATASETS) if not TaskConfig("reasoning_gym", gym_dataset=n).check()]
for name in accepted:
    entry = reasoning_gym.create_dataset(name, size=1, seed=0)[0]
    ref = json.dumps({"dataset": name, "entry": entry}, default=list)
    for verifier in ("reasoning_gym", "reasoning_gym_boxed"):
        verdicts[f"{name}/{verifier}"] = score(verifier, ref, payloads)
for verifier in ("numeric", "numeric_boxed", "math", "math_boxed", "choice", "choice_boxed"):
    reference = "A" if verifier.startswith("choice") else "31337"
    verdicts[verifier] = score(verifier, reference, code_only)
print("\nRESULT", json.dumps({"accepted": accepted, "verdicts": verdicts, "seen": seen}))
"""


@pytest.mark.slow
def test_no_verifier_compiles_or_spawns_from_model_text(tmp_path):
    """Every registered verifier and every reasoning_gym dataset the config accepts, each given
    the payloads (reasoning_gym: and the pool's hostile set), in a process with an audit hook:
    no source text holding the payload's marker is ever compiled (eval, exec and parse_expr
    compile first), no process starts, no file appears, and every item gets a verdict. The
    project's own verifiers get the hostile set's code items only here: its CPU bombs hang
    math-verify in C, out of a signal's reach (test_pool.py runs them through the pool)."""
    from tests.reward.test_pool import HOSTILE

    target = tmp_path / "PWNED_MARKER_44"
    hostile = {k: t.replace("PWNED_FILE", str(target)) for k, t in HOSTILE.items()}
    texts = [*payloads(target), *hostile.values()]
    code_only = [*payloads(target), *(t for k, t in hostile.items() if k.startswith("python"))]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, "-c", AUDIT_SCRIPT, "PWNED_MARKER_44"],
        input=json.dumps([texts, code_only]),
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    # (some datasets print to stdout)
    (line,) = [x for x in out.stdout.splitlines() if x.startswith("RESULT ")]
    result = json.loads(line.removeprefix("RESULT "))
    assert result["seen"] == []
    assert not target.exists() and not (tmp_path / "PWNED_FILE").exists()
    assert len(result["accepted"]) >= 100  # of 106 registered: all but the refused
    # numeric, math and choice, each with its boxed variant
    assert len(result["verdicts"]) == 2 * len(result["accepted"]) + 6
    for key, reasons in result["verdicts"].items():
        assert len(reasons) == len(texts if "/" in key else code_only), key
        # every item a verdict: the verifier's own, or an exception the pool makes "error"
        assert all(r in REASONS or r.startswith("error:") for r in reasons), (key, reasons)
    for name in EVALUATING:  # boxed: the answer is the whole box (auto may find a number)
        assert set(result["verdicts"][f"{name}/reasoning_gym_boxed"]) <= {
            "refused",
            "no_answer",
        }


@pytest.mark.slow
@pytest.mark.parametrize("name", ["countdown", "puzzle24", "polynomial_multiplication"])
def test_issue_payload_through_the_pool_creates_nothing(name, tmp_path):
    """The issue's reproduction: ``reward.verify`` with the task's own verifier."""
    from reward import verify
    from reward.tasks import TaskConfig, make_task

    task = make_task(TaskConfig(name="reasoning_gym", gym_dataset=name, num_train=1, num_test=1))
    target = tmp_path / "PWNED"
    texts = payloads(target)
    verdicts = verify(texts, [task.test[0].answer] * len(texts), verifier=task.verifier)
    assert not target.exists()
    # auto extraction: a box is the answer; without one, a number found in the text is
    for text, verdict in zip(texts, verdicts, strict=True):
        boxed = text.startswith(r"\boxed")
        assert verdict.reason == "refused" if boxed else verdict.reason in REASONS
