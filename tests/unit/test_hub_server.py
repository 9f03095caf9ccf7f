"""tests/hub_server.py's FakeHub, driven by the real huggingface_hub and datasets client code."""

from __future__ import annotations

import hashlib
import io
import json
import threading
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from huggingface_hub import HfApi, HfFileSystem, hf_hub_download, snapshot_download
from huggingface_hub.errors import (
    EntryNotFoundError,
    HfHubHTTPError,
    IncompleteSnapshotError,
    LocalEntryNotFoundError,
    OfflineModeIsEnabled,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)

from tests.hub_server import FakeHub, hub_env

MODEL = "org/tiny-model"
WEIGHTS = bytes(range(256)) * 8  # 2 KiB, served as an LFS file (*.safetensors)


def write_tree(root: Path, files: dict[str, bytes | str]) -> Path:
    for name, content in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content.encode() if isinstance(content, str) else content)
    return root


def read_tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


@pytest.fixture
def hub():
    with FakeHub() as fake:
        yield fake
    assert not [t.name for t in threading.enumerate() if t.name.startswith("FakeHub")]


@pytest.fixture
def model(tmp_path, hub):
    """org/tiny-model: branch main, and branch v2 (tagged v2.0) with other files."""
    main = write_tree(
        tmp_path / "src_main",
        {
            "config.json": json.dumps({"hidden_size": 8}),
            "model.safetensors": WEIGHTS,
            "tokenizer/vocab.txt": "a\nb\nc\n",
        },
    )
    v2 = write_tree(
        tmp_path / "src_v2",
        {"config.json": json.dumps({"hidden_size": 16}), "tokenizer/vocab.txt": "a\nb\n"},
    )
    sha = hub.add_repo(MODEL, main)
    sha2 = hub.add_repo(MODEL, v2, revision="v2", tags=["v2.0"])
    return main, sha, v2, sha2


def test_snapshot_download_fetches_every_file_then_serves_from_the_cache(
    monkeypatch, tmp_path, hub, model
):
    main, sha, _, _ = model
    cache = hub_env(monkeypatch, hub, tmp_path / "cache")

    path = Path(snapshot_download(MODEL))
    assert path == cache / "models--org--tiny-model" / "snapshots" / sha
    assert read_tree(path) == read_tree(main)
    gets = hub.file_requests("GET")
    assert sorted(gets) == sorted(f"/{MODEL}/resolve/{sha}/{name}" for name in read_tree(main))
    # ETag = git blob sha1 for a regular file, content sha256 for an LFS one: the blob names
    blobs = {p.name for p in (cache / "models--org--tiny-model" / "blobs").iterdir()}
    assert hashlib.sha256(WEIGHTS).hexdigest() in blobs
    config = (main / "config.json").read_bytes()
    assert hashlib.sha1(b"blob %d\0" % len(config) + config).hexdigest() in blobs

    hub.clear_requests()
    assert Path(snapshot_download(MODEL)) == path
    # 2.4.0: only the branch is resolved; the tree listing and the files come from the cache
    assert hub.requests == [("GET", f"/api/models/{MODEL}/revision/main")]


def test_a_revision_is_a_branch_a_tag_or_a_full_sha(monkeypatch, tmp_path, hub, model):
    main, sha, v2, sha2 = model
    cache = hub_env(monkeypatch, hub, tmp_path / "cache")
    assert sha != sha2 and hub.resolve(MODEL, "v2.0") == sha2

    by_branch = Path(snapshot_download(MODEL, revision="v2"))
    assert by_branch.name == sha2 and read_tree(by_branch) == read_tree(v2)
    assert (cache / "models--org--tiny-model" / "refs" / "v2").read_text() == sha2
    assert Path(snapshot_download(MODEL, revision="v2.0")) == by_branch

    hub.clear_requests()
    by_sha = Path(snapshot_download(MODEL, revision=sha))
    assert by_sha.name == sha and read_tree(by_sha) == read_tree(main)
    assert not [p for _, p in hub.requests if "/revision/" in p]  # a sha needs no resolution

    with FakeHub() as other:  # the same content makes the same commits
        assert other.add_repo(MODEL, main) == sha


