"""What the model wrote (``logger.samples``, diagnostics/samples.py): which rollouts are picked,
the records built from the advantage stage's own output, samples.jsonl (appended, cut back on
resume like metrics.jsonl), the wandb table, the report's section; and the spreads the advantage
stage logs beside them (``advantage/*``, ``response_length/{max,min}``, ``prompt_length/*``).
The driver runs with fake generation, verification and learner (no Ray); the e2e run with
real actors is tests/e2e/test_train_cli.py's ``whole_run``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from diagnostics.samples import SamplesSink, pick, sample_records
from diagnostics.sinks import ConsoleSink, MultiSink
from launch.config import TrainConfig
from launch.loop import Trainer
from launch.rollouts import Rollouts
from learner.advantage_stage import AdvantageStage
from learner.config import AlgorithmConfig
from learner.trigger import TriggerConfig
from reward.tasks import Problem
from reward.verifiers import Verdict
from rollout.types import Group, Sample
from tests.helpers import fake_stages
from tests.metric_names import SAMPLE_FIELDS
from tests.reference import ref_avspo, ref_grpo

FIELDS = SAMPLE_FIELDS  # every record's keys, written out there (a dropped field fails here)


def _group(prompt: str, prompt_len: int, texts: list[str], lengths: list[int]) -> Group:
    samples = [
        Sample([7] * n, [-0.5] * n, t, "stop", 0) for t, n in zip(texts, lengths, strict=True)
    ]
    return Group(prompt, [1] * prompt_len, samples)


def _verdicts(texts: list[str], answer: str) -> list[Verdict]:
    return [Verdict(1.0, "ok") if t == answer else Verdict(0.0, "wrong") for t in texts]


def test_pick_spreads_the_samples_evenly_over_the_step():
    # 8 groups of 4 = 32 samples; 4 picks: samples 0, 8, 16, 24 = the first of groups 0, 2, 4, 6
    assert pick([4] * 8, 4) == [(0, 0), (2, 0), (4, 0), (6, 0)]
    # 16 picks of 32: every second sample, so every group is seen (samples 0 and 2)
    assert pick([4] * 8, 16) == [(g, i) for g in range(8) for i in (0, 2)]
    # uneven groups (failed samples): 6 samples, 3 picks at 0, 2, 4
    assert pick([3, 1, 2], 3) == [(0, 0), (0, 2), (2, 0)]
    assert pick([3, 1, 2], 10) == [(0, 0), (0, 1), (0, 2), (1, 0), (2, 0), (2, 1)]
    assert pick([3, 1, 2], 0) == [] and pick([], 4) == []


def test_records_carry_the_stage_rewards_verdicts_and_advantages():
    """Two groups of 4 through the real advantage stage (GRPO): g0 answers 1 of 4 right, g1
    all four. Picks (n = 4 of 8): samples 0, 2 of each group. g0: mean 1/4, unbiased std
    sqrt((0.75^2 + 3 x 0.25^2) / 3) = 0.5, so A = 0.75 / 0.5 = 1.5 and -0.25 / 0.5 = -0.5;
    g1 collapsed: 0. DAPO's selection leaves g1 untrained here: still logged, trained false."""
    problems = [Problem("u0", "1+1", "1+1=", "2"), Problem("u1", "2+2", "2+2=", "4")]
    texts = [["2", "3", "5", "x"], ["4", "4", "4", "4"]]
    groups = [_group(p.prompt, 3 + i, t, [1, 2, 3, 4]) for i, (p, t) in
              enumerate(zip(problems, texts, strict=True))]  # fmt: skip
    verdicts = _verdicts(texts[0], "2") + _verdicts(texts[1], "4")
    stage = AdvantageStage(AlgorithmConfig(estimator="grpo"), reward_range=(0.0, 1.0), seed=0)
    trained = [True, False]
    out = stage.process(groups, verdicts, prompt_keys=["u0", "u1"], trained=trained)
    r = Rollouts(problems, groups, verdicts, trained, {})
    records = sample_records(7, r, out.rewards, out.advantages, n=4, solved_at=1.0)
    assert [list(x) for x in records] == [FIELDS] * 4
    assert [(x["group_id"], x["sample"]) for x in records] == [(0, 0), (0, 2), (1, 0), (1, 2)]
    first = records[0]
    assert first | {"advantage": None} == {
        "step": 7, "group_id": 0, "sample": 0, "prompt_uid": "u0", "prompt": "1+1=",
        "response": "2", "reference": "2", "reward": 1.0, "score": 1.0, "verdict": "ok",
        "correct": True, "advantage": None, "group_rewards": [1.0, 0.0, 0.0, 0.0],
        "trained": True, "finish_reason": "stop", "response_tokens": 1,
    }  # fmt: skip
    assert first["advantage"] == pytest.approx(1.5, rel=1e-5)
    assert records[1]["advantage"] == pytest.approx(-0.5, rel=1e-5)
    assert records[1]["verdict"] == "wrong" and records[1]["correct"] is False
    assert [x["advantage"] for x in records[2:]] == [0.0, 0.0]
    assert [x["trained"] for x in records] == [True, True, False, False]
    assert sample_records(7, r, out.rewards, out.advantages, n=0, solved_at=1.0) == []
    json.dumps(records)  # plain JSON values


