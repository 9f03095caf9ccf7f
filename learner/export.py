"""What leaves a learner rank as weights: the (LoRA: merged) model under the base model's names,
for checkpoints (a state-dict entry at a time), for the object-store sync (bucket refs, or a
file in shared memory when the engines share rank 0's node: comm/weight_file.py) and for the
collective sync (buckets broadcast to the engines: comm/weight_protocol.py).

Under ZeRO-3 every rank holds a shard of each parameter, so every rank calls each method here at
the same time and gathers the same pieces in the same order: one state-dict entry (a parameter,
or a LoRA weight with its two adapters) or one sync bucket beyond its shards at a time, never the
whole model. Only rank 0 copies what it gathered to the host, writes it or sends it.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator

import torch

from learner.lora import adapter_params, adapter_state_dict, state_units, sync_units


def gathered(params: list[torch.nn.Parameter], zero3: bool):
    """``params`` with their full data inside the ``with`` (ZeRO-3: gathered on every rank, the
    shards restored on exit; otherwise they are whole already)."""
    if not zero3 or not params:
        return contextlib.nullcontext()
    import deepspeed

    return deepspeed.zero.GatheredParameters(params, modifier_rank=None)


def host_copy(t: torch.Tensor) -> torch.Tensor:
    return t.detach().to("cpu", copy=True)


class WeightExport:
    """One rank's end of the weight export (``rank`` 0 keeps and sends, the others only gather
    with it)."""

    def __init__(self, module: torch.nn.Module, rank: int, zero3: bool):
        self.module, self.rank, self.zero3 = module, rank, zero3
        self.sync_buckets: list[list[int]] = []  # the collective sync's plan
        self.sender = None  # rank 0: the collective sync's sending end
        self.sync_store = None  # rank 0: the sync group's store (one per run)
        self.file: str | None = None  # rank 0: the sync's weights file, rewritten in place

    def state(self, every_rank: bool = False) -> dict[str, torch.Tensor] | None:
        """The full (merged) state dict as host copies, on rank 0 or on every rank (None on the
        others), gathered one state-dict entry at a time."""
        keep = every_rank or self.rank == 0
        out = {}
        for unit in state_units(self.module):
            with gathered(unit.params, self.zero3):
                if keep:
                    out[unit.name] = host_copy(unit.value())
        return out if keep else None

    def adapter(self, every_rank: bool = False) -> dict[str, torch.Tensor] | None:
        """A peft model's adapter weights as peft saves them (host copies; the adapters are small:
        gathered together), on rank 0 or every rank; None on the others or without LoRA."""
        keep = every_rank or self.rank == 0
        with gathered(adapter_params(self.module), self.zero3):
            return adapter_state_dict(self.module) if keep else None

    def specs(self) -> list[tuple[str, str, tuple[int, ...]]]:
        """``(name, dtype, shape)`` of every synced tensor (learner/lora.py ``sync_units``: the
        parameters, or the merged LoRA model; full shapes under ZeRO-3)."""
        return [
            (u.name, str(p.dtype).removeprefix("torch."), tuple(getattr(p, "ds_shape", p.shape)))
            for u in sync_units(self.module)
            for p in u.params[:1]
        ]

    def gathered_buckets(self, buckets: list[list[int]]) -> Iterator[list]:
        """Per bucket (indices into :meth:`specs`), its ``(name, tensor)`` pairs with full data,
        valid until the next bucket is asked for."""
        units = sync_units(self.module)
        for bucket in buckets:
            chosen = [units[i] for i in bucket]
            with gathered([p for u in chosen for p in u.params], self.zero3):
                yield [(u.name, u.value()) for u in chosen]

    @torch.no_grad()
    def bucket_refs(self, bucket_bytes: int) -> list | None:
        """The object-store sync: rank 0 puts the weights into Ray's object store one bucket (a
        ``{name: host tensor}`` dict of at most ``bucket_bytes``, as the collective sync packs
        them) at a time and returns the refs; None on the other ranks."""
        import ray

        from comm.weight_protocol import TensorSpec, plan_buckets

        specs = [TensorSpec(*s) for s in self.specs()]
        refs = []
        for named in self.gathered_buckets(plan_buckets(specs, bucket_bytes)):
            if self.rank == 0:
                refs.append(ray.put({n: host_copy(t) for n, t in named}))
        return refs if self.rank == 0 else None

    @torch.no_grad()
    def write_file(self, bucket_bytes: int) -> tuple[str, int] | None:
        """The object-store sync on one node: rank 0 writes the weights into one safetensors
        file in shared memory (comm/weight_file.py ``write_stream``; under ZeRO-3 gathered a
        bucket at a time, each written as it comes) and returns ``(path, bytes)``; None on the
        other ranks. The file is kept and rewritten in place at every sync (its pages stay
        allocated: memory speed, for one more copy of the weights in RAM) until
        :meth:`remove_file`, or until a new engine finds its writer gone."""
        from comm.weight_file import weights_dir, write_stream
        from comm.weight_protocol import TensorSpec, plan_buckets

        specs = [TensorSpec(*s) for s in self.specs()]
        stream = (
            pair
            for named in self.gathered_buckets(plan_buckets(specs, bucket_bytes))
            for pair in named
        )
        if self.rank != 0:
            for _ in stream:  # gather with rank 0
                pass
            return None
        typed = [(s.name, getattr(torch, s.dtype), tuple(s.shape)) for s in specs]
        nbytes = sum(torch.Size(shape).numel() * dtype.itemsize for _, dtype, shape in typed)
        if self.file is None:  # in this process's private folder (comm/weight_file.py)
            self.file = os.path.join(weights_dir(nbytes), "sync.safetensors")
        return self.file, write_stream(self.file, typed, stream)

    def remove_file(self) -> None:
        from comm.weight_file import remove_weights

        if self.file is not None:
            remove_weights(self.file)  # and its folder
            self.file = None

    def open_group(self, group, listener: Callable[[int], object]) -> None:
        """Plan the collective sync's buckets; rank 0 also joins the sync group (``group``:
        comm/weight_protocol.py ``SyncGroup``) as its rank 0, on the run's one store (made on the
        first call, at ``group.host:group.port``, on ``listener(port)``'s socket). A rebuilt group
        aborts the one it replaces first."""
        from comm.weight_protocol import TensorSpec, open_sender, plan_buckets, sync_store

        specs = [TensorSpec(*s) for s in self.specs()]
        self.sync_buckets = plan_buckets(specs, group.bucket_bytes)
        if self.sender is not None:
            self.sender.close()
            self.sender = None
        if self.rank == 0:
            if self.sync_store is None:
                self.sync_store = sync_store(group, listener(group.port))
            self.sender = open_sender(group, specs, self.sync_store)

    @torch.no_grad()
    def broadcast(self, version: int) -> int:
        """Send policy ``version`` to the engines bucket by bucket; the bytes sent (0 on ranks
        other than 0)."""
        sent = 0
        if self.sender is not None:
            self.sender.send_header(version)
        for named in self.gathered_buckets(self.sync_buckets):
            if self.sender is not None:
                sent += self.sender.send_bucket([t for _, t in named])
        return sent
