"""Placement groups on a real local Ray: each stage's bundles are reserved before its actors
start, actors land in their stage's group, and an impossible reservation fails fast naming the
stage."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import pytest
import ray

from comm.actors import spawn_actor_group
from launch.cluster import actor_resources, reserve, resolve_address, stage_bundles
from launch.config import TrainConfig
from launch.validation import ConfigError
from tests.helpers import ROOT


def _small() -> TrainConfig:
    cfg = TrainConfig()
    cfg.rollout.num_workers, cfg.rollout.num_cpus_per_worker = 2, 0.25
    cfg.learner.num_ranks, cfg.learner.num_cpus_per_rank = 2, 0.25
    cfg.cluster.ready_timeout_s = 60
    cfg.cluster.colocate = False  # a group per stage (the colocated layout: test below)
    return cfg


def test_stage_bundles_follow_the_config():
    cfg = _small()
    cfg.learner.num_gpus_per_rank = 1
    b = stage_bundles(cfg)
    assert b["rollout"] == [{"CPU": 0.25}, {"CPU": 0.25}]
    assert b["verifier"] == [{"CPU": 1.0}]
    assert b["learner"] == [{"CPU": 0.25, "GPU": 1}, {"CPU": 0.25, "GPU": 1}]


def test_address_comes_from_config_then_environment(monkeypatch):
    cfg = TrainConfig()
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert resolve_address(cfg) is None
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    assert resolve_address(cfg) == "10.0.0.1:6379"
    cfg.cluster.address = "head:6379"
    assert resolve_address(cfg) == "head:6379"


class Where:
    def group(self) -> str | None:
        pg = ray.util.get_current_placement_group()
        return None if pg is None else pg.id.hex()

    def bundle(self) -> int:
        return ray.get_runtime_context().get_placement_group_bundle_index()  # hypothetical API


@pytest.mark.slow
def test_actors_start_inside_their_stage_group(ray_cluster):
    placement = reserve(_small())
    try:
        actors = spawn_actor_group(Where, 2, num_cpus=0.25, placement=placement["rollout"])
        groups = ray.get([a.group.remote() for a in actors], timeout=60)
        assert groups == [placement["rollout"].group.id.hex()] * 2
        learner = spawn_actor_group(
            Where, 1, num_cpus=0.25, placement=placement["learner"], first_bundle=1
        )[0]
        assert ray.get(learner.group.remote(), timeout=60) == placement["learner"].group.id.hex()
        for a in [*actors, learner]:
            ray.kill(a)
    finally:
        for p in placement.values():
            ray.util.remove_placement_group(p.group)


def test_a_reservation_no_node_can_hold_fails_at_once_in_one_line(ray_cluster):
    """Issue 63: GPUs the cluster does not have are refused before any wait (not after
    ``cluster.ready_timeout_s``), in one line naming the ask, the cluster and the settings."""
    import time

    cfg = _small()
    cfg.learner.num_gpus_per_rank = 1  # the test cluster has no GPU
    cfg.cluster.ready_timeout_s = 300
    before = len(ray.util.placement_group_table())
    t0 = time.monotonic()
    with pytest.raises(ConfigError) as err:
        reserve(cfg)
    assert time.monotonic() - t0 < 10
    assert str(err.value).startswith(
        "cluster: GPU: the run asks for 2 (learner 2 x 1), the cluster has 0 (1 node); change "
    )
    assert "\n" not in str(err.value) and "cluster.wait_for_nodes=true" in str(err.value)
    assert len(ray.util.placement_group_table()) == before  # nothing was reserved


@pytest.mark.slow
def test_a_busy_cluster_is_waited_for_then_named(ray_cluster):
    """CPUs that exist but another job holds: waited for (``ready_timeout_s``), then named."""
    from ray.util.placement_group import placement_group

    cfg = _small()
    cfg.cluster.ready_timeout_s = 2
    hold = placement_group([{"CPU": ray.cluster_resources()["CPU"]}])  # every CPU, once free
    ray.get(hold.ready(), timeout=60)
    before = len(ray.util.placement_group_table())
    try:
        with pytest.raises(RuntimeError, match=r"could not reserve rollout .*within 2 s"):
            reserve(cfg)
    finally:
        ray.util.remove_placement_group(hold)
    table = ray.util.placement_group_table()
    assert all(v["state"] == "REMOVED" for v in list(table.values())[before:])


@pytest.mark.slow
def test_more_cpus_than_the_cluster_has_are_scaled_into_it(ray_cluster):
    """CPU asks beyond the cluster's CPUs shrink by one factor (the actors time-share the
    cores, as in a Ray the run starts); the actors ask for their share of the scaled bundle."""
    cfg = _small()
    cfg.learner.num_cpus_per_rank = 7.75  # asks: 2 x 0.25 + 1 + 2 x 7.75 = 17 on 8 CPUs
    placement = reserve(cfg, log=lambda line: None)
    try:
        scale = 8 / 17
        assert placement["learner"].cpu_scale == pytest.approx(scale)
        # 7.75 x 8/17 = 3.647..., rounded down to Ray's 1e-4: 3.647
        assert actor_resources(cfg, "learner", placement["learner"]) == (3.647, 0.0)
        where = spawn_actor_group(Where, 1, num_cpus=3.647, placement=placement["learner"])[0]
        assert ray.get(where.group.remote(), timeout=60) == placement["learner"].group.id.hex()
        ray.kill(where)
    finally:
        for p in placement.values():
            ray.util.remove_placement_group(p.group)


def test_placement_groups_can_be_turned_off():
    cfg = _small()
    cfg.cluster.placement_groups = False
    assert reserve(cfg) == {"rollout": None, "verifier": None, "learner": None}
    # evaluation reserves no learner
    assert reserve(cfg, ("rollout", "verifier")) == {"rollout": None, "verifier": None}


class _Member:
    def block(self, seconds: float) -> str:
        import time

        time.sleep(seconds)  # like a live DeepSpeed rank waiting in a collective for a dead peer
        return "done"

    def die(self) -> None:
        import os

        os._exit(1)

    def die_once(self, marker: str) -> None:
        """Exits once ``marker`` exists (its peer has failed by then)."""
        import os
        import time

        while not os.path.exists(marker):
            time.sleep(0.05)
        os._exit(1)

    def fail(self, marker: str) -> None:
        """Fails as a live DeepSpeed rank's collective does when its peer dies."""
        open(marker, "w").close()
        raise RuntimeError("Connection closed by peer")