def test_the_stage_logs_advantage_and_length_spreads_over_the_right_samples():
    """AVSPO with the trigger always on: g0 = [1, 0] (mixed), g1 = [1, 1] (collapsed, gets
    virtual samples), g2 = [1, 0] whose second verification timed out (faulted: no advantage,
    masked out of the loss). ``advantage/*`` are over the 4 samples of g0 and g1, the ones that
    enter the loss (the reference computes them over those two groups alone); with g2's two
    zeros the mean would be 2/3 of it. Lengths are over all 6 samples: prompts of 3, 6, 4
    tokens (each sample counts its prompt), responses 2, 5 | 1, 4 | 3, 3."""
    cfg = AlgorithmConfig(estimator="avspo", trigger=TriggerConfig(policy="always"))
    groups = [_group("a", 3, ["", ""], [2, 5]), _group("b", 6, ["", ""], [1, 4]),
              _group("c", 4, ["", ""], [3, 3])]  # fmt: skip
    verdicts = [Verdict(1.0, "ok"), Verdict(0.0, "wrong"), Verdict(1.0, "ok"), Verdict(1.0, "ok"),
                Verdict(1.0, "ok"), Verdict(0.0, "timeout")]  # fmt: skip
    out = AdvantageStage(cfg, reward_range=(0.0, 1.0), seed=0).process(groups, verdicts)
    want, _, _ = ref_avspo([1.0, 0.0, 1.0, 1.0], [0, 0, 1, 1], tau_adapt=0.0)
    m = out.metrics
    assert m["avspo/augmented_groups"] == 1.0 and want[2] > 0  # g1 got a signal
    assert out.advantages.tolist()[4:] == [0.0, 0.0]  # g2: faulted
    assert m["advantage/mean"] == pytest.approx(sum(want) / 4, rel=1e-5)
    assert m["advantage/max"] == pytest.approx(max(want), rel=1e-5)
    assert m["advantage/min"] == pytest.approx(min(want), rel=1e-5)
    assert (m["prompt_length/mean"], m["prompt_length/max"], m["prompt_length/min"]) == (
        pytest.approx(26 / 6), 6.0, 3.0)  # fmt: skip
    assert (m["response_length/mean"], m["response_length/max"], m["response_length/min"]) == (
        3.0, 5.0, 1.0)  # fmt: skip
    assert out.rewards.tolist() == [1.0, 0.0, 1.0, 1.0, 1.0, 0.0]


def test_advantage_spread_is_null_when_no_sample_enters_the_loss():
    groups = [_group("a", 2, ["", ""], [1, 1])]
    out = AdvantageStage(
        AlgorithmConfig(estimator="grpo"), reward_range=(0.0, 1.0), seed=0
    ).process(groups, [Verdict(0.0, "timeout"), Verdict(1.0, "ok")])
    assert all(out.metrics[f"advantage/{s}"] != out.metrics[f"advantage/{s}"]  # NaN
               for s in ("mean", "max", "min"))  # fmt: skip


