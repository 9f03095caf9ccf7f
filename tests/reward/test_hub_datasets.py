"""Task data through the ``datasets`` library (reward/data.py): a hub id with its configuration
and splits (served by tests/hub_server.py, which stands in for the network only), a local folder
in a hub layout, a glob of local files, and the errors that name the key, file or row."""

from __future__ import annotations

import io
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from reward.tasks import DataError, TaskConfig, make_task
from tests.hub_server import FakeHub, hub_env

GSM8K = TaskConfig(name="gsm8k", dataset="openai/gsm8k", dataset_config="main",
                   answer_format="gsm8k")  # fmt: skip


def _parquet(rows: list[dict]) -> bytes:
    buffer = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(rows), buffer)
    return buffer.getvalue()


def _gsm8k_rows(split: str, n: int) -> list[dict]:
    return [{"question": f"{split} {i}?", "answer": f"so\n#### {i}"} for i in range(n)]


README = (  # openai/gsm8k's configurations: main and socratic, each with train and test
    "---\nconfigs:\n"
    "- config_name: main\n  data_files:\n  - split: train\n    path: main/train-*\n"
    "  - split: test\n    path: main/test-*\n"
    "- config_name: socratic\n  data_files:\n  - split: train\n    path: socratic/train-*\n"
    "  - split: test\n    path: socratic/test-*\n---\n"
)


@pytest.fixture
def gsm8k_hub(monkeypatch, tmp_path):
    import datasets  # noqa: F401 - before hub_env: it patches datasets' copy of the endpoint

    files = {"README.md": README}
    for config, n in (("main", 3), ("socratic", 1)):
        for split in ("train", "test"):
            files[f"{config}/{split}-00000-of-00001.parquet"] = _parquet(_gsm8k_rows(split, n))
    with FakeHub() as hub:
        hub.add_repo("openai/gsm8k", files, repo_type="dataset")
        hub_env(monkeypatch, hub, tmp_path)
        yield hub


def test_a_hub_dataset_gives_both_splits_of_its_configuration(gsm8k_hub):
    task = make_task(GSM8K)
    assert [p.question for p in task.train] == ["train 0?", "train 1?", "train 2?"]
    assert [p.answer for p in task.test] == ["0", "1", "2"]
    assert task.test[0].uid == "gsm8k:main:test:1"
    capped = make_task(TaskConfig(**{**GSM8K.__dict__, "num_train": 2, "train_split": None}))
    assert capped.train == []  # train_split null: no train split
    assert len(make_task(TaskConfig(**{**GSM8K.__dict__, "num_test": 2})).test) == 2


def test_local_files_replace_the_dataset(gsm8k_hub, tmp_path):
    """task.test_file set: the task reads local files only (the preset's hub id is not asked:
    a run on local data needs no network); a train_file alone is refused."""
    f = tmp_path / "mine.jsonl"
    f.write_text(json.dumps({"question": "1+1?", "answer": "#### 2"}) + "\n")
    gsm8k_hub.clear_requests()
    task = make_task(TaskConfig(**{**GSM8K.__dict__, "test_file": str(f)}))
    assert task.train == [] and [p.answer for p in task.test] == ["2"]
    task = make_task(TaskConfig(**{**GSM8K.__dict__, "test_file": str(f), "train_file": str(f)}))
    assert len(task.train) == len(task.test) == 1 and gsm8k_hub.requests == []
    with pytest.raises(ValueError, match="task.train_file: needs test_file"):
        make_task(TaskConfig(**{**GSM8K.__dict__, "train_file": str(f)}))


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"test_split": "validation"}, "task.dataset: 'openai/gsm8k': no split 'validation'"),
        ({"dataset_config": "nope"}, "task.dataset: 'openai/gsm8k': no configuration 'nope'"),
        ({"dataset": "openai/none"}, "task.dataset: 'openai/none' could not be loaded"),
    ],
)
def test_a_missing_split_configuration_or_dataset_names_the_key(gsm8k_hub, overrides, message):
    with pytest.raises(DataError, match=message):
        make_task(TaskConfig(**{**GSM8K.__dict__, **overrides}))


def test_offline_a_cached_dataset_loads_and_an_uncached_one_is_named(
    gsm8k_hub, monkeypatch, tmp_path
):
    online = make_task(GSM8K)
    hub_env(monkeypatch, gsm8k_hub, tmp_path, offline=True)
    gsm8k_hub.clear_requests()
    assert make_task(GSM8K).test == online.test and gsm8k_hub.requests == []
    with pytest.raises(DataError, match="not in the datasets cache, and HF_HUB_OFFLINE=1 .offline"):
        make_task(TaskConfig(**{**GSM8K.__dict__, "dataset_config": "socratic"}))


def test_a_local_folder_in_a_hub_layout_and_a_glob_of_files(tmp_path):
    folder = tmp_path / "gsm8k"
    (folder / "data").mkdir(parents=True)
    for split, n in (("train", 2), ("test", 1)):
        (folder / "data" / f"{split}-00000-of-00001.parquet").write_bytes(
            _parquet(_gsm8k_rows(split, n))
        )
    task = make_task(TaskConfig(name="gsm8k", dataset=str(folder), answer_format="gsm8k"))
    assert len(task.train) == 2 and [p.answer for p in task.test] == ["0"]

    for part in (0, 1):  # a glob over two files: their rows in file order
        rows = [{"question": f"q{part}", "answer": f"#### {part}"}]
        (tmp_path / f"part{part}.parquet").write_bytes(_parquet(rows))
    glob = str(tmp_path / "part*.parquet")
    task = make_task(TaskConfig(name="gsm8k", test_file=glob, answer_format="gsm8k"))
    assert [p.answer for p in task.test] == ["0", "1"]
    with pytest.raises(DataError, match=r"part\*\.jsonl: no such file"):
        make_task(TaskConfig(name="gsm8k", test_file=str(tmp_path / "part*.jsonl")))


def test_a_json_array_file_is_read_as_rows(tmp_path):
    """The library reads a JSON array as well as JSON lines (the old reader refused it)."""
    f = tmp_path / "array.json"
    f.write_text(json.dumps([{"question": "q", "answer": "#### 1"}]))
    task = make_task(TaskConfig(name="gsm8k", test_file=str(f), answer_format="gsm8k"))
    assert [p.answer for p in task.test] == ["1"]
