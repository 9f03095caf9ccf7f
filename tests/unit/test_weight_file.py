"""comm/weight_file.py: weights as a safetensors file in shared memory (the object-store sync
into vLLM's engine core), read back as views of the mapped file."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import namedtuple

import pytest
import torch
from safetensors.torch import load_file, save_file

from comm import weight_file
from comm.weight_file import read_weights, remove_stale, weights_dir, write_weights


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
    assert weights_dir(1 << 20) == weight_file.tempfile.gettempdir()
    monkeypatch.setattr(weight_file.shutil, "disk_usage", lambda p: usage(0, 0, 2 << 30))
    assert weights_dir(1 << 20) == "/dev/shm"


def test_files_of_dead_writers_are_removed_and_live_ones_kept(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    names = [f"avspo-weights-{dead}-3.safetensors", f"avspo-weights-{os.getpid()}-4.safetensors",
             "avspo-weights-x-1.safetensors", "other.bin"]  # fmt: skip
    for name in names:
        (tmp_path / name).write_bytes(b"")
    assert remove_stale(str(tmp_path)) == [str(tmp_path / names[0])]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(names[1:])
