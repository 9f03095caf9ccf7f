"""Learner rank and hf rollout worker processes reused from one test's group to the next.

A 2-rank :class:`~learner.group.LearnerGroup` costs ~20 core-s to start here, ~9 per rank in
imports alone (transformers' model classes, DeepSpeed, torch.distributed.tensor) and ~1 to
build the rank; the learner and weight-sync tests start ~40 such groups. Under the pool a
group's ranks are Ray actors of :class:`PooledRank`: :meth:`LearnerGroup.shutdown` hands them
back instead of killing them (the engine dropped, the process group destroyed with DeepSpeed's
own ``deepspeed.comm.destroy_process_group``, which also releases its cached groups), and the
next group builds its ranks in those processes with ``LearnerRank.__init__``. The modules that
start learner groups run one after another (tests/conftest.py), and after the last of them the
idle ranks are killed (an idle actor costs ~0.65 core-s a minute, and holds Ray's CPUs). The
end-to-end runs always start fresh ranks (in their own driver's Ray jobs).

The same numbers either way: five groups in a row (ZeRO-3, ZeRO-2, stage 0, ZeRO-3 in bf16,
ZeRO-2) gave bit-equal metrics and weights in reused and in fresh processes (measured here;
tests/learner/test_actor_pool.py checks it), and every test compares with references computed
apart. Rollout workers of the hf engine are pooled the same way (~6 core-s a start; the
engine and its weight-sync group dropped; vLLM engines are not pooled). Only actors with plain
resources (1 CPU; no placement group, GPU or runtime env) are pooled, and a pooled actor
reserves no CPU from Ray (idle, it would keep others from starting); one that died in a test
is dropped, not reused, and so are the other ranks of its group (:class:`ActorPool`)."""

from __future__ import annotations

import contextlib
import gc
import traceback

import ray

from learner import group as learner_group
from learner.rank import LearnerRank
from rollout import group as rollout_group
from rollout.worker import RolloutWorker

spawn_actor_group = learner_group.spawn_actor_group  # the real one, for what is not pooled


class _Reusable:
    """An actor that serves one group after another: :meth:`reset` builds it anew."""

    base: type

    def __init__(self):  # empty until reset() builds it
        pass

    def reset(self, *args) -> None:
        """Become a fresh ``base(*args)`` (the previous one closed). If that fails, the actor
        exits, as a fresh one whose constructor failed: the group's next call to it raises
        Ray's actor-died error."""
        self.close()
        try:
            self.base.__init__(self, *args)
        except BaseException:
            traceback.print_exc()
            ray.actor.exit_actor()

    def close(self) -> None:
        """Drop everything it holds (engine, optimizer, weight-sync group, sockets)."""
        vars(self).clear()
        gc.collect()


class PooledRank(_Reusable, LearnerRank):
    base = LearnerRank

    def close(self) -> None:
        """Also leave the process group (DeepSpeed releases the groups it cached), and put
        ZeRO-3's process-wide counters back where a fresh process has them: which parameters
        stay whole depends on the elements persisted so far in the process."""
        import sys

        import torch.distributed as dist

        super().close()
        if dist.is_initialized():
            import deepspeed.comm

            deepspeed.comm.destroy_process_group()
        zero = sys.modules.get("deepspeed.runtime.zero.partition_parameters")
        if zero is not None:
            init = zero.Init
            init.param_id = init.num_persisted_parameters = init.num_persisted_elements = 0
            init.apply_param_persistence = False
            for name in ("param_persistence_threshold", "model_persistence_threshold",
                         "override_module_apply"):  # fmt: skip
                setattr(init, name, zero.get_config_default(zero.DeepSpeedZeroConfig, name))


class PooledWorker(_Reusable, RolloutWorker):
    base = RolloutWorker


def _pooled(cls: type, args: tuple) -> type | None:
    """The pooled class for an actor of ``cls`` built with ``args``; None: not pooled."""
    if cls is LearnerRank:
        return PooledRank
    if cls is RolloutWorker and args[0].engine == "hf":  # args[0]: its RolloutConfig
        return PooledWorker
    return None


