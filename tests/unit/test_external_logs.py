"""Other trainers' logs (diagnostics/external.py): a TRL trainer_state.json and a verl file-logger
jsonl, written here in those projects' formats, give the ACR series, ACR100 and accuracies derived
by hand below; bad input raises RunDataError naming the file and entry; ``launch.analyze`` puts
them in one cross-run table with our own runs."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from diagnostics.report import (
    RunDataError,
    acr100_coverage,
    load_run,
    summarize,
    write_cross_run,
)
from launch.analyze import main

# TRL: HF Trainer's log_history, as GRPOTrainer.log writes it with logging_steps=2,
# logging_first_step=True, eval_on_start=True and an eval at steps 4 and 6 (max_steps=6).
TRL_HISTORY = [
    {"eval_loss": 0.0, "eval_reward": 0.2, "eval_reward_std": 0.4,
     "eval_rewards/accuracy_reward/mean": 0.2, "eval_frac_reward_zero_std": 0.6,
     "eval_runtime": 3.1, "epoch": 0, "step": 0},
    {"loss": 0.01, "grad_norm": 0.5, "learning_rate": 1e-6, "num_tokens": 4096.0,
     "completions/mean_length": 120.0, "rewards/accuracy_reward/mean": 0.3,
     "rewards/accuracy_reward/std": 0.46, "reward": 0.3, "reward_std": 0.46,
     "frac_reward_zero_std": 0.5, "entropy": 0.7, "epoch": 0.17, "step": 1},
    {"loss": 0.02, "reward": 0.35, "reward_std": 0.48, "frac_reward_zero_std": 0.25,
     "epoch": 0.33, "step": 2},
    {"loss": 0.0, "reward": 0.4, "reward_std": 0.49, "frac_reward_zero_std": 0.75,
     "epoch": 0.67, "step": 4},
    {"eval_loss": 0.0, "eval_reward": 0.35, "eval_rewards/accuracy_reward/mean": 0.35,
     "eval_frac_reward_zero_std": 0.5, "epoch": 0.67, "step": 4},
    {"loss": 0.01, "reward": 0.45, "reward_std": 0.5, "frac_reward_zero_std": 0.375,
     "epoch": 1.0, "step": 6},
    {"eval_loss": 0.0, "eval_reward": 0.4, "eval_rewards/accuracy_reward/mean": 0.4,
     "eval_frac_reward_zero_std": 0.45, "epoch": 1.0, "step": 6},
    {"train_runtime": 60.2, "train_samples_per_second": 1.6, "train_steps_per_second": 0.1,
     "total_flos": 0.0, "train_loss": 0.01, "epoch": 1.0, "step": 6},
]  # fmt: skip

# verl: FileLogger lines {"step", "data"}; validation before training at step 0, two data
# sources; this trainer also logs acr/raw and its strata (verl has no collapse metric of its own).
VERL_LINES = [
    {"step": 0, "data": {"val-core/openai/gsm8k/acc/mean@1": 0.1,
                         "val-core/lighteval/MATH/acc/mean@1": 0.3,
                         "val-aux/openai/gsm8k/reward/mean@1": 0.1}},
    {"step": 1, "data": {"critic/score/mean": 0.25, "acr/raw": 0.5, "acr/high": 0.125,
                         "acr/low": 0.375, "actor/entropy": 0.7, "timing_s/gen": 3.2,
                         "training/global_step": 1, "training/epoch": 0}},
    {"step": 2, "data": {"critic/score/mean": None, "acr/raw": 0.75, "acr/high": 0.25,
                         "acr/low": 0.5}},
    {"step": 3, "data": {"critic/score/mean": 0.3, "acr/raw": 0.25, "acr/high": 0.0,
                         "acr/low": 0.25}},
    {"step": 4, "data": {"critic/score/mean": 0.35, "acr/raw": 0.5, "acr/high": 0.25,
                         "acr/low": 0.25, "val-core/openai/gsm8k/acc/mean@1": 0.3,
                         "val-core/lighteval/MATH/acc/mean@1": 0.5,
                         "val-core/openai/gsm8k/acc/maj@4/mean": 0.9}},
]  # fmt: skip


def write_trl(path: Path, history=TRL_HISTORY, name: str = "trainer_state.json") -> Path:
    path.mkdir(parents=True, exist_ok=True)
    state = {"global_step": 6, "max_steps": 6, "logging_steps": 2, "eval_steps": 4,
             "epoch": 1.0, "log_history": history, "best_metric": None}  # fmt: skip
    (path / name).write_text(json.dumps(state, indent=2))
    return path


def write_verl(path: Path, lines=VERL_LINES) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def write_ours(path: Path, acr: float, final: float, steps: int = 12) -> Path:
    """One of our run directories: acr/raw constant, accuracy 0.25 -> ``final``."""
    path.mkdir(parents=True)
    rows = [{"step": 0, "eval/accuracy": 0.25}]
    rows += [{"step": t, "acr/raw": acr, "reward/mean": 0.3} for t in range(1, steps + 1)]
    rows[-1]["eval/accuracy"] = final
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (path / "config.yaml").write_text("algorithm:\n  name: grpo\n")
    return path


# --- TRL -------------------------------------------------------------------------------------


def test_trl_series_acr100_and_accuracy(tmp_path):
    run = load_run(write_trl(tmp_path / "qwen_grpo"))
    assert run.name == "trl:qwen_grpo" and run.path == tmp_path / "qwen_grpo"
    # frac_reward_zero_std at the logged steps; each entry averages the steps since the last log
    assert run.series("acr/raw") == ([1, 2, 4, 6], [0.5, 0.25, 0.75, 0.375])
    assert run.series("log/steps_averaged") == ([1, 2, 4, 6], [1.0, 1.0, 2.0, 2.0])
    assert run.series("reward/mean") == ([1, 2, 4, 6], [0.3, 0.35, 0.4, 0.45])
    assert run.series("eval/accuracy") == ([0, 4, 6], [0.2, 0.35, 0.4])
    assert not run.series("acr/high")[0]  # TRL logs no strata
    s = summarize(run)
    # ACR100 = (1 * 0.5 + 1 * 0.25 + 2 * 0.75 + 2 * 0.375) / 6 = 3.0 / 6 = 0.5 over 6 steps
    # (the unweighted mean of the four entries would be 1.875 / 4 = 0.46875)
    assert s["acr100"] == pytest.approx(0.5)
    assert s["acr100_steps"] == 6 and "weighted by its steps" in s["acr100_source"]
    assert acr100_coverage(s) == "over 6 steps, run shorter than 100"
    assert (s["start_accuracy"], s["final_accuracy"], s["final_accuracy_step"]) == (0.2, 0.4, 6)
    assert s["total_steps"] == 6 and s["last_step"] == 6


def test_the_authors_fork_logs_effective_collapse_as_frac_reward_zero_std(tmp_path):
    """The AVSPO fork (hexixiang/ACR, trl_scope/trainer/grpo_trainer.py) computes
    frac_reward_zero_std from the std *after* its virtual sample joins, so it is the effective
    rate; its raw collapse is metrics/collapse_rate/general_batch, split into zeros_batch (all
    incorrect) and ones_batch (all correct). A log with those keys is the fork's run."""
    history = [
        {"frac_reward_zero_std": 0.0, "metrics/collapse_rate/general_batch": 1.0,
         "metrics/collapse_rate/zeros_batch": 1.0, "metrics/collapse_rate/ones_batch": 0.0,
         "metrics/collapse_rate/general_cumulative": 1.0, "reward": 0.0, "step": 1},
        {"frac_reward_zero_std": 0.0, "metrics/collapse_rate/general_batch": 0.0,
         "metrics/collapse_rate/zeros_batch": 0.0, "metrics/collapse_rate/ones_batch": 0.0,
         "reward": 0.5, "step": 2},
    ]  # fmt: skip
    run = load_run(write_trl(tmp_path / "fork", history))
    assert run.series("acr/raw") == ([1, 2], [1.0, 0.0])
    assert run.series("acr/effective") == ([1, 2], [0.0, 0.0])
    assert run.series("acr/low") == ([1, 2], [1.0, 0.0])
    assert run.series("acr/high") == ([1, 2], [0.0, 0.0])
    assert "effective" in run.notes["acr"]
    # plain TRL (no fork keys) keeps frac_reward_zero_std -> acr/raw, no effective rate
    plain = load_run(write_trl(tmp_path / "trl"))
    assert plain.series("acr/raw")[1][0] == 0.5 and not plain.series("acr/effective")[0]


