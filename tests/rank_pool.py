"""Learner rank processes reused from one test's group to the next.

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
tests/learner/test_rank_pool.py checks it), and every test compares with references computed
apart. Only groups of ``LearnerRank`` with plain resources (no placement group, GPU or runtime
env) are pooled; a rank that died in a test is dropped, not reused."""

from __future__ import annotations

import contextlib
import gc
import traceback

import ray

from learner import group as learner_group
from learner.rank import LearnerRank

spawn_actor_group = learner_group.spawn_actor_group  # the real one, for what is not pooled


class PooledRank(LearnerRank):
    """A learner rank process that serves one group after another (:meth:`reset`)."""

    def __init__(self):  # empty until reset() makes it a rank
        pass

    def reset(self, *args) -> None:
        """Become a fresh ``LearnerRank(*args)`` (the previous one closed). If that fails, the
        actor exits, as a fresh one whose constructor failed: the group's next call to it
        raises Ray's actor-died error."""
        self.close()
        try:
            LearnerRank.__init__(self, *args)
        except BaseException:
            traceback.print_exc()
            ray.actor.exit_actor()

    def close(self) -> None:
        """Drop the rank (engine, optimizer, export, sockets) and leave its process group."""
        import torch.distributed as dist

        vars(self).clear()
        if dist.is_initialized():
            import deepspeed.comm

            deepspeed.comm.destroy_process_group()
        gc.collect()


class RankPool:
    def __init__(self):
        self.idle: dict[float, list] = {}  # num_cpus -> idle PooledRank actors
        self.cpus: dict = {}  # actor id -> num_cpus, for every actor of this pool

    def spawn(self, cls, count, *args, num_cpus=1, num_gpus=0, runtime_env=None,
              placement=None, first_bundle=0, **kwargs) -> list:  # fmt: skip
        """``comm.actors.spawn_actor_group``'s signature: pooled ranks where it can."""
        if cls is not LearnerRank or num_gpus or runtime_env or placement is not None or kwargs:
            return spawn_actor_group(
                cls, count, *args, num_cpus=num_cpus, num_gpus=num_gpus,
                runtime_env=runtime_env, placement=placement, first_bundle=first_bundle, **kwargs,
            )  # fmt: skip
        got = []
        for _ in range(count):
            idle = self.idle.setdefault(num_cpus, [])
            if idle:
                actor = idle.pop()
            else:
                remote = ray.remote(num_cpus=num_cpus)(PooledRank)
                actor = remote.options(max_restarts=0).remote()
                self.cpus[actor._actor_id] = num_cpus
            actor.reset.remote(*args)  # ordered before the group's next call to it
            got.append(actor)
        return got

    def give_back(self, group) -> None:
        """``LearnerGroup.shutdown`` for pooled ranks: each is closed and kept (killed if it
        cannot close: it died, or hangs in a collective a dead peer left)."""
        closing = [(r, r.close.remote()) for r in group.ranks if r._actor_id in self.cpus]
        for actor in group.ranks:
            if actor._actor_id not in self.cpus:
                ray.kill(actor)
        for actor, ref in closing:
            try:
                ray.get(ref, timeout=60)
                self.idle[self.cpus[actor._actor_id]].append(actor)
            except Exception:
                self._kill(actor)
        group.ranks = []

    def drain(self) -> None:
        """Kill every idle rank."""
        for actors_ in self.idle.values():
            for actor in actors_:
                self._kill(actor)
            actors_.clear()

    def _kill(self, actor) -> None:
        self.cpus.pop(actor._actor_id, None)
        with contextlib.suppress(Exception):
            ray.kill(actor)


POOL = RankPool()


def install(monkeypatch) -> None:
    """Route ``LearnerGroup``'s rank starts and shutdowns through :data:`POOL`."""
    monkeypatch.setattr(learner_group, "spawn_actor_group", POOL.spawn)
    monkeypatch.setattr(learner_group.LearnerGroup, "shutdown", _shutdown)


def _shutdown(group) -> None:
    if group.ranks:  # the object-store sync's weights file, as LearnerGroup.shutdown does
        with contextlib.suppress(Exception):
            ray.get(group.ranks[0].remove_weight_file.remote(), timeout=10)
    POOL.give_back(group)
