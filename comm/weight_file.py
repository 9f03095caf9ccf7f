"""Weights handed between processes on one node as a safetensors file in shared memory: the
writer copies each tensor's bytes once into the file, the reader maps the file and gets views
(no copy until the engine copies them into its parameters). What crosses the process boundary
is the path, not the bytes (the object-store sync into vLLM's engine core: rollout/vllm_engine.py).

The layout is safetensors' own (an 8-byte little-endian header length, a JSON header of
``{name: {dtype, shape, data_offsets}}`` padded with spaces to 8 bytes, then the tensors back to
back), so ``safetensors.torch.load_file`` reads what :func:`write_weights` wrote and
:func:`read_weights` reads safetensors' files. Imports no Ray.

/dev/shm is writable by every user, so a name there that another user can guess is a name that
user can plant first (a file of the right size that then became the engine's weights, a
symlink that made root write through it). Each writing process therefore makes one private
folder (mode 0700, random name: :func:`weights_dir`) and its files in it; new files are made
with ``O_CREAT | O_EXCL | O_NOFOLLOW``, a rewrite in place opens only a regular file of this
user with one link, and the reader follows no symlink either.

>>> import tempfile, os
>>> t = {"w": torch.tensor([[1.5, -2.0]], dtype=torch.bfloat16), "b": torch.arange(3.0)}
>>> path = os.path.join(tempfile.mkdtemp(), "w.safetensors")
>>> write_weights(path, t.items())  # 2 bf16 values (4 B) + 3 fp32 values (12 B)
16
>>> [(n, x.dtype, x.tolist()) for n, x in read_weights(path)]
[('w', torch.bfloat16, [[1.5, -2.0]]), ('b', torch.float32, [0.0, 1.0, 2.0])]
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import json
import logging
import math
import mmap
import os
import shutil
import stat
import struct
import tempfile
from collections.abc import Iterable, Iterator

import torch

from comm.orphans import orphans

logger = logging.getLogger(__name__)

DTYPES = {
    torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
    torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8",
    torch.uint8: "U8", torch.bool: "BOOL",
}  # fmt: skip
TORCH_DTYPES = {v: k for k, v in DTYPES.items()}
SHM = "/dev/shm"
PREFIX = "avspo-weights-"  # a writer's private folder: <PREFIX><pid>-<random> (comm/orphans.py)
_OPEN = os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
_folders: dict[tuple[int, str], str] = {}  # (pid, /dev/shm or the temp folder): its own folder


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
    runs at memory speed (no page faults). That is only done to a regular file of this user with
    one link; a symlink at ``path``, or another user's file, is an error (``O_NOFOLLOW``), and a
    new file is made with ``O_EXCL``. Returns the bytes of tensor data.

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
    with _open_for_writing(path, total) as f:
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
    fd = os.open(path, os.O_RDONLY | _OPEN)  # a symlink: ELOOP
    try:
        size = _regular(fd, path).st_size
        with os.fdopen(os.dup(fd), "rb") as f:
            (length,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(length))
        # the opened file itself, mapped copy-on-write (what torch.from_file(shared=False) did
        # by path): the tensors keep the mapping alive
        mapped = mmap.mmap(fd, size, access=mmap.ACCESS_COPY)
    finally:
        os.close(fd)
    header.pop("__metadata__", None)
    data = torch.frombuffer(mapped, dtype=torch.uint8)[8 + length :]
    entries = sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0])
    for name, entry in entries:
        dtype = TORCH_DTYPES[entry["dtype"]]
        begin, end = entry["data_offsets"]
        raw = data[begin:end]
        if (8 + length + begin) % dtype.itemsize:
            raw = raw.clone()
        yield name, raw.view(dtype).reshape(entry["shape"])


def _regular(fd: int, path: str) -> os.stat_result:
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        raise OSError(errno.EINVAL, "not a regular file", path)
    return st


@contextlib.contextmanager
def _open_for_writing(path: str, total: int):
    """``path`` opened for writing ``total`` bytes from its start: a new file (``O_EXCL``: never
    one that someone else made, ``O_NOFOLLOW``: never through a symlink), or this user's own
    regular file with one link, kept when it has ``total`` bytes (rewritten in place) and
    truncated otherwise."""
    flags = os.O_WRONLY | _OPEN
    try:
        fd = os.open(path, flags | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        fd = os.open(path, flags)  # a symlink planted at the path: ELOOP
        try:
            st = _regular(fd, path)
            if st.st_uid != os.geteuid() or st.st_nlink != 1:
                why = f"not this user's own file (owner {st.st_uid}, {st.st_nlink} links)"
                raise OSError(errno.EPERM, why, path)
            if st.st_size != total:
                os.ftruncate(fd, 0)
        except BaseException:
            os.close(fd)
            raise
    with os.fdopen(fd, "wb") as f:  # an open descriptor: fdopen truncates nothing
        yield f


def weights_base(nbytes: int) -> str:
    """Where the folder of a weights file of ``nbytes`` goes: /dev/shm when it has room for it
    (memory speed), else the temp folder (e.g. Docker's default 64 MiB /dev/shm: docker/ raises
    it), said once per process in one warning line (:func:`shm_warning`): a disk write of the
    whole model at every sync (15.2 GB for a 7B model in bf16) is slow."""
    writable = os.path.isdir(SHM) and os.access(SHM, os.W_OK)
    usage = shutil.disk_usage(SHM) if writable else None
    if usage is not None and usage.free > nbytes + SHM_SPARE:
        return SHM
    base = tempfile.gettempdir()
    if base not in _warned:
        _warned.add(base)
        logger.warning(shm_warning(nbytes, usage, base))
    return base


SHM_SPARE = 64 << 20  # left free in /dev/shm for everyone else (NCCL, Ray's small objects)
_warned: set[str] = set()  # the fallback folders this process has warned of


def shm_warning(nbytes: int, usage, base: str) -> str:
    """The line that says a weights file goes to disk: why (``usage``: /dev/shm's
    ``shutil.disk_usage``, None where it is missing or not writable), where, and the room
    /dev/shm would need.

    >>> from collections import namedtuple
    >>> shm = namedtuple("usage", "total used free")(8e9, 1e9, 7e9)  # Docker's shm_size: 8gb
    >>> shm_warning(15_200_000_000, shm, "/tmp")  # doctest: +NORMALIZE_WHITESPACE
    'the weights file (15.2 GB) goes to /tmp (disk), written at every weight sync: it does not
    fit /dev/shm (7.0 GB free of 8.0 GB); give /dev/shm at least 15.3 GB free (Docker: shm_size)'
    """
    if usage is None:
        why = "/dev/shm is missing or not writable"
    else:
        free, total = usage.free / 1e9, usage.total / 1e9
        why = f"it does not fit /dev/shm ({free:.1f} GB free of {total:.1f} GB)"
    return (f"the weights file ({nbytes / 1e9:.1f} GB) goes to {base} (disk), written at every "
            f"weight sync: {why}; give /dev/shm at least {(nbytes + SHM_SPARE) / 1e9:.1f} GB "
            "free (Docker: shm_size)")  # fmt: skip


def weights_dir(nbytes: int) -> str:
    """This process's private folder for a weights file of ``nbytes`` (in :func:`weights_base`):
    made once (mode 0700, ``avspo-weights-<pid>-<random>``, so that :func:`remove_stale` can
    tell when its writer is gone), again if it went, and removed when the process exits (or by
    :func:`remove_weights` once its last file went)."""
    base, pid = weights_base(nbytes), os.getpid()
    folder = _folders.get((pid, base))
    if folder is None or not _own_private(folder):
        folder = tempfile.mkdtemp(prefix=f"{PREFIX}{pid}-", dir=base)  # mode 0700
        _folders[(pid, base)] = folder
    return folder


def _own_private(folder: str) -> bool:
    try:
        st = os.lstat(folder)
    except FileNotFoundError:
        return False
    mode = stat.S_IMODE(st.st_mode)
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and not mode & 0o077


@atexit.register
def _remove_own() -> None:
    for (pid, _), folder in _folders.items():
        if pid == os.getpid() and _own_private(folder):  # a forked child's: not its parent's
            shutil.rmtree(folder, ignore_errors=True)


def remove_weights(path: str) -> None:
    """Remove the weights file at ``path``, and its folder when that is this process's own
    :func:`weights_dir` and now empty (the next file gets a new one)."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    folder = os.path.dirname(path)
    for key, own in list(_folders.items()):
        if own == folder and key[0] == os.getpid():
            with contextlib.suppress(OSError):  # not empty: kept
                os.rmdir(folder)
                del _folders[key]


def remove_stale(folder: str | None = None) -> list[str]:
    """Remove the weights folders (``avspo-weights-<pid>-<random>``, with their files; from
    older versions also files ``avspo-weights-<pid>-<version>.safetensors``) whose writing
    process is gone (killed between writing and removing its file), when they are this user's;
    a symlink of such a name is removed, never followed. Returns their paths."""
    removed = []
    for where in [folder] if folder else [SHM, tempfile.gettempdir()]:
        for path in orphans(where, PREFIX):
            with contextlib.suppress(OSError):
                st = path.lstat()
                if st.st_uid != os.geteuid():
                    continue  # another user's: not this user's to judge
                if stat.S_ISDIR(st.st_mode):  # lstat: a symlink is no folder
                    shutil.rmtree(path)
                else:
                    path.unlink()
                removed.append(str(path))
    return removed
