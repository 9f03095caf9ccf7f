"""Weight sync from the learner to the rollout engines: one interface, transports behind it.

``push(named_tensors, version)`` on the learner side; each engine's ``load_weights(named
tensors, version)`` on the other. Algorithm code never branches on the transport.

- ``object_store`` (everywhere): one ``ray.put`` of the state dict, every worker reads the same
  object (zero-copy for workers on the node) and loads it in place.
- ``collective`` (GPUs): learner rank 0 broadcasts each tensor over an NCCL group that the
  engines joined (as OpenRLHF/verl do). Needs CUDA; not available on CPU machines.
"""

from __future__ import annotations

import time
from typing import Protocol

import ray
import torch

from rollout.actors import get


class WeightTransport(Protocol):
    def push(self, named_tensors: dict[str, torch.Tensor] | ray.ObjectRef, version: int) -> float:
        """Send the weights; returns the seconds it took until every engine had loaded them."""


class ObjectStoreTransport:
    def __init__(self, workers: list, *, timeout_s: float):
        self.workers, self.timeout_s = workers, timeout_s

    def push(self, named_tensors: dict[str, torch.Tensor] | ray.ObjectRef, version: int) -> float:
        """``named_tensors``: a state dict, or the ref of one already in the object store (a
        learner rank's ``export_weights`` result: then the weights never pass the driver)."""
        t0 = time.perf_counter()
        if isinstance(named_tensors, ray.ObjectRef):
            ref = named_tensors
        else:
            ref = ray.put({k: v.detach().to("cpu").contiguous() for k, v in named_tensors.items()})
        get(
            [w.load_weights.remote(ref, version) for w in self.workers],
            timeout_s=self.timeout_s,
            what=f"weight sync (version {version})",
        )
        return time.perf_counter() - t0


class CollectiveTransport:
    """NCCL broadcast from learner rank 0 to the engines (GPU only)."""

    def __init__(self, workers: list, *, timeout_s: float):
        if not torch.cuda.is_available():
            raise RuntimeError(
                "rollout.weight_sync=collective needs CUDA (NCCL); use object_store on CPU"
            )
        raise NotImplementedError(
            "the NCCL weight-sync transport is not built yet; use rollout.weight_sync=object_store"
        )

    def push(self, named_tensors: dict[str, torch.Tensor], version: int) -> float:
        raise NotImplementedError


TRANSPORTS = {"object_store": ObjectStoreTransport, "collective": CollectiveTransport}
