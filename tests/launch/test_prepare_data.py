"""Issue 61 (4, 5): ``launch.prepare_data`` writes the local files a config names from its tasks'
hub ids (tests/hub_server.py's FakeHub stands in for the network only), a missing file's error
names that command, and a hub that does not answer is told from offline at once, in one line."""

from __future__ import annotations

import io
import json
import sys
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from launch import prepare_data
from tests.helpers import ROOT
from tests.hub_server import FakeHub, hub_env

LIGHTEVAL = "DigitalLearningGmbH/MATH-lighteval"  # conf/task/math.yaml's hub id
MATH500 = "HuggingFaceH4/MATH-500"  # conf/task/math500.yaml's


def _parquet(rows: list[dict]) -> bytes:
    buffer = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(rows), buffer)
    return buffer.getvalue()


def _math_rows(split: str, n: int, **extra) -> list[dict]:
    return [
        {"problem": f"{split} {i}?", "solution": f"so \\boxed{{{i}}}", "level": "Level 3", **extra}
        for i in range(n)
    ]


TRAIN, TEST = _math_rows("train", 3), _math_rows("test", 2)
MATH500_ROWS = [{**r, "answer": str(i)} for i, r in enumerate(_math_rows("m500", 2))]


@pytest.fixture
def hub(monkeypatch, tmp_path):
    """The MATH training set and MATH-500, each in its published layout (data/<split>-*)."""
    import datasets  # noqa: F401 - before hub_env: it patches datasets' copy of the endpoint

    with FakeHub() as fake:
        fake.add_repo(LIGHTEVAL, {
            "data/train-00000-of-00001.parquet": _parquet(TRAIN),
            "data/test-00000-of-00001.parquet": _parquet(TEST),
        }, repo_type="dataset")  # fmt: skip
        fake.add_repo(MATH500, {"data/test-00000-of-00001.parquet": _parquet(MATH500_ROWS)},
                      repo_type="dataset")  # fmt: skip
        hub_env(monkeypatch, fake, tmp_path / "cache")
        yield fake


def _overrides(data) -> list[str]:
    """The paper experiment's shape: the MATH train file, MATH-500 read by the training task's
    test split and by an eval task (one file), and a gsm8k eval file that is already there."""
    return [
        "task=math", f"task.train_file={data}/math_train.jsonl",
        f"task.test_file={data}/math500.parquet",
        "+task@trainer.eval_tasks.math500=math500",
        f"trainer.eval_tasks.math500.test_file={data}/math500.parquet",
        "+task@trainer.eval_tasks.gsm8k=gsm8k",
        f"trainer.eval_tasks.gsm8k.test_file={data}/gsm8k_test.jsonl",
    ]  # fmt: skip


def test_writes_each_missing_file_from_its_hub_split_and_leaves_the_rest(hub, tmp_path, capsys):
    from launch.train import validate

    data = tmp_path / "data"
    data.mkdir()
    mine = json.dumps({"question": "mine?", "answer": "#### 7"}) + "\n"
    (data / "gsm8k_test.jsonl").write_text(mine)
    assert prepare_data.main(_overrides(data)) == 0
    out = capsys.readouterr().out
    assert f"{data}/gsm8k_test.jsonl: there, left alone (trainer.eval_tasks.gsm8k.test_file)" in out
    assert (data / "gsm8k_test.jsonl").read_text() == mine
    assert not [p for _, p in hub.requests if "gsm8k" in p]  # a file that is there: not asked
    lines = (data / "math_train.jsonl").read_text().splitlines()
    assert [json.loads(line) for line in lines] == TRAIN  # the whole split, the hub's columns
    # one file, two readers: written from the eval task's dataset (MATH-500), not MATH's test
    assert pq.read_table(data / "math500.parquet").to_pylist() == MATH500_ROWS
    assert (
        f"{data}/math500.parquet: wrote 2 rows of {MATH500}, split test "
        "(trainer.eval_tasks.math500.test_file, task.test_file)"
    ) in out
    validate(_overrides(data))  # launch.train --validate reads every file: the tasks' layout
    hub.clear_requests()
    assert prepare_data.main(_overrides(data)) == 0  # again: all there, nothing asked
    assert capsys.readouterr().out.count("left alone") == 3 and hub.requests == []


