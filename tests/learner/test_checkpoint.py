"""Learner checkpoints: a save/load round trip continues bit-exactly; bad `latest` is an error."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch

from learner import checkpoint
from learner.advantage_stage import AdvantageStage
from learner.config import AlgorithmConfig, LearnerConfig
from learner.group import LearnerGroup
from learner.trigger import TriggerConfig
from tests.helpers import train_batch


@pytest.mark.slow
@pytest.mark.parametrize("stage, dtype", [(2, "float32"), (3, "bfloat16")])
def test_round_trip_continues_bit_exactly(ray_cluster, tiny_model_dir, tmp_path, stage, dtype):
    """bf16 with dithered masters (learner/bf16_masters.py): the resumed group draws its own
    dither (another seed) at start, and the checkpoint's masters replace it: bit-exact too."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    _, first = train_batch(model, seed=1)
    _, second = train_batch(model, seed=2)
    cfg = LearnerConfig(
        num_ranks=2, zero_stage=stage, lr=1e-3, micro_batch_size=4, warmup_steps=3, timeout_s=600,
        bf16_masters="dither", seed=0,
    )  # fmt: skip
    algorithm = AlgorithmConfig(trigger=TriggerConfig(policy="adaptive", eta=0.5))
    root = tmp_path / "checkpoints"

    stage = AdvantageStage(algorithm, reward_range=(0.0, 1.0), seed=0)  # the driver's
    stage(torch.tensor([1.0, 1.0, 0.0, 1.0]), torch.tensor([0, 0, 1, 1]))  # trigger state
    stage(torch.tensor([1.0, 1.0, 1.0, 1.0]), torch.tensor([0, 0, 1, 1]))
    a = LearnerGroup(cfg, algorithm.loss, tiny_model_dir, dtype=dtype)
    try:
        a.train_on(first)
        sidecar = {"advantage_stage": stage.state_dict(), "extra": {"data_position": 17}}
        path = a.save_checkpoint(str(root), step=1, state=sidecar)
        continued = a.train_on(second)
        expected = a.export_weights()
    finally:
        a.shutdown()

    assert checkpoint.resolve("auto", root) == root / "step_000001"
    saved = AutoModelForCausalLM.from_pretrained(f"{path}/model", dtype=torch.float32)
    assert saved.config.vocab_size == model.config.vocab_size  # transformers loads it

    b = LearnerGroup(replace(cfg, seed=1), algorithm.loss, tiny_model_dir, dtype=dtype)
    try:
        state = b.load_checkpoint(path)
        resumed = b.train_on(second)
        got = b.export_weights()
    finally:
        b.shutdown()
    assert state["step"] == 1 and state["extra"] == {"data_position": 17}
    restored = AdvantageStage(algorithm, reward_range=(0.0, 1.0), seed=0)
    restored.load_state_dict(state["advantage_stage"])
    assert (
        restored.state.trigger.state_dict() == stage.state.trigger.state_dict()
    )  # threshold restored
    assert resumed["actor/lr"] == continued["actor/lr"]  # scheduler restored (warmup 2/3)
    for k in expected:
        assert torch.equal(expected[k], got[k]), k  # optimizer moments restored: bit-exact


def test_latest_pointing_nowhere_or_partial_is_an_error(tmp_path):
    root = tmp_path / "ckpt"
    assert checkpoint.resolve("auto", root) is None  # nothing yet: a fresh run
    root.mkdir()
    (root / "latest").write_text("step_000005")
    with pytest.raises(checkpoint.CheckpointError, match="does not exist"):
        checkpoint.resolve("auto", root)
    partial = root / "step_000005"
    (partial / "model").mkdir(parents=True)
    with pytest.raises(checkpoint.CheckpointError, match="incomplete"):
        checkpoint.resolve("auto", root)
    with pytest.raises(checkpoint.CheckpointError, match="does not exist"):
        checkpoint.resolve(str(tmp_path / "nope"), root)


def _staged(root, step: int):
    """A staged checkpoint as the layout has it (bytes instead of real weights)."""
    tmp = checkpoint.staging_dir(root, step)
    (tmp / "model").mkdir()
    (tmp / "model" / "config.json").write_text("{}")
    (tmp / "model" / "model.safetensors").write_bytes(b"w" * 64)
    (tmp / "deepspeed").mkdir()
    (tmp / "deepspeed" / "optim.pt").write_bytes(bytes(range(100)))
    return tmp


def _fake(root, step: int) -> str:
    return str(checkpoint.commit(root, step, _staged(root, step), {"step": step}))


