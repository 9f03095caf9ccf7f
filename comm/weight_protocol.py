"""The weight-sync wire protocol: learner rank 0 broadcasts its weights to every engine
worker over a torch.distributed group of their own (gloo on CPUs, NCCL on GPUs).

The group is *stateless* with respect to torch.distributed's default group: it is built from
its own TCPStore (hosted by learner rank 0) and a ``ProcessGroupGloo``/``ProcessGroupNCCL``
object, so it lives beside DeepSpeed's group in the learner and beside vLLM's own groups in the
engine workers without touching either (the route OpenRLHF and verl take). Ranks: 0 is learner
rank 0; engine worker i with tensor-parallel size t_i holds ranks ``1 + sum(t_j, j < i) + tp_rank``
(every TP shard receives the full tensors; vLLM's loader slices them).

One sync of policy version v:

1. a header ``[v, number of buckets, number of elements]`` (int64), checked by every receiver
   (a receiver that expected another version stops with an error instead of loading a mix);
2. the parameters in the learner's ``named_parameters()`` order (tied weights once), packed
   into buckets of one dtype and at most ``bucket_bytes`` (a larger tensor goes alone), one
   broadcast per bucket. Both sides compute the buckets from the same :class:`TensorSpec` list
   (:func:`plan_buckets`), so only data crosses the wire.

Receivers get an iterator of ``(name, tensor)`` that broadcasts a bucket when the loader reaches
it: at most one bucket is held beyond the model's own weights.

Both ends import this module: learner rank 0 (:func:`open_sender`) and the engines
(:func:`open_receiver`; inside vLLM's worker processes through rollout/collective.py). Imports no
Ray.

>>> specs = [TensorSpec("a", "float32", (4, 4)), TensorSpec("b", "float32", (16,)),
...          TensorSpec("c", "bfloat16", (8,)), TensorSpec("d", "float32", (100,))]
>>> plan_buckets(specs, bucket_bytes=128)  # a, b: 64 B each; c other dtype; d 400 B alone
[[0, 1], [2], [3]]
"""

from __future__ import annotations

import dataclasses
import math
import socket
from collections.abc import Iterable, Iterator
from datetime import timedelta

import torch

from comm.rendezvous import tcp_store

GROUP_PREFIX = "avspo_weight_sync"


@dataclasses.dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: str  # "float32", "bfloat16", ...
    shape: tuple[int, ...]

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def torch_dtype(self) -> torch.dtype:
        return getattr(torch, self.dtype)

    @property
    def nbytes(self) -> int:
        return self.numel * torch.empty((), dtype=self.torch_dtype).element_size()


@dataclasses.dataclass(frozen=True)
class SyncGroup:
    """Where and how the sync group meets: what every member is told to open its end."""

    host: str
    port: int
    world_size: int
    backend: str  # "gloo" | "nccl"
    timeout_s: float
    bucket_bytes: int
    generation: int = 0  # rebuilds so far (a restarted engine makes every member rejoin anew)


def plan_buckets(specs: list[TensorSpec], bucket_bytes: int) -> list[list[int]]:
    """Indices of ``specs`` per bucket: consecutive tensors of one dtype, at most
    ``bucket_bytes`` together; a tensor larger than that is a bucket of its own."""
    buckets: list[list[int]] = []
    size = 0
    for i, spec in enumerate(specs):
        last = buckets[-1] if buckets else None
        same_dtype = last is not None and specs[last[0]].dtype == spec.dtype
        if last is None or not same_dtype or size + spec.nbytes > bucket_bytes:
            buckets.append([i])
            size = spec.nbytes
        else:
            last.append(i)
            size += spec.nbytes
    return buckets


def open_group(
    store, rank: int, world_size: int, *, backend: str, timeout_s: float, generation: int = 0
) -> torch.distributed.ProcessGroup:
    """This process's member of the sync group, meeting on ``store`` (:func:`tcp_store`: learner
    rank 0 hosts it, the others are its clients). Blocks until all ranks joined.
    ``generation``: how many times the group was rebuilt; every generation meets under its own
    prefix of the same store (a restarted engine makes every member rejoin a new group)."""
    import torch.distributed as dist

    timeout = timedelta(seconds=timeout_s)
    prefixed = dist.PrefixStore(f"{GROUP_PREFIX}/{generation}", store)
    if backend == "gloo":
        group = dist.ProcessGroupGloo(prefixed, rank, world_size, timeout)
    elif backend == "nccl":
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = timeout
        group = dist.ProcessGroupNCCL(prefixed, rank, world_size, options)
    else:
        raise ValueError(f"weight-sync backend must be gloo or nccl, got {backend!r}")
    # A first collective: every rank is connected before anyone returns (NCCL connects lazily).
    flag = torch.ones(1, device=_device(backend))
    _broadcast(group, flag)
    return group


def _device(backend: str) -> torch.device:
    if backend == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _broadcast(group, tensor: torch.Tensor) -> None:
    import torch.distributed as dist

    opts = dist.BroadcastOptions()
    opts.rootRank, opts.rootTensor = 0, 0
    group.broadcast([tensor], opts).wait()


