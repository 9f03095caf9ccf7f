"""Weight sync from the learner to the rollout engines: one driver-level object that owns both
ends (:class:`WeightSync`), transports behind it. Stages never call each other: the learner
group and the rollout group only answer the calls made here.

- ``object_store`` (everywhere): when every engine runs on learner rank 0's node, rank 0 writes
  its parameters into one safetensors file in shared memory (rewritten in place at each sync,
  a bucket at a time under ZeRO-3) and the engines get its path: each maps it and reloads in
  place (comm/weight_file.py; the bytes are copied once on each side). Otherwise rank 0 puts
  them into Ray's object store one bucket (at most ``rollout.weight_sync_bucket_mb``) at a
  time; every worker reads the same objects (zero-copy on the node) and hands them to its
  engine bucket by bucket. What the engines hold (the file, or the refs) is kept until the
  next sync: a restarted worker gets exactly those weights.
- ``collective``: learner rank 0 broadcasts the parameters in buckets over a torch.distributed
  group that the engine workers joined (inside vLLM's worker processes, through its worker
  extension and ``collective_rpc``, as OpenRLHF/verl do): NCCL on GPUs, gloo on CPUs (tested
  here). comm/weight_protocol.py has the protocol. A restarted worker gets its weights through
  the object store, and every member rejoins a new group (same store, new name) at the next
  sync.

Colocated on GPUs (engines in vLLM sleep mode), :meth:`WeightSync.before_update` puts the
engines to sleep and :meth:`WeightSync.after_update` wakes their weights, syncs, then wakes
their KV cache, so the learner's update and the new weights never share the GPU with a KV cache.
Algorithm code never branches on the transport.
"""

from __future__ import annotations

import time

from comm.actors import get
from comm.weight_protocol import SyncGroup


class ObjectStoreTransport:
    def __init__(self, rollout, bucket_bytes: int):
        self.rollout, self.bucket_bytes = rollout, bucket_bytes
        self.refs: list = []  # the buckets of the version the engines hold (None: the start)
        self.file: str | None = None  # or the file they loaded it from (one node)
        self.one_node: bool | None = None  # every engine on learner rank 0's node

    def sync(self, learner, version: int) -> None:
        if self.one_node is not False:
            node, path, _ = learner.export_file(self.bucket_bytes)
            if self.one_node is None:
                self.one_node = set(self.rollout.node_ids()) == {node}
            if self.one_node:
                self.rollout.load_file(path, version)  # a worker that died: restarted, loads
                self.file = path
                return
        refs = learner.export_bucket_refs(self.bucket_bytes)
        self.rollout.load_weights(refs, version)  # a worker that died meanwhile: restarted
        self.refs = refs

    def restore(self, learner, worker: int, version: int) -> None:
        """Restarted ``worker`` gets ``version`` (version 0: the model it starts with)."""
        if not version:
            return
        if self.file is not None:
            self.rollout.load_file(self.file, version, workers=[worker])
        else:
            refs = self.refs or learner.export_bucket_refs(self.bucket_bytes)
            self.rollout.load_weights(refs, version, workers=[worker])


class CollectiveTransport:
    """The group is opened on the first sync (:meth:`connect`): the learner's tensor specs go to
    the engines once, then each sync moves only data. A restarted worker makes the next sync
    open a new group with every member."""

    def __init__(self, rollout, bucket_bytes: int, backend: str = "gloo"):
        self.rollout, self.bucket_bytes, self.backend = rollout, bucket_bytes, backend
        self.generation = -1  # the group's generation; -1: none open
        self.address = None  # (host, port) of learner rank 0's store, one for the run
        self.stale = True
        self.bytes_sent = 0

    def connect(self, learner) -> None:
        """Open the sync group: learner rank 0 is rank 0, then each engine worker's processes
        (one per tensor-parallel shard) in worker order."""
        rollout, timeout_s = self.rollout, self.rollout.cfg.timeout_s
        specs = learner.weight_specs()
        if self.address is None:
            self.address = learner.sync_address()
        host, port = self.address
        sizes = rollout.weight_sync_ranks()
        first = [1 + sum(sizes[:i]) for i in range(len(sizes))]
        self.generation += 1
        group = SyncGroup(
            host, port, 1 + sum(sizes), self.backend, timeout_s, self.bucket_bytes, self.generation
        )
        refs = learner.open_weight_group(group) + rollout.open_weight_group(group, first, specs)
        get(refs, timeout_s=timeout_s, what=f"opening the weight-sync group ({group.world_size} "
            f"ranks, generation {group.generation})")  # fmt: skip
        self.stale = False

    def sync(self, learner, version: int) -> None:
        """(A worker found dead first is restarted and the group rebuilt; one that dies during
        the broadcast stops the sync with an error.)"""
        self.rollout.check_alive()  # restarts the dead: they make the group stale
        if self.stale:
            self.connect(learner)
        refs = learner.broadcast_weights(version) + self.rollout.receive_weights(version)
        sent = get(refs, timeout_s=self.rollout.cfg.timeout_s, what=f"weight sync (version "
                   f"{version})")  # fmt: skip
        self.bytes_sent = int(sent[0])

    def restore(self, learner, worker: int, version: int) -> None:
        """Restarted ``worker`` gets ``version`` through the object store (the new worker is
        in no group): everyone rejoins a new group at the next sync."""
        ObjectStoreTransport(self.rollout, self.bucket_bytes).restore(learner, worker, version)
        self.stale = True


class WeightSync:
    """Learner rank 0's weights -> every engine, by ``rollout.weight_sync``; owns both ends.
    ``sleeps``: the engines sleep during the update (colocated on GPUs)."""

    def __init__(self, rollout, learner, sleeps: bool = False):
        cfg = rollout.cfg
        bucket_bytes = int(cfg.weight_sync_bucket_mb * 2**20)
        if cfg.weight_sync == "collective":
            self.transport = CollectiveTransport(rollout, bucket_bytes, weight_sync_backend(cfg))
        else:
            self.transport = ObjectStoreTransport(rollout, bucket_bytes)
        self.rollout, self.learner, self.sleeps = rollout, learner, sleeps
        self.version = 0  # the policy version every engine holds

    def before_update(self) -> None:
        if self.sleeps:  # the engines free the memory the update needs
            self.rollout.sleep()

    def after_update(self, version: int) -> float:
        """Wake the engines' weights, sync ``version`` into them, wake their KV cache; returns
        the seconds of the sync."""
        if self.sleeps:
            self.rollout.wake_up(["weights"])
        seconds = self.sync(version)
        if self.sleeps:
            self.rollout.wake_up(["kv_cache"])
        return seconds

    def sync(self, version: int) -> float:
        """Seconds until every engine holds ``version``."""
        t0 = time.perf_counter()
        self.transport.sync(self.learner, version)
        self.version = version
        return time.perf_counter() - t0

    def restore(self, worker: int) -> None:
        """A restarted worker gets the version the other engines hold (version 0 is the model
        it starts with). The rollout group calls it: pass it as ``on_restart`` when building
        the group (launch/stages.py)."""
        self.transport.restore(self.learner, worker, self.version)


def weight_sync_backend(cfg) -> str:
    """The collective transport's backend for a rollout config: NCCL when the engines hold GPUs
    (the learner's side is checked by the config validation), gloo otherwise."""
    if cfg.weight_sync_backend != "auto":
        return cfg.weight_sync_backend
    return "nccl" if cfg.num_gpus_per_worker > 0 else "gloo"
