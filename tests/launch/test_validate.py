"""Issue 44, config: every composed key against the schema, ``+`` or not (``--validate``, a plain
run and ``launch.submit`` exit 2 naming it, before anything starts); ``--validate`` finds
``model.path`` without downloading it; the README's own-model command validates."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from launch.validation import ConfigError
from tests.helpers import ROOT, load
from tests.hub_server import FakeHub, hub_env


@pytest.mark.parametrize(
    "overrides, key",
    [
        (["+learner.lrr=1e-6"], "learner.lrr"),
        (["+rollout.sampling.seedd=1"], "rollout.sampling.seedd"),
        (["+bogus=1"], "bogus"),
        (
            ["+task@trainer.eval_tasks.m=math500", "+trainer.eval_tasks.m.test_fiel=x"],
            "trainer.eval_tasks.m.test_fiel",
        ),
    ],
)
def test_a_key_added_with_plus_is_checked_against_the_schema(overrides, key):
    with pytest.raises(ConfigError, match=f"^{key}: unknown key"):
        load(*overrides)


def test_free_form_maps_still_take_new_keys():
    cfg = load("task=reasoning_gym", "+task.gym_config.min_terms=2")
    assert cfg.task.gym_config == {"min_terms": 2}
    cfg = load("+task@trainer.eval_tasks.m=math500", "trainer.eval_tasks.m.test_file=x.jsonl")
    assert cfg.trainer.eval_tasks["m"].test_file == "x.jsonl"


def test_the_message_suggests_the_key_meant():
    with pytest.raises(ConfigError) as err:
        load("+learner.lrr=1e-6")
    assert str(err.value) == (
        "learner.lrr: unknown key 'lrr', not in the schema (did you mean learner.lr?)"
    )


@pytest.mark.parametrize("override", ["+learner.lrr=1e-6", "learner.lrr=1e-6"])
def test_a_plain_run_exits_2_naming_the_key_before_anything_starts(override, monkeypatch, capsys):
    """In process: ``cli`` checks the config before Hydra's ``main`` (which would have exited 1
    for the second, and trained at the default lr for the first)."""
    import launch.train

    started = []
    monkeypatch.setattr(sys, "argv", ["launch.train", override])
    with pytest.raises(SystemExit) as err:
        launch.train.cli(main=lambda: started.append(1))
    assert err.value.code == 2 and not started
    err_text = capsys.readouterr().err  # ours for "+", Hydra's for the other: both name it
    assert err_text.startswith("config error: ") and "learner.lrr" in err_text


def test_submit_validates_before_asking_for_an_address(monkeypatch, capsys):
    import launch.submit

    for name in ("RAY_ADDRESS", "RAY_API_SERVER_ADDRESS"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(SystemExit) as err:
        launch.submit.main(["+learner.lrr=1e-6"])
    assert err.value.code == 2
    err_text = capsys.readouterr().err
    assert "learner.lrr" in err_text and "nothing was submitted" in err_text
    assert "no cluster" not in err_text  # the address was never asked for


def test_validate_cli_refuses_a_plus_typo():
    out = subprocess.run(
        [sys.executable, "-m", "launch.train", "--validate", "+learner.lrr=1e-6"],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2 and "config ok" not in out.stdout
    assert out.stderr.strip().splitlines()[-1].startswith("config error: learner.lrr")


def _validate(*overrides: str) -> None:
    from launch.train import validate

    validate(list(overrides))


def _model_folder(tmp_path, config: bool = True):
    folder = tmp_path / "my-model"
    folder.mkdir()
    if config:
        (folder / "config.json").write_text(json.dumps({"model_type": "llama"}))
    return folder


def test_validate_accepts_a_model_folder(tmp_path, capsys):
    """The README's own-model command with a local folder: validates (task and cluster as
    written; gsm8k's data comes from local files here, as offline)."""
    data = tmp_path / "g.jsonl"
    data.write_text(json.dumps({"question": "1+1", "answer": "#### 2"}) + "\n")
    folder = _model_folder(tmp_path)
    _validate(
        "model=pretrained", f"model.path={folder}", "model.dtype=bfloat16", "task=gsm8k",
        "cluster=gpu_node", f"task.train_file={data}", f"task.test_file={data}",
    )  # fmt: skip