def _header(
    version: int, buckets: list[list[int]], specs: list[TensorSpec], device
) -> torch.Tensor:
    total = sum(specs[i].numel for b in buckets for i in b)
    return torch.tensor([version, len(buckets), total], dtype=torch.int64, device=device)


class Member:
    """One end of the sync group (:class:`Sender` or :class:`Receiver`)."""

    group: object

    def close(self) -> None:
        """Abort this end's process group now, before a rebuilt group replaces it: NCCL frees
        its communicator and fails any collective still waiting on a dead peer, instead of
        leaving both to a destructor that runs late or hangs; gloo's abort is a no-op. Closing
        twice is harmless."""
        if self.group is not None:
            self.group.abort()
            self.group = None


class Sender(Member):
    """Learner rank 0's end: :meth:`send_header`, then :meth:`send_bucket` for each bucket in
    order (the learner gathers a bucket's ZeRO-3 shards around each call)."""

    def __init__(self, group, store, specs: list[TensorSpec], bucket_bytes: int, backend: str):
        self.group, self.store, self.specs, self.backend = group, store, specs, backend
        self.buckets = plan_buckets(specs, bucket_bytes)

    def send_header(self, version: int) -> None:
        _broadcast(self.group, _header(version, self.buckets, self.specs, _device(self.backend)))

    def send_bucket(self, tensors: list[torch.Tensor]) -> int:
        """One bucket's tensors, in spec order; returns the bytes sent."""
        device = _device(self.backend)
        flat = torch.cat([t.detach().reshape(-1).to(device) for t in tensors])
        _broadcast(self.group, flat)
        return flat.numel() * flat.element_size()


class Receiver(Member):
    """An engine worker's end."""

    def __init__(self, group, store, specs: list[TensorSpec], bucket_bytes: int, backend: str):
        self.group, self.store, self.specs, self.backend = group, store, specs, backend
        self.buckets = plan_buckets(specs, bucket_bytes)

    def receive(self, version: int) -> Iterator[tuple[str, torch.Tensor]]:
        """``(name, tensor)`` of policy ``version``, one bucket broadcast at a time. Raises if
        the sender's header is not the one expected (version, bucket count, elements)."""
        device = _device(self.backend)
        want = _header(version, self.buckets, self.specs, device)
        got = torch.empty_like(want)
        _broadcast(self.group, got)
        if not torch.equal(got, want):
            raise RuntimeError(
                "weight sync out of step: expected [version, buckets, elements] = "
                f"{want.tolist()}, the learner sent {got.tolist()}"
            )
        for bucket in self.buckets:
            specs = [self.specs[i] for i in bucket]
            flat = torch.empty(
                sum(s.numel for s in specs), dtype=specs[0].torch_dtype, device=device
            )
            _broadcast(self.group, flat)
            for spec, part in zip(specs, flat.split([s.numel for s in specs]), strict=True):
                yield spec.name, part.view(spec.shape)


def sync_store(group: SyncGroup, listener: socket.socket):
    """Learner rank 0's store for the sync group, served on ``listener`` (bound at
    ``group.host:group.port``, :func:`listen_socket`). One for the whole run: every rebuilt
    group meets on it under its generation's prefix. (Destroying the store of a group whose
    member was killed hung in torch's libuv store daemon: docs/NOTES.md.)"""
    timeout = timedelta(seconds=group.timeout_s)
    return tcp_store(group.host, group.port, None, timeout=timeout, listener=listener)


def open_sender(group: SyncGroup, specs: list[TensorSpec], store) -> Sender:
    """Learner rank 0's end of the sync group (rank 0), on its :func:`sync_store`."""
    pg = open_group(
        store, 0, group.world_size, backend=group.backend, timeout_s=group.timeout_s,
        generation=group.generation,
    )  # fmt: skip
    return Sender(pg, store, specs, group.bucket_bytes, group.backend)


def open_receiver(
    group: SyncGroup, rank: int, specs: list[tuple[str, str, tuple[int, ...]]]
) -> Receiver:
    """An engine process's end of the sync group (as rank ``rank``), for ``(name, dtype,
    shape)`` specs as the learner sends them."""
    timeout = timedelta(seconds=group.timeout_s)
    store = tcp_store(group.host, group.port, None, timeout=timeout)
    pg = open_group(
        store, rank, group.world_size, backend=group.backend, timeout_s=group.timeout_s,
        generation=group.generation,
    )  # fmt: skip
    specs_ = [TensorSpec(n, d, tuple(s)) for n, d, s in specs]
    return Receiver(pg, store, specs_, group.bucket_bytes, group.backend)


def checksum(tensors: Iterable[torch.Tensor]) -> tuple[float, float]:
    """``(sum, sum of squares)`` of every element, in float64: equal for the same weights in
    any layout that only concatenates tensors (vLLM fuses q/k/v and gate/up), so an engine's
    weights can be compared with the learner's without moving them.

    >>> checksum([torch.tensor([1.0, -2.0]), torch.tensor([[3.0]])])
    (2.0, 14.0)
    """
    total, squares = 0.0, 0.0
    for t in tensors:
        x = t.detach().double()
        total += float(x.sum())
        squares += float((x * x).sum())
    return total, squares
