"""Whether a run's reservation fits the Ray cluster it is about to use, before waiting for it.

On CPU a stage's logical CPUs are a scheduling fiction: the actors time-share the node's cores,
and their threads are planned from the real cores (launch/cluster.py ``plan_threads``). A Ray the
run starts declares enough of them (``init_ray``); a joined cluster declares what it was started
with (``ray start --head --num-cpus 2`` on a 2-core machine). So every CPU ask is scaled by one
factor until the run fits the cluster's CPUs, as it fits the local Ray it would have started:
the verifier's share is taken inside the node's budget. Every other resource (GPUs above all) is
what it says: a reservation the cluster's nodes can never hold is refused at once, in one line,
rather than waited for through ``cluster.ready_timeout_s`` (which is for resources that may
still come: a busy cluster's, or nodes an autoscaler adds with ``cluster.wait_for_nodes``).

Pure functions of the asks and the nodes' totals (``ray.nodes()``' ``Resources``).
"""

from __future__ import annotations

import math

Bundles = dict[str, list[dict[str, float]]]  # stage -> one resource dict per bundle
GRAIN = 1e-4  # Ray's resource granularity: a scaled ask is rounded down to it


def cpu_scale(asks: Bundles, nodes: list[dict[str, float]]) -> float:
    """The factor every CPU ask is multiplied by so that all of them fit the cluster's CPUs
    together (1.0 where they fit as asked).

    >>> asks = {"colocated": [{"CPU": 1.0}, {"CPU": 1.0}], "verifier": [{"CPU": 1.0}]}
    >>> cpu_scale(asks, [{"CPU": 2.0}])  # ray start --head --num-cpus 2: 3 asked, 2 there
    0.6666666666666666
    >>> cpu_scale(asks, [{"CPU": 5.0}])  # the local Ray the run starts: max(4, 3 + 2)
    1.0
    """
    need = sum(b.get("CPU", 0.0) for bundles in asks.values() for b in bundles)
    have = sum(n.get("CPU", 0.0) for n in nodes)
    return 1.0 if need <= have or need == 0 else have / need


def scaled(asks: Bundles, scale: float) -> Bundles:
    """``asks`` with every CPU multiplied by ``scale``, rounded down to Ray's granularity (so
    that the sum stays within the CPUs it was scaled to).

    >>> scaled({"verifier": [{"CPU": 1.0}], "learner": [{"CPU": 1.0, "GPU": 1.0}]}, 2 / 3)
    {'verifier': [{'CPU': 0.6666}], 'learner': [{'CPU': 0.6666, 'GPU': 1.0}]}
    """
    return {stage: [{**b, "CPU": scale_cpu(b["CPU"], scale)} if "CPU" in b else b
                    for b in bundles] for stage, bundles in asks.items()}  # fmt: skip


def scale_cpu(cpus: float, scale: float) -> float:
    """One CPU ask scaled (:func:`scaled`).

    >>> scale_cpu(1.0, 2 / 3), scale_cpu(0.5, 1.0)
    (0.6666, 0.5)
    """
    if scale == 1.0:
        return cpus
    return math.floor(cpus * scale / GRAIN + 1e-9) / round(1 / GRAIN)


def never_fits(asks: Bundles, nodes: list[dict[str, float]], strategy: str) -> str | None:
    """Why the cluster's nodes can never hold ``asks`` (one stage per placement group), in one
    sentence, or None: a resource asked for more than all nodes have together, a bundle bigger
    than every node, or (``STRICT_PACK``) a stage bigger than every node. Ray's own scheduler
    may still wait on fragmentation; this finds what no wait can cure.

    >>> never_fits({"learner": [{"CPU": 1.0, "GPU": 1.0}] * 8}, [{"CPU": 16.0, "GPU": 1.0}], "PACK")
    'GPU: the run asks for 8 (learner 8 x 1), the cluster has 1 (1 node)'
    >>> never_fits({"rollout": [{"GPU": 2.0}]}, [{"GPU": 1.0}, {"GPU": 1.0}], "PACK")
    'rollout: a bundle of GPU 2 fits no node (the largest has GPU 1)'
    >>> never_fits({"rollout": [{"GPU": 1.0}] * 2}, [{"GPU": 1.0}] * 2, "STRICT_PACK")
    'rollout: STRICT_PACK puts its 2 bundles on one node, and no node has GPU 2'
    >>> never_fits({"rollout": [{"GPU": 1.0}] * 2}, [{"GPU": 1.0}] * 2, "PACK")
    """
    count = f"{len(nodes)} node{'s' if len(nodes) != 1 else ''}"
    for resource in sorted({r for bundles in asks.values() for b in bundles for r in b}):
        need = sum(b.get(resource, 0.0) for bundles in asks.values() for b in bundles)
        have = sum(n.get(resource, 0.0) for n in nodes)
        if need > have + GRAIN:
            parts = ", ".join(
                f"{stage} {len(bundles)} x {_num(bundles[0].get(resource, 0.0))}"
                for stage, bundles in asks.items()
                if any(b.get(resource) for b in bundles)
            )
            return (f"{resource}: the run asks for {_num(need)} ({parts}), the cluster has "
                    f"{_num(have)} ({count})")  # fmt: skip
    for stage, bundles in asks.items():
        for b in bundles:
            if not any(_holds(n, b) for n in nodes):
                worst = max(b, key=lambda r: b[r] - max(n.get(r, 0.0) for n in nodes))
                largest = max(n.get(worst, 0.0) for n in nodes)
                return (f"{stage}: a bundle of {worst} {_num(b[worst])} fits no node (the "
                        f"largest has {worst} {_num(largest)})")  # fmt: skip
        if strategy == "STRICT_PACK":
            total = {r: sum(b.get(r, 0.0) for b in bundles) for b in bundles for r in b}
            if not any(_holds(n, total) for n in nodes):
                what = ", ".join(f"{r} {_num(v)}" for r, v in total.items())
                return (f"{stage}: STRICT_PACK puts its {len(bundles)} bundles on one node, "
                        f"and no node has {what}")  # fmt: skip
    return None


def _holds(node: dict[str, float], ask: dict[str, float]) -> bool:
    return all(node.get(r, 0.0) + GRAIN >= v for r, v in ask.items())


def _num(x: float) -> str:
    return f"{x:g}"
