"""``python -m launch.submit [options] [hydra overrides]``: run ``launch.train`` as a Ray job.

    python -m launch.submit --address http://HEAD:8265 trainer.run_dir=/shared/runs/a algorithm=grpo

The overrides are checked here first (the same Hydra composition and value checks as
``launch.train``), so a typo fails at once naming the key, and nothing is submitted. The job's
entrypoint is ``python -m launch.train <overrides>``; this project folder is uploaded as the job's
``working_dir`` (without .venv, outputs, caches and .git; Ray limits its size), or, run from an
installed copy (a wheel: no checkout around ``launch``), a temporary folder with only the
project's packages; the cluster's image must already have the project's dependencies (no pip/conda
in the runtime env). Inside the job Ray sets ``RAY_ADDRESS`` to the cluster's GCS address, so
``launch.train`` joins the cluster.

Address: ``--address``, else ``$RAY_API_SERVER_ADDRESS``, else ``$RAY_ADDRESS``. The job API is
the head's dashboard HTTP address (``http://HEAD:8265``), not the GCS address (``HEAD:6379``) that
``ray.init`` and ``ray start --address`` take.

Secrets: none are put in the job. The runtime env carries only ``PYTHONUNBUFFERED=1``; API keys
(``WANDB_API_KEY``, ``HF_TOKEN``, ...) set where you submit are NOT forwarded: the cluster's nodes
read them from their own environment (set them where the head and workers start). ``.env*``,
``.netrc``, ``*.pem`` and ``*.key`` files are left out of the upload. A Ray auth token (token
authentication) is read, as ``ray.init`` does, from ``RAY_AUTH_TOKEN``, ``RAY_AUTH_TOKEN_PATH`` or
``~/.ray/auth_token`` and only sent in the requests' HTTP header.

``trainer.run_dir`` should be an absolute path on storage the head can write (shared for
multi-node checkpoints): the job's working directory is Ray's temporary unpacked copy.

Exit status: 0 the job succeeded (or was submitted, with ``--no-wait``); 1 it failed or was
stopped; 2 nothing was submitted (bad option, address, override, or unreachable cluster); 124
``--timeout-s`` passed while following (the job is then stopped).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shlex
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import NoReturn

ROOT = Path(__file__).resolve().parents[1]  # the checkout, or site-packages when installed
PACKAGES = ("comm", "rollout", "reward", "learner", "diagnostics", "launch", "conf")  # shipped
EXCLUDES = [
    ".venv", ".git", "outputs", "multirun", "wandb", "build", "__pycache__", "*.egg-info",
    ".ruff_cache", ".pytest_cache", ".hypothesis",
    ".env*", ".netrc", "*.pem", "*.key",  # secrets: never uploaded
]  # fmt: skip
ENV_VARS = {"PYTHONUNBUFFERED": "1"}  # launch.cluster.init_ray adds TOKENIZERS_PARALLELISM
# itself when absent (Ray refuses a job driver whose runtime env repeats a job env var key).
HTTP_TIMEOUT_S = (10.0, 120.0)  # (connect, read) for every request to the dashboard


def fail(message: str, code: int = 2) -> NoReturn:
    print(f"launch.submit: {message}", file=sys.stderr)
    sys.exit(code)


def resolve_address(arg: str | None) -> str:
    address = arg or os.environ.get("RAY_API_SERVER_ADDRESS") or os.environ.get("RAY_ADDRESS")
    if not address:
        fail("no cluster: pass --address http://HEAD:8265 or set RAY_ADDRESS (dashboard address)")
    if not address.startswith(("http://", "https://")):
        fail(
            f"{address!r} is not a dashboard address: the Ray job API needs the head's dashboard "
            "HTTP address, e.g. http://HEAD:8265 (HEAD:6379 / ray:// are for ray.init)"
        )
    return address.rstrip("/")


def check_overrides(overrides: list[str]) -> str | None:
    """Compose and validate the config as launch.train does (a problem: the one line it prints,
    exit 2); return trainer.run_dir."""
    from launch.validation import ConfigError, compose_config

    try:
        cfg = compose_config(overrides)
    except ConfigError as err:
        fail(f"config error: {err}; nothing was submitted")
    return cfg.trainer.run_dir


@contextlib.contextmanager
def job_working_dir() -> Iterator[Path]:
    """The folder uploaded as the job's ``working_dir``: this checkout, or for an installed copy
    (``ROOT`` is site-packages, no pyproject.toml) a temporary folder holding only the project's
    packages, so that the job runs the same code and site-packages is never uploaded. Ray packs
    and uploads it inside ``submit_job``, so the folder need only outlive that call."""
    if (ROOT / "pyproject.toml").is_file():
        yield ROOT
        return
    with tempfile.TemporaryDirectory(prefix="avspo-job-") as tmp:
        for name in PACKAGES:
            shutil.copytree(ROOT / name, Path(tmp, name), ignore=shutil.ignore_patterns(*EXCLUDES))
        yield Path(tmp)


def connect(address: str):
    from ray.job_submission import JobSubmissionClient

    class Client(JobSubmissionClient):  # every HTTP request gets a timeout (Ray sets none)
        def _do_request(self, method, endpoint, **kwargs):
            kwargs.setdefault("timeout", HTTP_TIMEOUT_S)
            return super()._do_request(method, endpoint, **kwargs)

    # JobSubmissionClient prefers these variables over its address argument.
    os.environ.pop("RAY_API_SERVER_ADDRESS", None)
    os.environ["RAY_ADDRESS"] = address
    try:  # send Ray's auth token (RAY_AUTH_TOKEN[_PATH], ~/.ray/auth_token) as ray.init would
        from ray._private.authentication.authentication_token_setup import (
            maybe_enable_token_auth_if_token_available as enable_token_auth,
        )

        enable_token_auth(warn_if_disabled=False)
    except ImportError:  # a Ray without token authentication
        pass
    try:
        return Client(address)
    except Exception as err:  # refused, timed out, not a dashboard (404), ...
        fail(f"cannot reach the Ray job API at {address}: {err}")


async def stream_logs(client, job_id: str, deadline: float) -> bool:
    """Print the job's logs until it ends; False if the deadline passed first."""
    logs = client.tail_job_logs(job_id).__aiter__()
    while (left := deadline - time.monotonic()) > 0:
        try:
            chunk = await asyncio.wait_for(logs.__anext__(), timeout=left)
        except StopAsyncIteration:
            return True
        except asyncio.TimeoutError:
            return False
        print(chunk, end="", flush=True)
    return False


