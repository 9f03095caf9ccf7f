"""Weights handed between processes on one node as a safetensors file in shared memory: the
writer copies each tensor's bytes once into the file, the reader maps the file and gets views
(no copy until the engine copies them into its parameters). What crosses the process boundary
is the path, not the bytes (the object-store sync into vLLM's engine core: rollout/vllm_engine.py).

The layout is safetensors' own (an 8-byte little-endian header length, a JSON header of
``{name: {dtype, shape, data_offsets}}`` padded with spaces to 8 bytes, then the tensors back to
back), so ``safetensors.torch.load_file`` reads what :func:`write_weights` wrote and
:func:`read_weights` reads safetensors' files. Imports no Ray.

>>> import tempfile, os
>>> t = {"w": torch.tensor([[1.5, -2.0]], dtype=torch.bfloat16), "b": torch.arange(3.0)}
>>> path = os.path.join(tempfile.mkdtemp(), "w.safetensors")
>>> write_weights(path, t.items())  # 2 bf16 values (4 B) + 3 fp32 values (12 B)
16
>>> [(n, x.dtype, x.tolist()) for n, x in read_weights(path)]
[('w', torch.bfloat16, [[1.5, -2.0]]), ('b', torch.float32, [0.0, 1.0, 2.0])]
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import struct
import tempfile
from collections.abc import Iterable, Iterator

import torch

from comm.orphans import orphans

DTYPES = {
    torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
    torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8",
    torch.uint8: "U8", torch.bool: "BOOL",
}  # fmt: skip
TORCH_DTYPES = {v: k for k, v in DTYPES.items()}
SHM = "/dev/shm"
PREFIX = "avspo-weights-"  # then <pid>-<version>.safetensors (comm/orphans.py)


def write_weights(path: str, tensors: Iterable[tuple[str, torch.Tensor]]) -> int:
    """Write ``(name, tensor)`` pairs as a safetensors file at ``path``, in their order; returns
    the bytes of tensor data. The tensors are held until written (the header comes first)."""
    items = [(name, t.detach().to("cpu").contiguous()) for name, t in tensors]
    specs = [(name, t.dtype, tuple(t.shape)) for name, t in items]
    return write_stream(path, specs, items)


def write_stream(
    path: str,
    specs: list[tuple[str, torch.dtype, tuple[int, ...]]],
    tensors: Iterable[tuple[str, torch.Tensor]],
) -> int:
    """Write a safetensors file whose header comes from ``specs`` (name, dtype, shape), then each
    of ``tensors`` as it arrives (ZeRO-3 gathers one bucket at a time: none is held after its
    write); they must come in ``specs``' order. A file already at ``path`` with the same layout
    is overwritten in place, not truncated: on /dev/shm its pages stay allocated, so a rewrite
    runs at memory speed (no page faults). Returns the bytes of tensor data.

    >>> import tempfile, os
    >>> path = os.path.join(tempfile.mkdtemp(), "w.safetensors")
    >>> specs = [("a", torch.float32, (2,))]
    >>> write_stream(path, specs, [("a", torch.tensor([1.0, 2.0]))])
    8
    >>> size = os.path.getsize(path)
    >>> write_stream(path, specs, [("a", torch.tensor([3.0, 4.0]))]), os.path.getsize(path) == size
    (8, True)
    >>> [t.tolist() for _, t in read_weights(path)]
    [[3.0, 4.0]]
    """
    header, offset = {}, 0
    for name, dtype, shape in specs:
        if dtype not in DTYPES:
            raise ValueError(f"{name}: dtype {dtype} has no safetensors name")
        size = math.prod(shape) * dtype.itemsize
        header[name] = {"dtype": DTYPES[dtype], "shape": list(shape),
                        "data_offsets": [offset, offset + size]}  # fmt: skip
        offset += size
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    total = 8 + len(text) + offset
    same = os.path.exists(path) and os.path.getsize(path) == total
    with open(path, "r+b" if same else "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for (name, dtype, shape), (got, t) in zip(specs, tensors, strict=True):
            t = t.detach().to("cpu").contiguous()
            if got != name or t.dtype != dtype or tuple(t.shape) != tuple(shape):
                raise ValueError(f"{got}: expected {name} {dtype} {tuple(shape)}, got "
                                 f"{t.dtype} {tuple(t.shape)}")  # fmt: skip
            if t.numel():
                f.write(t.reshape(-1).view(torch.uint8).numpy())  # the one copy
    return offset


def read_weights(path: str) -> Iterator[tuple[str, torch.Tensor]]:
    """``(name, tensor)`` of a safetensors file, in file order: views of the mapped file (read
    only as they are used; a tensor whose offset does not suit its dtype is copied)."""
    with open(path, "rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(length))
    header.pop("__metadata__", None)
    size = os.path.getsize(path)
    data = torch.from_file(path, shared=False, size=size, dtype=torch.uint8)[8 + length :]
    entries = sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0])
    for name, entry in entries:
        dtype = TORCH_DTYPES[entry["dtype"]]
        begin, end = entry["data_offsets"]
        raw = data[begin:end]
        if (8 + length + begin) % dtype.itemsize:
            raw = raw.clone()
        yield name, raw.view(dtype).reshape(entry["shape"])


def weights_dir(nbytes: int) -> str:
    """Where a weights file of ``nbytes`` goes: /dev/shm when it has room for it (memory speed),
    else the temp folder (e.g. Docker's default 64 MiB /dev/shm: docker/ raises it)."""
    writable = os.path.isdir(SHM) and os.access(SHM, os.W_OK)
    if writable and shutil.disk_usage(SHM).free > nbytes + (64 << 20):
        return SHM
    return tempfile.gettempdir()


def remove_stale(folder: str | None = None) -> list[str]:
    """Remove the weight files (``avspo-weights-<pid>-<version>.safetensors``) whose writing
    process is gone (an engine killed between writing and removing one); returns their paths."""
    removed = []
    for where in [folder] if folder else [SHM, tempfile.gettempdir()]:
        for path in orphans(where, PREFIX):
            with contextlib.suppress(OSError):
                path.unlink()
                removed.append(str(path))
    return removed
