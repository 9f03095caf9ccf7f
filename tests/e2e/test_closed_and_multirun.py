"""A local run is closed to the network (cluster.listen=loopback), and a Hydra multirun runs its
jobs one after another in one process without leaking Ray resources. Real actors throughout."""

from __future__ import annotations

import ipaddress
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import fast_tiny_overrides
from tests.e2e.runs import ROOT, rows, session_processes, start_train


def listening() -> set[tuple[str, int, str]]:
    """``(address, port, inode)`` of every listening TCP socket of this network namespace
    (/proc/net/tcp{,6}: state 0A; addresses in the kernel's byte order, 4-byte words)."""
    found = set()
    for name in ("tcp", "tcp6"):
        try:
            lines = Path(f"/proc/net/{name}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] != "0A":
                continue
            addr_hex, port_hex = fields[1].split(":")
            raw = bytes.fromhex(addr_hex)
            raw = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
            found.add((str(ipaddress.ip_address(raw)), int(port_hex, 16), fields[9]))
    return found


def is_loopback(address: str) -> bool:
    ip = ipaddress.ip_address(address)
    mapped = getattr(ip, "ipv4_mapped", None)
    return ip.is_loopback or (mapped is not None and mapped.is_loopback)


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
        assert ("127.0.0.1", port) in {(a, p) for a, p, _ in listening()}


@pytest.mark.slow
@pytest.mark.parametrize("listen", ["loopback", "node"])
def test_a_local_run_listens_on_loopback_only(tmp_path, tiny_model_dir, listen):
    """Ray (GCS, raylet, workers, agents), DeepSpeed's store and gloo pairs, the collective weight
    sync's store and vLLM's own: every socket the run opens listens on 127.0.0.1 by default;
    ``cluster.listen=node`` (Ray's own default) opens some beyond it (the check can fail)."""
    before = listening()
    run_dir = tmp_path / "run"
    proc = start_train(
        run_dir,
        *fast_tiny_overrides(tiny_model_dir),
        f"cluster.listen={listen}",
        "rollout.weight_sync=collective",
        "trainer.total_steps=2",
        "trainer.prompts_per_step=4",
        "trainer.eval_every=0",
        "trainer.eval_pass_k=0",
        "logger.report=false",
    )
    seen: set[tuple[str, int, str]] = set()
    deadline = time.monotonic() + 900
    while proc.poll() is None and time.monotonic() < deadline:
        seen |= listening() - before
        time.sleep(0.2)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, out[-3000:] + err[-3000:]
    assert {1, 2} <= set(rows(run_dir))
    # Ray alone opens ~10 listening sockets (GCS, raylet x2, agents, workers): the run was seen
    assert len(seen) >= 5, seen
    open_ = sorted((a, p) for a, p, _ in seen if not is_loopback(a))
    if listen == "loopback":
        assert not open_, f"listening beyond loopback: {open_}"
    else:  # Ray's GCS and raylet listen on every interface
        assert len(open_) >= 2, seen


@pytest.mark.slow
def test_a_two_job_multirun_runs_both_in_one_process(tmp_path, tiny_model_dir):
    """``--multirun algorithm=grpo,avspo``, 2 steps each: both jobs finish with their own metrics
    (the second reserves its placement groups after the first released its own), and the
    process exits 0 with no Ray process left behind."""
    sweep = tmp_path / "sweep"
    cmd = [
        sys.executable,
        "-m",
        "launch.train",
        "--multirun",
        "algorithm=grpo,avspo",
        "rollout=hf",
        *fast_tiny_overrides(tiny_model_dir),
        "trainer.total_steps=2",
        "trainer.prompts_per_step=4",
        "trainer.eval_every=0",
        "trainer.eval_pass_k=0",
        "logger.report=false",
        f"hydra.sweep.dir={sweep}",
    ]
    proc = subprocess.Popen(
        cmd,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its session id is its pid: what is left of it is findable
    )
    out, err = proc.communicate(timeout=1200)
    assert proc.returncode == 0, out[-3000:] + err[-3000:]
    assert out.count("held-out accuracy:") == 2, out[-3000:]
    jobs = sorted(p for p in sweep.iterdir() if p.is_dir())
    assert [p.name for p in jobs] == ["0", "1"]
    for job, algorithm in zip(jobs, ("grpo", "avspo"), strict=True):
        got = rows(job)
        assert {1, 2} <= set(got), job
        assert f"name: {algorithm}" in (job / "config.yaml").read_text()
    deadline = time.monotonic() + 30  # Ray's daemons exit within moments of ray.shutdown()
    while session_processes(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not session_processes(proc.pid), session_processes(proc.pid)
