"""Model folders from the Hugging Face hub, resolved once by the driver and loaded by every actor
at the same commit.

The driver resolves ``model.path`` (a local folder or a hub id, with ``model.revision``) to a
:class:`ModelRef`: the snapshot folder on its node and, for a hub id, the repo and the commit
hash the revision named at that moment. Actors call :func:`node_folder` on it: the driver's
folder when their node has it (one machine, or a cache on a shared file system), else the same
commit from their node's hub cache or the hub. A branch that moves during a run never splits
the actors across two versions of the model.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

# What a model load reads: configs, safetensors weights, tokenizer and chat-template files.
# Other weight formats (.bin, .pt, .gguf, .onnx, .h5, flax) are fetched only when a repo has no
# safetensors (see weight_patterns).
MODEL_FILES = ["*.json", "*.txt", "*.model", "*.tiktoken", "*.jinja", "*.py", "tokenizer*"]
WEIGHT_FORMATS = (["*.safetensors"], ["*.bin"], ["*.pt", "*.pth"])


@dataclass(frozen=True)
class ModelRef:
    """A model as the driver resolved it; ``repo_id``/``commit`` are None for a local folder,
    ``patterns`` the files taken from the repo (None: all of them)."""

    folder: str
    repo_id: str | None = None
    commit: str | None = None
    patterns: tuple[str, ...] | None = None


def weight_patterns(files: list[str]) -> list[str]:
    """The files of a repo listing a model load needs: the configs and tokenizer, and the first
    weight format present (safetensors, else PyTorch .bin, else .pt/.pth), as vLLM picks.

    >>> weight_patterns(["config.json", "model.safetensors", "pytorch_model.bin"])[-1]
    '*.safetensors'
    >>> weight_patterns(["config.json", "pytorch_model.bin", "model.gguf"])[-1]
    '*.bin'
    """
    from fnmatch import fnmatch

    for patterns in WEIGHT_FORMATS:
        if any(fnmatch(Path(f).name, p) for f in files for p in patterns):
            return [*MODEL_FILES, *patterns]
    return list(MODEL_FILES)


def node_folder(model: str | ModelRef) -> str:
    """The model's folder on this node (see the module docstring)."""
    if isinstance(model, str):
        return model
    if model.repo_id is None or os.path.isdir(model.folder):
        return model.folder
    from huggingface_hub import snapshot_download

    patterns = None if model.patterns is None else list(model.patterns)
    return snapshot_download(model.repo_id, revision=model.commit, allow_patterns=patterns)