def test_missing_repo_revision_and_file_map_to_the_client_errors(monkeypatch, tmp_path, hub, model):
    main, sha, _, _ = model
    hub_env(monkeypatch, hub, tmp_path / "cache")

    path = hf_hub_download(MODEL, "tokenizer/vocab.txt", revision="main")
    assert Path(path).read_bytes() == (main / "tokenizer" / "vocab.txt").read_bytes()
    with pytest.raises(RepositoryNotFoundError):
        snapshot_download("org/no-such-model")
    with pytest.raises(RevisionNotFoundError):
        snapshot_download(MODEL, revision="no-such-branch")
    with pytest.raises(EntryNotFoundError):
        hf_hub_download(MODEL, "no-such-file.txt")
    # the 404 carried X-Repo-Commit: the client caches the file's absence at that commit
    cache = tmp_path / "cache" / "hf_home" / "hub" / "models--org--tiny-model"
    assert (cache / ".no_exist" / sha / "no-such-file.txt").exists()


def test_hf_hub_offline_serves_the_cache_and_sends_nothing(monkeypatch, tmp_path, hub, model):
    hub.add_repo("org/never-downloaded", {"config.json": "{}"})
    hub_env(monkeypatch, hub, tmp_path / "cache")
    online = snapshot_download(MODEL)

    hub_env(monkeypatch, hub, tmp_path / "cache", offline=True)
    hub.clear_requests()
    assert snapshot_download(MODEL) == online
    with pytest.raises(LocalEntryNotFoundError) as error:
        snapshot_download("org/never-downloaded")
    assert isinstance(error.value.__cause__, OfflineModeIsEnabled)
    assert hub.requests == []


def test_network_failure_falls_back_to_a_complete_cached_snapshot(
    monkeypatch, tmp_path, hub, model
):
    from huggingface_hub.utils import httpx  # the HTTP client huggingface_hub uses (httpx2)

    hub_env(monkeypatch, hub, tmp_path / "cache")
    hub.offline = True
    with pytest.raises(LocalEntryNotFoundError) as error:
        snapshot_download(MODEL)  # nothing cached
    assert isinstance(error.value.__cause__, httpx.ConnectError)

    hub.offline = False
    online = snapshot_download(MODEL)
    partial = snapshot_download(MODEL, revision="v2", allow_patterns=["config.json"])
    hub.offline = True
    hub.clear_requests()
    assert snapshot_download(MODEL) == online
    assert Path(hf_hub_download(MODEL, "config.json")).parent == Path(online)
    assert hub.requests == []  # refused: nothing reached the server
    # A cached snapshot missing files of the cached tree listing is not returned
    with pytest.raises(IncompleteSnapshotError) as error:
        snapshot_download(MODEL, revision="v2")
    assert error.value.snapshot_path == partial

    hub.offline = False  # the same port serves again
    assert snapshot_download(MODEL, revision="v2") == partial


def test_hub_errors_also_fall_back_to_the_cache(monkeypatch, tmp_path, hub, model):
    hub.add_repo("org/never-downloaded", {"config.json": "{}"})
    hub_env(monkeypatch, hub, tmp_path / "cache")
    online = snapshot_download(MODEL)

    hub.error_status = 503
    assert snapshot_download(MODEL) == online
    with pytest.raises(LocalEntryNotFoundError) as error:
        snapshot_download("org/never-downloaded")
    assert isinstance(error.value.__cause__, HfHubHTTPError)
    assert error.value.__cause__.response.status_code == 503