def test_trl_entry_straddling_step_100_counts_for_its_steps_up_to_100(tmp_path):
    # logging_steps=30: entries at 30, 60, 90, 120. ACR100 = (30 * 0.2 + 30 * 0.4 + 30 * 0.6
    # + 10 * 0.8) / 100 = (6 + 12 + 18 + 8) / 100 = 0.44, over all 100 steps.
    values = {30: 0.2, 60: 0.4, 90: 0.6, 120: 0.8}
    history = [{"frac_reward_zero_std": v, "step": t} for t, v in values.items()]
    s = summarize(load_run(write_trl(tmp_path / "r", history)))
    assert s["acr100"] == pytest.approx(0.44) and s["acr100_steps"] == 100
    assert acr100_coverage(s, always=False) is None  # a full window: not flagged
    assert s["final_accuracy"] is None


def test_trl_file_and_latest_checkpoint(tmp_path):
    out = tmp_path / "out"
    write_trl(out / "checkpoint-2", TRL_HISTORY[:3])
    write_trl(out / "checkpoint-10", TRL_HISTORY)  # numerically the latest, not "checkpoint-2"
    run = load_run(out)
    assert run.name == "trl:out" and run.source_file == out / "checkpoint-10" / "trainer_state.json"
    assert run.series("acr/raw")[0] == [1, 2, 4, 6]
    file_run = load_run(out / "checkpoint-2" / "trainer_state.json")
    assert file_run.name == "trl:out" and file_run.series("acr/raw")[0] == [1, 2]


