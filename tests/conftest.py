"""Shared fixtures: a small tiny model built once per pytest run, and a local Ray cluster."""

from __future__ import annotations

import atexit
import functools
import os
import shutil
import tempfile
from pathlib import Path

import pytest

# OpenMP threads that wait at a barrier sleep instead of spinning (set before anything loads
# torch; every run, actor and build the tests start inherits it). The suite runs two test
# workers on 2 cores, so torch processes share cores: a spinning thread burns the time slice
# the thread it waits for needs. Two 40-step tiny-model builds at once took 102 s spinning,
# 54 s sleeping, against 32 s for one alone either way (measured). Results do not change.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# Ray's dashboard agent samples every worker's process stats every 5 s for metrics no test
# reads: once a minute instead (the test run's Ray and the runs' own inherit it). An idle Ray's
# daemons went from 2.6 to 1.8 core-s a minute (the agent 0.55 -> 0.28; measured here).
os.environ.setdefault("REPORTER_UPDATE_INTERVAL_MS", "60000")
# Ray's log monitor globs the logs folder on every 0.1 s poll while it holds fewer than 1,000
# files: with the threshold at 0 it globs every 0.5 s (LOG_NAME_UPDATE_INTERVAL_S; new actors'
# lines still come through). The autoscaler monitor has nothing to scale on one node: its loop
# every 60 s instead of 5 s. An idle Ray: log monitor 0.41 -> 0.21, monitor 0.11 -> 0.07
# core-s a minute (measured here, two minutes each).
os.environ.setdefault("RAY_LOG_MONITOR_MANY_FILES_THRESHOLD", "0")
os.environ.setdefault("AUTOSCALER_UPDATE_INTERVAL_S", "60")

from launch.models.bootstrap import ModelConfig, ensure_model  # noqa: E402
from launch.models.tiny_model import FAST_TINY, tiny_overrides  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
# the datasets library's cache (local task files are converted into it): the test run's own,
# not the home folder's (set before anything imports datasets; runs started by tests inherit it)
# (made by the process that finds it unset, pytest's main one, and removed when that one exits)
if "HF_DATASETS_CACHE" not in os.environ:
    os.environ["HF_DATASETS_CACHE"] = tempfile.mkdtemp(prefix="avspo-test-datasets-")
    atexit.register(shutil.rmtree, os.environ["HF_DATASETS_CACHE"], ignore_errors=True)


# Rollout/learner tests use FAST_TINY (launch/models/tiny_model.py), a small model that ships with
# the project (launch/assets/tiny-fast): it emits EOS and mixes right and wrong answers.
def fast_tiny_model(tiny_model_dir: str) -> list[str]:
    """Hydra overrides that select FAST_TINY alone, for a run on another task (a dataset task
    never reads the arithmetic level: launch/unread_keys.py refuses it)."""
    return tiny_overrides(FAST_TINY)


def fast_tiny_overrides(tiny_model_dir: str) -> list[str]:
    """Hydra overrides that select FAST_TINY (the shipped model the ``tiny_model_dir`` fixture
    resolves) and the easy task level it handles (L1)."""
    return [*tiny_overrides(FAST_TINY), "task.difficulty=1", "task.num_test=32"]


def pytest_report_header(config) -> str:
    """The cores and memory the runs get, in the CI log's header (launch/cores.py)."""
    from launch.cores import cgroup_cpu_limit, usable_cores
    from learner.policy import available_ram_bytes

    mask, limit = os.sched_getaffinity(0), cgroup_cpu_limit()
    used = len(usable_cores(mask, limit))
    return (
        f"cores: {len(mask)} in the affinity mask, cgroup CPU limit {limit}, {used} used per "
        f"phase; MemAvailable {available_ram_bytes() / 2**30:.1f} GiB"
    )


RAY_DIRS = ("tests/e2e/", "tests/integration/")
# "gw0", "gw1", ... in a pytest-xdist worker (``make test``: two workers, whole files each)
XDIST_WORKER = os.environ.get("PYTEST_XDIST_WORKER")


def pytest_collection_modifyitems(config, items):
    """Tests marked ``gpu`` need CUDA: skipped (with the reason) where there is none. Tests that
    start Ray (the ``ray_cluster`` fixture, end-to-end and integration tests) get the ``ray``
    marker: ``make test-fast`` deselects them.

    Under pytest-xdist (``make test``: ``--dist loadfile --no-loadscope-reorder`` hands whole
    files to the workers in this order) the longest come first: the end-to-end files, then the
    other Ray tests, so that the short files even out the two workers at the end."""
    import torch

    skip = None if torch.cuda.is_available() else pytest.mark.skip(reason="needs a CUDA GPU")
    order = {}  # item -> its place under pytest-xdist: end-to-end, Ray, the rest
    for item in items:
        if skip is not None and item.get_closest_marker("gpu") is not None:  # not a word in the id
            item.add_marker(skip)
        where = Path(str(item.fspath)).resolve().relative_to(ROOT).as_posix()
        ray = "ray_cluster" in getattr(item, "fixturenames", ()) or where.startswith(RAY_DIRS)
        if ray:
            item.add_marker(pytest.mark.ray)
        # the modules whose groups share actor processes (tests/actor_pool.py) one after
        # another: the pool is drained where they end
        order[item] = (not where.startswith("tests/e2e/"), not ray, not uses_actor_pool(item))
    if XDIST_WORKER is not None:
        items.sort(key=order.__getitem__)