def follow(client, job_id: str, timeout_s: float) -> int:
    from ray.job_submission import JobStatus

    deadline = time.monotonic() + timeout_s
    ended = asyncio.run(stream_logs(client, job_id, deadline))
    while ended and not (status := client.get_job_status(job_id)).is_terminal():
        if time.monotonic() > deadline:  # the log stream closed, the status never ended
            ended = False
            break
        time.sleep(1.0)
    if not ended:
        client.stop_job(job_id)
        print(
            f"launch.submit: job {job_id} still running after {timeout_s:g} s: stopped it",
            file=sys.stderr,
        )
        return 124
    print(f"launch.submit: job {job_id} {status.value}", file=sys.stderr)
    if status == JobStatus.SUCCEEDED:
        return 0
    print(f"launch.submit: {client.get_job_info(job_id).message}", file=sys.stderr)
    return 1


def submit_job(
    client,
    entrypoint: str,
    runtime_env: dict,
    job_id: str | None,
    *,
    attempts: int = 3,
    wait_s: float = 2.0,
) -> str:
    """``client.submit_job`` under a submission id fixed here (``job_id``, else a new one), tried
    again (after 2 s, then 4 s) when the dashboard drops the connection: a head under load closed
    one mid-upload in a CI run. The fixed id makes a retry safe: a job that the dropped attempt
    did create is found by its id and entrypoint, and not submitted twice."""
    import secrets
    import string

    import requests

    alphabet = string.ascii_letters + string.digits
    job_id = job_id or "raysubmit_" + "".join(secrets.choice(alphabet) for _ in range(16))
    tried = 0
    while True:
        try:
            return client.submit_job(
                entrypoint=entrypoint, runtime_env=runtime_env, submission_id=job_id
            )
        except requests.exceptions.ConnectionError as err:
            with contextlib.suppress(Exception):  # no such job: the attempt did not create it
                if client.get_job_info(job_id).entrypoint == entrypoint:
                    return job_id
            tried += 1
            if tried == attempts:
                raise
            wait = wait_s * 2 ** (tried - 1)
            print(f"launch.submit: {err}; trying again in {wait:g} s", file=sys.stderr)
            time.sleep(wait)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m launch.submit",
        description="Submit launch.train as a Ray job (see the module docstring).",
        epilog="Everything else is a Hydra override for launch.train.",
    )
    parser.add_argument("--address", help="dashboard URL (default: $RAY_ADDRESS)")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument(
        "--follow",
        dest="wait",
        action="store_true",
        default=True,
        help="stream the job's logs until it ends (the default)",
    )
    mode.add_argument("--no-wait", dest="wait", action="store_false", help="submit and return")
    parser.add_argument(
        "--timeout-s",
        type=float,
        default=7 * 24 * 3600.0,
        help="stop the job if it runs longer while followed (default 7 days)",
    )
    parser.add_argument("--job-id", help="submission id (default: Ray generates one)")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, as for launch.train")
    args = parser.parse_intermixed_args(argv)
    if args.timeout_s <= 0:
        fail("--timeout-s must be > 0")
    run_dir = check_overrides(args.overrides)  # a bad key fails before any address is needed
    address = resolve_address(args.address)
    if not run_dir or not os.path.isabs(run_dir):
        print(
            "launch.submit: warning: trainer.run_dir is not an absolute path: the run's files "
            "will land in the job's temporary working dir copy",
            file=sys.stderr,
        )
    client = connect(address)
    entrypoint = shlex.join(["python", "-m", "launch.train", *args.overrides])
    try:
        with job_working_dir() as working_dir:
            runtime_env = {
                "working_dir": str(working_dir),
                "excludes": EXCLUDES,
                "env_vars": dict(ENV_VARS),
            }
            job_id = submit_job(client, entrypoint, runtime_env, args.job_id)
    except Exception as err:  # HTTP errors, duplicate job id, working dir too large, ...
        fail(f"submission to {address} failed: {err}")
    print(f"launch.submit: job {job_id} submitted: {entrypoint}", file=sys.stderr)
    print(f"launch.submit: dashboard {address}/#/jobs/{job_id}", file=sys.stderr)
    print(job_id, flush=True)
    if not args.wait:
        return 0
    try:
        return follow(client, job_id, args.timeout_s)
    except KeyboardInterrupt:
        fail(f"stopped following; the job runs on (ray job stop {job_id})", 130)
    except Exception as err:  # the dashboard went away, HTTP timeout, ...
        fail(f"lost track of job {job_id} at {address}: {err!r}", 1)


if __name__ == "__main__":
    sys.exit(main())