def test_samples_sink_appends_lines_and_multisink_feeds_only_sinks_that_keep_samples(tmp_path):
    path = tmp_path / "samples.jsonl"
    lines = []
    sink = MultiSink([SamplesSink(path), ConsoleSink(3, progress="never", write=lines.append)])
    sink.log_samples(1, [{"step": 1, "advantage": float("nan"), "group_rewards": [1.0]}])
    sink.log_samples(2, [])
    sink.log(1, {"reward/mean": 0.5})  # metrics: not into samples.jsonl
    sink.close()
    again = SamplesSink(path)  # a resumed run appends
    again.log_samples(2, [{"step": 2, "advantage": 0.5, "group_rewards": [float("inf")]}])
    again.close()
    assert [json.loads(x) for x in path.read_text().splitlines()] == [
        {"step": 1, "advantage": None, "group_rewards": [1.0]},
        {"step": 2, "advantage": 0.5, "group_rewards": [None]},
    ]
    assert lines == ["step 1/3 | reward 0.500"]


def test_wandb_sink_logs_a_table_of_the_steps_samples(tmp_path, monkeypatch):
    """Offline wandb (no network, no key): the step's records become one ``wandb.Table`` under
    ``samples`` at that step, a column per field, a group's rewards as JSON text."""
    import wandb

    from diagnostics.sinks import WandbSink

    monkeypatch.setenv("WANDB_SILENT", "true")
    sink = WandbSink(tmp_path, project="p", entity=None, mode="offline", config={}, name="r")
    calls = []
    real = sink._run.log
    monkeypatch.setattr(
        sink._run, "log", lambda row, step: calls.append((row, step)) or real(row, step=step)
    )
    record = {"prompt": "1+1=", "response": "2", "group_rewards": [1.0, 0.0], "correct": True}
    records = [dict.fromkeys(FIELDS, 0) | record | {"step": 3}] * 2
    sink.log_samples(3, records)
    sink.log_samples(4, [])  # nothing to log: no table
    sink.close()
    assert len(calls) == 1
    row, step = calls[0]
    table = row["samples"]
    assert step == 3 and isinstance(table, wandb.Table) and table.columns == FIELDS
    assert len(table.data) == 2
    got = dict(zip(FIELDS, table.data[0], strict=True))
    assert got["response"] == "2" and got["group_rewards"] == "[1.0, 0.0]" and got["correct"]


def test_the_report_shows_samples_of_the_first_and_last_steps(tmp_path):
    from diagnostics.report import write_report

    rows = [{"step": s, "reward/mean": 0.5, "acr/raw": 0.25} for s in range(4)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    base = dict.fromkeys(FIELDS, 0) | {"verdict": "ok", "correct": True, "reference": "2"}
    base |= {"finish_reason": "stop", "group_rewards": [1.0, 0.0]}
    samples = [base | {"step": s, "sample": i, "prompt": f"prompt of step {s}",
                       "response": f"answer {s}.{i} ```" + "x" * 700, "advantage": 0.25 * i}
               for s in (1, 2, 3) for i in range(4)]  # fmt: skip
    (tmp_path / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in samples))
    text = write_report(tmp_path).read_text()
    section = text[text.index("## Samples") :]
    assert "### Step 1" in section and "### Step 3" in section and "### Step 2" not in section
    assert "answer 1.0" in section and "answer 3.2" in section and "answer 3.3" not in section
    assert "advantage +0.500" in section and "its group's: 1, 0" in section
    assert "[... 114 more]" in section  # "answer 1.0 ```" + 700: 714 characters, cut at 600
    assert "````text" in section  # a fence longer than the ``` inside the response


class _Rollout:
    """Prompt "p{i}" answers "{i}" on the samples ``right[i]`` says."""

    restarts = regenerated = 0

    def __init__(self, right: dict[int, list[bool]]):
        self.right = right

    def generate(self, prompts, params):
        out = []
        for p in prompts:
            i = int(p[1:])
            texts = [str(i) if ok else "x" for ok in self.right[i][: params.n]]
            out.append(_group(p, 2 + i, texts, [1 + i] * len(texts)))
        return out


class _Learner:
    """Trains on nothing; keeps each checkpoint's state (as the learner group's sidecar)."""

    def __init__(self, saved: dict):
        self.saved = saved

    def train_on(self, batch, learner_version=None):
        return {}

    def save_checkpoint(self, root, step, state, keep):
        self.saved[step] = json.loads(json.dumps({"step": step, **state}))
        return f"{root}/step_{step:06d}"

    def load_checkpoint(self, folder):
        return self.saved[int(folder.rsplit("_", 1)[1])]


def _verify(groups, problems):
    return [
        Verdict(1.0, "ok") if s.text == p.answer else Verdict(0.0, "wrong")
        for g, p in zip(groups, problems, strict=True)
        for s in g.samples
    ]