def pytest_sessionfinish(session, exitstatus):
    """Runs of ``tests/e2e/runs.py start_train`` still going when the pytest run ends (Ctrl-C,
    ``-x``) are killed with their process groups. (The datasets cache goes when the process
    that made it exits, pytest's main one: a worker that finished first removed it while the
    other still used it.)"""
    import signal

    from tests.e2e.runs import STARTED

    for proc in STARTED:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.fixture(scope="session")
def tiny_model_dir() -> str:
    """FAST_TINY's folder: the shipped one (launch/assets/tiny-fast), its id checked at load."""
    return ensure_model(ModelConfig(source="tiny", tiny=FAST_TINY), log=lambda *_: None)


@pytest.fixture(scope="session")
def smollm2_cache(tmp_path_factory) -> str:
    """The model cache holding SmolLM2-135M-Instruct, converted offline once per pytest run
    (~40 s, 538 MB) and shared by the pytest-xdist workers like :func:`tiny_model_dir`'s: the
    conversion test and the smollm2_cpu run use one folder instead of converting twice."""
    base = tmp_path_factory.getbasetemp()
    cache = (base.parent if XDIST_WORKER else base) / "model_cache"
    ensure_model(ModelConfig(source="smollm2", cache_dir=str(cache)), log=lambda *_: None)
    return str(cache)


@pytest.fixture(scope="session")
def ray_cluster() -> str:
    """One local Ray per test process (8 logical CPUs: room for a joined run's groups beside
    what a test holds); yields its address. The tests' own actors run in it, and so do the
    end-to-end runs that join it (:func:`joined_ray`)."""
    import ray

    from launch.cluster import NO_PRESTART

    # No prestarted workers: each would idle at ~0.65 core-s a minute for the whole test run
    # (measured here; the tests' actors get processes of their own, and the runs that join
    # are other jobs, which cannot use this driver's workers).
    ray.init(
        address="local",  # its own, even while a test's `ray start --head` runs beside it
        num_cpus=8,
        include_dashboard=False,
        log_to_driver=False,
        runtime_env={"env_vars": {"TOKENIZERS_PARALLELISM": "false"}},
        _system_config=NO_PRESTART,
    )
    yield ray.get_runtime_context().gcs_address
    ray.shutdown()


@pytest.fixture(scope="session")
def joined_ray(ray_cluster) -> list[str]:
    """Overrides that make a ``launch.train`` run join the test run's Ray instead of starting
    its own (as a run on a cluster does, ``cluster.address``): ~14 of a short run's ~49
    core-seconds are Ray's own start and stop (docs/NOTES.md). For runs that test nothing of
    Ray's start, its stop or what is left after them; the thread plan is the same either way
    (launch/cluster.py ``node_cores``), so are the numbers."""
    return [f"cluster.address={ray_cluster}"]


def uses_actor_pool(item) -> bool:
    """Whether ``item``'s module starts learner or rollout groups (its code names them)."""
    return _names_a_group(str(item.fspath))


@functools.cache
def _names_a_group(path: str) -> bool:
    if not path.endswith(".py"):
        return False
    text = Path(path).read_text()
    return "LearnerGroup" in text or "RolloutGroup" in text


@pytest.fixture(autouse=True, scope="session")
def _actor_pool():
    """Learner and rollout groups reuse their actors' processes (tests/actor_pool.py), from
    module to module while the modules that start them follow each other (they are collected
    together)."""
    from tests import actor_pool

    patch = pytest.MonkeyPatch()
    actor_pool.install(patch)
    yield
    patch.undo()
    actor_pool.POOL.drain()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item, nextitem):
    """After the last test of the modules that start learner or rollout groups (its fixtures
    torn down):
    the pool's idle actors are killed, not left holding memory and Ray's CPUs (an idle actor
    costs ~0.65 core-s a minute). pytest-xdist runs a test once it knows the next one."""
    yield
    import sys

    pool = sys.modules.get("tests.actor_pool")
    if pool is not None and (nextitem is None or not uses_actor_pool(nextitem)):
        pool.POOL.drain()
