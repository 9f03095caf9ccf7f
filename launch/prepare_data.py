"""``python -m launch.prepare_data [hydra overrides]``: write the local data files a config reads
and does not find, from its tasks' hub datasets.

    python -m launch.prepare_data experiment=paper_qwen2.5_math_1.5b

The config is composed and checked as ``launch.train`` checks it (launch/train.py ``validate``,
without the data: a bad key exits 2 with one line). Then every local file named by a
``train_file`` / ``test_file`` of ``task`` or of a ``trainer.eval_tasks.<name>`` that is not there
is written from that task's hub dataset (``dataset``, ``dataset_config`` and the split,
``train_split`` / ``test_split``), read with the ``datasets`` library as a run without the file
would read it (reward/data.py: the cache, else a download), row for row with the hub's columns.
That is the layout the task reads: its keys (``question_key``, ``answer_key``, ...) name the same
columns in a file as on the hub. ``.jsonl`` / ``.json`` get JSON lines, ``.parquet`` Parquet,
``.arrow`` an Arrow stream. The whole split is written (``num_train`` / ``num_test`` cap what a
run reads: the paper's 500-problem MATH subset is the first 500 rows only if the file is that
subset). A file that is there is left alone, and said so. A file several tasks read is written
once, from the first of them in this order: the evaluation tasks, then ``task`` (with
``trainer.eval_tasks`` set, the training task's test split is not what is evaluated).

Exit status: 0 every file is there now; 2 some file could not be written (each named on one
line): a task with no hub dataset or split, a glob, a hub error, or, offline (``HF_HUB_OFFLINE=1``)
or with the hub unreachable, datasets missing from the cache (one line naming every such file and
its hub id).
"""

from __future__ import annotations

import glob
import json
import os
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

from reward.data import FORMATS, DataError, HubUnavailable, data_paths, hub_rows
from reward.tasks import FILE_TASKS, TEST_ONLY_TASKS, TaskConfig


@dataclass(frozen=True)
class Wanted:
    """A local file a task reads: ``key`` names it (``trainer.eval_tasks.gsm8k.test_file``),
    ``task`` and ``split`` say where its rows are on the hub (split None: nowhere)."""

    key: str
    path: str
    task: TaskConfig
    split: str | None

    @property
    def task_key(self) -> str:
        return self.key.rpartition(".")[0]

    def source(self) -> str:
        """The hub id, configuration and split, e.g. ``openai/gsm8k, configuration main, split
        test``."""
        config = f", configuration {self.task.dataset_config}" if self.task.dataset_config else ""
        return f"{self.task.dataset}{config}, split {self.split}"


def wanted(tasks: dict[str, TaskConfig]) -> dict[str, list[Wanted]]:
    """Each local file of ``tasks`` (key -> task, launch/validation.py ``task_configs``) -> the
    entries of the tasks that read it, the one to write it from first: evaluation tasks, then
    ``task``."""
    out: dict[str, list[Wanted]] = {}
    for key in sorted(tasks, key=lambda k: k == "task"):  # a stable sort: eval tasks in order
        tc = tasks[key]
        if tc.name not in FILE_TASKS:
            continue
        train_split = None if tc.name in TEST_ONLY_TASKS else tc.train_split
        for which, split in (("train", train_split), ("test", tc.test_split)):
            path = getattr(tc, f"{which}_file")
            if path:
                out.setdefault(path, []).append(Wanted(f"{key}.{which}_file", path, tc, split))
    return out


def unwritable(want: Wanted) -> str | None:
    """Why ``want`` cannot be written from the hub, or None."""
    where, task = f"{want.path} ({want.key})", want.task_key
    if glob.has_magic(want.path):
        return f"{where}: matches no file, and a glob names no file to write"
    if Path(want.path).suffix not in FORMATS:
        return f"{where}: no such file, and not one of the formats {sorted(FORMATS)} to write"
    if not want.task.dataset:
        return f"{where}: no such file, and no hub dataset to write it from: {task}.dataset is null"
    if not want.split:
        return f"{where}: no such file, and {task} reads no split of {want.task.dataset} there"
    return None


def write(want: Wanted) -> int:
    """Write ``want.path`` from its task's hub split (a complete file or none); the rows."""
    tc, key = want.task, f"{want.task_key}.dataset"
    rows = [row for _, row in hub_rows(tc.dataset, tc.dataset_config, want.split, key)]
    path = Path(want.path)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.partial")
    if FORMATS[path.suffix] == "json":
        with partial.open("w", encoding="utf-8") as f:
            f.writelines(json.dumps(r, ensure_ascii=False, default=str) + "\n" for r in rows)
    else:
        import pyarrow as pa
        import pyarrow.parquet as pq

        table = pa.Table.from_pylist(rows)
        if path.suffix == ".parquet":
            pq.write_table(table, partial)
        else:
            with pa.ipc.new_stream(str(partial), table.schema) as stream:
                stream.write_table(table)
    os.replace(partial, path)
    return len(rows)


def prepare(tasks: dict[str, TaskConfig], log=print) -> list[str]:
    """Write every missing file of ``tasks`` that can be written; the problems, one line each
    (offline or unreachable: one line for every dataset missing from the cache)."""
    problems, not_cached, why = [], [], ""
    for path, readers in wanted(tasks).items():
        first, keys = readers[0], ", ".join(w.key for w in readers)
        if data_paths(path):
            log(f"{path}: there, left alone ({keys})")
            continue
        problem = unwritable(first)
        if problem:
            problems.append(f"data error: {problem}")
            continue
        try:
            n = write(first)
        except HubUnavailable as err:
            not_cached.append(f"{path} ({first.source()})")
            why = err.why
            continue
        except DataError as err:
            problems.append(f"data error: {err}")
            continue
        log(f"{path}: wrote {n} rows of {first.source()} ({keys})")
    if not_cached:
        problems.append(
            f"data error: {len(not_cached)} file(s) not written, their datasets not in the cache "
            f"and {why}: {'; '.join(not_cached)}; run this where the hub is reachable"
        )
    return problems


def main(argv: list[str] | None = None) -> int:
    from launch.train import validate
    from launch.validation import compose_config, exit_on_config_error, overrides_of, task_configs

    overrides = overrides_of(sys.argv[1:] if argv is None else argv)
    validate(overrides, data=False)  # as launch.train checks it: a problem exits 2, one line
    with exit_on_config_error():
        cfg = compose_config(overrides)
    problems = prepare(task_configs(cfg))
    for problem in problems:
        print(problem, file=sys.stderr)
    if problems:
        return 2
    check = shlex.join(["python", "-m", "launch.train", *overrides, "--validate"])
    print(f"data ready; check with: {check}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
