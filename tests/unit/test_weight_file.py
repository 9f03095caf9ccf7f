"""comm/weight_file.py: weights as a safetensors file in shared memory (the object-store sync
into vLLM's engine core), read back as views of the mapped file."""

from __future__ import annotations

import contextlib
import os
import stat
import subprocess
import sys
from collections import namedtuple

import pytest
import torch
from safetensors.torch import load_file, save_file

from comm import weight_file
from comm.weight_file import (
    read_weights,
    remove_stale,
    weights_base,
    weights_dir,
    write_weights,
)
from tests.helpers import ROOT


def tensors() -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    return {
        # 3 bf16 values = 6 bytes: the fp32 tensor after it starts at an offset no multiple of 4
        "odd_bf16": torch.randn(3, dtype=torch.bfloat16),
        "w": torch.randn(4, 5),
        "scalar": torch.tensor(2.5),
        "empty": torch.empty(0, 3),
        "ids": torch.arange(4, dtype=torch.int64),
        "mask": torch.tensor([True, False]),
        "view": torch.randn(6, 4).t(),  # not contiguous
    }


def test_safetensors_reads_what_we_write_bit_for_bit(tmp_path):
    src = tensors()
    nbytes = write_weights(str(tmp_path / "w"), src.items())
    # 6 + 80 + 4 + 0 + 32 + 2 + 96 bytes of data
    assert nbytes == 220
    back = load_file(str(tmp_path / "w"))
    assert list(back) == list(src)  # order kept: offsets in the order given
    for name, t in src.items():
        assert back[name].dtype == t.dtype and torch.equal(back[name], t), name


def test_we_read_what_safetensors_writes_bit_for_bit(tmp_path):
    src = {k: v.contiguous() for k, v in tensors().items()}
    save_file(src, str(tmp_path / "w"))
    back = dict(read_weights(str(tmp_path / "w")))
    assert set(back) == set(src)
    for name, t in src.items():
        assert back[name].dtype == t.dtype and back[name].shape == t.shape, name
        assert torch.equal(back[name], t), name


def test_read_tensors_are_views_of_the_file_not_copies(tmp_path):
    write_weights(str(tmp_path / "w"), [("a", torch.ones(1024)), ("b", torch.zeros(8))])
    got = dict(read_weights(str(tmp_path / "w")))
    # both map one storage (the file), 4,096 bytes apart: no tensor was copied out
    assert got["a"].untyped_storage().data_ptr() == got["b"].untyped_storage().data_ptr()
    assert got["b"].data_ptr() - got["a"].data_ptr() == 1024 * 4


def test_an_unknown_dtype_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="c: dtype torch.complex64"):
        write_weights(str(tmp_path / "w"), [("c", torch.zeros(2, dtype=torch.complex64))])


def test_weights_go_to_shm_when_it_has_room_else_the_temp_folder(monkeypatch):
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(weight_file.os.path, "isdir", lambda p: True)
    monkeypatch.setattr(weight_file.os, "access", lambda p, mode: True)
    monkeypatch.setattr(weight_file.shutil, "disk_usage", lambda p: usage(0, 0, 64 << 20))
    # Docker's default /dev/shm (64 MiB) cannot hold 1 MiB plus the 64 MiB left to others
    assert weights_base(1 << 20) == weight_file.tempfile.gettempdir()
    monkeypatch.setattr(weight_file.shutil, "disk_usage", lambda p: usage(0, 0, 2 << 30))
    assert weights_base(1 << 20) == "/dev/shm"


def test_a_weights_file_that_does_not_fit_shm_is_said_once_in_one_line(monkeypatch, caplog):
    """Issue 62: a 7B model's bf16 weights (15.2 GB) in Docker's shm_size 8gb went to disk at
    every sync without a word. Now one warning line per process says so, with the room needed;
    a file that fits says nothing."""
    import logging

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(weight_file, "_warned", set())
    monkeypatch.setattr(weight_file.os.path, "isdir", lambda p: True)
    monkeypatch.setattr(weight_file.os, "access", lambda p, mode: True)
    monkeypatch.setattr(weight_file.shutil, "disk_usage", lambda p: usage(8e9, 1e9, 7e9))
    with caplog.at_level(logging.WARNING, logger="comm.weight_file"):
        assert weights_base(2_000_000_000) == "/dev/shm"  # a 1B model in bf16 fits: silent
        assert caplog.records == []
        for _ in range(3):  # every sync of the run
            assert weights_base(15_200_000_000) == weight_file.tempfile.gettempdir()
    (record,) = caplog.records
    said = record.getMessage()
    assert "\n" not in said and record.levelno == logging.WARNING
    assert "weights file (15.2 GB)" in said and "7.0 GB free of 8.0 GB" in said
    assert "at least 15.3 GB" in said and "shm_size" in said


