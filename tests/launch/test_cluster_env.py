"""``cluster.env_vars`` (issue 62): the GPU presets' NCCL settings reach every actor through
Ray's runtime env, on a joined cluster and on a local Ray alike, and a variable the driver's own
environment sets keeps the driver's value."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from launch import cluster
from tests.helpers import ROOT, load

NCCL = {"NCCL_CUMEM_ENABLE": "0", "NCCL_NVLS_ENABLE": "0"}


@pytest.mark.parametrize("preset", ["gpu_node", "gpu_node_split", "multi_node"])
def test_the_gpu_presets_give_every_actor_nccls_settings(preset):
    cfg = load(f"cluster={preset}")
    assert cfg.cluster.env_vars == NCCL
    got = cluster.runtime_env_vars(cfg, environ={})
    assert {k: got[k] for k in NCCL} == NCCL
    # the user's own value wins; a preset's variable can be dropped or another added
    got = cluster.runtime_env_vars(cfg, environ={"NCCL_CUMEM_ENABLE": "1"})
    assert "NCCL_CUMEM_ENABLE" not in got and got["NCCL_NVLS_ENABLE"] == "0"
    cfg = load(f"cluster={preset}", "~cluster.env_vars.NCCL_NVLS_ENABLE",
               "+cluster.env_vars.NCCL_DEBUG=WARN")  # fmt: skip
    assert cfg.cluster.env_vars == {"NCCL_CUMEM_ENABLE": "0", "NCCL_DEBUG": "WARN"}


def test_a_local_run_sets_no_nccl_variable():
    got = cluster.runtime_env_vars(load(), environ={})
    assert not any(k.startswith("NCCL_") for k in got) and got["TOKENIZERS_PARALLELISM"] == "false"


@pytest.mark.parametrize("joined", [True, False])
def test_init_ray_hands_them_to_ray_joined_or_local(monkeypatch, tmp_path, joined):
    """Both branches of ``init_ray`` (``ray.init`` stood in for: what it is given is the
    point)."""
    import ray

    seen = {}
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda **kwargs: seen.update(kwargs))
    monkeypatch.setattr(cluster, "run_ray_temp_dir", lambda: str(tmp_path / "ray"))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    for key in NCCL:
        monkeypatch.delenv(key, raising=False)
    address = ["cluster.address=10.0.0.1:6379"] if joined else ["cluster.listen=node"]
    cluster.init_ray(load("cluster=gpu_node", *address))
    assert seen["address"] == ("10.0.0.1:6379" if joined else "local")
    env = seen["runtime_env"]["env_vars"]
    assert {k: env[k] for k in NCCL} == NCCL


@pytest.mark.slow
@pytest.mark.ray
def test_an_actor_of_a_local_ray_sees_them():
    """A real local Ray in a child process: a task reads its environment. The driver's own
    NCCL_CUMEM_ENABLE=1 stays; NCCL_NVLS_ENABLE comes from the config. That Ray starts no idle
    workers ahead of the first task (launch/cluster.py ``NO_PRESTART``): two seconds after its
    start its raylet's children are its two agents only (Ray's default had two ``ray::IDLE``
    workers there by then, measured)."""
    code = (
        "import os, time, ray\n"
        "from pathlib import Path\n"
        "from launch.cluster import init_ray\n"
        "from tests.helpers import load\n"
        "def kids(pid):\n"
        "    stats = {p.name: p / 'stat' for p in Path('/proc').glob('[0-9]*')}\n"
        "    return [int(k) for k, f in stats.items()\n"
        "            if f.read_text().rsplit(')', 1)[1].split()[1] == str(pid)]\n"
        "title = lambda pid: Path(f'/proc/{pid}/cmdline').read_bytes().split(b'\\0')[0]\n"
        "init_ray(load('learner.num_ranks=1', '+cluster.env_vars.NCCL_CUMEM_ENABLE=0',"
        " '+cluster.env_vars.NCCL_NVLS_ENABLE=0'))\n"
        "raylet = [k for k in kids(os.getpid()) if title(k).endswith(b'/raylet')][0]\n"
        "time.sleep(2)\n"
        "print('BEFORE', sorted(title(k).decode() for k in kids(raylet)))\n"
        "env = ray.get(ray.remote(num_cpus=0)(lambda: dict(os.environ)).remote(), timeout=120)\n"
        "print('GOT', env.get('NCCL_CUMEM_ENABLE'), env.get('NCCL_NVLS_ENABLE'))\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("NCCL_NVLS_ENABLE", "RAY_ADDRESS")}
    env |= {"NCCL_CUMEM_ENABLE": "1", "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=300)  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    assert "GOT 1 0" in out.stdout, out.stdout
    assert "BEFORE ['ray::DashboardAgent', 'ray::RuntimeEnvAgent']\n" in out.stdout, out.stdout