@pytest.mark.slow
def test_get_stops_at_the_first_death_not_at_the_slowest_call(ray_cluster):
    """One call blocks for 120 s, its peer's actor dies: ``get`` raises the death at once (well
    before the 120 s, which is also below its own 300 s limit), naming what failed. (ray.get
    aborts on the first failed object; the learner relies on it: when one DeepSpeed rank dies,
    the live ones block in a collective until their own timeout.)"""
    import time

    from comm.actors import ActorGroupError, get

    slow, doomed = spawn_actor_group(_Member, 2, num_cpus=0.25)
    t0 = time.monotonic()
    with pytest.raises(ActorGroupError, match="training step: an actor died"):
        get([slow.block.remote(120), doomed.die.remote()], timeout_s=300, what="training step")
    assert time.monotonic() - t0 < 60
    ray.kill(slow)


@pytest.mark.slow
def test_a_peers_failure_reported_before_the_death_still_names_the_death(ray_cluster, tmp_path):
    """The fault test's rank kill, in small: the live member's call fails first (its collective
    lost the peer), the dead member's death is reported after. ``get`` names the death (what the
    emergency note then says), not only the symptom; a failure without a death stays itself."""
    from comm.actors import ActorGroupError, get

    live, doomed = spawn_actor_group(_Member, 2, num_cpus=0.25)
    marker = str(tmp_path / "failed")
    calls = [live.fail.remote(marker), doomed.die_once.remote(marker)]  # the failure listed first
    died = "(?s)update: an actor died .*RuntimeError: Connection closed by peer"
    with pytest.raises(ActorGroupError, match=died):
        get(calls, timeout_s=120, what="update")
    ray.kill(live)
    other, peer = spawn_actor_group(_Member, 2, num_cpus=0.25)
    with pytest.raises(ray.exceptions.RayTaskError, match="Connection closed by peer"):
        get([other.fail.remote(marker), peer.block.remote(0)], timeout_s=120, what="update")
    for actor in (other, peer):
        ray.kill(actor)


