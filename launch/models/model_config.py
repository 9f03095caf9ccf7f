"""The ``model`` config group's schema (``conf/model/*.yaml``); launch/models/bootstrap.py resolves
it to a local folder."""

from __future__ import annotations

from dataclasses import dataclass, field

from launch.models.tiny_model import TinyConfig


@dataclass
class ModelConfig:
    """The policy model (``conf/model/*.yaml``)."""

    name: str = "tiny"
    source: str = field(default="tiny", metadata={"choices": ("tiny", "smollm2", "path")})
    path: str | None = None
    """source=path: a local Hugging Face folder, or a hub id (org/name): from the hub cache, or
    downloaded into it (offline, HF_HUB_OFFLINE=1: the cache only)."""
    revision: str | None = None
    """A hub id's branch, tag or commit (null: main). A run writes the commit it resolved here
    in its config.yaml, so every actor, a resume and a rerun load the same weights."""
    cache_dir: str | None = None
    """Where built models live; null = $AVSPO_CACHE or ~/.cache/avspo/models."""
    dtype: str = field(
        default="float32", metadata={"choices": ("float32", "bfloat16", "float16", "auto")}
    )
    """The engines' and (``learner.dtype`` null) the learner's. ``auto``: bfloat16 where the
    launching machine has native bf16 (AMX / AVX512_BF16, a CUDA device), else float32
    (launch/models/dtype.py); the run's config.yaml records the choice."""
    tiny: TinyConfig = field(default_factory=TinyConfig)
    rebuild: bool = False
    """source=tiny: build the weights on this machine (into the cache) even where they ship
    (launch/assets/: the default and FAST_TINY). Other CPU vendors build other bytes (the
    weights id, printed by every run, says which: docs/NOTES.md)."""

    def check(self) -> str | None:
        if self.source == "path" and not self.path:
            return "source 'path' needs model.path"
        return None
