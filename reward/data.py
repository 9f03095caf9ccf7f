"""Rows of a task's data, read with the Hugging Face ``datasets`` library.

A split comes from one of two sources (``reward/tasks.py`` validates the rows on top):

- a hub dataset id, or a local folder in a hub layout (``task.dataset`` with
  ``task.dataset_config`` and the split's name): ``load_dataset(id, config, split=...)``, from
  the datasets cache or downloaded into it. Offline (``HF_HUB_OFFLINE=1``), or with the hub
  unreachable (one request with a ``PROBE_TIMEOUT_S`` limit finds out first, rather than the
  libraries' minute of retries), the cache only; an error says which of the two it was;
- local files (``task.train_file`` / ``task.test_file``: a path or a glob of jsonl, json,
  parquet or arrow files): ``load_dataset(<format>, data_files=...)``.

The library rejects a whole file for one bad line, without naming it. A JSON-lines file it
rejects is therefore read once more line by line (:func:`json_lines`), which names the row and
the reason (or, under ``on_bad_row: skip``, lets the caller skip that row and keep the rest):
the one hand-written reader kept, for that reason.
"""

from __future__ import annotations

import contextlib
import glob
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

FORMATS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".arrow": "arrow"}


PROBE_TIMEOUT_S = 3.0
"""Limit of the one request that tells a reachable hub from an unreachable one."""


class DataError(ValueError):
    """A data row is unusable; the message names the file, row and reason."""


class MissingFile(DataError):
    """A task's local file is not there. ``dataset``: the task's hub id, from which
    ``launch.prepare_data`` can write the file (None: the task has none)."""

    def __init__(self, message: str, dataset: str | None = None):
        super().__init__(message)
        self.dataset = dataset


class HubUnavailable(DataError):
    """A hub dataset that is not in the cache, with the hub offline or unreachable (``why``)."""

    def __init__(self, message: str, why: str):
        super().__init__(message)
        self.why = why


def data_paths(pattern: str) -> list[str]:
    """The local files a path or a glob names, sorted; empty when any of them is not a file."""
    paths = sorted(glob.glob(pattern)) if glob.has_magic(pattern) else [pattern]
    return paths if paths and all(Path(p).is_file() for p in paths) else []


def file_rows(
    pattern: str, key: str | None = None, dataset: str | None = None
) -> Iterator[tuple[int, Any]]:
    """(1-based row, row) of local files (a path or a glob, one format); a JSON-lines row the
    library could not read comes as a :class:`DataError` in place of the row. ``key`` (the
    config key naming the file) and ``dataset`` (its task's hub id) go into a
    :class:`MissingFile` error."""
    paths = data_paths(pattern)
    if not paths:
        raise MissingFile(f"{pattern}: no such file" + (f" ({key})" if key else ""), dataset)
    suffixes = {Path(p).suffix for p in paths}
    builder = FORMATS.get(suffixes.pop()) if len(suffixes) == 1 else None
    if builder is None:
        raise DataError(f"{pattern}: not one of the formats {sorted(FORMATS)} (one per source)")
    try:
        rows = _load(builder, progress=False, data_files=paths, split="train")
    except Exception as err:  # noqa: BLE001 - the library's many errors: name the row if we can
        if builder != "json":
            raise DataError(f"{pattern}: not a readable {builder} file ({err})") from None
        for path in paths:
            yield from json_lines(Path(path))
        return
    yield from enumerate(rows, start=1)


def hub_rows(
    dataset: str, config: str | None, split: str, key: str = "task.dataset"
) -> Iterator[tuple[int, Any]]:
    """(1-based row, row) of a hub dataset's split (or a local folder in a hub layout); errors
    name ``key``, the config key that holds ``dataset``."""
    why = None if Path(dataset).expanduser().is_dir() else hub_unavailable()
    try:
        with _cache_only(why is not None):
            rows = _load(dataset, progress=True, name=config, split=split)
    except Exception as err:  # noqa: BLE001 - not found, offline, bad split or config
        raise _hub_error(key, dataset, err, config, split, why) from None
    yield from enumerate(rows, start=1)


def hub_unavailable() -> str | None:
    """Why the hub cannot be asked (offline, or no answer to one request within
    ``PROBE_TIMEOUT_S``), or None: it answered (any HTTP status)."""
    from datasets import config
    from huggingface_hub.utils import get_session

    if config.HF_HUB_OFFLINE:
        return "HF_HUB_OFFLINE=1 (offline: only the cache is read)"
    try:
        get_session().head(config.HF_ENDPOINT, timeout=PROBE_TIMEOUT_S)
    except Exception as err:  # noqa: BLE001 - refused, no such host, timed out, TLS, proxy
        reason = f"{type(err).__name__}: {err}".splitlines()[0][:200]
        return f"the hub at {config.HF_ENDPOINT} is unreachable ({reason}; HF_HUB_OFFLINE unset)"
    return None


@contextlib.contextmanager
def _cache_only(on: bool):
    """The datasets library in offline mode (the cache only) while active, when ``on``."""
    import huggingface_hub.constants as hub
    from datasets import config

    before = config.HF_HUB_OFFLINE, hub.HF_HUB_OFFLINE
    if on:
        config.HF_HUB_OFFLINE = hub.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        config.HF_HUB_OFFLINE, hub.HF_HUB_OFFLINE = before


def _load(path: str, progress: bool, **kwargs) -> list[dict]:
    """The rows, decoded here (pyarrow takes text that is not UTF-8, decoding it does not);
    progress bars for downloads, not for a local file's conversion to the library's cache."""
    import datasets
    from huggingface_hub.utils import logging as hub_logging

    # its own "Failed to load JSON" lines are logged at ERROR before it raises, and
    # huggingface_hub logs each retry: ours say it, once
    datasets.logging.set_verbosity(datasets.logging.CRITICAL)
    verbosity = hub_logging.get_verbosity()
    hub_logging.set_verbosity_error()
    if not progress:
        datasets.disable_progress_bars()
    try:
        return datasets.load_dataset(path, **kwargs).to_list()
    finally:
        datasets.enable_progress_bars()
        hub_logging.set_verbosity(verbosity)


def _hub_error(
    key: str, dataset: str, err: Exception, config: str | None, split: str, why: str | None
) -> DataError:
    where, text = f"{key}: {dataset!r}", f"{type(err).__name__}: {err}".split("\n")[0][:300]
    if "Unknown split" in text or "Bad split" in text:
        return DataError(f"{where}: no split {split!r} ({text})")
    if "BuilderConfig" in text or "Config name is missing" in text:
        config_key = key.rpartition(".")[0] + ".dataset_config"
        return DataError(f"{where}: no configuration {config!r} ({config_key}; {text})")
    if why:
        return HubUnavailable(f"{where} is not in the datasets cache, and {why}", why)
    return DataError(f"{where} could not be loaded ({text})")


def json_lines(path: Path) -> Iterator[tuple[int, Any]]:
    """(1-based line, row) of a JSON-lines file, read line by line; a line that is not JSON, or
    not an object, yields a DataError in its place."""
    try:
        with path.open(encoding="utf-8") as f:
            for i, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as err:
                    yield i, DataError(f"{path}: row {i}: not valid JSON ({err.msg})")
                    continue
                if not isinstance(row, dict):
                    kind = type(row).__name__
                    yield i, DataError(f"{path}: row {i}: expected an object, got {kind}")
                    continue
                yield i, row
    except UnicodeDecodeError as err:
        raise DataError(f"{path}: not UTF-8 text ({err.reason} at byte {err.start})") from None
