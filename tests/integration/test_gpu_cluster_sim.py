"""The GPU presets' placement on a simulated multi-node Ray cluster (no GPU needed).

``ray.cluster_utils.Cluster`` starts several Ray nodes on this machine, each declaring 8 GPUs
that do not exist. Each preset's placement groups are reserved as a run reserves them
(launch/cluster.py ``reserve``) and tiny probe actors start where the rollout workers and
learner ranks would (``spawn_actor_group`` with the run's bundles and resources). Ray gives each
probe GPU ids from the declared ones and sets ``CUDA_VISIBLE_DEVICES`` from them, as it does on
real GPUs. The simulation runs in a subprocess (its own Ray; the test process may hold the
suite's Ray: tests/conftest.py ``ray_cluster``) and prints JSON the tests assert on.

What the device code reads: a learner rank computes on ``cuda`` with ``LOCAL_RANK=0``
(learner/rank.py), i.e. the first device ``CUDA_VISIBLE_DEVICES`` shows it; a vLLM engine with
tensor parallel size ``tp`` uses the first ``tp`` devices it sees (its mp executor,
rollout/vllm_engine.py). So each probe's ``CUDA_VISIBLE_DEVICES`` must list exactly the GPU ids
Ray assigned it, as many as it reserved.
"""

from __future__ import annotations

import functools
import ipaddress
import json
import math
import os
import subprocess
import sys

import pytest

from tests.helpers import ROOT, load

GPUS_PER_NODE = 8
CPUS_PER_NODE = 72  # logical: the largest preset stage on one node is 8 x 8 CPUs + the verifier


class Probe:
    """Where a rollout worker or learner rank would run: its node, Ray's GPU ids for it and
    the ``CUDA_VISIBLE_DEVICES`` its process sees. Imports nothing heavy."""

    def where(self) -> dict:
        import ray

        return {
            "node": ray.get_runtime_context().get_node_id(),
            "gpu_ids": [str(g) for g in ray.get_gpu_ids()],
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        }

    def rendezvous(self) -> tuple[str, int]:
        """What learner rank 0 answers when asked for a rendezvous address: the production
        method (learner/rank.py ``LearnerRank.address``) run on this probe."""
        from learner.rank import LearnerRank

        self._listeners = {}
        return LearnerRank.address(self)


def simulate(cfg) -> dict:
    """Reserve the preset's groups as a run does, start a probe per rollout worker and learner
    rank; their places, and learner rank 0's rendezvous address. Frees everything after."""
    import ray

    from comm.actors import spawn_actor_group
    from launch.cluster import actor_resources, reserve

    placement = reserve(cfg)
    alive = [n for n in ray.nodes() if n["Alive"]]
    out: dict = {"node_ips": {n["NodeID"]: n["NodeManagerAddress"] for n in alive}}
    probes = []
    try:
        for stage, count in (
            ("rollout", cfg.rollout.num_workers),
            ("learner", cfg.learner.num_ranks),
        ):
            cpus, gpus = actor_resources(cfg, stage)
            actors = [
                spawn_actor_group(
                    Probe, 1, num_cpus=cpus, num_gpus=gpus, placement=placement[stage],
                    first_bundle=i,
                )[0]
                for i in range(count)
            ]  # fmt: skip
            probes += actors
            out[stage] = ray.get([a.where.remote() for a in actors], timeout=120)
            out[f"{stage}_gpus"] = gpus
            if stage == "learner":
                out["rendezvous"] = ray.get(actors[0].rendezvous.remote(), timeout=120)
        return out
    finally:
        for actor in probes:
            ray.kill(actor)
        for p in {id(p): p for p in placement.values() if p is not None}.values():
            ray.util.remove_placement_group(p.group)


PRESETS = {
    # preset: (overrides, nodes the cluster has when it runs)
    "gpu_node": (["cluster=gpu_node", "cluster.listen=node"], 2),
    "gpu_node_split": (["cluster=gpu_node_split", "cluster.listen=node"], 2),
    # 8 engines x 2 GPUs + 8 ranks x 1 GPU = 24 GPUs: three 8-GPU nodes (two hold only 16)
    "multi_node": (["cluster=multi_node", "cluster.listen=node"], 3),
}


def main() -> None:
    """Every preset on one simulated cluster (started once, grown to the nodes each needs);
    prints ``{preset: simulate(...)}`` as JSON."""
    import ray
    from ray.cluster_utils import Cluster

    from launch.cluster import NO_PRESTART, _listen

    configs = {name: load(*overrides) for name, (overrides, _) in PRESETS.items()}
    (listen,) = {cfg.cluster.listen for cfg in configs.values()}
    _listen(listen)  # as init_ray does before a local Ray starts
    node = {"num_cpus": CPUS_PER_NODE, "num_gpus": GPUS_PER_NODE, "object_store_memory": 80 << 20}
    cluster = Cluster(
        initialize_head=True,
        head_node_args={**node, "include_dashboard": False, "_system_config": NO_PRESTART},
    )
    results = {}
    try:
        ray.init(address=cluster.address, log_to_driver=False)
        for name, (_, nodes) in PRESETS.items():
            while len(cluster.list_all_nodes()) < nodes:
                cluster.add_node(**node)
            cluster.wait_for_nodes()
            results[name] = simulate(configs[name])
    finally:
        ray.shutdown()
        cluster.shutdown()
    print(json.dumps(results))