def test_files_of_dead_writers_are_removed_and_live_ones_kept(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    names = [f"avspo-weights-{dead}-3.safetensors", f"avspo-weights-{os.getpid()}-4.safetensors",
             "avspo-weights-x-1.safetensors", "other.bin"]  # fmt: skip
    for name in names:
        (tmp_path / name).write_bytes(b"")
    assert remove_stale(str(tmp_path)) == [str(tmp_path / names[0])]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(names[1:])


# Shared files (issue 58, section 5): /dev/shm is world-writable, so a name another user can
# guess is a name another user can plant first.


def test_the_writer_refuses_a_symlink_planted_at_its_path(tmp_path):
    victim = tmp_path / "victim"
    victim.write_bytes(b"root's file")
    (tmp_path / "w").symlink_to(victim)
    with pytest.raises(OSError):
        write_weights(str(tmp_path / "w"), [("a", torch.ones(4))])
    assert victim.read_bytes() == b"root's file"  # not written through the link


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another user needs root")
def test_the_writer_rewrites_in_place_only_a_file_of_its_own(tmp_path):
    """A file already at the path is rewritten in place (memory speed) only when it is a regular
    file of this user with one link: one planted by another user (the engine would load what
    that user writes into it after us) or a hard link to someone else's file is refused."""
    specs, t = [("a", torch.float32, (4,))], torch.arange(4.0)
    write_weights(str(tmp_path / "w"), [("a", t)])  # the size the rewrite will have
    planted = tmp_path / "w"
    os.chown(planted, 65534, 65534)  # nobody's
    with pytest.raises(OSError):
        weight_file.write_stream(str(planted), specs, [("a", t + 1)])
    assert torch.equal(dict(read_weights(str(planted)))["a"], t)  # untouched
    os.chown(planted, os.getuid(), os.getgid())
    os.link(planted, tmp_path / "other")  # e.g. a hard link to a file that is not ours to write
    with pytest.raises(OSError):
        weight_file.write_stream(str(planted), specs, [("a", t + 1)])
    os.unlink(tmp_path / "other")
    weight_file.write_stream(str(planted), specs, [("a", t + 1)])  # its own file: in place
    assert torch.equal(dict(read_weights(str(planted)))["a"], t + 1)


def test_the_reader_refuses_a_symlink(tmp_path):
    write_weights(str(tmp_path / "real"), [("a", torch.ones(2))])
    (tmp_path / "w").symlink_to(tmp_path / "real")
    with pytest.raises(OSError):
        dict(read_weights(str(tmp_path / "w")))


def test_weights_dir_is_a_private_folder_of_this_process():
    """Not /dev/shm itself (mode 1777: anyone may plant a name there) but a folder made with a
    random name and mode 0700 inside it (or inside the temp folder), named after this process so
    that another writer's sweep (:func:`remove_stale`) can tell whether its writer is gone."""
    folder = weights_dir(1 << 20)
    st = os.lstat(folder)
    assert stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid()
    assert stat.S_IMODE(st.st_mode) == 0o700
    assert os.path.dirname(folder) in ("/dev/shm", weight_file.tempfile.gettempdir())
    assert os.path.basename(folder).startswith(f"avspo-weights-{os.getpid()}-")
    assert weights_dir(1 << 20) == folder  # made once per process


def test_a_writers_folder_goes_when_it_exits():
    code = "from comm.weight_file import weights_dir; print(weights_dir(1 << 20))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=ROOT).stdout.strip()  # fmt: skip
    assert os.path.basename(out).startswith("avspo-weights-") and not os.path.exists(out)


def _dead_pid() -> str:
    return subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip


def test_a_dead_writers_whole_folder_is_removed(tmp_path):
    dead = _dead_pid()
    folder = tmp_path / f"avspo-weights-{dead}-abc123"
    folder.mkdir(mode=0o700)
    (folder / "sync.safetensors").write_bytes(b"x" * 16)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "keep").write_bytes(b"")
    (tmp_path / f"avspo-weights-{dead}-link").symlink_to(elsewhere)  # the link goes, not its folder
    live = tmp_path / f"avspo-weights-{os.getpid()}-def456"
    live.mkdir(mode=0o700)
    assert sorted(remove_stale(str(tmp_path))) == sorted(
        [str(folder), str(tmp_path / f"avspo-weights-{dead}-link")]
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["elsewhere", live.name])
    assert (elsewhere / "keep").exists()


def test_the_engine_never_writes_at_the_old_predictable_name(tmp_path):
    """rollout/vllm_engine.py ``load_weights`` used to write ``/dev/shm/avspo-weights-<pid>-
    <version>.safetensors``: a symlink planted there made root write through it. The engine runs
    here with a stand-in for vLLM that reads the file it is given, as vLLM's workers do."""
    from rollout.vllm_engine import VLLMEngine

    got = {}

    class FakeLLM:
        def collective_rpc(self, method, args):
            (path,) = args
            got["path"], got["folder"] = path, os.lstat(os.path.dirname(path))
            got["weights"] = {n: t.clone() for n, t in read_weights(path)}
            return [0.0]

        def reset_prefix_cache(self):
            pass

    engine = VLLMEngine.__new__(VLLMEngine)
    engine.llm, engine.policy_version, engine.last_load = FakeLLM(), 0, {}
    victim = tmp_path / "victim"
    victim.write_bytes(b"root's file")
    planted = [
        os.path.join(base, f"avspo-weights-{os.getpid()}-7.safetensors")
        for base in {"/dev/shm", weight_file.tempfile.gettempdir()}
        if os.access(base, os.W_OK)
    ]
    try:
        for path in planted:
            os.symlink(victim, path)
        w = torch.arange(6.0).reshape(2, 3)
        engine.load_weights([{"w": w}], version=7)
    finally:
        for path in planted:  # (the old engine removed the link once loaded)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
    assert victim.read_bytes() == b"root's file"
    assert got["path"] not in planted and torch.equal(got["weights"]["w"], w)
    st = got["folder"]
    assert stat.S_IMODE(st.st_mode) == 0o700 and st.st_uid == os.getuid()
    assert os.path.dirname(os.path.dirname(got["path"])) in (
        "/dev/shm",
        weight_file.tempfile.gettempdir(),
    )
    assert not os.path.exists(os.path.dirname(got["path"]))  # removed once loaded, folder too
