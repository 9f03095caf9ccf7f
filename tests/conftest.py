"""Shared fixtures: a small tiny model built once per session, and a local Ray cluster."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

from launch.bootstrap import ModelConfig, ensure_model
from launch.tiny_model import TinyConfig
from tests.helpers import remove_orphan_shm

ROOT = Path(__file__).resolve().parents[1]

# Rollout/learner tests need a model that emits EOS and mixes right and wrong answers, not a
# good one: 0.86M parameters, 150 warm-start steps (~10 s).
FAST_TINY = TinyConfig(
    hidden_size=128,
    num_layers=4,
    num_heads=4,
    intermediate_size=384,
    sft_steps=150,
    sft_batch_size=128,
    sft_lr=3e-3,
    sft_levels=[0, 1, 2],
    seed=0,
)


def fast_tiny_overrides(tiny_model_dir: str) -> list[str]:
    """Hydra overrides that select the session's FAST_TINY model (built by the ``tiny_model_dir``
    fixture, so a run finds it in the cache) and the easy task level it handles (L1)."""
    default = TinyConfig()
    tiny = [
        f"model.tiny.{f.name}={getattr(FAST_TINY, f.name)}"
        for f in dataclasses.fields(TinyConfig)
        if getattr(FAST_TINY, f.name) != getattr(default, f.name)
    ]
    cache = os.path.dirname(tiny_model_dir)
    return [f"model.cache_dir={cache}", *tiny, "task.difficulty=1", "task.num_test=32"]


def pytest_report_header(config) -> str:
    """The cores and memory the runs get, in the CI log's header (launch/cluster.py)."""
    from launch.cluster import cgroup_cpu_limit, usable_cores
    from learner.policy import available_ram_bytes

    mask, limit = os.sched_getaffinity(0), cgroup_cpu_limit()
    used = len(usable_cores(mask, limit))
    return (
        f"cores: {len(mask)} in the affinity mask, cgroup CPU limit {limit}, {used} used per "
        f"phase; MemAvailable {available_ram_bytes() / 2**30:.1f} GiB"
    )


RAY_DIRS = ("tests/e2e/", "tests/integration/")


def pytest_collection_modifyitems(config, items):
    """Tests marked ``gpu`` need CUDA: skipped (with the reason) where there is none. Tests that
    start Ray (the ``ray_cluster`` fixture, end-to-end and integration tests) get the ``ray``
    marker: ``make test-fast`` deselects them."""
    import torch

    skip = None if torch.cuda.is_available() else pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if skip is not None and item.get_closest_marker("gpu") is not None:  # not a word in the id
            item.add_marker(skip)
        where = Path(str(item.fspath)).resolve().relative_to(ROOT).as_posix()
        if "ray_cluster" in getattr(item, "fixturenames", ()) or where.startswith(RAY_DIRS):
            item.add_marker(pytest.mark.ray)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> str:
    cache = tmp_path_factory.mktemp("model_cache")
    return ensure_model(
        ModelConfig(source="tiny", cache_dir=str(cache), tiny=FAST_TINY), log=lambda *_: None
    )


@pytest.fixture(scope="session")
def ray_cluster():
    import ray

    ray.init(
        num_cpus=4,
        include_dashboard=False,
        log_to_driver=False,
        runtime_env={"env_vars": {"TOKENIZERS_PARALLELISM": "false"}},
    )
    yield
    ray.shutdown()
    remove_orphan_shm()  # not the buffers of a run still going