def test_colocated_stages_share_one_group_and_split_the_node_by_phase(ray_cluster):
    """Worker i and rank i land in bundle i of one group; the phase that runs gets the node's
    cores: 1 engine -> all of them, 2 ranks -> half each."""
    import os

    from launch.cluster import plan_threads

    cfg = _small()
    cfg.cluster.colocate = True
    cfg.rollout.num_workers = 1
    placement = reserve(cfg)
    try:
        assert placement["rollout"] is placement["learner"]
        assert set(placement) == {"rollout", "learner", "verifier"}
        threads = plan_threads(cfg, placement)
        cores = sorted(os.sched_getaffinity(0))
        assert threads.rollout == [len(cores)] and threads.rollout_cpus == [cores]
        assert threads.learner == [max(1, len(cores) // 2)] * 2
        actor = spawn_actor_group(Where, 1, num_cpus=0.1, placement=placement["learner"])[0]
        assert ray.get(actor.group.remote(), timeout=60) == placement["rollout"].group.id.hex()
        ray.kill(actor)
    finally:
        for group in {id(p.group): p.group for p in placement.values()}.values():
            ray.util.remove_placement_group(group)


def test_a_joined_cluster_plans_the_drivers_node_like_a_local_one(ray_cluster):
    """A run that joins a cluster (``cluster.address``; the end-to-end tests join a shared head)
    computes on its own node with the cores the OS gives it, as a local run does, not with the
    head's logical CPU count (8 here, a scheduling fiction on this 2-core machine): the same
    thread plan, hence the same numbers. Its other nodes are read from Ray's count."""
    from launch.cluster import node_cores, plan_threads, usable_cores

    cfg = _small()
    cfg.cluster.colocate = True
    cfg.rollout.num_workers = 1
    placement = reserve(cfg)
    try:
        local = plan_threads(cfg, placement)
        cfg.cluster.address = ray.get_runtime_context().gcs_address
        assert plan_threads(cfg, placement) == local
        import os

        from launch.cluster import cgroup_cpu_limit

        here = usable_cores(os.sched_getaffinity(0), cgroup_cpu_limit())
        # the fixture's head has 8 logical CPUs: the node keeps at most that many of its cores
        assert node_cores(local=False) == {ray.get_runtime_context().get_node_id(): here[:8]}
    finally:
        for group in {id(p.group): p.group for p in placement.values()}.values():
            ray.util.remove_placement_group(group)


LOCAL_RAY_PRINTS = (
    "import os, stat\n"
    "print('problem:', beyond_loopback(ray_addresses()))\n"
    "print('gcs:', ray.get_runtime_context().gcs_address)\n"
    "node = ray._private.worker._global_node\n"
    "temp = node.get_temp_dir_path()\n"
    "parent = os.path.dirname(temp)\n"
    "print('temp:', temp)\n"
    "print('parent mode:', oct(stat.S_IMODE(os.lstat(parent).st_mode)))\n"
    "print('owner:', os.lstat(parent).st_uid == os.getuid())\n"
    "sockets = node.get_sockets_dir_path()\n"
    "print('longest socket:', max(len(os.path.join(sockets, s).encode())"
    " for s in os.listdir(sockets)))\n"
)
"""What the child of :func:`local_ray` prints of its Ray: the loopback check's finding, its GCS
address, its temp dir, that dir's parent's mode and owner, its longest socket path."""


@pytest.fixture(scope="module")
def local_ray():
    """A local Ray as a run starts it (``init_ray``, the default ``cluster.listen=loopback``) in
    a child process whose temp folder ($TMPDIR) is a folder of the test's (short: Ray's socket
    paths have a limit), holding another cluster's address file, faked
    (<temp>/ray/ray_current_cluster naming 127.0.0.1:1, where nobody listens). The three tests
    below read this one child (they each started the same Ray before): its temp folder after
    it exited, the faked file, and what it printed (:data:`LOCAL_RAY_PRINTS`), by name."""
    import shutil
    import tempfile

    temp = tempfile.mkdtemp(prefix="rt", dir="/tmp")
    try:
        fake = Path(temp, "ray", "ray_current_cluster")
        fake.parent.mkdir()
        fake.write_text("127.0.0.1:1")
        out = _init_ray_in_child(temp, LOCAL_RAY_PRINTS)
        got = dict(line.split(": ", 1) for line in out.stdout.splitlines() if ": " in line)
        yield SimpleNamespace(temp=temp, fake=fake, stdout=out.stdout, got=got)
    finally:
        shutil.rmtree(temp, ignore_errors=True)


@pytest.mark.slow
@pytest.mark.parametrize("listen", ["loopback", "node"])
def test_the_loopback_check_reads_what_ray_reports(listen, request):
    """``cluster.listen=loopback`` rests on a private Ray switch; after ``ray.init`` the run
    checks every address Ray reports (launch/cluster.py beyond_loopback) and refuses otherwise.
    A local Ray of each mode, in its own process (this one holds the tests' Ray): loopback (the
    default; :func:`local_ray`'s) reports nothing beyond 127.0.0.1; node reports the machine's
    address, which the check names (the same machine test_closed_and_multirun.py sees listening
    beyond loopback)."""
    import subprocess
    import sys

    if listen == "loopback":
        stdout = request.getfixturevalue("local_ray").stdout
        assert "problem: None" in stdout, stdout
        return
    code = (
        "from launch.cluster import init_ray, ray_addresses, beyond_loopback\n"
        "from tests.helpers import load\n"
        f"init_ray(load('learner.num_ranks=1', 'cluster.listen={listen}'))\n"
        "print('problem:', beyond_loopback(ray_addresses()))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "problem: Ray reports " in out.stdout, out.stdout


@pytest.mark.slow
def test_a_local_run_starts_its_own_ray_beside_another_clusters_address_file(local_ray):
    """With no address, ray.init joins the cluster named in <temp>/ray/ray_current_cluster (a
    `ray start` head or ray.cluster_utils writes it: tests/integration/test_gpu_cluster_sim.py
    does), and then refuses num_cpus ("When connecting to an existing cluster, num_cpus and
    num_gpus must not be provided"): every local run beside such a cluster failed. init_ray
    starts a Ray of its own (address="local"). The file is faked in a temp dir of its own
    (:func:`local_ray`)."""
    assert "gcs: " in local_ray.stdout and "127.0.0.1:1\n" not in local_ray.stdout
    assert local_ray.fake.read_text() == "127.0.0.1:1"  # its address file left as it was


def _init_ray_in_child(temp: str, then: str):
    """``init_ray`` (the default config, one learner rank) in a child process whose temp folder
    ($TMPDIR) is ``temp``, then ``then`` (Python, with ``ray`` and launch.cluster's
    ``ray_addresses`` and ``beyond_loopback`` imported); the finished process (it must exit 0)."""
    import subprocess
    import sys

    code = (
        "import ray\n"
        "from launch.cluster import beyond_loopback, init_ray, ray_addresses\n"
        "from tests.helpers import load\n"
        "init_ray(load('learner.num_ranks=1'))\n" + then
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env={**os.environ, "TMPDIR": temp, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return out


@pytest.mark.slow
def test_a_local_ray_keeps_its_files_in_a_private_folder_removed_at_exit(local_ray):
    """Ray makes every folder under its temp dir mode 0777 without the sticky bit (its
    try_to_create_directory): under a shared /tmp/ray any user could replace a session's logs,
    sockets or spilled objects. A local run starts Ray with a temp dir inside a new folder of
    mode 0700 of its own (launch/cluster.py init_ray), removed when the run exits. The temp
    folder Ray would use ($TMPDIR) is one of the test's (:func:`local_ray`), so that what is
    left there is seen: nothing but the other cluster's address file faked there."""
    got, temp = local_ray.got, local_ray.temp
    parent = os.path.dirname(got["temp"])
    assert os.path.dirname(parent) == temp, got  # in the temp folder Ray would have used
    assert os.path.basename(parent).startswith("avspo-ray-"), got  # a folder of the run's
    assert got["parent mode"] == "0o700" and got["owner"] == "True", got
    assert int(got["longest socket"]) <= 107, got  # AF_UNIX: 108 bytes with the final NUL
    # removed at exit, Ray's files and all: only the faked file is left, as it was
    left = sorted(p.relative_to(temp).as_posix() for p in Path(temp).rglob("*"))
    assert left == ["ray", "ray/ray_current_cluster"], left
    assert local_ray.fake.read_text() == "127.0.0.1:1"


def test_rays_private_temp_dir_stays_short_enough_for_its_socket_paths():
    """Ray refuses a Unix socket path over 107 bytes (ray._private.utils
    validate_socket_filepath); the run's temp dir sits in Ray's own temp folder unless that
    is too long for its session's sockets, then in /tmp."""
    import shutil
    import tempfile

    from launch.ray_dirs import SOCKET_PATH_MAX, SOCKET_TAIL, private_ray_temp_dir

    temp = tempfile.mkdtemp(prefix="rt", dir="/tmp")  # short (pytest's tmp_path is too long)
    fallback = None
    try:
        short = private_ray_temp_dir(os.path.join(temp, "s"))  # made if missing, as Ray would
        assert os.path.dirname(os.path.dirname(short)) == os.path.join(temp, "s")
        longer = os.path.join(temp, "x" * (SOCKET_PATH_MAX - SOCKET_TAIL))
        fallback = private_ray_temp_dir(longer)
        assert os.path.dirname(os.path.dirname(fallback)) == "/tmp"
        assert not os.path.exists(longer)
        for path in (short, fallback):
            assert len(path.encode()) + SOCKET_TAIL <= SOCKET_PATH_MAX
            parent = os.lstat(os.path.dirname(path))
            assert parent.st_mode & 0o777 == 0o700 and parent.st_uid == os.getuid()
            assert not os.path.exists(path)  # Ray makes it (mode 0777) inside
    finally:
        shutil.rmtree(temp, ignore_errors=True)
        if fallback is not None:
            os.rmdir(os.path.dirname(fallback))
