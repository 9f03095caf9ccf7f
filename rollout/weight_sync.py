"""Weight sync from the learner to the rollout engines: one interface, transports behind it.

``sync_from(learner, version)`` sends learner rank 0's weights to every engine; the object-store
transport also takes a state dict from anywhere (``push``). Algorithm code never branches on the
transport.

- ``object_store`` (everywhere): one ``ray.put`` of the state dict, every worker reads the same
  object (zero-copy for workers on the node) and loads it in place.
- ``collective``: learner rank 0 broadcasts the parameters in buckets over a torch.distributed
  group that the engine workers joined (inside vLLM's worker processes, through its worker
  extension and ``collective_rpc``, as OpenRLHF/verl do): NCCL on GPUs, gloo on CPUs (tested
  here). rollout/collective.py has the protocol.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol

import ray
import torch

from rollout.actors import ActorDied, get, settle


class WeightTransport(Protocol):
    def sync_from(self, learner, version: int) -> float:
        """Send learner rank 0's weights (``learner``: a :class:`learner.group.LearnerGroup`);
        returns the seconds until every engine had loaded them."""


class ObjectStoreTransport:
    def __init__(self, workers: list, *, timeout_s: float, **_):
        self.workers, self.timeout_s = workers, timeout_s

    def sync_from(self, learner, version: int, on_death=None) -> float:
        """Rank 0's state dict stays in the object store; the engines read it from there."""
        return self.push(learner.export_weights_ref(), version, on_death)

    def push(
        self,
        named_tensors: dict[str, torch.Tensor] | ray.ObjectRef,
        version: int,
        on_death: Callable[[int], None] | None = None,
    ) -> float:
        """``named_tensors``: a state dict, or the ref of one already in the object store (a
        learner rank's ``export_weights`` result: then the weights never pass the driver).
        ``on_death(i)``: called for a worker that died meanwhile (it restarts it with these
        weights); without it a death raises."""
        t0 = time.perf_counter()
        if isinstance(named_tensors, ray.ObjectRef):
            ref = named_tensors
        else:
            ref = ray.put({k: v.detach().to("cpu").contiguous() for k, v in named_tensors.items()})
        settled = settle(
            {i: w.load_weights.remote(ref, version) for i, w in enumerate(self.workers)},
            timeout_s=self.timeout_s,
            what=f"weight sync (version {version})",
        )
        for i, result in settled.items():
            if isinstance(result, ActorDied):
                if on_death is None:
                    raise result
                on_death(i)
        return time.perf_counter() - t0


class CollectiveTransport:
    """Learner rank 0 broadcasts to every engine worker over a torch.distributed group of their
    own (rollout/collective.py): gloo on CPUs, NCCL on GPUs, in buckets of ``bucket_mb``.

    The group is opened on the first sync (:meth:`connect`): the learner's tensor specs go to
    the engines once, then each sync moves only data."""

    def __init__(
        self, workers: list, *, timeout_s: float, bucket_mb: float = 256.0, backend: str = "gloo"
    ):
        self.workers, self.timeout_s = workers, timeout_s
        self.bucket_bytes = int(bucket_mb * 2**20)
        self.backend = backend
        self.learner = None
        self.bytes_sent = 0

    def connect(self, learner) -> None:
        """Open the sync group: learner rank 0 is rank 0, then each engine worker's processes
        (one per tensor-parallel shard) in worker order."""
        specs = learner.weight_specs()
        host, port = learner.sync_address()
        sizes = get(
            [w.weight_sync_ranks.remote() for w in self.workers],
            timeout_s=self.timeout_s,
            what="engine ranks",
        )
        first = [1 + sum(sizes[:i]) for i in range(len(sizes))]
        world = 1 + sum(sizes)
        refs = learner.open_weight_group(
            host, port, world, self.backend, self.timeout_s, self.bucket_bytes
        )
        refs += [
            w.open_weight_group.remote(
                host,
                port,
                first[i],
                world,
                self.backend,
                self.timeout_s,
                specs,
                self.bucket_bytes,
            )
            for i, w in enumerate(self.workers)
        ]
        get(refs, timeout_s=self.timeout_s, what=f"opening the weight-sync group ({world} ranks)")
        self.learner = learner

    def sync_from(self, learner, version: int, on_death=None) -> float:
        """(A dead engine stops the sync with an error: the group would have to be re-opened
        with every engine; restarts need rollout.weight_sync=object_store.)"""
        t0 = time.perf_counter()
        if self.learner is not learner:
            self.connect(learner)
        refs = learner.broadcast_weights(version)
        refs += [w.receive_weights.remote(version) for w in self.workers]
        sent = get(refs, timeout_s=self.timeout_s, what=f"weight sync (version {version})")
        self.bytes_sent = int(sent[0])
        return time.perf_counter() - t0

    def push(self, named_tensors, version: int) -> float:
        raise TypeError(
            "the collective transport sends from learner rank 0 (sync_from(learner, version)); "
            "a state dict from the driver goes through rollout.weight_sync=object_store"
        )


def weight_sync_backend(cfg) -> str:
    """The collective transport's backend for a rollout config: NCCL when the engines hold GPUs
    (the learner's side is checked by the config validation), gloo otherwise."""
    if cfg.weight_sync_backend != "auto":
        return cfg.weight_sync_backend
    return "nccl" if cfg.num_gpus_per_worker > 0 else "gloo"


TRANSPORTS = {"object_store": ObjectStoreTransport, "collective": CollectiveTransport}