def test_trl_without_accuracy_is_reported_and_left_out_of_the_fit(tmp_path):
    history = [{k: v for k, v in e.items() if "accuracy_reward" not in k} for e in TRL_HISTORY]
    run = load_run(write_trl(tmp_path / "noacc", history))
    assert summarize(run)["final_accuracy"] is None
    assert "no eval accuracy" in run.notes["no_accuracy"]
    text = write_cross_run(
        [write_ours(tmp_path / "a", 0.2, 0.45), write_ours(tmp_path / "b", 0.6, 0.3), run.path],
        tmp_path / "cross",
    ).read_text()
    assert "Least squares over 2 runs" in text
    assert "Not in the fit: trl:noacc (no eval accuracy: log_history has no " in text


@pytest.mark.parametrize(
    ("history", "message"),
    [
        (TRL_HISTORY[:2] + [{"frac_reward_zero_std": "0.5", "step": 2}],
         "log_history[2]: 'frac_reward_zero_std' must be a number or null, got '0.5'"),
        (TRL_HISTORY[:1] + [["step", 1]], "log_history[1]: expected a JSON object, got list"),
        (TRL_HISTORY[:3] + [{"reward": 0.1}], "log_history[3]: 'step' must be an integer >= 0"),
        (TRL_HISTORY[:1], "no log_history entry has 'frac_reward_zero_std'"),
    ],
)  # fmt: skip
def test_trl_bad_entries_name_file_and_entry(tmp_path, history, message):
    file = write_trl(tmp_path / "bad", history) / "trainer_state.json"
    with pytest.raises(RunDataError, match=re.escape(f"{file}") + ".*" + re.escape(message)):
        load_run(tmp_path / "bad")


