"""The cores a colocated phase may use on a local node: the affinity mask cut to the cgroup's
CPU quota. A container given 2 CPUs of a 64-core host sees all 64 in its mask; planning 64 torch
threads per phase there runs each OpenMP region on a throttled 2-CPU quota (a CI run hung this
way). The cgroup trees below are written by the tests."""

from __future__ import annotations

from pathlib import Path

from launch.cores import cgroup_cpu_limit, usable_cores


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_v2_quota_of_the_process_cgroup(tmp_path):
    # cpu.max "200000 100000": 200 ms of CPU per 100 ms period = 2 CPUs
    write(tmp_path / "proc_cgroup", "0::/job/ci\n")
    write(tmp_path / "cg/job/ci/cpu.max", "200000 100000\n")
    assert cgroup_cpu_limit(tmp_path / "proc_cgroup", tmp_path / "cg") == 2.0


def test_v2_the_tightest_ancestor_wins_and_max_means_none(tmp_path):
    # the leaf says "max" (no limit of its own); its parent allows 150000/100000 = 1.5 CPUs
    write(tmp_path / "proc_cgroup", "0::/job/ci\n")
    write(tmp_path / "cg/job/ci/cpu.max", "max 100000\n")
    write(tmp_path / "cg/job/cpu.max", "150000 100000\n")
    assert cgroup_cpu_limit(tmp_path / "proc_cgroup", tmp_path / "cg") == 1.5


def test_v2_namespaced_root_file(tmp_path):
    # inside a cgroup namespace the process sees "0::/" and its limit in the root's cpu.max
    write(tmp_path / "proc_cgroup", "0::/\n")
    write(tmp_path / "cg/cpu.max", "400000 100000\n")
    assert cgroup_cpu_limit(tmp_path / "proc_cgroup", tmp_path / "cg") == 4.0


def test_v1_cfs_quota(tmp_path):
    # cfs_quota_us 300000 / cfs_period_us 100000 = 3 CPUs; -1 (none) on the root
    write(tmp_path / "proc_cgroup", "4:memory:/x\n2:cpu,cpuacct:/docker/abc\n")
    base = tmp_path / "cg/cpu,cpuacct"
    write(base / "cpu.cfs_quota_us", "-1\n")
    write(base / "cpu.cfs_period_us", "100000\n")
    write(base / "docker/abc/cpu.cfs_quota_us", "300000\n")
    write(base / "docker/abc/cpu.cfs_period_us", "100000\n")
    assert cgroup_cpu_limit(tmp_path / "proc_cgroup", tmp_path / "cg") == 3.0


def test_no_limit_anywhere(tmp_path):
    write(tmp_path / "proc_cgroup", "1:cpu:/\n0::/\n")
    write(tmp_path / "cg/cpu/cpu.cfs_quota_us", "-1\n")
    write(tmp_path / "cg/cpu/cpu.cfs_period_us", "100000\n")
    assert cgroup_cpu_limit(tmp_path / "proc_cgroup", tmp_path / "cg") is None
    assert cgroup_cpu_limit(tmp_path / "missing", tmp_path / "cg") is None


def test_usable_cores_cuts_the_mask_to_the_quota():
    # 64 ids in the mask, a 2-CPU quota: the first 2; 1.5 CPUs: 1 (never oversubscribe); none: all
    mask = set(range(64))
    assert usable_cores(mask, 2.0) == [0, 1]
    assert usable_cores(mask, 1.5) == [0]
    assert usable_cores(mask, 0.2) == [0]
    assert usable_cores({3, 1}, None) == [1, 3]
    assert usable_cores({5}, 8.0) == [5]
