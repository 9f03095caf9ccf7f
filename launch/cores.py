"""The CPUs this process may compute on: its affinity mask cut to its cgroup's CPU quota (a
container given 2 CPUs of a big host still sees the host's cores in its affinity mask). Pure
reads of /proc and /sys; launch/cluster.py ``node_cores`` plans each node's threads with them."""

from __future__ import annotations

from pathlib import Path


def cgroup_cpu_limit(
    proc_cgroup: str | Path = "/proc/self/cgroup", root: str | Path = "/sys/fs/cgroup"
) -> float | None:
    """The CPUs this process's cgroup may use (its CFS quota / period, the tightest along the
    path to the root; cgroup v2 ``cpu.max`` or v1 ``cpu.cfs_quota_us``), None without a limit.
    A container given 2 CPUs of a big host still sees the host's cores in its affinity mask."""
    try:
        lines = Path(proc_cgroup).read_text().splitlines()
    except OSError:
        return None
    limits = []
    for line in lines:
        _, controllers, path = line.split(":", 2)
        parts = [p for p in path.split("/") if p]
        if controllers == "":  # v2: one unified tree
            bases, v2 = [Path(root), Path(root) / "unified"], True
        elif "cpu" in controllers.split(","):
            bases, v2 = list(dict.fromkeys([Path(root) / controllers, Path(root) / "cpu"])), False
        else:
            continue
        for base in bases:
            for depth in range(len(parts), -1, -1):
                limit = _cpu_limit_file(base.joinpath(*parts[:depth]), v2)
                if limit is not None:
                    limits.append(limit)
    return min(limits) if limits else None


def _cpu_limit_file(folder: Path, v2: bool) -> float | None:
    try:
        if v2:
            quota, period = (folder / "cpu.max").read_text().split()[:2]
        else:
            quota = (folder / "cpu.cfs_quota_us").read_text().strip()
            period = (folder / "cpu.cfs_period_us").read_text().strip()
        if quota in ("max", "-1"):
            return None
        return int(quota) / int(period)
    except (OSError, ValueError):
        return None


def usable_cores(mask: set[int], limit: float | None) -> list[int]:
    """The CPU ids of ``mask`` that threads may use: all of them, or the first ``limit`` (rounded
    down, at least one) when a cgroup quota allows fewer: more threads than the quota's CPUs
    stall every OpenMP region on throttling."""
    ids = sorted(mask)
    return ids if limit is None else ids[: max(1, int(limit))]
