"""Checkpoint layout and atomic commit, shared by the learner group and the driver.

    <root>/step_000012/            one complete checkpoint
        model/                     HF folder (safetensors, config, tokenizer): transformers loads it
        deepspeed/                 DeepSpeed's own files (shards, optimizer, scheduler)
        state.json                 step, data position, RNG states, trigger and ACR monitor state
    <root>/latest                  the name of the newest complete checkpoint, written last

A checkpoint is written into ``<root>/.tmp-step_000012`` and renamed into place only when every
part is there, then ``latest`` is replaced (write + rename). So a crash leaves either the old
``latest`` or the new one, never a half checkpoint behind it. Resuming from a ``latest`` whose
checkpoint is missing or incomplete is an error, never a silent fresh start. Nothing here uses
pickle: the sidecar is JSON.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

STATE = "state.json"


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
    """Write the sidecar, rename ``tmp`` into place and point ``latest`` at it."""
    root = Path(root)
    (tmp / STATE).write_text(json.dumps(state))
    check_complete(tmp)
    final = root / step_name(step)
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    pointer = root / ".latest.tmp"
    pointer.write_text(final.name)
    os.replace(pointer, root / "latest")
    return final


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
    return folder


def read_state(folder: Path) -> dict:
    return json.loads((folder / STATE).read_text())