def test_tree_paths_info_and_ranged_reads(monkeypatch, tmp_path, model):
    main, sha, _, _ = model
    with FakeHub(tree_page_size=2) as hub:  # pagination through the Link header
        hub.add_repo(MODEL, main)
        hub_env(monkeypatch, hub, tmp_path / "cache")
        api = HfApi()

        assert sorted(api.list_repo_files(MODEL)) == sorted(read_tree(main))
        infos = api.get_paths_info(MODEL, ["config.json", "tokenizer", "absent"], revision=sha)
        assert [(type(i).__name__, i.path) for i in infos] == [
            ("RepoFile", "config.json"),
            ("RepoFolder", "tokenizer"),
        ]
        weights = next(e for e in api.list_repo_tree(MODEL) if e.path == "model.safetensors")
        assert weights.lfs.sha256 == hashlib.sha256(WEIGHTS).hexdigest()

        fs = HfFileSystem()
        assert fs.ls(f"{MODEL}/tokenizer", detail=False) == [f"{MODEL}/tokenizer/vocab.txt"]
        assert fs.info(f"{MODEL}/model.safetensors")["size"] == len(WEIGHTS)
        with fs.open(f"{MODEL}/model.safetensors", block_size=64) as f:
            f.seek(1000)
            assert f.read(100) == WEIGHTS[1000:1100]

        url = f"{hub.url}/{MODEL}/resolve/main/model.safetensors"
        head = urllib.request.urlopen(urllib.request.Request(url, method="HEAD"))
        assert head.headers["X-Repo-Commit"] == sha
        assert head.headers["ETag"] == f'"{hashlib.sha256(WEIGHTS).hexdigest()}"'
        assert int(head.headers["Content-Length"]) == len(WEIGHTS)
        assert "X-Xet-Hash" not in head.headers and "Link" not in head.headers
        tail = urllib.request.urlopen(urllib.request.Request(url, headers={"Range": "bytes=-10"}))
        assert tail.status == 206 and tail.read() == WEIGHTS[-10:]
        with pytest.raises(urllib.error.HTTPError) as error:
            urllib.request.urlopen(urllib.request.Request(url, headers={"Range": "bytes=9999-"}))
        assert error.value.code == 416
        assert error.value.headers["Content-Range"] == f"bytes */{len(WEIGHTS)}"


def test_load_dataset_from_the_fake_hub(monkeypatch, tmp_path, hub):
    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [{"question": f"{i} + {i}", "answer": str(2 * i)} for i in range(6)]
    buffer = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(rows), buffer)
    sha = hub.add_repo(
        "org/math-ds",
        {"data/train-00000-of-00001.parquet": buffer.getvalue()},
        repo_type="dataset",
    )
    readme = (
        "---\nconfigs:\n"
        "- config_name: easy\n  data_files:\n  - split: train\n    path: easy/*.jsonl\n"
        "- config_name: hard\n  data_files:\n  - split: train\n    path: hard/*.jsonl\n"
        "---\n# Arithmetic\n"
    )
    hard = [{"question": "7 * 6", "answer": "42"}, {"question": "9 * 9", "answer": "81"}]
    hub.add_repo(
        "org/math-configs",
        {
            "README.md": readme,
            "easy/train.jsonl": json.dumps({"question": "1 + 1", "answer": "2"}) + "\n",
            "hard/train.jsonl": "".join(json.dumps(r) + "\n" for r in hard),
        },
        repo_type="dataset",
    )
    hub_env(monkeypatch, hub, tmp_path / "cache")  # after `import datasets`: patches its config

    plain = datasets.load_dataset("org/math-ds", split="train")
    assert plain.to_list() == rows
    assert plain.cache_files[0]["filename"].startswith(str(tmp_path / "cache"))
    assert f"/datasets/org/math-ds/resolve/{sha}/data/train-00000-of-00001.parquet" in (
        hub.file_requests("GET")
    )
    assert datasets.load_dataset("org/math-configs", "hard", split="train").to_list() == hard

    hub_env(monkeypatch, hub, tmp_path / "cache", offline=True)
    hub.clear_requests()
    assert datasets.load_dataset("org/math-ds", split="train").to_list() == rows
    assert hub.requests == []
