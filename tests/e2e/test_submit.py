"""``python -m launch.submit`` against a real Ray head started here (loopback only): a 2-step
run as a Ray job, bad input refused before anything is submitted, no secret in the job.

The head is ``ray start --head --block`` with its own sid, ended by signalling the processes it
started (never ``ray stop``, which would also stop the test run's own ``ray.init`` cluster)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import NamedTuple

import pytest

from tests.conftest import fast_tiny_overrides

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
SECRET = f"sentinel-{uuid.uuid4().hex}"
PORT_FLAGS = (
    "--port",
    "--dashboard-port",
    "--ray-client-server-port",
    "--dashboard-agent-listen-port",
    "--dashboard-agent-grpc-port",
    "--metrics-export-port",
    "--runtime-env-agent-port",
    "--node-manager-port",
    "--object-manager-port",
)


class Head(NamedTuple):
    url: str  # the dashboard (job API)
    token: str  # Ray's auth token of this head
    auth_env: dict[str, str]  # what a submitting shell sets to use it
    temp: str  # its --temp-dir (head.log, session_latest/logs/)

    def log_tails(self, chars: int = 2000) -> str:
        """The ends of the head's own logs and its dashboard's: a failed submission's message
        carries them (the fixture deletes the folder when the module ends)."""
        logs = [Path(self.temp) / "head.log"]
        logs += sorted((Path(self.temp) / "session_latest" / "logs").glob("dashboard*"))
        return "".join(
            f"\n--- {p.name} ---\n{p.read_text(errors='replace')[-chars:]}"
            for p in logs
            if p.is_file()
        )


def free_ports(n: int) -> list[int]:
    with contextlib.ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(n)]
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]


def port_in_use(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "WANDB_"))}
    return {**env, "PATH": f"{BIN}{os.pathsep}{env.get('PATH', '')}", **extra}


def submit(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "launch.submit", *args],
        cwd=ROOT,
        env=clean_env(**env),
        capture_output=True,
        text=True,
        timeout=900,
    )


def stop_tree(proc: subprocess.Popen) -> None:
    """SIGTERM ``ray start --block`` (it ends what it started), then SIGKILL what is left."""
    import psutil

    def tree() -> dict[int, psutil.Process]:
        with contextlib.suppress(psutil.NoSuchProcess):
            root = psutil.Process(proc.pid)
            return {p.pid: p for p in (root, *root.children(recursive=True))}
        return {}

    procs = tree()  # before the signal: children of dead parents get reparented
    proc.send_signal(signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=10)
    for p in list(procs.values()):
        with contextlib.suppress(psutil.NoSuchProcess):
            procs.update({c.pid: c for c in p.children(recursive=True)})
    for p in procs.values():
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()
    psutil.wait_procs(list(procs.values()), timeout=10)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)


@pytest.fixture(scope="module")
def ray_head():
    """A fresh head as a user starts one on a 2-core machine (``--num-cpus 2``; issue 63: the
    default run fits it), 127.0.0.1 only, token auth with a throwaway token."""
    import requests

    ports = dict(zip(PORT_FLAGS, free_ports(len(PORT_FLAGS)), strict=True))
    temp = tempfile.mkdtemp(prefix="rs", dir="/tmp")  # short: Ray's socket paths have a limit
    cmd = [str(BIN / "ray"), "start", "--head", "--block", "--node-ip-address=127.0.0.1"]
    cmd += [f"{flag}={port}" for flag, port in ports.items()]
    cmd += ["--dashboard-host=127.0.0.1", "--include-dashboard=true", "--num-cpus=2"]
    cmd += [f"--temp-dir={temp}", "--disable-usage-stats"]
    log = open(Path(temp) / "head.log", "w")  # noqa: SIM115 (closed in the finally)
    token = secrets.token_hex(32)  # token auth on, as a real cluster has it, with our own token
    (Path(temp) / "auth_token").write_text(token)
    auth = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(Path(temp) / "auth_token")}
    # RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0: every Ray address on this node is 127.0.0.1
    env = clean_env(RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0", RAY_USAGE_STATS_ENABLED="0", **auth)
    head = subprocess.Popen(
        cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    url = f"http://127.0.0.1:{ports['--dashboard-port']}"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert head.poll() is None, (Path(temp) / "head.log").read_text()[-3000:]
            with contextlib.suppress(requests.RequestException):
                headers = {"Authorization": f"Bearer {token}"}
                if requests.get(f"{url}/api/jobs/", headers=headers, timeout=5).status_code == 200:
                    break
            assert time.monotonic() < deadline, "the Ray head did not come up in 120 s"
            time.sleep(1)
        yield Head(url, token, auth, temp)
    finally:
        stop_tree(head)
        log.close()
        busy = [p for p in ports.values() if port_in_use(p)]
        shutil.rmtree(temp, ignore_errors=True)
        assert not busy, f"ports still bound after the head stopped: {busy}"


@pytest.fixture
def client(ray_head, monkeypatch):
    from ray.job_submission import JobSubmissionClient

    # JobSubmissionClient prefers these over its argument
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.delenv("RAY_API_SERVER_ADDRESS", raising=False)
    return JobSubmissionClient(ray_head.url, headers={"Authorization": f"Bearer {ray_head.token}"})


def test_no_address_is_one_line_exit_2():
    out = submit("trainer.total_steps=2")
    assert out.returncode == 2, out.stderr
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert "RAY_ADDRESS" in out.stderr and "Traceback" not in out.stderr


def test_gcs_or_unreachable_address_is_refused():
    out = submit("trainer.total_steps=2", RAY_ADDRESS="127.0.0.1:6379")
    assert out.returncode == 2 and "dashboard" in out.stderr, out.stderr
    (port,) = free_ports(1)
    out = submit("--address", f"http://127.0.0.1:{port}", "trainer.run_dir=/tmp/unused")
    assert out.returncode == 2 and "cannot reach" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr


@pytest.mark.slow
def test_bad_override_is_not_submitted(ray_head, client):
    before = len(client.list_jobs())
    out = submit("--address", ray_head.url, "trainer.total_stepz=2", **ray_head.auth_env)
    assert out.returncode == 2, out.stdout + out.stderr
    assert "trainer.total_stepz" in out.stderr and "nothing was submitted" in out.stderr
    assert len(client.list_jobs()) == before
    assert not any("total_stepz" in job.entrypoint for job in client.list_jobs())


@pytest.mark.slow
def test_two_step_run_as_ray_job(ray_head, client, tmp_path, tiny_model_dir):
    from ray.job_submission import JobStatus

    run_dir = tmp_path / "run"  # absolute: the job's cwd is Ray's copy of the working dir
    overrides = [
        "trainer.total_steps=2",
        "trainer.eval_every=1",
        "trainer.prompts_per_step=4",
        "rollout=hf",
        "learner.num_ranks=1",
        "verifier.num_workers=1",
        f"trainer.run_dir={run_dir}",
        f"hydra.run.dir={tmp_path / 'hydra'}",
        *fast_tiny_overrides(tiny_model_dir),  # the test run's small model, already built
    ]
    job_id = f"avspo-test-{uuid.uuid4().hex[:8]}"
    t0 = time.monotonic()
    out = submit(
        "--address", ray_head.url, "--follow", "--timeout-s", "600", "--job-id", job_id, *overrides,
        WANDB_API_KEY=SECRET, HF_TOKEN=SECRET, **ray_head.auth_env,
    )  # fmt: skip
    took = time.monotonic() - t0
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-3000:] + ray_head.log_tails()
    assert f"job {job_id} SUCCEEDED" in out.stderr, out.stderr
    assert "held-out accuracy" in out.stdout  # the job's log was followed
    assert client.get_job_status(job_id) == JobStatus.SUCCEEDED
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2]
    assert all("eval/accuracy" in r for r in rows)
    assert (run_dir / "config.yaml").exists()

    info = client.get_job_info(job_id)
    assert info.job_id  # set once the entrypoint's ray.init joined this cluster (not its own Ray)
    assert info.runtime_env["working_dir"].startswith("gcs://")  # the project was uploaded
    for secret in (SECRET, ray_head.token):
        assert secret not in json.dumps(info.runtime_env) + info.entrypoint
        assert secret not in client.get_job_logs(job_id)
        for path in run_dir.rglob("*"):
            if path.is_file():
                assert secret.encode() not in path.read_bytes(), path
    print(f"submit -> SUCCEEDED in {took:.1f} s")


@pytest.mark.slow
def test_the_default_run_through_rays_own_cli_on_a_2_cpu_head(ray_head, client, tmp_path):
    """Issue 63: Ray's own ``ray job submit`` (not launch.submit), as docs/cluster.md tells a
    user to run it (token: RAY_AUTH_MODE=token for the client; the working dir's excludes), the
    default run (vLLM, two learner ranks, the verifier pool) on a head with 2 CPUs: the actors'
    3 CPUs are scaled into the head's 2, as in a Ray the run starts. One step and 32 held-out
    problems instead of 40 and 256 (the layout and the CPU asks are the default's). Prints the
    time from the submission to the first step's row."""
    from launch.submit import EXCLUDES

    run_dir = tmp_path / "run"  # absolute: the job's cwd is Ray's copy of the working dir
    env = clean_env(RAY_ADDRESS=ray_head.url, **ray_head.auth_env)
    cmd = [str(BIN / "ray"), "job", "submit", "--working-dir", ".",
           "--runtime-env-json", json.dumps({"excludes": [*EXCLUDES, "runs"]}),
           "--", "python", "-m", "launch.train", "trainer.total_steps=1", "task.num_test=32",
           f"trainer.run_dir={run_dir}"]  # fmt: skip
    t0 = time.monotonic()
    proc = subprocess.Popen(
        cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )  # fmt: skip
    first = None
    metrics = run_dir / "metrics.jsonl"
    while proc.poll() is None and time.monotonic() - t0 < 900:
        if first is None and metrics.exists() and '"step": 1' in metrics.read_text():
            first = time.monotonic() - t0
        time.sleep(0.2)
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    out = proc.communicate(timeout=60)[0]
    assert proc.returncode == 0, out[-4000:] + ray_head.log_tails()
    assert "succeeded" in out and "held-out accuracy" in out, out[-3000:]
    assert "each CPU ask x 0.667" in out  # 3 CPUs asked (2 colocated bundles + the verifier)
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1]
    (job,) = [j for j in client.list_jobs() if "trainer.total_steps=1" in j.entrypoint
              and str(run_dir) in j.entrypoint]  # fmt: skip
    assert job.status == "SUCCEEDED"
    print(f"ray job submit -> first step in {first:.1f} s, done in {time.monotonic() - t0:.1f} s")


class FakeClient:
    """What launch.submit.follow uses of JobSubmissionClient."""

    def __init__(self, status: str, hang: bool = False):
        from ray.job_submission import JobStatus

        self.status, self.hang, self.stopped = JobStatus(status), hang, False

    async def tail_job_logs(self, job_id):
        yield "a log line\n"
        if self.hang:
            await asyncio.sleep(3600)

    def get_job_status(self, job_id):
        return self.status

    def stop_job(self, job_id):
        self.stopped = True

    def get_job_info(self, job_id):
        return SimpleNamespace(message="the entrypoint exited with 1")


@pytest.mark.parametrize(
    ("status", "hang", "code"),
    [("SUCCEEDED", False, 0), ("FAILED", False, 1), ("STOPPED", False, 1), ("RUNNING", True, 124)],
)
def test_follow_exit_codes(status, hang, code, capsys):
    from launch.submit import follow

    fake = FakeClient(status, hang)
    assert follow(fake, "job", timeout_s=0.5) == code
    out = capsys.readouterr()
    assert "a log line" in out.out
    assert fake.stopped == (code == 124)
    assert ("exited with 1" in out.err) == (code == 1)


class DroppingClient:
    """What launch.submit.submit_job uses of JobSubmissionClient: the first ``drops`` submissions
    lose their connection, after creating the job when ``created``."""

    def __init__(self, drops: int, created: bool = False):
        self.drops, self.created, self.jobs, self.calls = drops, created, {}, []

    def submit_job(self, *, entrypoint, runtime_env, submission_id):
        import requests

        self.calls.append(submission_id)
        if len(self.calls) <= self.drops:
            if self.created:
                self.jobs[submission_id] = entrypoint
            raise requests.exceptions.ConnectionError("Connection aborted.")
        if submission_id in self.jobs:
            raise RuntimeError(f"job {submission_id} already exists")
        self.jobs[submission_id] = entrypoint
        return submission_id

    def get_job_info(self, job_id):
        return SimpleNamespace(entrypoint=self.jobs[job_id])  # KeyError: no such job


@pytest.mark.parametrize("job_id", ["mine", None])
def test_a_dropped_submission_is_tried_again_under_the_same_id(job_id, capsys):
    from launch.submit import submit_job

    fake = DroppingClient(drops=2)
    got = submit_job(fake, "python -m launch.train", {}, job_id, wait_s=0)
    assert len(fake.calls) == 3 and len(set(fake.calls)) == 1  # one id, three attempts
    assert got == fake.calls[0] and fake.jobs == {got: "python -m launch.train"}
    assert got == "mine" if job_id else got.startswith("raysubmit_")
    assert capsys.readouterr().err.count("trying again") == 2


def test_a_job_the_dropped_attempt_created_is_not_submitted_twice():
    from launch.submit import submit_job

    fake = DroppingClient(drops=1, created=True)
    assert submit_job(fake, "python -m launch.train", {}, "mine", wait_s=0) == "mine"
    assert fake.calls == ["mine"]


def test_a_connection_that_keeps_dropping_fails_after_three_attempts():
    import requests

    from launch.submit import submit_job

    fake = DroppingClient(drops=5)
    with pytest.raises(requests.exceptions.ConnectionError):
        submit_job(fake, "python -m launch.train", {}, None, wait_s=0)
    assert len(fake.calls) == 3