@pytest.mark.parametrize(
    "path, message",
    [
        ("{tmp}/nowhere", "is no folder here, nor a hub id"),
        ("{tmp}/empty", "has no config.json"),
        ("just-a-name", "is no folder here, nor a hub id"),
    ],
)
def test_validate_refuses_a_model_path_that_is_not_there(tmp_path, capsys, path, message):
    (tmp_path / "empty").mkdir()
    with pytest.raises(SystemExit) as err:
        _validate("model=pretrained", "model.path=" + path.format(tmp=tmp_path))
    assert err.value.code == 2
    assert capsys.readouterr().err.startswith("config error: model.path: ")
    # the message is the reason given
    with pytest.raises(ConfigError, match=message):
        from launch.models.bootstrap import check_model_path
        from launch.models.model_config import ModelConfig

        check_model_path(ModelConfig(source="path", path=path.format(tmp=tmp_path)))


def test_a_model_path_without_the_preset_names_the_model_and_the_preset(tmp_path):
    """``model.source=path`` alone keeps the tiny model's lengths: refused, naming the model by
    its path (it used to name 'tiny') and the preset to use."""
    with pytest.raises(ConfigError, match="for model 'Org/m' .*model=pretrained model.path="):
        load("model.source=path", "model.path=Org/m")


REPO = "avspo-test/tiny"
FILES = {"config.json": json.dumps({"model_type": "llama"}), "model.safetensors": b"\0" * 64}


def test_a_hub_id_is_asked_not_downloaded_then_found_in_the_cache(monkeypatch, tmp_path):
    from launch.models.bootstrap import check_model_path, local_model
    from launch.models.model_config import ModelConfig

    cfg = ModelConfig(source="path", path=REPO)
    with FakeHub() as hub:
        hub.add_repo(REPO, FILES)
        hub_env(monkeypatch, hub, tmp_path)
        check_model_path(cfg)  # on the hub: fine, and nothing fetched
        assert hub.file_requests("GET") == []
        with pytest.raises(ConfigError, match="neither a local folder nor a model on the hub"):
            check_model_path(ModelConfig(source="path", path="avspo-test/absent"))
        local_model(REPO, log=lambda m: None)  # a run downloads it into the cache
        hub_env(monkeypatch, hub, tmp_path, offline=True)
        hub.clear_requests()
        check_model_path(cfg)  # offline: the cache has it
        assert hub.requests == []
        with pytest.raises(ConfigError, match="HF_HUB_OFFLINE is set"):
            check_model_path(ModelConfig(source="path", path="avspo-test/absent"))


@pytest.mark.slow
def test_validate_cli_offline_names_a_hub_id_missing_from_the_cache(tmp_path):
    """The README's own-model command as written, offline with an empty cache: exit 2 naming
    model.path (it used to pass --validate and fail in the run, naming the tiny model)."""
    env = {
        **os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1",
        "HF_HOME": str(tmp_path / "hf"), "HF_DATASETS_OFFLINE": "1",
    }  # fmt: skip
    data = tmp_path / "g.jsonl"
    data.write_text(json.dumps({"question": "1+1", "answer": "#### 2"}) + "\n")
    out = subprocess.run(
        [
            sys.executable, "-m", "launch.train", "--validate", "model=pretrained",
            "model.path=Qwen/Qwen2.5-Math-1.5B", "model.dtype=bfloat16", "task=gsm8k",
            "cluster=gpu_node", f"task.train_file={data}", f"task.test_file={data}",
        ],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 2, out.stderr[-2000:]
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("config error: model.path: 'Qwen/Qwen2.5-Math-1.5B' is not in the")
    assert not (tmp_path / "hf" / "hub" / "models--Qwen--Qwen2.5-Math-1.5B").exists()
