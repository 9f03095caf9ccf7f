"""Checkpoint layout and atomic commit, shared by the learner group and the driver.

    <root>/step_000012/            one complete checkpoint
        model/                     HF folder (safetensors, config, tokenizer): transformers loads it
        deepspeed/                 DeepSpeed's own files (shards, optimizer, scheduler)
        state.json                 step, data position, RNG states, trigger and ACR monitor state
        manifest.json              sha256 and size of every other file, written last
    <root>/latest                  the name of the newest complete checkpoint, written last

A checkpoint is written into ``<root>/.tmp-step_000012``; when every part is there its manifest
is written, every file and folder is fsynced, the folder is renamed into place, and ``latest``
is replaced (write, fsync, rename, fsync of the root). So a crash or a full disk leaves either
the old ``latest`` or the new one, never a half checkpoint behind it, and the previous
checkpoints stay loadable. Before a load the manifest is checked file by file (a changed byte is
refused naming the file); resuming from a ``latest`` whose checkpoint is missing, incomplete or
corrupted is an error, never a silent fresh start. Retention (:func:`retain`) keeps the newest
``trainer.keep_checkpoints``; :func:`clean_stale` removes partial folders of crashed writes.

Nothing here uses pickle (the sidecar and manifest are JSON). DeepSpeed's own files are torch
pickles: :func:`safe_torch_load` loads them with ``weights_only=True`` and only the three
DeepSpeed classes they hold allowed.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

STATE = "state.json"
MANIFEST = "manifest.json"


class CheckpointError(RuntimeError):
    pass


def step_name(step: int) -> str:
    return f"step_{step:06d}"


def staging_dir(root: str | Path, step: int) -> Path:
    tmp = Path(root) / f".tmp-{step_name(step)}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    return tmp


def commit(root: str | Path, step: int, tmp: Path, state: dict) -> Path:
    """Write the sidecar and the manifest, fsync, rename ``tmp`` into place and point
    ``latest`` at it."""
    root = Path(root)
    (tmp / STATE).write_text(json.dumps(state))
    check_complete(tmp)
    write_manifest(tmp)
    _fsync_tree(tmp)
    final = root / step_name(step)
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    _fsync(root)
    pointer = root / ".latest.tmp"
    pointer.write_text(final.name)
    _fsync(pointer)
    os.replace(pointer, root / "latest")
    _fsync(root)
    return final


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(folder: Path) -> None:
    for path in sorted(folder.rglob("*"), reverse=True):  # files before their folders
        _fsync(path)
    _fsync(folder)


def _files(folder: Path) -> list[str]:
    return sorted(
        p.relative_to(folder).as_posix()
        for p in folder.rglob("*")
        if p.is_file() and p.name != MANIFEST
    )


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def write_manifest(folder: Path) -> None:
    files = {rel: {"sha256": _sha256(folder / rel), "bytes": (folder / rel).stat().st_size}
             for rel in _files(folder)}  # fmt: skip
    (folder / MANIFEST).write_text(json.dumps({"version": 1, "files": files}, indent=1))


def verify(folder: Path) -> None:
    """Every file listed in the manifest is there with its sha256, and nothing else is."""
    path = folder / MANIFEST
    if not path.exists():
        raise CheckpointError(
            f"checkpoint {folder} has no {MANIFEST} (not written by this trainer, or by a version "
            "before checkpoints had manifests): refusing to load it unverified"
        )
    files = json.loads(path.read_text())["files"]
    extra = sorted(set(_files(folder)) - set(files))
    if extra:
        raise CheckpointError(f"checkpoint {folder}: files not in its manifest: {extra[:5]}")
    for rel, want in files.items():
        f = folder / rel
        if not f.is_file():
            raise CheckpointError(f"checkpoint {folder}: {rel} is missing")
        if f.stat().st_size != want["bytes"] or _sha256(f) != want["sha256"]:
            raise CheckpointError(f"checkpoint {folder}: {rel} does not match its sha256")


def checkpoints(root: str | Path) -> list[Path]:
    """Committed checkpoint folders under ``root``, oldest first."""
    return sorted(p for p in Path(root).glob("step_*") if p.is_dir())


def retain(root: str | Path, keep: int | None) -> list[str]:
    """Delete all but the newest ``keep`` checkpoints (never the one ``latest`` names); None or
    0 keeps everything. Returns the names removed."""
    if not keep:
        return []
    pointer = Path(root) / "latest"
    latest = pointer.read_text().strip() if pointer.exists() else None
    old = [p for p in checkpoints(root)[:-keep] if p.name != latest]
    for p in old:
        shutil.rmtree(p)
    return [p.name for p in old]


def clean_stale(root: str | Path) -> list[str]:
    """Remove what crashed writes left behind (``.tmp-*`` folders, ``.latest.tmp``); call it
    only when no checkpoint is being written (at start)."""
    root = Path(root)
    stale = sorted([*root.glob(".tmp-*"), *root.glob(".latest.tmp")])
    for p in stale:
        shutil.rmtree(p) if p.is_dir() else p.unlink()
    return [p.name for p in stale]


def size(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def check_space(root: str | Path, need: int) -> None:
    """Raise before writing when ``root``'s filesystem has less than ``need`` bytes free."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(root).free
    if free < need:
        raise CheckpointError(
            f"not enough space for a checkpoint under {root}: ~{need / 2**30:.2f} GiB needed "
            f"(the last checkpoint's size), {free / 2**30:.2f} GiB free"
        )