@functools.cache
def simulated() -> dict:
    """The simulation, run once in a subprocess (its own Ray, a clean environment: on a GPU
    machine the real devices' ``CUDA_VISIBLE_DEVICES`` would limit the declared ones)."""
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "CUDA_VISIBLE_DEVICES")}
    env["PYTHONPATH"] = str(ROOT)
    proc = subprocess.run(
        [sys.executable, "-m", "tests.integration.test_gpu_cluster_sim"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    # Ray's raylets print warnings to this stdout too: the JSON is the last line that is one
    return json.loads([line for line in proc.stdout.splitlines() if line.startswith("{")][-1])


def places(preset: str, stage: str) -> list[tuple[str, str]]:
    """``(node, GPU id)`` of every GPU each actor of ``stage`` holds, actor by actor."""
    return [(p["node"], g) for p in simulated()[preset][stage] for g in p["gpu_ids"]]


def nodes_of(preset: str, stage: str) -> list[str]:
    return [p["node"] for p in simulated()[preset][stage]]


@pytest.mark.slow
@pytest.mark.parametrize("preset", PRESETS)
def test_each_actor_sees_exactly_the_gpus_ray_gave_it(preset):
    """A learner rank computes on the first device it sees (``LOCAL_RANK=0``), an engine on
    the first ``tensor_parallel_size``: ``CUDA_VISIBLE_DEVICES`` must be Ray's ids for it, as
    many as it reserved (a colocated half GPU is one device)."""
    cfg = load(*PRESETS[preset][0])
    got = simulated()[preset]
    wanted = {"rollout": cfg.rollout.tensor_parallel_size, "learner": 1}
    for stage, count in wanted.items():
        for probe in got[stage]:
            assert probe["cuda_visible_devices"] == ",".join(probe["gpu_ids"]), (stage, probe)
            assert len(probe["gpu_ids"]) == count == math.ceil(got[f"{stage}_gpus"]), probe


@pytest.mark.slow
@pytest.mark.parametrize("preset", PRESETS)
def test_each_learner_rank_gets_its_own_gpu(preset):
    learner = places(preset, "learner")
    assert len(set(learner)) == len(learner) == load(*PRESETS[preset][0]).learner.num_ranks


@pytest.mark.slow
def test_colocated_worker_and_rank_share_one_gpu_on_one_node():
    """gpu_node: engine i and rank i share GPU i of bundle i (they take turns), all 8 on one
    node (STRICT_PACK)."""
    rollout, learner = places("gpu_node", "rollout"), places("gpu_node", "learner")
    assert rollout == learner
    assert len({node for node, _ in learner}) == 1
    assert sorted(int(gpu) for _, gpu in learner) == list(range(GPUS_PER_NODE))


@pytest.mark.slow
@pytest.mark.parametrize("preset", ["gpu_node_split", "multi_node"])
def test_split_layouts_give_engines_and_ranks_different_gpus(preset):
    rollout, learner = places(preset, "rollout"), places(preset, "learner")
    assert len(set(rollout)) == len(rollout)  # no GPU shared by two engines
    assert not set(rollout) & set(learner)


@pytest.mark.slow
def test_split_node_packs_each_stage_on_one_node():
    """gpu_node_split: STRICT_PACK holds the 4 engines on one node and the 4 ranks on one node
    (each placement group is packed on its own: on a cluster of several nodes the engines and
    the ranks may land on two different nodes, as one simulation here did)."""
    assert len(set(nodes_of("gpu_node_split", "rollout"))) == 1
    assert len(set(nodes_of("gpu_node_split", "learner"))) == 1


@pytest.mark.slow
def test_tensor_parallel_engines_stay_within_one_node():
    """multi_node: each engine's 2 GPUs are one bundle's, so one node's: its process (and vLLM's
    TP workers, started beside it) sees both; 8 engines x 2 GPUs over the nodes."""
    got = simulated()["multi_node"]
    assert all(len(p["gpu_ids"]) == 2 for p in got["rollout"])
    assert len(set(places("multi_node", "rollout"))) == 8 * 2  # 8 engines x TP 2, none shared


@pytest.mark.slow
def test_multi_node_packs_learner_ranks_on_the_fewest_nodes_in_rank_order():
    """multi_node: ZeRO-3 gathers and reduces every layer across the learner ranks, so they
    sit on as few nodes as their GPUs fill (8 ranks x 1 GPU: one 8-GPU node), each node's ranks
    consecutive (NVLink inside a node, one hop between). SPREAD scattered them over all three
    nodes, interleaved (ranks 0, 3, 4, 7 on one node): ZeRO-3 over the network for nothing."""
    nodes = nodes_of("multi_node", "learner")
    assert len(set(nodes)) == math.ceil(len(nodes) / GPUS_PER_NODE)
    assert [n for i, n in enumerate(nodes) if i == 0 or nodes[i - 1] != n] == list(
        dict.fromkeys(nodes)
    )  # a node's ranks form one run
    assert len(set(nodes_of("multi_node", "rollout"))) == 2  # 8 engines x 2 GPUs fill two


@pytest.mark.slow
@pytest.mark.parametrize("preset", PRESETS)
def test_rendezvous_is_the_node_address_with_listen_node(preset):
    """cluster.listen=node: learner rank 0 offers its node's address (what ranks and engines on
    other nodes can reach), not loopback. (The simulated nodes share this machine's address:
    that it is rank 0's node's is checked, not that it differs from the others'.)"""
    got = simulated()[preset]
    host, port = got["rendezvous"]
    assert host == got["node_ips"][got["learner"][0]["node"]]
    assert not ipaddress.ip_address(host).is_loopback and port > 0


if __name__ == "__main__":
    main()
