"""Rows of a task's data, read with the Hugging Face ``datasets`` library.

A split comes from one of two sources (``reward/tasks.py`` validates the rows on top):

- a hub dataset id, or a local folder in a hub layout (``task.dataset`` with
  ``task.dataset_config`` and the split's name): ``load_dataset(id, config, split=...)``, from
  the datasets cache or downloaded into it (offline, ``HF_HUB_OFFLINE=1``: the cache only);
- local files (``task.train_file`` / ``task.test_file``: a path or a glob of jsonl, json,
  parquet or arrow files): ``load_dataset(<format>, data_files=...)``.

The library rejects a whole file for one bad line, without naming it. A JSON-lines file it
rejects is therefore read once more line by line (:func:`json_lines`), which names the row and
the reason (or, under ``on_bad_row: skip``, lets the caller skip that row and keep the rest):
the one hand-written reader kept, for that reason.
"""

from __future__ import annotations

import glob
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

FORMATS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".arrow": "arrow"}


class DataError(ValueError):
    """A data row is unusable; the message names the file, row and reason."""


def data_paths(pattern: str) -> list[str]:
    """The local files a path or a glob names, sorted; empty when any of them is not a file."""
    paths = sorted(glob.glob(pattern)) if glob.has_magic(pattern) else [pattern]
    return paths if paths and all(Path(p).is_file() for p in paths) else []


def file_rows(pattern: str) -> Iterator[tuple[int, Any]]:
    """(1-based row, row) of local files (a path or a glob, one format); a JSON-lines row the
    library could not read comes as a :class:`DataError` in place of the row."""
    paths = data_paths(pattern)
    if not paths:
        raise DataError(f"{pattern}: no such file")
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


def hub_rows(dataset: str, config: str | None, split: str) -> Iterator[tuple[int, Any]]:
    """(1-based row, row) of a hub dataset's split (or a local folder in a hub layout)."""
    try:
        rows = _load(dataset, progress=True, name=config, split=split)
    except Exception as err:  # noqa: BLE001 - not found, offline, bad split or config
        raise DataError(f"task.dataset: {dataset!r}{_hub_reason(err, config, split)}") from None
    yield from enumerate(rows, start=1)


def _load(path: str, progress: bool, **kwargs) -> list[dict]:
    """The rows, decoded here (pyarrow takes text that is not UTF-8, decoding it does not);
    progress bars for downloads, not for a local file's conversion to the library's cache."""
    import datasets

    # its own "Failed to load JSON" lines are logged at ERROR before it raises: ours say it, once
    datasets.logging.set_verbosity(datasets.logging.CRITICAL)
    if not progress:
        datasets.disable_progress_bars()
    try:
        return datasets.load_dataset(path, **kwargs).to_list()
    finally:
        datasets.enable_progress_bars()


def _hub_reason(err: Exception, config: str | None, split: str) -> str:
    text = f"{type(err).__name__}: {err}".split("\n")[0][:300]
    if "Unknown split" in text or "Bad split" in text:
        return f": no split {split!r} ({text})"
    if "BuilderConfig" in text or "Config name is missing" in text:
        return f": no configuration {config!r} (task.dataset_config; {text})"
    return f" could not be loaded ({text}; offline, HF_HUB_OFFLINE=1, only the cache is read)"


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