SAFE_GLOBALS = (
    "deepspeed.runtime.fp16.loss_scaler.LossScaler",
    "deepspeed.runtime.zero.config.ZeroStageEnum",
    "deepspeed.utils.tensor_fragment.fragment_address",
)
"""The classes DeepSpeed's checkpoint files hold beyond tensors and plain containers (found by
loading ZeRO-2/3 checkpoints with weights_only=True)."""


def safe_torch_load(path, map_location=None):
    """``torch.load`` with ``weights_only=True``, allowing :data:`SAFE_GLOBALS` only: a file
    that needs anything else (code to run) is refused, naming it."""
    import importlib

    import torch

    allowed = []
    for name in SAFE_GLOBALS:
        module, _, attr = name.rpartition(".")
        allowed.append(getattr(importlib.import_module(module), attr))
    try:
        with torch.serialization.safe_globals(allowed):
            return torch.load(path, map_location=map_location, weights_only=True)
    except Exception as err:  # torch's UnpicklingError text names the global it refused
        lines = [x.strip() for x in str(err).splitlines() if "GLOBAL" in x or "Unsupported" in x]
        raise CheckpointError(
            f"{path}: refused by the weights-only loader ({lines[0] if lines else err})"
        ) from None


def check_complete(folder: Path) -> None:
    missing = [p for p in (STATE, "model/config.json", "deepspeed") if not (folder / p).exists()]
    if not any((folder / "model").glob("*.safetensors")):
        missing.append("model/*.safetensors")
    if missing:
        raise CheckpointError(f"checkpoint {folder} is incomplete: missing {missing}")


def resolve(resume: str, root: str | Path) -> Path | None:
    """``resume``: "auto" (latest under root, or None for a fresh run) or a checkpoint path."""
    root = Path(root)
    if resume == "auto":
        pointer = root / "latest"
        if not pointer.exists():
            return None
        folder = root / pointer.read_text().strip()
        if not folder.is_dir():
            raise CheckpointError(f"{pointer} points to {folder}, which does not exist")
    else:
        folder = Path(resume)
        if not folder.is_dir():
            raise CheckpointError(f"resume path {folder} does not exist")
    check_complete(folder)
    verify(folder)
    return folder


def read_state(folder: Path) -> dict:
    return json.loads((folder / STATE).read_text())