def test_trl_invalid_json_names_the_file(tmp_path):
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "trainer_state.json").write_text('{"log_history": [')
    with pytest.raises(RunDataError, match=re.escape(f"{tmp_path / 'bad' / 'trainer_state.json'}")):
        load_run(tmp_path / "bad")


# --- verl ------------------------------------------------------------------------------------


def test_verl_series_acr100_strata_and_accuracy(tmp_path):
    file = write_verl(tmp_path / "proj" / "qwen_grpo.jsonl")
    run = load_run(file)
    assert run.name == "verl:qwen_grpo" and run.path == tmp_path / "proj" / "qwen_grpo_report"
    assert run.series("acr/raw") == ([1, 2, 3, 4], [0.5, 0.75, 0.25, 0.5])
    assert run.series("acr/high") == ([1, 2, 3, 4], [0.125, 0.25, 0.0, 0.25])
    assert run.series("reward/mean") == ([1, 3, 4], [0.25, 0.3, 0.35])  # null dropped
    # eval/accuracy = mean over data sources: step 0 (0.1 + 0.3) / 2 = 0.2; step 4 (0.3 + 0.5) / 2
    # = 0.4; maj@4 and val-aux are not read
    steps, acc = run.series("eval/accuracy")
    assert steps == [0, 4] and acc == pytest.approx([0.2, 0.4])
    s = summarize(run)
    # ACR100 = (0.5 + 0.75 + 0.25 + 0.5) / 4 = 0.5 over 4 steps; strata means
    # high (0.125 + 0.25 + 0 + 0.25) / 4 = 0.15625, low (0.375 + 0.5 + 0.25 + 0.25) / 4 = 0.34375
    assert s["acr100"] == pytest.approx(0.5) and s["acr100_steps"] == 4
    assert s["acr100_source"] == "mean acr/raw over steps 1..100"
    assert (s["mean_acr_high"], s["mean_acr_low"]) == pytest.approx((0.15625, 0.34375))
    assert s["start_accuracy"] == pytest.approx(0.2) and s["final_accuracy"] == pytest.approx(0.4)


def test_verl_reward_is_accuracy_only_within_0_1(tmp_path):
    def lines(score):  # no "acc": verl's core validation metric is then the reward
        return [
            {"step": 0, "data": {"val-core/ds/reward/mean@4": 0.0}},
            {"step": 1, "data": {"frac_reward_zero_std": 0.5, "val-core/ds/reward/mean@4": score}},
        ]

    run = load_run(write_verl(tmp_path / "r01.jsonl", lines(0.6)))
    assert run.series("acr/raw") == ([1], [0.5]) and summarize(run)["final_accuracy"] == 0.6
    run = load_run(write_verl(tmp_path / "pm1.jsonl", lines(-1.0)))
    assert summarize(run)["final_accuracy"] is None
    assert "leaves [0, 1]" in run.notes["no_accuracy"]


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        ([json.dumps(VERL_LINES[0]), '{"step": 1, "data": {"acr/raw": 0.5}', ""],
         ":2: not valid JSON line"),
        ([json.dumps(VERL_LINES[0]), '{"step": 1, "acr/raw": 0.5}'],
         ":2: expected a verl file-logger line"),
        ([json.dumps(VERL_LINES[0]), '{"step": -1, "data": {}}'],
         ":2: 'step' must be an integer >= 0"),
        ([json.dumps(VERL_LINES[0]), '{"step": 1, "data": {"acr/raw": "high"}}'],
         ":2: 'acr/raw' must be a number or null"),
        ([json.dumps(VERL_LINES[0]), '{"step": 1, "data": {"critic/score/mean": 0.1}}'],
         ": no per-step collapse metric"),
    ],
)  # fmt: skip
def test_verl_bad_lines_name_file_and_line(tmp_path, lines, message):
    file = tmp_path / "exp.jsonl"
    file.write_text("\n".join(lines) + "\n")
    with pytest.raises(RunDataError, match=re.escape(f"{file}{message}")):
        load_run(file)