def _run(run_dir: Path, saved: dict, resume: str | None = None) -> Trainer:
    cfg = TrainConfig()
    cfg.algorithm = AlgorithmConfig(estimator="grpo")
    cfg.trainer.total_steps, cfg.trainer.save_every = 3, 2
    cfg.trainer.prompts_per_step, cfg.rollout.n_samples = 2, 4
    cfg.logger.samples, cfg.logger.console, cfg.logger.report = 3, False, False
    problems = [Problem(f"u{i}", f"q{i}", f"p{i}", str(i)) for i in range(4)]
    right = {0: [True] * 4, 1: [True, False, False, True], 2: [False] * 4, 3: [True, False] * 2}
    stages = fake_stages(cfg, problems, _Rollout(right), _verify, learner=_Learner(saved),
                         resume_from=resume)  # fmt: skip
    t = Trainer(cfg, stages, run_dir, log=lambda *_: None)
    t.evaluate = lambda step, phase=None: {"eval/accuracy": 0.0}  # no held-out set here
    t.run()
    return t


def _lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def test_the_driver_logs_samples_every_step_and_a_resume_cuts_them_back_and_appends(tmp_path):
    """``logger.samples=3`` of 8 samples a step (2 prompts x 4): samples 0, 2, 5 (0 and 2 of
    the first group, 1 of the second), each with the advantage GRPO gives its group's rewards.
    An earlier attempt's file moves aside at a fresh start; a resume from the step-2 checkpoint
    keeps steps 1-2, moves step 3 to samples.pre_resume.jsonl and logs step 3 again, the same
    rollouts (as metrics.jsonl)."""
    path = tmp_path / "samples.jsonl"
    path.write_text('{"step": 1, "stale": true}\n')  # an attempt that died before a checkpoint
    saved: dict = {}
    _run(tmp_path, saved)
    assert _lines(tmp_path / "samples.pre_resume.jsonl") == [{"step": 1, "stale": True}]
    first = _lines(path)
    assert [r["step"] for r in first] == [1, 1, 1, 2, 2, 2, 3, 3, 3]
    assert [(r["group_id"], r["sample"]) for r in first[:3]] == [(0, 0), (0, 2), (1, 1)]
    metrics = {r["step"]: r for r in _lines(tmp_path / "metrics.jsonl")}
    for r in first:
        assert list(r) == FIELDS and r["trained"]
        rewards = r["group_rewards"]
        assert r["reward"] == rewards[r["sample"]] == r["score"]
        assert r["correct"] == (r["response"] == r["reference"])
        want = ref_grpo(rewards, [0] * len(rewards))[r["sample"]]
        assert r["advantage"] == pytest.approx(want, rel=1e-5, abs=1e-6)
        row = metrics[r["step"]]
        assert row["advantage/min"] <= r["advantage"] <= row["advantage/max"]
        assert row["response_length/min"] <= r["response_tokens"] <= row["response_length/max"]
    # a crash after step 3 (its checkpoint is step 2's): the resumed run continues at step 3
    _run(tmp_path, saved, resume=str(tmp_path / "checkpoints" / "step_000002"))
    assert _lines(path) == first  # steps 1-2 kept, step 3 again: the same rollouts, once
    moved = _lines(tmp_path / "samples.pre_resume.jsonl")
    assert moved[1:] == first[6:]  # the old step 3, after the stale row


def test_logger_samples_is_a_checked_key():
    from launch.validation import ConfigError, validate

    assert TrainConfig().logger.samples == 4
    cfg = TrainConfig()
    cfg.logger.samples = -1
    with pytest.raises(ConfigError, match="logger.samples: must be >= 0"):
        validate(cfg)


def test_stage_outputs_every_samples_reward_and_advantage():
    groups = [_group("a", 1, ["", "", ""], [1, 1, 1])]
    out = AdvantageStage(
        AlgorithmConfig(estimator="grpo"), reward_range=(0.0, 1.0), seed=0
    ).process(groups, [Verdict(1.0, "ok"), Verdict(0.0, "wrong"), Verdict(0.0, "wrong")])
    assert out.rewards.tolist() == [1.0, 0.0, 0.0]
    want = ref_grpo([1.0, 0.0, 0.0], [0, 0, 0])
    assert out.advantages.tolist() == pytest.approx(want, rel=1e-5)
    assert torch.equal(out.batch.advantages, out.advantages)
