"""The driver's handle on its rollout workers: spawns them, spreads each call's samples over
them (a group's samples too: rollout/shares.py), merges their streams into whole groups, and
restarts one that dies (regenerating its lost samples with the same seeds).

Results come back in prompt order, each group's samples in sample order; every remote wait has
a timeout; a worker that dies makes the call raise :class:`comm.actors.ActorGroupError` naming
it unless it can be restarted (``rollout.max_restarts``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable, Iterator

from ray.exceptions import RayActorError

from comm.actors import ActorDied, ActorGroupError, get, settle, spawn_actor_group
from comm.hub import ModelRef
from rollout.config import RolloutConfig
from rollout.seeding import derive_seed
from rollout.shares import Assembler, split
from rollout.types import Group, SamplingConfig, Share
from rollout.worker import RolloutWorker

logger = logging.getLogger(__name__)


class RolloutGroup:
    def __init__(
        self,
        cfg: RolloutConfig,
        model_path: str | ModelRef,
        dtype: str = "float32",
        placement=None,
        wait: bool = True,
        resources: tuple[float, float] | None = None,
        threads: list[int] | None = None,
        cpus: list[list[int] | None] | None = None,
        sleep_mode: bool = False,
        on_restart: Callable[[int], None] | None = None,
    ):
        """Spawns the workers; with ``wait`` (default) also waits until their engines are up.
        ``wait=False`` lets the caller start other actors meanwhile, then call
        :meth:`wait_ready` (vLLM takes ~30 s to start on CPU). ``resources``: (CPUs, GPUs) each
        worker asks Ray for (default: the config's); ``threads`` / ``cpus``: per worker
        (launch/cluster.py ``plan_threads``); ``sleep_mode``: see :class:`RolloutWorker`;
        ``on_restart(i)``: gives restarted worker i the weights the others hold."""
        self.cfg = cfg
        self.resources = resources or (cfg.num_cpus_per_worker, cfg.num_gpus_per_worker)
        self.threads = threads or [None] * cfg.num_workers
        self.cpus = cpus or [None] * cfg.num_workers
        self.sleep_mode = sleep_mode
        self.model_path, self.dtype, self.placement = model_path, dtype, placement
        self.workers = [self._spawn(i) for i in range(cfg.num_workers)]
        # called with a restarted worker's index: gives it the weights the others hold
        # (rollout/weight_sync.py WeightSync.restore); None: the model it starts with
        self.on_restart = on_restart
        self.restarts = 0  # workers restarted (rollout.max_restarts bounds it)
        self.regenerated = 0  # groups (whole or a share) lost with a worker and generated again
        self.generated = [0] * cfg.num_workers  # samples each worker sent back (a call's share)
        self._ready = [w.ready.remote() for w in self.workers]
        if wait:
            self.wait_ready()

    def _spawn(self, i: int):
        cfg = self.cfg
        return spawn_actor_group(
            RolloutWorker,
            1,
            cfg,
            self.model_path,
            self.dtype,
            self.threads[i],
            self.cpus[i],
            self.sleep_mode,
            num_cpus=self.resources[0],
            num_gpus=self.resources[1],
            placement=self.placement,
            first_bundle=i,
        )[0]

    def restart(self, i: int, why: str) -> None:
        """Replace dead worker ``i`` (same resources, same placement bundle) and give it the
        weights the other engines hold (:attr:`on_restart`). At most ``rollout.max_restarts``
        per run."""

        import ray

        if self.restarts >= self.cfg.max_restarts:
            raise ActorGroupError(f"{why}; rollout.max_restarts ({self.cfg.max_restarts}) reached")
        self.restarts += 1
        logger.warning("rollout worker %d died (%s): restarting it", i, why)
        with contextlib.suppress(Exception):
            ray.kill(self.workers[i])
        self.workers[i] = self._spawn(i)
        get([self.workers[i].ready.remote()], timeout_s=self.cfg.start_timeout_s,
            what=f"restarting rollout worker {i}")  # fmt: skip
        if self.on_restart is not None:
            self.on_restart(i)

    def _call_all(self, method: str, *args, what: str, workers: list[int] | None = None) -> dict:
        """``method(*args)`` on every worker (or ``workers``); one that died is restarted and
        asked again. Returns ``{worker: result}``."""
        todo = list(range(len(self.workers))) if workers is None else list(workers)
        out = {}
        while todo:
            settled = settle(
                {i: getattr(self.workers[i], method).remote(*args) for i in todo},
                timeout_s=self.cfg.timeout_s,
                what=what,
            )
            todo = []
            for i, result in settled.items():
                if isinstance(result, ActorDied):
                    self.restart(i, f"died in {what}")
                    todo.append(i)
                else:
                    out[i] = result
        return out

    def wait_ready(self) -> list[str]:
        """Wait (``rollout.start_timeout_s``) until every engine is up; returns their names and
        devices (:meth:`RolloutWorker.ready`)."""
        self.engines = get(
            self._ready, timeout_s=self.cfg.start_timeout_s, what="starting rollout workers"
        )
        return self.engines

    def generate(self, prompts: list[str], params: SamplingConfig | None = None) -> list[Group]:
        """Groups of ``params.n`` samples for each prompt, in prompt order (:meth:`stream`
        collected)."""
        done = dict(item for step in self.stream(prompts, params) for item in step)
        return [done[i] for i in range(len(prompts))]

    def stream(
        self, prompts: list[str], params: SamplingConfig | None = None
    ) -> Iterator[list[tuple[int, Group]]]:
        """The groups of ``prompts`` as the engines finish them: lists of ``(prompt index,
        group)``, each prompt once with its samples in order. The call's samples are spread over
        the workers in equal shares (rollout/shares.py ``split``: 1 prompt x 8 samples on 4
        workers is 2 samples each). With a seed s every worker's call is seeded with
        ``derive_seed(s, "worker", 0)`` (the name is from when each worker had a seed of its
        own: one-worker runs keep their samples) and sample j of prompt p draws from its own
        stream whoever generates it, so the groups do not depend on the number of workers. A
        worker that dies is restarted and its shares generated again with the same seeds; the
        pieces it had already sent stand, the rest follow. ``rollout.timeout_s`` bounds the
        whole call."""
        import ray

        params = params or self.cfg.sampling.params(n=self.cfg.n_samples)
        if params.seed is not None:
            params = dataclasses.replace(params, seed=derive_seed(params.seed, "worker", 0))
        plan = split(len(prompts), params.n, len(self.workers))
        calls = {i: shares for i, shares in enumerate(plan) if shares}
        texts = {i: [prompts[s.position] for s in shares] for i, shares in calls.items()}
        assembler = Assembler([s for shares in plan for s in shares])
        streams = {i: self._open_stream(i, texts[i], params, calls[i]) for i in calls}
        deadline = time.monotonic() + self.cfg.timeout_s
        while streams:
            ready, _ = ray.wait(
                list(streams.values()), num_returns=1, timeout=max(0.0, deadline - time.monotonic())
            )
            if not ready:
                for gen in streams.values():
                    with contextlib.suppress(Exception):
                        ray.cancel(gen)
                raise ActorGroupError(
                    f"rollout generation: no answer within {self.cfg.timeout_s:.0f} s"
                )
            i = next(i for i, gen in streams.items() if gen is ready[0])
            try:
                pieces = ray.get(next(streams[i]))
            except StopIteration:
                del streams[i]
                continue
            except RayActorError as err:
                del streams[i]
                self.restart(i, f"rollout generation: an actor died ({type(err).__name__}: {err})")
                self.regenerated += len(calls[i])
                # the whole call again (the same batch, so the same numbers); pieces already
                # received are dropped by the assembler
                pieces = list(enumerate(self._generate_on(i, texts[i], params, calls[i])))
            self.generated[i] += sum(len(piece.samples) for _, piece in pieces)
            whole = [(calls[i][k].position, assembler.add(calls[i][k], g)) for k, g in pieces]
            done = [(p, group) for p, group in whole if group is not None]
            if done:
                yield done

    def _open_stream(self, i: int, prompts: list[str], params: SamplingConfig, shares):
        return (
            self.workers[i]
            .generate_stream.options(num_returns="streaming")
            .remote(prompts, params, shares)
        )

    def _generate_on(
        self, i: int, prompts: list[str], params: SamplingConfig, shares: list[Share]
    ) -> list[Group]:
        """Worker ``i``'s call in one piece (after a restart), restarting it again if it dies."""
        while True:
            result = settle({i: self.workers[i].generate.remote(prompts, params, shares)},
                            timeout_s=self.cfg.timeout_s, what="rollout generation")[i]  # fmt: skip
            if not isinstance(result, ActorDied):
                return result
            self.restart(i, str(result))

    def load_weights(self, buckets: list, version: int, workers: list[int] | None = None) -> None:
        """Every engine (or ``workers``) loads the weights whose buckets' refs are given
        (rollout/weight_sync.py); a worker that died meanwhile is restarted and loads them."""
        self._call_all("load_weights", buckets, version, workers=workers,
                       what=f"weight sync (version {version})")  # fmt: skip

    def load_file(self, path: str, version: int, workers: list[int] | None = None) -> None:
        """Every engine (or ``workers``) loads the weights file at ``path`` on their node."""
        self._call_all("load_file", path, version, workers=workers,
                       what=f"weight sync (version {version})")  # fmt: skip

    def node_ids(self) -> list[str]:
        """The node each worker runs on."""
        return list(self._call_all("node_id", what="node ids").values())

    def check_alive(self) -> None:
        """Restart any worker that died since the last call."""
        self._call_all("policy_version", what="a liveness check")

    # the collective transport's calls (rollout/weight_sync.py): refs it waits on with the learner's

    def weight_sync_ranks(self) -> list[int]:
        """Per worker, its processes in the sync group (its tensor-parallel size)."""
        return get([w.weight_sync_ranks.remote() for w in self.workers],
                   timeout_s=self.cfg.timeout_s, what="engine ranks")  # fmt: skip

    def open_weight_group(self, group, first_ranks: list[int], specs) -> list:
        return [
            w.open_weight_group.remote(group, first, specs)
            for w, first in zip(self.workers, first_ranks, strict=True)
        ]

    def receive_weights(self, version: int) -> list:
        return [w.receive_weights.remote(version) for w in self.workers]

    def sleep(self) -> None:
        """Every engine releases its device memory (vLLM sleep mode; colocated on GPUs)."""
        get([w.sleep.remote() for w in self.workers], timeout_s=self.cfg.timeout_s, what="sleep")

    def wake_up(self, tags: list[str] | None = None) -> None:
        """``tags``: what to wake (vLLM's "weights", "kv_cache"); None: everything."""
        get([w.wake_up.remote(tags) for w in self.workers], timeout_s=self.cfg.timeout_s,
            what="wake")  # fmt: skip

    def policy_versions(self) -> list[int]:
        return get(
            [w.policy_version.remote() for w in self.workers],
            timeout_s=self.cfg.timeout_s,
            what="policy versions",
        )

    def weights_checksums(self) -> list[tuple[float, float]]:
        """Per engine, (sum, sum of squares) of its weights: equal to the learner's
        (comm/weight_protocol.py ``checksum`` of its export) after a sync."""
        return get([w.weights_checksum.remote() for w in self.workers],
                   timeout_s=self.cfg.timeout_s, what="weight checksums")  # fmt: skip

    def score(self, prompt_ids: list[int], response_ids: list[int], worker: int = 0) -> list[float]:
        return get(
            [self.workers[worker].score.remote(prompt_ids, response_ids)],
            timeout_s=self.cfg.timeout_s,
            what="scoring",
        )[0]

    def shutdown(self) -> None:
        import ray

        for w in self.workers:
            ray.kill(w)
        self.workers = []
