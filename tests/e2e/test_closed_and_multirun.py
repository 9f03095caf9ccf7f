"""A Hydra multirun (GRPO and AVSPO on the same rewards) runs its jobs one after another in one
process without leaking Ray resources, and with ``cluster.listen=node`` its sockets listen beyond
loopback (the control of the default run's loopback check). Real actors throughout."""

from __future__ import annotations

import ipaddress
import os
import subprocess
import sys
import time

import pytest

from tests.conftest import fast_tiny_overrides
from tests.e2e.runs import (
    ROOT,
    is_loopback,
    listening,
    processes_left,
    rows,
    socket_sids,
    watch_listening,
)


def test_the_socket_reader_decodes_the_kernels_format():
    # 127.0.0.1:8080 as the kernel writes it: 0100007F:1F90; ::ffff:127.0.0.1 in tcp6 words
    assert str(ipaddress.ip_address(bytes.fromhex("0100007F")[::-1])) == "127.0.0.1"
    assert is_loopback("127.0.0.1") and is_loopback("::ffff:127.0.0.1") and is_loopback("::1")
    assert not is_loopback("0.0.0.0") and not is_loopback("::") and not is_loopback("10.0.0.2")
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        [inode] = [i for a, p, i in listening() if (a, p) == ("127.0.0.1", port)]
        assert socket_sids()[inode] == os.getsid(0)  # ours: attributed to our sid


@pytest.mark.slow
def test_grpo_and_avspo_as_a_two_job_multirun_on_the_same_rewards(tmp_path, tiny_model_dir):
    """``--multirun algorithm=grpo,avspo``, 2 steps each, in one process: both jobs finish with
    their own metrics (the second reserves its placement groups after the first released its
    own) and the process exits 0 with no Ray process left behind.

    Step 1 of both jobs sees identical rewards (same seed, same weights: a job does not depend
    on the one before it): GRPO leaves every collapsed group at zero advantage (effective ==
    raw); AVSPO, triggered, gives them non-zero advantages (effective < raw). With logger=wandb
    and a key in the environment, the key appears in no file of either run directory.

    The sweep runs with ``cluster.listen=node`` (Ray's own default): the control of the loopback
    check in tests/e2e/test_default_run.py (every socket of a default run listens on 127.0.0.1),
    the same check here sees Ray's GCS and raylet listen on every interface."""
    sweep = tmp_path / "sweep"
    sentinel = "sk-test-SENTINEL-4f1d2c9a8b7e"
    cmd = [
        sys.executable,
        "-m",
        "launch.train",
        "--multirun",
        "algorithm=grpo,avspo",
        "algorithm.trigger.policy=always",  # AVSPO triggers at ACR_t > 0 (step 1: ~0.06)
        "cluster.listen=node",
        "rollout=hf",
        *fast_tiny_overrides(tiny_model_dir),
        "trainer.total_steps=2",
        "trainer.prompts_per_step=16",
        "learner.num_ranks=1",  # what is tested is the sweep and the rewards, not the ranks
        "trainer.eval_every=0",
        "trainer.eval_pass_k=0",
        "logger=wandb",
        "logger.report=false",
        f"hydra.sweep.dir={sweep}",
    ]
    before = listening()
    proc = subprocess.Popen(
        cmd,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), "WANDB_API_KEY": sentinel,
             "WANDB_MODE": "offline"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its sid is its pid: what is left of it is findable
    )  # fmt: skip
    seen, out, err = watch_listening(proc, before, time.monotonic() + 1200)
    assert proc.returncode == 0, out[-3000:] + err[-3000:]
    assert len(seen) >= 5, seen  # Ray alone opens ~10 (GCS, raylet x2, agents, workers)
    assert len([a for a, _, _ in seen if not is_loopback(a)]) >= 2, seen
    assert out.count("held-out accuracy:") == 2, out[-3000:]
    # the sweep's shared trigger override is avspo's: a note in the grpo job, not a refusal
    assert out.count("note: algorithm.trigger.policy: set, but this run never reads it") == 1
    jobs = sorted(p for p in sweep.iterdir() if p.is_dir())
    assert [p.name for p in jobs] == ["0", "1"]
    for job, algorithm in zip(jobs, ("grpo", "avspo"), strict=True):
        assert {1, 2} <= set(rows(job)), job
        assert f"name: {algorithm}" in (job / "config.yaml").read_text()
    assert processes_left(proc.pid) == []

    g, a = rows(jobs[0]), rows(jobs[1])
    assert g[1]["acr/raw"] == a[1]["acr/raw"] and g[1]["reward/mean"] == a[1]["reward/mean"]
    for step in (1, 2):
        assert g[step]["acr/effective"] == g[step]["acr/raw"]
    triggered = [s for s in (1, 2) if a[s]["avspo/triggered"] == 1.0]
    assert 1 in triggered and a[1]["acr/raw"] > 0
    assert a[1]["acr/effective"] < g[1]["acr/effective"]
    for step in triggered:
        assert a[step]["acr/effective"] < a[step]["acr/raw"]
        assert a[step]["avspo/virtual_samples"] > 0
    for job in jobs:
        assert (job / "wandb").is_dir()  # the offline wandb run is there...
        for path in (p for p in job.rglob("*") if p.is_file()):  # ...and the key in no file
            assert sentinel.encode() not in path.read_bytes(), path