def test_a_changed_byte_an_extra_file_or_no_manifest_is_refused_naming_it(tmp_path):
    root = tmp_path / "ckpt"
    folder = tmp_path / "ckpt" / "step_000001"
    assert _fake(root, 1) == str(folder)
    assert checkpoint.resolve("auto", root) == folder  # verified
    data = bytearray((folder / "deepspeed" / "optim.pt").read_bytes())
    data[50] ^= 1  # one bit of one byte
    (folder / "deepspeed" / "optim.pt").write_bytes(bytes(data))
    with pytest.raises(checkpoint.CheckpointError, match=r"deepspeed/optim.pt does not match"):
        checkpoint.resolve("auto", root)
    data[50] ^= 1
    (folder / "deepspeed" / "optim.pt").write_bytes(bytes(data))
    checkpoint.resolve("auto", root)  # restored: fine again
    (folder / "deepspeed" / "extra.pt").write_bytes(b"x")
    with pytest.raises(checkpoint.CheckpointError, match=r"not in its manifest: \['deepspeed/"):
        checkpoint.resolve("auto", root)
    (folder / "deepspeed" / "extra.pt").unlink()
    (folder / checkpoint.MANIFEST).unlink()
    with pytest.raises(checkpoint.CheckpointError, match="has no manifest.json"):
        checkpoint.resolve("auto", root)


def test_retention_keeps_the_newest_and_stale_partials_are_cleaned(tmp_path):
    root = tmp_path / "ckpt"
    for step in range(1, 6):
        _fake(root, step)
        removed = checkpoint.retain(root, keep=2)
        assert removed == ([] if step <= 2 else [f"step_{step - 2:06d}"])
    assert [p.name for p in checkpoint.checkpoints(root)] == ["step_000004", "step_000005"]
    assert (root / "latest").read_text() == "step_000005"
    assert checkpoint.retain(root, keep=None) == []  # null keeps everything
    checkpoint.staging_dir(root, 6)  # a write that crashed
    (root / ".latest.tmp").write_text("step_000006")
    assert checkpoint.clean_stale(root) == [".latest.tmp", ".tmp-step_000006"]
    assert sorted(p.name for p in root.iterdir()) == ["latest", "step_000004", "step_000005"]


def test_a_failed_write_leaves_the_previous_checkpoint_loadable(tmp_path, monkeypatch):
    """A full disk while the manifest is written (the last file): the commit fails, latest
    still names step 1, which verifies; and the space check refuses before writing at all."""
    root = tmp_path / "ckpt"
    _fake(root, 1)

    def full(folder):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(checkpoint, "write_manifest", full)
    tmp = _staged(root, 2)
    with pytest.raises(OSError, match="No space left"):
        checkpoint.commit(root, 2, tmp, {"step": 2})
    monkeypatch.undo()
    assert checkpoint.resolve("auto", root) == root / "step_000001"
    size = checkpoint.size(root / "step_000001")  # 2 + 64 + 100 + state + manifest bytes
    monkeypatch.setattr(
        checkpoint.shutil, "disk_usage", lambda p: type("U", (), {"free": size - 1})()
    )
    with pytest.raises(checkpoint.CheckpointError, match="not enough space"):
        checkpoint.check_space(root, size)


class _Planted:
    """What an attacker's pickle does when loaded without weights_only: runs code."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        import pathlib

        return (pathlib.Path.touch, (pathlib.Path(self.marker),))


@pytest.mark.slow
def test_a_checkpoint_with_code_in_its_pickles_is_refused(ray_cluster, tiny_model_dir, tmp_path):
    """An optimizer file replaced by a pickle that runs code (and the manifest rewritten to
    match, as whoever controls the folder could): the weights-only loader refuses it, names the
    global it would have called, and the code never runs."""
    from learner.loss import LossConfig

    cfg = LearnerConfig(num_ranks=1, zero_stage=2, timeout_s=300)
    group = LearnerGroup(cfg, LossConfig(), tiny_model_dir)
    try:
        folder = group.save_checkpoint(str(tmp_path / "ckpt"), 1, {})
        optim = next((tmp_path / "ckpt").rglob("*optim_states.pt"))
        marker = tmp_path / "pwned"
        torch.save({"optimizer_state_dict": _Planted(str(marker))}, optim)
        (Path(folder) / checkpoint.MANIFEST).unlink()
        checkpoint.write_manifest(Path(folder))
        with pytest.raises(Exception, match="refused by the weights-only loader") as err:
            group.load_checkpoint(folder)
    finally:
        group.shutdown()
    assert "Unsupported global" in str(err.value)  # the pickle's callable (here getattr)
    assert not marker.exists()