# --- unsupported and unknown -----------------------------------------------------------------


def test_openrlhf_tensorboard_logs_are_refused_with_the_reason(tmp_path):
    run_dir = tmp_path / "openrlhf_tb" / "run1"
    run_dir.mkdir(parents=True)
    (run_dir / "events.out.tfevents.1700000000.host.1.0").write_bytes(b"\x00")
    with pytest.raises(RunDataError, match="not supported.*no per-step share of collapsed groups"):
        load_run(tmp_path / "openrlhf_tb")


def test_unknown_inputs_name_the_path(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(RunDataError, match=re.escape(f"{tmp_path / 'empty' / 'metrics.jsonl'}")):
        load_run(tmp_path / "empty")
    (tmp_path / "notes.txt").write_text("hi")
    with pytest.raises(RunDataError, match=re.escape(f"{tmp_path / 'notes.txt'}: not a directory")):
        load_run(tmp_path / "notes.txt")
    with pytest.raises(RunDataError, match=re.escape(f"{tmp_path / 'gone.jsonl'}: no such file")):
        load_run(tmp_path / "gone.jsonl")


# --- launch.analyze --------------------------------------------------------------------------


def test_analyze_puts_ours_trl_and_verl_in_one_cross_run_table(tmp_path, capsys):
    ours = write_ours(tmp_path / "ours", acr=0.2, final=0.45)
    trl = write_trl(tmp_path / "trl_run")
    verl = write_verl(tmp_path / "verl_logs" / "exp1.jsonl")
    assert main([str(ours), str(trl), str(verl), "--out", str(tmp_path / "cross")]) == 0
    printed = capsys.readouterr().out
    assert "trl:trl_run (unknown algorithm): accuracy 0.200 -> 0.400" in printed
    assert "verl:exp1 (unknown algorithm): accuracy 0.200 -> 0.400" in printed
    for report in (ours, trl, tmp_path / "verl_logs" / "exp1_report"):
        assert (report / "report.md").is_file() and (report / "acr.png").is_file()
    assert "# Run report: verl:exp1" in (tmp_path / "verl_logs/exp1_report/report.md").read_text()
    text = (tmp_path / "cross" / "cross_run.md").read_text()
    assert "| [ours](../ours/report.md) | grpo | 0.200 | 12 | 25.0 | 45.0 |" in text
    assert "| [trl:trl_run](../trl_run/report.md) | n/a | 0.500 | 6 | 20.0 | 40.0 |" in text
    verl_link = "[verl:exp1](../verl_logs/exp1_report/report.md)"
    assert f"| {verl_link} | n/a | 0.500 | 4 | 20.0 | 40.0 |" in text
    # Points (0.2, 45), (0.5, 40), (0.5, 40) lie on the line through (0.2, 45) and (0.5, 40):
    # slope = -5 / 0.3 = -16.667, intercept = 45 + 16.667 * 0.2 = 48.333, R^2 = 1.
    assert "Least squares over 3 runs" in text
    assert "intercept = 48.333, slope = -16.667, R^2 = 1.000" in text


def test_analyze_exits_2_on_a_bad_external_log(tmp_path, capsys):
    file = write_verl(tmp_path / "exp.jsonl", [{"step": 1, "data": {"critic/score/mean": 0.1}}])
    assert main([str(write_trl(tmp_path / "trl")), str(file)]) == 2
    err = capsys.readouterr().err
    assert f"{file}: no per-step collapse metric" in err and "Traceback" not in err
    assert not (tmp_path / "trl" / "report.md").exists()  # nothing written before all are read
