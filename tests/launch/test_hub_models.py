"""A hub id in ``model.path`` (launch/models/bootstrap.py ``local_model``, comm/hub.py): resolved to
one commit and downloaded, a cache hit the second time, a pinned revision, offline and unreachable
hubs, and the errors that name the key. The hub is tests/hub_server.py's FakeHub (it stands in for
the network only: the resolution is huggingface_hub's own code)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from comm.hub import ModelRef, node_folder
from launch.models.bootstrap import local_model, pin_revision
from launch.models.model_config import ModelConfig
from launch.validation import ConfigError
from tests.hub_server import FakeHub, hub_env

REPO = "avspo-test/tiny"
FILES = {
    "config.json": json.dumps({"model_type": "llama"}),
    "model.safetensors": b"\0" * 64,
    "pytorch_model.bin": b"\1" * 64,  # a second weight format: not downloaded (safetensors are)
    "tokenizer.json": "{}",
    "README.md": "# not needed to load the model",
}
LOADED = {"config.json", "model.safetensors", "tokenizer.json"}


@pytest.fixture
def hub():
    with FakeHub() as fake:
        yield fake


def _files(folder: str) -> set[str]:
    return {p.name for p in Path(folder).iterdir()}


def test_a_hub_id_downloads_one_commit_then_hits_the_cache(monkeypatch, tmp_path, hub):
    sha = hub.add_repo(REPO, FILES)
    hub_env(monkeypatch, hub, tmp_path)
    ref = local_model(REPO, log=lambda m: None)
    assert ref.repo_id == REPO and ref.commit == sha and Path(ref.folder).name == sha
    assert _files(ref.folder) == LOADED
    assert len(hub.file_requests("GET")) == len(LOADED)

    hub.clear_requests()
    assert local_model(REPO, log=lambda m: None) == ref
    assert hub.file_requests("GET") == []  # the cache: only the revision is asked for


def test_a_pinned_revision_and_the_commit_written_into_the_config(monkeypatch, tmp_path, hub):
    first = hub.add_repo(REPO, FILES)
    second = hub.add_repo(REPO, {**FILES, "config.json": "{}"})  # main moved on
    hub.add_repo(REPO, FILES, revision="v1")
    hub_env(monkeypatch, hub, tmp_path)
    assert local_model(REPO, first, log=lambda m: None).commit == first  # a full sha
    assert local_model(REPO, "v1", log=lambda m: None).commit not in (None, first, second)
    cfg = ModelConfig(source="path", path=REPO)
    pin_revision(cfg, log=lambda m: None)
    assert cfg.revision == second  # what a run writes into its config.yaml
    local = ModelConfig(source="path", path=str(tmp_path))
    pin_revision(local)
    assert local.revision is None  # a local folder has no commit
    assert local_model(str(tmp_path)) == ModelRef(str(tmp_path))


def test_offline_the_cache_alone_decides(monkeypatch, tmp_path, hub):
    sha = hub.add_repo(REPO, FILES)
    hub.add_repo("avspo-test/never-downloaded", FILES)
    hub_env(monkeypatch, hub, tmp_path)
    ref = local_model(REPO, log=lambda m: None)

    hub_env(monkeypatch, hub, tmp_path, offline=True)  # HF_HUB_OFFLINE=1
    hub.clear_requests()
    cached = local_model(REPO, log=lambda m: None)
    assert cached.folder == ref.folder and cached.commit == sha and hub.requests == []
    said = r"'avspo-test/never-downloaded' is neither a local folder nor in the local Hugging Face"
    with pytest.raises(ConfigError, match=rf"model.path: {said} hub cache.*HF_HUB_OFFLINE is set"):
        local_model("avspo-test/never-downloaded")

    hub_env(monkeypatch, hub, tmp_path)  # online again, but the hub is down: the cache decides
    hub.offline = True
    assert local_model(REPO, log=lambda m: None).folder == ref.folder
    with pytest.raises(ConfigError, match="the hub is unreachable"):
        local_model("avspo-test/never-downloaded")


def test_unknown_repos_revisions_and_ids_name_their_key(monkeypatch, tmp_path, hub):
    hub.add_repo(REPO, FILES)
    hub_env(monkeypatch, hub, tmp_path)
    with pytest.raises(ConfigError, match="model.path: 'avspo-test/none' is neither a local folder"
                       " nor a model on the hub"):  # fmt: skip
        local_model("avspo-test/none")
    with pytest.raises(ConfigError, match="model.revision: 'nope' is not a revision of"):
        local_model(REPO, "nope")
    with pytest.raises(ConfigError, match="model.path: '/no/such/folder' is neither a local "
                       "folder nor a hub id"):  # fmt: skip
        local_model("/no/such/folder")


def test_a_node_without_the_drivers_folder_loads_the_same_commit(monkeypatch, tmp_path, hub):
    """An actor on another node (the driver's folder is not there) takes the driver's commit,
    even after the branch moved on, with the driver's file choice."""
    sha = hub.add_repo(REPO, FILES)
    hub.add_repo(REPO, {**FILES, "config.json": "{}"})  # main moves on after the driver resolved
    hub_env(monkeypatch, hub, tmp_path / "node2")
    ref = ModelRef(str(tmp_path / "driver-only"), REPO, sha, ("*.json", "*.safetensors"))
    folder = node_folder(ref)
    assert Path(folder).name == sha and _files(folder) == LOADED
    assert json.loads((Path(folder) / "config.json").read_text()) == {"model_type": "llama"}
    assert node_folder(str(tmp_path)) == str(tmp_path)  # a plain folder: as is
