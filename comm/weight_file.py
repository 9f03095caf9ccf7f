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
    header, offset = {}, 0
    for name, t in items:
        if t.dtype not in DTYPES:
            raise ValueError(f"{name}: dtype {t.dtype} has no safetensors name")
        size = t.numel() * t.element_size()
        header[name] = {"dtype": DTYPES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + size]}  # fmt: skip
        offset += size
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for _, t in items:
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