@pytest.mark.parametrize("mode", ["offline", "unreachable"])
def test_without_the_hub_one_line_names_each_missing_file_and_hub_id(
    hub, monkeypatch, tmp_path, capfd, mode
):
    data = tmp_path / "data"
    if mode == "offline":
        hub_env(monkeypatch, hub, tmp_path / "cache", offline=True)
    else:
        hub.offline = True  # the port refuses connections; HF_HUB_OFFLINE stays unset
    capfd.readouterr()
    assert prepare_data.main(_overrides(data)) == 2
    err = capfd.readouterr().err.strip().splitlines()
    assert len(err) == 1, err  # no retries logged, no traceback
    said = "HF_HUB_OFFLINE=1 (offline" if mode == "offline" else f"hub at {hub.url} is unreachable"
    assert err[0].startswith("data error: 3 file(s) not written") and said in err[0]
    assert f"{data}/math_train.jsonl ({LIGHTEVAL}, split train)" in err[0]
    assert f"{data}/math500.parquet ({MATH500}, split test)" in err[0]
    assert f"{data}/gsm8k_test.jsonl (openai/gsm8k, configuration main, split test)" in err[0]
    assert not data.exists()


def test_a_missing_file_names_the_command_that_writes_it(monkeypatch, tmp_path, capsys):
    """The README's cluster command as written (data in $AVSPO_DATA, here empty)."""
    import launch.train

    monkeypatch.setenv("AVSPO_DATA", str(tmp_path))
    argv = ["experiment=paper_qwen2.5_math_1.5b", "--validate"]
    monkeypatch.setattr(sys, "argv", [str(ROOT / "launch" / "train.py"), *argv])
    with pytest.raises(SystemExit) as err:
        launch.train.cli()
    assert err.value.code == 2
    assert capsys.readouterr().err == (
        f"data error: {tmp_path}/math_train.jsonl: no such file (task.train_file); write it "
        "with: python -m launch.prepare_data experiment=paper_qwen2.5_math_1.5b\n"
    )
    # an eval task's file: its own key; no hub id (minerva_math has none): no command offered
    (tmp_path / "g.jsonl").write_text(json.dumps({"question": "1+1", "answer": "#### 2"}) + "\n")
    argv = [
        "task=gsm8k", f"task.train_file={tmp_path}/g.jsonl", f"task.test_file={tmp_path}/g.jsonl",
        "+task@trainer.eval_tasks.mm=minerva_math",
        f"trainer.eval_tasks.mm.test_file={tmp_path}/mm.jsonl", "--validate",
    ]  # fmt: skip
    monkeypatch.setattr(sys, "argv", [str(ROOT / "launch" / "train.py"), *argv])
    with pytest.raises(SystemExit):
        launch.train.cli()
    assert capsys.readouterr().err == (
        f"data error: {tmp_path}/mm.jsonl: no such file (trainer.eval_tasks.mm.test_file)\n"
    )


def test_an_unreachable_hub_fails_at_once_in_one_line_and_offline_says_offline(
    hub, monkeypatch, tmp_path, capfd
):
    """``--validate task=gsm8k`` (openai/gsm8k, not cached). Unreachable, HF_HUB_OFFLINE unset:
    it took 28 s (huggingface_hub's five retries, 23 s of waits, each logged) and then said
    "offline"; now one request tells, one line says so. The wait is timed in process (the
    interpreter's start is not the hub's doing): under 10 s."""
    from launch.train import validate

    hub.offline = True  # the port refuses: what a closed HF_ENDPOINT gives
    capfd.readouterr()
    start = time.monotonic()
    with pytest.raises(SystemExit) as err:
        validate(["task=gsm8k"])
    took = time.monotonic() - start
    lines = capfd.readouterr().err.strip().splitlines()
    assert err.value.code == 2 and len(lines) == 1, lines
    assert lines[0].startswith("data error: task.dataset: 'openai/gsm8k' is not in the datasets")
    assert f"the hub at {hub.url} is unreachable (ConnectError" in lines[0]
    assert "HF_HUB_OFFLINE unset" in lines[0]
    assert took < 10, f"{took:.1f} s"
    hub_env(monkeypatch, hub, tmp_path / "cache", offline=True)
    with pytest.raises(SystemExit):
        validate(["task=gsm8k"])
    lines = capfd.readouterr().err.strip().splitlines()
    assert lines == [
        "data error: task.dataset: 'openai/gsm8k' is not in the datasets cache, and "
        "HF_HUB_OFFLINE=1 (offline: only the cache is read)"
    ]


def test_an_unreachable_hub_still_serves_what_the_cache_has(hub, capfd):
    from reward.tasks import TaskConfig, make_task

    cfg = TaskConfig(name="math", dataset=LIGHTEVAL, verifier="math", question_key="problem",
                     answer_key="solution", answer_format="boxed")  # fmt: skip
    online = make_task(cfg)
    hub.offline = True
    capfd.readouterr()
    assert make_task(cfg) == online
    assert capfd.readouterr().err == ""  # no retry, nothing logged
