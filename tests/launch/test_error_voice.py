"""Issue 61 (5): one voice for errors. launch.train, launch.evaluate and launch.submit print a
config error as the same one line (Hydra's list of presets kept whole on it); an error about an
evaluation task names its own key; the job's upload leaves secrets out."""

from __future__ import annotations

import sys
import zipfile

import pytest

from launch.validation import ConfigError
from tests.helpers import ROOT, load
from tests.hub_server import FakeHub, hub_env

PRESETS = sorted(p.stem for p in (ROOT / "conf" / "algorithm").glob("*.yaml"))
NOSUCH = (
    "config error: In 'config': Could not find 'algorithm/nosuch' (available options in "
    f"'algorithm': {', '.join(PRESETS)})"
)


def _train(monkeypatch):
    import launch.train

    monkeypatch.setattr(sys, "argv", ["launch.train", "algorithm=nosuch"])
    launch.train.cli(main=lambda: pytest.fail("main ran"))


def _evaluate(monkeypatch):
    import launch.evaluate

    monkeypatch.setattr(sys, "argv", ["launch.evaluate", "algorithm=nosuch"])
    monkeypatch.setattr(launch.evaluate, "main", lambda: pytest.fail("main ran"))
    launch.evaluate.cli()


def _submit(monkeypatch):
    import launch.submit

    launch.submit.main(["algorithm=nosuch"])


@pytest.mark.parametrize("entry, prefix, suffix", [
    (_train, "", ""),
    (_evaluate, "", ""),
    (_submit, "launch.submit: ", "; nothing was submitted"),
])  # fmt: skip
def test_an_unknown_preset_is_one_line_listing_every_preset(entry, prefix, suffix, monkeypatch,
                                                           capsys):  # fmt: skip
    assert len(PRESETS) >= 10  # Hydra's list is whole (the first line alone had none of it)
    with pytest.raises(SystemExit) as err:
        entry(monkeypatch)
    assert err.value.code == 2
    assert capsys.readouterr().err == f"{prefix}{NOSUCH}{suffix}\n"


def test_a_check_of_an_eval_task_names_its_key():
    with pytest.raises(ConfigError) as err:
        load("+task@trainer.eval_tasks.m=math500", "trainer.eval_tasks.m.dataset=null")
    assert str(err.value).startswith("trainer.eval_tasks.m.dataset: task 'math500' reads a")
    with pytest.raises(ConfigError, match=r"^trainer\.eval_tasks\.m\.train_file: needs test_file"):
        load("+task@trainer.eval_tasks.m=math500", "trainer.eval_tasks.m.train_file=x.jsonl")


def test_a_hub_error_of_an_eval_task_names_its_key(monkeypatch, tmp_path, capsys):
    """``--validate`` reads each eval task's dataset: the error names the eval task's key (it
    named ``task.dataset``, a key that was not the problem)."""
    import datasets  # noqa: F401 - before hub_env: it patches datasets' copy of the endpoint

    from launch.train import validate

    with FakeHub() as hub:  # online, without that dataset
        hub_env(monkeypatch, hub, tmp_path)
        with pytest.raises(SystemExit):
            validate(["+task@trainer.eval_tasks.m=math500", "trainer.eval_tasks.m.dataset=o/x"])
    assert capsys.readouterr().err.startswith(
        "data error: trainer.eval_tasks.m.dataset: 'o/x' could not be loaded (DatasetNotFound"
    )


def test_the_upload_leaves_secrets_out(tmp_path):
    """Packed by Ray's own packaging code with launch.submit's excludes (the job's upload), and
    copied with them as an installed copy's job folder is."""
    import shutil

    from ray._private.runtime_env.packaging import create_package

    from launch.submit import EXCLUDES

    secrets = [".env", ".env.local", ".envrc", ".netrc", "id.pem", "conf/tls/server.key"]
    kept = ["launch/x.py", "conf/a.yaml", "keys.py", "environment.md"]
    src = tmp_path / "src"
    for name in secrets + kept:
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        (src / name).write_text("x")
    create_package(str(src), tmp_path / "job.zip", include_gitignore=False, excludes=EXCLUDES)
    with zipfile.ZipFile(tmp_path / "job.zip") as z:
        files = sorted(n for n in z.namelist() if not n.endswith("/"))
    assert files == sorted(kept)
    shutil.copytree(src, tmp_path / "copy", ignore=shutil.ignore_patterns(*EXCLUDES))
    copied = sorted(str(p.relative_to(tmp_path / "copy")) for p in (tmp_path / "copy").rglob("*"))
    assert [p for p in copied if (tmp_path / "copy" / p).is_file()] == sorted(kept)