class ActorPool:
    """Idle actors in units: a learner group's ranks go back and come out together, so the
    ranks of a group always share one history (DeepSpeed keeps process-wide state: a reused rank
    beside a fresh one hung in ZeRO-3's start, most likely on ZeRO-3's persisted-parameter
    counters, now reset in :meth:`PooledRank.close`); a rollout worker is a unit of its own."""

    def __init__(self):
        self.idle: dict[tuple, list[list]] = {}  # (pooled class, unit size) -> idle units
        self.keys: dict = {}  # actor id -> its pooled class, for every actor of this pool
        self.forming: list = []  # the unit whose ranks a learner group is taking

    def spawn(self, cls, count, *args, num_cpus=1, num_gpus=0, runtime_env=None,
              placement=None, first_bundle=0, **kwargs) -> list:  # fmt: skip
        """``comm.actors.spawn_actor_group``'s signature: pooled actors where it can."""
        pooled = _pooled(cls, args)
        plain = num_cpus == 1 and not (num_gpus or runtime_env or kwargs) and placement is None
        if pooled is None or not plain:
            return spawn_actor_group(
                cls, count, *args, num_cpus=num_cpus, num_gpus=num_gpus,
                runtime_env=runtime_env, placement=placement, first_bundle=first_bundle, **kwargs,
            )  # fmt: skip
        got = []
        for _ in range(count):
            if pooled is PooledRank:  # args: rank, world size, ... (LearnerGroup: rank 0 first)
                if args[0] == 0:
                    self.forming = self._unit(pooled, args[1])
                actor = self.forming[args[0]]
            else:
                (actor,) = self._unit(pooled, 1)
            actor.reset.remote(*args)  # ordered before the group's next call to it
            got.append(actor)
        return got

    def _unit(self, pooled: type, size: int) -> list:
        idle = self.idle.setdefault((pooled, size), [])
        if idle:
            return idle.pop()
        # no CPU reserved: idle, it must not keep others' actors from starting (in use, it
        # computes with the threads its arguments give, as a fresh one; Ray sets
        # OMP_NUM_THREADS=1 for it, as for a fresh one with its 1 CPU)
        unit = [
            ray.remote(num_cpus=0)(pooled).options(max_restarts=0).remote() for _ in range(size)
        ]
        self.keys.update((actor._actor_id, pooled) for actor in unit)
        return unit

    def give_back(self, actors: list, *, unit: bool) -> None:
        """A group's shutdown: its pooled actors are closed and kept, as one unit (``unit``) or
        each on its own; any that cannot close (it died, or hangs in a collective a dead peer
        left) is killed, and with it the rest of its unit. Actors not of the pool are killed."""
        pooled = [a for a in actors if a._actor_id in self.keys]
        for actor in actors:
            if actor._actor_id not in self.keys:
                ray.kill(actor)
        closing = [(a, a.close.remote()) for a in pooled]
        closed = []
        for actor, ref in closing:
            try:
                ray.get(ref, timeout=60)
                closed.append(actor)
            except Exception:
                self._kill(actor)
        if unit and len(closed) < len(pooled):  # a rank was lost: its peers go too
            for actor in closed:
                self._kill(actor)
            return
        for members in [closed] if unit else [[a] for a in closed]:
            if members:
                key = (self.keys[members[0]._actor_id], len(members))
                self.idle.setdefault(key, []).append(members)

    def drain(self) -> None:
        """Kill every idle actor."""
        for units in self.idle.values():
            for members in units:
                for actor in members:
                    self._kill(actor)
            units.clear()

    def _kill(self, actor) -> None:
        self.keys.pop(actor._actor_id, None)
        with contextlib.suppress(Exception):
            ray.kill(actor)


POOL = ActorPool()


def install(monkeypatch) -> None:
    """Route the learner and rollout groups' actor starts and shutdowns through :data:`POOL`."""
    monkeypatch.setattr(learner_group, "spawn_actor_group", POOL.spawn)
    monkeypatch.setattr(rollout_group, "spawn_actor_group", POOL.spawn)
    monkeypatch.setattr(learner_group.LearnerGroup, "shutdown", _learner_shutdown)
    monkeypatch.setattr(rollout_group.RolloutGroup, "shutdown", _rollout_shutdown)


def _learner_shutdown(group) -> None:
    if group.ranks:  # the object-store sync's weights file, as LearnerGroup.shutdown does
        with contextlib.suppress(Exception):
            ray.get(group.ranks[0].remove_weight_file.remote(), timeout=10)
    POOL.give_back(group.ranks, unit=True)
    group.ranks = []


def _rollout_shutdown(group) -> None:
    POOL.give_back(group.workers, unit=False)
    group.workers = []
